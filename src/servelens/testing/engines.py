"""Test helpers for conformance runs against real engines: a recording tap between the gateway and
an engine (:func:`recording_tap`), ``/metrics`` scrapes and their differences, SSE payloads.

The tap is a pass-through HTTP proxy on a free loopback port that keeps every chat/completions
response body exactly as the engine sent it, so a test can hold what the client got against what
the engine said (its ``usage`` and, for llama.cpp, its ``timings``). Optionally it tags each
response with its own ``x-request-id`` (the gateway logs it as ``upstream_request_id`` and relays it;
the bench records it as ``request_id``: one key joins all three), and it can play an engine that
ignores ``stream_options`` (llama-cpp-python's own server) by removing them from requests. Example::

    async with recording_tap(srv.url, tag_requests=True) as tap:
        ...  # point the gateway at tap.url
        tap.exchanges[0].final_event()["timings"]["prompt_ms"]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from servelens.core.buckets import IslBuckets
from servelens.core.sse import SSEDecoder
from servelens.formats.metrics_text import Scrape, parse_scrape
from servelens.formats.results import BenchRecord, load_results
from servelens.gateway.testing import serve_app


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    """GET ``url/metrics`` and parse it. Raises urllib's errors, ValueError for non-exposition text."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as resp:
        return parse_scrape(resp.read().decode())


async def ascrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    """:func:`scrape` with an aiohttp session."""
    async with session.get(url + "/metrics") as resp:
        return parse_scrape(await resp.text())


def delta(after: Scrape, before: Scrape, name: str, match: dict[str, str] | None = None) -> float:
    """``after - before`` of one sample (summed over the series ``match`` selects)."""
    return after.value(name, match) - before.value(name, match)


def wait_until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``cond()`` until true, at most ``timeout_s`` (a bounded condition wait, for counts that
    another process updates). Raises AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def run_bench(url: str, args: Sequence[str], out: Path, timeout_s: float = 900.0) -> tuple[
        tuple[BenchRecord, ...], float]:  # fmt: skip
    """``servelens bench --url URL ARGS --output-dir OUT --no-progress`` as a subprocess: its records
    and wall time (s). Raises AssertionError with the bench's output when it exits non-zero."""
    cmd = [sys.executable, "-m", "servelens", "bench", "--url", url, *args, "--output-dir", str(out), "--no-progress"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    wall_s = time.monotonic() - t0
    assert proc.returncode == 0, f"bench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return tuple(load_results(out)), wall_s


def wait_gateway_counted(gw_url: str, before: Scrape, n: int, timeout_s: float) -> Scrape:
    """Wait (bounded) until the gateway at ``gw_url`` counted ``n`` more requests than in ``before``
    (it records a request once its stream has ended); its scrape then."""
    wait_until(lambda: delta(scrape(gw_url), before, "servelens_requests_total") >= n, timeout_s,
               f"the gateway to record {n} requests")  # fmt: skip
    return scrape(gw_url)


def bench_bucket_counts(records: Sequence[BenchRecord], buckets: IslBuckets, extra_isl: Sequence[int] = ()) -> dict[
        str, int]:  # fmt: skip
    """Requests per ISL bucket label from the engine's ``prompt_tokens`` in the bench's records (and
    ``extra_isl``: requests the bench does not record, such as its probe); empty buckets left out.
    Raises AssertionError for a record without the engine's count."""
    counts: dict[str, int] = {}
    for isl in [*extra_isl, *(r.isl_server for r in records)]:
        assert isl is not None, "the engine reports prompt_tokens"
        label = buckets.label(isl)
        counts[label] = counts.get(label, 0) + 1
    return counts


def gateway_bucket_counts(after: Scrape, before: Scrape, buckets: IslBuckets) -> dict[str, int]:
    """Requests per ISL bucket label the gateway counted between two scrapes (its
    ``servelens_request_duration_by_isl_seconds_count``); empty buckets left out."""
    counts = {label: int(delta(after, before, "servelens_request_duration_by_isl_seconds_count",
                               {"isl_bucket": label})) for label in buckets.labels}  # fmt: skip
    return {k: v for k, v in counts.items() if v}


def sse_events(raw: bytes) -> list[str]:
    """The ``data`` payloads of an SSE body (core decoder), in order."""
    dec = SSEDecoder()
    blocks = dec.decode(raw) + dec.flush()
    return [b.data for b in blocks if b.data is not None]


def expected_events(upstream: list[str], client_usage: bool, client_continuous: bool) -> list[str]:
    """What the client should get: vLLM's events minus the usage it did not ask for (written here
    independently of the byte-level cutting of the gateway and the ASGI middleware; compared as
    order-preserving JSON)."""
    out: list[str] = []
    for data in upstream:
        if data == "[DONE]":
            out.append(data)
            continue
        obj = json.loads(data)
        if "usage" in obj and not client_continuous:
            usage_only = obj.get("choices") == []
            if usage_only and client_usage:
                pass  # the final usage chunk the client asked for
            elif usage_only:
                continue  # not asked for: dropped whole
            else:
                del obj["usage"]
        out.append(json.dumps(obj))
    return out


def canon_events(events: list[str]) -> list[str]:
    """Events as compact JSON (``[DONE]`` as it is), to compare their content in order."""
    return [e if e == "[DONE]" else json.dumps(json.loads(e)) for e in events]


@dataclass(frozen=True)
class Exchange:
    """One chat/completions request through the tap: the request body as forwarded, the response's
    status and content type, the tap's own request id (``tap-N``, or None without ``tag_requests``)
    and the response body exactly as the engine sent it."""

    request_id: str | None
    request: bytes
    status: int
    content_type: str
    body: bytes

    def events(self) -> list[dict[str, Any]]:
        """The JSON events of a streamed body (``[DONE]`` and comments such as llama-server's
        ``:`` heartbeat left out); a unary body as one event."""
        if self.content_type != "text/event-stream":
            return [json.loads(self.body)] if self.body.strip() else []
        return [json.loads(e) for e in sse_events(self.body) if e != "[DONE]"]

    def final_event(self) -> dict[str, Any]:
        """The last JSON event (where llama-server puts ``usage`` and ``timings``); {} if none."""
        ev = self.events()
        return ev[-1] if ev else {}


@dataclass
class Tap:
    """A running tap: ``url`` to send to; ``bodies`` (raw response bodies of chat requests, in
    order, as in the vLLM tests) and ``exchanges`` (chat and completions requests, in order)."""

    url: str
    bodies: list[bytes] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)

    def by_id(self) -> dict[str, Exchange]:
        """Exchanges by their tap request id (``tag_requests`` only)."""
        return {e.request_id: e for e in self.exchanges if e.request_id is not None}


