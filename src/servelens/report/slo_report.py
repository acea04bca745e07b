"""SLO attainment for ``servelens report`` (one window): exact from a bench results file, bounds
from the by-ISL histograms of a ``/metrics`` scrape (or two) or a Prometheus range (exact counter
deltas over ``--window``), with lines that say which figures are bounds and why."""

from __future__ import annotations

import time
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.core.slo import (
    Attainment,
    AttainmentBounds,
    Slo,
    attainment,
    counted_attainment,
    histogram_attainment,
    parse_threshold,
    threshold_note,
)
from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import ExplainError, HistogramWindow
from servelens.dashboards.queries import model_matcher
from servelens.formats.metrics_text import Scrape, bucket_histograms
from servelens.formats.results import to_slo_request
from servelens.prometheus.names import MetricNames
from servelens.report.explain_windows import prometheus_window, read_records, span_s
from servelens.report.promapi import PromClient, parse_duration_s
from servelens.report.sources import exact_increases, scrape

COUNTER_NOTE = ("from the gateway's SLO counters: exact per request, for the SLOs the gateway was started with "
                "(--slo-ttft/--slo-itl there); requests are those with a bucket and a first token")

COUNTERS_NEED_SLO = "--slo-from counters: give the SLOs the gateway counts (--slo-ttft/--slo-itl)"
"""The one-line error of ``report`` and ``dashboard`` for ``--slo-from counters`` without an SLO."""


@dataclass(frozen=True)
class SloReport:
    """Attainment rows (exact, or bounds) of one window, and the lines that qualify them."""

    slo: Slo
    exact: tuple[Attainment, ...] | None
    bounds: tuple[AttainmentBounds, ...] | None
    notes: tuple[str, ...]


def slo_from_results(path: str, buckets: IslBuckets, slo: Slo) -> SloReport:
    """Exact attainment and goodput of a bench run (goodput over first send to last end).
    Raises ValueError for a missing, empty or malformed file."""
    records = read_records(path)
    span = span_s(records)
    rows = attainment([to_slo_request(r) for r in records], buckets, slo, span if span > 0 else 1e-9)
    return SloReport(slo, rows, None, ())


def histogram_notes(slo: Slo, ttft_edges: tuple[float, ...], itl_edges: tuple[float, ...], buckets: IslBuckets,
                    length_known: bool) -> tuple[str, ...]:
    """The lines that say which histogram SLO figures are bounds, and why."""
    notes = []
    for metric, th, edges in (("TTFT", slo.ttft, ttft_edges), ("ITL", slo.itl, itl_edges)):
        if th is not None:
            note = threshold_note(metric, th, edges, buckets)
            if note:
                notes.append(note)
    if slo.itl is not None:
        notes.append("ITL attainment from histograms is the share of tokens (the histogram counts tokens), not "
                     "of requests whose mean ITL met it; goodput with an ITL SLO needs per-request data")
    elif not length_known:
        notes.append("goodput needs the window's length, which a scrape does not carry")
    return tuple(notes)


def _from_histograms(ttft: dict[str, CumulativeHistogram], itl: dict[str, CumulativeHistogram],
                     buckets: IslBuckets, slo: Slo, length_s: float | None) -> SloReport:
    missing = [label for label in buckets.labels if label not in ttft or label not in itl]
    if len(missing) == len(buckets):
        raise ExplainError("no by-ISL TTFT and ITL histograms to judge the SLOs from")
    proto_t, proto_i = next(iter(ttft.values())), next(iter(itl.values()))

    def get(d: dict[str, CumulativeHistogram], label: str, proto: CumulativeHistogram) -> CumulativeHistogram:
        return d.get(label) or CumulativeHistogram(tuple((le, 0.0) for le, _ in proto.buckets), 0.0)

    t = [get(ttft, label, proto_t) for label in buckets.labels]
    i = [get(itl, label, proto_i) for label in buckets.labels]
    rows = histogram_attainment(t, i, buckets, slo, length_s)
    edges_t = tuple(le for le, _ in proto_t.buckets)
    edges_i = tuple(le for le, _ in proto_i.buckets)
    return SloReport(slo, None, rows, histogram_notes(slo, edges_t, edges_i, buckets, length_s is not None))


