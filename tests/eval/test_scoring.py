"""Scoring on hand-written replies with known answers."""

from __future__ import annotations

import pytest

from servelens.eval.scoring import (
    ExpectedCall,
    MadeCall,
    PrecisionRecall,
    call_counts,
    decision_counts,
    extract_letter,
    extract_number,
    numbers_equal,
    parse_arguments,
    score_turn,
)


@pytest.mark.parametrize(("reply", "value", "method"), [
    ("She makes 9 * 2 = $18 every day.\n#### 18", "18", "####"),
    ("#### -7", "-7", "####"),
    ("The temperature fell to −3 degrees.", "-3", "last_number"),  # U+2212 minus
    ("a loss of -12.5 dollars", "-12.5", "last_number"),
    ("16-3-4=9", "9", "last_number"),  # hyphens between numbers are not signs
    ("so 16-3-4", "4", "last_number"),
    ("she pays $-5", "-5", "last_number"),
    ("#### 1,234,567", "1234567", "####"),
    ("#### $1,000.00", "1000", "####"),
    ("#### 18.0", "18", "####"),
    ("The answer is 42.", "42", "last_number"),  # a trailing full stop
    ("#### 0.50", "0.5", "####"),
    ("#### 13 #### 14", "14", "####"),  # the LAST ####
    ("#### 13\nso #### 14 then 15", "14", "####"),  # the first number after the last ####
    ("#### 13 #### 14 ####", "14", "last_number"),  # nothing after the last ####: the last number
    ("5\u202f600 euros", "5600", "last_number"),  # French thin-space thousands
    ("3,5 hours", "5", "last_number"),  # "," is no decimal point
    ("12,34 and more", "34", "last_number"),  # nor a thousands separator without three digits
    ("€5 each, total #### €25", "25", "####"),
])
def test_extract_number(reply: str, value: str, method: str) -> None:
    got = extract_number(reply)
    assert got is not None
    assert (got.value, got.method) == (value, method)


@pytest.mark.parametrize("reply", ["", "I do not know.", "####", "no digits here ####"])
def test_extract_number_failure(reply: str) -> None:
    assert extract_number(reply) is None


@pytest.mark.parametrize(("extracted", "gold", "equal"), [
    ("18", "18", True), ("18", "18.00", True), ("5600", "5,600", True), ("1000", "$1,000", True),
    ("-3", "-3", True), ("3", "-3", False), ("18", "19", False), ("0.5", ".5", False),  # ".5" reads as 5
    ("7", "no number", False),
])
def test_numbers_equal(extracted: str, gold: str, equal: bool) -> None:
    assert numbers_equal(extracted, gold) is equal


@pytest.mark.parametrize(("reply", "letter", "method"), [
    ("B", "B", "strict"),
    (" (C) ", "C", "strict"),
    ("D.", "D", "strict"),
    ("Answer: A", "A", "strict"),
    ("Let me think. Answer: C\nNo wait. Answer: D", "D", "strict"),  # the last one
    ("Ｂ", "B", "lenient"),  # full-width letter
    ("答案：Ｃ", "C", "lenient"),
    ("答案是B选项", "B", "lenient"),
    ("正解はDです", "D", "lenient"),
    ("答えは (C)", "C", "lenient"),
    ("Jibu ni C", None, None),  # a phrase we do not list, with no other marker: a format failure
    ("Antwort: C", "C", "lenient"),
    ("La réponse est B.", "B", "lenient"),
    ("Réponse : A", "A", "lenient"),
    ("La respuesta es (D)", "D", "lenient"),
    ("Ответ: B", "B", "lenient"),
    ("The correct answer is **B**", "B", "lenient"),
    ("**C**", "C", "lenient"),
    ("I pick (A) here", "A", "lenient"),
    ("It is option D.", "D", "lenient"),
    ("A) because it is larger", "A", "lenient"),
    ("The answer is a bit unclear", None, None),  # a lowercase article is no choice
    ("I cannot tell.", None, None),
])
def test_extract_letter(reply: str, letter: str | None, method: str | None) -> None:
    got = extract_letter(reply)
    assert (got.letter, got.method) == (letter, method) if got else (letter, method) == (None, None)


REQUIRED = {"cd": ("folder",), "mv": ("source", "destination"), "ls": ()}
CD = ExpectedCall("cd", {"folder": "document"})
MV = ExpectedCall("mv", {"source": "a.pdf", "destination": "temp"})


def test_turn_exact() -> None:
    s = score_turn([CD, MV], [MadeCall("mv", '{"destination": "temp", "source": "a.pdf"}'),
                              MadeCall("cd", '{"folder": "document"}')], REQUIRED)
    assert (s.should_call, s.did_call, s.name_matches, s.exact_matches) == (True, True, 2, 2)
    assert s.exact and s.decision_correct
    assert (s.invalid_json, s.missing_required, s.unknown_functions) == (0, 0, 0)


def test_turn_flaws_counted() -> None:
    made = [MadeCall("cd", '{"folder": "docs"}'),  # right name, wrong argument
            MadeCall("mv", '{"source": "a.pdf"'),  # not JSON
            MadeCall("mv", '{"source": "a.pdf"}'),  # required argument missing
            MadeCall("rm", '{"path": "x"}')]  # invented
    s = score_turn([CD, MV], made, REQUIRED)
    assert (s.expected, s.made, s.name_matches, s.exact_matches) == (2, 4, 2, 0)
    assert (s.invalid_json, s.missing_required, s.unknown_functions) == (1, 1, 1)
    assert s.decision_correct and not s.exact


def test_turn_quiet() -> None:
    assert score_turn([], [], REQUIRED).decision_correct
    assert not score_turn([], [MadeCall("ls", "")], REQUIRED).decision_correct  # "" is {} (no arguments)
    assert not score_turn([CD], [], REQUIRED).decision_correct


def test_numbers_in_arguments_compare_by_value() -> None:
    exp = ExpectedCall("cd", {"folder": 5})
    assert score_turn([exp], [MadeCall("cd", '{"folder": 5.0}')], {"cd": ("folder",)}).exact
    assert not score_turn([exp], [MadeCall("cd", '{"folder": true}')], {"cd": ("folder",)}).exact


def test_parse_arguments() -> None:
    assert parse_arguments("") == {}
    assert parse_arguments('{"a": 1}') == {"a": 1}
    assert parse_arguments("[1]") is None
    assert parse_arguments("null") is None
    assert parse_arguments("{") is None


def test_precision_recall_f1_over_turns() -> None:
    # 4 turns: should&did, should&did, should&quiet (fn), shouldn't&did (fp) -> P 2/3, R 2/3, F1 2/3
    turns = [{"should_call": True, "did_call": True}, {"should_call": True, "did_call": True},
             {"should_call": True, "did_call": False}, {"should_call": False, "did_call": True},
             {"should_call": False, "did_call": False}]
    pr = decision_counts(turns)
    assert (pr.tp, pr.fp, pr.fn) == (2, 1, 1)
    assert pr.precision == pytest.approx(2 / 3) and pr.recall == pytest.approx(2 / 3)
    assert pr.f1 == pytest.approx(2 / 3)
    assert PrecisionRecall(0, 0, 0).f1 is None
    calls = call_counts([{"name_matches": 1, "made": 3, "expected": 2}, {"name_matches": 2, "made": 2, "expected": 2}])
    assert (calls.tp, calls.fp, calls.fn) == (3, 2, 1)
    assert calls.f1 == pytest.approx(6 / 9)
