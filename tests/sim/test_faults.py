"""Each fault mode, produced exactly as specified (servelens.sim.faults)."""

import asyncio
import json
import time

import aiohttp
import pytest

from servelens.core.openai import parse_chunk
from servelens.sim import writer as sim_writer
from servelens.sim.faults import FAULT_MODES, FaultInjector, FaultPlan, parse_modes
from servelens.sim.testing import capture, run_sim

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def body(osl: int = 10, chat: bool = True, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {"max_tokens": osl, "ignore_eos": True, "stream": True, **kw}
    if chat:
        base["messages"] = [{"role": "user", "content": "tell me"}]
    else:
        base["prompt"] = "tell me"
    return base


def fault(mode: str, **extra: str) -> dict[str, str]:
    return {"x-servelens-fault": mode, **extra}


def token_chunks(data: list[str]) -> list[dict[str, object]]:
    out = []
    for d in data:
        info = parse_chunk(d)
        if info.has_output:
            assert info.obj is not None
            out.append(info.obj)
    return out


@pytest.mark.parametrize("mode,status", [("http_429", 429), ("http_500", 500), ("http_503", 503)])
async def test_http_errors_before_any_chunk(mode: str, status: int) -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(), fault(mode))
        assert cap.status == status and cap.headers["content-type"].startswith("application/json")
        err = json.loads(cap.body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        assert (rec.outcome, rec.http_status, rec.osl) == ("error", status, 0)


async def test_error_mid_stream() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(10), fault("error_mid_stream"))
        assert cap.status == 200
        infos = [parse_chunk(d) for d in cap.data]
        assert infos[-1].error is not None and "[DONE]" not in cap.data
        assert sum(i.has_output for i in infos) == 5
        assert all(i.finish_reason is None for i in infos)
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        # the engine's step loop runs on while the stream writer waits on the socket, so it may have
        # generated tokens beyond the 5 sent when the fault cancels it (on a stalled machine even all
        # 10); the truth holds every token generated up to the cancel plus at most one step in flight
        assert rec.outcome == "error" and rec.osl >= 5
        if rec.tokens_at_cancel is not None:
            assert 5 <= rec.tokens_at_cancel <= rec.osl <= rec.tokens_at_cancel + 1


async def test_reset_mid_stream_is_a_tcp_reset() -> None:
    async with run_sim() as sim:
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        payload = json.dumps(body(10, chat=False)).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"x-request-id: rst-1\r\nx-servelens-fault: reset_mid_stream\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        await writer.drain()
        got = b""
        with pytest.raises(ConnectionResetError):
            async with asyncio.timeout(5):
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break  # a clean EOF is not a reset: the pytest.raises fails
                    got += chunk
        writer.close()
        rec = await sim.wait_truth("rst-1")
        # as for error_mid_stream: the step loop may run ahead of the writer before the cancel lands
        assert rec.outcome == "reset" and rec.osl >= 5
        if rec.tokens_at_cancel is not None:
            assert 5 <= rec.tokens_at_cancel <= rec.osl <= rec.tokens_at_cancel + 1
        assert b"0\r\n\r\n" not in got


async def test_no_done() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(6, stream_options={"include_usage": True}), fault("no_done"))
        infos = [parse_chunk(d) for d in cap.data]
        assert "[DONE]" not in cap.data and all(i.finish_reason is None for i in infos)
        assert sum(i.has_output for i in infos) == 6 and all(i.usage is None for i in infos)
        assert (await sim.wait_truth(cap.headers["x-request-id"])).outcome == "incomplete"


async def test_malformed_chunk_then_stream_continues() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + COMP, body(8, chat=False), fault("malformed_chunk"))
        infos = [parse_chunk(d) for d in cap.data]
        bad = [k for k, i in enumerate(infos) if i.malformed]
        assert len(bad) == 1 and 0 < bad[0] < len(infos) - 2
        assert sum(i.has_output for i in infos) == 8 and cap.data[-1] == "[DONE]"


