"""Property-based tests (hypothesis) of the request-body usage injection with arbitrary JSON: it never
raises, what it sends is JSON whenever the client's body was, and the client's own fields are unchanged
(only ``stream_options.include_usage`` / ``continuous_usage_stats`` may be added)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from servelens.core.openai import decode_json_strictness
from servelens.gateway.usage import _lax_bool, plan_injection

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=8) | st.sampled_from(["\ud800", "true", "1", "yes", "no", "é🙂"]))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=15,
)
FLAG: st.SearchStrategy[Any] = st.sampled_from(
    [None, True, False, 1, 0, "true", "false", "yes", " true", 2, 1.0, [], {}])
STREAM_OPTIONS = st.one_of(
    st.just("absent"), JSON,
    st.fixed_dictionaries({}, optional={"include_usage": FLAG, "continuous_usage_stats": FLAG, "other": JSON}),
)
BODY = st.builds(
    lambda fields, so: {**fields, **({} if so == "absent" else {"stream_options": so}), "stream": True},
    st.dictionaries(st.sampled_from(["model", "messages", "prompt", "max_tokens", "n", "x", "é"]) | st.text(max_size=5),
                    JSON, max_size=5),
    STREAM_OPTIONS,
)


def canon(value: Any) -> str:
    """A comparable text of a JSON value (NaN equal to NaN; key order kept, as JSON objects keep it)."""
    return json.dumps(value, allow_nan=True)


@given(BODY, st.sampled_from([(",", ":"), (", ", ": "), (",", ": ")]), st.booleans(), st.booleans(),
       st.booleans(), st.booleans(), st.booleans())
def test_the_injection_keeps_the_clients_fields_and_sends_json(
    obj: dict[str, Any], seps: tuple[str, str], ascii_only: bool, inject: bool, continuous: bool, null: bool,
    leading_space: bool,
) -> None:
    text = json.dumps(obj, separators=seps, ensure_ascii=ascii_only, allow_nan=True)
    body = (b"  " if leading_space else b"") + text.encode("utf-8", "surrogatepass")
    try:
        parsed, strict = decode_json_strictness(body)
    except Exception:
        return  # not JSON the gateway accepts (it answers 400 before any injection)
    inj = plan_injection(parsed, body, inject_usage=inject, continuous=continuous, null_usage=null, strict=strict)
    if inj.body is body:
        return  # sent as the client wrote it
    sent, _ = decode_json_strictness(inj.body)
    assert isinstance(sent, dict)
    assert [k for k in sent if k != "stream_options"] == [k for k in parsed if k != "stream_options"]
    for key, value in parsed.items():
        if key != "stream_options":
            assert canon(sent[key]) == canon(value), key
    so_in = parsed.get("stream_options") or {}
    so_out = sent["stream_options"]
    assert isinstance(so_out, dict) and so_out.get("include_usage") is True
    for key, value in so_in.items():
        if key in ("include_usage", "continuous_usage_stats") and _lax_bool(value):
            assert _lax_bool(so_out[key]) is True  # asked for already: still asked for
        elif key not in ("include_usage", "continuous_usage_stats"):
            assert canon(so_out[key]) == canon(value), key
    added = set(so_out) - set(so_in)
    assert added <= {"include_usage", "continuous_usage_stats"}  # (NaN stays NaN: canon writes it so)


@given(st.binary(max_size=200))
def test_bodies_that_are_not_json_are_refused_before_any_injection(body: bytes) -> None:
    try:
        parsed, strict = decode_json_strictness(body)
    except Exception as exc:
        assert type(exc).__name__ == "DecodeError"  # what the gateway turns into its 400 invalid_json
        return
    if isinstance(parsed, dict):
        plan_injection(parsed, body, inject_usage=True, continuous=True, strict=strict)  # never raises
