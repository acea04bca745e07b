import json

import pytest

from servelens.core.openai import error_body, parse_chunk


def chunk(delta: dict | None = None, text: str | None = None, finish: str | None = None, usage: object = None,
          **extra: object) -> str:
    choice: dict = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    return json.dumps({"choices": [choice], "usage": usage, **extra})


@pytest.mark.parametrize(
    ("payload", "has_output"),
    [
        (chunk({"role": "assistant", "content": ""}), False),  # role-only first chunk is not output
        (chunk({"role": "assistant"}), False),
        (chunk({"content": "hi"}), True),
        (chunk({"reasoning_content": "think"}), True),
        (chunk({"reasoning": "think"}), True),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), True),
        (chunk(text="abc"), True),
        (chunk(text=""), False),
        (json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}), False),
    ],
)
def test_output_bearing(payload: str, has_output: bool) -> None:
    assert parse_chunk(payload).has_output is has_output


def test_usage_and_cached_tokens() -> None:
    info = parse_chunk(chunk({"content": "x"}, usage={"prompt_tokens": 10, "completion_tokens": 1,
                                                     "prompt_tokens_details": {"cached_tokens": 8}}))
    assert info.usage is not None
    assert (info.usage.prompt_tokens, info.usage.completion_tokens, info.usage.cached_tokens) == (10, 1, 8)


@pytest.mark.parametrize("details", [None, {}, {"cached_tokens": None}])
def test_cached_tokens_absent_or_null_is_unknown(details: object) -> None:
    usage: dict = {"prompt_tokens": 10, "completion_tokens": 1}
    if details is not None:
        usage["prompt_tokens_details"] = details
    info = parse_chunk(chunk({"content": "x"}, usage=usage))
    assert info.usage is not None and info.usage.cached_tokens is None


def test_null_usage_is_none() -> None:
    assert parse_chunk(chunk({"content": "x"}, usage=None)).usage is None


def test_done_malformed_error_finish() -> None:
    assert parse_chunk("[DONE]").done
    assert parse_chunk("{not json").malformed
    assert parse_chunk("[1,2]").malformed
    err = parse_chunk(json.dumps({"error": {"message": "boom", "type": "internal_error"}}))
    assert err.error == "boom"
    assert parse_chunk(chunk({"content": "x"}, finish="stop")).finish_reason == "stop"


def test_error_body_shape() -> None:
    body = json.loads(error_body("bad", "invalid_request_error", 400))
    assert body == {"error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": 400}}


def test_error_body_echoing_a_lone_surrogate_is_json() -> None:
    # decode_json lets a client's "\ud800" in; an error message that echoes it must still encode
    raw = error_body("The model '\ud800x☃' does not exist.", "invalid_request_error", "model_not_found")
    assert b"\\ud800" in raw
    assert json.loads(raw)["error"]["message"] == "The model '\ud800x☃' does not exist."


@pytest.mark.parametrize(
    ("choices", "first", "outputs", "several"),
    [
        ([{"index": 0, "delta": {"content": "a"}}], True, 1, False),
        ([{"delta": {"content": "a"}}], True, 1, False),  # no index: the first choice
        ([{"index": 1, "delta": {"content": "a"}}], False, 1, True),
        ([{"index": 1, "delta": {"role": "assistant"}}], False, 0, True),
        ([{"index": 0, "delta": {"content": "a"}}, {"index": 1, "delta": {"content": "b"}}], True, 2, True),
        ([{"index": 0, "text": ""}, {"index": 2, "text": "b"}], False, 1, True),
    ],
)
def test_which_choices_carry_output(choices: list, first: bool, outputs: int, several: bool) -> None:
    info = parse_chunk(json.dumps({"choices": choices}))
    assert (info.first_output, info.outputs, info.several_choices) == (first, outputs, several)
    assert info.has_output == (outputs > 0)


@pytest.mark.parametrize(("count", "read"), [(0, 0), (2**31 - 1, 2**31 - 1), (2**31, None), (10**15, None),
                                             (10**18, None), (-1, None), (True, None), (3.0, None), ("3", None)])
def test_usage_counts_beyond_int32_are_unknown(count: object, read: int | None) -> None:
    """A usage count above 2**31 - 1 is junk, as a negative or non-integer one is: unknown (None), so an
    upstream's 10**18 never reaches OSL, output_tokens_total nor an ISL bucket."""
    usage = {"prompt_tokens": count, "completion_tokens": count,
             "prompt_tokens_details": {"cached_tokens": count}}
    got = parse_chunk(chunk({"content": "x"}, usage=usage)).usage
    assert got is not None
    assert (got.prompt_tokens, got.completion_tokens, got.cached_tokens) == (read, read, read)
