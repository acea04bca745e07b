"""servelens.asgi.MetricsMiddleware without vLLM: a tiny OpenAI-shaped ASGI app (servelens.asgi.testing),
called directly. Definitions and counts, never speed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from servelens.asgi import MEASURED_KEY, MetricsMiddleware, has_measured_route
from servelens.asgi.testing import Route, TinyApp, call, lifespan

BUCKETS = "512,1024"
CHAT = "/v1/chat/completions"


def _mw(tiny: TinyApp, reg: CollectorRegistry, **kw: object) -> MetricsMiddleware:
    return MetricsMiddleware(tiny, registry=reg, isl_buckets=BUCKETS, environ={}, **kw)  # type: ignore[arg-type]


def _v(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value("servelens_" + name, labels) or 0.0


def _requests(reg: CollectorRegistry) -> float:
    return sum(s.value for m in reg.collect() for s in m.samples if s.name == "servelens_requests_total")


def _stream(isl: int = 700, osl: int = 5, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [], "stream": True, "max_tokens": osl, "prompt_tokens": isl, **extra}


async def test_families_at_zero_on_start() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")
    assert [m["type"] for m in await lifespan(mw, {"app": tiny})] == ["lifespan.startup.complete",
                                                                      "lifespan.shutdown.complete"]
    for bucket in ("0-512", "513-1024", "1025+"):
        assert reg.get_sample_value("servelens_time_to_first_token_by_isl_seconds_count",
                                    {"model": "tiny", "isl_bucket": bucket}) == 0.0


@pytest.mark.parametrize("so", [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}])
async def test_stream_bytes_unchanged_and_measured(so: dict[str, bool] | None) -> None:
    """Usage is injected (the app sees it), cut from what the client gets: the client's bytes equal the
    app's answer to the client's own request; TTFT, ITL per token, OSL and ISL's bucket from usage."""
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")
    body = _stream(stream_options=so) if so else _stream()
    got = await call(mw, CHAT, body, scope_extra={"app": tiny})
    sent = json.loads(tiny.bodies[-1])
    assert sent["stream_options"]["include_usage"] is True
    direct = await call(TinyApp(), CHAT, body)
    assert got.status == 200 and got.body == direct.body
    labels = {"model": "tiny", "isl_bucket": "513-1024"}
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", **labels) == 1
    assert _v(reg, "inter_token_latency_by_isl_seconds_count", **labels) == 4  # 5 tokens: 4 gaps
    assert _v(reg, "output_sequence_tokens_by_isl_sum", **labels) == 5
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 1
    assert _requests(reg) == 1


async def test_unary_and_completions() -> None:
    reg, tiny = CollectorRegistry(), TinyApp(cached_tokens=64)
    mw = _mw(tiny, reg, model="tiny")
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "prompt_tokens": 2000}
    got = await call(mw, "/v1/completions", body, scope_extra={"app": tiny})
    assert got.body == (await call(TinyApp(cached_tokens=64), "/v1/completions", body)).body
    assert tiny.bodies[-1] == json.dumps(body).encode()  # nothing added to a unary request
    labels = {"model": "tiny", "isl_bucket": "1025+"}
    assert _v(reg, "output_sequence_tokens_by_isl_sum", **labels) == 3
    assert _v(reg, "cached_tokens_by_isl_sum", **labels) == 64
    assert _v(reg, "requests_total", model="tiny", endpoint="completions", request_type="unary",
              status="success", error_type="") == 1


async def test_model_registered_on_first_success_and_unknown_counted_once() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg)
    await lifespan(mw, {"app": tiny})
    assert reg.get_sample_value("servelens_time_to_first_token_by_isl_seconds_count",
                                {"model": "tiny", "isl_bucket": "0-512"}) is None
    bad = await call(mw, CHAT, _stream(model="nope"), scope_extra={"app": tiny})
    assert bad.status == 404
    await call(mw, CHAT, _stream(isl=100), scope_extra={"app": tiny})
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", model="tiny", isl_bucket="0-512") == 1
    assert _v(reg, "requests_total", model="unknown_model", endpoint="chat_completions", request_type="stream",
              status="error", error_type="not_found") == 1
    assert _requests(reg) == 2


async def test_invalid_body_answered_by_the_app_counted_once() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")

    async def strict(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        await receive()
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "bad json"}}'})

    mw.app = strict  # type: ignore[assignment]
    got = await call(mw, CHAT, b"{not json", scope_extra={"app": tiny})
    assert got.status == 400
    assert _v(reg, "requests_total", model="unknown_model", endpoint="chat_completions", request_type="unary",
              status="error", error_type="validation") == 1
    assert _requests(reg) == 1


