"""HTTP behaviour of the sim: formats, usage, errors, metrics, truth, timing, disconnect."""

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from servelens.core.openai import parse_chunk
from servelens.sim.model import idle_ttft_s
from servelens.sim.scheduler import Step
from servelens.sim.testing import capture, run_sim
from servelens.sim.tokenizer import count_tokens, make_text


def chat(content: str, **kw: object) -> dict[str, object]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **kw}


async def test_streaming_chat_format_and_final_usage() -> None:
    async with run_sim() as sim:
        prompt = make_text(37, "p")
        cap = await capture(sim.url + "/v1/chat/completions",
                            chat(prompt, max_tokens=9, ignore_eos=True, stream=True,
                                 stream_options={"include_usage": True}))
        assert cap.status == 200 and cap.headers["content-type"].startswith("text/event-stream")
        rid = cap.headers["x-request-id"]
        data = cap.data
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert all(c["usage"] is None for c in chunks[:-1])
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert not parse_chunk(data[0]).has_output
        tokens = chunks[1:-1]
        assert len(tokens) == 9 and all(c["object"] == "chat.completion.chunk" and c["id"] == rid for c in tokens)
        assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 8 + ["length"]
        text = "".join(c["choices"][0]["delta"]["content"] for c in tokens)
        assert count_tokens(text) == 9
        final = chunks[-1]
        assert final["choices"] == []
        assert final["usage"] == {"prompt_tokens": 37, "completion_tokens": 9, "total_tokens": 46,
                                  "prompt_tokens_details": {"cached_tokens": 0}}
        rec = await sim.wait_truth(rid)
        assert (rec.isl, rec.osl, rec.outcome, rec.finish_reason) == (37, 9, "ok", "length")
        assert rec.first_token_ns is not None
        assert rec.arrival_ns < rec.first_token_ns <= cap.read_ns[-1]
        assert len(rec.token_times_ns) == 9 and list(rec.token_times_ns) == sorted(rec.token_times_ns)


async def test_streaming_completions_continuous_usage_and_no_usage_key() -> None:
    async with run_sim() as sim:
        cap = await capture(sim.url + "/v1/completions",
                            {"prompt": "one two three", "max_tokens": 5, "ignore_eos": True, "stream": True,
                             "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        chunks = [json.loads(d) for d in cap.data[:-1]]
        assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [1, 2, 3, 4, 5]
        assert all(c["object"] == "text_completion" and "text" in c["choices"][0] for c in chunks[:-1])
        assert chunks[-1]["usage"]["prompt_tokens"] == 3
        plain = await capture(sim.url + "/v1/completions",
                              {"prompt": "one two", "max_tokens": 3, "ignore_eos": True, "stream": True})
        assert all("usage" not in json.loads(d) for d in plain.data[:-1])
        assert plain.data[-1] == "[DONE]"


async def test_non_streaming_token_id_prompt_determinism_and_request_id_reuse() -> None:
    async with run_sim(seed=7) as sim, aiohttp.ClientSession() as s:
        body = {"prompt": [5, 6, 7, 8], "max_tokens": 12, "ignore_eos": True}
        texts = []
        for rid in ("mine-1", "mine-2"):
            async with s.post(sim.url + "/v1/completions", json=body, headers={"x-request-id": rid}) as r:
                assert r.status == 200 and r.headers["x-request-id"] == rid
                obj = await r.json()
                texts.append(obj["choices"][0]["text"])
                assert obj["usage"]["prompt_tokens"] == 4 and obj["usage"]["completion_tokens"] == 12
        assert texts[0] == texts[1] and count_tokens(texts[0]) == 12
        async with s.post(sim.url + "/v1/completions", json={**body, "seed": 8}) as r:
            assert (await r.json())["choices"][0]["text"] != texts[0]
        async with s.post(sim.url + "/v1/chat/completions", json=chat("hi", max_tokens=3, ignore_eos=True)) as r:
            obj = await r.json()
            assert obj["object"] == "chat.completion"
            assert obj["choices"][0]["message"]["role"] == "assistant"
            assert obj["choices"][0]["finish_reason"] == "length"


async def test_eos_min_tokens_and_stop_reason() -> None:
    async with run_sim(eos_min_tokens=3, eos_max_tokens=3) as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 10}) as r:
            obj = await r.json()
            assert obj["usage"]["completion_tokens"] == 3 and obj["choices"][0]["finish_reason"] == "stop"
        async with s.post(sim.url + "/v1/completions",
                          json={"prompt": "a b", "max_tokens": 10, "min_tokens": 6}) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 6
        async with s.post(sim.url + "/v1/completions",
                          json={"prompt": "a b", "max_completion_tokens": 2}) as r:
            obj = await r.json()
            assert obj["usage"]["completion_tokens"] == 2 and obj["choices"][0]["finish_reason"] == "length"


