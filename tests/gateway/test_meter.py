"""StreamMeter on synthetic bytes and integer timestamps (no I/O, no clock)."""

import json

import pytest

from servelens.core.sse import SSEDecoder
from servelens.core.timing import RequestRecord
from servelens.gateway import meter as meter_mod
from servelens.gateway.meter import StreamMeter
from servelens.gateway.usage import (
    STRIP_ALL,
    STRIP_CONTINUOUS,
    STRIP_CONTINUOUS_NULL,
    STRIP_NONE,
    null_usage,
    remove_usage,
)
from servelens.prometheus import FrontendMetrics

MS = 1_000_000


def ev(obj: object, eol: str = "\n") -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}{eol}{eol}".encode()


def delta(**d: object) -> dict:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}


def fin(reason: str = "stop", **d: object) -> dict:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": reason}]}


def usage(pt: int, ct: int, cached: object = "absent") -> dict:
    u: dict = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
    if cached != "absent":
        u["prompt_tokens_details"] = cached
    return u


def meter(strip: int = 0) -> tuple[FrontendMetrics, StreamMeter]:
    m = FrontendMetrics(isl_buckets="512,1024")
    m.register_model("m")
    live = m.begin("m", "chat_completions", "stream", arrival_ns=0)
    return m, StreamMeter(live, strip)


def finish(mt: StreamMeter, t_ns: int) -> tuple[RequestRecord, tuple[str, str]]:
    mt.end(t_ns)
    status, etype = mt.outcome()
    return mt.live.finish(t_ns, status, etype, osl=mt.osl, cached_tokens=mt.cached_tokens), (status, etype)


def test_role_only_first_chunk_is_not_the_first_token() -> None:
    _, mt = meter()
    mt.feed(5 * MS, ev(delta(role="assistant", content="")))
    assert mt.live.timer.first_output_ns is None
    mt.feed(20 * MS, ev(delta(content="Hi")))
    mt.feed(30 * MS, ev(fin(content="!")) + b"data: [DONE]\n\n")
    rec, outcome = finish(mt, 31 * MS)
    assert rec.ttft_s == pytest.approx(0.020)
    assert outcome == ("success", "")
    assert rec.osl == 2 and not mt.osl_from_usage  # counted chunks, flagged


def test_reasoning_and_tool_call_deltas_are_output() -> None:
    _, mt = meter()
    mt.feed(7 * MS, ev(delta(reasoning_content="think")))
    assert mt.live.timer.first_output_ns == 7 * MS
    mt.feed(9 * MS, ev(delta(tool_calls=[{"index": 0, "function": {"arguments": "{"}}])))
    assert mt.live.timer.output_chunks == 2


def test_multi_token_chunks_split_itl_from_cumulative_usage() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev({**delta(role="assistant", content=""), "usage": usage(600, 0)}))
    mt.feed(10 * MS, ev({**delta(content="abcd"), "usage": usage(600, 4)}))
    mt.feed(40 * MS, ev({**delta(content="efg"), "usage": usage(600, 7)}))
    mt.feed(41 * MS, ev({**fin(), "usage": usage(600, 7)}) + b"data: [DONE]\n\n")
    rec, _ = finish(mt, 42 * MS)
    assert rec.itl.count == 3  # three tokens after a 30 ms gap: three ITL values of 10 ms
    assert rec.itl.sum == pytest.approx(0.030)
    assert rec.osl == 7 and rec.output_tokens == 7


def test_usage_on_last_chunk_only_is_not_taken_as_tokens_per_chunk() -> None:
    _, mt = meter()
    mt.feed(10 * MS, ev(delta(content="a")))
    mt.feed(20 * MS, ev(delta(content="b")))
    mt.feed(30 * MS, ev({**fin(content="c"), "usage": usage(10, 3)}))
    rec, _ = finish(mt, 31 * MS)
    assert rec.itl.count == 2 and rec.osl == 3


