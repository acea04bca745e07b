"""Per-request debug log (JSONL), for accuracy checks against an engine's own records.

One line per measured request, written when it finishes. Fields (units in the names):
``upstream_request_id`` (the upstream's ``x-request-id`` response header, or null), ``model``,
``endpoint``, ``request_type``, ``isl`` (tokens or null), ``isl_source``, ``bucket`` (ISL
bucket label or null), ``ttft_s`` (null without output), ``duration_s``, ``osl``,
``osl_source`` (``usage`` or ``chunks``), ``cached_tokens`` (null when unknown),
``output_chunks``, ``status``, ``error_type``, ``http_status``, ``arrival_ns`` and
``first_output_ns`` (``time.perf_counter_ns()`` of the gateway process, CLOCK_MONOTONIC on Linux,
so they compare with an engine's timestamps on the same machine). With ``chunks`` (the gateway's
``--request-log-chunks``) also ``chunk_offsets_ns`` (every output chunk's arrival, as read, minus
``arrival_ns``; of the first choice when ``n`` > 1) and ``chunk_tokens`` (the tokens the gateway
counted in each), as the bench's results file has them; else both are null.
Request headers (``Authorization`` included) and bodies are never written.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import msgspec


@dataclass(frozen=True)
class RequestLogEntry:
    """One line of the request log (see the module docstring for the fields)."""

    upstream_request_id: str | None
    model: str
    endpoint: str
    request_type: str
    isl: int | None
    isl_source: str
    bucket: str | None
    ttft_s: float | None
    duration_s: float
    osl: int | None
    osl_source: str
    cached_tokens: int | None
    output_chunks: int
    status: str
    error_type: str
    http_status: int
    arrival_ns: int
    first_output_ns: int | None
    chunk_offsets_ns: tuple[int, ...] | None = None
    chunk_tokens: tuple[int, ...] | None = None


class RequestLog:
    """Appends :class:`RequestLogEntry` lines to ``path`` (created, or appended to).

    Args:
        path: the file.
        chunks: the entries carry every output chunk's time and tokens (see the module docstring).

    Raises OSError when the file cannot be opened.
    """

    def __init__(self, path: str | Path, chunks: bool = False) -> None:
        self.path = Path(path)
        self.chunks = chunks
        self._fh: IO[bytes] | None = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        self._encode = msgspec.json.Encoder().encode

    def write(self, entry: RequestLogEntry) -> None:
        """Append one line and flush it (readers see it at once)."""
        if self._fh is None:
            return
        self._fh.write(self._encode(asdict(entry)) + b"\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file; later writes are dropped."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_request_log(path: str | Path) -> list[dict[str, object]]:
    """Read a request log back (a list of dicts, in file order)."""
    dec = msgspec.json.Decoder()
    with open(path, "rb") as fh:
        return [dec.decode(line) for line in fh if line.strip()]
