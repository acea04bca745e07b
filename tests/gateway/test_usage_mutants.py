"""Usage injection behaviours that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servelens.core.openai import decode_json_strictness
from servelens.gateway.usage import (
    STRIP_ALL,
    STRIP_CONTINUOUS,
    STRIP_CONTINUOUS_NULL,
    STRIP_NONE,
    Injection,
    plan_injection,
    plan_learned,
    stream_asked,
)


def test_a_re_encoded_strict_body_keeps_utf8_and_compact_separators() -> None:
    # "stream_options": {} is there, so the whole body is re-encoded (msgspec: UTF-8, no spaces)
    obj = {"model": "m", "stream": True, "stream_options": {}, "messages": [{"role": "user", "content": "é"}]}
    body = json.dumps(obj).encode()
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)  # strict is the default
    assert inj.strip == STRIP_ALL
    assert inj.body == ('{"model":"m","stream":true,"stream_options":{"include_usage":true},'
                        '"messages":[{"role":"user","content":"é"}]}').encode()


def test_a_body_only_pythons_json_reads_is_re_encoded_by_json_keeping_nan() -> None:
    body = b'{"model": "m", "stream": true, "stream_options": {}, "temperature": NaN}'
    obj, strict = decode_json_strictness(body)
    assert strict is False
    inj = plan_injection(obj, body, inject_usage=True, continuous=False, strict=strict)
    assert inj.strip == STRIP_ALL
    assert inj.body == b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":NaN}'


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_a_body_with_a_bom_or_in_utf16_or_32_is_not_edited(encoding: str) -> None:
    body = json.dumps({"model": "m", "stream": True}).encode(encoding)
    obj, strict = decode_json_strictness(body)
    assert strict is False
    inj = plan_injection(obj, body, inject_usage=True, continuous=True, strict=strict)
    assert inj.body is body and inj.strip == STRIP_NONE and not inj.include_usage


def test_untouched_bodies_still_say_what_the_client_asked() -> None:
    so = {"include_usage": True, "continuous_usage_stats": True}
    obj = {"model": "m", "stream": True, "stream_options": so}
    body = json.dumps(obj).encode()
    for inject in (False, True):  # injection off, or nothing left to add
        inj = plan_injection(obj, body, inject_usage=inject, continuous=True)
        assert inj.body is body and inj.strip == STRIP_NONE
        assert inj.client_usage is True and inj.client_continuous is True
    bom = body.decode().encode("utf-8-sig")
    inj = plan_injection(obj, bom, inject_usage=True, continuous=True, strict=False)
    assert inj.body is bom and inj.client_usage is True and inj.client_continuous is True


def test_stream_options_go_in_right_after_the_opening_brace_leaving_the_clients_bytes() -> None:
    body = b'{"model": "m", "stream": true}'
    obj = json.loads(body)
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)
    assert inj.body == b'{"stream_options":{"include_usage":true},"model": "m", "stream": true}'
    inj = plan_injection(obj, b" " + body, inject_usage=True, continuous=True)
    assert inj.body == b' {"stream_options":{"include_usage":true,"continuous_usage_stats":true},' \
        b'"model": "m", "stream": true}'


def test_an_injected_request_says_the_client_asked_no_continuous_stats() -> None:
    obj = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    inj = plan_injection(obj, json.dumps(obj).encode(), inject_usage=True, continuous=True)
    assert inj.continuous is True and inj.client_usage is True and inj.client_continuous is False


PLAIN = {"model": "m", "stream": True}
PLAIN_BODY = b'{"model":"m","stream":true}'
BOTH_ADDED = b'{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m","stream":true}'
USAGE_ADDED = b'{"stream_options":{"include_usage":true},"model":"m","stream":true}'


def _learned(obj: dict[str, Any], body: bytes, *, inject_usage: bool = True, continuous_usage: str = "auto",
             stream_options_ok: bool = True, continuous_ok: bool = True, usage_null: bool | None = False,
             strict: bool = True) -> tuple[Injection, bool]:
    return plan_learned(obj, body, inject_usage=inject_usage, continuous_usage=continuous_usage,
                        stream_options_ok=stream_options_ok, continuous_ok=continuous_ok, usage_null=usage_null,
                        strict=strict)


@pytest.mark.parametrize(("continuous_usage", "continuous_ok", "body"), [
    ("on", False, BOTH_ADDED),  # on: whatever was learned
    ("auto", True, BOTH_ADDED),  # auto: as learned of the upstream
    ("auto", False, USAGE_ADDED),
    ("off", True, USAGE_ADDED),
])
def test_plan_learned_adds_continuous_usage_as_configured_and_learned(
    continuous_usage: str, continuous_ok: bool, body: bytes
) -> None:
    inj, learn = _learned(PLAIN, PLAIN_BODY, continuous_usage=continuous_usage, continuous_ok=continuous_ok)
    assert inj == Injection(body, STRIP_ALL, include_usage=True, continuous=body == BOTH_ADDED)
    assert learn is False


@pytest.mark.parametrize(("inject_usage", "stream_options_ok"), [(False, True), (True, False), (False, False)])
def test_plan_learned_adds_nothing_unless_configured_and_the_upstream_takes_stream_options(
    inject_usage: bool, stream_options_ok: bool
) -> None:
    inj, learn = _learned(PLAIN, PLAIN_BODY, inject_usage=inject_usage, stream_options_ok=stream_options_ok,
                          continuous_usage="on")
    assert inj == Injection(PLAIN_BODY) and learn is False


def test_plan_learned_learns_the_no_usage_marker_from_a_client_asking_include_usage_only() -> None:
    obj = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
    body = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    both = b'{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}'
    # not known yet: sent as the client wrote it, without continuous_usage_stats, and this request teaches it
    assert _learned(obj, body, continuous_usage="on", usage_null=None) == (
        Injection(body, STRIP_NONE, client_usage=True), True)
    # known: continuous_usage_stats added, its usage cut out or nulled on the chunks with choices
    assert _learned(obj, body, continuous_usage="on", usage_null=True) == (
        Injection(both, STRIP_CONTINUOUS_NULL, continuous=True, client_usage=True), False)
    assert _learned(obj, body, continuous_usage="on", usage_null=False) == (
        Injection(both, STRIP_CONTINUOUS, continuous=True, client_usage=True), False)
    # nothing to learn when the client asked for no usage (all of it is cut) or continuous is off
    assert _learned(PLAIN, PLAIN_BODY, continuous_usage="on", usage_null=None) == (
        Injection(BOTH_ADDED, STRIP_ALL, include_usage=True, continuous=True), False)
    assert _learned(obj, body, continuous_usage="off", usage_null=None) == (
        Injection(body, STRIP_NONE, client_usage=True), False)


def test_plan_learned_re_encodes_a_strict_body_by_default_in_utf8() -> None:
    obj = {"model": "m", "stream": True, "stream_options": {}, "messages": [{"role": "user", "content": "é"}]}
    body = json.dumps(obj).encode()
    inj, learn = plan_learned(obj, body, inject_usage=True, continuous_usage="off", stream_options_ok=True,
                              continuous_ok=True, usage_null=False)  # strict is the default
    assert inj.body == ('{"model":"m","stream":true,"stream_options":{"include_usage":true},'
                        '"messages":[{"role":"user","content":"é"}]}').encode()
    assert learn is False
    inj, _ = _learned(obj, body, continuous_usage="off", strict=True)
    assert inj.body == ('{"model":"m","stream":true,"stream_options":{"include_usage":true},'
                        '"messages":[{"role":"user","content":"é"}]}').encode()


def test_plan_learned_passes_on_a_lenient_body() -> None:
    body = b'{"model": "m", "stream": true, "stream_options": {}, "temperature": NaN}'
    obj, strict = decode_json_strictness(body)
    inj, learn = _learned(obj, body, continuous_usage="off", strict=strict)
    assert inj.body == b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"temperature":NaN}'
    assert learn is False



@pytest.mark.parametrize(("obj", "want"), [
    ({"stream": True}, True), ({"stream": "true"}, True), ({"stream": 1}, True), ({"stream": "YES"}, True),
    ({"stream": False}, False), ({"stream": 0}, False), ({"stream": None}, False), ({}, False),
    ({"STREAM": True}, False), ({"XXstreamXX": True}, False),
    ({"stream": "maybe"}, None), ({"stream": 2}, None), ({"stream": [True]}, None),
])
def test_stream_asked_reads_the_stream_field_as_pydantic_does(obj: dict[str, Any], want: bool | None) -> None:
    assert stream_asked(obj) is want
