"""The one-line verdict of an :class:`~servelens.core.decompose.Explanation`, printed before the table:

``TTFT p95 rose 2.0 s -> 9.8 s; at the earlier mix it would be 2.3 s: mostly a traffic shift
toward 8193+ prompts; 4097-8192 also slowed, 0.9 s -> 4.4 s``

Figures read together (a pair, the headline with its counterfactual, the mean's two effects) share
one unit (:mod:`servelens.core.units`): ``77 ms -> 110 ms``, not ``77 ms -> 0.11 s``.

The headline is one quantile (p95 unless asked), or the mean when that quantile is not measured (every
observation of a window in one ``le`` bucket of its histograms: :func:`not_measured`); the explanation
after the colon follows the
mean's verdict (mix, latency, both, none), with the mean's split it is judged on (``(mean: mix
+360 ms, latency +430 ms)``; for ``none`` the mean in both windows and its split), since a
quantile can move another way than the mean. Buckets named as slower or faster are those whose own
mean changed significantly (:meth:`Explanation.ranked`), shown with their figures at the headline
quantile, at most ``top`` of them. Adjacent buckets are named as one range (``8193-16384`` and
``16385+`` read ``8193+``).
"""

from __future__ import annotations

from collections.abc import Sequence

from servelens.core.decompose import FASTER, BucketChange, Explanation
from servelens.core.units import format_in, format_times, time_unit


def format_s(x: float | None) -> str:
    """One latency alone: ``9.8 s``, ``310 ms``, ``3.1 ms``; ``-`` for None
    (:func:`~servelens.core.units.format_times`; figures read together share one unit)."""
    return format_times(x)[0]


def _bounds(label: str) -> tuple[str, str | None]:
    low, _, high = label.partition("-")
    return low.rstrip("+"), (high or None)


def label_range(labels: Sequence[str], order: Sequence[str]) -> str:
    """Name a set of bucket labels, merging runs adjacent in ``order`` (numeric order):
    ``["8193-16384", "16385+"]`` -> ``8193+``; ``["0-512", "2049-4096"]`` -> ``0-512 and 2049-4096``."""
    chosen = sorted(set(labels), key=list(order).index)
    runs: list[list[str]] = []
    for label in chosen:
        if runs and order.index(runs[-1][-1]) + 1 == order.index(label):
            runs[-1].append(label)
        else:
            runs.append([label])
    names = []
    for run in runs:
        low, _ = _bounds(run[0])
        _, high = _bounds(run[-1])
        names.append(f"{low}-{high}" if high else f"{low}+")
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def shifted_toward(e: Explanation, cover: float = 0.8) -> str:
    """The buckets the traffic moved toward, in the mix effect's direction: among buckets whose
    share rose, those whose gain moved the mean the way the mix effect did (gain times the bucket's
    earlier mean minus the earlier overall mean), the largest first until they make ``cover`` of it."""
    sign = 1.0 if e.mix_effect_s >= 0 else -1.0
    pushes = []
    for b in e.buckets:
        gain = b.share_after - b.share_before
        base = b.mean_before_s if b.mean_before_s is not None else b.mean_after_s
        if gain > 0 and base is not None and sign * gain * (base - e.mean_before_s) > 0:
            pushes.append((sign * gain * (base - e.mean_before_s), b.label))
    if not pushes:  # no bucket pushes the mean this way on its own: name the largest gain
        gain, label = max((b.share_after - b.share_before, b.label) for b in e.buckets)
        return label_range([label], e.labels)
    pushes.sort(reverse=True)
    total, got, names = sum(p for p, _ in pushes), 0.0, []
    for p, label in pushes:
        names.append(label)
        got += p
        if got >= cover * total:
            break
    return label_range(names, e.labels)


def _moved(a: float | None, b: float | None, unit: str) -> str:
    fa, fb = format_in(a, unit), format_in(b, unit)
    if a is None or b is None:
        return f"{fa} -> {fb}"
    # figures that read the same at the line's precision stayed, whatever their last digits
    word = "stayed at" if fa == fb else "rose" if b > a else "fell"
    return f"{word} {fa}" if word == "stayed at" else f"{word} {fa} -> {fb}"


def le_span(r: tuple[float, float]) -> str:
    """An ``le`` bucket ``(lower, upper]`` (s) in one unit: ``0-2.0 s``, ``22-24 ms``, ``over 510 s``."""
    lo, hi = r
    if hi == float("inf"):
        return f"over {format_times(lo)[0]}"
    a, b = format_times(lo, hi)
    return f"{a.rsplit(' ', 1)[0]}-{b}"