def slo_from_metrics(source: str, names: MetricNames, before: str | None, model: str | None,
                     buckets: IslBuckets, slo: Slo) -> SloReport:
    """Bounds from a scrape (since-start counts) or the difference of two. Raises ValueError."""
    per_bucket, _ = bucket_histograms(scrape(source), names, scrape(before) if before else None, model)
    ttft = {label: h.ttft for label, h in per_bucket.items() if h.ttft is not None}
    itl = {label: h.itl for label, h in per_bucket.items() if h.itl is not None}
    return _from_histograms(ttft, itl, buckets, slo, None)


def slo_from_prometheus(url: str, names: MetricNames, window: str, model: str | None, buckets: IslBuckets,
                        slo: Slo, end_s: float | None = None) -> SloReport:
    """Bounds from exact counter deltas over the last ``window`` (goodput over the window's length).
    Raises ValueError."""
    span = parse_duration_s(window)
    end = time.time() if end_s is None else end_s
    windows = prometheus_window(PromClient(url), names, model_matcher(model), end - span, end, buckets.labels)
    ttft, itl = windows["TTFT"], windows["ITL"]
    assert isinstance(ttft, HistogramWindow) and isinstance(itl, HistogramWindow)
    return _from_histograms(dict(zip(ttft.labels, ttft.histograms, strict=True)),
                            dict(zip(itl.labels, itl.histograms, strict=True)), buckets, slo, span)


def check_thresholds(exported: dict[str, set[str]], slo: Slo, buckets: IslBuckets, where: str,
                     names: MetricNames) -> str | None:
    """The thresholds given must be those the gateway counts against: ``exported`` maps each ``slo`` kind
    (ttft, itl) to the ``threshold`` values of the gateway's ``{p}_slo_threshold_info`` (several when
    gateways, or one restarted, counted against different ones). Raises ExplainError (one line) for a
    threshold that differs, or several; returns a note when nothing was exported (a gateway from before
    the info gauge: the thresholds cannot be checked), else None."""
    if not exported:
        return (f"{where} exports no SLO thresholds ({names.slo_threshold_info}: a gateway older than it): the "
                "thresholds given are taken to be the ones it counts against, not checked")
    for kind, given in (("ttft", slo.ttft), ("itl", slo.itl)):
        specs = sorted(exported.get(kind, set()))
        if given is None or not specs:
            continue  # which kinds are counted is _check_kinds' to say
        flag = f"--slo-{kind}"
        if len(specs) > 1:
            raise ExplainError(f"{where}: the SLO counters mix {kind.upper()} thresholds ({', '.join(specs)}): "
                               "gateways, or one restarted, counted against different ones; read one window or "
                               "gateway")
        try:
            counted = parse_threshold(specs[0], buckets)
        except ExplainError:
            counted = None
        if counted is None or not counted.same_as(given):
            raise ExplainError(f"{where}: the gateway counts {kind.upper()} against {specs[0]}, {flag} gives "
                               f"{given.spec} (seconds): give the SLOs the gateway was started with ({flag} "
                               f"'{specs[0]}')")
    return None


def _thresholds_in_scrape(scrape_: Scrape, names: MetricNames) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for (sample, labels), value in scrape_.samples.items():
        d = dict(labels)
        if sample == names.slo_threshold_info and value > 0 and "slo" in d and "threshold" in d:
            out.setdefault(d["slo"], set()).add(d["threshold"])
    return out


def _check_kinds(present: set[str], slo: Slo, where: str) -> None:
    """The counters' ``slo`` values must be the SLOs given (the gateway's own)."""
    want = {k for k, th in (("ttft", slo.ttft), ("itl", slo.itl)) if th is not None} | {"all"}
    if not present:
        raise ExplainError(f"{where}: no SLO counters (start the gateway with --slo-ttft/--slo-itl, or read the "
                           "histograms: --slo-from histograms)")
    if present != want:
        raise ExplainError(f"{where}: the gateway counts slo={','.join(sorted(present))}, the flags give "
                           f"{','.join(sorted(want))}: give the SLOs the gateway was started with")


