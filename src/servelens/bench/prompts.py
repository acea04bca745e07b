"""Prompt text of an exact token length, with shared prefixes for shared Mooncake ``hash_ids``.

Two tokenizers:

* :class:`SimTokenizer` (default): the simulated engine's documented tokenizer
  (:mod:`servelens.sim.tokenizer`), where block texts concatenate additively, so a prompt built from
  blocks has exactly the summed token count and ``usage.prompt_tokens`` equals the target.
* :class:`FileTokenizer`: a Hugging Face ``tokenizer.json`` (``--tokenizer PATH``, via the
  ``tokenizers`` library) for a real engine. Texts are built from vocabulary words that encode as one
  token each and checked (and trimmed or padded at the tail) by encoding the whole prompt without
  special tokens. The engine's chat template and BOS token still add tokens: the bench records
  ``usage.prompt_tokens`` and the summary reports how far it was from the target.

Prefix sharing (Mooncake): block ``i`` of a request covers tokens ``[512 i, 512 (i+1))``; a full block's
text depends only on its hash id, so requests with the same leading ``hash_ids`` send byte-identical
leading text and an engine's prefix cache hits for real. A partial last block is keyed by
``(hash id, size)``.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from servelens.bench.traces import MOONCAKE_BLOCK_TOKENS


class TokenizerLike(Protocol):
    """What the prompt builder needs of a tokenizer."""

    name: str

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens)."""
        ...

    def make_text(self, n_tokens: int, key: object) -> str:
        """Deterministic text of ``n_tokens`` tokens for ``key`` (ends with a separator so texts
        concatenate, exactly for the sim's tokenizer and approximately for others)."""
        ...


class SimTokenizer:
    """The sim's tokenizer (one token per word or punctuation mark; see :mod:`servelens.sim.tokenizer`)."""

    name = "sim"

    def __init__(self) -> None:
        from servelens.sim import tokenizer as simtok

        self._tok = simtok

    def count_tokens(self, text: str) -> int:
        """``servelens.sim.tokenizer.count_tokens``."""
        return int(self._tok.count_tokens(text))

    def make_text(self, n_tokens: int, key: object) -> str:
        """``servelens.sim.tokenizer.make_text`` (exactly ``n_tokens``; additive under concatenation)."""
        return str(self._tok.make_text(n_tokens, key))


_WORD_RE = re.compile(r"^[a-z]{3,12}$")


class FileTokenizer:
    """A Hugging Face ``tokenizer.json`` loaded with the ``tokenizers`` library.

    Raises ValueError when the file cannot be loaded or has too few plain one-token words
    (fewer than 16 lowercase ASCII words that encode as exactly one token after a space).
    """

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - tokenizers is a declared extra
            raise ValueError(
                "--tokenizer needs the 'tokenizers' package: pip install 'servelens[tokenizers]'"
            ) from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception for bad files
            raise ValueError(f"cannot load tokenizer {path}: {exc}") from None
        self.name = f"file:{Path(path).name}"
        words: list[str] = []
        loose: list[str] = []  # one token on its own, but not after a space (e.g. some Metaspace vocabularies)
        vocab = self._tok.get_vocab()
        for tid in sorted(vocab.values()):
            w = self._tok.decode([tid]).strip()
            if not _WORD_RE.match(w):
                continue
            if len(self._tok.encode(" " + w, add_special_tokens=False).ids) == 1:
                words.append(w)
            elif len(loose) < 2048 and len(self._tok.encode(w, add_special_tokens=False).ids) == 1:
                loose.append(w)
            if len(words) >= 2048:
                break
        if len(words) < 16:
            # texts are still deterministic per key (shared prefixes stay byte-identical); fit() corrects
            # the total length, but a block is then only about, not exactly, block_tokens long
            words = words + loose
        if len(words) < 16:
            raise ValueError(f"tokenizer {path}: found only {len(words)} one-token words; cannot build prompts")
        self._words = tuple(words)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def make_text(self, n_tokens: int, key: object) -> str:
        """``n_tokens`` one-token words ``" w"`` chosen by a generator seeded from ``key``."""
        rng = random.Random(f"servelens-bench:{key!r}")
        words = self._words
        k = len(words)
        return "".join([" " + words[int(rng.random() * k)] for _ in range(n_tokens)])

    def fit(self, text: str, n_tokens: int, key: object) -> str:
        """Trim or pad the tail of ``text`` until it encodes to ``n_tokens`` (a few passes at most)."""
        for attempt in range(6):
            have = self.count_tokens(text)
            if have == n_tokens:
                break
            if have < n_tokens:
                text += self.make_text(n_tokens - have, (key, "pad", attempt))
            else:
                parts = text.split(" ")
                cut = max(1, len(parts) - (have - n_tokens))
                text = " ".join(parts[:cut])
        return text


def load_tokenizer(path: str | Path | None) -> TokenizerLike:
    """:class:`FileTokenizer` for ``path``, or :class:`SimTokenizer` when ``path`` is None."""
    return SimTokenizer() if path is None else FileTokenizer(path)


class PromptBuilder:
    """Builds prompt texts of exact token length, sharing block texts between requests.

    Args:
        tokenizer: a :class:`TokenizerLike`.
        block_tokens: prefix block size in tokens (Mooncake: 512).
        cache_blocks: how many full-block texts to keep (LRU), so shared blocks are built once.
    """

    def __init__(
        self, tokenizer: TokenizerLike, block_tokens: int = MOONCAKE_BLOCK_TOKENS, cache_blocks: int = 4096
    ) -> None:
        self.tokenizer = tokenizer
        self.block_tokens = block_tokens
        self._cache: OrderedDict[object, str] = OrderedDict()
        self._cache_max = cache_blocks

    def _block(self, key: object, n: int) -> str:
        cache = self._cache
        text = cache.get(key)
        if text is not None:
            cache.move_to_end(key)
            return text
        text = self.tokenizer.make_text(n, key)
        cache[key] = text
        if len(cache) > self._cache_max:
            cache.popitem(last=False)
        return text

    def build(self, isl_tokens: int, key: object, hash_ids: Sequence[int] = ()) -> str:
        """Prompt text of ``isl_tokens`` tokens.

        With ``hash_ids``, block ``i`` is the text of ``hash_ids[i]`` (shared across requests);
        tokens beyond ``len(hash_ids) * block_tokens`` are unique text for ``key``. Without, the
        whole text is unique to ``key``. Raises ValueError for ``isl_tokens < 1``.
        """
        if isl_tokens < 1:
            raise ValueError(f"prompt length must be >= 1 token, got {isl_tokens}")
        parts: list[str] = []
        left = isl_tokens
        bt = self.block_tokens
        for hid in hash_ids:
            if left <= 0:
                break
            n = min(bt, left)
            parts.append(self._block(("blk", hid), n) if n == bt else self.tokenizer.make_text(n, ("blk", hid, n)))
            left -= n
        if left > 0:
            parts.append(self.tokenizer.make_text(left, ("req", key)))
        text = "".join(parts)
        fit = getattr(self.tokenizer, "fit", None)
        if fit is not None:
            text = fit(text, isl_tokens, key)
        return text
