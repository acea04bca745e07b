"""Running a bench: workload -> requests on a schedule -> records -> the per-bucket table.

Library entry points (the CLI and ``servelens demo`` call these):

* :class:`BenchConfig` (frozen): what to run.
* ``await run_bench(config) -> BenchResult`` inside a running event loop, or
  :func:`run_bench_sync` (its own loop, uvloop when installed).
* :func:`print_result` renders the table(s) with rich.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
from rich.console import Console

from servelens.bench.arrivals import ARRIVALS, arrival_offsets, trace_offsets
from servelens.bench.client import ENDPOINTS, RequestSpec, build_body, error_message, send_request
from servelens.bench.distributions import parse_length_dist
from servelens.bench.lag import LagMonitor, LagReport
from servelens.bench.prompts import PromptBuilder, load_tokenizer
from servelens.bench.traces import TraceRow, clip_row, read_trace
from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.core.summary import BucketRow, rows_from_histograms, rows_from_samples
from servelens.core.timing import NS_PER_S
from servelens.formats.metrics_text import Scrape, bucket_histograms, parse_scrape
from servelens.formats.results import RESULTS_FILE, SUMMARY_FILE, BenchRecord, to_samples, write_results
from servelens.formats.table import fit_to, rich_table, side_by_side
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames
from servelens.serving import client_error_reason

LONG_REQUEST_POLICIES = ("drop", "clip")
PREBUILD_MAX_TOKENS = 30_000_000
"""Prompts are built before the run when the workload's total ISL is at most this many tokens
(about 180 MB of text with the sim's words); larger workloads build each prompt just before sending."""


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Lengths in tokens, times in seconds.

    Attributes:
        url: the endpoint's base URL (``http://host:port``; ``/v1/...`` is appended; a trailing ``/v1``
            is accepted).
        model: model name; None takes the first model ``GET /v1/models`` lists.
        endpoint: ``"chat"`` or ``"completions"``.
        trace, trace_format: a Mooncake JSONL or Azure CSV trace and its format (None: detect).
            With a trace, ``isl``/``osl``/``num_requests`` are not used.
        time_scale: trace timestamps are multiplied by this (0.1 replays ten times faster).
        isl, osl: synthetic length specs (see :mod:`servelens.bench.distributions`).
        num_requests: synthetic workload size.
        seed: seeds lengths, Poisson arrivals and prompt texts.
        max_requests: send at most this many requests (trace or synthetic).
        duration_s: stop starting new requests after this many seconds (in-flight ones finish).
        concurrency: closed loop with this many workers; with ``rate`` or a trace: cap on in-flight.
        rate: open loop at this many requests/s with ``arrival`` (``poisson`` or ``constant``).
        tokenizer: a ``tokenizer.json`` for a real engine; None uses the sim's documented tokenizer.
        max_context: requests whose ISL + OSL exceeds this are dropped or clipped
            (``long_requests``); None: the ``max_model_len`` that ``/v1/models`` reports, if any.
        isl_buckets: ISL bucket boundaries for the table.
        metrics_url: a ``/metrics`` URL scraped before and after the run (server-side table).
        metrics_prefix: metric-name prefix of the by-ISL families at ``metrics_url``.
        output_dir: where ``results.jsonl`` and ``summary.json`` go (None: not written).
        request_timeout_s: per-read timeout of a request (s).
        lag_threshold_ms: event-loop lag p99 above which the client figures are not trustworthy.
        continuous_usage: ask for ``continuous_usage_stats``; None probes the endpoint once.
        ignore_eos: send ``ignore_eos``/``min_tokens`` so the output length equals the target.
        api_key: sent as ``Authorization: Bearer ...`` (never written to files).
        progress: show a rich progress bar (requests done, errors, elapsed) on stderr.
        ramp_up_s: closed loop: start the workers evenly over this many seconds (None: 1 ms per worker,
            at most 2 s). Each worker's first request opens a connection; starting 1,000 at once
            overflows a server's listen backlog and the retried SYNs add a second to their TTFT.
    """

    url: str
    model: str | None = None
    endpoint: str = "chat"
    trace: str | None = None
    trace_format: str | None = None
    time_scale: float = 1.0
    isl: str = "512"
    osl: str = "128"
    num_requests: int = 100
    seed: int = 0
    max_requests: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    tokenizer: str | None = None
    max_context: int | None = None
    long_requests: str = "drop"
    isl_buckets: tuple[int, ...] = DEFAULT_ISL_BOUNDARIES
    metrics_url: str | None = None
    metrics_prefix: str = DEFAULT_PREFIX
    output_dir: str | None = None
    request_timeout_s: float = 600.0
    lag_threshold_ms: float = 10.0
    continuous_usage: bool | None = None
    ignore_eos: bool = True
    api_key: str | None = field(default=None, repr=False)
    progress: bool = False
    ramp_up_s: float | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and math.isnan(self.rate):
            raise ValueError("rate must be a number of requests per second (inf: all at once), got nan")
        for name, value in (("duration", self.duration_s), ("ramp-up", self.ramp_up_s),
                            ("time-scale", self.time_scale), ("request-timeout", self.request_timeout_s),
                            ("max-loop-lag-ms", self.lag_threshold_ms)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request-timeout must be > 0 s, got {self.request_timeout_s}")
        if self.lag_threshold_ms < 0:
            raise ValueError(f"max-loop-lag-ms must be >= 0, got {self.lag_threshold_ms}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r}; expected chat or completions")
        if self.long_requests not in LONG_REQUEST_POLICIES:
            raise ValueError(f"--long-requests must be drop or clip, got {self.long_requests!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival process {self.arrival!r}; expected poisson or constant")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.num_requests < 1:
            raise ValueError(f"num-requests must be >= 1, got {self.num_requests}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max-requests must be >= 1, got {self.max_requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration_s}")
        if self.ramp_up_s is not None and self.ramp_up_s < 0:
            raise ValueError(f"ramp-up must be >= 0 s, got {self.ramp_up_s}")
        if self.time_scale < 0:
            raise ValueError(f"time-scale must be >= 0, got {self.time_scale}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max-context must be >= 2 tokens, got {self.max_context}")
        _check_url("--url", self.url)
        if self.metrics_url is not None:
            _check_url("--metrics-url", self.metrics_url)
        object.__setattr__(self, "isl_buckets", IslBuckets.parse(self.isl_buckets).boundaries)
        parse_length_dist(self.isl)
        parse_length_dist(self.osl)
        MetricNames(self.metrics_prefix)

    @property
    def base_url(self) -> str:
        """``url`` without a trailing ``/`` or ``/v1``."""
        u = self.url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u


def _check_url(flag: str, url: str) -> None:
    """Raise ValueError (one line) unless ``url`` is an ``http(s)://host[:port]`` URL without a query or
    fragment (a bad one would otherwise fail later with the URL repeated as its own reason)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{flag} must start with http:// or https://, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port number
    except ValueError as exc:
        raise ValueError(f"{flag} {url!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{flag} {url!r} has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{flag} must not have a query or fragment, got {url!r}")


