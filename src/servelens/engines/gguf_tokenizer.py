"""A Hugging Face ``tokenizer.json`` made from the tokenizer a GGUF model file carries.

llama.cpp serves GGUF files, which hold their vocabulary, merges and pre-tokenizer name in the
file's metadata (``tokenizer.ggml.*``). servelens counts prompt tokens with the ``tokenizers``
library (``servelens bench --tokenizer``, ``servelens gateway --tokenizer``), so this module writes
the same tokenizer in that library's format: read with the ``gguf`` package (llama.cpp's own
reader), built with ``tokenizers``.

Supported: byte-level BPE (``tokenizer.ggml.model = "gpt2"``) with the pre-tokenizers named
``gpt2`` (GPT-2's split) and ``smollm`` (digits one by one, then GPT-2's split; SmolLM/SmolLM2).
Their definitions are llama.cpp's ``llama-vocab.cpp`` (``LLAMA_VOCAB_PRE_TYPE_GPT2`` and
``..._SMOLLM``), which match the models' own ``tokenizer.json`` (``ByteLevel``, and
``Digits(individual_digits=True)`` before it for SmolLM). Control tokens (token type 3) become
special added tokens, so ``<|im_start|>`` in a text is one token as llama-server's ``/tokenize``
with ``parse_special`` counts it. The conformance tests check the counts against llama-server.

Beside it, :func:`write_tokenizer_config` writes a ``tokenizer_config.json`` with the file's chat
template and BOS/EOS tokens, for ``servelens gateway --chat-template`` (the prompt counted as the
engine renders it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTROL_TOKEN_TYPE = 3
"""``tokenizer.ggml.token_type`` of a control (special) token (gguf's ``TokenType.CONTROL``)."""

SUPPORTED_PRE = ("gpt2", "smollm")


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer metadata of a GGUF file.

    Attributes:
        model: ``tokenizer.ggml.model`` (``gpt2`` for byte-level BPE).
        pre: ``tokenizer.ggml.pre``, the pre-tokenizer's name.
        tokens: the vocabulary, index = token id.
        token_types: one per token (1 normal, 3 control, ...).
        merges: BPE merges, ``"left right"``, in rank order.
        bos_id, eos_id: the begin/end-of-sequence token ids (None when absent).
        add_bos: whether the model's prompts start with BOS (``tokenizer.ggml.add_bos_token``).
        chat_template: the Jinja chat template ("" when absent).
    """

    model: str
    pre: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    chat_template: str


def read_vocab(gguf_path: Path | str) -> GgufVocab:
    """Read a GGUF file's tokenizer metadata (memory-mapped; about 4 s for a 49k vocabulary).

    Raises ValueError when the file is not a GGUF file or has no tokenizer; ImportError naming the
    extra when the ``gguf`` package is missing."""
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover - a declared extra
        raise ImportError("reading a GGUF tokenizer needs 'gguf': pip install 'servelens[llamacpp]'") from None
    try:
        reader = GGUFReader(str(gguf_path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read GGUF file {gguf_path}: {exc}") from None

    def get(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    tokens = get("tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{gguf_path}: no tokenizer.ggml.tokens in the file")
    types = get("tokenizer.ggml.token_type") or [1] * len(tokens)
    return GgufVocab(
        model=str(get("tokenizer.ggml.model", "")),
        pre=str(get("tokenizer.ggml.pre", "default")),
        tokens=tuple(tokens),
        token_types=tuple(int(t) for t in types),
        merges=tuple(get("tokenizer.ggml.merges") or ()),
        bos_id=get("tokenizer.ggml.bos_token_id"),
        eos_id=get("tokenizer.ggml.eos_token_id"),
        add_bos=bool(get("tokenizer.ggml.add_bos_token", False)),
        chat_template=str(get("tokenizer.chat_template", "")),
    )


def build_tokenizer(vocab: GgufVocab) -> Any:
    """A ``tokenizers.Tokenizer`` equal to the GGUF's (see the module docstring for what is
    supported). Raises ValueError for another tokenizer model or pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if vocab.model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {vocab.model!r} is not supported (only byte-level BPE, 'gpt2')")
    if vocab.pre not in SUPPORTED_PRE:
        raise ValueError(f"GGUF pre-tokenizer {vocab.pre!r} is not supported (only {', '.join(SUPPORTED_PRE)})")
    ids = {tok: i for i, tok in enumerate(vocab.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False))  # type: ignore[arg-type]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if vocab.pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(vocab.tokens, vocab.token_types,
                                                                              strict=True)
               if ty == CONTROL_TOKEN_TYPE]  # fmt: skip
    tok.add_special_tokens(special)
    return tok


def write_tokenizer_config(gguf_path: Path | str, out_path: Path | str) -> Path:
    """Write ``out_path``, a Hugging Face ``tokenizer_config.json`` holding the GGUF's chat template
    (``chat_template``), its BOS and EOS tokens as strings and ``add_bos_token``; returns it (written
    under a temporary name and renamed). Raises ValueError (see :func:`read_vocab`; also when the
    file has no chat template)."""
    import json

    vocab = read_vocab(gguf_path)
    if not vocab.chat_template:
        raise ValueError(f"{gguf_path}: no tokenizer.chat_template in the file")

    def token(i: int | None) -> str | None:
        return vocab.tokens[i] if i is not None and 0 <= i < len(vocab.tokens) else None

    config = {"chat_template": vocab.chat_template, "bos_token": token(vocab.bos_id), "eos_token": token(vocab.eos_id),
              "add_bos_token": vocab.add_bos}  # fmt: skip
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def write_tokenizer_json(gguf_path: Path | str, out_path: Path | str) -> Path:
    """Write ``out_path`` (a ``tokenizer.json``) from the GGUF file's tokenizer; returns it. The file
    is written under a temporary name and renamed, so a reader never sees half of it.

    Raises ValueError (see :func:`read_vocab`, :func:`build_tokenizer`)."""
    out = Path(out_path)
    tok = build_tokenizer(read_vocab(gguf_path))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tok.save(str(tmp))
    tmp.replace(out)
    return out