def not_measured(e: Explanation) -> str | None:
    """Why ``e``'s all-requests quantiles are not measurements, or None when they are: every observation
    of a window (or of the later one at the earlier mix) fell in one ``le`` bucket, where
    ``histogram_quantile`` returns points of a straight line through it."""
    spans = [(name, r) for name, r in (("earlier", e.le_range_before_s), ("later", e.le_range_after_s),
                                       ("at the earlier mix", e.le_range_counterfactual_s)) if r is not None]
    if not spans:
        return None
    if len({r for _, r in spans}) == 1:
        windows = [n for n, _ in spans if n in ("earlier", "later")]
        where = ("both windows" if len(windows) == 2 else f"the {windows[0]} window" if windows
                 else "the later window at the earlier mix")
        return f"every {e.metric} of {where} in the le bucket {le_span(spans[0][1])}"
    return "every value in one le bucket: " + ", ".join(f"{n} {le_span(r)}" for n, r in spans)


def _figures(b: BucketChange, qi: int | None) -> tuple[float | None, float | None, str]:
    """The bucket's headline quantile in both windows; its mean (named so) when the quantile did not
    move the way the bucket changed (coarse ``le`` edges can put both in one bucket's interpolation),
    or when a window's observations all fell in one ``le`` bucket (the quantile is not measured)."""
    if qi is not None and b.quantiles_before_s[qi] is not None and b.quantiles_after_s[qi] is not None \
            and not b.interpolated():
        a, z = b.quantiles_before_s[qi], b.quantiles_after_s[qi]
        assert a is not None and z is not None
        if (z - a) * (-1 if b.change == FASTER else 1) > 0:
            return a, z, ""
    return b.mean_before_s, b.mean_after_s, "mean "


def verdict_line(e: Explanation, q: float = 0.95, top: int = 3) -> str:
    """One line (module docstring). Raises KeyError when ``q`` is not among ``e``'s quantiles."""
    s = e.quantile(q)
    qi = next(i for i, x in enumerate(e.quantiles) if x is s)
    why = not_measured(e)
    if why is None:
        unit = time_unit((s.before_s, s.after_s, s.counterfactual_s))  # one unit for the headline's figures
        line = f"{e.metric} p{q * 100:g} {_moved(s.before_s, s.after_s, unit)}"
        if s.counterfactual_s is not None:
            line += f"; at the earlier mix it would be {format_in(s.counterfactual_s, unit)}"
    else:  # an interpolation inside one le bucket is no measurement: the mean, which is exact, instead
        unit = time_unit((e.mean_before_s, e.mean_after_s, e.counterfactual_mean_s))
        line = (f"{e.metric} mean {_moved(e.mean_before_s, e.mean_after_s, unit)} (p{q * 100:g} not measured: "
                f"{why}); at the earlier mix it would be {format_in(e.counterfactual_mean_s, unit)}")
    changed = e.ranked()
    shown, rest = changed[:top], len(changed) - top

    def items(also: str) -> str:
        parts = []
        for b in shown:
            a, z, what = _figures(b, qi)
            verb = "got faster" if b.change == FASTER else "slowed"
            fa, fz = format_times(a, z)
            parts.append(f"{b.label} {also}{verb}, {what}{fa} -> {fz}")
        if rest > 0:
            parts.append(f"{rest} more bucket{'s' if rest > 1 else ''} changed")
        return "; ".join(parts)

    # what every verdict is judged on, the mean's split, shown with it: a quantile can move the other way
    # (ITL p95 3.3 -> 3.4 ms, 2.8 ms at the earlier mix, while the mean's change is all latency)
    mix, lat = format_times(e.mix_effect_s, e.latency_effect_s, signed=True)
    mean = f"mean: mix {mix}, latency {lat}"
    if e.verdict == "mix":
        line += f": {'mostly ' if changed else ''}a traffic shift toward {shifted_toward(e)} prompts ({mean})"
        line += f"; {items('also ')}" if shown else f", no bucket {'slower' if e.mix_effect_s >= 0 else 'faster'}"
    elif e.verdict == "latency":
        word = "slower" if e.latency_effect_s >= 0 else "faster"
        line += f": {word} within buckets, not a traffic shift ({mean})"
        line += f"; {items('')}" if shown else ""
    elif e.verdict == "both":
        word = "slower" if e.latency_effect_s >= 0 else "faster"
        line += f": a traffic shift toward {shifted_toward(e)} prompts and {word} buckets ({mean})"
        line += f"; {items('')}" if shown else ""
    else:
        before, after, mix, lat = format_times(e.mean_before_s, e.mean_after_s, e.mix_effect_s, e.latency_effect_s)
        line += (f": no significant change of the mean ({before} -> {after}: mix {_sign(mix)}, "
                 f"latency {_sign(lat)})")
        line += f"; {items('')}" if shown else ""
    return line


def _sign(text: str) -> str:
    """A formatted figure with its sign (``+0.31 ms``)."""
    return text if text.startswith(("-", "+")) else "+" + text
