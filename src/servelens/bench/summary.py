"""What a bench run produced: :class:`BenchResult`, the ``summary.json`` written beside the results
file (:func:`build_summary`) and how far the server's prompt lengths were from the targets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servelens.bench.config import BenchConfig
from servelens.bench.lag import LagReport
from servelens.core.clumping import detect_clumping
from servelens.core.slo import Attainment, Slo
from servelens.core.summary import BucketRow
from servelens.formats.results import BenchRecord


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
        slo: the SLOs judged (None: none given); attainment: per bucket, then "all" (exact, from
            the records), None without an SLO.
        uncached_client_rows, uncached_server_rows: the rows per uncached bucket (client: exact, from
            each response's usage; server: the gateway's by-uncached families, empty when it has none),
            None without ``uncached_buckets``.
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
    slo: Slo | None = None
    attainment: tuple[Attainment, ...] | None = None
    uncached_client_rows: tuple[BucketRow, ...] | None = None
    uncached_server_rows: tuple[BucketRow, ...] | None = None

    @property
    def errors(self) -> int:
        """Failed requests."""
        return sum(1 for r in self.records if not r.ok)


def build_summary(
    config: BenchConfig, model: str, records: Sequence[BenchRecord], client_rows: Sequence[BucketRow],
    server_rows: Sequence[BucketRow] | None, lag: LagReport, dropped: int, clipped: int, elapsed: float,
    deviation: PromptDeviation, continuous: bool, ignore_eos: bool, tokenizer: str, max_context: int | None,
    client_cpu_s: float, template_tokens: int | None = None,
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
        # what the endpoint adds to every prompt (its chat template), learned from the probe; requests
        # are fitted into max_context less this (None: the endpoint reported no usage for the probe)
        "template_tokens": template_tokens,
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
        "token_clumping": asdict(detect_clumping(r.chunk_offsets_ns for r in ok)),
        "client_rows": [asdict(r) for r in client_rows],
        "server_rows": [asdict(r) for r in server_rows] if server_rows is not None else None,
    }