async def test_app_rejecting_stream_options_gets_the_clients_body() -> None:
    """A strict app refusing the added field: the request is sent once more as the client sent it,
    the client gets the app's 200, counted once, and the field is not sent again."""
    reg, tiny = CollectorRegistry(), TinyApp(reject="stream_options")
    mw = _mw(tiny, reg, model="tiny")
    body = _stream()
    got = await call(mw, CHAT, body, scope_extra={"app": tiny})
    assert got.status == 200 and got.body == (await call(TinyApp(), CHAT, body)).body
    assert [b"stream_options" in b for b in tiny.bodies] == [True, False]
    await call(mw, CHAT, body, scope_extra={"app": tiny})
    assert b"stream_options" not in tiny.bodies[-1]
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="success", error_type="") == 2
    # no usage: the bucket is unknown, the request still counted once
    assert _v(reg, "isl_bucket_assignments_total", model="tiny", source="unknown") == 2


async def test_client_disconnect_counted_cancelled_once() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")
    await call(mw, CHAT, _stream(osl=10), disconnect_after=3, scope_extra={"app": tiny})
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="error", error_type="cancelled") == 1
    assert _requests(reg) == 1


async def test_added_twice_counts_once() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    inner = _mw(tiny, reg, model="tiny")
    outer = _mw(inner, reg, model="tiny")  # type: ignore[arg-type]
    scope: dict[str, object] = {"app": tiny}
    await call(outer, CHAT, _stream(), scope_extra=scope)
    assert _requests(reg) == 1
    assert _v(reg, "time_to_first_token_by_isl_seconds_count", model="tiny", isl_bucket="513-1024") == 1
    assert MEASURED_KEY not in scope  # the key is set in the request's own scope


async def test_other_paths_pass_through() -> None:
    reg, tiny = CollectorRegistry(), TinyApp(paths=(CHAT, "/v1/models"))
    mw = _mw(tiny, reg, model="tiny")
    got = await call(mw, "/v1/models", b"{}", scope_extra={"app": tiny})
    assert got.status == 404 or got.status == 200
    assert _requests(reg) == 0


async def test_no_chat_route_one_line_nothing_counted(caplog: pytest.LogCaptureFixture) -> None:
    reg, tiny = CollectorRegistry(), TinyApp(paths=("/v1/embeddings",))
    assert not has_measured_route(tiny)
    mw = _mw(tiny, reg, model="tiny")
    with caplog.at_level(logging.INFO, logger="servelens.asgi"):
        await lifespan(mw, {"app": tiny})
        for _ in range(3):
            assert (await call(mw, CHAT, _stream(), scope_extra={"app": tiny})).status == 404
    lines = [r for r in caplog.records if r.name == "servelens.asgi"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "no route /v1/chat/completions or /v1/completions" in lines[0].getMessage()
    assert _requests(reg) == 0
    assert b"stream_options" not in tiny.bodies[-1]  # passed through as it came


def test_routes_that_cannot_be_told_are_measured() -> None:
    class Mounted:
        path = "/v1"
        routes: list[Route] = []  # noqa: RUF012

    class App:
        routes = (Route("/health"), Mounted())

    assert has_measured_route(App())
    assert has_measured_route(object())  # a pure ASGI callable: no routes to read


async def test_bad_setting_fails_startup_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    tiny = TinyApp()
    mw = MetricsMiddleware(tiny, registry=CollectorRegistry(), environ={"SERVELENS_ISL_BUCKETS": "512,abc"})
    assert mw.error is not None and "SERVELENS_ISL_BUCKETS='512,abc'" in mw.error and "\n" not in mw.error
    sent = await lifespan(mw, {"app": tiny})
    assert sent == [{"type": "lifespan.startup.failed", "message": mw.error}]
    # a server without lifespan: the line once in the log, the app served unmeasured
    mw2 = MetricsMiddleware(tiny, registry=CollectorRegistry(), environ={"SERVELENS_CONTINUOUS_USAGE": "maybe"})
    with caplog.at_level(logging.INFO, logger="servelens.asgi"):
        for _ in range(2):
            assert (await call(mw2, CHAT, _stream(), scope_extra={"app": tiny})).status == 200
    assert [r.levelno for r in caplog.records if r.name == "servelens.asgi"] == [logging.ERROR]


async def test_same_registry_shared_and_conflict_refused() -> None:
    reg = CollectorRegistry()
    a = _mw(TinyApp(), reg, model="tiny")
    b = _mw(TinyApp(), reg, model="other")
    assert a.metrics is b.metrics and a.error is None and b.error is None
    c = MetricsMiddleware(TinyApp(), registry=reg, isl_buckets="100", environ={})
    assert c.error is not None and "another MetricsMiddleware" in c.error


def test_env_settings() -> None:
    env = {"SERVELENS_MODEL": "a, b", "SERVELENS_ISL_BUCKETS": "off", "SERVELENS_METRICS_PREFIX": "inproc",
           "SERVELENS_INJECT_USAGE": "0", "SERVELENS_CONTINUOUS_USAGE": "off"}
    mw = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ=env)
    s = mw.settings
    assert (s.models, s.isl_buckets, s.prefix, s.inject_usage, s.continuous_usage) == (("a", "b"), None, "inproc",
                                                                                       False, "off")


