"""servelens.asgi.MetricsMiddleware on the edges an adversarial tester found: settings given empty, lax
``stream`` values, made-up model names, absurd usage. Called directly (servelens.asgi.testing); counts,
never speed."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import Message, Scope, TinyApp, call, lifespan

CHAT = "/v1/chat/completions"


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def tok(text: str, reason: str | None = None) -> bytes:
    return ev({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}]})


class ScriptedApp:
    """An ASGI app answering every request with the event stream ``events`` (one body message each);
    ``bodies``: the request bodies it read."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for e in self.events:
            await send({"type": "http.response.body", "body": e, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _v(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value("servelens_" + name, labels) or 0.0


def _requests(reg: CollectorRegistry) -> float:
    return sum(s.value for m in reg.collect() for s in m.samples if s.name == "servelens_requests_total")


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra}


@pytest.mark.parametrize("value", ["", "  "])
async def test_isl_buckets_variable_set_empty_fails_startup_in_one_line(value: str) -> None:
    """``SERVELENS_ISL_BUCKETS=''`` is an error, as ``--isl-buckets ''`` is (was: the defaults in silence)."""
    tiny = TinyApp()
    mw = MetricsMiddleware(tiny, registry=CollectorRegistry(), environ={"SERVELENS_ISL_BUCKETS": value})
    assert mw.error == (f"servelens.asgi.MetricsMiddleware: SERVELENS_ISL_BUCKETS={value!r} is empty: give "
                        "boundaries in tokens (e.g. 512,1024,2048) or 'off' to turn the by-ISL metrics off")
    assert await lifespan(mw, {"app": tiny}) == [{"type": "lifespan.startup.failed", "message": mw.error}]
    assert mw.metrics is None


def test_isl_buckets_variable_unset_or_off() -> None:
    unset = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ={})
    assert unset.error is None and unset.settings.isl_buckets == "512,1024,2048,4096,8192,16384"
    off = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ={"SERVELENS_ISL_BUCKETS": " off "})
    assert off.error is None and off.settings.isl_buckets is None


async def test_absurd_usage_is_unknown_osl_from_chunks() -> None:
    """completion_tokens 10**18 and prompt_tokens 10**15 are junk (above 2**31 - 1): OSL is the 3 counted
    chunks, output_tokens_total grows by 3, no ISL bucket."""
    final = ev({"choices": [], "usage": {"prompt_tokens": 10**15, "completion_tokens": 10**18,
                                         "total_tokens": 10**15 + 10**18}})
    app = ScriptedApp([tok("a"), tok("b"), tok("c", "stop"), final, b"data: [DONE]\n\n"])
    reg = CollectorRegistry()
    mw = MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ={}, model="tiny")
    got = await call(mw, CHAT, _body(stream_options={"include_usage": True}))
    assert got.status == 200 and got.body == b"".join(app.events)
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 1
    assert _v(reg, "output_sequence_tokens_sum", model="tiny") == 3
    assert _v(reg, "output_tokens_total", model="tiny") == 3
    assert _v(reg, "input_sequence_tokens_count", model="tiny") == 0
    assert _v(reg, "isl_bucket_assignments_total", model="tiny", source="unknown") == 1


@pytest.mark.parametrize(("last", "error_type"), [
    (b'data: {"choi', "truncated_stream"),  # was backend_error
    (b"data: [DONE]", ""),
    (b'data: {"error": {"message": "boom"}}', "backend_error"),
])
@pytest.mark.parametrize("so", [None, {"include_usage": True, "continuous_usage_stats": True}])
async def test_body_ending_inside_an_event_is_truncated(last: bytes, error_type: str,
                                                        so: dict[str, bool] | None) -> None:
    """The app's body ends (more_body false) inside an event: truncated_stream; a last event that parses
    is read. ``so``: None, usage added and cut (whole events held); the client's own: passed as it comes."""
    app = ScriptedApp([tok("a"), last])
    reg = CollectorRegistry()
    mw = MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ={}, model="tiny")
    got = await call(mw, CHAT, _body(stream_options=so) if so else _body())
    assert got.status == 200 and got.body == b"".join(app.events)
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="error" if error_type else "success", error_type=error_type) == 1
    assert _requests(reg) == 1


async def test_made_up_model_names_register_at_most_max_learned_models(caplog: pytest.LogCaptureFixture) -> None:
    """An app that ignores ``model`` answers 25 made-up names with a 200: 8 are registered (the default
    SERVELENS_MAX_LEARNED_MODELS), the other 17 counted under unknown_model, said once (was: 19 models
    registered and /metrics grown 18-fold; the series budget was the only bound)."""
    app = ScriptedApp([tok("a", "stop"), b"data: [DONE]\n\n"])
    reg = CollectorRegistry()
    mw = MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ={})
    with caplog.at_level("INFO", logger="servelens.asgi"):
        for i in range(25):
            got = await call(mw, CHAT, _body(model=f"made-up-{i:02d}"))
            assert got.status == 200
    assert mw.metrics is not None and sorted(mw.metrics.state.models) == [f"made-up-{i:02d}" for i in range(8)]
    assert _v(reg, "requests_total", model="unknown_model", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 17
    assert _requests(reg) == 25
    warned = [r for r in caplog.records if "SERVELENS_MAX_LEARNED_MODELS" in r.getMessage()]
    assert len(warned) == 1
    lines = [ln for ln in reg_text(reg).splitlines() if ln and not ln.startswith("#")]
    assert not any('model="made-up-08"' in ln for ln in lines)


def reg_text(reg: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(reg).decode()


@pytest.mark.parametrize(("setting", "learned"), [({"SERVELENS_MAX_LEARNED_MODELS": "0"}, 0),
                                                  ({"SERVELENS_MAX_LEARNED_MODELS": "2"}, 2)])
async def test_max_learned_models_setting(setting: dict[str, str], learned: int) -> None:
    app = ScriptedApp([tok("a", "stop"), b"data: [DONE]\n\n"])
    reg = CollectorRegistry()
    mw = MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ=setting, model="declared")
    await lifespan(mw, {"app": app})
    for name in ("x", "y", "z", "declared"):
        await call(mw, CHAT, _body(model=name), scope_extra={"app": app})
    assert mw.metrics is not None and sorted(mw.metrics.state.models) == sorted(["declared", *"xyz"[:learned]])
    assert _v(reg, "requests_total", model="unknown_model", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 3 - learned


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_bad_max_learned_models_is_one_line(value: str) -> None:
    mw = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ={"SERVELENS_MAX_LEARNED_MODELS": value})
    assert mw.error == (f"servelens.asgi.MetricsMiddleware: SERVELENS_MAX_LEARNED_MODELS={value!r}: "
                        "give a whole number >= 0")


@pytest.mark.parametrize(("declared", "counted_as"), [(["tiny"], "tiny"), ([], "unknown_model"),
                                                      (["tiny", "other"], "unknown_model")])
async def test_a_request_naming_no_model(declared: list[str], counted_as: str) -> None:
    """Counted under the app's model when exactly one is known at start (vLLM answers it with that one),
    else under unknown_model (as the module docstring says)."""
    app = ScriptedApp([tok("a", "stop"), b"data: [DONE]\n\n"])
    reg = CollectorRegistry()
    mw = MetricsMiddleware(app, registry=reg, isl_buckets="512,1024", environ={}, model=declared)
    await lifespan(mw, {"app": app})
    body = _body()
    del body["model"]
    assert (await call(mw, CHAT, body, scope_extra={"app": app})).status == 200
    assert _v(reg, "requests_total", model=counted_as, endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 1
    assert _requests(reg) == 1
