"""The runner against a small answering endpoint: known accuracy, cache and resume, retries, failures,
function calling."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from servelens.eval.records import read_run
from servelens.eval.runner import EvalConfig, EvalResult, print_summary, run_eval
from servelens.eval.suites import answer_key, read_text_suite, select
from servelens.eval.testing import Endpoint, key_of
from servelens.sim.answers import AnswerPolicy, answers_right


def config(ep: Endpoint, tmp: Path, **kw: Any) -> EvalConfig:
    kw.setdefault("suite", "gsm8k")
    kw.setdefault("limit", 20)
    return EvalConfig(url=ep.url, output_dir=str(tmp), backoff_s=0.001, **kw)


def keyed(ep: Endpoint, suite: str = "gsm8k") -> None:
    ep.key = key_of(answer_key(suite, read_text_suite(suite, None)))


async def test_accuracy_is_the_known_truth(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    endpoint.policy = AnswerPolicy(0.7, seed=5)
    res = await run_eval(config(endpoint, tmp_path, limit=50))
    expected = [answers_right(f"gsm8k/{i}", endpoint.policy) for i in range(50)]
    assert [r.correct for r in res.records] == expected
    assert res.summary["mean"] == pytest.approx(sum(expected) / 50)
    assert (res.summary["failed"], res.summary["requests_sent"], res.summary["retries"]) == (0, 50, 0)
    assert res.summary["temperature_sent"] is False and "temperature" not in endpoint.bodies[0]
    back = read_run(tmp_path / "gsm8k")
    assert [r.item for r in back.records] == [f"gsm8k/{i}" for i in range(50)]
    rec = back.records[0]
    assert rec.requests[0]["messages"][0]["content"].endswith(read_text_suite("gsm8k", None)[0].messages[0]["content"])
    assert rec.usage == {"prompt_tokens": rec.usage["prompt_tokens"], "completion_tokens": 7}
    assert rec.latency_s is not None and rec.latency_s > 0


async def test_temperature_recorded_and_sent(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint, "mmlu")
    res = await run_eval(config(endpoint, tmp_path, suite="mmlu", limit=2, temperature=0.0, runs=2))
    assert all(b["temperature"] == 0.0 for b in endpoint.bodies)
    assert res.summary["temperature_sent"] is True and res.summary["temperature"] == 0.0
    assert len(endpoint.bodies) == 2 * 6 * 2  # 2 runs x 6 subjects x 2 items: a run index is part of the key
    assert res.summary["per_run"] == [1.0, 1.0] and res.summary["sd_over_runs"] == 0.0
    assert set(res.summary["per_group"]) == {r.group for r in res.records}


async def test_resume_sends_exactly_the_missing_items(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    endpoint.stop_after = 12  # the endpoint goes away after 12 answers
    first = await run_eval(config(endpoint, tmp_path, retries=0, concurrency=1))
    assert first.summary["failed"] == 8
    answered = {r.item for r in first.records if r.error is None}
    endpoint.stop_after = None
    endpoint.bodies.clear()
    second = await run_eval(config(endpoint, tmp_path, concurrency=3))
    items = read_text_suite("gsm8k", None)
    sent = {next(i.id for i in items if i.messages[-1]["content"] == b["messages"][-1]["content"])
            for b in endpoint.bodies}
    assert sent == {f"gsm8k/{i}" for i in range(20)} - answered and len(endpoint.bodies) == 8
    assert second.summary["failed"] == 0 and second.summary["cache_hits"] == 12
    endpoint.bodies.clear()
    third = await run_eval(config(endpoint, tmp_path))  # a repeated run costs nothing
    assert endpoint.bodies == [] and third.summary["cache_hits"] == 20
    assert [r.correct for r in third.records] == [r.correct for r in second.records]
    await run_eval(config(endpoint, tmp_path, use_cache=False))
    assert len(endpoint.bodies) == 20  # --no-cache: fresh calls


async def test_cache_not_shared_between_deployments(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    await run_eval(config(endpoint, tmp_path, limit=5))
    endpoint.bodies.clear()
    await run_eval(config(endpoint, tmp_path, limit=5, model="other-model"))  # same folder, another model
    assert len(endpoint.bodies) == 5


async def test_retries_counted(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    endpoint.fail_first = 3
    res = await run_eval(config(endpoint, tmp_path, limit=5, concurrency=1))
    assert (res.summary["retries"], res.summary["requests_sent"], res.summary["failed"]) == (3, 8, 0)


async def test_erroring_endpoint_counts_failures(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    endpoint.fail_status = 500
    res = await run_eval(config(endpoint, tmp_path, limit=4, retries=2))
    assert res.summary["failed"] == 4 and res.summary["retries"] == 8 and res.summary["scored"] == 0
    assert all(r.error == "HTTP 500: engine unavailable (after 3 attempts)" for r in res.records)
    endpoint.fail_status = 400  # not retried
    res = await run_eval(config(endpoint, tmp_path, limit=4, retries=2))
    assert res.summary["retries"] == 0 and res.records[0].error == "HTTP 400: engine unavailable"


async def test_timeout_is_a_counted_failure(endpoint: Endpoint, tmp_path: Path) -> None:
    keyed(endpoint)
    items = read_text_suite("gsm8k", None)
    endpoint.hang_prompts = {items[2].messages[-1]["content"]}
    res = await run_eval(config(endpoint, tmp_path, limit=4, retries=1, timeout_s=0.2))
    (failed,) = [r for r in res.records if r.error is not None]
    assert failed.item == "gsm8k/2" and "timed out (after 2 attempts)" in (failed.error or "")
    assert res.summary["failed"] == 1 and res.summary["scored"] == 3


async def test_an_error_sent_with_200_is_a_failure_not_cached(endpoint: Endpoint, tmp_path: Path) -> None:
    """Some servers answer an error object with status 200: the item fails with its message, and as it
    is no answer it is not cached, so the rerun asks exactly that item again."""
    keyed(endpoint)
    items = read_text_suite("gsm8k", None)
    endpoint.error_200_prompts = {items[1].messages[-1]["content"]}
    first = await run_eval(config(endpoint, tmp_path, limit=3))
    (failed,) = [r for r in first.records if r.error is not None]
    assert failed.item == "gsm8k/1" and failed.error == "HTTP 200 with an error: model overloaded"
    assert first.summary["retries"] == 0 and first.summary["failed"] == 1
    endpoint.error_200_prompts = set()
    endpoint.bodies.clear()
    second = await run_eval(config(endpoint, tmp_path, limit=3))
    assert [b["messages"][-1]["content"] for b in endpoint.bodies] == [items[1].messages[-1]["content"]]
    assert second.summary["failed"] == 0 and second.summary["cache_hits"] == 2


async def test_cache_not_shared_between_endpoints_serving_the_same_model(tmp_path: Path) -> None:
    """Two deployments under one model name, one output folder: the second is asked every item."""
    from servelens.eval.testing import answering_endpoint

    async with answering_endpoint() as a, answering_endpoint() as b:
        keyed(a)
        keyed(b)
        await run_eval(config(a, tmp_path, limit=5))
        res = await run_eval(config(b, tmp_path, limit=5))
        assert a.model == b.model and len(b.bodies) == 5 and res.summary["cache_hits"] == 0
        a.bodies.clear()
        again = await run_eval(config(a, tmp_path, limit=5))  # A's answers are still A's
        assert a.bodies == [] and again.summary["cache_hits"] == 5


async def test_unreachable_endpoint_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^cannot reach http://127\.0\.0\.1:9/v1/models: cannot connect"):
        await run_eval(EvalConfig(url="http://127.0.0.1:9", suite="gsm8k", output_dir=str(tmp_path)))


def test_config_checks() -> None:
    for kw, msg in (({"suite": "nope"}, "unknown suite"), ({"runs": 0}, "--runs"), ({"limit": 0}, "--limit"),
                    ({"url": "ftp://x"}, "--url"), ({"shots": 2}, "--shots is for")):
        with pytest.raises(ValueError, match=msg):
            EvalConfig(**({"url": "http://127.0.0.1:1", "suite": "gsm8k"} | kw))  # type: ignore[arg-type]


# --- function calling ---------------------------------------------------------------------------------


def reference_caller(body: dict[str, Any]) -> dict[str, Any]:
    """Calls the reference calls of the turn it is asked (from the user message), then stops: a tool
    result already in the conversation after the last user message means "done"."""
    from servelens.eval.bfcl import read_bfcl
    from servelens.eval.suites import packaged_data

    msgs = body["messages"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    if any(m["role"] == "tool" for m in msgs[last_user:]):
        return {"role": "assistant", "content": "Done."}
    for conv in read_bfcl(packaged_data("bfcl"))[0]:
        for t, turn in enumerate(conv.turns):
            if turn[-1]["content"] == msgs[last_user]["content"]:
                calls = [{"id": f"x{k}", "type": "function",
                          "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
                         for k, c in enumerate(conv.expected[t])]
                return {"role": "assistant", "content": None, "tool_calls": calls} if calls else {
                    "role": "assistant", "content": "Nothing to do."}
    raise AssertionError("unknown turn")


async def test_bfcl_reference_caller_scores_perfectly(endpoint: Endpoint, tmp_path: Path) -> None:
    endpoint.tool_reply = reference_caller
    res = await run_eval(config(endpoint, tmp_path, suite="bfcl", limit=3, tool_results="stand-in"))
    s = res.summary
    assert s["tool_call_f1"] == 1.0 and s["function_name_f1"] == 1.0 and s["exact_turns"] == s["scored"]
    assert s["records"] == 13 and s["failed"] == 0  # 3 conversations of 4 + 4 + 5 turns
    # every turn took two replies: the calls, then "Done." after their results
    assert s["requests_sent"] == 2 * 13
    assert all(len(r.requests) == 2 and r.requests[1]["messages"][-1]["role"] == "tool" for r in res.records)


async def test_bfcl_malformed_calls_counted(endpoint: Endpoint, tmp_path: Path) -> None:
    def junk(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] == "tool":
            return {"role": "assistant", "content": "ok"}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "cd", "arguments": "{not json"}},
            {"id": "b", "type": "function", "function": {"name": "teleport", "arguments": "{}"}},
            {"id": "c", "type": "function", "function": {"name": "mv", "arguments": '{"source": "x"}'}},
            {"id": "d", "type": "function"}]}

    endpoint.tool_reply = junk
    res = await run_eval(config(endpoint, tmp_path, suite="bfcl", limit=1, tool_results="stand-in"))
    s = res.summary
    turns = s["scored"]
    assert s["failed"] == 0 and turns == 4
    assert s["invalid_json_calls"] == 2 * turns  # "{not json" and the entry without a function
    assert s["unknown_function_calls"] == 2 * turns  # "teleport" and the nameless one
    assert s["missing_required_calls"] == turns
    assert s["tool_call_recall"] == 1.0 and s["exact_turns"] == 0
    # the results told the model what was wrong
    tool_msgs = [m for m in res.records[0].requests[1]["messages"] if m["role"] == "tool"][-4:]
    assert [json.loads(m["content"]).get("error", "")[:7] for m in tool_msgs] == ["argumen", "unknown", "missing",
                                                                                "unknown"]


async def test_bfcl_context_cut_counted(endpoint: Endpoint, tmp_path: Path) -> None:
    endpoint.tool_reply = reference_caller
    # the first conversation's turns 0 and 1 fit; from turn 2 on the history is too long
    from servelens.eval.bfcl import StandInResults, read_bfcl, reference_messages
    from servelens.eval.suites import packaged_data

    conv = read_bfcl(packaged_data("bfcl"))[0][0]
    sizes = [len(json.dumps(reference_messages(conv, t, StandInResults().session(conv, t).history())))
             for t in range(len(conv.turns))]
    endpoint.context_chars = sizes[2] - 1
    res = await run_eval(config(endpoint, tmp_path, suite="bfcl", limit=1, tool_results="stand-in"))
    s = res.summary
    assert (s["cut_turns"], s["cut_conversations"], s["failed"], s["scored"]) == (2, 1, 0, 2)
    assert [r.cut for r in res.records] == [False, False, True, True]
    assert res.records[2].error == "prompt longer than the context: turn cut"
    endpoint.context_chars = None
    endpoint.fail_status = 400  # a 400 for another reason is a failure, not a cut
    res = await run_eval(config(endpoint, tmp_path, suite="bfcl", limit=1, tool_results="stand-in", use_cache=False))
    assert res.summary["cut_turns"] == 0 and res.summary["failed"] == 4


def test_bfcl_select_by_conversation() -> None:
    from servelens.eval.bfcl import read_bfcl
    from servelens.eval.suites import packaged_data

    convs = select(read_bfcl(packaged_data("bfcl"))[0], None, 3)
    assert [len(c.turns) for c in convs] == [4, 4, 5]


def test_summary_title_never_breaks_the_url() -> None:
    """The title wrapped at the table's width and cut the URL ("/v1/chat/completio" over "ns"); a word
    wider than the table now stays whole."""
    url = "http://127.0.0.1:45678/v1/chat/completions"
    s = {"suite": "gsm8k", "model": "sim-model", "url": url, "runs": 1, "headline": "accuracy",
         "sd_over_runs": None, "per_run": [0.8], "mean": 0.8, "per_group": {}, "temperature_sent": True,
         "temperature": 0, "items": 10, "max_tokens": 512, "requests_sent": 10, "retries": 0, "cache_hits": 0,
         "failed": 0, "extraction_failures": 0, "output_tokens_per_s_during_eval": None,
         "fresh_completion_tokens": 0}
    buf = io.StringIO()
    print_summary(EvalResult((), s, Path("out")), Console(file=buf, width=80))
    lines = buf.getvalue().splitlines()
    assert lines[0].strip() == f"servelens eval gsm8k: sim-model at {url}"
    assert lines[1].startswith("┏")  # the table right under it, narrower than the title
