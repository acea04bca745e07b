"""The two windows ``servelens explain`` compares, read from one kind of source:

* two bench results files (per-request samples: exact figures, bootstrap intervals);
* two pairs of ``/metrics`` scrapes (files or URLs): the earlier window is the difference of the first
  pair, the later window that of the second;
* a Prometheus-compatible HTTP API and two time ranges: exact counter deltas at the range edges (the
  raw samples in the range minus the value at its start, as the report's exact request counts;
  not ``rate()``/``increase()``, which extrapolate to the edges and would bias the intervals).

Every reader gives a :class:`WindowPairs`: per metric (TTFT, ITL, request duration) the earlier and
the later window, what each window is, and how long it lasted when the source knows it (for
goodput). Bad input raises :class:`~servelens.core.windows.ExplainError` or ValueError with one line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.slo import SloRequest
from servelens.core.summary import BucketHistograms, CumulativeHistogram
from servelens.core.timing import NS_PER_S
from servelens.core.windows import BucketSamples, ExplainError, HistogramWindow, SampleWindow, Window, sample_window
from servelens.dashboards.queries import model_matcher
from servelens.formats.columnar import columns_for
from servelens.formats.metrics_text import bucket_histograms
from servelens.formats.results import BenchRecord, load_results, summary_isl_buckets, to_samples, to_slo_request
from servelens.prometheus.names import MetricNames
from servelens.report.explain_columns import ColumnRun
from servelens.report.promapi import PromClient, parse_duration_s
from servelens.report.sources import check_buckets_match, discover_buckets, exact_increases, scrape

METRICS = ("TTFT", "ITL", "duration")
"""The metrics explained, in output order."""


@dataclass(frozen=True)
class WindowPairs:
    """Both windows of every metric from one source.

    Attributes:
        labels: the ISL bucket labels in numeric order.
        windows: per metric of :data:`METRICS`, ``(earlier, later)``.
        before_desc, after_desc: what each window is (one line).
        before_s, after_s: each window's length (s; None when the source cannot say: saved scrapes).
        requests: per window, what the SLOs need of each request (bench results only; None for
            histograms, whose SLO figures are bounds from the TTFT and ITL windows).
        exact: True for per-request samples.
    """

    labels: tuple[str, ...]
    windows: dict[str, tuple[Window, Window]]
    before_desc: str
    after_desc: str
    before_s: float | None
    after_s: float | None
    requests: tuple[tuple[SloRequest, ...], tuple[SloRequest, ...]] | None = None

    @property
    def exact(self) -> bool:
        """True when the windows hold per-request samples."""
        return isinstance(self.windows["TTFT"][0], SampleWindow)

    @property
    def buckets(self) -> IslBuckets | None:
        """The buckets as :class:`IslBuckets` (None if the labels are not a standard set)."""
        try:
            return IslBuckets.from_labels(self.labels)
        except ValueError:
            return None


# ---------------------------------------------------------------- bench results (exact)


def read_records(path: str) -> list[BenchRecord]:
    """The records of a bench results file or folder. Raises ValueError (one line) for a missing,
    unreadable, malformed or empty file."""
    try:
        records = load_results(path)
    except OSError as exc:
        raise ValueError(f"cannot read results file {path}: {exc.strerror or exc}") from None
    if not records:
        raise ExplainError(f"{path}: no requests in it (an empty results file)")
    return records


def run_buckets(before: str, after: str, buckets: IslBuckets | None) -> IslBuckets:
    """``buckets``, else the bench runs' own (from their summary.json), which must agree."""
    if buckets is not None:
        return buckets
    a, b = summary_isl_buckets(before), summary_isl_buckets(after)
    if a is not None and b is not None and a != b:
        raise ExplainError(
            f"the two runs used different ISL buckets ({IslBuckets(a).spec} and {IslBuckets(b).spec}): "
            "pass --isl-buckets to put both runs' requests into the same buckets"
        )
    chosen = a or b
    return IslBuckets(chosen) if chosen else IslBuckets.default()