async def test_slow_start_headers_at_once_pings_then_tokens() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + COMP, body(3, chat=False),
                            fault("slow_start", **{"x-servelens-fault-delay-ms": "350"}))
        pings = [b for b in cap.blocks if b.comments == (" ping",)]
        assert len(pings) >= 1  # every 100 ms: 3 on an idle machine, fewer when the CPU is contended
        first_token_read = next(t for t, r in zip(cap.read_ns, cap.reads, strict=True) if b'"text"' in r)
        assert first_token_read - cap.headers_ns >= 300_000_000
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        assert rec.ttft_ns is not None and rec.ttft_ns >= 350_000_000


async def test_keepalive_comments_and_id_retry_blocks() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(6), fault("keepalive"))
        assert any(b.comments == (" keep-alive",) and b.data is None for b in cap.blocks)
        assert any(b.id is not None and b.data is None and b"retry: 3000" in b.raw for b in cap.blocks)
        assert len(token_chunks(cap.data)) == 6 and cap.data[-1] == "[DONE]"


async def test_role_first_chunk() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(3), fault("role_first"))
        first = json.loads(cap.data[0])
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert not parse_chunk(cap.data[0]).has_output


async def test_coalesce_two_events_per_write() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + COMP, body(12, chat=False), fault("coalesce"))
        assert max(r.count(b"data: ") for r in cap.reads) >= 2
        assert all(r.count(b"data: ") % 2 == 0 for r in cap.reads[:-1]) or len(cap.reads) < 7
        assert len(token_chunks(cap.data)) == 12