def test_last_cumulative_usage_wins_never_summed_and_isl_sources() -> None:
    m, mt = meter()
    mt.feed(1 * MS, ev({**delta(content="a"), "usage": usage(600, 1)}))
    mt.feed(2 * MS, ev({**delta(content="b"), "usage": usage(600, 2)}))
    mt.feed(3 * MS, ev({**fin(), "usage": usage(600, 2)}))
    mt.feed(4 * MS, ev({"choices": [], "usage": usage(600, 2, {"cached_tokens": 512})}))
    rec, _ = finish(mt, 5 * MS)
    assert rec.osl == 2 and rec.isl == 600 and rec.cached_tokens == 512
    assert mt.live.isl_source == "first_chunk_usage"
    assert mt.live.bucket_label == "513-1024"
    st = m.state.models["m"]
    assert st.isl_sources == {"first_chunk_usage": 1, "final_usage": 0, "tokenizer": 0, "unknown": 0}
    assert st.by_isl is not None and st.by_isl["513-1024"].ttft.count == 1


def test_final_usage_assigns_bucket_at_the_end() -> None:
    m, mt = meter()
    mt.feed(8 * MS, ev(delta(content="a")))
    st = m.state.models["m"]
    assert st.stock.ttft.count == 1
    assert st.by_isl is not None and sum(h.ttft.count for h in st.by_isl.values()) == 0
    mt.feed(9 * MS, ev(fin(content="b")))
    mt.feed(10 * MS, ev({"choices": [], "usage": usage(100, 2)}))
    # TTFT measured at the first output chunk goes into the bucket as soon as the ISL is known
    assert st.by_isl["0-512"].ttft.count == 1
    assert st.by_isl["0-512"].ttft.sum == pytest.approx(0.008)
    finish(mt, 11 * MS)
    assert st.isl_sources is not None and st.isl_sources["final_usage"] == 1


@pytest.mark.parametrize("details", [None, "absent", {"cached_tokens": None}, {}])
def test_cached_tokens_null_or_absent_is_unknown(details: object) -> None:
    m, mt = meter()
    mt.feed(1 * MS, ev(fin(content="a")))
    mt.feed(2 * MS, ev({"choices": [], "usage": usage(10, 1, details)}))
    rec, _ = finish(mt, 3 * MS)
    assert rec.cached_tokens is None
    assert m.state.models["m"].stock.cached.count == 0


def test_multibyte_split_and_event_split_and_coalesced() -> None:
    _, mt = meter()
    stream = ev(delta(content="é🙂")) + ev(delta(content="ü")) + ev(fin(content="x")) + b"data: [DONE]\n\n"
    cut = stream.index("🙂".encode()) + 2  # inside the 4-byte character
    mt.feed(1 * MS, stream[:cut])
    mt.feed(2 * MS, stream[cut:])  # rest of event 1, events 2, 3 and [DONE] in one read
    rec, outcome = finish(mt, 3 * MS)
    assert rec.output_chunks == 3 and outcome == ("success", "")
    assert rec.ttft_s == pytest.approx(0.002)  # the first event completed in the second read


def test_comments_keepalive_id_retry_and_pings_are_not_output() -> None:
    _, mt = meter()
    mt.feed(1 * MS, b": ping\n\n: ping\n\n")
    mt.feed(2 * MS, b"id: 7\n\nretry: 100\n\n: keep-alive\n\n")
    assert mt.live.timer.first_output_ns is None
    mt.feed(50 * MS, b"id: 8\n" + ev(fin(content="a")))
    rec, _ = finish(mt, 51 * MS)
    assert rec.ttft_s == pytest.approx(0.050)


def test_crlf_line_endings() -> None:
    _, mt = meter()
    mt.feed(3 * MS, ev(delta(content="a"), eol="\r\n") + ev(fin(content="b"), eol="\r\n") + b"data: [DONE]\r\n\r\n")
    rec, outcome = finish(mt, 4 * MS)
    assert rec.output_chunks == 2 and outcome == ("success", "")


def test_error_object_in_stream_is_backend_error() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev(delta(content="a")) + ev({"error": {"message": "boom", "type": "internal"}}))
    _, outcome = finish(mt, 2 * MS)
    assert outcome == ("error", "backend_error")