def _counted(buckets: IslBuckets, slo: Slo, requests: dict[str, float], met: dict[tuple[str, str], float],
             length_s: float | None, unchecked: str | None = None) -> SloReport:
    # the gateway registers every bucket's counters at zero: one missing beside finished requests is
    # missing data (a cut scrape, a relabelling), not 0 % met
    kinds = [k for k, th in (("ttft", slo.ttft), ("itl", slo.itl)) if th is not None] + ["all"]
    for label in buckets.labels:
        lost = [k for k in kinds if (label, k) not in met]
        if requests.get(label, 0.0) > 0 and lost:
            raise ExplainError(f"bucket {label}: {round(requests[label])} finished requests but no SLO counter "
                               f"series for slo={','.join(lost)} (a scrape cut short, or relabelled?)")
    rows = counted_attainment([(label, round(requests.get(label, 0.0)),
                                round(met.get((label, "ttft"), 0.0)), round(met.get((label, "itl"), 0.0)),
                                round(met.get((label, "all"), 0.0))) for label in buckets.labels], slo, length_s)
    notes = [COUNTER_NOTE] + ([] if length_s is not None else ["goodput needs the window's length, which a scrape "
                                                               "does not carry"]) + ([unchecked] if unchecked else [])
    return SloReport(slo, rows, None, tuple(notes))


def _scrape_counts(after: Scrape, before: Scrape | None, name: str, by: tuple[str, ...],
                   model: str | None) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for sign, sc in ((1.0, after), (-1.0, before)):
        if sc is None:
            continue
        for (sample, labels), v in sc.samples.items():
            d = dict(labels)
            if sample != name or (model and d.get("model") != model):
                continue
            key = tuple(d.get(k, "") for k in by)
            out[key] = out.get(key, 0.0) + sign * v
    return out


def counters_from_metrics(source: str, names: MetricNames, before: str | None, model: str | None,
                          buckets: IslBuckets, slo: Slo) -> SloReport:
    """Exact attainment from the gateway's SLO counters in a scrape (or the difference of two).
    Raises ValueError (ExplainError) when the counters are absent or count other SLOs."""
    after, prior = scrape(source), scrape(before) if before else None
    met = _scrape_counts(after, prior, names.slo_by_isl, ("isl_bucket", "slo"), model)
    _check_kinds({k[1] for k in met}, slo, source)
    unchecked = check_thresholds(_thresholds_in_scrape(after, names), slo, buckets, source, names)
    req = _scrape_counts(after, prior, names.duration_by_isl + "_count", ("isl_bucket",), model)
    return _counted(buckets, slo, {k[0]: v for k, v in req.items()}, {(k[0], k[1]): v for k, v in met.items()}, None,
                    unchecked)


def counters_from_prometheus(url: str, names: MetricNames, window: str, model: str | None, buckets: IslBuckets,
                             slo: Slo, end_s: float | None = None) -> SloReport:
    """Exact attainment and goodput from exact deltas of the gateway's SLO counters over ``window``.
    Raises ValueError."""
    span = parse_duration_s(window)
    client = PromClient(url)
    at = time.time() if end_s is None else end_s
    m = model_matcher(model)
    met = exact_increases(client, names.slo_by_isl, m, window, at, ("isl_bucket", "slo"))
    _check_kinds({k[1] for k in met}, slo, url)
    unchecked = check_thresholds(thresholds_in_window(client, names, model, window, at), slo, buckets, url,
                                 names)
    req = exact_increases(client, names.duration_by_isl + "_count", m, window, at)
    return _counted(buckets, slo, {k[0]: v for k, v in req.items()}, {(k[0], k[1]): v for k, v in met.items()}, span,
                    unchecked)


def thresholds_in_window(client: PromClient, names: MetricNames, model: str | None, window: str,
                         at_s: float) -> dict[str, set[str]]:
    """Every ``(slo, threshold)`` of ``{p}_slo_threshold_info`` seen in the ``window`` before ``at_s``;
    with ``model``, only from the scrape targets (``instance``, ``job``) that counted that model's
    requests (the info gauge has no model label). Raises PromApiError."""
    info = f"max_over_time({names.slo_threshold_info}[{window}])"
    if model:
        counted = f"max_over_time({names.slo_by_isl}{{{model_matcher(model)}}}[{window}])"
        info = f"({info} and on (instance, job) group by (instance, job) ({counted}))"
    out: dict[str, set[str]] = {}
    for s in client.query(f"count by (slo, threshold) ({info})", at_s):
        if "slo" in s.labels and "threshold" in s.labels:
            out.setdefault(s.labels["slo"], set()).add(s.labels["threshold"])
    return out
