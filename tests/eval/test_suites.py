"""Suite readers on the packaged cuts and on files in the wrong format; BFCL parsing and tool results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelens.eval import bfcl
from servelens.eval.scoring import MadeCall
from servelens.eval.suites import answer_key, packaged_data, read_text_suite, score_text, select


def test_packaged_cuts_read() -> None:
    gsm = read_text_suite("gsm8k", None)
    assert len(gsm) == 100 and gsm[0].id == "gsm8k/0" and gsm[0].gold == "18"
    assert "#### <number>" in gsm[0].messages[-1]["content"]
    mgsm = read_text_suite("mgsm", None)
    assert len(mgsm) == 11 * 25
    assert {i.group for i in mgsm} == {"bn", "de", "en", "es", "fr", "ja", "ru", "sw", "te", "th", "zh"}
    # row i is the same problem in every language: same gold answer
    assert {i.gold for i in mgsm if i.id.endswith("/0")} == {"18"}
    mmlu = read_text_suite("mmlu", None)
    assert len(mmlu) == 6 * 20 and mmlu[0].id == "mmlu/abstract_algebra/0" and mmlu[0].gold == "B"
    convs, skipped = bfcl.read_bfcl(packaged_data("bfcl"))
    assert len(convs) == 10 and skipped == []
    assert convs[0].item_id(2) == "bfcl/multi_turn_base_0/2"


def test_mmlu_shots_are_dev_exemplars() -> None:
    items = read_text_suite("mmlu", None, shots=2)
    msgs = items[0].messages
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"].startswith("Answer: ")
    with pytest.raises(ValueError, match="fewer than --shots"):
        read_text_suite("mmlu", None, shots=6)


def test_select_limits_per_group() -> None:
    mgsm = read_text_suite("mgsm", None)
    got = select(mgsm, ["de", "fr"], 3)
    assert [i.id for i in got] == [f"mgsm/{lang}/{r}" for lang in ("de", "fr") for r in range(3)]
    assert len(select(read_text_suite("gsm8k", None), None, 7)) == 7
    with pytest.raises(ValueError, match="no group xx"):
        select(mgsm, ["xx"], None)


def test_wrong_formats_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"q": "what"}\n')
    with pytest.raises(ValueError, match="line 1: not GSM8K"):
        read_text_suite("gsm8k", bad)
    (tmp_path / "mgsm_de.tsv").write_text("a question without an answer\n")
    with pytest.raises(ValueError, match="not MGSM format"):
        read_text_suite("mgsm", tmp_path)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "x_test.csv").write_text("q,a,b\n1,2,3\n")
    with pytest.raises(ValueError, match="not MMLU CSV format"):
        read_text_suite("mmlu", tmp_path)
    with pytest.raises(ValueError, match=r"no test/<subject>_test\.csv"):
        read_text_suite("mmlu", tmp_path / "test")
    with pytest.raises(ValueError, match="BFCL v3 multi-turn base layout"):
        bfcl.read_bfcl(tmp_path)
    with pytest.raises(ValueError, match="no such file"):
        read_text_suite("gsm8k", tmp_path / "missing.jsonl")


def test_bfcl_mismatched_entry_skipped(tmp_path: Path) -> None:
    src = packaged_data("bfcl")
    for p in src.rglob("*.json"):
        dst = tmp_path / p.relative_to(src)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(p.read_bytes())
    answers = tmp_path / "possible_answer" / bfcl.QUESTIONS_FILE
    lines = answers.read_text().splitlines()
    first = json.loads(lines[0])
    first["ground_truth"].append([])
    answers.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    convs, skipped = bfcl.read_bfcl(tmp_path)
    assert skipped == ["multi_turn_base_0"] and len(convs) == 9


def test_score_text() -> None:
    gsm = read_text_suite("gsm8k", None)[0]
    assert score_text("gsm8k", gsm, "so 9 * 2 = 18\n#### 18").correct
    assert not score_text("gsm8k", gsm, "#### 19").correct
    failed = score_text("gsm8k", gsm, "no idea")
    assert (failed.extracted, failed.correct) == (None, False)
    mmlu = read_text_suite("mmlu", None)[0]
    assert score_text("mmlu", mmlu, "Answer: B").method == "strict"


def test_answer_key_lines_score_as_they_say() -> None:
    for suite in ("gsm8k", "mgsm", "mmlu"):
        items = read_text_suite(suite, None)[:30]
        for it, line in zip(items, answer_key(suite, items), strict=True):
            assert line["prompt"] == it.messages[-1]["content"]
            assert score_text(suite, it, line["correct"]).correct
            assert not score_text(suite, it, line["wrong"]).correct


def test_parse_reference_calls() -> None:
    assert bfcl.parse_call("sort('final_report.pdf')", ["file_name"]) == ("sort", {"file_name": "final_report.pdf"})
    assert bfcl.parse_call("grep(file_name='a', pattern='b')", []) == ("grep", {"file_name": "a", "pattern": "b"})
    assert bfcl.parse_call("f(x=[1, 2], y={'k': True})", []) == ("f", {"x": [1, 2], "y": {"k": True}})
    for bad in ("f(", "x.y(1)", "f(g(1))", "f(1, 2)", "f(**k)"):
        with pytest.raises(ValueError, match="reference call"):
            bfcl.parse_call(bad, ["a"])


def test_tools_are_json_schema() -> None:
    convs, _ = bfcl.read_bfcl(packaged_data("bfcl"))
    text = json.dumps(convs[0].tools)
    assert '"type": "dict"' not in text and '"type": "float"' not in text
    assert all(t["type"] == "function" and t["function"]["parameters"]["type"] == "object" for t in convs[0].tools)


def test_reference_history_teacher_forced() -> None:
    conv = bfcl.read_bfcl(packaged_data("bfcl"))[0][0]
    session = bfcl.StandInResults().session(conv, 2)
    msgs = bfcl.reference_messages(conv, 2, session.history())
    roles = [m["role"] for m in msgs]
    # turn 0: user, assistant (3 calls), 3 tool results; turn 1: user, assistant (2 calls), 2 results; turn 2 user
    assert roles == ["user", "assistant", "tool", "tool", "tool", "user", "assistant", "tool", "tool", "user"]
    assert [c["function"]["name"] for c in msgs[1]["tool_calls"]] == ["cd", "mkdir", "mv"]
    assert msgs[-1] == dict(conv.turns[2][0])


def test_stand_in_results() -> None:
    conv = bfcl.read_bfcl(packaged_data("bfcl"))[0][0]
    s = bfcl.StandInResults().session(conv, 0)
    assert json.loads(s.call(MadeCall("cd", '{"folder": "x"}'))) == {"status": "ok"}
    assert "unknown function" in s.call(MadeCall("rm_rf", "{}"))
    assert "not a valid JSON" in s.call(MadeCall("cd", "{"))
    assert "missing required" in s.call(MadeCall("cd", "{}"))


@pytest.mark.skipif(not bfcl.bfcl_available(), reason="needs bfcl-eval (pip install --no-deps bfcl-eval mpmath)")
def test_bfcl_executor_runs_the_reference() -> None:
    conv = bfcl.read_bfcl(packaged_data("bfcl"))[0][0]
    s = bfcl.BfclExecutor().session(conv, 1)
    (results,) = s.history()
    assert json.loads(results[0]) == {"current_working_directory": "document"}
    # turn 1 starts in document/ with temp/ made and the report moved: a grep there finds it
    out = s.call(MadeCall("cd", '{"folder": "temp"}'))
    assert "temp" in out
    assert "budget analysis" in s.call(MadeCall("grep", '{"file_name": "final_report.pdf", "pattern": "budget"}'))


def test_read_tool_calls_keeps_malformed() -> None:
    made, echo = bfcl.read_tool_calls({"tool_calls": [
        {"id": "c1", "function": {"name": "cd", "arguments": '{"folder": "a"}'}},
        {"function": {"name": "ls", "arguments": {"a": True}}},  # an object instead of a string
        {"function": {"arguments": "{}"}},  # no name
        "junk",
    ]})
    assert [m.name for m in made] == ["cd", "ls", "", ""]
    assert made[1].arguments == '{"a": true}'
    assert made[3].arguments == "null"
    assert [e["id"] for e in echo] == ["c1", "call_1", "call_2", "call_3"]
    assert bfcl.read_tool_calls({"content": "hi"}) == ([], [])