def test_stream_without_finish_or_done_is_truncated_and_no_ttft_zero() -> None:
    m, mt = meter()
    mt.feed(1 * MS, ev(delta(role="assistant", content="")))
    rec, outcome = finish(mt, 2 * MS)
    assert outcome == ("error", "truncated_stream")
    assert rec.ttft_s is None
    assert m.state.models["m"].stock.ttft.count == 0


def test_finish_reason_alone_or_done_alone_ends_a_stream_and_done_without_output_is_not_success() -> None:
    # either end marker alone completes a stream: a finish_reason without [DONE] ...
    _, mt = meter()
    mt.feed(1 * MS, ev(fin(content="a")))
    assert finish(mt, 2 * MS)[1] == ("success", "")
    # ... and [DONE] after output chunks none of which has a finish_reason (without [DONE] it is truncated)
    _, mt = meter()
    mt.feed(1 * MS, ev(delta(content="a")) + b"data: [DONE]\n\n")
    assert finish(mt, 2 * MS)[1] == ("success", "")
    _, mt = meter()
    mt.feed(1 * MS, ev(delta(content="a")))
    assert finish(mt, 2 * MS)[1] == ("error", "truncated_stream")
    # [DONE] as the whole stream: complete, but nothing was generated
    _, mt = meter()
    mt.feed(1 * MS, b"data: [DONE]\n\n")
    assert finish(mt, 2 * MS)[1] == ("error", "backend_error")


def test_malformed_chunk_is_backend_error() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev(delta(content="a")) + b"data: {not json\n\n" + ev(fin(content="b")))
    assert finish(mt, 2 * MS)[1] == ("error", "backend_error")


def test_strip_all_drops_usage_chunk_and_usage_members() -> None:
    _, mt = meter(STRIP_ALL)
    a = ev({**delta(content="a"), "usage": usage(5, 1)})
    out = mt.feed(1 * MS, a[:10])
    assert out == b""  # an incomplete block is held
    out = mt.feed(2 * MS, a[10:] + b": ka\n\n" + ev({"choices": [], "usage": usage(5, 1)}) + b"data: [DONE]\n\n")
    assert out == ev(delta(content="a")) + b": ka\n\ndata: [DONE]\n\n"
    assert mt.prompt_tokens == 5 and mt.osl == 1


def test_strip_continuous_keeps_final_usage_chunk() -> None:
    for strip, member in ((STRIP_CONTINUOUS, ""), (STRIP_CONTINUOUS_NULL, ',"usage":null')):
        _, mt = meter(strip)
        final = ev({"choices": [], "usage": usage(5, 1)})
        out = mt.feed(1 * MS, ev({**delta(content="a"), "usage": usage(5, 1)}) + final)
        assert out == ev(delta(content="a"))[:-3] + member.encode() + b"}\n\n" + final


def _reference_strip(block: bytes, strip: int) -> bytes:
    """What the relay sent per block when it decoded every event before sending it."""
    (blk,) = SSEDecoder().decode(block)
    try:
        obj = json.loads(blk.data or "")
    except ValueError:
        return block
    if not isinstance(obj, dict) or "usage" not in obj or obj.get("error") is not None:
        return block
    only = obj["usage"] is not None and not obj.get("choices")
    if strip == STRIP_ALL:
        return b"" if only else remove_usage(block)
    if only:
        return block
    return null_usage(block) if strip == STRIP_CONTINUOUS_NULL else remove_usage(block)


USAGE = b'{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}'