def _duration_window(records: Sequence[BenchRecord], buckets: IslBuckets) -> SampleWindow:
    """Request duration (send to end of stream) of the successful requests, per bucket."""
    values: list[list[float]] = [[] for _ in buckets.labels]
    for r in records:
        if r.ok:
            values[buckets.index(r.isl)].append(r.duration_s)
    return SampleWindow("duration", buckets.labels, tuple(BucketSamples(tuple(v)) for v in values))


def span_s(records: Sequence[BenchRecord]) -> float:
    """First send to last end (s), as the bench's elapsed time."""
    return (max(r.end_ns for r in records) - min(r.send_ns for r in records)) / NS_PER_S


def from_results(
    before: str, after: str, buckets: IslBuckets | None = None, slo: bool = True, values: bool = False
) -> WindowPairs:
    """The windows of two bench results files (``results.jsonl`` or their folders), bucketed with
    ``buckets`` or, when None, the runs' own boundaries (which must agree). ``slo`` False: a run read
    from its columns leaves ``requests`` None (they cost a pass over every token; the SLOs need them).
    A run read from its columns has a compact ITL window
    (:class:`~servelens.core.windows.BinnedSampleWindow`) unless ``values`` asks for every value
    (a :class:`~servelens.core.windows.SampleWindow`, 8 bytes a token: what ``--compare`` resamples).

    Raises ExplainError or ValueError (one line) for a missing, empty or malformed file, or runs
    bucketed differently.
    """
    chosen = run_buckets(before, after, buckets)
    got = [_run_windows(path, chosen, slo, values) for path in (before, after)]
    windows = {m: (got[0][0][m], got[1][0][m]) for m in METRICS}
    ra, rb = got[0][2], got[1][2]
    return WindowPairs(chosen.labels, windows, f"results {before}", f"results {after}", got[0][1], got[1][1],
                       (ra, rb) if ra is not None and rb is not None else None)


def _run_windows(
    path: str, buckets: IslBuckets, slo: bool, values: bool
) -> tuple[dict[str, Window], float, tuple[SloRequest, ...] | None]:
    """One run's windows, its span (s) and SLO requests: from its columns when it has fresh ones
    (:mod:`servelens.report.explain_columns`, no records), else from its records."""
    cols = columns_for(path)
    if cols is not None:
        run = ColumnRun(str(cols), buckets)
        if run.c.requests == 0:
            raise ExplainError(f"{path}: no requests in it (an empty results file)")
        itl: Window
        itl, sizes, sums = run.itl(with_sums=slo) if values else run.itl_window(slo)
        return ({"TTFT": run.ttft_window(), "ITL": itl, "duration": run.duration_window()}, run.span_s(),
                run.slo_requests(sizes, sums) if slo else None)
    recs = read_records(path)
    samples = to_samples(recs)
    windows: dict[str, Window] = {"TTFT": sample_window(samples, buckets, "ttft"),
                                  "ITL": sample_window(samples, buckets, "itl"),
                                  "duration": _duration_window(recs, buckets)}
    return windows, span_s(recs), tuple(map(to_slo_request, recs))


# ---------------------------------------------------------------- histograms (scrapes, Prometheus)


def _zero_like(h: CumulativeHistogram) -> CumulativeHistogram:
    return CumulativeHistogram(tuple((le, 0.0) for le, _ in h.buckets), 0.0)


def _histogram_windows(
    per_bucket: dict[str, BucketHistograms], stock: BucketHistograms, labels: Sequence[str], where: str
) -> dict[str, Window]:
    """TTFT, ITL and duration windows from per-bucket histograms (a label the source lacks is empty)."""
    out: dict[str, Window] = {}
    for metric, attr in (("TTFT", "ttft"), ("ITL", "itl"), ("duration", "duration")):
        got = {label: getattr(h, attr) for label, h in per_bucket.items() if getattr(h, attr) is not None}
        if not got:
            raise ExplainError(f"{where} has no by-ISL {metric} histograms")
        proto = next(iter(got.values()))
        hists = tuple(got.get(label) or _zero_like(proto) for label in labels)
        requests = None
        if metric == "ITL":  # one request's tokens are not independent: the variance counts requests
            durations = [per_bucket[label].duration if label in per_bucket else None for label in labels]
            requests = tuple(d.count if d is not None else 0.0 for d in durations)
        total = getattr(stock, attr)
        unbucketed = max(0.0, total.count - sum(h.count for h in hists)) if total is not None else 0.0
        try:
            out[metric] = HistogramWindow(metric, tuple(labels), hists, requests, unbucketed)
        except ExplainError as exc:
            raise ExplainError(f"{where}: {exc}") from None
    return out