async def test_bad_requests_get_openai_errors() -> None:
    async with run_sim() as sim, aiohttp.ClientSession() as s:
        cases = [
            (chat("x", n=0), 400, "n"),
            (chat("x", n=129), 400, "n"),
            (chat("x", n=True), 400, "n"),
            ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
            ({"messages": []}, 400, "messages"),
            (chat("x", max_tokens=0), 400, "max_tokens"),
            (chat("x", stream_options={"include_usage": True}), 400, "stream_options"),
            (chat("x", max_tokens=200_000), 400, "max_tokens"),
        ]
        for body, status, param in cases:
            async with s.post(sim.url + "/v1/chat/completions", json=body) as r:
                assert r.status == status, body
                err = (await r.json())["error"]
                assert set(err) == {"message", "type", "param", "code"} and err["param"] == param
                assert r.headers["x-request-id"]
        async with s.post(sim.url + "/v1/completions", data=b"{not json") as r:
            assert r.status == 400 and "JSON" in (await r.json())["error"]["message"]
        for body in ({"prompt": ""}, {"prompt": [""]}):  # 0 tokens: vLLM refuses an empty prompt too
            async with s.post(sim.url + "/v1/completions", json=body) as r:
                err = (await r.json())["error"]
                assert r.status == 400 and err["param"] == "prompt" and "cannot be empty" in err["message"]
        async with s.post(sim.url + "/v1/completions", json={"prompt": "x"},
                          headers={"x-servelens-fault": "bogus"}) as r:
            assert r.status == 400 and "bogus" in (await r.json())["error"]["message"]
        assert all(t.outcome == "invalid" for t in sim.truth())
        for path in ("/v1/completions", "/v1/chat/completions"):
            async with s.get(sim.url + path) as r:
                assert r.status == 405 and r.headers["allow"] == "POST"
                assert (await r.json())["error"]["code"] == 405


async def test_models_health_tokenize_metrics_and_debug_off() -> None:
    async with run_sim(model="m1") as sim, aiohttp.ClientSession() as s:
        async with s.get(sim.url + "/v1/models") as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["m1"]
        async with s.get(sim.url + "/health") as r:
            assert r.status == 200
        async with s.post(sim.url + "/tokenize", json={"prompt": "Hello, world!"}) as r:
            obj = await r.json()
            assert obj["count"] == 4 and len(obj["tokens"]) == 4
        async with s.post(sim.url + "/tokenize", json={"messages": [{"role": "user", "content": "a b"}]}) as r:
            assert (await r.json())["count"] == 2
        async with s.post(sim.url + "/v1/completions",
                          json={"model": "m1", "prompt": make_text(40, 1), "max_tokens": 4, "ignore_eos": True}) as r:
            rid = r.headers["x-request-id"]
            await r.read()
        await sim.wait_truth(rid)
        async with s.get(sim.url + "/metrics") as r:
            text = await r.text()
        for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_count",
                     "vllm:e2e_request_latency_seconds_sum", "vllm:request_prompt_tokens_sum",
                     "vllm:request_generation_tokens_sum", "vllm:num_requests_running",
                     "vllm:num_requests_waiting", "vllm:prompt_tokens_cached_total"):
            assert name in text, name
        assert 'vllm:request_prompt_tokens_sum{model_name="m1"} 40.0' in text
        assert 'vllm:inter_token_latency_seconds_count{model_name="m1"} 3.0' in text
        async with s.get(sim.url + "/debug/requests") as r:
            assert r.status == 404