@pytest.mark.parametrize("strip", [STRIP_ALL, STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL])
def test_stripping_on_the_bytes_matches_decoding_every_event(strip: int) -> None:
    # the relay decides what to cut on the bytes, before the event is decoded for measurement
    events = [
        ev({"id": "a", **delta(role="assistant"), "usage": None}),
        ev({"id": "a", **delta(content="x"), "usage": usage(5, 1)}),
        ev({"id": "a", **delta(content="y"), "usage": None}),
        ev({"id": "a", **delta(content='"choices":[]'), "usage": usage(5, 2)}),
        ev({"id": "{", **delta(content="z"), "usage": usage(5, 3)}),  # not told on the bytes: decoded
        ev({"id": "a", "choices": [], "usage": usage(5, 3, {"cached_tokens": 2})}),
        ev({"id": "{", "choices": [], "usage": usage(5, 3)}),
        ev({"id": "a", "usage": usage(5, 3)}),
        ev({"id": "a", "choices": None, "usage": usage(5, 3)}),
        ev({"id": "a", "choices": [], "usage": None}),
        ev({"id": "a", **fin(content="w")}),
        b"data: [DONE]\n\n",
        # found by a differential fuzzer against the decoding relay:
        ev({"id": "c", **delta(content="a"), "x_groq": {"usage": {"prompt_tokens": 5}}}),  # nested usage only
        ev({"id": "c", "meta": {"usage": {"a": 1}}}),
        ev({"id": "c", "meta": {"usage": {"a": 1}}, **delta(content="b"), "usage": usage(5, 4)}),
        ev({"error": {"message": "boom"}, "usage": usage(1, 0)}),  # an error event is sent as it came
        b': "choices":[]\ndata: {"id":"c","choices":[{"delta":{"content":"hi"}}],"usage":' + USAGE + b"\n\n",
        b'data: {"usage":' + USAGE + b',"choices":[]}\nid: 3\n\n',
        b'id: {1}\ndata: {"id":"c","choices":[],"usage":' + USAGE + b"}\n\n",
        b'data: {"choices":[],"usage":' + USAGE + b"\n\n",  # malformed (a brace missing): never dropped
        b'data:[{"choices":null,"usage":' + USAGE + b"}]\n\n",  # not an object
        b'data: {"choices":[],\ndata: "usage":' + USAGE + b"}\n\n",  # two data lines
    ]
    _, mt = meter(strip)
    for i, e in enumerate(events):
        assert mt.feed(i * MS, e) == _reference_strip(e, strip), e


def test_relay_sends_first_and_measure_reads_with_the_relay_time() -> None:
    _, mt = meter(STRIP_ALL)
    out = mt.relay(7 * MS, ev({**delta(content="a"), "usage": usage(600, 1)}))
    assert out == ev(delta(content="a"))
    assert mt.live.timer.first_output_ns is None and mt.prompt_tokens is None  # not measured yet
    mt.measure()
    assert mt.live.timer.first_output_ns == 7 * MS and mt.prompt_tokens == 600
    assert mt.live.bucket_label == "513-1024"
    # not stripping: the bytes go as they are and the decoding waits too
    _, raw = meter()
    assert raw.relay(3 * MS, ev(delta(content="b"))) is None and raw.blocks == 0
    raw.relay(4 * MS, b"data: [DONE]\n\n")
    assert raw.end(5 * MS) is None  # end measures what is queued first
    assert raw.live.timer.first_output_ns == 3 * MS and raw.done and raw.blocks == 2


@pytest.mark.parametrize("strip", [0, STRIP_ALL])
def test_an_event_over_the_limit_is_given_up_and_relayed_unparsed(monkeypatch: pytest.MonkeyPatch, strip: int) -> None:
    # an upstream that never ends its line: the event was held whole (when stripping, nothing went to
    # the client and memory grew at the upstream's rate); now it is let go past MAX_EVENT_BYTES
    monkeypatch.setattr(meter_mod, "MAX_EVENT_BYTES", 1000)
    _, mt = meter(strip)
    first = ev(delta(content="a"))
    out = mt.feed(1 * MS, first + b'data: {"choices":[{"delta":{"content":"' + b"x" * 600)
    assert out == (first if strip else None)
    held = b"x" * 600
    out = mt.feed(2 * MS, held)  # over the limit: the held bytes go out (when stripping)
    assert mt._decoder.pending_bytes == 0
    assert out == (b'data: {"choices":[{"delta":{"content":"' + b"x" * 1200 if strip else None)
    later = ev({**fin(content="b"), "usage": usage(5, 2)}) + b"data: [DONE]\n\n"
    assert mt.feed(3 * MS, later) == (later if strip else None)  # as it came: unparsed, unstripped
    assert mt.end(4 * MS) == (b"" if strip else None)
    assert mt.outcome() == ("error", "backend_error")
    assert mt.live.timer.output_tokens == 1 and mt.completion_tokens is None