class _Writes:
    """Stands in for the StreamResponse: records each write the sim makes (one TCP send each)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


async def test_coalesce_and_split_at_the_write_level(monkeypatch: pytest.MonkeyPatch) -> None:
    # the client's reads may merge or cut writes; the writes themselves are exactly as specified
    monkeypatch.setattr(sim_writer, "SPLIT_GAP_S", 0)
    events = [b'{"text":" caf\xc3\xa9"}', b'{"text":" plain"}', b'{"text":" \xe6\x97\xa5\xe6\x9c\xac"}']
    out = _Writes()
    w = sim_writer.SSEWriter(out, FaultPlan(frozenset({"coalesce"})))  # type: ignore[arg-type]
    for e in events:
        await w.event(e)
    await w.event(b"[DONE]", last=True)
    await w.flush()
    assert [x.count(b"data: ") for x in out.writes] == [2, 2]  # two events in one write
    out = _Writes()
    w = sim_writer.SSEWriter(out, FaultPlan(frozenset({"split"})))  # type: ignore[arg-type]
    for e in events:
        await w.event(e)
    assert len(out.writes) == 2 * len(events)  # each event in two writes
    for i, e in enumerate(events):
        first, second = out.writes[2 * i], out.writes[2 * i + 1]
        assert first + second == b"data: " + e + b"\n\n"
        if e != events[1]:  # cut after the lead byte of the first multi-byte character
            assert first[-1] >= 0xC0
            with pytest.raises(UnicodeDecodeError):
                first.decode()


async def test_split_inside_multibyte_character() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(12), fault("split"))
        broken = 0
        for r in cap.reads:
            try:
                r.decode("utf-8")
            except UnicodeDecodeError:
                broken += 1
        assert broken >= 1  # some read ended inside a multi-byte character
        text = "".join(c["choices"][0]["delta"]["content"] for c in token_chunks(cap.data))  # type: ignore[index]
        assert len(text.encode()) > len(text)  # multi-byte text decoded intact
        assert cap.data[-1] == "[DONE]"


async def test_crlf_line_endings() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + COMP, body(4, chat=False), fault("crlf"))
        assert cap.body.count(b"\r\n\r\n") == len(cap.data)
        assert cap.body.replace(b"\r\n", b"").count(b"\n") == 0
        assert len(token_chunks(cap.data)) == 4


async def test_reasoning_only_deltas() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(5), fault("reasoning"))
        deltas = [c["choices"][0]["delta"] for c in token_chunks(cap.data)]  # type: ignore[index]
        assert len(deltas) == 5 and all(set(d) == {"reasoning_content"} for d in deltas)


async def test_tool_call_deltas() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(5), fault("tool_calls"))
        chunks = token_chunks(cap.data)
        calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks]  # type: ignore[index]
        assert calls[0]["id"].startswith("call_") and calls[0]["function"]["name"] == "lookup"
        args = json.loads("".join(c["function"]["arguments"] for c in calls))
        assert len(args["text"].split()) == 5
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"  # type: ignore[index]


async def test_multi_token_chunks_with_continuous_usage() -> None:
    async with run_sim() as sim:
        so = {"include_usage": True, "continuous_usage_stats": True}
        cap = await capture(sim.url + COMP, body(13, chat=False, stream_options=so), fault("multi_token"))
        chunks = token_chunks(cap.data)
        used = [c["usage"]["completion_tokens"] for c in chunks]  # type: ignore[index]
        assert used == [1, 5, 9, 13]
        assert [len(c["choices"][0]["text"].split()) for c in chunks] == [1, 4, 4, 4]  # type: ignore[index]
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        assert rec.osl == 13 and len(set(rec.token_times_ns)) == 4


async def test_combined_modes_and_non_streaming_errors() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + CHAT, body(6), fault("crlf,keepalive,coalesce"))
        assert b"\r\n: keep-alive\r\n" in cap.body or cap.body.startswith(b": keep-alive")
        assert len(token_chunks(cap.data)) == 6 and cap.data[-1] == "[DONE]"
        async with aiohttp.ClientSession() as s:
            b = {**body(6), "stream": False}
            async with s.post(sim.url + CHAT, json=b, headers=fault("error_mid_stream")) as r:
                assert r.status == 500 and "error" in await r.json()


async def test_global_faults_are_seeded() -> None:
    async with run_sim(fault_rate=1.0, fault_modes=("http_503",)) as sim:
        cap = await capture(sim.url + COMP, body(2, chat=False))
        assert cap.status == 503
        ok = await capture(sim.url + COMP, body(2, chat=False), fault("multi_token"))
        assert ok.status == 200  # a request's own header wins over the global draw
    a = FaultInjector(0.5, "http_500,no_done", seed=3)
    b = FaultInjector(0.5, "http_500,no_done", seed=3)
    draws_a = [a.plan(None, None).modes for _ in range(50)]
    assert draws_a == [b.plan(None, None).modes for _ in range(50)]
    assert 10 < sum(1 for m in draws_a if m) < 40
    assert parse_modes(",".join(FAULT_MODES)) == frozenset(FAULT_MODES)
    with pytest.raises(ValueError):
        FaultInjector(1.5)


def _output_chunks_in(raw: bytes) -> int:
    """Chat token chunks in ``raw`` (the role chunk's empty content is not one)."""
    return raw.count(b'"content":" ')


async def test_stall_mid_stream_silence_then_the_rest() -> None:
    async with run_sim() as sim:
        stall = fault("stall_mid_stream", **{"x-servelens-fault-delay-ms": "300"})
        cap = await capture(sim.url + CHAT, body(10), stall)
        assert cap.status == 200 and cap.data[-1] == "[DONE]"
        chunks = token_chunks(cap.data)
        assert len(chunks) == 10 and chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
        # the one long silence comes after exactly half the tokens, and nothing (not even a comment) in it
        gaps = [b - a for a, b in zip(cap.read_ns, cap.read_ns[1:], strict=False)]
        i = max(range(len(gaps)), key=gaps.__getitem__) + 1
        assert gaps[i - 1] >= 300_000_000
        assert _output_chunks_in(b"".join(cap.reads[:i])) == 5
        assert not any(b.comments for b in cap.blocks)
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        # the truth is what the engine did: all 10 generated, the response ended after the stall
        assert (rec.outcome, rec.osl, rec.finish_reason) == ("ok", 10, "length")
        assert rec.faults == ("stall_mid_stream",)
        assert rec.first_token_ns is not None and rec.end_ns - rec.first_token_ns >= 300_000_000
        # non-streaming: unaffected
        async with aiohttp.ClientSession() as s, s.post(sim.url + CHAT, json={**body(4), "stream": False},
                                                        headers=fault("stall_mid_stream")) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 4


async def test_stall_mid_stream_client_leaves_during_the_silence() -> None:
    async with run_sim() as sim, aiohttp.ClientSession() as s:
        r = await s.post(sim.url + COMP, json=body(40, chat=False),
                         headers={**fault("stall_mid_stream", **{"x-servelens-fault-delay-ms": "60000"}),
                                  "x-request-id": "stall-gone"})
        seen = 0
        while seen < 20:  # the half before the stall
            seen += (await r.content.readuntil(b"\n\n")).count(b'"text"')
        assert seen == 20
        r.close()
        rec = await sim.wait_truth("stall-gone")  # ends at the disconnect, not after the 60 s stall
        assert rec.outcome == "cancelled" and 20 <= rec.osl <= 40


@pytest.mark.parametrize("stream", [True, False])
async def test_slow_headers_nothing_before_the_delay(stream: bool) -> None:
    async with run_sim() as sim:
        t0 = time.perf_counter_ns()
        cap = await capture(sim.url + CHAT, body(3, stream=stream),
                            fault("slow_headers", **{"x-servelens-fault-delay-ms": "300"}))
        assert cap.status == 200 and cap.headers_ns - t0 >= 300_000_000
        if stream:
            assert cap.data[-1] == "[DONE]" and len(token_chunks(cap.data)) == 3
            assert not any(b.comments for b in cap.blocks)  # no pings: that is slow_start
        else:
            assert json.loads(cap.body)["usage"]["completion_tokens"] == 3
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        # the request reached the engine only after the delay
        assert rec.outcome == "ok" and rec.osl == 3
        assert rec.admitted_ns is not None and rec.admitted_ns - rec.arrival_ns >= 300_000_000


async def test_slow_headers_client_leaves_before_the_headers() -> None:
    async with run_sim() as sim:
        with pytest.raises(TimeoutError):
            await capture(sim.url + CHAT, body(3), {**fault("slow_headers", **{"x-servelens-fault-delay-ms": "60000"}),
                                                     "x-request-id": "no-headers"}, timeout=1.0)
        rec = await sim.wait_truth("no-headers")
        assert (rec.outcome, rec.osl, rec.admitted_ns, rec.first_token_ns) == ("cancelled", 0, None, None)


@pytest.mark.parametrize("prefix_cache_blocks", [None, 0])
async def test_null_details_in_every_usage(prefix_cache_blocks: int | None) -> None:
    async with run_sim(prefix_cache_blocks=prefix_cache_blocks) as sim:
        so = {"include_usage": True, "continuous_usage_stats": True}
        b = {**body(4, stream_options=so), "messages": [{"role": "user", "content": "one more word " * 40}]}
        await capture(sim.url + CHAT, b)  # warm the prefix cache (when on)
        cap = await capture(sim.url + CHAT, b, fault("null_details"))
        usages = [json.loads(d)["usage"] for d in cap.data if d != "[DONE]"]
        assert len(usages) == 6  # role, 4 tokens, the final usage chunk
        assert all("prompt_tokens_details" in u and u["prompt_tokens_details"] is None for u in usages)
        assert usages[-1]["completion_tokens"] == 4
        unary = {**body(4), "stream": False, "messages": b["messages"]}
        async with aiohttp.ClientSession() as s, s.post(sim.url + CHAT, json=unary, headers=fault("null_details")) as r:
            raw = await r.read()
            assert b'"prompt_tokens_details":null' in raw
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        # the truth keeps what the engine served from its cache (the wire just does not say)
        if prefix_cache_blocks is None:
            assert rec.cached_tokens > 0
        else:
            assert rec.cached_tokens == 0
