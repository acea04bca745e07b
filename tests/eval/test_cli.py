"""``servelens eval run`` and ``compare`` through the console script's entry point."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from servelens.cli.main import main
from servelens.eval.suites import answer_key, read_text_suite
from servelens.eval.testing import Endpoint, key_of
from servelens.sim.answers import AnswerPolicy


async def cli(*argv: str) -> int:
    # main() runs its own event loop: in a thread, while the endpoint serves in this one
    return await asyncio.to_thread(main, list(argv))


async def test_run_and_compare(endpoint: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint.key = key_of(answer_key("mmlu", read_text_suite("mmlu", None)))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert await cli("eval", "run", "--url", endpoint.url, "--suite", "mmlu", "--limit", "5", "--output-dir", a,
                     "--no-progress", "--temperature", "0") == 0
    out = capsys.readouterr().out
    assert "servelens eval mmlu" in out and "temperature 0.0 sent" in out and "records:" in out
    summary = json.loads((tmp_path / "a" / "mmlu" / "summary.json").read_text())
    assert summary["mean"] == 1.0 and summary["items"] == 30
    endpoint.policy = AnswerPolicy(0.0)
    assert await cli("eval", "run", "--url", endpoint.url, "--suite", "mmlu", "--limit", "5", "--output-dir", b,
                     "--no-progress", "--temperature", "0") == 0
    capsys.readouterr()
    html = tmp_path / "c.html"
    assert await cli("eval", "compare", a, b, "--format", "json", "--html", str(html)) == 0
    data = json.loads(capsys.readouterr().out)
    (ev,) = data["evals"]
    assert (ev["accuracy_a"], ev["accuracy_b"], ev["only_a"], ev["only_b"]) == (1.0, 0.0, 30, 0)
    assert ev["real_difference"] is True and ev["p_value"] == pytest.approx(2 / 2**30)
    assert html.exists()
    assert await cli("eval", "compare", a, b, "--no-html") == 0
    table = capsys.readouterr().out
    assert "Real difference?" in table and "abstract_algebra" in table


async def test_one_line_errors(endpoint: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "test.jsonl"
    bad.write_text("not json\n")
    assert await cli("eval", "run", "--url", endpoint.url, "--suite", "gsm8k", "--data", str(bad),
                     "--output-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err == f"servelens: error: {bad} line 1: not GSM8K test.jsonl format (a JSON object with 'question' " \
                  "and an 'answer' ending '#### <number>')\n"
    assert await cli("eval", "run", "--url", "http://127.0.0.1:9", "--suite", "gsm8k",
                     "--output-dir", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: cannot reach http://127.0.0.1:9/v1/models") and err.count("\n") == 1
    assert await cli("eval", "compare", str(tmp_path / "x"), str(tmp_path / "y")) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:  # argparse's own exit, as for every subcommand
        await cli("eval", "run", "--url", endpoint.url, "--suite", "nope")
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("servelens: error: argument --suite: invalid choice: 'nope'")


async def test_every_item_failed_exits_1(
    endpoint: Endpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint.fail_status = 500
    assert await cli("eval", "run", "--url", endpoint.url, "--suite", "gsm8k", "--limit", "2", "--retries", "0",
                     "--no-progress", "--output-dir", str(tmp_path)) == 1
    assert "failed 2" in capsys.readouterr().out
