import json

import msgspec
import pytest

from servelens.gateway.usage import (
    STRIP_ALL,
    STRIP_CONTINUOUS,
    STRIP_CONTINUOUS_NULL,
    STRIP_NONE,
    choices_empty,
    is_usage_only,
    null_usage,
    plan_injection,
    remove_usage,
)

U = '{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}'


@pytest.mark.parametrize(
    ("with_usage", "without"),
    [
        # vLLM / sim: usage last, compact
        ('data: {"id":"x","choices":[{"delta":{"content":"a"}}],"usage":' + U + "}\n\n",
         'data: {"id":"x","choices":[{"delta":{"content":"a"}}]}\n\n'),
        # compact, CRLF, nested details (the fast path) and null
        ('data: {"id":"x","choices":[],"usage":' + U + "}\r\n\r\n", 'data: {"id":"x","choices":[]}\r\n\r\n'),
        ('data: {"id":"x","choices":[{"text":"a"}],"usage":null}\n\n', 'data: {"id":"x","choices":[{"text":"a"}]}\n\n'),
        # usage first
        ('data: {"usage":' + U + ',"id":"x","choices":[]}\n\n', 'data: {"id":"x","choices":[]}\n\n'),
        # spaced JSON (Python json.dumps default)
        ('data: {"id": "x", "usage": {"prompt_tokens": 5}, "choices": []}\r\n\r\n',
         'data: {"id": "x", "choices": []}\r\n\r\n'),
        # null usage (OpenAI style)
        ('data: {"id":"x","choices":[],"usage":null}\n\n', 'data: {"id":"x","choices":[]}\n\n'),
        # the only member
        ('data: {"usage":null}\n\n', "data: {}\n\n"),
        # "usage" as a string value and inside content must not confuse the cut
        ('data: {"choices":[{"delta":{"content":"usage \\"usage\\": {}"}}],"v":"usage","usage":' + U + "}\n\n",
         'data: {"choices":[{"delta":{"content":"usage \\"usage\\": {}"}}],"v":"usage"}\n\n'),
        # a nested "usage" key (two matches: the top-level scanner decides)
        ('data: {"choices":[{"usage":{"a":1},"delta":{}}],"usage":{"b":"}{"},"z":1}\n\n',
         'data: {"choices":[{"usage":{"a":1},"delta":{}}],"z":1}\n\n'),
    ],
)
def test_remove_usage_exact_bytes(with_usage: str, without: str) -> None:
    assert remove_usage(with_usage.encode()) == without.encode()


def test_remove_usage_leaves_other_bytes_alone() -> None:
    raw = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    assert remove_usage(raw) is raw
    assert remove_usage(b"data: [DONE]\n\n") == b"data: [DONE]\n\n"


def test_null_usage_replaces_value_only() -> None:
    raw = ('data: {"id":"x","choices":[{"delta":{"content":"a"}}],"usage":' + U + "}\n\n").encode()
    assert null_usage(raw) == b'data: {"id":"x","choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'


def test_is_usage_only() -> None:
    assert is_usage_only({"choices": [], "usage": {"prompt_tokens": 1}})
    assert not is_usage_only({"choices": [], "usage": None})
    assert not is_usage_only({"choices": [{"delta": {}}], "usage": {"prompt_tokens": 1}})


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ('{"id":"x","choices":[],"usage":' + U + "}", True),
        ('{"id":"x","choices": [ ] ,"usage":' + U + "}", True),
        ('{"id":"x","choices":null,"usage":' + U + "}", True),
        ('{"id":"x","usage":' + U + "}", True),  # absent
        ('{"id":"x","choices":[{"delta":{"content":"a"}}],"usage":' + U + "}", False),
        ('{"id":"x","choices":[{"delta":{"content":"\\"choices\\":[]"}}]}', False),  # in a string: escaped
        ('{"meta":{"choices":[]},"choices":[{"text":"a"}]}', None),  # a nested key first: not told
        ('{"id":"{x","choices":[]}', None),  # a brace in a string before it: not told, so decoded
        ('{"id":"x","choices":{}}', None),
    ],
)
def test_choices_empty_on_the_bytes(data: str, expected: bool | None) -> None:
    raw = f"data: {data}\n\n".encode()
    assert choices_empty(raw) is expected
    if expected is not None:  # when it answers, it answers as is_usage_only reads the object
        obj = json.loads(data)
        assert expected == (not obj.get("choices"))


