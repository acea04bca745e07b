"""The simulated engine answering eval items from their key (``servelens sim --answer-key``), end to end
through ``servelens eval run``: the accuracy the eval reads is exactly the key's draws."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelens.eval.runner import EvalConfig, run_eval
from servelens.eval.suites import answer_key, read_text_suite
from servelens.sim.answers import AnswerKey, AnswerPolicy, answers_right
from servelens.sim.config import SimConfig
from servelens.sim.testing import run_sim


def _write_key(tmp_path: Path, suite: str) -> Path:
    path = tmp_path / f"{suite}-key.jsonl"
    lines = answer_key(suite, read_text_suite(suite, None))
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("suite", ["gsm8k", "mmlu"])
async def test_the_sim_answers_eval_items_as_its_key_and_policy_say(tmp_path: Path, suite: str) -> None:
    path = _write_key(tmp_path, suite)
    policy = AnswerPolicy(0.6, seed=3)
    async with run_sim(answer_key=str(path), answer_accuracy=0.6, seed=3) as sim:
        res = await run_eval(EvalConfig(url=sim.url, suite=suite, limit=12, output_dir=str(tmp_path / "out"),
                                        progress=False))
    assert res.records and all(r.error is None for r in res.records)
    for r in res.records:
        assert r.correct == answers_right(r.item, policy), r.item  # the key's draw, item by item
    assert sum(bool(r.correct) for r in res.records) not in (0, len(res.records))  # both kinds seen


async def test_requests_that_are_not_items_are_generated_as_usual(tmp_path: Path) -> None:
    import aiohttp

    path = _write_key(tmp_path, "gsm8k")
    async with run_sim(answer_key=str(path)) as sim, aiohttp.ClientSession() as s:
        body = {"model": "sim-model", "max_tokens": 5, "messages": [{"role": "user", "content": "not an item"}]}
        async with s.post(sim.url + "/v1/chat/completions", json=body) as r:
            reply = (await r.json())["choices"][0]["message"]["content"]
    assert r.status == 200 and "####" not in reply and len(reply.split()) == 5


def test_a_bad_answer_key_or_policy_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"item": "x"}\n')
    with pytest.raises(ValueError, match=r"line 1: not an answer-key line"):
        AnswerKey.read(bad)
    with pytest.raises(ValueError, match=r"accuracy must be in \[0, 1\]"):
        SimConfig(answer_accuracy=1.5)