def choice(index: int, reason: str | None = None, **d: object) -> dict:
    return {"choices": [{"index": index, "delta": d, "finish_reason": reason}]}


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous-usage", "final-usage"])
def test_several_choices_itl_is_the_first_choices(continuous: bool) -> None:
    """n=2: the choices decode together and their chunks interleave 1 ms apart; TTFT and ITL are
    those of choice 0 (50 ms), not the 1 ms between two choices' chunks; OSL counts both."""
    _, mt = meter()
    mt.feed(1 * MS, ev(choice(0, role="assistant", content="")) + ev(choice(1, role="assistant", content="")))
    for step in range(3):
        for i in (0, 1):
            reason = "stop" if step == 2 else None
            body = choice(i, reason, content=f"t{step}")
            if continuous:
                body["usage"] = usage(20, step + 1)  # vLLM: the count of the chunk's own choice
            mt.feed((10 + 50 * step + i) * MS, ev(body))
    mt.feed(200 * MS, ev({"choices": [], "usage": usage(20, 6)}) + b"data: [DONE]\n\n")
    rec, outcome = finish(mt, 201 * MS)
    assert outcome == ("success", "")
    assert mt.multi
    assert rec.ttft_s == pytest.approx(0.010)
    assert rec.itl.count == 2 and rec.itl.sum == pytest.approx(0.100)  # two 50 ms gaps of choice 0
    assert rec.output_chunks == 3
    assert rec.osl == 6 and rec.isl == 20


def test_several_choices_without_usage_count_every_choice() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev(choice(0, content="a")))  # one choice only so far: measured as usual
    mt.feed(2 * MS, ev(choice(1, content="b")))
    mt.feed(30 * MS, ev({"choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "stop"},
                                     {"index": 1, "delta": {"content": "d"}, "finish_reason": "stop"}]}))
    rec, outcome = finish(mt, 31 * MS)
    assert outcome == ("success", "")
    assert rec.ttft_s == pytest.approx(0.001)
    assert rec.itl.count == 1 and rec.itl.sum == pytest.approx(0.029)
    assert not mt.osl_from_usage and mt.osl == 4


def test_one_choice_with_an_explicit_index_is_not_several() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev(choice(0, content="a")))
    mt.feed(2 * MS, ev(choice(0, "stop", content="b")))
    rec, _ = finish(mt, 3 * MS)
    assert not mt.multi and rec.itl.count == 1 and mt.osl == 2


def test_several_choices_cut_before_the_usage_chunk_count_chunks_not_one_choices_usage() -> None:
    # vLLM's continuous usage on a chunk with a choice counts that choice alone: without the final
    # usage-only chunk, OSL is the output chunks of every choice (6), not the last choice's count (3)
    _, mt = meter()
    for step in range(3):
        for i in (0, 1):
            body = choice(i, "stop" if step == 2 else None, content=f"t{step}")
            body["usage"] = usage(20, step + 1)
            mt.feed((10 + 50 * step + i) * MS, ev(body))
    rec, outcome = finish(mt, 200 * MS)
    assert outcome == ("success", "")  # every choice finished (as for n=1, [DONE] is not needed)
    assert not mt.osl_from_usage and mt.osl == 6 and rec.isl == 20


def test_several_choices_stream_ending_before_every_choice_finished_is_truncated() -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev(choice(0, content="a")))
    mt.feed(2 * MS, ev(choice(1, "stop", content="b")))  # choice 1 finished, choice 0 never did
    _, outcome = finish(mt, 3 * MS)
    assert outcome == ("error", "truncated_stream")
    _, mt = meter()
    mt.feed(1 * MS, ev(choice(0, "stop", content="a")))  # choice 0 finished before choice 1 showed up
    mt.feed(2 * MS, ev(choice(1, "length", content="b")))
    _, outcome = finish(mt, 3 * MS)
    assert outcome == ("success", "")  # every choice seen finished (no [DONE] needed, as for n=1)