def _body(**extra: object) -> tuple[dict, bytes]:
    obj = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], **extra}
    return obj, json.dumps(obj).encode()


def test_plan_injection_client_asked_nothing() -> None:
    obj, body = _body()
    inj = plan_injection(obj, body, inject_usage=True, continuous=True)
    assert inj.strip == STRIP_ALL and inj.include_usage and inj.continuous
    sent = msgspec.json.decode(inj.body)
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert {k: v for k, v in sent.items() if k != "stream_options"} == obj
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)
    assert msgspec.json.decode(inj.body)["stream_options"] == {"include_usage": True}
    assert inj.strip == STRIP_ALL


def test_plan_injection_client_asked_usage_only() -> None:
    obj, body = _body(stream_options={"include_usage": True})
    inj = plan_injection(obj, body, inject_usage=True, continuous=True)
    assert inj.strip == STRIP_CONTINUOUS and inj.continuous and not inj.include_usage and inj.client_usage
    assert plan_injection(obj, body, inject_usage=True, continuous=True, null_usage=True).strip == \
        STRIP_CONTINUOUS_NULL
    # nothing to add without continuous: the client's bytes go out unchanged
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)
    assert inj.body is body and inj.strip == STRIP_NONE


@pytest.mark.parametrize("value", [1, 1.0, "true", "True", "YES", "on", "1", "t", "y"])
def test_plan_injection_reads_include_usage_as_the_engines_do(value: object) -> None:
    # vLLM and SGLang read stream_options with pydantic's lax bool: 1 and "true" ask for usage. The
    # gateway read only `true`, so it rewrote the client's value and cut the usage it had asked for
    obj, body = _body(stream_options={"include_usage": value})
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)
    assert inj.body is body and inj.strip == STRIP_NONE and inj.client_usage
    inj = plan_injection(obj, body, inject_usage=True, continuous=True)
    assert inj.strip == STRIP_CONTINUOUS and not inj.include_usage and inj.continuous
    obj, body = _body(stream_options={"include_usage": True, "continuous_usage_stats": value})
    assert plan_injection(obj, body, inject_usage=True, continuous=True).body is body


@pytest.mark.parametrize("value", [0, 0.0, "false", "off", "no", "0", None])
def test_plan_injection_lax_false_is_not_asking(value: object) -> None:
    obj, body = _body(stream_options={"include_usage": value})
    inj = plan_injection(obj, body, inject_usage=True, continuous=False)
    assert inj.strip == STRIP_ALL and msgspec.json.decode(inj.body)["stream_options"]["include_usage"] is True


@pytest.mark.parametrize("so", [{"include_usage": 2}, {"include_usage": "maybe"}, {"include_usage": [True]},
                                {"include_usage": 1.5}, {"include_usage": " true"}, {"include_usage": "true "},
                                {"include_usage": True, "continuous_usage_stats": "x"}])
def test_plan_injection_leaves_values_an_engine_rejects_untouched(so: dict) -> None:
    obj, body = _body(stream_options=so)
    inj = plan_injection(obj, body, inject_usage=True, continuous=True)
    assert inj.body is body and inj.strip == STRIP_NONE  # the upstream answers it as it would without us


def test_plan_injection_untouched_cases() -> None:
    obj, body = _body(stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert plan_injection(obj, body, inject_usage=True, continuous=True).body is body
    obj, body = _body(stream_options="bad")
    assert plan_injection(obj, body, inject_usage=True, continuous=True).body is body
    obj, body = _body()
    inj = plan_injection(obj, body, inject_usage=False, continuous=True)
    assert inj.body is body and inj.strip == STRIP_NONE