async def test_debug_endpoints_and_truth_log_file(tmp_path: Path) -> None:
    log = tmp_path / "truth.jsonl"
    async with run_sim(debug=True, truth_log=str(log)) as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/completions", json={"prompt": "a", "max_tokens": 3}) as r:
            rid = r.headers["x-request-id"]
            await r.read()
        rec = await sim.wait_truth(rid)
        async with s.get(sim.url + "/debug/requests") as r:
            data = (await r.json())["data"]
        assert data[-1]["request_id"] == rid and data[-1]["token_times_ns"] == list(rec.token_times_ns)
        async with s.get(sim.url + "/debug/stats") as r:
            assert (await r.json())["steps"] >= 3
    lines = log.read_bytes().splitlines()
    assert msgspec.json.decode(lines[-1])["request_id"] == rid


async def test_ttft_grows_with_uncached_isl_over_http() -> None:
    """Over HTTP the engine charges each prompt its model's prefill (the steps it planned, in model
    seconds, equal the idle TTFT of the model), which grows with the uncached ISL; the wall TTFT holds at
    least that time divided by --speedup. (That steps take exactly cost / speedup is checked on a virtual
    clock in test_model.py; on this machine how much longer is its load's figure.)"""
    isls = (200, 3000, 12000)
    async with run_sim(speedup=2) as sim, aiohttp.ClientSession() as s:
        engine = sim.engine
        real_plan = engine.plan
        planned: list[Step] = []

        def plan() -> Step | None:
            step = real_plan()
            if step is not None:
                planned.append(step)
            return step

        engine.plan = plan  # type: ignore[method-assign]
        ttfts, costs = [], []
        for isl in isls:
            body = {"prompt": make_text(isl, ("isl", isl)), "max_tokens": 2, "ignore_eos": True}
            async with s.post(sim.url + "/v1/completions", json=body) as r:
                rid = r.headers["x-request-id"]
                assert (await r.json())["usage"]["prompt_tokens"] == isl
            rec = await sim.wait_truth(rid)
            assert rec.ttft_ns is not None
            ttfts.append(rec.ttft_ns)
            costs.append(sum(st.cost_s for st in planned if any(req.request_id == rid for req, _ in st.prefill)))
        assert costs == pytest.approx([idle_ttft_s(sim.config.params, isl) for isl in isls], rel=1e-9)
        assert costs == sorted(costs) and costs[2] > 5 * costs[0]
        assert all(t >= c / 2 * 1e9 * 0.99 for t, c in zip(ttfts, costs, strict=True)), (ttfts, costs)