@pytest.mark.parametrize("index", ["0", True, None, [], -1, 0.0])
def test_a_junk_choice_index_is_the_first_choice(index: object) -> None:
    _, mt = meter()
    mt.feed(1 * MS, ev({"choices": [{"index": index, "delta": {"content": "a"}, "finish_reason": None}]}))
    mt.feed(5 * MS, ev({"choices": [{"index": index, "delta": {"content": "b"}, "finish_reason": "stop"}]}))
    rec, outcome = finish(mt, 6 * MS)
    assert not mt.multi and outcome == ("success", "")
    assert rec.ttft_s == pytest.approx(0.001) and rec.itl.count == 1


@pytest.mark.parametrize("strip", [STRIP_NONE, STRIP_CONTINUOUS])
def test_cr_framed_stream_is_measured_and_sent_read_by_read(strip: int) -> None:
    _, mt = meter(strip)
    first = ev({**delta(content="a"), "usage": usage(5, 1)}, eol="\r")
    out = mt.feed(1 * MS, first)
    assert mt.live.timer.first_output_ns == 1 * MS  # not at the next read, 1 s later
    if strip != STRIP_NONE:
        assert out == ev(delta(content="a"), eol="\r")  # sent now, usage cut
    mt.feed(1000 * MS, ev({**fin(content="b"), "usage": usage(5, 2)}, eol="\r") + b"data: [DONE]\r\r")
    rec, outcome = finish(mt, 1001 * MS)
    assert rec.ttft_s == pytest.approx(0.001) and outcome == ("success", "") and rec.osl == 2


def test_byte_order_mark_before_the_first_event_is_measured() -> None:
    _, mt = meter()
    mt.feed(1 * MS, b"\xef\xbb\xbf" + ev(delta(content="a")))
    mt.feed(1000 * MS, ev(fin(content="b")) + b"data: [DONE]\n\n")
    rec, _ = finish(mt, 1001 * MS)
    assert rec.ttft_s == pytest.approx(0.001) and rec.osl == 2


def _sse_data(out: bytes) -> list[str]:
    """The data of each event in ``out`` (SSE rules, via the decoder)."""
    d = SSEDecoder()
    return [b.data for b in d.decode(out) + d.flush() if b.data is not None]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("strip", [STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL])
def test_injected_usage_is_cut_from_json_spread_over_several_data_lines(eol: str, strip: int) -> None:
    # legal SSE: several data: lines joined with \n (JSON whitespace). Cutting on the raw block kept
    # the comma before the line break: '{...,\n}' reached the client, invalid JSON
    _, mt = meter(strip)
    u = json.dumps(usage(5, 1))
    split_after_comma = f': note{eol}id: 7{eol}data: {{"choices":[{{"index":0,"delta":{{"content":"a"}},' \
        f'"finish_reason":null}}],{eol}data: "usage":{u}}}{eol}{eol}'
    split_in_value = f'data: {{"choices":[{{"index":0,"delta":{{"content":"b"}},"finish_reason":"stop"}}],' \
        f'"usage":{eol}data: {u}}}{eol}{eol}'
    sent = (mt.feed(1 * MS, split_after_comma.encode()), mt.feed(2 * MS, split_in_value.encode()))
    out = b"".join(x or b"" for x in sent)
    got = [json.loads(d) for d in _sse_data(out)]
    if strip == STRIP_CONTINUOUS_NULL:
        assert [g.pop("usage") for g in got] == [None, None]
    assert got == [delta(content="a"), fin(content="b")]
    assert out.startswith(f": note{eol}id: 7{eol}data: ".encode())  # the other lines as they came
    rec, outcome = finish(mt, 3 * MS)
    assert outcome == ("success", "") and rec.osl == 1  # the usage was read before it was cut