def _without_stream_options(body: bytes) -> bytes:
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    if not isinstance(obj, dict) or "stream_options" not in obj:
        return body
    del obj["stream_options"]
    return json.dumps(obj).encode()


@asynccontextmanager
async def recording_tap(
    upstream: str, *, tag_requests: bool = False, drop_stream_options: bool = False
) -> AsyncIterator[Tap]:
    """A pass-through HTTP proxy to ``upstream`` on a free loopback port (see the module docstring);
    only for tests. Request headers kept: ``Content-Type`` and ``Accept``; response headers:
    ``Content-Type`` (and the tap's ``x-request-id`` with ``tag_requests``)."""
    tap = Tap("")
    # a new connection per request: llama-server closes its connection after every streamed response
    # although its headers say keep-alive, and a reused one then fails (docs/llama-cpp.md)
    session = aiohttp.ClientSession(auto_decompress=False, connector=aiohttp.TCPConnector(force_close=True))
    n = 0

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal n
        body = await request.read()
        measured = request.path.startswith(("/v1/chat", "/v1/completions"))
        if measured and drop_stream_options:
            body = _without_stream_options(body)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with session.request(request.method, upstream + request.path_qs, data=body, headers=headers) as up:
            rid = None
            resp = web.StreamResponse(status=up.status)
            if measured and tag_requests:
                n += 1
                rid = f"tap-{n}"
                resp.headers["x-request-id"] = rid
            ctype = up.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if ctype:
                resp.content_type = ctype
            await resp.prepare(request)
            raw = bytearray()
            async for data in up.content.iter_any():
                raw += data
                await resp.write(data)
            if request.path.startswith("/v1/chat"):
                tap.bodies.append(bytes(raw))
            if measured:
                tap.exchanges.append(Exchange(rid, body, up.status, ctype, bytes(raw)))
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    try:
        async with serve_app(app) as url:
            tap.url = url
            yield tap
    finally:
        await session.close()


@contextmanager
def tap_in_thread(upstream: str, **options: bool) -> Iterator[Tap]:
    """:func:`recording_tap` run by its own event loop in a daemon thread, for synchronous tests that
    block (a bench run as a subprocess) while the tap relays. ``options``: as for
    :func:`recording_tap`. Read ``tap.exchanges`` after the requests ended (appended by that thread)."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def run() -> None:
        stop = asyncio.Event()
        box["stop"], box["loop"] = stop, asyncio.get_running_loop()
        try:
            async with recording_tap(upstream, **options) as tap:
                box["tap"] = tap
                started.set()
                await stop.wait()
        except BaseException as exc:
            box["error"] = exc
            started.set()
            raise

    thread = threading.Thread(target=asyncio.run, args=(run(),), name="recording-tap", daemon=True)
    thread.start()
    started.wait(30)
    if "tap" not in box:
        raise RuntimeError(f"the recording tap did not start: {box.get('error')!r}")
    try:
        yield box["tap"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)