async def test_repeated_long_prompt_reports_cached_tokens_and_lower_ttft() -> None:
    """The second of two identical 8,000-token prompts is served from the prefix cache: usage and truth
    say so, and the engine prefills only the uncached tail, at under half the first one's modelled
    prefill cost (the steps the engine planned, in model seconds: how long each took on this machine is
    its load's figure, not the definition)."""
    async with run_sim(speedup=4) as sim, aiohttp.ClientSession() as s:
        engine = sim.engine
        real_plan = engine.plan
        planned: list[Step] = []

        def plan() -> Step | None:
            step = real_plan()
            if step is not None:
                planned.append(step)
            return step

        engine.plan = plan  # type: ignore[method-assign]
        body = chat(make_text(8000, "shared"), max_tokens=2, ignore_eos=True, stream=True,
                    stream_options={"include_usage": True})
        recs = []
        for _ in range(2):
            cap = await capture(sim.url + "/v1/chat/completions", body)
            usage = json.loads(cap.data[-2])["usage"]
            recs.append((usage["prompt_tokens_details"]["cached_tokens"],
                         await sim.wait_truth(cap.headers["x-request-id"])))
        (c1, r1), (c2, r2) = recs
        assert c1 == 0 and c2 == (8000 - 1) // 16 * 16 and r2.cached_tokens == c2

        def prefill(rid: str) -> tuple[int, float]:
            """(tokens, modelled seconds) of the steps that prefilled ``rid``'s prompt."""
            steps = [(st, n) for st in planned for req, n in st.prefill if req.request_id == rid]
            return sum(n for _, n in steps), sum(st.cost_s for st, _ in steps)

        (tokens1, cost1), (tokens2, cost2) = prefill(r1.request_id), prefill(r2.request_id)
        assert tokens1 == 8000 and tokens2 == 8000 - c2
        assert 0 < cost2 < cost1 / 2
        # the wall TTFT holds at least the modelled prefill, scaled by --speedup (a bound load only raises)
        assert r1.ttft_ns is not None and r1.ttft_ns >= cost1 / 4 * 1e9 * 0.99
        del s


async def test_queueing_appears_beyond_max_num_seqs() -> None:
    async with run_sim(speedup=5, max_num_seqs=2) as sim:
        body = {"prompt": "x y z", "max_tokens": 30, "ignore_eos": True, "stream": True}
        caps = await asyncio.gather(*[
            capture(sim.url + "/v1/completions", body, {"x-request-id": f"q{i}"}) for i in range(4)])
        assert all(c.status == 200 for c in caps)
        recs = sorted([await sim.wait_truth(f"q{i}") for i in range(4)], key=lambda r: r.admitted_ns or 0)
        first_end = min(r.token_times_ns[-1] for r in recs[:2])
        # the first pair is admitted before either ends; the queued pair only once a slot is free, so its
        # TTFT holds that wait (how long it is, ~30 decode steps, is a figure of the machine's load)
        assert all(r.admitted_ns is not None and r.admitted_ns < first_end for r in recs[:2])
        assert all((r.admitted_ns or 0) >= first_end for r in recs[2:])
        assert all((r.first_token_ns or 0) > first_end and (r.ttft_ns or 0) > first_end - r.arrival_ns
                   for r in recs[2:])


async def test_disconnect_stops_generation_within_one_step() -> None:
    async with run_sim(speedup=10) as sim, aiohttp.ClientSession() as s:
        body = {"prompt": "go", "max_tokens": 5000, "ignore_eos": True, "stream": True}
        r = await s.post(sim.url + "/v1/completions", json=body)
        rid = r.headers["x-request-id"]
        got = 0
        async for line in r.content:
            if line.startswith(b"data: {"):
                got += 1
                if got == 5:
                    break
        r.close()  # drop the connection
        rec = await sim.wait_truth(rid, timeout=30)
        assert rec.outcome == "cancelled" and rec.cancel_ns is not None
        assert 5 <= rec.osl < 5000
        assert sum(1 for t in rec.token_times_ns if t > rec.cancel_ns) <= 1
        assert not sim.engine.running and not sim.engine.waiting


async def test_non_streaming_disconnect_stops_generation() -> None:
    async with run_sim(speedup=10) as sim, aiohttp.ClientSession() as s:
        body = {"prompt": "go", "max_tokens": 5000, "ignore_eos": True}  # ~3 s of wall time at speedup 10
        with pytest.raises(TimeoutError):
            async with s.post(sim.url + "/v1/completions", json=body, headers={"x-request-id": "ns-gone"},
                              timeout=aiohttp.ClientTimeout(total=0.3)) as r:
                await r.read()
        rec = await sim.wait_truth("ns-gone", timeout=30)
        assert rec.outcome == "cancelled" and rec.osl < 5000 and not rec.stream
        assert rec.cancel_ns is not None and sum(1 for t in rec.token_times_ns if t > rec.cancel_ns) <= 1
        assert not sim.engine.running and not sim.engine.waiting