def test_a_byte_order_mark_mid_stream_stays_part_of_its_field_name() -> None:
    # only the BOM opening the stream is skipped; elsewhere "\ufeffdata" is an unknown field. The cut
    # took that line for the event's first data line: the client lost the event
    _, mt = meter(STRIP_CONTINUOUS)
    u = json.dumps(usage(5, 1)).encode()
    stream = (ev(delta(content="a")) + b"\xef\xbb\xbfdata: ignored\n"
              + b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],\ndata: "usage":'
              + u + b"}\n\ndata: [DONE]\n\n")
    out = (mt.feed(1 * MS, stream) or b"") + (mt.end(2 * MS) or b"")
    assert _sse_data(out) == [json.dumps(delta(content="a"), separators=(",", ":")),
                              json.dumps(fin(content="b"), separators=(",", ":")), "[DONE]"]
    assert b"\xef\xbb\xbfdata: ignored\n" in out


def test_the_cut_keeps_a_bom_opening_the_stream_and_an_unfinished_event_unfinished() -> None:
    _, mt = meter(STRIP_CONTINUOUS)
    u = json.dumps(usage(5, 1)).encode()
    first = b'\xef\xbb\xbfdata: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],\ndata: "usage":'
    out = mt.feed(1 * MS, first + u + b"}\n\n") or b""
    assert out.startswith(b"\xef\xbb\xbfdata: {") and b"usage" not in out and out.endswith(b"}\n\n")
    last = b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}],\ndata: "usage":' + u + b"}"
    assert mt.feed(2 * MS, last) == b""  # no blank line yet: held
    tail = mt.end(3 * MS) or b""
    # the stream ended inside the event: sent without usage and still without its blank line (a client
    # drops an event the stream ends in, as the spec says; a blank line added would have it dispatched)
    assert b"usage" not in tail and tail.startswith(b"data: {") and not tail.endswith(b"\n\n")


# -- tokens per chunk from cumulative usage (design notes: ITL) ------------------------------------


def counted(chunks: list[tuple[str, int]]) -> tuple[RequestRecord, tuple[str, str]]:
    """Content chunks (text, cumulative count) 30 ms apart from 10 ms, the last with finish_reason."""
    _, mt = meter()
    for i, (text, ct) in enumerate(chunks):
        body = fin(content=text) if i == len(chunks) - 1 else delta(content=text)
        mt.feed((10 + 30 * i) * MS, ev({**body, "usage": usage(5, ct)}))
    mt.feed(len(chunks) * 30 * MS, b"data: [DONE]\n\n")
    return finish(mt, len(chunks) * 30 * MS)


def test_a_chunk_whose_count_did_not_move_carries_no_token() -> None:
    """Content a, b, c, d with cumulative counts 1, 1, 2, 3: two token gaps, not three; b's gap joins c's."""
    rec, outcome = counted([("a", 1), ("b", 1), ("c", 2), ("d", 3)])
    assert outcome == ("success", "")
    assert rec.ttft_s == pytest.approx(0.010)
    assert rec.itl.count == 2 and rec.itl.sum == pytest.approx(0.090)  # c - a = 60 ms, d - c = 30 ms
    assert rec.osl == 3


def test_a_token_in_an_empty_text_chunk_is_counted() -> None:
    """Chunks a (1), "" (2), c (3), d (4), 30 ms apart: three 30 ms ITL values."""
    rec, _ = counted([("a", 1), ("", 2), ("c", 3), ("d", 4)])
    assert rec.itl.count == 3 and rec.itl.sum == pytest.approx(0.090)
    assert rec.ttft_s == pytest.approx(0.010) and rec.osl == 4


def test_tokens_counted_before_the_first_output_are_not_a_first_token() -> None:
    # an empty-text chunk whose count moved before any text: TTFT is still the first text (design)
    _, mt = meter()
    mt.feed(5 * MS, ev({**delta(role="assistant", content=""), "usage": usage(5, 0)}))
    mt.feed(10 * MS, ev({**delta(content=""), "usage": usage(5, 1)}))
    mt.feed(20 * MS, ev({**delta(content="ab"), "usage": usage(5, 2)}))
    mt.feed(50 * MS, ev({**fin(content="c"), "usage": usage(5, 3)}) + b"data: [DONE]\n\n")
    rec, _ = finish(mt, 51 * MS)
    assert rec.ttft_s == pytest.approx(0.020)
    assert rec.itl.count == 1 and rec.itl.sum == pytest.approx(0.030)


