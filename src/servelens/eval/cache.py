"""The response cache of an eval run: one JSON line per answered request, appended as each answer
arrives, so an interrupted run loses nothing and a rerun sends only what is missing.

The key is SHA-256 over the canonical JSON (sorted keys, no spaces) of the endpoint URL the request
went to, the model, the whole request body and the run index: a reply is only ever reused for the
same request to the same deployment in the same repetition. (lm-evaluation-harness keyed its cache
without the model and served model A's replies as model B's: lm-eval issue 4063.)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

CACHE_FILE = "cache.jsonl"


def cache_key(url: str, model: str, body: Any, run: int) -> str:
    """The hex SHA-256 of ``{"url", "model", "request", "run"}`` as canonical JSON.

    Args:
        url: the full URL the request is posted to (``http://host:port/v1/chat/completions``).
        model: the model name.
        body: the request body (any JSON value).
        run: the run index (0-based; ``--runs K`` repeats with 0..K-1).
    """
    canon = json.dumps({"url": url, "model": model, "request": body, "run": run}, sort_keys=True,
                       separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedReply:
    """A stored answer: the response body and how long it took the first time (ns)."""

    response: Any
    latency_ns: int


class ResponseCache:
    """Answers by key, read from and appended to ``path``.

    Args:
        path: the cache file (created on the first answer).
        read: False ignores what the file holds (``--no-cache``: fresh calls); new answers are still
            appended, and the last line of a key wins when the file is read again.

    Raises ValueError when an existing file is not a cache file.
    """

    def __init__(self, path: Path, read: bool = True) -> None:
        self.path = path
        self._entries: dict[str, CachedReply] = {}
        self._file: TextIO | None = None
        if read and path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        good = 0  # bytes up to the end of the last whole line
        for n, line in enumerate(data.splitlines(keepends=True)):
            if not line.endswith(b"\n"):
                break  # the last line of an interrupted write: cut off below, so appends start clean
            try:
                obj = json.loads(line)
                self._entries[obj["key"]] = CachedReply(obj["response"], int(obj["latency_ns"]))
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{self.path} line {n + 1}: not a servelens eval cache line") from None
            good += len(line)
        if good < len(data):
            with self.path.open("r+b") as f:
                f.truncate(good)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedReply | None:
        """The stored answer for ``key``, or None."""
        return self._entries.get(key)

    def put(self, key: str, response: Any, latency_ns: int) -> None:
        """Store an answer and append it to the file (flushed). Raises OSError when it cannot be written."""
        self._entries[key] = CachedReply(response, latency_ns)
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps({"key": key, "latency_ns": latency_ns, "response": response},
                                    ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