def _labels(found: Sequence[str], buckets: IslBuckets | None) -> tuple[str, ...]:
    if buckets is None:
        return tuple(sorted(set(found), key=label_sort_key))
    check_buckets_match(found, buckets)
    return buckets.labels


def _pairs(
    before: dict[str, Window], after: dict[str, Window], labels: tuple[str, ...], descs: tuple[str, str],
    lengths: tuple[float | None, float | None],
) -> WindowPairs:
    return WindowPairs(labels, {m: (before[m], after[m]) for m in METRICS}, descs[0], descs[1], *lengths)


def from_scrapes(
    scrapes: Sequence[str], names: MetricNames, model: str | None = None, buckets: IslBuckets | None = None
) -> WindowPairs:
    """The windows of two pairs of ``/metrics`` scrapes (files or URLs, read in the order given):
    ``scrapes[1] - scrapes[0]`` is the earlier window, ``scrapes[3] - scrapes[2]`` the later.

    Raises ExplainError or ValueError (one line) for an unreadable scrape, a pair whose counters went
    down (swapped, or a restart in between), no by-ISL families, or buckets that differ between the
    windows.
    """
    if len(scrapes) != 4:
        raise ExplainError(f"--metrics takes four scrapes (two pairs: BEFORE_START BEFORE_END AFTER_START "
                           f"AFTER_END), got {len(scrapes)}")
    parsed = [scrape(s) for s in scrapes]
    found: list[dict[str, Window]] = []
    label_sets: list[tuple[str, ...]] = []
    for k, (start, end) in enumerate(((0, 1), (2, 3))):
        where = f"{scrapes[end]} minus {scrapes[start]}"
        try:
            per_bucket, stock = bucket_histograms(parsed[end], names, parsed[start], model)
        except ValueError as exc:
            raise ExplainError(f"{['earlier', 'later'][k]} window ({where}): {exc}") from None
        if not per_bucket:
            raise ExplainError(
                f"{scrapes[end]} has no {names.ttft_by_isl} series" + (f" for model {model!r}" if model else "")
                + " (check --metrics-prefix and that the server exports ISL buckets)"
            )
        labels = _labels(list(per_bucket), buckets)
        label_sets.append(labels)
        found.append(_histogram_windows(per_bucket, stock, labels, where))
    descs = (f"/metrics {scrapes[1]} minus {scrapes[0]}", f"/metrics {scrapes[3]} minus {scrapes[2]}")
    return _pairs(found[0], found[1], label_sets[0], descs, (None, None))


# ---------------------------------------------------------------- Prometheus HTTP API (exact deltas)


def _time_s(text: str, now_s: float) -> float:
    """``now``, ``now-10m``, unix seconds, or an ISO 8601 / RFC 3339 time (UTC unless it says)."""
    t = text.strip()
    if t == "now":
        return now_s
    if t.startswith("now-"):
        return now_s - parse_duration_s(t[4:])
    try:
        return float(t)
    except ValueError:
        pass
    try:
        stamp = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time (now, now-10m, unix seconds or 2026-01-31T12:00:00Z): {text!r}") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.now().astimezone().tzinfo).astimezone()
    return stamp.timestamp()


def parse_range(text: str, end_s: float, now_s: float) -> tuple[float, float]:
    """``(start, end)`` unix seconds of a range ``DURATION`` (ending at ``end_s``) or
    ``DURATION@END`` (END as in ``now-10m``, unix seconds or RFC 3339). Raises ValueError (one line)."""
    length, _, at = text.partition("@")
    try:
        span = parse_duration_s(length)
    except ValueError:
        raise ValueError(f"a range is DURATION or DURATION@END (1h, 10m@now, 1h@now-10m), got {text!r}") from None
    end = _time_s(at, now_s) if at else end_s
    return end - span, end


