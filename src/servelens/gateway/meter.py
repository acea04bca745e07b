"""Per-request stream measurement (and usage stripping) for the relay (:mod:`.relay`); no I/O.

:class:`StreamMeter` is fed the upstream body exactly as it is read (``feed(t_ns, data)``) and
drives a :class:`~servelens.core.state.LiveRequest`:

* SSE blocks come from the core :class:`~servelens.core.sse.SSEDecoder` (splits across reads,
  several events per read, ``\\r\\n``, comments, ``id:``/``retry:``-only blocks);
  each ``data`` payload is read by :func:`~servelens.core.openai.parse_chunk`.
* TTFT: the first chunk carrying output (content, reasoning, tool-call delta, completion text);
  a role-only chunk is not output (definition in :mod:`servelens.core.timing`).
* Tokens per chunk for ITL (:class:`~servelens.core.stream.FirstChoiceTokens`): the increase of the
  first choice's cumulative ``usage.completion_tokens`` when every output chunk carries usage
  (``continuous_usage_stats``): a chunk whose count did not move carries no token, one whose count
  moved carries tokens even with empty text; else one token per output chunk.
* ISL: ``usage.prompt_tokens`` from the first chunk carrying usage. Source
  ``first_chunk_usage`` when it arrives no later than the first output chunk, else
  ``final_usage`` (the by-ISL TTFT is then observed at that moment).
* OSL and cached tokens: the *last* cumulative usage seen (never summed); an absent
  ``cached_tokens`` stays unknown. Without any usage, OSL is the counted output tokens and
  :attr:`StreamMeter.osl_from_usage` is False.
* Several choices (``n`` > 1; seen on the first chunk with a choice ``index`` other than 0): the
  choices decode together and their chunks interleave, so TTFT and ITL are those of the first
  choice (``index`` 0), from its own cumulative counts (vLLM and SGLang put each choice's own count on
  its chunks; vLLM too measures each sequence of a request on its own); OSL is
  ``usage.completion_tokens`` of a usage-only chunk (``choices`` empty: the sum over choices), else
  output chunks of every choice; without ``[DONE]`` the stream is complete only when every choice seen finished.
* Outcome (:meth:`StreamMeter.outcome`, :func:`~servelens.core.stream.stream_outcome`): an in-stream
  error (an ``error`` object, ``"object": "error"``, an SSE ``event: error``) or a malformed ``data``
  payload -> ``backend_error``; a stream with neither ``finish_reason`` nor ``[DONE]``, or whose body
  ended inside an event (a last event without its blank line that does not parse) ->
  ``truncated_stream``; a stream that produced nothing (no output chunk, no completion token counted)
  -> ``backend_error``; else success (docs/counting.md).

When the gateway injected usage the client did not ask for (``strip`` is not
:data:`~servelens.gateway.usage.STRIP_NONE`), ``feed`` returns the bytes to send instead:
whole blocks only, with the injected usage removed (see :mod:`servelens.gateway.usage`).

Sending first, measuring after: :meth:`StreamMeter.relay` does only what the bytes to send
depend on (finding block ends and cutting usage out, on the bytes) and queues the rest;
:meth:`StreamMeter.measure` reads the queued blocks later (the gateway calls it once the event
loop has written out what it read in the same turn). Times are those passed with each read, so a
later measurement is the same measurement; ``feed`` is ``relay`` then ``measure``.

An event still unfinished after :data:`MAX_EVENT_BYTES` (an upstream that never ends its line or
its event) is not held any longer: the stream counts as ``backend_error`` and the rest of it is
relayed as it comes, unmeasured and unstripped (memory stays bounded; the relay's back-pressure
applies, as it cannot while a block is held back for stripping).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

from servelens.core.openai import ChunkInfo, choice_index, decode_json, parse_chunk
from servelens.core.sse import SSEBlock, SSEDecoder
from servelens.core.state import LiveRequest
from servelens.core.stream import FirstChoiceTokens, cut_mid_event, stream_outcome
from servelens.gateway.usage import (
    STRIP_ALL,
    STRIP_CONTINUOUS_NULL,
    STRIP_NONE,
    choices_empty,
    cut_member,
    is_usage_only,
    null_usage,
    remove_usage,
    usage_span,
)

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Largest unfinished SSE event held (bytes); a streamed chunk is normally one token's worth."""


