"""Property-based tests (hypothesis) of the stream meter: the relay stays byte-exact and what is
measured (which reads are stamped as tokens, tokens per chunk, ISL, OSL, cached tokens, outcome) does
not depend on how the bytes were split into reads. Synthetic times: a read is stamped with the offset
just past its last byte, so the reference, the stream fed one byte at a time, stamps each event with
the offset at which it became complete; any other split must stamp it with the end of the read that
holds that byte."""

from __future__ import annotations

import bisect
import itertools
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from servelens.gateway.meter import StreamMeter
from servelens.gateway.usage import STRIP_ALL, STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL, STRIP_NONE
from servelens.prometheus import FrontendMetrics

USAGE = st.one_of(
    st.none(),
    st.builds(lambda pt, ct, cached: {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct,
                                      **({"prompt_tokens_details": {"cached_tokens": cached}} if cached else {})},
              st.integers(0, 2000), st.integers(0, 40), st.sampled_from([None, 0, 64])),
)
TEXT = st.one_of(st.just(""), st.text(max_size=6))


@st.composite
def chunk(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["content", "content", "content", "role", "usage_only", "finish", "several"]))
    if kind == "usage_only":
        obj: dict[str, Any] = {"choices": [], "usage": draw(USAGE)}
    else:
        index = draw(st.sampled_from([0, 0, 0, 1]))
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if kind == "role" else {"content": draw(TEXT)}
        choice = {"index": index, "delta": delta, "finish_reason": "stop" if kind == "finish" else None}
        choices = [choice, {**choice, "index": 1}] if kind == "several" else [choice]
        obj = {"id": "c", "object": "chat.completion.chunk", "choices": choices}
        usage = draw(USAGE)
        if usage is not None or draw(st.booleans()):
            obj["usage"] = usage
        if draw(st.booleans()):
            obj = dict(reversed(list(obj.items())))  # usage first
    spaced = draw(st.booleans())
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=(", ", ": ") if spaced else (",", ":"))
    if draw(st.integers(0, 9)) == 0:  # the JSON over two data: lines (legal SSE)
        cut = draw(st.integers(0, len(text)))
        return b"data: " + text[:cut].encode() + b"\ndata: " + text[cut:].encode()
    return b"data: " + text.encode()


EVENT = st.one_of(
    chunk(), chunk(), chunk(), chunk(),
    st.sampled_from([b"data: [DONE]", b": ping", b"id: 3", b"event: error\ndata: {\"message\": \"boom\"}",
                     b'data: {"object": "error", "message": "bad", "code": 400}', b"data: {not json",
                     b'data: {"error": {"message": "x"}}', b"retry: 5"]),
)


@st.composite
def stream(draw: Any) -> bytes:
    eol = draw(st.sampled_from([b"\n", b"\r\n", b"\r"]))
    events = draw(st.lists(EVENT, max_size=14))
    body = b"".join(e.replace(b"\n", eol) + eol + eol for e in events)
    if draw(st.booleans()):
        body = body[:draw(st.integers(0, len(body)))]  # cut anywhere (truncated stream)
    return (b"\xef\xbb\xbf" if draw(st.integers(0, 5)) == 0 else b"") + body


def run(data: bytes, parts: list[bytes], strip: int, measure_every: list[bool]) -> tuple[Any, ...]:
    m = FrontendMetrics(isl_buckets="512,1024")
    m.register_model("m")
    live = m.begin("m", "chat_completions", "stream", arrival_ns=0)
    meter = StreamMeter(live, strip)
    sent: list[bytes] = []
    t = 0
    for i, part in enumerate(parts):
        t += len(part)
        out = meter.relay(t, part)
        sent.append(part if out is None else out)
        if measure_every[i % len(measure_every)]:
            meter.measure()  # the relay measures after the loop's turn: any number of reads later
    end = meter.end(len(data) + 1)
    sent.append(end or b"")
    status, etype = meter.outcome()
    rec = live.finish(len(data) + 2, status, etype, osl=meter.osl, cached_tokens=meter.cached_tokens)
    times = list(live.timer.times_ns)
    tokens = [live.timer.chunk_tokens.get(i, 1) for i in range(1, len(times))]
    figures = (tokens, rec.isl, meter.osl, meter.osl_from_usage, meter.cached_tokens, meter.prompt_tokens,
               (status, etype), meter.multi, meter.done, meter.error, meter.malformed)
    return times, figures, b"".join(sent)


STRIPS = st.sampled_from([STRIP_NONE, STRIP_ALL, STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL])


@given(stream(), st.lists(st.integers(min_value=0), max_size=30), STRIPS,
       st.lists(st.booleans(), min_size=1, max_size=5))
def test_measured_figures_and_sent_bytes_do_not_depend_on_the_split(
    data: bytes, cuts: list[int], strip: int, measure_every: list[bool]
) -> None:
    ref_times, ref_figures, ref_sent = run(data, [data[i:i + 1] for i in range(len(data))], strip, [True])
    points = sorted({c % (len(data) + 1) for c in cuts} - {0})
    edges = [0, *points, len(data)]
    parts = [data[a:b] for a, b in itertools.pairwise(edges) if b > a]
    ends = list(itertools.accumulate(len(p) for p in parts))
    times, figures, sent = run(data, parts, strip, measure_every)
    assert figures == ref_figures
    assert sent == ref_sent
    if strip == STRIP_NONE:
        assert sent == data  # byte for byte
    # each token chunk is stamped by the read holding the byte that completed it in the reference
    expected = [t if t > len(data) else ends[bisect.bisect_left(ends, t)] for t in ref_times]
    assert times == expected


@given(stream())
def test_streams_without_injected_usage_are_relayed_unchanged_whatever_is_stripped(data: bytes) -> None:
    if b'"usage"' in data:
        return
    for strip in (STRIP_ALL, STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL):
        assert run(data, [data], strip, [True])[2] == data


@given(stream(), STRIPS)
def test_what_is_sent_decodes_to_what_came_less_the_injected_usage(data: bytes, strip: int) -> None:
    from servelens.core.sse import SSEDecoder

    def events(raw: bytes) -> list[Any]:
        dec = SSEDecoder()
        out = []
        for blk in [*dec.decode(raw), *dec.flush()]:
            if blk.data is None:
                continue
            try:
                out.append(json.loads(blk.data))
            except ValueError:
                out.append(blk.data)
        return out

    sent = run(data, [data], strip, [True])[2]
    came, went = events(data), events(sent)
    if any(isinstance(ev, str) and '"usage"' in ev for ev in came):
        # a payload that is not JSON but holds a "usage" member may have it cut (documented in
        # StreamMeter._strip: it counts as backend_error either way): compare the JSON events only
        came = [ev for ev in came if not isinstance(ev, str)]
        went = [ev for ev in went if not isinstance(ev, str)]
    if strip == STRIP_NONE:
        assert went == came
        return
    expect = []
    for ev in came:
        if isinstance(ev, dict) and "usage" in ev and ev.get("error") is None:
            if not ev.get("choices") and ev["usage"] is not None:
                if strip == STRIP_ALL:
                    continue  # a chunk that only carried the injected usage is dropped
                expect.append(ev)
                continue
            ev = dict(ev)
            if strip == STRIP_CONTINUOUS_NULL:
                ev["usage"] = None
            else:
                del ev["usage"]
        expect.append(ev)
    assert went == expect
