"""Running an eval: items -> requests (bounded concurrency, retries, cache) -> scored records -> summary.

One module past 400 lines because it is one pipeline read top to bottom (send, retry, cache, score,
stop on a signal); the suites, scoring, statistics and cache live in their own modules.

Entry points: :class:`EvalConfig` (frozen), ``await run_eval(config)`` or :func:`run_eval_sync`, and
:func:`print_summary` (a rich table). :func:`run_eval_sync` stops on Ctrl-C, SIGTERM or SIGHUP and raises
:class:`EvalInterrupted` (how many items were done; every answer so far is in the cache, so the same run
again sends only the missing ones).
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from servelens.eval import bfcl
from servelens.eval.cache import CACHE_FILE, ResponseCache
from servelens.eval.client import Reply, Sender
from servelens.eval.records import RECORDS_FILE, SUMMARY_FILE, EvalRecord, run_figures, write_records
from servelens.eval.scoring import MadeCall, score_turn
from servelens.eval.suites import (
    DEFAULT_MAX_TOKENS,
    SUITE_NAMES,
    TextItem,
    dump_messages,
    packaged_data,
    read_text_suite,
    score_text,
    select,
)
from servelens.formats.table import fit_to, whole_words
from servelens.serving import client_error_reason

DEFAULT_OUTPUT_DIR = "eval-results"


@dataclass(frozen=True)
class EvalConfig:
    """What to run.

    Attributes:
        url: the endpoint's base URL (``/v1/chat/completions`` is appended; a trailing ``/v1`` is accepted).
        suite: one of :data:`~servelens.eval.suites.SUITE_NAMES`.
        model: model name; None takes the first model ``GET /v1/models`` lists.
        data: the suite's data file or folder (None: the cut shipped in the package).
        groups: only these groups (languages, subjects, API classes); None: all.
        limit: at most this many items per group (in total for a suite without groups).
        runs: repetitions of every item (run index 0..runs-1 is part of the cache key).
        temperature: sent when not None; None leaves the model's default (recorded either way).
        max_tokens: reply budget per request (None: the suite's default).
        shots: MMLU few-shot exemplars from the dev split.
        concurrency: items in flight at once.
        retries, backoff_s, timeout_s: per request (see :class:`~servelens.eval.client.Sender`).
        output_dir: results go to ``output_dir/<suite>/``.
        use_cache: False sends every request afresh (answers are still stored).
        tool_results: function calling: ``auto``, ``bfcl-eval`` or ``stand-in`` (:mod:`servelens.eval.bfcl`).
        max_steps: function calling: model replies per turn at most.
        api_key: sent as a bearer token (never written to files).
        progress: a rich progress bar on stderr.
    """

    url: str
    suite: str
    model: str | None = None
    data: str | None = None
    groups: tuple[str, ...] | None = None
    limit: int | None = None
    runs: int = 1
    temperature: float | None = None
    max_tokens: int | None = None
    shots: int = 0
    concurrency: int = 8
    retries: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 600.0
    output_dir: str = DEFAULT_OUTPUT_DIR
    use_cache: bool = True
    tool_results: str = "auto"
    max_steps: int = 4
    api_key: str | None = field(default=None, repr=False)
    progress: bool = False

    def __post_init__(self) -> None:
        if self.suite not in SUITE_NAMES:
            raise ValueError(f"unknown suite {self.suite!r}; available: {', '.join(SUITE_NAMES)}")
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {self.url!r}")
        for name, value, lo in (("runs", self.runs, 1), ("concurrency", self.concurrency, 1),
                                ("retries", self.retries, 0), ("shots", self.shots, 0),
                                ("max-steps", self.max_steps, 1)):
            if value < lo:
                raise ValueError(f"--{name} must be >= {lo}, got {value}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.temperature is not None and not (0 <= self.temperature < math.inf):
            raise ValueError(f"--temperature must be a number >= 0, got {self.temperature}")
        if self.shots and self.suite != "mmlu":
            raise ValueError("--shots is for the mmlu suite")

    @property
    def chat_url(self) -> str:
        """The chat-completions URL."""
        u = self.url.rstrip("/")
        return (u[:-3] if u.endswith("/v1") else u) + "/v1/chat/completions"


class EvalInterrupted(KeyboardInterrupt):
    """A run stopped by a signal before its end. ``args[0]`` is the signal's name (``"SIGINT"``,
    ``"SIGTERM"``, ``"SIGHUP"``; :func:`servelens.cli.main.interrupted` reads it).

    Attributes:
        done: item runs answered (or failed) and recorded before the stop.
        total: item runs the run had (items x runs; 0 when it stopped before the items were read).
        cache: the run's cache file, which holds every answer received.
    """

    def __init__(self, signal_name: str, done: int, total: int, cache: Path) -> None:
        super().__init__(signal_name)
        self.done = done
        self.total = total
        self.cache = cache


@dataclass
class RunProgress:
    """Progress of a run, updated by :func:`run_eval` as it goes (read when the run is stopped).

    Attributes:
        done: item runs recorded so far.
        total: item runs in the run (items x runs), set once the suite is read.
    """

    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class EvalResult:
    """A finished run: the records (item order), the summary written, and the folder."""

    records: tuple[EvalRecord, ...]
    summary: dict[str, Any]
    folder: Path


def _usage(responses: Sequence[Any]) -> dict[str, int]:
    total = {"prompt_tokens": 0, "completion_tokens": 0}
    for r in responses:
        u = r.get("usage") if isinstance(r, dict) else None
        if isinstance(u, dict):
            for k in total:
                v = u.get(k)
                total[k] += v if isinstance(v, int) and not isinstance(v, bool) else 0
    return total


def _message(response: Any) -> dict[str, Any] | None:
    try:
        msg = response["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        return None
    return msg if isinstance(msg, dict) else None


class _Run:
    """The state of one run: config, sender, counters, the records file."""

    def __init__(self, config: EvalConfig, sender: Sender, model: str, out: Path) -> None:
        self.config = config
        self.sender = sender
        self.model = model
        self.max_tokens = config.max_tokens or DEFAULT_MAX_TOKENS[config.suite]
        self.records: list[EvalRecord] = []
        self.partial = (out / RECORDS_FILE).open("w", encoding="utf-8")
        self.backend = bfcl.backend(config.tool_results) if config.suite == "bfcl" else None
        self.done = self.failed = self.cached = 0
        self.fresh_completion_tokens = 0

    def body(self, messages: list[dict[str, Any]], tools: Sequence[Any] | None = None) -> dict[str, Any]:
        b: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        if self.config.temperature is not None:
            b["temperature"] = self.config.temperature
        if tools:
            b["tools"] = list(tools)
        return b

    def add(self, rec: EvalRecord, replies: Sequence[Reply]) -> None:
        self.records.append(rec)
        self.partial.write(rec.to_json() + "\n")
        self.partial.flush()
        self.done += 1
        self.failed += rec.error is not None and not rec.cut
        self.cached += rec.cached
        self.fresh_completion_tokens += sum(_usage([r.response])["completion_tokens"] for r in replies if not r.cached)

    async def text_item(self, item: TextItem, run: int) -> None:
        body = self.body(dump_messages(item.messages))
        reply = await self.sender.send(body, run)
        msg = _message(reply.response)
        text = None if msg is None else (msg.get("content") or "")
        error = reply.error or (None if msg is not None else "the answer has no choices[0].message")
        extracted = method = None
        correct = None
        if error is None and text is not None:
            s = score_text(self.config.suite, item, text)
            extracted, method, correct = s.extracted, s.method, s.correct
        self.add(EvalRecord(item.id, item.group, run, (body,), text, extracted, method, correct,
                            None if correct is None else float(correct), reply.latency_ns / 1e9,
                            _usage([reply.response]), error, cached=reply.cached), [reply])

    async def bfcl_turn(self, conv: bfcl.Conversation, turn: int, run: int) -> None:
        assert self.backend is not None
        session = self.backend.session(conv, turn)
        messages = bfcl.reference_messages(conv, turn, session.history())
        bodies: list[dict[str, Any]] = []
        replies: list[Reply] = []
        made: list[MadeCall] = []
        text: str | None = None
        error: str | None = None
        cut = capped = False
        for step in range(self.config.max_steps):
            body = self.body(list(messages), conv.tools)
            bodies.append(body)
            reply = await self.sender.send(body, run)
            replies.append(reply)
            msg = _message(reply.response)
            if reply.error is not None or msg is None:
                cut = reply.context_exceeded
                error = "prompt longer than the context: turn cut" if cut else (
                    reply.error or "the answer has no choices[0].message")
                break
            calls, echo = bfcl.read_tool_calls(msg)
            text = msg.get("content") if isinstance(msg.get("content"), str) else None
            if not calls:
                break
            made += calls
            if step == self.config.max_steps - 1:
                capped = True
                break
            messages.append({"role": "assistant", "content": text, "tool_calls": echo})
            messages += [{"role": "tool", "tool_call_id": e["id"], "content": session.call(c)}
                         for c, e in zip(calls, echo, strict=True)]
        metrics: dict[str, Any] = {}
        correct = None
        if error is None:
            ts = score_turn(conv.expected[turn], made, conv.required)
            metrics = asdict(ts) | {"exact": ts.exact, "steps_capped": capped,
                                    "calls": [[c.name, c.arguments] for c in made]}
            correct = ts.decision_correct
        self.add(EvalRecord(conv.item_id(turn), conv.group, run, tuple(bodies), text,
                            ",".join(c.name for c in made) if error is None else None, None, correct,
                            None if correct is None else float(correct),
                            sum(r.latency_ns for r in replies) / 1e9, _usage([r.response for r in replies]),
                            error, cut=cut, cached=all(r.cached for r in replies), metrics=metrics), replies)


async def _discover(session: aiohttp.ClientSession, config: EvalConfig, headers: dict[str, str]) -> str:
    """The model to use: ``config.model``, else the first ``GET /v1/models`` lists. Raises ValueError."""
    url = config.chat_url.removesuffix("/chat/completions") + "/models"
    try:
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ValueError(f"cannot reach {url}: {client_error_reason(exc)}") from None
    except ValueError:
        data = None
    if config.model:
        return config.model
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
    if not first.get("id"):
        raise ValueError(f"{url} lists no models; pass --model")
    return str(first["id"])


def _load(config: EvalConfig) -> tuple[list[Any], dict[str, Any]]:
    """The selected work units (text items, or (conversation, turn) pairs) and notes for the summary."""
    data = Path(config.data) if config.data else None
    notes: dict[str, Any] = {"data": str(data) if data else f"packaged cut ({packaged_data(config.suite).name})"}
    if config.suite != "bfcl":
        return select(read_text_suite(config.suite, data, config.shots), config.groups, config.limit), notes
    convs, skipped = bfcl.read_bfcl(data if data is not None else packaged_data("bfcl"))
    convs = select(convs, config.groups, config.limit)
    notes["skipped_entries"] = skipped
    return [(c, t) for c in convs for t in range(len(c.turns))], notes


async def run_eval(config: EvalConfig, progress: RunProgress | None = None) -> EvalResult:
    """Run ``config`` in the running loop; records and summary under ``output_dir/<suite>/``.

    Raises ValueError (unreachable endpoint, bad suite data, unwritable folder) and OSError; failed
    requests are recorded and counted, not raised. Cancelled, it stops at once: the answers received
    are in the cache, the records of the finished items in the records file; ``progress`` (when
    given) says how far it got.
    """
    tally = progress if progress is not None else RunProgress()
    units, notes = _load(config)
    if not units:
        raise ValueError("no items selected")
    tally.total = len(units) * config.runs  # known before the endpoint is asked, for an early stop
    out = Path(config.output_dir) / config.suite
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write results to {out}: {exc.strerror or exc}") from None
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    cache = ResponseCache(out / CACHE_FILE, read=config.use_cache)
    wall0 = time.perf_counter_ns()
    connector = aiohttp.TCPConnector(limit=config.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = await _discover(session, config, headers)
        sender = Sender(session, config.chat_url, model, cache, config.retries, config.backoff_s,
                        config.timeout_s, headers)
        run = _Run(config, sender, model, out)
        total = tally.total
        bar = Progress(TextColumn("eval " + config.suite), BarColumn(), MofNCompleteColumn(),
                       TextColumn("failed {task.fields[failed]}  cached {task.fields[cached]}"),
                       TimeElapsedColumn(), console=Console(stderr=True), disable=not config.progress,
                       refresh_per_second=2)
        task = bar.add_task("eval", total=total, failed=0, cached=0)
        gate = asyncio.Semaphore(config.concurrency)

        async def one(unit: Any, k: int) -> None:
            async with gate:
                if isinstance(unit, TextItem):
                    await run.text_item(unit, k)
                else:
                    await run.bfcl_turn(unit[0], unit[1], k)
            tally.done = run.done
            bar.update(task, completed=run.done, failed=run.failed, cached=run.cached)

        try:
            with bar:
                await asyncio.gather(*(one(u, k) for k in range(config.runs) for u in units))
        finally:
            run.partial.close()
            cache.close()
    wall_s = (time.perf_counter_ns() - wall0) / 1e9
    order = {(u.id if isinstance(u, TextItem) else u[0].item_id(u[1])): i for i, u in enumerate(units)}
    records = tuple(sorted(run.records, key=lambda r: (r.run, order[r.item])))
    write_records(out / RECORDS_FILE, records)
    summary = {
        "suite": config.suite, "url": config.chat_url, "model": model,
        "temperature_sent": config.temperature is not None, "temperature": config.temperature,
        "max_tokens": run.max_tokens, "runs": config.runs, "items": len(units), "limit": config.limit,
        "groups": list(config.groups) if config.groups else None, "shots": config.shots,
        "tool_results": run.backend.name if run.backend is not None else None, **notes,
        "requests_sent": sender.sent, "retries": sender.retried, "cache_hits": run.cached,
        "wall_s": wall_s, "fresh_completion_tokens": run.fresh_completion_tokens,
        "output_tokens_per_s_during_eval": run.fresh_completion_tokens / wall_s if wall_s > 0 else None,
        **run_figures(config.suite, records),
        "per_group": {g: run_figures(config.suite, [r for r in records if r.group == g])["mean"]
                      for g in sorted({r.group for r in records if r.group is not None})},
    }
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return EvalResult(records, summary, out)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Signals that stop :func:`run_eval_sync` cleanly (Ctrl-C, ``kill``, a closed terminal)."""


