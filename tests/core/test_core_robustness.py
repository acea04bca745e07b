"""The core against hostile input: nesting too deep to decode, junk usage values."""

from __future__ import annotations

import pytest

from servelens.core.openai import parse_chunk, parse_response, parse_usage

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("payload", [DEEP, b'{"choices":' + DEEP + b"}", DEEP.decode()],
                         ids=["array", "in_object", "str"])
def test_nesting_too_deep_is_malformed_not_an_exception(payload: bytes | str) -> None:
    assert parse_chunk(payload).malformed
    assert parse_response(payload).malformed


@pytest.mark.parametrize("bad", [-1, -700, True, False, 1.5, "12", None, [3]])
def test_usage_counts_must_be_non_negative_ints(bad: object) -> None:
    u = parse_usage({"prompt_tokens": bad, "completion_tokens": bad, "prompt_tokens_details": {"cached_tokens": bad}})
    assert u is not None
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (None, None, None)
    ok = parse_usage({"prompt_tokens": 0, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}})
    assert ok is not None and (ok.prompt_tokens, ok.completion_tokens, ok.cached_tokens) == (0, 7, 0)