def test_several_choices_take_the_first_choices_own_counts() -> None:
    """n = 2, two tokens per chunk, per-choice cumulative counts 2/4/6/8 and a final total of 16:
    choice 0 gives 6 ITL values, as the same chunks do at n = 1."""

    def run(n: int) -> RequestRecord:
        _, mt = meter()
        for step in range(4):
            for i in range(n):
                body = choice(i, "length" if step == 3 else None, content=f"t{step}t{step}")
                body["usage"] = usage(20, 2 * (step + 1))  # vLLM, SGLang: the chunk's own choice's count
                mt.feed((10 + 40 * step + i) * MS, ev(body))
        mt.feed(200 * MS, ev({"choices": [], "usage": usage(20, 8 * n)}) + b"data: [DONE]\n\n")
        rec, outcome = finish(mt, 201 * MS)
        assert outcome == ("success", "") and rec.osl == 8 * n
        return rec

    one, two = run(1), run(2)
    assert one.itl.count == 6 and one.itl.sum == pytest.approx(0.120)
    assert two.itl.count == 6 and two.itl.sum == pytest.approx(0.120)
    assert two.ttft_s == pytest.approx(one.ttft_s)


def test_usage_on_a_chunk_of_several_choices_falls_back_to_one_token_per_chunk() -> None:
    # one count for two choices cannot be split: choice 0's output chunks count one token each
    _, mt = meter()
    both = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None},
                        {"index": 1, "delta": {"content": "b"}, "finish_reason": None}], "usage": usage(5, 4)}
    mt.feed(10 * MS, ev(both))
    mt.feed(40 * MS, ev({**both, "usage": usage(5, 8),
                         "choices": [{**c, "finish_reason": "stop"} for c in both["choices"]]}))
    rec, outcome = finish(mt, 41 * MS)
    assert outcome == ("success", "")
    assert rec.itl.count == 1 and rec.itl.sum == pytest.approx(0.030)


# -- streams that produced nothing, or said they failed (docs/counting.md) ------------------------


@pytest.mark.parametrize(
    "stream",
    [
        b"data: [DONE]\n\n",
        ev(delta(role="assistant", content="")) + b"data: [DONE]\n\n",
        ev(delta(role="assistant", content="")) + ev(fin()) + b"data: [DONE]\n\n",
    ],
    ids=["done-alone", "role-only", "role-and-finish"],
)
def test_a_stream_that_produced_nothing_is_not_a_success(stream: bytes) -> None:
    _, mt = meter()
    mt.feed(1 * MS, stream)
    rec, outcome = finish(mt, 2 * MS)
    assert outcome == ("error", "backend_error")
    assert rec.ttft_s is None


def test_a_reply_that_is_only_an_end_of_sequence_token_is_a_success() -> None:
    # the model stopped at once: no text, but usage counts the token it generated
    _, mt = meter()
    mt.feed(1 * MS, ev({**fin(content=""), "usage": usage(5, 1)}) + b"data: [DONE]\n\n")
    rec, outcome = finish(mt, 2 * MS)
    assert outcome == ("success", "") and rec.osl == 1 and rec.ttft_s is None


@pytest.mark.parametrize(
    "error_event",
    [
        b'event: error\ndata: {"message": "boom"}\n\n',
        b"event: error\ndata: boom\n\n",
        b'data: {"object": "error", "message": "boom", "type": "BadRequestError", "param": null, "code": 400}\n\n',
    ],
    ids=["sse-event-error", "sse-event-error-text", "vllm-object-error"],
)
def test_an_error_event_then_done_is_backend_error(error_event: bytes) -> None:
    for before in (b"", ev(delta(content="a"))):
        _, mt = meter()
        mt.feed(1 * MS, before + error_event + b"data: [DONE]\n\n")
        _, outcome = finish(mt, 2 * MS)
        assert outcome == ("error", "backend_error")
        assert mt.error == "boom"
