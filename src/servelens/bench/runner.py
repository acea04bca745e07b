"""Running a bench: workload -> requests on a schedule -> records -> the per-bucket table.

Library entry points (the CLI and ``servelens demo`` call these; :mod:`servelens.bench` exports them):

* :class:`~servelens.bench.config.BenchConfig` (frozen): what to run.
* ``await run_bench(config) -> BenchResult`` inside a running event loop, or
  :func:`run_bench_sync` (its own loop, uvloop when installed).
* :func:`~servelens.bench.printing.print_result` renders the table(s) with rich.

The steps live beside this module: :mod:`~servelens.bench.workload` (what to send),
:mod:`~servelens.bench.control` (model discovery, the probe, the scrapes), :mod:`~servelens.bench.loops`
(open and closed loop), :mod:`~servelens.bench.progress`, :mod:`~servelens.bench.summary`
(``BenchResult``, ``summary.json``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from servelens.bench.client import ENDPOINTS, RequestSpec, build_body, send_request
from servelens.bench.config import BenchConfig
from servelens.bench.control import PROBE_PROMPT, discover, fetch_server_rows, probe, quiet_scrape, template_tokens
from servelens.bench.lag import LagMonitor
from servelens.bench.loops import closed_loop, open_loop
from servelens.bench.progress import Progress
from servelens.bench.prompts import PromptBuilder, load_tokenizer
from servelens.bench.summary import BenchResult, PromptDeviation, build_summary
from servelens.bench.workload import WorkItem, build_workload
from servelens.core.buckets import IslBuckets
from servelens.core.slo import attainment
from servelens.core.summary import rows_from_samples
from servelens.core.timing import NS_PER_S
from servelens.formats.columnar import COLUMNS_DIR
from servelens.formats.columnar_write import write_columnar
from servelens.formats.results import (
    RESULTS_FILE,
    SUMMARY_FILE,
    BenchRecord,
    to_samples,
    to_slo_request,
    write_results,
)
from servelens.formats.slo_table import attainment_dicts, slo_dict
from servelens.serving import pending_stop_signal

PREBUILD_MAX_TOKENS = 30_000_000
"""Prompts are built before the run when the workload's total ISL is at most this many tokens
(about 180 MB of text with the sim's words); larger workloads build each prompt just before sending."""


TEMPLATE_MARGIN_TOKENS = 512
"""A request within this many tokens of the context makes the bench learn the endpoint's chat-template
tokens from its probe (templates add tens of tokens; a system prompt in the template more)."""


def _check_output_dir(out: Path) -> None:
    """Fail before any load is sent when results could not be written (ValueError, one line)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".servelens-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"cannot write results to {out}: {exc.strerror or exc}") from None


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
        model, ctx = await discover(session, config, headers)
        max_context = config.max_context if config.max_context is not None else ctx
        url = config.base_url + ENDPOINTS[config.endpoint]
        # the template's tokens are asked for only when some request comes near the context (a probe
        # request is one more request on the server's counters)
        near = max_context is not None and any(
            it.isl + it.osl > max_context - TEMPLATE_MARGIN_TOKENS for it in build_workload(config, None)[0])
        continuous, ignore_eos, reported = await probe(session, url, model, config, headers,
                                                       want_prompt_tokens=near)
        # the endpoint's chat template takes part of the context: what does not fit with it is dropped
        # or clipped to fit (a prompt clipped to the whole context failed on every engine with a template)
        template = template_tokens(reported, tokenizer.count_tokens(PROBE_PROMPT))
        fit_context = None if max_context is None else max(max_context - (template or 0), 2)
        items, dropped, clipped, scheduled = build_workload(config, fit_context)
        if not items:
            if dropped:
                raise ValueError(f"the workload is empty: {dropped} requests were over the context ({max_context} "
                                 f"tokens, ISL + OSL{f' + {template} of chat template' if template else ''}) and "
                                 "dropped; --long-requests clip keeps them, clipped to fit")
            raise ValueError("the workload is empty (every request was filtered out by --duration)")

        def make_spec(i: int, it: WorkItem) -> RequestSpec:
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

        before = await quiet_scrape(session, config) if config.metrics_url else None
        records: list[BenchRecord | None] = [None] * len(items)
        progress = Progress(len(items), config.progress)
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
                await open_loop(items, one, t_start, cap, stop_ns)
            else:
                workers = min(cap or 1, len(items))
                ramp = config.ramp_up_s if config.ramp_up_s is not None else min(2.0, workers * 0.001)
                await closed_loop(len(items), one, workers, stop_ns, ramp)
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
            # the same requests as columns: what servelens report reads fast (formats/columnar.py)
            write_columnar(Path(config.output_dir) / COLUMNS_DIR, done, results_path, IslBuckets(config.isl_buckets))
        server_rows = None
        server_uncached = None
        server_error = None
        all_from_buckets = False
        kind = None
        if config.metrics_url and before is not None:
            expect = sum(1 for r in done if r.http_status is not None)
            try:
                server_rows, server_uncached, all_from_buckets, kind = await fetch_server_rows(
                    session, config, before, expect)
            except ValueError as exc:  # the server's side is missing, the client's figures stand
                server_error = str(exc)
    buckets = IslBuckets(config.isl_buckets)
    client_rows = tuple(rows_from_samples(to_samples(done), buckets))
    client_uncached = (tuple(rows_from_samples(to_samples(done), IslBuckets(config.uncached_buckets), "uncached"))
                       if config.uncached_buckets is not None else None)
    elapsed = (max(r.end_ns for r in done) - min(r.send_ns for r in done)) / NS_PER_S if done else 0.0
    deviation = PromptDeviation.of(done)
    summary = build_summary(config, model, done, client_rows, server_rows, lag_report, dropped, clipped, elapsed,
                       deviation, continuous, ignore_eos, tokenizer.name, max_context, client_cpu_s, template)

    if server_error is not None:
        summary["server_error"] = server_error
    if client_uncached is not None:
        summary["client_rows_by_uncached"] = [asdict(r) for r in client_uncached]
        summary["server_rows_by_uncached"] = ([asdict(r) for r in server_uncached]
                                              if server_uncached is not None else None)
    if kind is not None:  # what served the scrape: the tables name it
        summary["server_kind"] = kind
    if all_from_buckets:  # a sidecar (--by-isl-only) exports no stock histograms
        summary["server_all_from_buckets"] = True
    slo = config.slo
    attained = None
    if slo is not None and done:
        attained = attainment([to_slo_request(r) for r in done], buckets, slo, elapsed if elapsed > 0 else 1e-9)
        summary["slo"] = {"slo": slo_dict(slo), "rows": attainment_dicts(attained)}
    summary_path = None
    if config.output_dir:
        out = Path(config.output_dir)
        summary_path = out / SUMMARY_FILE
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    return BenchResult(
        records=tuple(done), client_rows=client_rows, server_rows=server_rows, lag=lag_report,
        results_path=results_path, summary_path=summary_path, summary=summary, model=model,
        endpoint=config.endpoint, dropped=dropped, clipped=clipped, elapsed_s=elapsed,
        prompt_deviation=deviation, continuous_usage=continuous, slo=slo, attainment=attained,
        uncached_client_rows=client_uncached, uncached_server_rows=server_uncached,
    )


async def _run_until_signal(config: BenchConfig) -> BenchResult:
    """:func:`run_bench`, stopped by SIGTERM or SIGHUP as Ctrl-C stops it (the finished requests are
    written), then ``KeyboardInterrupt("SIGTERM")`` (or ``"SIGHUP"``) is raised. The signals are taken
    by the loop (a handler raising at an arbitrary point could be swallowed by a callback); one that a
    caller's handler recorded before (:func:`servelens.serving.note_stop_signal`) stops the run at once.
    Outside the main thread they are left alone."""
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
        if (name := pending_stop_signal()) is not None:
            # a caller's (the demo's) KeyboardInterrupt for it was raised where Python drops exceptions
            loop.call_soon(stop, signal.Signals[name])
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
