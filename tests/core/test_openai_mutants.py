"""OpenAI payload reading that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md)."""

from __future__ import annotations

import json

import msgspec
import pytest

from servelens.core import openai as openai_mod
from servelens.core.openai import decode_json_strictness, error_body, parse_chunk, parse_response


@pytest.mark.parametrize(
    "delta",
    [{"function_call": {"name": "f"}}, {"function_call": {"arguments": "{"}}, {"tool_calls": [{"index": 0}]}],
)
def test_a_function_call_or_tool_call_delta_is_output(delta: dict) -> None:
    info = parse_chunk(json.dumps({"choices": [{"index": 0, "delta": delta}]}))
    assert info.has_output and info.first_output and info.outputs == 1


@pytest.mark.parametrize(
    ("message", "has_output"),
    [
        ({"role": "assistant", "content": "hi"}, True),
        ({"role": "assistant", "content": None, "reasoning_content": "think"}, True),
        ({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}, True),
        ({"role": "assistant", "content": ""}, False),
        ({"role": "assistant", "content": None, "tool_calls": []}, False),
    ],
)
def test_a_whole_responses_message_is_output_when_it_has_content_reasoning_or_tool_calls(
    message: dict, has_output: bool
) -> None:
    body = json.dumps({"object": "chat.completion", "choices": [{"index": 0, "message": message}]})
    info = parse_response(body)
    assert info.has_output is has_output and info.outputs == int(has_output)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"error": "boom"}, "boom"),  # a bare string error
        ({"error": {"code": 500}}, str({"code": 500})),  # an error object without a message: the whole object
        ({"error": {"message": "m", "code": 1}}, "m"),
    ],
)
def test_error_text_of_an_error_field(payload: dict, message: str) -> None:
    info = parse_chunk(json.dumps(payload))
    assert info.error == message and info.obj == payload


def test_object_error_keeps_the_payload() -> None:
    payload = {"object": "error", "message": "bad", "code": 400}
    info = parse_chunk(json.dumps(payload))
    assert info.error == "bad" and info.obj == payload


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("boom", "boom"),
        (b"boom", "boom"),  # bytes are decoded to text
        (b"\xff boom", "\ufffd boom"),  # invalid UTF-8 is replaced, not raised
        ("", "(empty error event)"),
    ],
)
def test_an_error_event_that_is_not_json_gives_its_text(data: str | bytes, message: str) -> None:
    info = parse_chunk(data, event="error")
    assert info.error == message and type(info.error) is str


def test_done_as_bytes_or_text() -> None:
    assert parse_chunk(b"[DONE]").done and parse_chunk("[DONE]").done
    assert not parse_chunk(b"[done]").done


def test_a_normal_chunk_keeps_its_object_and_counts_its_choices() -> None:
    payload = {"choices": [{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}},
                           {"index": 2, "delta": {}}]}
    info = parse_chunk(json.dumps(payload))
    assert info.obj == payload
    assert (info.choices, info.outputs, info.several_choices, info.first_choice) == (3, 2, True, True)


@pytest.mark.parametrize(
    ("reasons", "first"),
    [([None], None), ([None, "length"], "length"), (["stop", "length"], "stop"), (["", "stop"], "stop")],
)
def test_finish_reason_is_the_first_non_null_among_the_choices(reasons: list, first: str | None) -> None:
    payload = {"choices": [{"index": i, "delta": {}, "finish_reason": r} for i, r in enumerate(reasons)]}
    assert parse_chunk(json.dumps(payload)).finish_reason == first


def test_strictness_flag_says_which_decoder_accepted_the_text() -> None:
    assert decode_json_strictness('{"a": 1}') == ({"a": 1}, True)
    value, strict = decode_json_strictness('{"a": NaN}')  # only Python's json accepts NaN
    assert strict is False and value["a"] != value["a"]


def test_a_recursion_error_from_the_decoder_is_a_decode_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def deep(data: bytes | str) -> object:
        raise RecursionError

    monkeypatch.setattr(openai_mod, "_decode", deep)
    with pytest.raises(msgspec.DecodeError, match=r"^JSON is nested too deeply$"):
        decode_json_strictness(b"[]")


def test_error_body_with_a_lone_surrogate_is_compact_json_like_the_others() -> None:
    assert error_body("\ud800", "t") == b'{"error":{"message":"\\ud800","type":"t","param":null,"code":null}}'
    assert error_body("x", "t") == b'{"error":{"message":"x","type":"t","param":null,"code":null}}'
