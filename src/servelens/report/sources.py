"""Where ``servelens report`` gets its figures: a bench results file (exact percentiles), a
``/metrics`` scrape or saved text (since-start counts, or the difference of two scrapes), or a
Prometheus-compatible HTTP API (the dashboard's per-bucket queries).

One module past 400 lines: the three sources give the same rows (by ISL or by uncached bucket), and a
reader comparing how each is computed reads them side by side.

Every source gives a :class:`Report`: the per-bucket rows in numeric bucket order, then "all";
and, when the source has time, the p95 TTFT per bucket over time.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from servelens.core.buckets import IslBuckets, label_sort_key
from servelens.core.edges import edges_kind
from servelens.core.quantiles import percentile
from servelens.core.summary import ALL_LABEL, BucketRow, rows_from_histograms, rows_from_samples
from servelens.dashboards.queries import FIGURE_BY_KEY, UNCACHED_FIGURE_BY_KEY, Figure, model_matcher
from servelens.formats.columnar import columns_for
from servelens.formats.metrics_text import Scrape, bucket_histograms, parse_scrape
from servelens.prometheus.names import MetricNames
from servelens.report.columnar import p95_over_time_columns, rows_from_columns, timed_ttft
from servelens.report.over_time import time_bins
from servelens.report.promapi import PromClient, parse_duration_s
from servelens.report.results import TimedSample, load_timed_samples


@dataclass(frozen=True)
class TimeSeries:
    """p95 TTFT of one ISL bucket over time.

    Attributes:
        bucket: bucket label.
        times_s: unix times (s) of the points (bin starts for a results file).
        ttft_p95_s: p95 TTFT (s) at each time; None where the bucket had no requests.
        counts: requests behind each point (a results file); empty when the source cannot say.
        origin: whose measurement it is (``client``, ``server``), for the chart's title.
        method: how a point is made, for the chart's note (the quantile's definition, the window).
        window_s: the width (s) of the window behind each point (a results file's bins), None when
            ``method`` says it.
    """

    bucket: str
    times_s: tuple[float, ...]
    ttft_p95_s: tuple[float | None, ...]
    counts: tuple[int, ...] = ()
    origin: str = ""
    method: str = ""
    window_s: float | None = None


@dataclass(frozen=True)
class Report:
    """Rows (numeric bucket order, then "all"), optional time series, and a source description."""

    rows: tuple[BucketRow, ...]
    timeseries: tuple[TimeSeries, ...] = ()
    source: str = ""
    last_sample_s: float | None = None
    """A Prometheus API source: the time (unix s) of the newest sample the rows count, the last scrape;
    requests that ended after it are not in the rows until the next scrape (None for other sources)."""


# ---------------------------------------------------------------- results file (exact)


PER_POINT = 10
"""Requests per bucket and window the over-time chart aims at when it chooses its windows."""


def auto_bins(samples: Sequence[TimedSample], buckets: IslBuckets, lo: int = 3, hi: int = 30) -> int:
    """How many windows the p95 over time gets when none is asked for: about :data:`PER_POINT`
    requests per bucket (with requests) and window, between ``lo`` and ``hi`` windows; a p95 of a
    handful of requests is only their largest."""
    active = {buckets.label(s.sample.isl) for s in samples if s.sample.isl is not None}
    return max(lo, min(hi, len(samples) // (max(len(active), 1) * PER_POINT)))


def p95_over_time(
    samples: Sequence[TimedSample], buckets: IslBuckets, bins: int | None = None, min_bin_s: float = 1.0
) -> tuple[TimeSeries, ...]:
    """Bin requests by wall-clock send time and take the exact p95 TTFT of each bucket per bin.

    ``bins`` equal bins over the span of send times (None: :func:`auto_bins`), at least
    ``min_bin_s`` wide. Samples without a send time or an ISL are skipped; empty when no sample has
    a send time.
    """
    timed = [s for s in samples if s.send_time_s is not None and s.sample.isl is not None]
    if not timed:
        return ()
    t0, width, n = time_bins(timed, auto_bins(timed, buckets) if bins is None else bins, min_bin_s)
    per: dict[str, list[list[float]]] = {label: [[] for _ in range(n)] for label in buckets.labels}
    for s in timed:
        assert s.send_time_s is not None and s.sample.isl is not None
        if not s.sample.ok or s.sample.ttft_s is None:
            continue
        i = min(int((s.send_time_s - t0) // width), n - 1)
        per[buckets.label(s.sample.isl)][i].append(s.sample.ttft_s)
    times = tuple(t0 + i * width for i in range(n))
    method = "exact p95 of the requests sent in the window that starts there"
    out = []
    for label in buckets.labels:
        vals = tuple(percentile(v, 95) if v else None for v in per[label])
        if any(v is not None for v in vals):
            out.append(TimeSeries(label, times, vals, tuple(len(v) for v in per[label]), "client", method, width))
    return tuple(out)


def report_from_results(path: str | Path, buckets: IslBuckets, by: str = "isl") -> Report:
    """Exact per-bucket percentiles from a bench results file, and p95 TTFT over send time.

    ``by="uncached"``: rows by uncached prompt tokens (server ISL minus cached tokens; requests
    without cached tokens only in "all"), no time series. Raises ValueError for a missing or
    malformed file.
    """
    cols = columns_for(path)
    if cols is not None:  # the columns: the same figures, without an object per request or token
        rows = rows_from_columns(cols, buckets, by)
        if by == "uncached":
            return Report(tuple(rows), (), f"results {cols}, by uncached prompt tokens")
        return Report(tuple(rows), p95_over_time_columns(timed_ttft(cols, buckets), buckets), f"results {cols}")
    timed = load_timed_samples(path)
    rows = rows_from_samples([t.sample for t in timed], buckets, by)
    if by == "uncached":
        return Report(tuple(rows), (), f"results file {path}, by uncached prompt tokens")
    return Report(tuple(rows), p95_over_time(timed, buckets), f"results file {path}")


# ---------------------------------------------------------------- /metrics text


def read_metrics_text(source: str, timeout_s: float = 10.0) -> str:
    """The exposition text of a ``/metrics`` URL (http/https) or a saved file.

    Raises ValueError when the URL cannot be fetched or the file cannot be read.
    """
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=timeout_s) as resp:
                data: bytes = resp.read()
                return data.decode("utf-8", errors="replace")
        except urllib.error.HTTPError as exc:
            raise ValueError(f"cannot fetch {source}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ValueError(f"cannot fetch {source}: {getattr(exc, 'reason', exc)}") from None
    try:
        return Path(source).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read metrics file {source}: {exc.strerror or exc}") from None


def scrape(source: str) -> Scrape:
    """A parsed scrape of a ``/metrics`` URL or file. Raises ValueError naming the source."""
    text = read_metrics_text(source)  # its errors name the source already
    try:
        return parse_scrape(text)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def report_from_metrics(
    source: str,
    names: MetricNames,
    before: str | None = None,
    model: str | None = None,
    buckets: IslBuckets | None = None,
    by: str = "isl",
) -> Report:
    """Rows from a scrape (since-start counts) or from ``source - before`` (two scrapes), with
    ``histogram_quantile`` interpolation. ``buckets`` (optional) lists buckets the server may not
    have exported yet, as empty rows; it must cover the server's labels (:func:`check_buckets_match`).
    ``by="uncached"``: the rows per uncached bucket (the gateway's ``--uncached-buckets`` families).

    Raises ValueError when a source cannot be read or parsed, or has no by-ISL (by-uncached)
    families of ``names`` (wrong ``--metrics-prefix``, or bucketing off).
    """
    after = scrape(source)
    earlier = scrape(before) if before else None
    per_bucket, all_h = bucket_histograms(after, names, earlier, model, by)
    if not per_bucket:
        family = names.ttft_by_uncached if by == "uncached" else names.ttft_by_isl
        raise ValueError(
            f"{source} has no {family} series"
            + (f" for model {model!r}" if model else "")
            + (" (check --metrics-prefix and that the gateway runs with --uncached-buckets)" if by == "uncached"
               else " (check --metrics-prefix and that the server exports ISL buckets)")
        )
    if buckets is not None:
        check_buckets_match(per_bucket, buckets, "--uncached-buckets" if by == "uncached" else "--isl-buckets")
    rows = rows_from_histograms(per_bucket, all_h)
    if buckets is not None:
        rows = _with_empty_buckets(rows, buckets)
    desc = f"/metrics {source}" + (f" minus {before}" if before else " (since start)")
    return Report(tuple(rows), (), desc)


def check_buckets_match(server_labels: Iterable[str], buckets: IslBuckets, flag: str = "--isl-buckets") -> None:
    """Raise ValueError (one line naming the server's buckets and boundaries) when the server
    exports an ``isl_bucket`` label that ``buckets`` (the user's ``--isl-buckets``, or ``flag``) does
    not have. A server exporting a subset of ``buckets`` is fine (the rest show as empty rows)."""
    have = sorted(set(server_labels), key=label_sort_key)
    if not set(have) <= set(buckets.labels):
        uppers = [label.split("-", 1)[1] for label in have if "-" in label]
        kind = "uncached buckets" if flag == "--uncached-buckets" else "ISL buckets"
        raise ValueError(
            f"{flag} {buckets.spec} does not match the server's {kind} ({', '.join(have)}); "
            f"pass {flag} {','.join(uppers)} or leave it out to use the server's"
        )


def _empty_row(label: str) -> BucketRow:
    return BucketRow(label, 0, None, None, None, None, None, None, None, None, exact=False)


def _with_empty_buckets(rows: list[BucketRow], buckets: IslBuckets) -> list[BucketRow]:
    have = {r.bucket: r for r in rows}
    labels = sorted(set(buckets.labels) | {r.bucket for r in rows if r.bucket != ALL_LABEL}, key=label_sort_key)
    out = [have.get(label) or _empty_row(label) for label in labels]
    if ALL_LABEL in have:
        out.append(have[ALL_LABEL])
    return out


# ---------------------------------------------------------------- Prometheus HTTP API


def discover_buckets(client: PromClient, names: MetricNames, model: str | None = None, by: str = "isl") -> list[str]:
    """The ``isl_bucket`` (``by="uncached"``: ``uncached_bucket``) values present on the server, in
    numeric order (not string order)."""
    sel = model_matcher(model)
    label, family = ("uncached_bucket", names.duration_by_uncached) if by == "uncached" else (
        "isl_bucket", names.duration_by_isl)
    got = client.query(f"count by ({label}) ({family}_count{{{sel}}})")
    labels = {s.labels[label] for s in got if label in s.labels}
    return sorted(labels, key=label_sort_key)


def _series_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def counter_increase(points: Sequence[tuple[float, float]], start: float | None) -> float:
    """How much a counter grew over its samples in a window: the sum of the steps between
    consecutive samples, starting from ``start`` (the value at or before the window start; None
    when the series is younger than the window: count from the first sample in it). A drop is a
    counter reset: the step is then the new value (as in Prometheus' ``increase``). Never negative;
    no extrapolation. Points are ``(unix time s, value)`` in time order.
    """
    total = 0.0
    prev = start
    for _, v in points:
        if prev is not None:
            total += v - prev if v >= prev else v
        prev = v
    return total


def exact_increases(
    client: PromClient, counter: str, model: str, window: str, at_s: float, by: tuple[str, ...] = ("isl_bucket",)
) -> dict[tuple[str, ...], float]:
    """How much the counter ``counter`` (a ``_count``, ``_sum`` or ``_bucket`` series) grew in
    ``(at_s - window, at_s]``, per value of the labels ``by`` (``()``: one total), summed over series
    (models, instances).

    Per series: its raw samples in the window (``counter[window]``) minus its value at or before the
    window start (``counter offset window``, within the server's lookback); falling back to the
    first sample in the window when the series is younger than the window; resets handled as in
    :func:`counter_increase`. Unlike ``increase()``, which extrapolates to the window edges (up to
    about 2x the true count when the window holds few samples), this is the count the scrapes saw.
    Raises PromApiError.
    """
    sel = f"{counter}{{{model}}}"
    before = {_series_key(s.labels): s.value for s in client.query(f"{sel} offset {window}", at_s)}
    out: dict[tuple[str, ...], float] = {}
    for s in client.query(f"{sel}[{window}]", at_s):
        start = before.get(_series_key(s.labels))
        if start is not None and math.isnan(start):
            start = None
        key = tuple(s.labels.get(label, "") for label in by)
        out[key] = out.get(key, 0.0) + counter_increase([p for p in s.points if not math.isnan(p[1])], start)
    return out


def exact_counts(
    client: PromClient, counter: str, model: str, window: str, at_s: float, by: str | None = "isl_bucket"
) -> dict[str, float]:
    """:func:`exact_increases` per value of one label ``by`` (``""`` key for ``by`` None)."""
    got = exact_increases(client, counter, model, window, at_s, (by,) if by else ())
    return {(key[0] if key else ""): v for key, v in got.items()}


def le_kind(client: PromClient, bucket_series: str, model: str, at_s: float, metric: str) -> str | None:
    """Which ``le`` edges (:func:`~servelens.core.edges.edges_kind`) a histogram's ``_bucket`` series have
    on the server at ``at_s``; None when it has none. Raises PromApiError."""
    got = client.query(f"count by (le) ({bucket_series}{{{model}}})", at_s)
    edges = sorted(float(s.labels["le"]) for s in got if "le" in s.labels)
    return edges_kind(edges, metric) if edges else None


def _prom_row(
    client: PromClient,
    names: MetricNames,
    bucket: str | None,
    window: str,
    model: str,
    at_s: float,
    counts: dict[str, float],
    figures: dict[str, Figure] = FIGURE_BY_KEY,
) -> BucketRow:
    def fig(key: str) -> float | None:
        figure = figures.get(key)
        return None if figure is None else client.scalar(figure.expr(names, bucket, window, model), at_s)

    requests = counts.get(bucket if bucket is not None else "", 0.0)
    return BucketRow(
        bucket=bucket if bucket is not None else ALL_LABEL,
        requests=max(round(requests), 0),
        errors=None,
        ttft_p50_s=fig("ttft_p50"),
        ttft_p95_s=fig("ttft_p95"),
        ttft_p99_s=fig("ttft_p99"),
        itl_p50_s=fig("itl_p50"),
        itl_p95_s=fig("itl_p95"),
        mean_cached_tokens=fig("cached_mean"),
        ttft_mean_s=fig("ttft_mean"),
        exact=False,
        cache_hit_ratio=fig("cache_hit_ratio"),
    )


def report_from_prometheus(
    url: str,
    names: MetricNames,
    window: str = "5m",
    buckets: IslBuckets | Sequence[str] | None = None,
    model: str | None = None,
    end_s: float | None = None,
    range_s: float | None = 3600.0,
    timeout_s: float = 10.0,
    by: str = "isl",
) -> Report:
    """Rows from a Prometheus-compatible API over the last ``window`` before ``end_s`` (unix s,
    default now), using the dashboard's per-bucket queries (one query per bucket and figure); the
    "all" row uses the stock histograms. ``requests`` is the exact number of requests the scrapes
    saw end in the window (:func:`exact_counts` of the duration ``_count``: last value in the window
    minus the value at or before its start, not ``increase()``, which extrapolates); the percentiles
    and means are the dashboard's ``rate()`` ratios, where extrapolation cancels. With ``range_s``,
    also p95 TTFT per bucket over ``[end_s - range_s, end_s]``
    (``query_range``).

    ``buckets`` None: discover the bucket labels on the server (ordered numerically); an
    :class:`IslBuckets` must cover the server's labels (:func:`check_buckets_match`).
    ``by="uncached"``: the rows per uncached bucket (:data:`~servelens.dashboards.queries.UNCACHED_FIGURES`;
    no cached-token columns, no time series).
    Raises ValueError (a bad URL or window, an unreachable server, a rejected query).
    """
    parse_duration_s(window)  # a bad window is a one-line error before any query
    client = PromClient(url, timeout_s)
    at = time.time() if end_s is None else end_s
    m = model_matcher(model)
    uncached = by == "uncached"
    if buckets is None:
        labels: Sequence[str] = discover_buckets(client, names, model, by)
        if not labels:
            family = names.duration_by_uncached if uncached else names.duration_by_isl
            raise ValueError(
                f"{url} has no {family}_count series"
                + (f" for model {model!r}" if model else "")
                + " (check --metrics-prefix and the scrape config"
                + (", and that the gateway runs with --uncached-buckets)" if uncached else ")")
            )
    else:
        if isinstance(buckets, IslBuckets):
            check_buckets_match(discover_buckets(client, names, model, by), buckets,
                                "--uncached-buckets" if uncached else "--isl-buckets")
        labels = buckets.labels if isinstance(buckets, IslBuckets) else tuple(buckets)
    family, label_name, figures = ((names.duration_by_uncached, "uncached_bucket", UNCACHED_FIGURE_BY_KEY)
                                   if uncached else (names.duration_by_isl, "isl_bucket", FIGURE_BY_KEY))
    # the last scrape the rows count: its sample time (the duration _count of every model and bucket)
    last = client.scalar(f"max(timestamp({family}_count{{{m}}}))", at)
    by_bucket = exact_counts(client, f"{family}_count", m, window, at, by=label_name)
    total = exact_counts(client, f"{names.duration}_count", m, window, at, by=None)
    rows = [_prom_row(client, names, label, window, m, at, by_bucket, figures) for label in labels]
    rows.append(_prom_row(client, names, None, window, m, at, total, FIGURE_BY_KEY))
    kinds = {metric: le_kind(client, f"{family}_bucket", m, at, metric) for metric, family in
             (("ttft", names.ttft_by_uncached if uncached else names.ttft_by_isl),
              ("itl", names.itl_by_uncached if uncached else names.itl_by_isl))}
    rows = [replace(r, ttft_le_edges=kinds["ttft"], itl_le_edges=kinds["itl"]) for r in rows]
    series: tuple[TimeSeries, ...] = ()
    if range_s and not uncached:
        step = max(range_s / 240, 1.0)
        series = prometheus_p95_over_time(client, names, labels, window, m, at - range_s, at, step)
    return Report(tuple(rows), series, f"Prometheus API {url}, window {window}",
                  last_sample_s=last if last is not None and math.isfinite(last) else None)


def prometheus_p95_over_time(
    client: PromClient,
    names: MetricNames,
    labels: Sequence[str],
    window: str,
    model: str,
    start_s: float,
    end_s: float,
    step_s: float,
) -> tuple[TimeSeries, ...]:
    """p95 TTFT per bucket over time with ``query_range`` (the dashboard's p95 panel queries)."""
    fig = FIGURE_BY_KEY["ttft_p95"]
    method = (f"histogram_quantile(0.95) of the by-ISL histogram's rate over the {window} before it (that "
              f"window smooths the line), every {step_s:.3g} s")
    out = []
    for label in labels:
        got = client.query_range(fig.expr(names, label, window, model), start_s, end_s, step_s)
        if not got:
            continue
        pts = got[0].points
        out.append(TimeSeries(
            label, tuple(t for t, _ in pts), tuple(None if math.isnan(v) else v for _, v in pts),
            origin="server", method=method,
        ))
    return tuple(out)