@dataclass(frozen=True)
class PromptDeviation:
    """How far the server's ``usage.prompt_tokens`` was from the built prompts' targets (tokens).

    Attributes:
        reported: requests whose server reported ``prompt_tokens``.
        exact: of those, how many matched the target exactly.
        mean_diff, min_diff, max_diff, mean_abs_diff: ``prompt_tokens - target`` statistics.
    """

    reported: int
    exact: int
    mean_diff: float | None
    min_diff: int | None
    max_diff: int | None
    mean_abs_diff: float | None

    @classmethod
    def of(cls, records: Sequence[BenchRecord]) -> PromptDeviation:
        """From the records that carry ``isl_server``."""
        diffs = [r.isl_server - r.isl_target for r in records if r.isl_server is not None]
        if not diffs:
            return cls(0, 0, None, None, None, None)
        return cls(
            reported=len(diffs),
            exact=sum(1 for d in diffs if d == 0),
            mean_diff=sum(diffs) / len(diffs),
            min_diff=min(diffs),
            max_diff=max(diffs),
            mean_abs_diff=sum(abs(d) for d in diffs) / len(diffs),
        )

    def line(self) -> str:
        """One line for the console."""
        if not self.reported:
            return "prompt length: the server did not report usage.prompt_tokens"
        if self.exact == self.reported:
            return f"prompt length: all {self.reported} prompts had exactly their target token count"
        return (f"prompt length vs target: {self.exact}/{self.reported} exact, server - target "
                f"mean {self.mean_diff:+.1f}, min {self.min_diff:+d}, max {self.max_diff:+d} tokens")