async def test_multiprocess_mode_one_line_nothing_measured(caplog: pytest.LogCaptureFixture) -> None:
    """vLLM with several API servers sets PROMETHEUS_MULTIPROC_DIR; its /metrics then serves only the
    multiprocess files, never this process's families: said once, nothing measured or added."""
    tiny = TinyApp()
    mw = MetricsMiddleware(tiny, environ={"PROMETHEUS_MULTIPROC_DIR": "/tmp/x"}, model="tiny-mp")  # default REGISTRY
    with caplog.at_level(logging.INFO, logger="servelens.asgi"):
        await lifespan(mw, {"app": tiny})
        assert (await call(mw, CHAT, _stream(model="tiny"), scope_extra={"app": tiny})).status == 200
    lines = [r for r in caplog.records if r.name == "servelens.asgi"]
    assert len(lines) == 1 and "PROMETHEUS_MULTIPROC_DIR" in lines[0].getMessage()
    assert b"stream_options" not in tiny.bodies[-1]
    assert mw.metrics is None  # nothing registered in a registry nobody serves


async def test_app_raising_counted_once_as_internal() -> None:
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")

    async def broken(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        await receive()
        raise RuntimeError("a bug in the app")

    mw.app = broken  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        await call(mw, CHAT, _stream(), scope_extra={"app": tiny})
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="error", error_type="internal") == 1
    assert _requests(reg) == 1


async def test_send_failing_under_an_app_that_rewraps_it_is_cancelled() -> None:
    """Starlette turns the server's send error (the client left) into its own ClientDisconnect: still
    counted as cancelled, once."""
    reg, tiny = CollectorRegistry(), TinyApp()
    mw = _mw(tiny, reg, model="tiny")

    class ClientDisconnect(Exception):
        pass

    async def rewrapping(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        async def wrapped(m: MutableMapping[str, Any]) -> None:
            try:
                await send(m)
            except OSError:
                raise ClientDisconnect from None

        await tiny(scope, receive, wrapped)

    mw.app = rewrapping  # type: ignore[assignment]
    with pytest.raises(ClientDisconnect):
        await call(mw, CHAT, _stream(osl=10), disconnect_after=3, scope_extra={"app": tiny})
    assert _v(reg, "requests_total", model="tiny", endpoint="chat_completions", request_type="stream",
              status="error", error_type="cancelled") == 1
    assert _requests(reg) == 1


README = Path(__file__).resolve().parents[2] / "README.md"

_README_RUN = '''
import asyncio, sys
from servelens.asgi.testing import call, lifespan

exec(compile(sys.argv[1], "README.md", "exec"))
app.add_api_route("/v1/chat/completions", lambda: {}, methods=["POST"])  # "your routes" (not called here)


async def main() -> None:
    started = [m["type"] for m in await lifespan(app)]
    got = await call(app, "/metrics", b"", method="GET")
    print(started, got.status, dict(got.headers).get(b"content-type", b"").decode())
    print(got.body.decode())

asyncio.run(main())
'''


def test_readme_fastapi_example_serves_metrics_at_metrics() -> None:
    """The README's "Another ASGI server" snippet, as written plus a chat route where its comment says
    "your routes", in a fresh interpreter (it uses prometheus_client's default registry): ``GET /metrics``
    answers 200 with the by-ISL families at zero, what ``curl .../metrics | grep time_to_first_token_by_isl``
    reads. Its first version mounted ``make_asgi_app()`` at ``/metrics``, which Starlette answers with a 307
    to ``/metrics/``: curl printed nothing."""
    text = README.read_text()
    start = text.index("```python\n", text.index("**Another ASGI server.**")) + len("```python\n")
    snippet = text[start:text.index("```", start)]
    proc = subprocess.run([sys.executable, "-c", _README_RUN, snippet], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    head, _, body = proc.stdout.partition("\n")
    assert head.startswith("['lifespan.startup.complete', 'lifespan.shutdown.complete'] 200 text/plain; version=")
    family = "servelens_time_to_first_token_by_isl_seconds_count"
    assert [line for line in body.splitlines() if line.startswith(family)] == [
        f'{family}{{isl_bucket="{b}",model="my-model"}} 0.0' for b in ("0-1024", "1025-4096", "4097-8192", "8193+")]