async def test_kv_capacity_and_prompt_shapes() -> None:
    async with run_sim(kv_capacity_tokens=100) as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/completions", json={"prompt": make_text(90, 0), "max_tokens": 20}) as r:
            assert r.status == 400 and "KV cache" in (await r.json())["error"]["message"]
        async with s.post(sim.url + "/v1/completions", json={"prompt": ["a b c"], "max_tokens": 2}) as r:
            assert (await r.json())["usage"]["prompt_tokens"] == 3
        async with s.post(sim.url + "/v1/completions", json={"prompt": ["a", "b"], "max_tokens": 2}) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "prompt"


async def test_no_cached_tokens_field_when_prefix_cache_is_off() -> None:
    async with run_sim(prefix_cache_blocks=0) as sim:
        body = {"prompt": make_text(64, 5), "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
        for _ in range(2):
            cap = await capture(sim.url + "/v1/completions", body)
            usage = json.loads(cap.data[-2])["usage"]
            assert usage["prompt_tokens"] == 64 and "prompt_tokens_details" not in usage
            assert (await sim.wait_truth(cap.headers["x-request-id"])).cached_tokens == 0


async def test_requests_let_go_by_a_failing_step_end_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    # a step that raises (a bug, or a model input nothing validated) used to stop the step loop, and
    # every request hung; now its requests end with an error and the engine serves the next ones
    async with run_sim() as sim, aiohttp.ClientSession() as s:
        engine = sim.engine
        real_plan = engine.plan
        fail = {"after_tokens": 3}

        def plan() -> Step | None:
            if fail and any(r.generated >= fail["after_tokens"] for r in engine.running):
                fail.clear()
                raise OverflowError("step cost")
            return real_plan()

        engine.plan = plan  # type: ignore[method-assign]
        body = chat("hello there", max_tokens=50, ignore_eos=True, stream=True)
        async with s.post(sim.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            text = (await r.read()).decode()
        assert '"error"' in text and "Engine dropped the request" in text and "[DONE]" not in text
        assert text.count('"content"') >= 3  # the tokens before the failure went out

        fail["after_tokens"] = 0  # unary: fails before its tokens are out
        async with s.post(sim.url + "/v1/chat/completions", json=chat("again", max_tokens=5)) as r:
            assert r.status == 500
            assert (await r.json())["error"]["message"].startswith("Engine dropped the request")

        async with s.post(sim.url + "/v1/chat/completions", json=chat("fine now", max_tokens=5)) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] <= 5
    assert caplog.text.count("sim step failed; letting go of 1 request(s)") == 2
    assert [t.outcome for t in sim.truth()] == ["error", "error", "ok"]


async def test_idle_keepalive_connection_is_closed_after_the_timeout() -> None:
    # aiohttp's own default would hold an idle client connection for an hour
    async with run_sim(keepalive_timeout_s=0.3) as sim:
        host, port = sim.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: sim\r\n\r\n")
            await writer.drain()
            answered = asyncio.get_running_loop().time()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            async with asyncio.timeout(10):  # the server's close: EOF
                assert await reader.read() == b""
            assert asyncio.get_running_loop().time() - answered >= 0.25
        finally:
            writer.close()


async def test_created_is_the_request_time_not_the_servers_start() -> None:
    """``created`` (unix s) of each response is taken when the request arrives, as vLLM does; the
    server's start time stays on ``/v1/models`` only."""
    import time

    async with run_sim() as sim, aiohttp.ClientSession() as s:
        sim._server.state.created = 1  # a start time no response may show
        for stream in (False, True):
            before = int(time.time())
            cap = await capture(sim.url + "/v1/chat/completions",
                                chat("hi", max_tokens=2, ignore_eos=True, stream=stream))
            after = int(time.time())
            objs = [json.loads(d) for d in cap.data[:-1]] if stream else [json.loads(cap.body)]
            assert objs and all(before <= o["created"] <= after for o in objs)
        async with s.get(sim.url + "/v1/models") as r:
            assert (await r.json())["data"][0]["created"] == 1


def _piece(chunk: Any) -> str:
    """The text a one-choice chunk carries (chat delta content or completions text)."""
    choice = chunk["choices"][0]
    return str(choice["delta"].get("content") or "") if "delta" in choice else str(choice["text"])


@pytest.mark.parametrize("endpoint", ["chat_completions", "completions"])
async def test_n_choices_stream_their_own_tokens_with_per_choice_usage(endpoint: str) -> None:
    """n=3: each choice its own stream of tokens (interleaved chunks, one choice each, by
    ``index``), its own EOS point and finish_reason; continuous usage counts the chunk's choice;
    the final usage sums the choices (OpenAI/vLLM semantics); choice 0 is what n=1 gives."""
    async with run_sim() as sim:
        url = sim.url + ("/v1/chat/completions" if endpoint == "chat_completions" else "/v1/completions")
        base: dict[str, Any] = (chat("the same prompt", max_tokens=40) if endpoint == "chat_completions"
                                else {"prompt": "the same prompt", "max_tokens": 40})
        so = {"include_usage": True, "continuous_usage_stats": True}
        cap = await capture(url, {**base, "n": 3, "stream": True, "stream_options": so})
        one = await capture(url, {**base, "stream": True, "stream_options": so})
        chunks: list[Any] = [json.loads(d) for d in cap.data[:-1]]
        assert cap.data[-1] == "[DONE]"
        final, body = chunks[-1], chunks[:-1]
        assert final["choices"] == [] and all(len(c["choices"]) == 1 for c in body)
        per: dict[int, list[Any]] = {}
        for c in body:
            per.setdefault(c["choices"][0]["index"], []).append(c)
        assert sorted(per) == [0, 1, 2]
        counts = {}
        for i, cs in per.items():
            tokens = [c for c in cs if _piece(c)]
            counts[i] = len(tokens)
            # continuous usage: that choice's own cumulative count, one more per token chunk
            assert [c["usage"]["completion_tokens"] for c in tokens] == list(range(1, len(tokens) + 1))
            reasons = [c["choices"][0]["finish_reason"] for c in cs]
            assert reasons[-1] in ("stop", "length") and all(r is None for r in reasons[:-1])
        assert final["usage"]["completion_tokens"] == sum(counts.values())
        assert final["usage"]["prompt_tokens"] == final["usage"]["total_tokens"] - sum(counts.values())
        # the choices are their own texts (how they interleave depends on the loop's timing: not asserted)
        texts = {i: "".join(_piece(c) for c in cs) for i, cs in per.items()}
        assert len(set(texts.values())) == 3
        # choice 0 is what n=1 gives
        assert texts[0] == "".join(_piece(json.loads(d)) for d in one.data[:-2])
        rec = await sim.wait_truth(cap.headers["x-request-id"])
        assert (rec.choices, rec.osl, rec.outcome) == (3, sum(counts.values()), "ok")
        assert len(rec.token_times_ns) == counts[0]  # the first choice's timing


async def test_n_choices_whole_reply() -> None:
    async with run_sim() as sim, aiohttp.ClientSession() as s:
        async with s.post(sim.url + "/v1/chat/completions", json=chat("hello there", max_tokens=30, n=2)) as r:
            obj = await r.json()
        assert [c["index"] for c in obj["choices"]] == [0, 1]
        lengths = [count_tokens(c["message"]["content"]) for c in obj["choices"]]
        assert obj["usage"]["completion_tokens"] == sum(lengths)
        assert all(c["finish_reason"] in ("stop", "length") for c in obj["choices"])
        rec = await sim.wait_truth(r.headers["x-request-id"])
        assert (rec.choices, rec.osl) == (2, sum(lengths))