@dataclass(frozen=True)
class BenchResult:
    """What a run produced.

    Attributes:
        records: one :class:`BenchRecord` per request sent, in workload order.
        client_rows: exact per-bucket rows from the client's records (then "all").
        server_rows: rows from the ``/metrics`` difference (histogram_quantile), None without
            ``metrics_url``; empty when that endpoint has no by-ISL families.
        lag: the client's event-loop lag report (``lag.trustworthy``, ``lag.verdict()``).
        results_path, summary_path: the files written (None without ``output_dir``).
        summary: the summary as written to ``summary.json`` (plain JSON data).
        model: the model used; endpoint: ``chat``/``completions``.
        dropped, clipped: requests dropped or clipped for exceeding the context.
        elapsed_s: wall time from the first send to the last end.
        prompt_deviation: server ``prompt_tokens`` vs targets.
        continuous_usage: whether continuous usage was requested.
    """

    records: tuple[BenchRecord, ...]
    client_rows: tuple[BucketRow, ...]
    server_rows: tuple[BucketRow, ...] | None
    lag: LagReport
    results_path: Path | None
    summary_path: Path | None
    summary: dict[str, Any]
    model: str
    endpoint: str
    dropped: int
    clipped: int
    elapsed_s: float
    prompt_deviation: PromptDeviation
    continuous_usage: bool

    @property
    def errors(self) -> int:
        """Failed requests."""
        return sum(1 for r in self.records if not r.ok)


@dataclass(frozen=True)
class _Item:
    isl: int
    osl: int
    hash_ids: tuple[int, ...]
    offset_ns: int


