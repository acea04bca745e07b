"""Reading Prometheus text exposition (a ``/metrics`` scrape) into per-bucket histograms.

Parsing is ``prometheus_client.parser`` (via :mod:`servelens.prometheus.parse`); this module
only picks the servelens families out of it,
sums over models (or keeps one), and subtracts two scrapes, so the table can be computed from the
server's own view with ``histogram_quantile`` interpolation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servelens.core.summary import BucketHistograms, CumulativeHistogram
from servelens.prometheus.names import MetricNames
from servelens.prometheus.parse import LabelKey, parse_exposition


@dataclass(frozen=True)
class Scrape:
    """One parsed exposition: ``samples[(sample_name, sorted label items)] = value``."""

    samples: Mapping[tuple[str, LabelKey], float]

    def histogram(self, name: str, match: Mapping[str, str] | None = None) -> CumulativeHistogram | None:
        """Sum of every series of histogram ``name`` whose labels include ``match``
        (``sum by (le)``). None when no series matches."""
        return self.histograms_by(name, (), match).get((), None)

    def histograms_by(
        self, name: str, by: tuple[str, ...], match: Mapping[str, str] | None = None
    ) -> dict[tuple[str, ...], CumulativeHistogram]:
        """``sum by (le, *by)`` of histogram ``name`` over series matching ``match``."""
        match = match or {}
        buckets: dict[tuple[str, ...], dict[float, float]] = defaultdict(dict)
        sums: dict[tuple[str, ...], float] = defaultdict(float)
        for (sample, labels), value in self.samples.items():
            if sample not in (name + "_bucket", name + "_sum"):
                continue
            ld = dict(labels)
            if any(ld.get(k) != v for k, v in match.items()):
                continue
            key = tuple(ld.get(k, "") for k in by)
            if sample.endswith("_sum"):
                sums[key] += value
            else:
                le = float(ld["le"])
                buckets[key][le] = buckets[key].get(le, 0.0) + value
        out: dict[tuple[str, ...], CumulativeHistogram] = {}
        for key, b in buckets.items():
            pairs = tuple(sorted(b.items()))
            if not pairs or not math.isinf(pairs[-1][0]):
                continue
            out[key] = CumulativeHistogram(pairs, sums.get(key, 0.0))
        return out

    def value(self, name: str, match: Mapping[str, str] | None = None) -> float:
        """Sum of the samples named ``name`` whose labels include ``match`` (0 when none)."""
        match = match or {}
        total = 0.0
        for (sample, labels), value in self.samples.items():
            if sample == name:
                ld = dict(labels)
                if all(ld.get(k) == v for k, v in match.items()):
                    total += value
        return total

    def values_by(self, name: str, label: str, match: Mapping[str, str] | None = None) -> dict[str, float]:
        """``sum by (label)`` of the samples named ``name`` (a counter) whose labels include ``match``."""
        match = match or {}
        out: dict[str, float] = defaultdict(float)
        for (sample, labels), value in self.samples.items():
            if sample == name:
                ld = dict(labels)
                if label in ld and all(ld.get(k) == v for k, v in match.items()):
                    out[ld[label]] += value
        return dict(out)

    def label_values(self, name: str, label: str) -> set[str]:
        """Values of ``label`` among the samples of family ``name`` (any suffix)."""
        out: set[str] = set()
        for (sample, labels), _ in self.samples.items():
            if sample.startswith(name):
                for k, v in labels:
                    if k == label:
                        out.add(v)
        return out


def parse_scrape(text: str) -> Scrape:
    """Parse Prometheus text exposition. Raises ValueError on text that is not exposition format."""
    return Scrape(parse_exposition(text))


def decreased_counters(after: Scrape, before: Scrape, histograms: Iterable[str]) -> list[str]:
    """The ``_count``/``_bucket`` series of ``histograms`` that are lower in ``after`` than in
    ``before`` (as ``name{labels}``, sorted): counters never decrease, so the scrapes are swapped
    or the server restarted between them. Series present in only one scrape are not compared."""
    names = {f"{h}{suffix}" for h in histograms for suffix in ("_count", "_bucket")}
    out = []
    for key, value in after.samples.items():
        sample, labels = key
        if sample in names and key in before.samples and value < before.samples[key]:
            out.append(sample + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}")
    return sorted(out)


def _sub(a: CumulativeHistogram | None, b: CumulativeHistogram | None) -> CumulativeHistogram | None:
    if a is None:
        return None
    return a.minus(b) if b is not None else a


def bucket_histograms(
    after: Scrape,
    names: MetricNames,
    before: Scrape | None = None,
    model: str | None = None,
    by: str = "isl",
) -> tuple[dict[str, BucketHistograms], BucketHistograms]:
    """Per-bucket by-ISL histograms (and the stock "all requests" ones) from a scrape, or from the
    difference ``after - before`` of two scrapes. Summed over models unless ``model`` is given.
    With ``by="uncached"``: the histograms per uncached bucket (label ``uncached_bucket``; TTFT,
    ITL, duration, no cached tokens) instead.

    Returns ``(per_bucket, all_requests)``; ``per_bucket`` is empty when the scrape has no by-ISL
    families (bucketing off on that server). Each ISL bucket's ``prompt_tokens`` is its
    ``prompt_tokens_by_isl_total`` (None when the server does not export it), and "all"'s their sum
    with the by-ISL cached tokens beside it, so every row's hit ratio counts the same requests; with
    ``by="uncached"`` too ("all" is the same requests; the uncached buckets have no cached tokens).
    Raises ValueError when a counter is lower in ``after`` than in ``before`` (swapped scrapes, or a
    restart in between).
    """
    match = {"model": model} if model else None
    stock = (names.ttft, names.itl, names.duration, names.cached)
    fams = {
        "ttft": names.ttft_by_isl,
        "itl": names.itl_by_isl,
        "duration": names.duration_by_isl,
        "cached": names.cached_by_isl,
    }
    label = "isl_bucket"
    if by == "uncached":
        fams = {"ttft": names.ttft_by_uncached, "itl": names.itl_by_uncached,
                "duration": names.duration_by_uncached}
        label = "uncached_bucket"
    elif by != "isl":
        raise ValueError(f"by must be 'isl' or 'uncached', got {by!r}")
    if before is not None:
        down = decreased_counters(after, before, (*fams.values(), *stock))
        if down:
            raise ValueError(
                f"counters decreased between the two scrapes ({len(down)} series, e.g. {down[0]}): "
                "the scrapes are swapped (the earlier one goes first: --metrics-before, or the first of a pair) "
                "or the server restarted in between"
            )
    got: dict[str, dict[tuple[str, ...], CumulativeHistogram]] = {}
    for key, fam in fams.items():
        a = after.histograms_by(fam, (label,), match)
        if before is not None:
            b = before.histograms_by(fam, (label,), match)
            a = {k: v.minus(b[k]) if k in b else v for k, v in a.items()}
        got[key] = a
    # the hit ratio's prompt tokens per ISL bucket; "all" is the same requests whatever the rows' buckets
    prompt: dict[str, float] | None = None
    if any(s == names.prompt_tokens_by_isl for s, _ in after.samples):
        prompt = after.values_by(names.prompt_tokens_by_isl, "isl_bucket", match)
        if before is not None:
            earlier = before.values_by(names.prompt_tokens_by_isl, "isl_bucket", match)
            prompt = {k: v - earlier.get(k, 0.0) for k, v in prompt.items()}
    labels = sorted({k[0] for d in got.values() for k in d})
    per_bucket = {
        bucket: BucketHistograms(
            ttft=got["ttft"].get((bucket,)),
            itl=got["itl"].get((bucket,)),
            duration=got["duration"].get((bucket,)),
            cached=got.get("cached", {}).get((bucket,)),
            prompt_tokens=prompt.get(bucket) if prompt is not None and by == "isl" else None,
        )
        for bucket in labels
    }
    hit_cached = None
    if prompt:  # the by-ISL cached tokens of the same requests (the stock histogram counts more)
        cached_isl = _sub(after.histogram(names.cached_by_isl, match),
                          before.histogram(names.cached_by_isl, match) if before else None)
        hit_cached = cached_isl.sum if cached_isl is not None else None
    all_h = BucketHistograms(
        ttft=_sub(after.histogram(names.ttft, match), before.histogram(names.ttft, match) if before else None),
        itl=_sub(after.histogram(names.itl, match), before.histogram(names.itl, match) if before else None),
        duration=_sub(
            after.histogram(names.duration, match), before.histogram(names.duration, match) if before else None
        ),
        cached=_sub(
            after.histogram(names.cached, match), before.histogram(names.cached, match) if before else None
        ),
        prompt_tokens=sum(prompt.values()) if prompt is not None and hit_cached is not None else None,
        hit_cached_tokens=hit_cached,
    )
    return per_bucket, all_h
