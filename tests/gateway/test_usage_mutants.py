"""Usage injection behaviours that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md)."""

from __future__ import annotations

import json

import pytest

from servelens.core.openai import decode_json_strictness
from servelens.gateway.usage import STRIP_ALL, STRIP_NONE, plan_injection


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
