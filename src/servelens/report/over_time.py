"""The all-requests TTFT quantile over time, raw and at a reference bucket mix, from bench results:
the "without per-bucket metrics" view (one line for every prompt) beside the line a mix shift
cannot move (:func:`servelens.core.decompose.counterfactual` of each time bin's requests).

Both lines use the same quantile definition (inverted CDF, the counterfactual's), so at the
reference mix they coincide. The requests come in segments (the demo's phases; one segment for
one run), each binned on its own. A bin with no request in a bucket that the reference mix weights
takes that bucket's latency from its whole segment (the segment is one steady setup, so that is the
best estimate there is) and is marked; a segment without that bucket at all leaves a gap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelens.core.buckets import IslBuckets
from servelens.core.decompose import counterfactual, observed_quantiles
from servelens.core.windows import ExplainError, Mix, aligned_mix, sample_window
from servelens.report.results import TimedSample


@dataclass(frozen=True)
class AllRequestsSeries:
    """The all-requests quantile per time bin (bin starts, unix s), raw and at ``reference``;
    ``borrowed`` marks bins whose adjusted figure took a bucket from the bin's segment; a None
    point separates segments."""

    q: float
    times_s: tuple[float, ...]
    raw_s: tuple[float | None, ...]
    adjusted_s: tuple[float | None, ...]
    borrowed: tuple[bool, ...]
    reference: str


def time_bins(samples: Sequence[TimedSample], bins: int, min_bin_s: float) -> tuple[float, float, int]:
    """``(first send time, bin width, number of bins)`` for ``bins`` equal bins over the send times,
    at least ``min_bin_s`` wide. Raises ValueError when no sample has a send time."""
    times = [s.send_time_s for s in samples if s.send_time_s is not None]
    if not times:
        raise ValueError("no send times")
    t0, t1 = min(times), max(times)
    width = max((t1 - t0) / bins, min_bin_s)
    return t0, width, min(bins, int((t1 - t0) // width) + 1)  # the last send time joins the last bin


def all_requests_over_time(
    segments: Sequence[Sequence[TimedSample]], buckets: IslBuckets, reference: Mix,
    description: str = "the reference mix", bins: int = 4, min_bin_s: float = 1.0, q: float = 0.95,
) -> AllRequestsSeries | None:
    """The TTFT ``q`` quantile of all requests per send-time bin (``bins`` per segment), raw and at
    ``reference`` (module docstring). None when no request has a send time. Raises ExplainError
    when ``reference`` does not match ``buckets``."""
    mix = aligned_mix(reference, buckets.labels)
    times: list[float] = []
    raw: list[float | None] = []
    adjusted: list[float | None] = []
    borrowed: list[bool] = []
    for segment in segments:
        timed = [s for s in segment if s.send_time_s is not None]
        if not timed:
            continue
        if times:  # a gap between segments
            times.append((times[-1] + min(s.send_time_s for s in timed if s.send_time_s is not None)) / 2)
            raw.append(None)
            adjusted.append(None)
            borrowed.append(False)
        whole = sample_window([s.sample for s in timed], buckets, "ttft")
        t0, width, n = time_bins(timed, bins, min_bin_s)
        per_bin: list[list[TimedSample]] = [[] for _ in range(n)]
        for s in timed:
            assert s.send_time_s is not None
            per_bin[min(int((s.send_time_s - t0) // width), n - 1)].append(s)
        for i, group in enumerate(per_bin):
            window = sample_window([s.sample for s in group], buckets, "ttft")
            times.append(t0 + i * width)
            if window.counts().sum() == 0:
                raw.append(None)
                adjusted.append(None)
                borrowed.append(False)
                continue
            raw.append(observed_quantiles(window, (q,))[0])
            lacking = any(share > 0 and c == 0 for share, c in zip(mix.shares, window.counts(), strict=True))
            try:
                adjusted.append(counterfactual(window, mix, (q,), fallback=whole).quantiles_s[0])
            except ExplainError:  # the whole segment lacks a weighted bucket
                adjusted.append(None)
            borrowed.append(lacking)
    if not times:
        return None
    return AllRequestsSeries(q, tuple(times), tuple(raw), tuple(adjusted), tuple(borrowed), description)