_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)?")


def _with_data(raw: bytes, data: bytes, lead_bom: bool = False) -> bytes:
    """SSE block ``raw`` with its ``data`` lines replaced by ``data`` (one ``data:`` line per line
    of it, where the first data line was); other lines (comments, ``id:``, ``event:``, a leading
    ``\\n`` that completed the previous block's ``\\r\\n``) as they were, with the block's own line
    ending, and its blank line only if it had one. ``lead_bom``: ``raw`` starts with the byte order
    mark the decoder skipped at the start of the stream (elsewhere a BOM is part of a field name)."""
    out: list[bytes] = []
    eol = b"\n"
    placed = False
    lines = [m.group() for m in _LINE.finditer(raw) if m.group()]
    blank = len(lines) > 1 and lines[-1] in (b"\n", b"\r\n", b"\r")
    for i, line in enumerate(lines[:-1] if blank else lines):
        if lead_bom and i == 0:
            out.append(line[:3])
            line = line[3:]
        text = line.rstrip(b"\r\n")
        if text != line:
            eol = line[len(text):]
        if text.split(b":", 1)[0] == b"data":
            if not placed:
                out.append(b"".join(b"data: " + part + eol for part in data.split(b"\n")))
                placed = True
            continue
        out.append(line)  # other lines, and an empty one opening the block (the rest of a \r\n)
    return b"".join(out) + (lines[-1] if blank else b"")


class _Unparsed(SSEDecoder):
    """The decoder of a stream given up on: every read is one block of raw bytes without data."""

    __slots__ = ()

    def decode(self, chunk: bytes) -> list[SSEBlock]:
        return [SSEBlock(None, None, None, chunk)]

    def flush(self) -> list[SSEBlock]:
        return []


