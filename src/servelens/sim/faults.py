"""Fault injection for the simulated engine (pure: parsing and the seeded global draw).

Per request: header ``x-servelens-fault: <mode>[,<mode>...]`` (and ``x-servelens-fault-delay-ms``
for ``slow_start``, ``slow_headers`` and ``stall_mid_stream``; default 500 ms). Globally: each
request, with probability ``rate``, gets one mode drawn uniformly from ``modes`` by a
``random.Random(seed)`` (so a run is reproducible for a given order of arrivals). Modes (exact names):

============================  ====================================================================
``http_429|500|503``          HTTP error with an OpenAI error body before any chunk
``error_mid_stream``          after half the tokens, ``data: {"error": {...}}`` inside the 200 stream,
                              then the stream ends (no ``[DONE]``); generation stops
``reset_mid_stream``          after half the tokens the TCP connection is reset (RST)
``no_done``                   all tokens, but no ``finish_reason``, no usage chunk, no ``[DONE]``
``malformed_chunk``           one extra ``data:`` event with broken JSON mid-way; the stream continues
``stall_mid_stream``          after half the tokens (streams of 2 or more tokens) the stream goes silent
                              for the delay (default 500 ms; no byte at all, not even a comment), then
                              continues to its normal end; the engine generates on meanwhile (the
                              truth's token times are the engine's, the chunks after the cut are
                              written after the stall); a non-streaming response is unaffected
``slow_headers``              nothing at all (no response headers) for the delay (default 500 ms), and
                              the request reaches the engine only after it; then the response as usual
                              (stream or not). A client that leaves meanwhile: truth ``cancelled``,
                              ``osl`` 0, never admitted
``null_details``              every usage object carries ``"prompt_tokens_details": null`` (cached
                              tokens not reported, as some engines do), streamed or not, whether or not
                              the prefix cache is on; the truth's ``cached_tokens`` is still the engine's
``slow_start``                headers at once, the request reaches the engine only after the delay
                              (default 500 ms), with ``: ping`` comments every 100 ms meanwhile; a
                              chat stream's role-only chunk still comes at once (before prefill, as
                              in vLLM), so there the first *output* chunk is the late one
``keepalive``                 ``: keep-alive`` comments and ``id:``/``retry:``-only blocks between chunks
``role_first``                role-only first chat chunk with empty content (always on for chat, as
                              in vLLM; the name is accepted for explicitness)
``coalesce``                  events written two per TCP write
``split``                     each event written in two writes, split inside a multi-byte UTF-8
                              character when it has one (output words are then all multi-byte)
``crlf``                      ``\\r\\n`` line endings
``reasoning``                 chat deltas carry ``reasoning_content`` only
``tool_calls``                chat deltas carry a tool call (``finish_reason: tool_calls``)
``multi_token``               4 tokens per decode step and per chunk
============================  ====================================================================
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass

HTTP_FAULTS: dict[str, int] = {"http_429": 429, "http_500": 500, "http_503": 503}
FAULT_MODES: tuple[str, ...] = (
    "http_429", "http_500", "http_503", "error_mid_stream", "reset_mid_stream", "no_done",
    "malformed_chunk", "slow_start", "keepalive", "role_first", "coalesce", "split", "crlf",
    "reasoning", "tool_calls", "multi_token", "stall_mid_stream", "slow_headers", "null_details",
)
FAULT_HEADER = "x-servelens-fault"
DELAY_HEADER = "x-servelens-fault-delay-ms"
DEFAULT_DELAY_MS = 500
MULTI_TOKENS_PER_STEP = 4


def parse_modes(text: str | Iterable[str]) -> frozenset[str]:
    """Mode names from ``"a,b"`` (or an iterable); blanks ignored.

    Raises ValueError naming an unknown mode and the known ones.
    """
    items = text.split(",") if isinstance(text, str) else list(text)
    modes = {m.strip() for m in items if m.strip()}
    bad = sorted(modes - set(FAULT_MODES))
    if bad:
        raise ValueError(f"unknown fault mode(s) {', '.join(bad)}; known: {', '.join(FAULT_MODES)}")
    return frozenset(modes)


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one request.

    Attributes:
        modes: the mode names.
        delay_ms: the ``slow_start``, ``slow_headers`` and ``stall_mid_stream`` delay (ms).
    """

    modes: frozenset[str] = frozenset()
    delay_ms: int = DEFAULT_DELAY_MS

    def __contains__(self, mode: str) -> bool:
        return mode in self.modes

    @property
    def http_status(self) -> int | None:
        """The status of the first HTTP fault (429 before 500 before 503), or None."""
        for name in ("http_429", "http_500", "http_503"):
            if name in self.modes:
                return HTTP_FAULTS[name]
        return None


class FaultInjector:
    """Global random faults plus per-request headers.

    Args:
        rate: probability in [0, 1] that a request without a fault header gets one global mode.
        modes: the modes drawn from (all of :data:`FAULT_MODES` when empty and ``rate > 0``).
        seed: seed of the draw.

    Raises ValueError for a rate outside [0, 1] or an unknown mode.
    """

    def __init__(self, rate: float = 0.0, modes: Iterable[str] | str = (), seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {rate!r}")
        self.rate = rate
        parsed = parse_modes(modes)
        self.modes: tuple[str, ...] = tuple(sorted(parsed)) if parsed else FAULT_MODES
        self._rng = random.Random(seed)

    def plan(self, header: str | None, delay_header: str | None) -> FaultPlan:
        """The plan for one request from its headers (header wins over the global draw).

        Raises ValueError for an unknown mode or a bad delay.
        """
        delay = DEFAULT_DELAY_MS
        if delay_header is not None:
            try:
                delay = int(delay_header)
            except ValueError:
                raise ValueError(f"{DELAY_HEADER} must be an integer number of ms") from None
            if delay < 0 or delay > 600_000:
                raise ValueError(f"{DELAY_HEADER} must be in [0, 600000]")
        if header is not None and header.strip():
            return FaultPlan(parse_modes(header), delay)
        if self.rate > 0 and self._rng.random() < self.rate:
            return FaultPlan(frozenset([self._rng.choice(self.modes)]), delay)
        return FaultPlan(frozenset(), delay)
