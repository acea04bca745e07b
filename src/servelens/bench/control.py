"""The bench's own requests to the endpoint, beside the load: which model and context it serves
(``GET /v1/models``), which options it accepts (a one-token probe for continuous usage and
``ignore_eos``), and its ``/metrics`` before and after the run (the server-side table). Each is
bounded by :data:`CONTROL_TIMEOUT_S`."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from servelens.bench.client import build_body, error_message
from servelens.bench.config import BenchConfig
from servelens.core.openai import parse_chunk
from servelens.core.sse import SSEDecoder
from servelens.core.summary import BucketRow, rows_from_histograms, summed_over_buckets
from servelens.formats.metrics_text import Scrape, bucket_histograms, parse_scrape
from servelens.prometheus.connections import MAX_CONNECTIONS
from servelens.prometheus.names import MetricNames
from servelens.serving import client_error_reason

CONTROL_TIMEOUT_S = 10.0
"""Bound on the bench's own small requests (``/v1/models``, ``/metrics`` scrapes), in seconds: a server
that accepts and never answers is an error within it, not after ``--request-timeout``."""
_CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)


async def _get_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> Any:
    async with session.get(url, headers=headers, timeout=_CONTROL_TIMEOUT) as resp:
        if resp.status != 200:
            raise ValueError(f"GET {url} answered HTTP {resp.status}")
        try:
            return await resp.json(content_type=None)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to decode
            raise ValueError(f"GET {url}: the answer is not JSON (is this an OpenAI-compatible server?)") from None


async def discover(
    session: aiohttp.ClientSession, config: BenchConfig, headers: dict[str, str]
) -> tuple[str, int | None]:
    """The model to use and the context length ``/v1/models`` reports (vLLM's ``max_model_len``).

    An endpoint that cannot be reached, or does not answer within ``CONTROL_TIMEOUT_S``, is a
    ValueError even with ``--model`` (the load would only wait on it); one that answers without a
    usable list is fine when ``--model`` names the model.
    """
    url = config.base_url + "/v1/models"
    try:
        data = await _get_json(session, url, headers)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ValueError(f"cannot reach {url}: {client_error_reason(exc)}") from None
    except ValueError:
        if config.model:  # no /v1/models here (or not JSON): the model is named, go on
            return config.model, None
        raise
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models:
        if config.model:
            return config.model, None
        raise ValueError(f"{url} lists no models; pass --model")
    chosen = None
    if config.model:
        chosen = next((m for m in models if isinstance(m, dict) and m.get("id") == config.model), None)
        model = config.model
    else:
        chosen = models[0] if isinstance(models[0], dict) else None
        model = str(chosen.get("id")) if chosen else ""
        if not model:
            raise ValueError(f"{url}: first model has no id; pass --model")
    ctx = chosen.get("max_model_len") if isinstance(chosen, dict) else None
    return model, ctx if isinstance(ctx, int) and ctx > 0 else None


PROBE_PROMPT = "hello"
"""The probe's prompt: one token for any tokenizer worth the name (the sim's, BPE vocabularies)."""


async def probe(
    session: aiohttp.ClientSession, url: str, model: str, config: BenchConfig, headers: dict[str, str],
    want_prompt_tokens: bool = False,
) -> tuple[bool, bool, int | None]:
    """Which of continuous usage and ignore_eos the endpoint accepts (one tiny request each try), and
    the ``usage.prompt_tokens`` the endpoint reported for the probe's prompt, :data:`PROBE_PROMPT` (None
    when it reported none). With ``continuous_usage`` set in the config no probe is needed for the
    options; one is sent anyway when ``want_prompt_tokens`` (the chat template's tokens, for fitting
    long requests into the context), and any refusal of it is no error then (prompt tokens None)."""
    tries = [(True, config.ignore_eos), (False, config.ignore_eos), (False, False)]
    given = config.continuous_usage is not None
    if given:
        if not want_prompt_tokens:
            return bool(config.continuous_usage), config.ignore_eos, None
        tries = [(bool(config.continuous_usage), config.ignore_eos)]
    for cont, eos in tries:
        body = build_body(config.endpoint, model, PROBE_PROMPT, 1, continuous_usage=cont, ignore_eos=eos)
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                answer = await resp.read()
                if resp.status == 200:
                    return cont, eos, reported_prompt_tokens(answer)
                if given:  # only the template was asked for: the run's own requests will say what fails
                    return cont, eos, None
                if resp.status not in (400, 422):
                    raise ValueError(f"POST {url} answered HTTP {resp.status} to a one-token probe request: "
                                     f"{error_message(answer)}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ValueError(f"cannot reach {url}: {client_error_reason(exc)}") from None
    raise ValueError(f"POST {url} rejected a minimal streaming request (HTTP 400); check --model and --endpoint")


def reported_prompt_tokens(stream: bytes) -> int | None:
    """The last ``usage.prompt_tokens`` in an SSE stream's bytes (None when no chunk carried one)."""
    found: int | None = None
    for blk in SSEDecoder().decode(stream):
        if blk.data is None:
            continue
        info = parse_chunk(blk.data, blk.event)
        if info.usage is not None and info.usage.prompt_tokens is not None:
            found = info.usage.prompt_tokens
    return found


