"""The sim's tokenizer as a Hugging Face ``tokenizer.json``, for load generators that count tokens with
one (aiperf, vLLM's benchmarks): with it their prompt lengths are the sim's ``prompt_tokens`` exactly.

The sim's rule (:mod:`servelens.sim.tokenizer`): one token per run of word characters, one per other
non-space character. Here: split on whitespace, then into ``\\w+`` runs and single other characters
(``tokenizers``' ``WhitespaceSplit`` and ``Split(..., "isolated")``), a word-level vocabulary of the sim's
prompt words and punctuation, and every other word mapped to ``unk``, itself a word: text decoded from
any ids (tokens joined by spaces) counts as many sim tokens as ids were decoded. Counts agree on
text in the common scripts; Python's ``\\w`` and Rust's differ on a few rare characters (connector
punctuation such as U+2054, some combining marks). Needs the ``tokenizers`` extra.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path
from typing import Any

from servelens.sim.tokenizer import OUTPUT_WORDS

HF_NAME = "local/sim-words"
"""The repository name the tokenizer has in the Hugging Face cache :func:`write_hf_cache` writes."""
UNK = "unk"
"""The unknown token: one ``\\w+`` run, so it counts one sim token wherever it is decoded."""
_REVISION = "0" * 40


def sim_tokenizer() -> Any:
    """A ``tokenizers.Tokenizer`` that counts like the sim (see the module docstring). Raises
    ImportError naming the extra when ``tokenizers`` is not installed."""
    try:
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    except ImportError:
        raise ImportError("the sim's Hugging Face tokenizer needs 'tokenizers': pip install 'servelens[tokenizers]'"
                          ) from None
    words = [UNK, *dict.fromkeys((*OUTPUT_WORDS, *string.punctuation))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), behavior="isolated"),
    ])
    return tok


def write_tokenizer(folder: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder`` (created); returns it."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    sim_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK, "model_max_length": 1 << 30}))
    return out


def write_hf_cache(hf_home: str | Path) -> str:
    """Write the tokenizer into a Hugging Face cache at ``hf_home`` (``$HF_HOME``) as :data:`HF_NAME`, so a
    tool that loads tokenizers by name finds it with ``HF_HUB_OFFLINE=1`` (aiperf does not load one
    from a plain folder offline). Returns the name to pass (``--tokenizer local/sim-words``)."""
    repo = Path(hf_home) / "hub" / ("models--" + HF_NAME.replace("/", "--"))
    write_tokenizer(repo / "snapshots" / _REVISION)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(_REVISION)
    return HF_NAME


def main(argv: list[str] | None = None) -> int:
    """``python -m servelens.sim.hf_tokenizer HF_HOME``: write the cache, print the tokenizer's name."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m servelens.sim.hf_tokenizer",
                                description="Write the sim's tokenizer into a Hugging Face cache (HF_HOME) "
                                "as local/sim-words, for aiperf's --tokenizer.")
    p.add_argument("hf_home", metavar="HF_HOME", help="the cache folder (created); run aiperf with HF_HOME set to it")
    args = p.parse_args(argv)
    try:
        print(write_hf_cache(args.hf_home))
    except (ImportError, OSError) as exc:
        print(f"servelens: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
