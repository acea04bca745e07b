"""Prompts of exact token length with a tokenizer file (the real-engine path) and the sim tokenizer."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from servelens.bench.prompts import FileTokenizer, PromptBuilder, load_tokenizer
from servelens.sim.tokenizer import WORDS


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small byte-level BPE (GPT-2 style) trained on a deterministic text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) + ", and then: 3.14!" for i in range(400)]
    tok.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_file_tokenizer_exact_lengths_and_shared_prefix(tokenizer_file: Path) -> None:
    ft = FileTokenizer(tokenizer_file)
    b = PromptBuilder(ft, block_tokens=64)
    a = b.build(300, "a", hash_ids=(7, 8, 9))
    c = b.build(250, "c", hash_ids=(7, 8, 11, 12))
    assert ft.count_tokens(a) == 300 and ft.count_tokens(c) == 250
    enc = ft._tok.encode  # compare the token ids of the shared 128-token prefix
    ia, ic = enc(a, add_special_tokens=False).ids, enc(c, add_special_tokens=False).ids
    assert ia[:128] == ic[:128] and ia[128:136] != ic[128:136]
    for n in (1, 2, 17, 511, 2048):
        assert ft.count_tokens(b.build(n, ("k", n))) == n


def test_bad_tokenizer_file(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        load_tokenizer(bad)


def test_build_rejects_empty_prompt() -> None:
    with pytest.raises(ValueError, match=">= 1 token"):
        PromptBuilder(load_tokenizer(None)).build(0, "k")
