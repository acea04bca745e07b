"""``servelens demo``: the main job end to end on the embedded default.

Starts the simulated engine (a preset with prefix caching) and the gateway with ISL buckets on free
loopback ports as child processes, replays a cut of the real Mooncake conversation trace
(packaged with its license) through the gateway, time-compressed, then prints the per-bucket table
from the client and from the gateway's ``/metrics`` (side by side, or one above the other on a narrow
terminal), writes ``report.html`` and the
bench results, and stops everything. ``engine="vllm"`` runs the same against a real vLLM CPU
engine serving a tiny local model (:mod:`servelens.engines.vllm_cpu`); ``engine="llama.cpp"``
against llama.cpp's ``llama-server`` serving a real model, SmolLM2-135M-Instruct
(:mod:`servelens.engines.llama_cpp`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from servelens.bench import BenchConfig, BenchResult, print_result, run_bench_sync
from servelens.bench.traces import resolve_trace
from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.process import ServerProcess
from servelens.report.html import write_html
from servelens.report.sources import report_from_results
from servelens.serving import clear_stop_signals, note_stop_signal, pending_stop_signal
from servelens.sim.model import MIN_SPEEDUP

DEMO_TRACE = "mooncake_conversation_400.jsonl"
DEMO_TRACE_SMALL = "azure_conv_2023_500.csv"
"""The demo's trace for llama.cpp's real model on a CPU: Azure's conversation prompts (median ~1k
tokens) instead of Mooncake's (several thousand)."""
DEMO_PREFIX_CACHE_BLOCKS = 250_000
"""Prefix-cache blocks (16 tokens) for the demo's sim: 4M tokens, the scale of a host-memory KV offload
store (Mooncake, LMCache). With the preset's 320k tokens the conversation turns that share long prefixes
come back after their blocks were evicted, and every bucket shows only the shared first block."""
ENGINES = ("sim", "vllm", "llama.cpp")
ENGINE_EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm": ("tokenizers", ("tokenizers",)),
    "llama.cpp": ("llamacpp", ("tokenizers", "gguf")),
}
"""Per real engine: the package extra it needs and the modules in it. The bench builds prompts and the
gateway counts them with the engine's own ``tokenizer.json`` (``tokenizers``); llama.cpp's is made from
its GGUF model file (``gguf``). Extras, not core dependencies: ``tokenizers`` brings ``huggingface_hub``
and its own dependencies (~30 MB), which the gateway in front of an engine that reports usage never needs."""


