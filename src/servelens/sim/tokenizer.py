"""The simulated engine's deterministic tokenizer (pure; no I/O, no clock).

Rule: **one token per maximal run of word characters** (``\\w+``, Unicode-aware, so ``café`` or
``日本`` is one token) **and one token per other non-space character** (punctuation, symbols).
Whitespace separates tokens and is never a token. Formally the tokens of ``text`` are
``re.findall(r"\\w+|[^\\w\\s]", text)``.

Consequences a caller can rely on:

- ``count_tokens("Hello, world!") == 4`` (``Hello`` ``,`` ``world`` ``!``).
- Texts that end with whitespace concatenate additively:
  ``count_tokens(a + b) == count_tokens(a) + count_tokens(b)`` whenever ``a`` ends with whitespace
  (or is empty). :func:`make_text` always returns such a text, so a prompt built from per-block
  texts (e.g. one text per 512-token Mooncake ``hash_id``) has exactly the sum of the block sizes.
- Chat prompts count the message contents only: ``prompt_tokens`` is the sum over messages of
  ``count_tokens(content)`` (text parts of a list content are summed); roles and the chat template
  add **no** tokens. See :func:`chat_prompt_tokens`.

Token ids (``/tokenize``, and ``/v1/completions`` prompts given as id lists) are
``zlib.crc32(token.encode("utf-8")) % VOCAB_SIZE``: stable across processes and platforms.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Sequence
from typing import Any

VOCAB_SIZE = 128_000
"""Token ids are in ``[0, VOCAB_SIZE)``."""

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# Plain ASCII words used for built prompts (each is exactly one token).
WORDS: tuple[str, ...] = (
    "the", "model", "token", "cache", "prefix", "batch", "engine", "latency", "request", "stream",
    "server", "decode", "prefill", "queue", "block", "memory", "kernel", "tensor", "layer", "weight",
    "answer", "question", "data", "value", "time", "first", "second", "input", "output", "length",
    "river", "mountain", "forest", "city", "window", "garden", "yellow", "purple", "quiet", "rapid",
    "north", "south", "east", "west", "alpha", "beta", "gamma", "delta", "omega", "sigma",
    "apple", "orange", "lemon", "cherry", "bread", "water", "stone", "paper", "glass", "metal",
)
# One-token words with multi-byte UTF-8 characters (used in generated text; see ``fault split``).
MULTIBYTE_WORDS: tuple[str, ...] = (
    "café", "naïve", "über", "façade", "señor", "smörgåsbord", "déjà", "crème", "Ærø", "日本",
    "東京", "привет", "κόσμος", "straße", "jalapeño",
)
OUTPUT_WORDS: tuple[str, ...] = WORDS + MULTIBYTE_WORDS


def split_tokens(text: str) -> list[str]:
    """The token strings of ``text`` (see the module rule)."""
    return _TOKEN_RE.findall(text)


_ID_CACHE: dict[str, int] = {}
_ID_CACHE_MAX = 262_144


def token_id(token: str) -> int:
    """The id of one token string: ``crc32(utf-8) % VOCAB_SIZE``."""
    return zlib.crc32(token.encode("utf-8")) % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; ``len(tokenize(t)) == count_tokens(t)``."""
    toks = _TOKEN_RE.findall(text)
    cache = _ID_CACHE
    try:
        return [cache[t] for t in toks]
    except KeyError:
        if len(cache) > _ID_CACHE_MAX:
            cache.clear()
        for t in toks:
            if t not in cache:
                cache[t] = token_id(t)
        return [cache[t] for t in toks]


def count_tokens(text: str) -> int:
    """Number of tokens in ``text`` (see the module rule)."""
    return len(_TOKEN_RE.findall(text))


def _rng(key: object) -> random.Random:
    # random.Random(str) seeds from a SHA-512 of the string: identical in every process.
    return random.Random(f"servelens-sim:{key!r}")


def make_text(n_tokens: int, seed_or_prefix_key: object = 0) -> str:
    """Text of exactly ``n_tokens`` tokens, deterministic in ``seed_or_prefix_key``.

    The text is ``n_tokens`` ASCII words, each followed by one space (so it ends with a space and
    texts concatenate additively; ``make_text(0, k) == ""``). The same key and length always give
    the same text, in every process, so shared prefixes built from the same keys are real prefix
    cache hits. The key may be any value with a stable ``repr`` (int, str, tuple of those).

    Raises ValueError if ``n_tokens`` is negative.
    """
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    rng = _rng(seed_or_prefix_key)
    words = WORDS
    k = len(words)
    return "".join([words[int(rng.random() * k)] + " " for _ in range(n_tokens)])


def content_text(content: Any) -> str:
    """The text of a chat message ``content``: a string, a list of parts (``text`` parts joined by
    a space), or None (empty). Raises ValueError for any other shape."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, dict):
                if part.get("type", "text") == "text":
                    text = part.get("text", "")
                    if not isinstance(text, str):
                        raise ValueError("content part 'text' must be a string")
                    parts.append(text)
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise ValueError("content parts must be objects")
        return " ".join(parts)
    raise ValueError("message content must be a string, a list of parts, or null")


def chat_prompt_tokens(messages: Sequence[Any]) -> list[int]:
    """Prompt token ids of a chat request: the concatenation of each message content's tokens.

    ``len(result) == sum(count_tokens(content_text(m["content"])))``; roles, names and the chat
    template add no tokens. Raises ValueError for a malformed message list.
    """
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        ids.extend(tokenize(content_text(m.get("content"))))
    return ids


def generated_words(n: int, key: object, multibyte_only: bool = False) -> list[str]:
    """The ``n`` output words of a request, deterministic in ``key`` (seed and prompt).

    Each is one token; the streamed text of token i is ``" " + words[i]``. Words come from
    :data:`OUTPUT_WORDS` (which includes multi-byte UTF-8 words), or only from
    :data:`MULTIBYTE_WORDS` when ``multibyte_only``.
    """
    rng = _rng(("out", key))
    pool = MULTIBYTE_WORDS if multibyte_only else OUTPUT_WORDS
    k = len(pool)
    return [pool[int(rng.random() * k)] for _ in range(n)]