async def _run_until_signal(config: EvalConfig) -> EvalResult:
    """:func:`run_eval`, cancelled by a signal of :data:`STOP_SIGNALS` (taken by the loop: a handler
    raising at an arbitrary point could be swallowed by a callback), then :class:`EvalInterrupted`.
    Outside the main thread the signals are left alone."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    tally = RunProgress()
    got: list[str] = []

    def stop(sig: signal.Signals) -> None:
        if not got and task is not None:
            got.append(sig.name)
            task.cancel()

    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            previous[sig] = signal.getsignal(sig)
            loop.add_signal_handler(sig, stop, sig)
    try:
        return await run_eval(config, tally)
    except asyncio.CancelledError:
        if got:
            raise EvalInterrupted(got[0], tally.done, tally.total,
                                  Path(config.output_dir) / config.suite / CACHE_FILE) from None
        raise
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: set from C, cannot be put back from Python
                signal.signal(sig, handler)


def run_eval_sync(config: EvalConfig) -> EvalResult:
    """:func:`run_eval` in a fresh event loop. Raises :class:`EvalInterrupted` on Ctrl-C, SIGTERM or
    SIGHUP (in the main thread), once the run has stopped and its files are closed."""
    return asyncio.run(_run_until_signal(config))


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_summary(result: EvalResult, console: Console | None = None) -> None:
    """The summary as a rich table (per run, mean ± SD, per group) and the counts under it."""
    s = result.summary
    console = console or Console()
    t = Table(title=whole_words(f"servelens eval {s['suite']}: {s['model']} at {s['url']}"))
    t.add_column("group")
    for k in range(s["runs"]):
        t.add_column(f"run {k}", justify="right")
    t.add_column(f"{s['headline']} (mean ± SD)", justify="right")
    sd = f" ± {_fmt(s['sd_over_runs'])}" if s["sd_over_runs"] is not None else ""
    t.add_row("all", *[_fmt(v) for v in s["per_run"]], _fmt(s["mean"]) + sd, style="bold")
    for g, v in s["per_group"].items():
        t.add_row(g, *(["" for _ in range(s["runs"])]), _fmt(v))
    temp = f"temperature {s['temperature']} sent" if s["temperature_sent"] else "no temperature sent (model default)"
    lines = [f"{s['items']} items x {s['runs']} runs; {temp}; max_tokens {s['max_tokens']}",
             f"requests sent {s['requests_sent']}, retries {s['retries']}, cache hits {s['cache_hits']}, "
             f"failed {s['failed']}, extraction failures {s['extraction_failures']}"]
    if s["suite"] == "bfcl":
        lines.append(f"tool-call precision {_fmt(s['tool_call_precision'])} recall {_fmt(s['tool_call_recall'])}; "
                     f"function names F1 {_fmt(s['function_name_f1'])}; exact turns {s['exact_turns']}; "
                     f"invalid JSON {s['invalid_json_calls']}, missing required {s['missing_required_calls']}, "
                     f"unknown functions {s['unknown_function_calls']}; cut turns {s['cut_turns']}; "
                     f"tool results: {s['tool_results']}")
    if "items_flipping_between_runs" in s:
        lines.append(f"items whose correctness differs between runs: {s['items_flipping_between_runs']}")
    if s["output_tokens_per_s_during_eval"] is not None and s["fresh_completion_tokens"]:
        lines.append(f"output tokens/s during this eval run (not a load test): "
                     f"{s['output_tokens_per_s_during_eval']:.1f}")
    fit_to(t, console.width)
    console.print(t)
    for line in lines:
        console.print(line, highlight=False)
    console.print(f"records: {result.folder / RECORDS_FILE}  summary: {result.folder / SUMMARY_FILE}")