class StreamMeter:
    """Measures one streaming response. Not thread-safe; one per request.

    Args:
        live: the request being measured.
        strip: how to remove injected usage from what is returned by :meth:`feed`.
    """

    __slots__ = (
        "_append",
        "_choices_done",
        "_choices_seen",
        "_decoder",
        "_other_outputs",
        "_queue",
        "_tokens",
        "_uncached",
        "blocks",
        "cached_tokens",
        "completion_tokens",
        "cut",
        "done",
        "error",
        "finish_reason",
        "live",
        "malformed",
        "multi",
        "produced",
        "prompt_tokens",
        "strip",
        "usage_key_on_chunks",
    )

    def __init__(self, live: LiveRequest, strip: int = STRIP_NONE) -> None:
        self.live = live
        self.strip = strip
        self._decoder = SSEDecoder()
        self._queue: list[tuple[int, bytes | SSEBlock]] = []  # read, not yet measured (see relay)
        self._append: Callable[[int], None] | None = None  # bound after the first output chunk
        self._tokens = FirstChoiceTokens()
        self._other_outputs = 0  # output chunks of choices other than the first (n > 1)
        self._choices_seen: set[int] = set()  # n > 1: the choices' indexes seen, and those finished
        self._choices_done: set[int] = set()
        self.multi = False
        """Several choices in the stream (``n`` > 1): TTFT and ITL from the first choice only."""
        self.blocks = 0
        self.done = False
        self.malformed = False
        self.cut = False
        """The body ended inside an event (a last event without its blank line that does not parse)."""
        self.produced = False
        """The stream carried output: an output-bearing chunk (any choice), or a completion count > 0."""
        self.error: str | None = None
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._uncached = live.uncached_enabled
        self.usage_key_on_chunks: bool | None = None
        """Whether the first chunk with choices had ``"usage": null`` (None: no such chunk)."""

    def feed(self, t_ns: int, data: bytes) -> bytes | None:
        """Bytes read from the upstream at ``t_ns`` (int ns, the clock of ``live``), measured now.

        Returns None when not stripping (send ``data`` as it is), else the bytes to send now
        (possibly empty: an incomplete block is held until its end arrives).
        """
        out = self.relay(t_ns, data)
        self.measure()
        return out

    def relay(self, t_ns: int, data: bytes) -> bytes | None:
        """Like :meth:`feed`, but only what the bytes to send depend on is done now; the reads are
        measured by the next :meth:`measure` (or :meth:`end`), with the times given here."""
        if self.strip == STRIP_NONE:
            self._queue.append((t_ns, data))  # sent as it is: nothing to read before it goes
            return None
        blocks = self._decoder.decode(data)
        if not blocks and self._decoder.pending_bytes > MAX_EVENT_BYTES:
            return self._give_up()
        queue = self._queue
        out: list[bytes] = []
        for blk in blocks:
            if blk.data is None:
                out.append(blk.raw)
            else:
                queue.append((t_ns, blk))
                out.append(self._strip(blk))
        return b"".join(out)

    def measure(self) -> None:
        """Measure every read queued by :meth:`relay` since the last call (a no-op when none)."""
        queue = self._queue
        if not queue:
            return
        self._queue = []
        if self.strip != STRIP_NONE:
            for t_ns, blk in queue:
                self._measure(t_ns, blk)  # type: ignore[arg-type]
            return
        decoder = self._decoder
        for t_ns, data in queue:
            blocks = decoder.decode(data)  # type: ignore[arg-type]
            if not blocks and decoder.pending_bytes > MAX_EVENT_BYTES:
                self._give_up()
                return
            for blk in blocks:
                if blk.data is not None:
                    self._measure(t_ns, blk)

    def _give_up(self) -> bytes | None:
        """An event over :data:`MAX_EVENT_BYTES`: stop parsing; its bytes go out when stripping
        (else they were sent already), and so does everything after them."""
        held = self._decoder.discard()
        self._decoder = _Unparsed()
        self.malformed = True
        return held if self.strip != STRIP_NONE else None

    def end(self, t_ns: int) -> bytes | None:
        """The upstream body ended (measures what is queued first); returns the held bytes when
        stripping (else None). A last event without its blank line is read when it parses, and is the
        stream cut mid-event when it does not (:func:`~servelens.core.stream.cut_mid_event`:
        ``truncated_stream``, not a malformed chunk)."""
        self.measure()
        out: list[bytes] = []
        for blk in self._decoder.flush():
            if blk.data is None:
                out.append(blk.raw)
            else:
                self._measure(t_ns, blk, last=True)
                out.append(self._strip(blk))
        return b"".join(out) if self.strip != STRIP_NONE else None

    def _strip(self, blk: SSEBlock) -> bytes:
        """The bytes to send for one data block, with the injected usage cut out.

        A chunk whose top-level ``usage`` is set and whose ``choices`` are empty or absent exists
        only to carry usage (:func:`~servelens.gateway.usage.is_usage_only`): dropped for
        :data:`STRIP_ALL`, kept for the others. On other chunks the member is cut out, or its
        value made ``null`` for :data:`STRIP_CONTINUOUS_NULL`. An error event is sent as it came.

        Read on the bytes when the block is one ``data:`` line (what engines send) and the bytes
        settle it; else, and before a chunk is dropped, the event is decoded (so a malformed event
        or an error event is never dropped). A malformed event whose bytes hold a top-level
        ``"usage"`` member may have it cut (it is measured as ``backend_error`` either way)."""
        raw = blk.raw
        if b'"usage"' not in raw:
            return raw
        body = raw.rstrip(b"\r\n")
        one_line = raw.startswith(b"data:") and b"\n" not in body and b"\r" not in body
        if not one_line or b'"error"' in raw or raw[5:raw.find(b"{")].strip():
            return self._strip_decoded(blk, one_line)  # not one data line holding an object: decode it
        span = usage_span(raw)
        if span is None:
            return raw
        key, value, end = span
        if raw[value:end] != b"null":
            only = choices_empty(raw)
            if only is None or (only and self.strip == STRIP_ALL):
                return self._strip_decoded(blk, True)  # not settled on the bytes, or about to drop it
            if only:
                return raw
        if self.strip == STRIP_CONTINUOUS_NULL:
            return raw[:value] + b"null" + raw[end:]
        return cut_member(raw, key, end)

    def _strip_decoded(self, blk: SSEBlock, one_line: bool) -> bytes:
        """:meth:`_strip` on the decoded event (its ``data`` field); ``one_line``: the block is a
        single ``data:`` line."""
        raw = blk.raw
        try:
            obj = decode_json(blk.data or "")
        except (ValueError, msgspec.DecodeError):  # not JSON: measured as malformed, sent as it came
            return raw
        if not isinstance(obj, dict) or "usage" not in obj or obj.get("error") is not None:
            return raw
        if is_usage_only(obj):
            return b"" if self.strip == STRIP_ALL else raw
        cut = null_usage if self.strip == STRIP_CONTINUOUS_NULL else remove_usage
        if one_line:
            return cut(raw)
        # the JSON spans several data: lines (legal SSE, joined with \n): cut it as one text, and
        # send the event with that text in data: lines and its other lines as they came
        return _with_data(raw, cut((blk.data or "").encode()), lead_bom=blk is self._decoder.bom_block)

    def _measure(self, t_ns: int, blk: SSEBlock, last: bool = False) -> None:
        """Read one data block; ``last``: the one the body's end dispatched without its blank line."""
        self.blocks += 1
        data = blk.data
        assert data is not None
        info = parse_chunk(data, blk.event)
        if info.done:
            self.done = True
            return
        if info.malformed:
            if last and cut_mid_event(info):
                self.cut = True
            else:
                self.malformed = True
            return
        if info.error is not None:
            if self.error is None:
                self.error = info.error
            return
        live = self.live
        usage = info.usage
        if info.has_output:
            self.produced = True
        if info.several_choices or self.multi:
            self._several(info)
        tokens = self._tokens.step(info)
        if usage is not None:
            pt = usage.prompt_tokens
            if pt is not None:
                self.prompt_tokens = pt
                if live.isl is None:
                    first = live.timer.first_output_ns is None
                    live.set_isl(pt, "first_chunk_usage" if first else "final_usage")
            ct = usage.completion_tokens
            if ct is not None:
                if ct:
                    self.produced = True
                if not self.multi or not info.choices:
                    self.completion_tokens = ct
            if usage.cached_tokens is not None:
                if self.cached_tokens is None and self._uncached:  # latches the uncached bucket (opt-in)
                    live.set_cached(usage.cached_tokens,
                                    "first_chunk_usage" if live.timer.first_output_ns is None else "final_usage")
                self.cached_tokens = usage.cached_tokens
        if tokens:
            append = self._append
            if append is not None and tokens == 1:
                append(t_ns)  # the per-token hot path: one append (see LiveRequest.chunk_times_ns)
            else:
                live.output(t_ns, tokens)
                if append is None:
                    self._append = live.chunk_times_ns.append
        if info.finish_reason is not None and self.finish_reason is None:
            self.finish_reason = info.finish_reason
        if self.usage_key_on_chunks is None:
            obj = info.obj
            if obj is not None and obj.get("choices"):
                self.usage_key_on_chunks = "usage" in obj and obj["usage"] is None

    def _several(self, info: ChunkInfo) -> None:
        """A chunk of a stream with several choices (see the module docstring): which choices
        were seen and which finished; output chunks of the other choices counted."""
        if not self.multi:
            self.multi = True
            # chunks so far were the first choice's: their usage was its own count (vLLM's and SGLang's
            # continuous usage is per choice); only a usage-only chunk (choices empty) counts every choice
            self.completion_tokens = None
            self._choices_seen = {0}
            self._choices_done = {0} if self.finish_reason is not None else set()
        self._other_outputs += info.outputs - info.first_output
        choices = (info.obj or {}).get("choices")
        for ch in choices if isinstance(choices, list) else ():
            if isinstance(ch, dict):
                index = choice_index(ch)
                self._choices_seen.add(index)
                if ch.get("finish_reason"):
                    self._choices_done.add(index)

    @property
    def osl_from_usage(self) -> bool:
        """True when OSL comes from ``usage.completion_tokens`` (else from counted chunks)."""
        return self.completion_tokens is not None

    @property
    def osl(self) -> int:
        """``usage.completion_tokens`` (last cumulative value), else output tokens counted."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return self.live.timer.output_tokens + self._other_outputs

    def outcome(self) -> tuple[str, str]:
        """``(status, error_type)`` of a stream that ended (see the module docstring and
        :func:`~servelens.core.stream.stream_outcome`)."""
        complete = self.done or (self.finish_reason is not None and self._choices_seen <= self._choices_done)
        error_type = stream_outcome(failed=self.error is not None or self.malformed, complete=complete,
                                    produced=self.produced, cut=self.cut)
        return ("error", error_type) if error_type else ("success", "")
