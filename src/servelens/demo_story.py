"""``servelens demo`` tells the story per-bucket metrics exist for (issue 17, section 6): when the
single TTFT p95 climbs, did the system get slower, or did the traffic shift toward longer prompts?

Three phases on the embedded simulated engine, each a bench run through the gateway:

1. **baseline**: mostly chat traffic (prompt lengths of the packaged Azure conversation trace) with
   some long conversations (lengths of the packaged Mooncake trace), Poisson arrivals;
2. **traffic shift**: the same engine, most requests now long, arriving as much more slowly as
   keeps the prefill work per second what it was (the engine is as busy as in phase 1, so the
   buckets' own latency should not move: any move is the engine's head-of-line blocking, which
   explain reports as latency);
3. **engine slowed on long prompts**: phase 1's very traffic (the same lengths and times, new prompt
   texts) on an engine whose attention cost is ``slow_attention`` times higher: long prompts get much
   slower, short ones barely.

After each phase the per-bucket table (client and gateway: side by side, or one above the other
on a narrow terminal); after phases 2 and 3, ``servelens
explain``'s verdict against phase 1 and its per-bucket table; then ``report.html`` with the
"without and with" charts over the three phases: the single TTFT p95 line beside the same at phase
1's mix, then the per-bucket lines. The traces, results, summaries, the gateway's ``/metrics``
before and after each phase, and the explanations stay in the output folder, with the commands
that read them again. Outputs are capped at ``osl`` tokens to keep
the run to about a minute and a half on two cores.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

import servelens.demo as demo
from servelens.bench import BenchConfig, BenchResult, print_result, run_bench_sync
from servelens.bench.traces import packaged_trace, read_trace
from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.core.windows import window_mix
from servelens.demo_hop import gateway_ttft_by_id, hop_rows, print_hop
from servelens.report.explain import ExplainReport, explain_windows
from servelens.report.explain_output import bucket_table, to_json
from servelens.report.explain_windows import from_results
from servelens.report.html import write_html
from servelens.report.over_time import all_requests_over_time
from servelens.report.results import load_timed_samples
from servelens.report.sources import p95_over_time, read_metrics_text
from servelens.sim.model import MIN_SPEEDUP
from servelens.sim.presets import get_preset

CHAT_TRACE = "azure_conv_2023_500.csv"
LONG_TRACE = "mooncake_conversation_400.jsonl"
SCRAPES = ("metrics-before.txt", "metrics-after.txt")
"""The gateway's /metrics before and after each phase, saved in the phase's folder."""
PHASES = (("baseline", "phase 1: baseline"),
          ("shift", "phase 2: traffic shifted toward long prompts"),
          ("slow", "phase 3: phase 1's traffic, engine slowed on long prompts"))


@dataclass(frozen=True)
class StoryConfig:
    """The story's knobs (times in seconds, lengths in tokens).

    Attributes:
        phase_s: how long each phase sends requests.
        rate: phase 1's (and 3's) requests per second (Poisson); phase 2's is lower by the ratio of
            the mean prompt lengths, so that the prompt tokens per second stay the same.
        chat_share: share of chat-length requests in phase 1 and in the shifted phase 2.
        osl: output tokens of every request.
        slow_attention: phase 3's engine: attention cost times this.
        output_dir: where the traces, results, explanations and ``report.html`` go.
        sim_preset, sim_speedup: the simulated engine (every simulated time divided by the speedup).
        data_parallel_size: the engine's replicas (``sim --data-parallel-size``), each at real speed
            (speedup 1): per replica the load of one engine at speedup 16, at a real H100's
            per-request latencies (TTFT 15-2000 ms). At speedup 16 on one engine the short prompts'
            TTFTs were 4-7 ms, of which the client-gateway hop (1-2 ms) was a fifth to a third, and
            the server's percentiles could not come within 10 % of the client's
            (docs/benchmarks.md, the three-phase demo).
        sim_spin_us: the sim's ``--spin-us``: 0, since 16 step loops each yielding for the last
            millisecond before every step's deadline take CPU from the bench client and the gateway
            on two cores; a step then ends up to a timer tick (~1 ms) late, a sixth of the shortest
            real-speed step, and the client and the gateway time what the sim really sent.
        max_num_batched_tokens: the engine's step budget: prefill chunks this small keep a short
            prompt's wait behind a long one's prefill short (vLLM's chunked prefill), so that the
            phases' traffic barely slows the other buckets down.
        isl_buckets: the gateway's and the tables' boundaries.
        max_isl: longer prompts are clipped to this (it keeps the sim's own tokenizing, which
            holds its event loop, small beside the step times).
        max_context: the engine's context.
        seed: seeds the traffic and the prompt texts.
    """

    phase_s: float = 20.0
    rate: float = 6.0
    chat_share: tuple[float, float] = (0.75, 0.25)
    osl: int = 16
    max_isl: int = 20_000
    slow_attention: float = 6.0
    output_dir: str = "servelens-demo"
    sim_preset: str = "llama-3.1-8b-h100"
    sim_speedup: float = 1.0
    data_parallel_size: int = 16
    sim_spin_us: int = 0
    max_num_batched_tokens: int = 2048
    isl_buckets: tuple[int, ...] = DEFAULT_ISL_BOUNDARIES
    max_context: int = 32768
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in (("duration", self.phase_s), ("rate", self.rate)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.sim_speedup) and self.sim_speedup >= MIN_SPEEDUP):
            raise ValueError(f"speedup must be a finite number >= {MIN_SPEEDUP:g}, got {self.sim_speedup}")
        if self.data_parallel_size < 1:
            raise ValueError(f"data-parallel-size must be >= 1, got {self.data_parallel_size}")
        if not all(0 <= s <= 1 for s in self.chat_share):
            raise ValueError("chat shares must be within [0, 1]")
        get_preset(self.sim_preset)
        object.__setattr__(self, "isl_buckets", IslBuckets.parse(self.isl_buckets).boundaries)


@dataclass(frozen=True)
class StoryResult:
    """Each phase's bench result, both explanations against phase 1, and the report's path."""

    benches: dict[str, BenchResult]
    explanations: dict[str, ExplainReport]
    report_path: Path


def _pools(config: StoryConfig) -> tuple[list[int], list[int]]:
    """Prompt lengths of the chat and the long-conversation traces, clipped to ``max_isl``."""
    top = min(config.max_isl, config.max_context - config.osl - 64)  # room for the chat template's tokens
    return ([min(r.isl_tokens, top) for r in read_trace(packaged_trace(CHAT_TRACE))],
            [min(r.isl_tokens, top) for r in read_trace(packaged_trace(LONG_TRACE))])


def phase_rate(config: StoryConfig, chat_share: float) -> float:
    """Requests per second that keep phase 1's prompt tokens per second at ``chat_share``."""
    chat, long = (float(np.mean(p)) for p in _pools(config))
    mean = lambda share: share * chat + (1 - share) * long  # noqa: E731
    return config.rate * mean(config.chat_share[0]) / mean(chat_share)


def write_trace(path: Path, config: StoryConfig, chat_share: float, seed: int) -> Path:
    """A Mooncake-format trace of Poisson arrivals over ``phase_s`` at :func:`phase_rate`, whose
    prompt lengths are drawn from the packaged chat trace with probability ``chat_share``, else from
    the long-conversation trace (clipped to ``max_isl``); no shared prefixes (no ``hash_ids``)."""
    chat, long = _pools(config)
    rng = np.random.default_rng([config.seed, seed])
    rate = phase_rate(config, chat_share)
    t, lines = 0.0, []
    while True:
        t += float(rng.exponential(1 / rate))
        if t >= config.phase_s:
            break
        pool = chat if rng.random() < chat_share else long
        isl = pool[int(rng.integers(len(pool)))]
        lines.append(json.dumps({"timestamp": round(t * 1000, 3), "input_length": isl,
                                 "output_length": config.osl, "hash_ids": []}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def _stack(config: StoryConfig, out: Path, console: Console, slow: bool) -> Iterator[str]:
    """Engine and gateway up (the slowed engine with ``slow``); yields the gateway's URL."""
    base = get_preset(config.sim_preset).params
    args = ["sim", "--preset", config.sim_preset, "--speedup", str(config.sim_speedup),
            "--max-model-len", str(config.max_context), "--seed", "0",
            "--max-num-batched-tokens", str(config.max_num_batched_tokens), "--spin-us", str(config.sim_spin_us)]
    if config.data_parallel_size > 1:
        args += ["--data-parallel-size", str(config.data_parallel_size)]
    if slow:
        args += ["--prefill-attn-s-per-token-pair", repr(base.prefill_attn_s_per_token_pair * config.slow_attention)]
    tag = "slow" if slow else "normal"
    # the engine's own times of every request (arrival, each token), for benchmarks/demo_accuracy.py
    args += ["--truth-log", str(out / f"sim-{tag}-truth.jsonl")]
    # demo.ServerProcess: the launcher the trace replay uses (and its tests replace)
    with demo.ServerProcess(args, log_path=out / f"sim-{tag}.log") as sim:
        what = (f"attention cost x{config.slow_attention:g} (long prompts slow down most)" if slow
                else f"preset {config.sim_preset}")
        console.print(f"[bold]engine[/]  servelens sim at {sim.url}: {what}, speedup {config.sim_speedup:g}, "
                      f"{config.data_parallel_size} replica{'s' if config.data_parallel_size > 1 else ''}")
        buckets = IslBuckets(config.isl_buckets)
        # the request log: each request's exact TTFT, for benchmarks/demo_accuracy.py
        with demo.ServerProcess(["gateway", "--upstream", sim.url, "--isl-buckets", buckets.spec,
                                 "--request-log", str(out / f"gateway-{tag}-requests.jsonl")],
                                log_path=out / f"gateway-{tag}.log") as gw:
            console.print(f"[bold]gateway[/] servelens gateway at {gw.url} (metrics at {gw.url}/metrics)")
            yield gw.url


def _phase(config: StoryConfig, url: str, name: str, title: str, trace: Path, seed: int, out: Path,
           console: Console) -> BenchResult:
    console.print()
    console.rule(title, align="left")
    share = config.chat_share[1 if name == "shift" else 0]
    console.print(f"[bold]bench[/]   {title}: {share:.0%} chat-length prompts, {phase_rate(config, share):.1f} "
                  f"requests/s for {config.phase_s:g} s, trace {trace}")
    # the gateway's view of the phase, for servelens explain --metrics (the bench's one probe request is in it)
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / SCRAPES[0]).write_text(read_metrics_text(f"{url}/metrics"))
    bench = run_bench_sync(BenchConfig(
        url=url, trace=str(trace), seed=seed, max_context=config.max_context, long_requests="clip",
        isl_buckets=config.isl_buckets, metrics_url=f"{url}/metrics", output_dir=str(out / name),
        progress=console.is_terminal,
    ))
    (out / name / SCRAPES[1]).write_text(read_metrics_text(f"{url}/metrics"))
    print_result(bench, console)
    log = out / f"gateway-{'slow' if name == 'slow' else 'normal'}-requests.jsonl"  # _stack's request log
    print_hop(hop_rows(bench.records, gateway_ttft_by_id([log]), bench.server_rows, IslBuckets(config.isl_buckets)),
              console)
    return bench


def _explain(out: Path, name: str, console: Console) -> ExplainReport:
    report = explain_windows(from_results(str(out / "baseline"), str(out / name)))
    (out / f"explain-{name}.json").write_text(to_json(report))
    console.print()
    phase = dict(PHASES)[name].split(":")[0]  # "phase 2": the phase's own title was its rule above (80 columns)
    console.rule(f"servelens explain: {phase} against phase 1", align="left")
    for r in report.metrics:
        console.print(r.verdict_line, soft_wrap=True, highlight=False)
    ttft = report.metrics[0].explanation
    if ttft is not None:
        console.print(bucket_table(ttft, 0.95))
    scrapes = " ".join(str(out / phase / f) for phase in ("baseline", name) for f in SCRAPES)
    console.print(f"the whole explanation: servelens explain --results {out / 'baseline'} {out / name}\n"
                  f"the gateway's view: servelens explain --metrics {scrapes}", soft_wrap=True, highlight=False)
    return report


def run_story(config: StoryConfig, console: Console | None = None) -> StoryResult:
    """Run the three phases and write the report (blocking). Raises ServerStartError, ValueError or
    OSError on failures, KeyboardInterrupt on Ctrl-C, SIGTERM or SIGHUP (servers stopped first)."""
    with demo._terminate_as_interrupt():
        return _run(config, console or Console(width=None if sys.stdout.isatty() else 150))


def _run(config: StoryConfig, console: Console) -> StoryResult:
    out = Path(config.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write to --output-dir {out}: {exc.strerror or exc}") from None
    traces = {"baseline": write_trace(out / "traces" / "baseline.jsonl", config, config.chat_share[0], 1),
              "shift": write_trace(out / "traces" / "shift.jsonl", config, config.chat_share[1], 2)}
    traces["slow"] = traces["baseline"]  # the same traffic; the bench seed gives new prompt texts
    benches: dict[str, BenchResult] = {}
    explanations: dict[str, ExplainReport] = {}
    with _stack(config, out, console, slow=False) as url:
        for seed, (name, title) in enumerate(PHASES[:2], 1):
            benches[name] = _phase(config, url, name, title, traces[name], seed, out, console)
    explanations["shift"] = _explain(out, "shift", console)
    with _stack(config, out, console, slow=True) as url:
        benches["slow"] = _phase(config, url, "slow", PHASES[2][1], traces["slow"], 3, out, console)
    explanations["slow"] = _explain(out, "slow", console)
    path = _write_report(config, out, benches, explanations)
    console.print()
    console.print(f"[bold]report[/]  {path}")
    return StoryResult(benches, explanations, path)


def _write_report(config: StoryConfig, out: Path, benches: dict[str, BenchResult],
                  explanations: dict[str, ExplainReport]) -> Path:
    buckets = IslBuckets(config.isl_buckets)
    samples = {name: load_timed_samples(out / name) for name, _ in PHASES}
    baseline = from_results(str(out / "baseline"), str(out / "baseline")).windows["TTFT"][0]
    bins = 4  # per phase, as the all-requests line
    overall = all_requests_over_time([samples[name] for name, _ in PHASES], buckets, window_mix(baseline),
                                     "phase 1's bucket mix", bins=bins)
    marks = []
    for name, title in PHASES[1:]:
        starts = [s.send_time_s for s in samples[name] if s.send_time_s is not None]
        if starts:
            marks.append((min(starts), title.split(": ", 1)[1]))
    notes = [f"{dict(PHASES)[name]} against phase 1: {r.metrics[0].verdict_line}" for name, r in explanations.items()]
    return write_html(
        out / "report.html", benches["baseline"].client_rows,
        [ts for name, _ in PHASES for ts in p95_over_time(samples[name], buckets, bins=bins)],  # binned per phase
        title="servelens demo: slower, or did the traffic shift?",
        source=f"engine: servelens sim (preset {config.sim_preset}, speedup {config.sim_speedup:g}, "
               f"{config.data_parallel_size} replicas); client: exact "
               "percentiles from each phase's results.jsonl; mix-adjusted: each time bin's per-bucket TTFT at phase "
               "1's bucket mix",
        compare_rows=benches["shift"].client_rows, names=(PHASES[0][1], PHASES[1][1]),
        overall=overall, marks=marks, notes=notes, extra_tables=[(PHASES[2][1], benches["slow"].client_rows)],
    )