def template_tokens(reported: int | None, counted: int) -> int | None:
    """Tokens the endpoint adds to a prompt (its chat template, a BOS token): what it reported for the
    probe's prompt less what the bench's tokenizer counts in it; None when nothing was reported."""
    return None if reported is None else max(reported - counted, 0)


async def fetch_scrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    """GET ``url`` and parse it as Prometheus text. Raises ValueError (one line) for a non-200 answer,
    an unreachable endpoint, a timeout or text that is not exposition format."""
    try:
        async with session.get(url, timeout=_CONTROL_TIMEOUT) as resp:
            if resp.status != 200:
                raise ValueError(f"GET {url} answered HTTP {resp.status}")
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ValueError(f"cannot scrape {url}: {client_error_reason(exc)}") from None
    return parse_scrape(text)

async def quiet_scrape(session: aiohttp.ClientSession, config: BenchConfig) -> Scrape:
    """The "before" scrape, taken once the server has no request in flight (the probe request
    is recorded by a proxy just after its last bytes reach us); bounded to 3 s."""
    assert config.metrics_url is not None
    inflight = MetricNames(config.metrics_prefix).inflight
    deadline = time.monotonic() + 3.0
    while True:
        scrape = await fetch_scrape(session, config.metrics_url)
        if scrape.value(inflight) <= 0 or time.monotonic() > deadline:
            return scrape
        await asyncio.sleep(0.02)


def server_kind(scrape: Scrape) -> str:
    """What serves a ``/metrics``: ``gateway`` when the scrape has the gateway's own
    ``servelens_gateway_max_connections`` (every gateway exports it, in the sidecar mode too), else
    ``server`` (the ASGI middleware inside an engine, or any other exporter of the families)."""
    return "gateway" if any(name == MAX_CONNECTIONS for name, _ in scrape.samples) else "server"


async def fetch_server_rows(
    session: aiohttp.ClientSession, config: BenchConfig, before: Scrape, expect: int
) -> tuple[tuple[BucketRow, ...], tuple[BucketRow, ...] | None, bool, str]:
    """Rows from ``after - before``; the rows per uncached bucket from the same scrapes when
    ``config.uncached_buckets`` is set (empty when the server has no such families), else None;
    whether the "all requests" row is the by-ISL histograms summed over the buckets (an endpoint
    without the stock families: a ``--by-isl-only`` sidecar gateway); and :func:`server_kind` of the
    scrape. Waits (bounded, 3 s) until the server has recorded ``expect`` requests, since a proxy
    records a request just after its last bytes reach the client."""
    assert config.metrics_url is not None
    names = MetricNames(config.metrics_prefix)
    deadline = time.monotonic() + 3.0
    summed, overall = False, None
    while True:
        after = await fetch_scrape(session, config.metrics_url)
        per_bucket, all_h = bucket_histograms(after, names, before)
        if not per_bucket and all_h.duration is None:
            break  # no servelens families at this URL
        summed = all_h.duration is None and all_h.ttft is None
        overall = summed_over_buckets(per_bucket) if summed else all_h
        seen = overall.duration.count if overall is not None and overall.duration is not None else 0
        if seen >= expect or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    kind = server_kind(after)
    if not per_bucket and all_h.duration is None:
        return (), (None if config.uncached_buckets is None else ()), False, kind
    all_row = overall if summed else all_h
    rows = tuple(rows_from_histograms(per_bucket, all_row))
    from_buckets = summed and overall is not None
    if config.uncached_buckets is None:
        return rows, None, from_buckets, kind
    per_uncached, _ = bucket_histograms(after, names, before, by="uncached")
    return (rows, (tuple(rows_from_histograms(per_uncached, all_row)) if per_uncached else ()), from_buckets,
            kind)
