"""The ASGI middleware: what it measures, how it finds the models, how it fails.

``MetricsMiddleware(app)`` wraps any ASGI app serving OpenAI's API. ``POST /v1/chat/completions``
and ``POST /v1/completions`` are measured as the gateway measures them (the same definitions,
:mod:`servelens.gateway.meter` and :mod:`servelens.gateway.usage`); every other request, websocket
and lifespan event passes through untouched.

Per measured request: the body is read whole (the app reads it whole too), usage is added to a
stream's ``stream_options`` as the gateway adds it (:func:`~servelens.gateway.usage.plan_learned`),
the app is called with that body, and its answer goes out through :class:`~.exchange.Exchange`. A
400/422 to such a request is held back and read as the gateway reads it
(:mod:`servelens.gateway.rejection`): the app is called again (with the body it was given, replayed)
without the field the error blames, or with the client's own body when the error only shows what was
added (FastAPI's 422 and vLLM's 400 echo the request), and only that last answer goes out; any other
refusal goes out as it is. That the app refuses a field is remembered for the process only when the
error blamed it and the request without it was accepted: an ordinary bad request (a chat request
without ``messages``) never turns the measurement off.

Models: those named in the settings (``SERVELENS_MODEL``), those the app serves (vLLM's
``app.state.openai_serving_models``), read when the app's startup completed, get every series at
zero then. Another model the app answers with a 2xx is registered on first use, up to
``SERVELENS_MAX_LEARNED_MODELS`` (8) of them: an app that ignores ``model`` answers any name, and a
client must not be able to add label values without bound (the gateway never lets a request add
one). A request naming a model the app does not serve (its 404), or one more past that bound, is
counted under ``model="unknown_model"`` (``requests_total`` and the stock duration only), the
bound's line logged once. A request naming no model is counted under the app's model when exactly
one is known at start (vLLM answers such a request with its first served model), else under
``unknown_model``.

Bad input: bad settings fail the app's startup with one line (ASGI ``lifespan.startup.failed``,
which uvicorn logs before it exits); a server without lifespan gets that line in the log once and
the app unmeasured. An app whose routes (Starlette's ``app.routes``) have neither measured path gets
one warning line and is passed through; nothing is counted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any

import msgspec

from servelens.asgi.exchange import REJECTED, ClientWatch, Exchange, Message, Send
from servelens.asgi.settings import AsgiSettings, shared_metrics
from servelens.core.openai import decode_json_strictness
from servelens.gateway.measured import MEASURED_PATHS
from servelens.gateway.rejection import CONTINUOUS, RESEND_WITHOUT_CONTINUOUS, read_rejection
from servelens.gateway.usage import Injection, plan_learned, stream_asked
from servelens.prometheus import REGISTRY, CollectorRegistry, FrontendMetrics

log = logging.getLogger("servelens.asgi")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_now = time.perf_counter_ns

MEASURED_KEY = "servelens.measured"
"""Set in the scope of a request one middleware measures: an inner one passes it through."""


class MetricsMiddleware:
    """Per-request, per-ISL-bucket metrics of an ASGI OpenAI server, recorded in process.

    ``vllm serve MODEL --middleware servelens.asgi.MetricsMiddleware``; or
    ``app.add_middleware(MetricsMiddleware)`` (Starlette, FastAPI); or ``MetricsMiddleware(app)``.
    The families go to ``registry`` (default: prometheus_client's ``REGISTRY``, which vLLM serves on
    its ``/metrics``), one set per registry and process, shared by every middleware on it.

    Args:
        app: the ASGI app.
        model, isl_buckets, prefix, inject_usage, continuous_usage, max_learned_models: see
            :class:`~servelens.asgi.settings.AsgiSettings` (None: the ``SERVELENS_*`` variable, else the
            default).
        registry: the prometheus_client registry (default ``REGISTRY``).
        environ: where the settings' variables are read (default ``os.environ``).

    Bad settings do not raise here (vLLM and Starlette build middleware inside the server's startup,
    where a raise is not reported as such): :attr:`error` holds the line, and the app's startup fails
    with it (see the module docstring).
    """

    def __init__(
        self, app: ASGIApp, *, model: str | list[str] | None = None, isl_buckets: str | None = None,
        prefix: str | None = None, inject_usage: bool | None = None, continuous_usage: str | None = None,
        max_learned_models: int | None = None, registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.error: str | None = None
        """Why nothing is measured (bad settings), or None."""
        self.measuring: bool | None = None
        """False: the app has no measured route; None: not known before its startup or first request."""
        self.metrics: FrontendMetrics | None = None
        self._declared: list[str] = []  # the models known at start (settings, the app's served names)
        self._learned: set[str] = set()  # registered from answered requests (at most max_learned_models)
        self._said_learned = False
        # learned of the app (the gateway learns these per upstream)
        self.stream_options_ok = True
        self.continuous_ok = True
        self.usage_null: bool | None = None
        self._said_error = False
        self._multiprocess = False
        _visible(log)
        self.registry = REGISTRY if registry is None else registry
        self._environ = os.environ if environ is None else environ
        try:
            self.settings = AsgiSettings.resolve(
                self._environ, model=model, isl_buckets=isl_buckets, prefix=prefix,
                inject_usage=inject_usage, continuous_usage=continuous_usage, max_learned_models=max_learned_models)
            # vLLM with several API servers: /metrics serves only the multiprocess files (said at startup)
            self._multiprocess = bool(self._environ.get("PROMETHEUS_MULTIPROC_DIR")) and self.registry is REGISTRY
            if not self._multiprocess:
                self.metrics, self.accounting = shared_metrics(self.registry, self.settings)
        except ValueError as exc:
            self.error = f"servelens.asgi.MetricsMiddleware: {exc}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            endpoint = MEASURED_PATHS.get(scope.get("path", ""))
            if endpoint is not None and scope.get("method") == "POST" and MEASURED_KEY not in scope:
                if self.error is not None:
                    self._say_error()
                else:
                    if self.measuring is None:
                        self._started(scope)
                    if self.measuring:
                        scope[MEASURED_KEY] = True
                        await self._measure(scope, receive, send, endpoint)
                        return
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _say_error(self) -> None:
        if not self._said_error:
            self._said_error = True
            log.error("%s; nothing is measured", self.error)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Bad settings fail the startup; else, once the app's startup completed, see what it serves."""
        if self.error is not None:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._said_error = True
                await send({"type": "lifespan.startup.failed", "message": self.error})
                return
            await self.app(scope, receive, send)
            return

        async def startup_seen(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete" and self.measuring is None:
                self._started(scope)
            await send(message)

        await self.app(scope, receive, startup_seen)

    def _started(self, scope: Scope) -> None:
        """At the app's startup (or its first request): are the measured routes there; which models
        does it serve (every series at zero for them); one line in the log either way."""
        app = scope.get("app")
        if not has_measured_route(app):
            self.measuring = False
            log.warning("servelens.asgi.MetricsMiddleware: the app has no route %s: nothing is measured, every "
                        "request passes through", " or ".join(MEASURED_PATHS))
            return
        if self._multiprocess:
            self.measuring = False
            log.warning("servelens.asgi.MetricsMiddleware: PROMETHEUS_MULTIPROC_DIR is set (vLLM with "
                        "--api-server-count > 1): /metrics then serves prometheus_client's multiprocess files only, "
                        "not this process's servelens families: nothing is measured (run one API server, or "
                        "servelens gateway in front)")
            return
        self.measuring = True
        assert self.metrics is not None
        self._declared = list(dict.fromkeys(n for n in [*self.settings.models, *served_models(app)] if n))
        for name in self._declared:
            self._register(name)
        s = self.settings
        log.info("servelens.asgi.MetricsMiddleware: measuring POST %s in process; models %s; ISL buckets %s; "
                 "metrics %s_* (%d series per model)", ", ".join(MEASURED_PATHS),
                 ", ".join(self.metrics.state.models) or "(registered on first success)", s.isl_buckets or "off",
                 s.prefix, self.metrics.series_per_model)

    def _learn(self, name: str) -> None:
        """A request naming ``name`` got a 2xx: register it unless known, or past the models learned from
        requests (``max_learned_models``; said once: it is then counted as ``unknown_model``)."""
        metrics = self.metrics
        assert metrics is not None
        if name in metrics.state.models or not name:
            return
        if len(self._learned) >= self.settings.max_learned_models:
            if not self._said_learned:
                self._said_learned = True
                log.warning("servelens.asgi.MetricsMiddleware: %d models registered from requests (%s), the most "
                            "SERVELENS_MAX_LEARNED_MODELS allows; requests naming others are counted as "
                            "unknown_model", len(self._learned), ", ".join(sorted(self._learned)) or "none")
            return
        self._register(name)
        if name in metrics.state.models:
            self._learned.add(name)

    def _register(self, name: str) -> None:
        """Register ``name`` (all its series at zero) unless known or past the model budget (said once)."""
        metrics = self.metrics
        assert metrics is not None
        if name in metrics.state.models or not name:
            return
        try:
            metrics.register_model(name)
        except ValueError as exc:
            if not getattr(self, "_said_full", False):
                self._said_full = True
                log.warning("servelens.asgi.MetricsMiddleware: %s; counted as unknown_model", exc)

    async def _measure(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        """Read the body, plan the usage to add, call the app, count the request once."""
        assert self.metrics is not None
        arrival = _now()
        parts: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # gone while sending its body: counted once, no model
                self.metrics.state.client_disconnected()
                self.accounting.rejected(endpoint, "unary", "cancelled", arrival)
                return
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        watch = ClientWatch(receive)  # hears the client leave, whether or not the app asks
        try:
            await self._answer(scope, watch, send, endpoint, arrival, body)
        finally:
            watch.close()

    async def _answer(self, scope: Scope, watch: ClientWatch, send: Send, endpoint: str, arrival: int,
                      body: bytes) -> None:
        """Plan the usage to add to ``body``, call the app (again, after a refusal of what was added:
        :mod:`servelens.gateway.rejection`), count the request once."""
        assert self.metrics is not None
        obj: dict[str, Any] | None = None
        strict = True
        try:
            decoded, strict = decode_json_strictness(body)
            obj = decoded if isinstance(decoded, dict) else None
        except (msgspec.DecodeError, ValueError):
            pass  # the app answers it (its own 400), counted with no model
        model = obj.get("model") if obj is not None else None
        if obj is not None and model is None and len(self._declared) == 1:
            model = self._declared[0]  # vLLM serves its one model to a request naming none
        stream = obj is not None and stream_asked(obj) is True  # "true" and 1 too, as pydantic reads them
        inj, learn = Injection(body), False
        if stream and isinstance(model, str):
            assert obj is not None
            s = self.settings
            inj, learn = plan_learned(obj, body, inject_usage=s.inject_usage, continuous_usage=s.continuous_usage,
                                      stream_options_ok=self.stream_options_ok, continuous_ok=self.continuous_ok,
                                      usage_null=self.usage_null, strict=strict)
        ex = await self._call(scope, watch, send, endpoint, model if isinstance(model, str) else None,
                              stream, arrival, inj, body)
        drop_continuous = drop_all = False
        while ex.held is not None and obj is not None:
            # the app refused (400/422) what was added to the request: the gateway's rule (gateway.rejection)
            rej = read_rejection(inj, b"".join(m.get("body", b"") for m in ex.held[1:]))
            if rej.resend is None:  # an ordinary client error, not showing what was added: its answer goes out
                await ex.release()
                ex.finish()
                break
            if rej.resend == RESEND_WITHOUT_CONTINUOUS:
                drop_continuous = True
            else:
                drop_all = True
            s = self.settings
            inj, learn = plan_learned(obj, body, inject_usage=s.inject_usage, continuous_usage=s.continuous_usage,
                                      stream_options_ok=self.stream_options_ok and not drop_all,
                                      continuous_ok=self.continuous_ok and not drop_continuous,
                                      usage_null=self.usage_null, strict=strict)
            ex = await self._call(scope, watch, send, endpoint, ex.model, stream, arrival, inj, body)
            if rej.blamed is not None and ex.status not in REJECTED:  # sent without it: accepted
                if rej.blamed == CONTINUOUS:
                    self.continuous_ok = False
                else:
                    self.stream_options_ok = False
                log.info("servelens.asgi.MetricsMiddleware: the app rejects %s; not sending it again", rej.blamed)
        if learn and ex.out.status == "success" and ex.meter is not None and ex.meter.usage_key_on_chunks is not None:
            self.usage_null = ex.meter.usage_key_on_chunks

    async def _call(
        self, scope: Scope, watch: ClientWatch, send: Send, endpoint: str, model: str | None, stream: bool,
        arrival: int, inj: Injection, body: bytes, hold: bool = True,
    ) -> Exchange:
        """Call the app with ``inj.body`` as the request body (then ``watch``'s messages); count the answer
        unless it is held."""
        assert self.metrics is not None
        ex = Exchange(self.metrics, self.accounting, endpoint, model, stream, arrival, inj, send,
                      hold_rejection=hold and inj.body is not body and self.settings.continuous_usage != "on",
                      register=self._learn)
        given = False
        watch.exchange = ex
        watch.start()

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": inj.body, "more_body": False}
            message = await watch.receive()
            if message["type"] == "http.disconnect":
                ex.disconnected = True
            return message

        inner = scope
        if inj.body is not body:  # the length the app may read is the new body's
            headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() != b"content-length"]
            inner = {**scope, "headers": [*headers, (b"content-length", str(len(inj.body)).encode())]}
        try:
            await self.app(inner, replay, ex.send)
        except (Exception, asyncio.CancelledError) as exc:
            ex.held = None  # (a held answer is dropped: the server answers the exception)
            ex.finish(exc)
            raise
        if ex.held is None:
            ex.finish()
        return ex


def _visible(logger: logging.Logger) -> None:
    """Give ``logger`` a stderr handler when nothing would print its lines (vLLM and uvicorn set up only
    their own loggers), so the start line and the warnings reach the server's log."""
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)


def has_measured_route(app: object) -> bool:
    """False only when ``app`` lists its routes (Starlette's ``app.routes``), each with a plain path, and
    none is a measured path; True when it has one, or its routes cannot be told (a pure ASGI app, a
    mounted sub-app, FastAPI's lazily included routers, which have no ``path``)."""
    routes = getattr(app, "routes", None)
    if not isinstance(routes, Iterable):
        return True
    for r in routes:
        path = getattr(r, "path", None)
        if path in MEASURED_PATHS or not isinstance(path, str) or hasattr(r, "routes"):
            return True
    return False


def served_models(app: object) -> list[str]:
    """The model names an app serves, where it says so: vLLM's ``app.state.openai_serving_models``
    (its ``base_model_paths``: the ``--served-model-name`` list); [] for any other app."""
    serving = getattr(getattr(app, "state", None), "openai_serving_models", None)
    paths = getattr(serving, "base_model_paths", None) or ()
    return [n for n in (getattr(p, "name", None) for p in paths) if isinstance(n, str) and n]

