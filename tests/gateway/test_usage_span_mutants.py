"""Finding and cutting the top-level ``usage`` member on the bytes, checked against a JSON decoder,
on the shapes mutation testing found unchecked (scripts/mutation.py, docs/mutation.md): pretty-printed
JSON, nested ``usage`` keys and arrays before the top-level one, strings holding quotes, backslashes,
braces and ``"usage":``."""

from __future__ import annotations

import json

import pytest

from servelens.gateway.usage import choices_empty, null_usage, remove_usage, usage_span

BODIES = [
    '{"id":"a","choices":[],"usage":{"prompt_tokens":1}}',
    '{"id": "a", "usage": {"prompt_tokens": 1, "completion_tokens": 2}, "choices": []}',
    '{"x_groq": {"usage": {"a": 1}}, "usage": {"b": 2}}',
    '{"choices": [{"delta": {"content": "a \\" } ] { \\\\"}}], "usage": {"c": 3}}',
    '{"s": "x\\\\", "t": [1, "\\"usage\\": 5"], "usage": null}',
    '{"s": "\\\\\\"", "usage": {"p": [1, 2]}}',
    '{"usage": {"p": 1}, "choices": []}',
    '{"usage": {"p": 1}}',
    '{"a": 12, "b": true, "c": null, "d": -1.5e3, "usage": 7}',
    '{ "a" : [ ] , "usage" : { "p" : 1 } }',
    '{"a":{"b":[{"c":"}"}]},"usage":{"d":{"e":1}}}',
    # a nested object first, so the member-by-member scan runs: empty strings, an escaped quote just
    # before a closing one, a top-level string holding ", " and a brace
    '{"x": {"": ""}, "": "", "usage": {"p": 1}}',
    '{"x": {"q": "\\""}, "r": "\\"", "usage": 1}',
    '{"x": {}, "s": "a, b}", "usage": {"p": 1}}',
]


def block(body: str) -> bytes:
    return b"data: " + body.encode() + b"\n\n"


@pytest.mark.parametrize("body", BODIES)
def test_usage_span_is_the_top_level_member(body: str) -> None:
    raw = block(body)
    obj = json.loads(body)
    span = usage_span(raw)
    assert span is not None
    key, value, end = span
    assert raw[key:key + 7] == b'"usage"'
    assert json.loads(raw[value:end]) == obj["usage"]
    assert raw[end:].lstrip(b" ")[:1] in (b",", b"}")


@pytest.mark.parametrize("body", BODIES)
def test_remove_and_null_usage_change_only_the_usage_member(body: str) -> None:
    raw = block(body)
    obj = json.loads(body)
    without = {k: v for k, v in obj.items() if k != "usage"}
    cut = remove_usage(raw)
    assert cut.startswith(b"data: ") and cut.endswith(b"}\n\n")
    assert json.loads(cut[6:]) == without
    nulled = null_usage(raw)
    assert json.loads(nulled[6:]) == {**obj, "usage": None}


@pytest.mark.parametrize(
    "body",
    [
        '{"x": {"usage": 1}}',  # only a nested one
        '{"s": "\\"usage\\": 1"}',  # only inside a string
        '{"a": 1}',
        '{"a": [1, 2}',  # unterminated: not as expected
        '"usage": 1, "b": 2',  # no object at all
        '{"x": {"usage": 1},',  # cut off after a member
        '{"x": {"usage": 1}, 5}',  # a member without a key
        '{"x": {"usage": 1}, "a" 5}',  # a key without a colon
    ],
)
def test_no_top_level_usage_member_gives_none(body: str) -> None:
    assert usage_span(block(body)) is None


def test_known_lets_a_single_occurrence_be_the_member_wherever_it_is() -> None:
    raw = block('{"choices": [{"index": 0}], "usage": {"p": 1}}')
    _, value, end = usage_span(raw, known=True) or (0, 0, 0)
    assert raw[value:end] == b'{"p": 1}'
    # two occurrences: the nested first one is not taken, even when known
    raw = block('{"choices": [{"usage": 0}], "usage": {"p": 1}}')
    assert json.loads(remove_usage(raw)[6:]) == {"choices": [{"usage": 0}]}


def test_remove_and_null_usage_on_the_bare_json_of_a_multi_line_event() -> None:
    # an event whose JSON spans several data: lines is cut as one text, starting with its brace
    text = b'{"x": {"usage": 1}, "usage": {"p": 2}, "y": 3}'
    assert remove_usage(text) == b'{"x": {"usage": 1}, "y": 3}'
    assert null_usage(text) == b'{"x": {"usage": 1}, "usage": null, "y": 3}'
    assert remove_usage(b'{"usage": {"p": 2}, "y": 3}') == b'{"y": 3}'


def test_choices_empty_on_a_cut_off_block_is_false_not_an_error() -> None:
    assert choices_empty(b'data: {"choices": [\n\n') is False
    assert choices_empty(b'data: {"choices": [ ]}\n\n') is True


def test_bare_text_cut_off_after_a_comma_gives_no_span() -> None:
    assert usage_span(b'{"x": {"usage": 1},') is None