def _workload(config: BenchConfig, max_context: int | None) -> tuple[list[_Item], int, int, bool]:
    """Items in send order, dropped and clipped counts, and whether they carry their own schedule."""
    items: list[_Item] = []
    dropped = clipped = 0
    limit = config.max_requests
    if config.trace:
        rows: list[TraceRow] = read_trace(config.trace, config.trace_format)
        offsets = trace_offsets([r.offset_ns for r in rows], config.time_scale)
        end_ns = config.duration_s * NS_PER_S if config.duration_s is not None else None
        for row, off in zip(rows, offsets, strict=True):
            if (limit is not None and len(items) >= limit) or (end_ns is not None and off > end_ns):
                break
            if max_context is not None and row.isl_tokens + row.osl_tokens > max_context:
                if config.long_requests == "drop":
                    dropped += 1
                    continue
                clip_osl = min(row.osl_tokens, max(1, max_context // 2))
                row = clip_row(TraceRow(row.offset_ns, row.isl_tokens, clip_osl, row.hash_ids), max_context - clip_osl)
                clipped += 1
            items.append(_Item(row.isl_tokens, row.osl_tokens, row.hash_ids, off))
        return items, dropped, clipped, True
    isls = parse_length_dist(config.isl).sample(np.random.default_rng([config.seed, 1]), config.num_requests)
    osls = parse_length_dist(config.osl).sample(np.random.default_rng([config.seed, 2]), config.num_requests)
    for i, o in zip(isls, osls, strict=True):
        if limit is not None and len(items) >= limit:
            break
        if max_context is not None and i + o > max_context:
            if config.long_requests == "drop":
                dropped += 1
                continue
            o = min(o, max(1, max_context // 2))
            i = max_context - o
            clipped += 1
        items.append(_Item(i, o, (), 0))
    scheduled = config.rate is not None
    if config.rate is not None:
        offs = arrival_offsets(config.arrival, len(items), config.rate, config.seed)
        items = [_Item(it.isl, it.osl, it.hash_ids, off) for it, off in zip(items, offs, strict=True)]
        if config.duration_s is not None:
            items = [it for it in items if it.offset_ns <= config.duration_s * NS_PER_S]
    return items, dropped, clipped, scheduled


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


async def _discover(
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


async def _probe(
    session: aiohttp.ClientSession, url: str, model: str, config: BenchConfig, headers: dict[str, str]
) -> tuple[bool, bool]:
    """Which of continuous usage and ignore_eos the endpoint accepts (one tiny request each try)."""
    tries = [(True, config.ignore_eos), (False, config.ignore_eos), (False, False)]
    if config.continuous_usage is not None:
        return config.continuous_usage, config.ignore_eos
    for cont, eos in tries:
        body = build_body(config.endpoint, model, "hello", 1, continuous_usage=cont, ignore_eos=eos)
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                answer = await resp.read()
                if resp.status == 200:
                    return cont, eos
                if resp.status not in (400, 422):
                    raise ValueError(f"POST {url} answered HTTP {resp.status} to a one-token probe request: "
                                     f"{error_message(answer)}")
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ValueError(f"cannot reach {url}: {client_error_reason(exc)}") from None
    raise ValueError(f"POST {url} rejected a minimal streaming request (HTTP 400); check --model and --endpoint")


async def _scrape(session: aiohttp.ClientSession, url: str) -> Scrape:
    try:
        async with session.get(url, timeout=_CONTROL_TIMEOUT) as resp:
            if resp.status != 200:
                raise ValueError(f"GET {url} answered HTTP {resp.status}")
            text = await resp.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise ValueError(f"cannot scrape {url}: {client_error_reason(exc)}") from None
    return parse_scrape(text)


def _check_output_dir(out: Path) -> None:
    """Fail before any load is sent when results could not be written (ValueError, one line)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".servelens-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write results to {out}: {exc.strerror or exc}") from None


async def _quiet_scrape(session: aiohttp.ClientSession, config: BenchConfig) -> Scrape:
    """The "before" scrape, taken once the server has no request in flight (the probe request
    is recorded by a proxy just after its last bytes reach us); bounded to 3 s."""
    assert config.metrics_url is not None
    inflight = MetricNames(config.metrics_prefix).inflight
    deadline = time.monotonic() + 3.0
    while True:
        scrape = await _scrape(session, config.metrics_url)
        if scrape.value(inflight) <= 0 or time.monotonic() > deadline:
            return scrape
        await asyncio.sleep(0.02)


async def _server_rows(
    session: aiohttp.ClientSession, config: BenchConfig, before: Scrape, expect: int
) -> tuple[BucketRow, ...]:
    """Rows from ``after - before``; waits (bounded, 3 s) until the server has recorded ``expect`` requests,
    since a proxy records a request just after its last bytes reach the client."""
    assert config.metrics_url is not None
    names = MetricNames(config.metrics_prefix)
    deadline = time.monotonic() + 3.0
    while True:
        after = await _scrape(session, config.metrics_url)
        per_bucket, all_h = bucket_histograms(after, names, before)
        if not per_bucket and all_h.duration is None:
            break  # no servelens families at this URL
        seen = all_h.duration.count if all_h.duration is not None else 0
        if seen >= expect or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    return tuple(rows_from_histograms(per_bucket, all_h if all_h.duration or all_h.ttft else None))


class _Progress:
    """A rich progress bar refreshed at 2 Hz from the loop (not per request)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.done = 0
        self.errors = 0
        self._enabled = enabled
        self._total = total
        self._bar: Any = None
        self._task_id: Any = None
        self._refresher: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self._enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(), console=Console(stderr=True), auto_refresh=False, transient=False,
        )
        self._bar.start()
        self._task_id = self._bar.add_task("bench", total=self._total, errors=0)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    def _update(self) -> None:
        self._bar.update(self._task_id, completed=self.done, errors=self.errors)
        self._bar.refresh()

    async def _refresh(self) -> None:
        while True:
            self._update()
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._bar is not None:
            self._update()
            self._bar.stop()


async def run_bench(config: BenchConfig) -> BenchResult:
    """Run the bench described by ``config`` in the running event loop.

    Raises ValueError for user errors (unreachable URL, no model, bad trace, everything rejected),
    OSError for unreadable files. Request failures are recorded, not raised.
    """
    headers = {"Content-Type": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    tokenizer = load_tokenizer(config.tokenizer)
    builder = PromptBuilder(tokenizer)
    cap = config.concurrency if (config.concurrency is not None) else (None if (config.rate or config.trace) else 1)
    # no connector limit: the workers (closed loop) or the semaphore (open loop) bound the connections
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=config.request_timeout_s)
    if config.output_dir:
        _check_output_dir(Path(config.output_dir))
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        model, ctx = await _discover(session, config, headers)
        max_context = config.max_context if config.max_context is not None else ctx
        items, dropped, clipped, scheduled = _workload(config, max_context)
        if not items:
            if dropped:
                raise ValueError(f"the workload is empty: {dropped} requests were over the context ({max_context} "
                                 "tokens, ISL + OSL) and dropped; --long-requests clip keeps them, clipped to fit")
            raise ValueError("the workload is empty (every request was filtered out by --duration)")
        url = config.base_url + ENDPOINTS[config.endpoint]
        continuous, ignore_eos = await _probe(session, url, model, config, headers)

        def make_spec(i: int, it: _Item) -> RequestSpec:
            key = ("req", config.seed, i)
            prompt = builder.build(it.isl, key, it.hash_ids)
            body = build_body(config.endpoint, model, prompt, it.osl, continuous_usage=continuous,
                              ignore_eos=ignore_eos)
            return RequestSpec(i, it.offset_ns, it.isl, it.osl, body)

        prebuilt: list[RequestSpec] | None = None
        if sum(it.isl for it in items) <= PREBUILD_MAX_TOKENS:
            prebuilt = [make_spec(i, it) for i, it in enumerate(items)]

        def spec_at(i: int) -> RequestSpec:
            return prebuilt[i] if prebuilt is not None else make_spec(i, items[i])

        before = await _quiet_scrape(session, config) if config.metrics_url else None
        records: list[BenchRecord | None] = [None] * len(items)
        progress = _Progress(len(items), config.progress)
        lag = LagMonitor(threshold_ms=config.lag_threshold_ms)
        progress.start()
        lag.start()
        cpu_start = time.process_time()
        t_start = time.perf_counter_ns()
        stop_ns = t_start + round(config.duration_s * NS_PER_S) if config.duration_s is not None else None

        async def one(i: int) -> None:
            rec = await send_request(session, url, spec_at(i), headers)
            records[i] = rec
            progress.done += 1
            if not rec.ok:
                progress.errors += 1

        try:
            if scheduled:
                await _open_loop(items, one, t_start, cap, stop_ns)
            else:
                workers = min(cap or 1, len(items))
                ramp = config.ramp_up_s if config.ramp_up_s is not None else min(2.0, workers * 0.001)
                await _closed_loop(len(items), one, workers, stop_ns, ramp)
        except asyncio.CancelledError:  # Ctrl-C: keep what finished (servelens report --results reads it)
            if config.output_dir:
                write_results(Path(config.output_dir) / RESULTS_FILE, [r for r in records if r is not None])
            raise
        finally:
            client_cpu_s = time.process_time() - cpu_start
            lag_report = await lag.stop()
            await progress.stop()
        done = [r for r in records if r is not None]
        results_path = None
        if config.output_dir:  # before the server scrape: an interrupt or a failed scrape loses nothing
            results_path = write_results(Path(config.output_dir) / RESULTS_FILE, done)
        server_rows = None
        server_error = None
        if config.metrics_url and before is not None:
            expect = sum(1 for r in done if r.http_status is not None)
            try:
                server_rows = await _server_rows(session, config, before, expect)
            except ValueError as exc:  # the server's side is missing, the client's figures stand
                server_error = str(exc)
    buckets = IslBuckets(config.isl_buckets)
    client_rows = tuple(rows_from_samples(to_samples(done), buckets))
    elapsed = (max(r.end_ns for r in done) - min(r.send_ns for r in done)) / NS_PER_S if done else 0.0
    deviation = PromptDeviation.of(done)
    summary = _summary(config, model, done, client_rows, server_rows, lag_report, dropped, clipped, elapsed,
                       deviation, continuous, ignore_eos, tokenizer.name, max_context, client_cpu_s)

    if server_error is not None:
        summary["server_error"] = server_error
    summary_path = None
    if config.output_dir:
        out = Path(config.output_dir)
        summary_path = out / SUMMARY_FILE
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return BenchResult(
        records=tuple(done), client_rows=client_rows, server_rows=server_rows, lag=lag_report,
        results_path=results_path, summary_path=summary_path, summary=summary, model=model,
        endpoint=config.endpoint, dropped=dropped, clipped=clipped, elapsed_s=elapsed,
        prompt_deviation=deviation, continuous_usage=continuous,
    )


async def _open_loop(
    items: Sequence[_Item], one: Callable[[int], Any], t_start: int, cap: int | None, stop_ns: int | None
) -> None:
    sem = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()
    clock = time.perf_counter_ns

    async def guarded(i: int) -> None:
        if sem is None:
            await one(i)
            return
        async with sem:
            await one(i)

    loop = asyncio.get_running_loop()
    try:
        for i, it in enumerate(items):
            due = t_start + it.offset_ns
            if stop_ns is not None and due > stop_ns:
                break
            wait = due - clock()
            if wait > 0:
                await asyncio.sleep(wait / NS_PER_S)
            t = loop.create_task(guarded(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


async def _closed_loop(
    n: int, one: Callable[[int], Any], workers: int, stop_ns: int | None, ramp_s: float = 0.0
) -> None:
    it: Iterator[int] = iter(range(n))
    clock = time.perf_counter_ns

    async def worker(k: int) -> None:
        if ramp_s > 0 and k:
            await asyncio.sleep(ramp_s * k / workers)
        for i in it:
            if stop_ns is not None and clock() > stop_ns:
                return
            await one(i)

    await asyncio.gather(*(worker(k) for k in range(min(workers, n))))


def _summary(
    config: BenchConfig, model: str, records: Sequence[BenchRecord], client_rows: Sequence[BucketRow],
    server_rows: Sequence[BucketRow] | None, lag: LagReport, dropped: int, clipped: int, elapsed: float,
    deviation: PromptDeviation, continuous: bool, ignore_eos: bool, tokenizer: str, max_context: int | None,
    client_cpu_s: float,
) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    chunks = sum(len(r.chunk_offsets_ns) for r in records)
    out_tokens = sum(r.osl or 0 for r in ok)
    cfg = {k: v for k, v in asdict(config).items() if k != "api_key"}
    cfg["isl_buckets"] = list(config.isl_buckets)
    if config.trace is not None:  # the synthetic workload's settings were not used
        for unused in ("isl", "osl", "num_requests"):
            cfg[unused] = None
    errors_by_type: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors_by_type[r.error_type] = errors_by_type.get(r.error_type, 0) + 1
    return {
        "format": "servelens-bench-summary/1",
        "model": model,
        "endpoint": config.endpoint,
        "config": cfg,
        "tokenizer": tokenizer,
        "max_context": max_context,
        "continuous_usage": continuous,
        "ignore_eos": ignore_eos,
        "requests": len(records),
        "succeeded": len(ok),
        "errors": len(records) - len(ok),
        "errors_by_type": errors_by_type,
        "dropped_over_context": dropped,
        "clipped_to_context": clipped,
        "elapsed_s": elapsed,
        "requests_per_s": len(records) / elapsed if elapsed > 0 else None,
        "output_tokens_per_s": out_tokens / elapsed if elapsed > 0 else None,
        "chunks_per_s": chunks / elapsed if elapsed > 0 else None,
        "chunks": chunks,
        "client_cpu_s": client_cpu_s,
        "client_cpu_us_per_chunk": client_cpu_s / chunks * 1e6 if chunks else None,
        "tokens_per_chunk_from_usage": all(r.tokens_from_usage for r in ok) if ok else None,
        "prompt_tokens_vs_target": asdict(deviation),
        "event_loop_lag": asdict(lag) | {"trustworthy": lag.trustworthy},
        "client_rows": [asdict(r) for r in client_rows],
        "server_rows": [asdict(r) for r in server_rows] if server_rows is not None else None,
    }


def print_result(result: BenchResult, console: Console | None = None) -> None:
    """Print the client table (the client/server table instead when there are server rows; on a
    terminal too narrow for it, the client's table and then the server's) and a few summary lines to
    ``console`` (stdout by default)."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 150))  # a file or pipe: do not wrap the columns
    s = result.summary
    lines = [result.lag.verdict(), result.prompt_deviation.line()]
    if result.dropped or result.clipped:
        lines.append(f"over the context ({s['max_context']} tokens): {result.dropped} dropped, "
                     f"{result.clipped} clipped")
    if s.get("tokens_per_chunk_from_usage") is False:
        lines.append("the server sent no continuous usage: ITL counts one token per chunk")
    title = f"servelens bench: {result.model} ({result.endpoint}), {len(result.records)} requests"
    if not result.lag.trustworthy:
        title += " [CLIENT FIGURES NOT TRUSTWORTHY]"
    both = side_by_side(result.client_rows, result.server_rows, title=title + "\nClient vs server (gateway "
                        "/metrics)", notes=lines) if result.server_rows else None
    if both is not None and fit_to(both, console.width):  # one table: the client's figures beside the server's
        console.print(both)
    elif both is not None:  # a narrow terminal: the client's table, then the server's
        client = rich_table(result.client_rows, title=title + "\nClient (exact percentiles)", caption="\n".join(lines))
        server = rich_table(result.server_rows or [], title="Server (gateway /metrics)")
        fit_to(client, console.width)
        fit_to(server, console.width)
        console.print(client)
        console.print(server)
    else:
        table = rich_table(result.client_rows, title=title, caption="\n".join(lines))
        fit_to(table, console.width)
        console.print(table)
        if s.get("server_error"):
            console.print(f"server side: none, the final scrape failed: {s['server_error']}")
        elif result.server_rows is not None:
            console.print("server side: the /metrics endpoint has no servelens by-ISL histograms "
                          f"(prefix {s['config']['metrics_prefix']!r})")
    rps = s.get("requests_per_s")
    console.print(
        f"{s['requests']} requests, {s['errors']} errors in {result.elapsed_s:.1f} s"
        + (f" ({rps:.1f} req/s, {s['chunks_per_s']:.0f} chunks/s)" if rps else "")
    )
    if result.results_path is not None:
        console.print(f"results: {result.results_path}  summary: {result.summary_path}")


async def _run_until_signal(config: BenchConfig) -> BenchResult:
    """:func:`run_bench`, stopped by SIGTERM or SIGHUP as Ctrl-C stops it (the finished requests are
    written), then ``KeyboardInterrupt("SIGTERM")`` (or ``"SIGHUP"``) is raised. The signals are taken
    by the loop (a handler raising at an arbitrary point could be swallowed by a callback); outside
    the main thread they are left alone."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    got: list[str] = []

    def stop(sig: signal.Signals) -> None:
        if not got and task is not None:
            got.append(sig.name)
            task.cancel()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, stop, sig)
    try:
        return await run_bench(config)
    except asyncio.CancelledError:
        if got:
            raise KeyboardInterrupt(got[0]) from None
        raise
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: set from C, cannot be put back from Python
                signal.signal(sig, handler)  # the caller's (the demo's), not the default the loop leaves


def run_bench_sync(config: BenchConfig) -> BenchResult:
    """:func:`run_bench` in a fresh event loop (uvloop when installed). Raises KeyboardInterrupt on
    Ctrl-C, and ``KeyboardInterrupt("SIGTERM")``/``("SIGHUP")`` on those signals, once the requests
    that finished are written."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(_run_until_signal(config))
    return uvloop.run(_run_until_signal(config))
