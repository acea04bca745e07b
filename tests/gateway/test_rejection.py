"""servelens.gateway.rejection: which added field a 400/422 blames, in the shapes servers write (exact
values, hand-written bodies)."""

from __future__ import annotations

import json

import pytest

from servelens.gateway.rejection import RESEND_CLIENTS_BODY, RESEND_WITHOUT_CONTINUOUS, Rejection, read_rejection
from servelens.gateway.usage import Injection

BOTH = Injection(b"{}", 1, include_usage=True, continuous=True)
CONT_ONLY = Injection(b"{}", 2, include_usage=False, continuous=True, client_usage=True)
ECHO = {"model": "m", "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
PY_ECHO = "{'model': 'm', 'stream': True, 'stream_options': {'include_usage': True, 'continuous_usage_stats': True}}"


def fastapi(*locs: list[str]) -> bytes:
    return json.dumps({"detail": [{"type": "t", "loc": loc, "msg": "m", "input": ECHO} for loc in locs]}).encode()


def vllm(loc: str, param: str | None) -> bytes:
    message = f"1 validation error:\n  {{'type': 'missing', 'loc': {loc}, 'msg': 'Field required', 'input': {PY_ECHO}}}"
    return json.dumps({"error": {"message": message, "type": "Bad Request", "param": param, "code": 400}}).encode()


@pytest.mark.parametrize(("inj", "text", "want"), [
    # FastAPI's 422: the loc decides, the echoed input does not
    (BOTH, fastapi(["body", "messages"]), Rejection(None, True)),
    (BOTH, fastapi(["body", "stream_options", "continuous_usage_stats"]), Rejection("continuous_usage_stats", True)),
    (BOTH, fastapi(["body", "stream_options"]), Rejection("stream_options", True)),
    (BOTH, fastapi(["body", "messages"], ["body", "stream_options", "include_usage"]),
     Rejection("stream_options", True)),
    # vLLM's 400: the loc tuples in the message and param (older vLLM: no param)
    (BOTH, vllm("('body', 'messages')", "body.messages"), Rejection(None, True)),
    (BOTH, vllm("('body', 'messages')", None), Rejection(None, True)),
    (BOTH, vllm("('body', 'stream_options', 'continuous_usage_stats')", None),
     Rejection("continuous_usage_stats", True)),
    (BOTH, vllm("('body',)", None), Rejection(None, True)),  # a model validator's error
    # OpenAI's: param
    (BOTH, json.dumps({"error": {"message": "Unknown parameter: 'stream_options.continuous_usage_stats'.",
                                 "param": "stream_options.continuous_usage_stats"}}).encode(),
     Rejection("continuous_usage_stats", True)),
    (BOTH, json.dumps({"error": {"message": "bad temperature", "param": "temperature"}}).encode(),
     Rejection(None, False)),
    # words only: the message names the field
    (BOTH, json.dumps({"error": {"message": "Unrecognized request argument supplied: continuous_usage_stats",
                                 "param": None}}).encode(), Rejection("continuous_usage_stats", True)),
    (BOTH, json.dumps({"error": {"message": "unknown field stream_options"}}).encode(),
     Rejection("stream_options", False)),
    (BOTH, b"stream_options is not supported", Rejection("stream_options", False)),
    (BOTH, json.dumps({"detail": "Not Found"}).encode(), Rejection(None, False)),
    (BOTH, b"", Rejection(None, False)),
    # what was added decides what the error can blame, and show
    (CONT_ONLY, fastapi(["body", "stream_options", "continuous_usage_stats"]),
     Rejection("continuous_usage_stats", True)),
    (CONT_ONLY, json.dumps({"detail": [{"loc": ["body", "messages"], "input": {"stream_options": {
        "include_usage": True}}}]}).encode(), Rejection(None, False)),  # the client's own include_usage
    (Injection(b"{}", 1, include_usage=True), json.dumps({"error": {"message": "continuous_usage_stats?"}}).encode(),
     Rejection(None, False)),  # not added: not blamed
])
def test_read_rejection(inj: Injection, text: bytes, want: Rejection) -> None:
    assert read_rejection(inj, text) == want


def test_what_is_resent() -> None:
    assert Rejection("continuous_usage_stats", True).resend == RESEND_WITHOUT_CONTINUOUS
    assert Rejection("stream_options", False).resend == RESEND_CLIENTS_BODY
    assert Rejection(None, True).resend == RESEND_CLIENTS_BODY  # an echo: the client gets its own answer
    assert Rejection(None, False).resend is None
