"""The sim's tokenizer as a Hugging Face tokenizer.json (for aiperf): it counts what the sim counts, and
text decoded from any ids counts as many sim tokens as ids were decoded (aiperf builds prompts so)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servelens.sim.tokenizer import OUTPUT_WORDS, count_tokens, make_text

pytest.importorskip("tokenizers")

from servelens.sim.hf_tokenizer import HF_NAME, main, sim_tokenizer, write_hf_cache

TOK = sim_tokenizer()


TEXT = st.characters(categories=("Lu", "Ll", "Lo", "Nd", "Pd", "Ps", "Pe", "Po", "Sm", "Sc", "Zs"),
                     max_codepoint=0xFFFF) | st.sampled_from(" \n\t_")


@given(st.text(alphabet=TEXT, max_size=200))
def test_counts_what_the_sim_counts(text: str) -> None:
    """Text in the common scripts (letters, digits, punctuation, symbols, spaces of the Basic
    Multilingual Plane): Python's and Rust's Unicode classes differ on a few rare characters."""
    assert len(TOK.encode(text, add_special_tokens=False).ids) == count_tokens(text)


def test_built_prompts_and_punctuation() -> None:
    for n in (1, 17, 1000):
        text = make_text(n, n)
        assert len(TOK.encode(text).ids) == count_tokens(text) == n
    assert len(TOK.encode("Hello, world!! (a corpus word: Shakespeare's)").ids) == count_tokens(
        "Hello, world!! (a corpus word: Shakespeare's)")


def test_decoded_ids_count_as_many_sim_tokens() -> None:
    rng = random.Random(0)
    vocab = TOK.get_vocab_size()
    corpus = TOK.encode("To be, or not to be: that is the question. " * 20 + " ".join(OUTPUT_WORDS[:50])).ids
    for n in (1, 100, 1000):
        ids = [rng.choice(corpus) if rng.random() < 0.5 else rng.randrange(vocab) for _ in range(n)]
        assert count_tokens(TOK.decode(ids)) == n


def test_hf_cache_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "hf")]) == 0 and capsys.readouterr().out == HF_NAME + "\n"
    snap = next((tmp_path / "hf" / "hub" / "models--local--sim-words" / "snapshots").iterdir())
    assert (tmp_path / "hf" / "hub" / "models--local--sim-words" / "refs" / "main").read_text() == snap.name
    assert json.loads((snap / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    from tokenizers import Tokenizer

    again = Tokenizer.from_file(str(snap / "tokenizer.json"))
    assert again.encode("a, b").ids == TOK.encode("a, b").ids
    assert write_hf_cache(tmp_path / "hf") == HF_NAME  # twice: idempotent
