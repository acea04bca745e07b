"""Tokens per chunk of the first choice and the outcome of a stream (pure)."""

import json

from servelens.core.openai import parse_chunk
from servelens.core.stream import FirstChoiceTokens, stream_outcome


def chunk(text: str, ct: int | None = None, index: int = 0) -> str:
    body: dict[str, object] = {"choices": [{"index": index, "delta": {"content": text}}]}
    if ct is not None:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": ct}
    return json.dumps(body)


def steps(*chunks: str) -> list[int]:
    counter = FirstChoiceTokens()
    return [counter.step(parse_chunk(c)) for c in chunks]


def test_tokens_follow_the_cumulative_count() -> None:
    assert steps(chunk("a", 1), chunk("b", 1), chunk("", 3), chunk("d", 4)) == [1, 0, 2, 1]


def test_without_usage_one_output_chunk_is_one_token() -> None:
    assert steps(chunk("a"), chunk(""), chunk("b"), chunk("c", 9)) == [1, 0, 1, 1]


def test_a_count_that_goes_back_is_not_cumulative() -> None:
    counter = FirstChoiceTokens()
    got = [counter.step(parse_chunk(c)) for c in (chunk("a", 2), chunk("b", 1), chunk("", 5), chunk("c", 6))]
    assert got == [2, 1, 0, 1] and not counter.counted_from_usage


def test_other_choices_chunks_carry_none_of_the_first_choices_tokens() -> None:
    assert steps(chunk("a", 2), chunk("x", 2, index=1), chunk("b", 4), chunk("y", 4, index=1)) == [2, 0, 2, 0]


def test_the_outcome_vocabulary() -> None:
    assert stream_outcome(failed=True, complete=True, produced=True) == "backend_error"
    assert stream_outcome(failed=False, complete=False, produced=True) == "truncated_stream"
    assert stream_outcome(failed=False, complete=True, produced=False) == "backend_error"
    assert stream_outcome(failed=False, complete=True, produced=True) == ""


def test_error_shapes_in_a_stream() -> None:
    assert parse_chunk('{"message": "boom"}', "error").error == "boom"
    assert parse_chunk("", "error").error == "(empty error event)"
    assert parse_chunk('{"error": {"message": "x"}}', "error").error == "x"
    assert parse_chunk('{"object": "error", "message": "y", "code": 400}').error == "y"
    assert parse_chunk('{"object": "chat.completion.chunk", "choices": []}').error is None
