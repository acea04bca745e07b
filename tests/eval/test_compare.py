"""compare between two simulated deployments whose truth is known; its table, JSON and HTML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelens.eval.compare import compare_dirs
from servelens.eval.report import JSON_FIELDS, render_html, rich_table, to_json
from servelens.eval.runner import EvalConfig, run_eval
from servelens.eval.stats import holm, mcnemar_exact
from servelens.eval.suites import answer_key, read_text_suite
from servelens.eval.testing import Endpoint, key_of
from servelens.sim.answers import AnswerPolicy, answers_right


async def deployment(ep: Endpoint, out: Path, policy: AnswerPolicy, suite: str = "mgsm", **kw: object) -> None:
    ep.key = key_of(answer_key(suite, read_text_suite(suite, None)))
    ep.policy = policy
    await run_eval(EvalConfig(url=ep.url, suite=suite, output_dir=str(out), backoff_s=0.001, **kw))  # type: ignore[arg-type]


A = AnswerPolicy(0.8, seed=1, independence=0.5)
B = AnswerPolicy(0.6, seed=2, independence=0.5)


async def test_two_deployments_single_run(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A)
    await deployment(endpoint, tmp_path / "b", B, model="other")  # the fake answers any model name
    items = [i.id for i in read_text_suite("mgsm", None)]
    b = sum(answers_right(i, A) and not answers_right(i, B) for i in items)
    c = sum(answers_right(i, B) and not answers_right(i, A) for i in items)
    result = compare_dirs(tmp_path / "a", tmp_path / "b")
    top = result.rows[0]
    p = top.paired
    assert (top.eval, p.n, p.only_a, p.only_b, p.test) == ("mgsm", 275, b, c, "mcnemar-exact")
    assert p.p_value == pytest.approx(mcnemar_exact(b, c))
    assert top.accuracy_a == pytest.approx(sum(answers_right(i, A) for i in items) / 275)
    assert top.real_difference is (p.p_value < 0.05)
    groups = result.rows[1:]
    assert [g.group for g in groups] == ["bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh"]
    assert [g.p_holm for g in groups] == pytest.approx(holm([g.paired.p_value for g in groups]))
    assert all(g.real_difference is ((g.p_holm or 1) < 0.05) for g in groups)
    assert sum(g.paired.only_a for g in groups) == b
    data = json.loads(to_json(result))
    (ev,) = data["evals"]
    assert all(k in ev for k in JSON_FIELDS) and len(ev["groups"]) == 11
    assert all(k in g for g in ev["groups"] for k in JSON_FIELDS)
    assert isinstance(ev["real_difference"], bool)
    table = rich_table(result)
    assert [c.header for c in table.columns] == ["Eval", "A", "B", "only A", "only B", "p", "Real difference?"]
    page = render_html(result)
    assert "ZOOMED axis, not from 0" in page and "<script src=" not in page and page.count("plotly.js v") >= 1


async def test_self_comparison_says_no(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A, suite="gsm8k")
    await deployment(endpoint, tmp_path / "a2", A, suite="gsm8k", use_cache=False)  # a rerun of A
    result = compare_dirs(tmp_path / "a", tmp_path / "a2")
    top = result.rows[0]
    assert (top.paired.only_a, top.paired.only_b, top.paired.p_value, top.real_difference) == (0, 0, 1.0, False)
    assert any("self-comparison" in n for n in result.notes)
    assert "gsm8k: 0 of 100 replies differ in text between A and B (same item and run index)" in result.notes


async def test_format_failures_compared(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A, suite="gsm8k", limit=10)
    endpoint.key = key_of([])  # every reply is "no idea": no number at all
    endpoint.policy = A
    await run_eval(EvalConfig(url=endpoint.url, suite="gsm8k", output_dir=str(tmp_path / "b"), limit=10))
    notes = compare_dirs(tmp_path / "a", tmp_path / "b").notes
    assert ("gsm8k: extraction failures A 0, B 10 of 10 (only A 0, only B 10, McNemar exact p 0.00195; "
            "first run of each)") in notes


async def test_repeated_runs_use_item_means_and_spread(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A, suite="gsm8k", runs=3)
    await deployment(endpoint, tmp_path / "b", B, suite="gsm8k", runs=2)
    top = compare_dirs(tmp_path / "a", tmp_path / "b").rows[0]
    assert top.paired.test == "paired-permutation"
    assert len(top.runs_a_values) == 3 and len(top.runs_b_values) == 2
    assert top.sd_a == 0.0  # the fake answers alike in every run


async def test_different_item_sets_refused(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A, suite="gsm8k", limit=10)
    await deployment(endpoint, tmp_path / "b", A, suite="gsm8k", limit=12)
    with pytest.raises(ValueError, match=r"^gsm8k: A and B ran different items \(0 only in A, 2 only in B; "
                                         r"e\.g\. gsm8k/10\)"):
        compare_dirs(tmp_path / "a", tmp_path / "b")


async def test_failed_items_left_out_and_counted(endpoint: Endpoint, tmp_path: Path) -> None:
    await deployment(endpoint, tmp_path / "a", A, suite="gsm8k", limit=10)
    endpoint.fail_prompts = {read_text_suite("gsm8k", None)[3].messages[-1]["content"]}
    await deployment(endpoint, tmp_path / "b", A, suite="gsm8k", limit=10, retries=0)
    top = compare_dirs(tmp_path / "a", tmp_path / "b").rows[0]
    assert (top.paired.n, top.excluded) == (9, 1)


def test_not_run_folders(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no eval runs"):
        compare_dirs(tmp_path, tmp_path)
    with pytest.raises(ValueError, match="alpha"):
        compare_dirs(tmp_path, tmp_path, alpha=1.5)
