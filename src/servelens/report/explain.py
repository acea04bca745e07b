"""``servelens explain`` as a library call: the windows of a source (:mod:`servelens.report.explain_windows`)
in, an :class:`ExplainReport` out: per metric the shift-share split, the counterfactual and the
verdict (:func:`servelens.core.decompose.explain`), optionally both windows at a reference mix, and
SLO attainment in both windows (exact from bench results, bounds from histograms).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from servelens.core.decompose import DEFAULT_QUANTILES, Counterfactual, Explanation, counterfactual, explain
from servelens.core.slo import Attainment, AttainmentBounds, Slo, attainment, histogram_attainment
from servelens.core.uncertainty import INTERVALS
from servelens.core.verdict import verdict_line
from servelens.core.windows import ExplainError, HistogramWindow, Mix, Window, aligned_mix
from servelens.report.explain_windows import METRICS, WindowPairs
from servelens.report.slo_report import histogram_notes


@dataclass(frozen=True)
class ExplainOptions:
    """How to explain (times in s).

    Attributes:
        quantiles: the quantiles shown (0.95 for p95); headline: the one the verdict line names.
        confidence: interval level; resamples, seed: the bootstrap's (bench results only).
        intervals: ``auto``, ``bootstrap`` or ``normal``: how the intervals of bench results are made
            (:func:`~servelens.core.uncertainty.split_intervals`; histograms have the normal approximation).
        min_share: the verdict's materiality threshold (:func:`~servelens.core.decompose.decide_verdict`).
        reference: a reference mix: both windows are also shown at it (None: not shown).
        slo: SLO thresholds (None: no attainment).
        metrics: which of :data:`~servelens.report.explain_windows.METRICS` to explain.
    """

    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    headline: float = 0.95
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    min_share: float = 0.1
    intervals: str = "auto"
    reference: Mix | None = None
    slo: Slo | None = None
    metrics: tuple[str, ...] = METRICS

    def __post_init__(self) -> None:
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise ExplainError(f"unknown metric {', '.join(unknown) or '(none)'}: choose from {', '.join(METRICS)}")
        if self.intervals not in INTERVALS:
            raise ExplainError(f"unknown intervals {self.intervals!r}: choose from {', '.join(INTERVALS)}")
        if not any(abs(q - self.headline) < 1e-12 for q in self.quantiles):
            object.__setattr__(self, "quantiles", tuple(sorted({*self.quantiles, self.headline})))


@dataclass(frozen=True)
class AtReference:
    """Both windows' per-bucket latency at the reference mix: the mix-adjusted figures."""

    mix: Mix
    before: Counterfactual
    after: Counterfactual


@dataclass(frozen=True)
class MetricResult:
    """One metric: its explanation and verdict line, or why there is none (``skipped``)."""

    metric: str
    explanation: Explanation | None
    verdict_line: str
    reference: AtReference | None = None
    skipped: str | None = None


@dataclass(frozen=True)
class SloResult:
    """SLO attainment in both windows: :class:`~servelens.core.slo.Attainment` rows (exact) or
    :class:`~servelens.core.slo.AttainmentBounds` rows (histograms), with ``notes`` saying which
    figures are bounds and why."""

    slo: Slo
    exact: bool
    before: tuple[Attainment, ...] | tuple[AttainmentBounds, ...]
    after: tuple[Attainment, ...] | tuple[AttainmentBounds, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ExplainReport:
    """Everything ``servelens explain`` prints (see the module docstring)."""

    labels: tuple[str, ...]
    before_desc: str
    after_desc: str
    before_s: float | None
    after_s: float | None
    exact: bool
    metrics: tuple[MetricResult, ...]
    slo: SloResult | None = None


def _reference(before: Window, after: Window, mix: Mix, quantiles: Sequence[float]) -> tuple[AtReference, str | None]:
    """Both windows at ``mix``; a bucket with a share but no data in one window borrows the other's."""
    mix = aligned_mix(mix, before.labels)
    note = None
    lacking = [label for label, share, a, b in zip(mix.labels, mix.shares, before.counts(), after.counts(), strict=True)
               if share > 0 and min(a, b) <= 0]
    if lacking:
        note = (f"bucket {', '.join(lacking)} has a share in the reference mix but no {before.metric} observations "
                "in one window: there it takes the other window's latency")
    got = AtReference(mix, counterfactual(before, mix, quantiles, fallback=after),
                      counterfactual(after, mix, quantiles, fallback=before))
    return got, note


def _empty(before: Window, after: Window) -> str | None:
    for name, w in (("earlier", before), ("later", after)):
        if w.counts().sum() <= 0:
            return f"no {w.metric} observations in the {name} window"
    return None


def explain_windows(pairs: WindowPairs, options: ExplainOptions | None = None) -> ExplainReport:
    """Explain every metric of ``pairs`` (module docstring).

    TTFT must have observations in both windows; ITL or duration without any (e.g. one-token
    replies have no ITL) is skipped with a line saying so. Raises ExplainError (one line) for
    windows that do not compare, a reference mix or SLO table that does not match the buckets.
    """
    opts = options or ExplainOptions()
    results = []
    for metric in opts.metrics:
        before, after = pairs.windows[metric]
        empty = _empty(before, after)
        if empty is not None and metric != "TTFT":
            results.append(MetricResult(metric, None, f"{metric}: not explained, {empty}", skipped=empty))
            continue
        e = explain(before, after, opts.quantiles, opts.confidence, opts.resamples, opts.seed, opts.min_share,
                    opts.intervals)
        ref = None
        if opts.reference is not None:
            ref, note = _reference(before, after, opts.reference, opts.quantiles)
            if note:
                e = _with_note(e, note)
        results.append(MetricResult(metric, e, verdict_line(e, opts.headline), ref))
    slo = _slo(pairs, opts.slo) if opts.slo is not None else None
    return ExplainReport(pairs.labels, pairs.before_desc, pairs.after_desc, pairs.before_s, pairs.after_s,
                         pairs.exact, tuple(results), slo)


def _with_note(e: Explanation, note: str) -> Explanation:
    return replace(e, limitations=(*e.limitations, note))


def _slo(pairs: WindowPairs, slo: Slo) -> SloResult:
    buckets = pairs.buckets
    if buckets is None:
        raise ExplainError(f"SLOs need standard ISL bucket labels, got {', '.join(pairs.labels)}")
    if pairs.requests is not None:
        rows = [attainment(reqs, buckets, slo, max(length or 0.0, 1e-9)) for reqs, length in
                zip(pairs.requests, (pairs.before_s, pairs.after_s), strict=True)]
        return SloResult(slo, True, rows[0], rows[1], ())
    got = []
    for k, length in enumerate((pairs.before_s, pairs.after_s)):
        ttft, itl = pairs.windows["TTFT"][k], pairs.windows["ITL"][k]
        assert isinstance(ttft, HistogramWindow) and isinstance(itl, HistogramWindow)
        got.append(histogram_attainment(ttft.histograms, itl.histograms, buckets, slo, length))
    ttft, itl = pairs.windows["TTFT"][0], pairs.windows["ITL"][0]
    assert isinstance(ttft, HistogramWindow) and isinstance(itl, HistogramWindow)
    notes = histogram_notes(slo, ttft.edges, itl.edges, buckets, pairs.before_s is not None)
    return SloResult(slo, False, got[0], got[1], notes)
