"""PromQL for the bucket mix (issue 17, section 1): each bucket's share of the requests, and the TTFT
p95 (any quantile) and mean *at a reference mix*, so that a dashboard can show the raw all-requests
line beside the mix-adjusted one: the raw line moves when the traffic shifts toward longer prompts,
the adjusted one only when the buckets themselves get slower.

The mix-adjusted histogram is :func:`servelens.core.decompose.counterfactual` in PromQL: the by-ISL
histograms share ``le`` edges, so ``sum_b w_b * H_b / n_b`` (each bucket's histogram normalised to
its own count, weighted by the reference share ``w_b``) is exact as a histogram, and
``histogram_quantile`` reads its quantile as from any histogram; the mean is ``sum_b w_b * m_b``.

The reference mix (:class:`MixReference`) is either

* **a fixed weight file** (``servelens dashboard --reference-mix FILE``, written by
  ``servelens explain --write-mix``): the steady yardstick. The adjusted line moves only when latency
  moves, today as next month; the choice for alerting and for comparing releases. It must be kept
  up to date by hand when the intended traffic changes.
* **the mix over a longer window** (``--reference-window 24h``, the default): needs no file and
  follows the traffic's slow drift, so a shift that took a day is absorbed into the yardstick, and
  right after the server starts there is little history. It costs a long-range ``rate()`` per
  evaluation.

A bucket with a positive reference share but no TTFT in the rate window leaves the figure
undefined (the counterfactual cannot weight data it does not have): the expression then returns
nothing (a gap), on Prometheus and VictoriaMetrics alike, instead of silently renormalising the other
buckets (VictoriaMetrics would drop the NaN term of a sum).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from servelens.core.windows import Mix
from servelens.dashboards.queries import selector

ISL = "isl_bucket"


@dataclass(frozen=True)
class MixReference:
    """The mix the adjusted figures are computed at: ``mix`` (fixed shares) or ``window`` (the mix
    over that long a window, a Prometheus duration such as ``24h``). Exactly one is set."""

    mix: Mix | None = None
    window: str | None = None

    def __post_init__(self) -> None:
        if (self.mix is None) == (self.window is None):
            raise ValueError("a reference mix is either fixed shares or a window, not both or neither")

    @property
    def tag(self) -> str:
        """Part of the record names: ``refmix`` (fixed) or ``ref24h``."""
        return "refmix" if self.mix is not None else f"ref{self.window}"

    def describe(self) -> str:
        """One line for descriptions and annotations."""
        if self.mix is not None:
            return "the fixed reference mix " + ", ".join(f"{k} {v:.1%}" for k, v in
                                                          zip(self.mix.labels, self.mix.shares, strict=True))
        return f"the mix over the last {self.window}"


DEFAULT_REFERENCE = MixReference(window="24h")
"""The reference mix unless a weight file is given: the mix over the last 24 hours."""


def _by(by: tuple[str, ...], *extra: str) -> str:
    return ", ".join((*extra, *by))


def bucket_share_expr(histogram: str, bucket: str | None, window: str, model: str = "",
                      by: tuple[str, ...] = ()) -> str:
    """Each bucket's share of the observations of ``histogram`` (a by-ISL family's base name) over
    ``window``: ``bucket`` one label (its share, the label kept) or None (every bucket's, summed
    by ``isl_bucket`` and ``by``)."""
    sel = selector(bucket, model)
    return (f"sum by ({_by(by, ISL)}) (rate({histogram}_count{sel}[{window}])) / ignoring ({ISL}) group_left "
            f"sum by ({_by(by) or ISL}) (rate({histogram}_count{selector(None, model)}[{window}]))"
            if by else
            f"sum by ({ISL}) (rate({histogram}_count{sel}[{window}])) / ignoring ({ISL}) group_left "
            f"sum (rate({histogram}_count{selector(None, model)}[{window}]))")


def _weights(ref: MixReference, histogram: str, model: str, by: tuple[str, ...],
             recorded: str | None = None) -> tuple[str, str]:
    """The weight vector (labels ``isl_bucket``, and ``by`` for a window mix; ``recorded``: the name of
    a recording rule that holds the window mix) and the join labels."""
    if recorded is not None and ref.window is not None:
        return f"({recorded}{selector(None, model)} > 0)", _by(by, ISL)
    if ref.mix is not None:
        parts = [f'label_replace(vector({share:.12g}), "{ISL}", {json.dumps(label)}, "", "")'
                 for label, share in zip(ref.mix.labels, ref.mix.shares, strict=True) if share > 0]
        return "(" + " or ".join(parts) + ")", ISL
    assert ref.window is not None
    return f"(({bucket_share_expr(histogram, None, ref.window, model, by)}) > 0)", _by(by, ISL)


def _terms(histogram: str, window: str, model: str, by: tuple[str, ...]) -> tuple[str, str, str]:
    sel = selector(None, model)
    h = f"sum by ({_by(by, 'le', ISL)}) (rate({histogram}_bucket{sel}[{window}]))"
    n = f"sum by ({_by(by, ISL)}) (rate({histogram}_count{sel}[{window}]))"
    s = f"sum by ({_by(by, ISL)}) (rate({histogram}_sum{sel}[{window}]))"
    return h, n, s


def _guard(ref: MixReference, histogram: str, window: str, model: str, by: tuple[str, ...],
           recorded: str | None) -> str:
    """``and on (by)`` a condition true when every bucket with a reference share has observations."""
    w, on = _weights(ref, histogram, model, by, recorded)
    _, n, _ = _terms(histogram, window, model, by)
    have = f"count by ({_by(by)}) (({n} > 0) * on ({on}) group_left () {w})" if by else \
        f"count (({n} > 0) * on ({on}) group_left () {w})"
    if ref.mix is not None:
        need = f"{sum(1 for s in ref.mix.shares if s > 0)}"
    else:
        need = f"count by ({_by(by)}) ({w})" if by else f"scalar(count ({w}))"
    return f" and on ({_by(by)}) ({have} >= {need})"


def adjusted_quantile_expr(histogram: str, q: float, ref: MixReference, window: str, model: str = "",
                           by: tuple[str, ...] = (), recorded: str | None = None) -> str:
    """``histogram_quantile(q, ...)`` of the by-ISL ``histogram`` at the reference mix (module
    docstring), one series per value of the labels ``by`` (``()``: over every selected series).
    ``recorded``: a recording rule holding the window mix (by ``isl_bucket`` and ``by``), read
    instead of computing it again."""
    w, on = _weights(ref, histogram, model, by, recorded)
    h, n, _ = _terms(histogram, window, model, by)
    mixed = f"sum by ({_by(by, 'le')}) (({h} / ignoring (le) group_left {n}) * on ({on}) group_left () {w})"
    return f"histogram_quantile({q:g}, {mixed})" + _guard(ref, histogram, window, model, by, recorded)


def adjusted_mean_expr(histogram: str, ref: MixReference, window: str, model: str = "",
                       by: tuple[str, ...] = (), recorded: str | None = None) -> str:
    """The mean of the by-ISL ``histogram`` at the reference mix: ``sum_b w_b * _sum_b / _count_b``
    (``recorded`` as in :func:`adjusted_quantile_expr`)."""
    w, on = _weights(ref, histogram, model, by, recorded)
    _, n, s = _terms(histogram, window, model, by)
    agg = f"sum by ({_by(by)})" if by else "sum"
    return f"{agg} (({s} / {n}) * on ({on}) group_left () {w})" + _guard(ref, histogram, window, model, by, recorded)
