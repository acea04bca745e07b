"""servelens.gateway.rejection, cases its mutants showed untested (issue 21): each body hand-written, each
reading worked out from the module docstring's rules."""

from __future__ import annotations

import json

import pytest

from servelens.gateway.rejection import Rejection, read_rejection
from servelens.gateway.usage import Injection

BOTH = Injection(b"{}", 1, include_usage=True, continuous=True)
USAGE_ONLY = Injection(b"{}", 1, include_usage=True)


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


@pytest.mark.parametrize(("inj", "text", "want"), [
    # a loc naming include_usage alone blames stream_options (what carries it)
    (BOTH, _json({"detail": [{"loc": ["body", "include_usage"], "msg": "m"}]}), Rejection("stream_options", True)),
    (BOTH, _json({"error": {"message": "bad", "param": "include_usage"}}), Rejection("stream_options", True)),
    # a word is split on what is not a letter, digit or underscore: capitals are part of the word
    (BOTH, _json({"error": {"message": "unknown field Astream_optionsB"}}), Rejection(None, False)),
    (BOTH, _json({"error": {"message": "unknown field Xcontinuous_usage_statsY"}}), Rejection(None, True)),
    # a detail list whose items are not objects: no loc, the whole text is the message
    (BOTH, _json({"detail": ["stream_options"]}), Rejection("stream_options", False)),
    # param alone blames, whatever the message says
    (BOTH, _json({"error": {"message": "bad request", "param": "stream_options"}}), Rejection("stream_options", False)),
    (BOTH, _json({"error": {"message": "bad request", "param": "stream_options.continuous_usage_stats"}}),
     Rejection("continuous_usage_stats", True)),
    # an empty param is no path: the message decides
    (BOTH, _json({"error": {"message": "unknown field stream_options", "param": ""}}),
     Rejection("stream_options", False)),
    # the error as a string, and a top-level message
    (BOTH, _json({"error": "unknown field stream_options"}), Rejection("stream_options", False)),
    (BOTH, _json({"message": "unknown field stream_options"}), Rejection("stream_options", False)),
    # not UTF-8 and not JSON: the text read with replacement characters
    (BOTH, b"\xff\xfe stream_options is not supported", Rejection("stream_options", False)),
    # include_usage added and echoed (continuous_usage_stats not added): shows what was added
    (USAGE_ONLY, _json({"detail": [{"loc": ["body", "messages"],
                                    "input": {"stream_options": {"include_usage": True}}}]}), Rejection(None, True)),
    (USAGE_ONLY, b"include_usage", Rejection("stream_options", True)),
])
def test_read_rejection_more_shapes(inj: Injection, text: bytes, want: Rejection) -> None:
    assert read_rejection(inj, text) == want