def check_engine_packages(engine: str) -> None:
    """Raise ValueError (one line, with the ``pip install`` that fixes it) when a Python package the
    ``engine``'s demo needs is not installed; nothing for the sim."""
    extra, modules = ENGINE_EXTRAS.get(engine, ("", ()))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"--engine {engine} needs the {' and '.join(repr(m) for m in missing)} package"
                         f"{'s' if len(missing) > 1 else ''} (the bench and the gateway count tokens with the "
                         f"engine's tokenizer): pip install -e '.[{extra}]' in a checkout, pip install "
                         f"'servelens[{extra}]' otherwise")


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs. Times in seconds, lengths in tokens.

    Attributes:
        engine: ``sim`` (default, the embedded simulated engine), ``vllm`` (vLLM CPU build with a
            tiny local model; installs it on first use, minutes) or ``llama.cpp`` (llama-server
            with SmolLM2-135M-Instruct Q4_1; builds it on first use, minutes, cached per machine).
        trace: a Mooncake JSONL or Azure CSV trace (path or packaged name).
        time_scale: trace timestamps are multiplied by this (0.5 replays twice as fast).
        duration_s: stop starting requests after this many seconds of replay (None: whole trace).
        max_requests: send at most this many requests (None: no limit).
        output_dir: where ``report.html``, ``results.jsonl``, ``summary.json`` and logs go.
        keep_running: leave the engine and gateway up after the run until Ctrl-C.
        engine_port, gateway_port: the loopback ports of the engine and the gateway (0: a free one,
            new each run); fixed ones let a Prometheus scrape config be reused across runs.
        sim_preset, sim_speedup: the simulated engine's timing preset and speedup (every
            simulated time divided by it).
        isl_buckets: the gateway's and the table's ISL boundaries.
        max_context: requests over this context are clipped (the trace has prompts beyond 100k).
    """

    engine: str = "sim"
    trace: str = DEMO_TRACE
    time_scale: float = 0.5
    duration_s: float | None = None
    max_requests: int | None = None
    output_dir: str = "servelens-demo"
    keep_running: bool = False
    engine_port: int = 0
    gateway_port: int = 0
    sim_preset: str = "llama-3.1-8b-h100"
    sim_speedup: float = 8.0
    isl_buckets: tuple[int, ...] = DEFAULT_ISL_BOUNDARIES
    max_context: int = 32768

    def __post_init__(self) -> None:
        # checked here, before anything starts (NaN and inf would otherwise fail late and obscurely)
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; expected one of {', '.join(ENGINES)}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time-scale must be a finite number > 0, got {self.time_scale}")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration must be a finite number of seconds > 0, got {self.duration_s}")
        for name in ("engine_port", "gateway_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name.replace('_', '-')} must be 0..65535 (0: a free port), got {port}")
        if self.engine_port and self.engine_port == self.gateway_port:
            raise ValueError(f"engine-port and gateway-port must differ, both are {self.engine_port}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max-requests must be >= 1, got {self.max_requests}")
        if not (math.isfinite(self.sim_speedup) and self.sim_speedup >= MIN_SPEEDUP):
            raise ValueError(f"speedup must be a finite number >= {MIN_SPEEDUP:g}, got {self.sim_speedup}")
        object.__setattr__(self, "isl_buckets", IslBuckets.parse(self.isl_buckets).boundaries)


@dataclass(frozen=True)
class DemoResult:
    """What the demo produced: the bench result (client rows, gateway rows), the report path,
    and the engine and gateway URLs (down again unless ``keep_running``)."""

    bench: BenchResult
    report_path: Path
    engine_url: str
    gateway_url: str


@contextlib.contextmanager
def _engine(config: DemoConfig, out: Path, console: Console) -> Iterator[tuple[str, str | None, int]]:
    """Yield ``(engine URL, tokenizer path or None, context for the bench in tokens)``.

    For vLLM and llama.cpp the bench's context leaves room for the chat template's tokens
    (``bench_max_context`` of :class:`~servelens.engines.vllm_cpu.VllmServer` and
    :class:`~servelens.engines.llama_cpp.LlamaServer`), so clipped prompts still fit.
    """
    if config.engine == "sim":
        args = ["sim", "--preset", config.sim_preset, "--speedup", str(config.sim_speedup),
                "--max-model-len", str(config.max_context), "--seed", "0",
                "--prefix-cache-blocks", str(DEMO_PREFIX_CACHE_BLOCKS), "--port", str(config.engine_port)]
        with ServerProcess(args, log_path=out / "sim.log") as sim:
            console.print(f"[bold]engine[/]  servelens sim at {sim.url}")
            console.print(f"        preset {config.sim_preset}, speedup {config.sim_speedup:g} (every simulated "
                          f"time divided by {config.sim_speedup:g}), prefix cache of "
                          f"{DEMO_PREFIX_CACHE_BLOCKS * 16 / 1e6:.0f}M tokens (as with a KV offload store)")
            yield sim.url, None, config.max_context
        return
    if config.engine == "llama.cpp":
        from servelens.engines.llama_cpp import LlamaServer

        console.print("[bold]engine[/]  llama.cpp's llama-server with SmolLM2-135M-Instruct "
                      "(the first run on a machine builds it: minutes)")
        with LlamaServer(port=config.engine_port) as llama:
            console.print(f"[bold]engine[/]  llama-server at {llama.url}, model {llama.model}, "
                          f"{llama.n_slots} slots of {llama.ctx_per_slot} tokens")
            yield llama.url, str(llama.tokenizer_path), llama.bench_max_context
        return
    from servelens.engines.vllm_cpu import VllmServer

    console.print("[bold]engine[/]  vLLM CPU build with a tiny local model (first run installs it: minutes)")
    with VllmServer(port=config.engine_port) as srv:
        console.print(f"[bold]engine[/]  vLLM at {srv.url}, model {srv.model}")
        yield srv.url, str(srv.tokenizer_path), srv.bench_max_context


def _wait_for_interrupt(console: Console) -> None:
    stop = threading.Event()
    # Ctrl-C, SIGTERM and a closed terminal (SIGHUP) all stop them the same way (exit 0: the way to end it)
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        console.print("[bold]--keep-running[/]: engine and gateway stay up; press Ctrl-C to stop them.")
        while not stop.wait(0.2):  # short waits: the signal handler runs between them in any case
            pass
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt while the demo runs, so that ``kill`` or a
    closed terminal stops the engine and gateway (children in their own sessions, which the signal
    does not reach) instead of leaving them running. Only in the main thread (Python's rule for
    signal handlers); elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        note_stop_signal(name)  # if Python drops this exception (raised in a finalizer), the bench stops on it
        raise KeyboardInterrupt(name)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
        if (name := pending_stop_signal()) is not None:  # dropped, and after the bench: the demo still stops
            raise KeyboardInterrupt(name)
    finally:
        clear_stop_signals()
        for s, h in previous.items():
            signal.signal(s, h)


def run_demo(config: DemoConfig, console: Console | None = None) -> DemoResult:
    """Run the demo (blocking). Raises ServerStartError/ValueError/OSError on failures, and
    KeyboardInterrupt on Ctrl-C, SIGTERM or SIGHUP (the engine and gateway are stopped first)."""
    with _terminate_as_interrupt():
        return _run_demo(config, console)


def _run_demo(config: DemoConfig, console: Console | None) -> DemoResult:
    check_engine_packages(config.engine)  # before anything is installed, built or started
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    out = Path(config.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write to --output-dir {out}: {exc.strerror or exc}") from None
    buckets = IslBuckets(config.isl_buckets)
    trace = str(resolve_trace(config.trace))  # before the engine and gateway start
    with _engine(config, out, console) as (engine_url, tokenizer, max_context):
        gw_args = ["gateway", "--upstream", engine_url, "--isl-buckets", buckets.spec,
                   "--port", str(config.gateway_port),
                   "--request-log", str(out / "gateway-requests.jsonl")]
        if tokenizer:
            gw_args += ["--tokenizer", tokenizer]
        with ServerProcess(gw_args, log_path=out / "gateway.log") as gw:
            console.print(f"[bold]gateway[/] servelens gateway at {gw.url} (metrics at {gw.url}/metrics)")
            console.print(f"[bold]bench[/]   replaying {config.trace} at time scale {config.time_scale:g}"
                          + (f", for {config.duration_s:g} s" if config.duration_s else "")
                          + f", prompts clipped to {max_context} tokens")
            bench = run_bench_sync(BenchConfig(
                url=gw.url,
                trace=trace,
                time_scale=config.time_scale,
                duration_s=config.duration_s,
                max_requests=config.max_requests,
                tokenizer=tokenizer,
                max_context=max_context,
                long_requests="clip",
                isl_buckets=config.isl_buckets,
                metrics_url=f"{gw.url}/metrics",
                output_dir=str(out),
                progress=console.is_terminal,
            ))
            print_result(bench, console)
            assert bench.results_path is not None
            report = report_from_results(bench.results_path, buckets)
            report_path = write_html(
                out / "report.html", bench.client_rows, report.timeseries,
                title=f"servelens demo: {config.trace} through the gateway",
                source=f"engine {config.engine} at {engine_url}; client: exact percentiles from "
                       f"{bench.results_path.name}; gateway: histogram_quantile over its /metrics difference",
                compare_rows=bench.server_rows, names=("client", "gateway"),
            )
            console.print(f"[bold]report[/]  {report_path}")
            if config.keep_running:
                _wait_for_interrupt(console)
    return DemoResult(bench, report_path, engine_url, gw.url)
