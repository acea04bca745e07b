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


def two_choices(ct: int | None = None, texts: tuple[str, str] = ("a", "x")) -> str:
    body: dict[str, object] = {"choices": [{"index": i, "delta": {"content": t}} for i, t in enumerate(texts)]}
    if ct is not None:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": ct}
    return json.dumps(body)


def test_counted_from_usage_is_a_bool_for_the_results_file() -> None:
    """``counted_from_usage`` goes into each result as ``tokens_from_usage``: True or False, never None."""
    counter = FirstChoiceTokens()
    assert counter.counted_from_usage is False and counter.started is False  # nothing counted yet
    counter.step(parse_chunk(chunk("a", 1)))
    assert counter.counted_from_usage is True and counter.started is True
    for breaking in (chunk("b"), chunk("b", 0), two_choices(5), two_choices(), two_choices(5, ("", "x"))):
        counter = FirstChoiceTokens()
        counter.step(parse_chunk(chunk("a", 1)))
        counter.step(parse_chunk(breaking))
        assert counter.counted_from_usage is False, breaking


def test_chunks_before_the_first_output_carry_no_token_and_the_first_carries_one_at_least() -> None:
    # a role-only chunk first; a first output chunk whose count has not moved is still the first token
    assert steps(chunk(""), chunk("a", 0), chunk("b", 1)) == [0, 1, 1]


def test_a_count_of_several_choices_is_not_the_first_choices() -> None:
    # from the chunk carrying two choices and one count on, one output chunk is one token
    assert steps(chunk("a", 1), two_choices(4), chunk("b", 6), chunk("c", 9)) == [1, 1, 1, 1]
    # two choices' output without usage: the same
    assert steps(chunk("a", 1), two_choices(), chunk("b", 6)) == [1, 1, 1]


def test_another_choices_count_is_not_read() -> None:
    # choice 1's count (5) is its own: the first choice goes on from 2 to 4
    assert steps(chunk("a", 2), chunk("x", 5, index=1), chunk("b", 4)) == [2, 0, 2]


def test_a_cut_stream_is_truncated_unless_an_error_came_first() -> None:
    from servelens.core.openai import parse_chunk
    from servelens.core.stream import cut_mid_event, stream_outcome

    assert cut_mid_event(parse_chunk('{"choi')) and not cut_mid_event(parse_chunk('{"choices": []}'))
    assert not cut_mid_event(parse_chunk("[DONE]"))
    for complete in (True, False):
        for produced in (True, False):
            assert stream_outcome(failed=False, complete=complete, produced=produced, cut=True) == "truncated_stream"
            assert stream_outcome(failed=True, complete=complete, produced=produced, cut=True) == "backend_error"
    assert stream_outcome(failed=False, complete=True, produced=True) == ""
    assert stream_outcome(failed=False, complete=True, produced=True, cut=False) == ""