def _duration_text(seconds: float) -> str:
    """A Prometheus duration for a whole number of milliseconds."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def prometheus_window(
    client: PromClient, names: MetricNames, model: str, start_s: float, end_s: float, labels: tuple[str, ...],
) -> dict[str, Window]:
    """TTFT, ITL and duration windows of ``(start_s, end_s]`` from exact counter deltas of every
    by-ISL ``le`` series and ``_sum`` (``model``: a ready matcher). Raises ExplainError, PromApiError."""
    window = _duration_text(end_s - start_s)
    where = f"{client.url} from {_stamp(start_s)} to {_stamp(end_s)}"
    per_bucket: dict[str, dict[str, CumulativeHistogram]] = {label: {} for label in labels}
    stock: dict[str, CumulativeHistogram] = {}
    for attr, fam, total in (("ttft", names.ttft_by_isl, names.ttft), ("itl", names.itl_by_isl, names.itl),
                             ("duration", names.duration_by_isl, names.duration)):
        counts: dict[tuple[str, float], float] = {}
        for (label, le), v in exact_increases(client, f"{fam}_bucket", model, window, end_s,
                                              ("isl_bucket", "le")).items():
            key = (label, float(le))  # one edge whatever its spelling (le="1" or le="1.0")
            counts[key] = counts.get(key, 0.0) + v
        edges = sorted({le for _, le in counts})
        if not edges:
            raise ExplainError(f"{where}: no {fam}_bucket samples (is the range older than the data?)")
        sums = exact_increases(client, f"{fam}_sum", model, window, end_s)
        for label in labels:
            cum = tuple((le, counts.get((label, le), 0.0)) for le in edges)
            per_bucket[label][attr] = CumulativeHistogram(cum, sums.get((label,), 0.0))
        stock_count = exact_increases(client, f"{total}_count", model, window, end_s, ()).get((), 0.0)
        stock[attr] = CumulativeHistogram(((math.inf, stock_count),), 0.0)
    hists = {label: BucketHistograms(h["ttft"], h["itl"], h["duration"], None) for label, h in per_bucket.items()}
    return _histogram_windows(hists, BucketHistograms(stock["ttft"], stock["itl"], stock["duration"], None),
                              labels, where)


def from_prometheus(
    url: str,
    names: MetricNames,
    before: str,
    after: str,
    model: str | None = None,
    buckets: IslBuckets | None = None,
    now_s: float | None = None,
    timeout_s: float = 10.0,
) -> WindowPairs:
    """The windows of two time ranges on a Prometheus-compatible server, from exact counter deltas
    of the by-ISL histograms (every ``le`` series, ``_sum``; summed over models unless ``model``).

    ``after`` is a range ending now by default; ``before``, a bare DURATION, ends where ``after``
    starts (``--before 1h --after 10m``: the hour before the last ten minutes). The ranges must not
    overlap. Raises ExplainError or ValueError (one line).
    """
    client = PromClient(url, timeout_s)
    now = time.time() if now_s is None else now_s
    a_start, a_end = parse_range(after, now, now)
    b_start, b_end = parse_range(before, a_start, now)
    if b_end > a_start:
        raise ExplainError(f"the ranges overlap: the earlier one ends {b_end - a_start:g} s after the later one starts")
    found = discover_buckets(client, names, model)
    if not found:
        raise ExplainError(
            f"{url} has no {names.duration_by_isl}_count series" + (f" for model {model!r}" if model else "")
            + " (check --metrics-prefix and the scrape config)"
        )
    labels = _labels(found, buckets)
    m = model_matcher(model)
    windows = [prometheus_window(client, names, m, s, e, labels) for s, e in ((b_start, b_end), (a_start, a_end))]
    descs = tuple(f"Prometheus {url} {_stamp(s)} to {_stamp(e)}" for s, e in ((b_start, b_end), (a_start, a_end)))
    return _pairs(windows[0], windows[1], labels, (descs[0], descs[1]), (b_end - b_start, a_end - a_start))


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
