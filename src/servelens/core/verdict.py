"""The one-line verdict of an :class:`~servelens.core.decompose.Explanation`, printed before the table:

``TTFT p95 rose 2.0 s -> 9.8 s; at the earlier mix it would be 2.3 s: mostly a traffic shift
toward 8193+ prompts; 4097-8192 also slowed, 0.9 s -> 4.4 s``

The headline is one quantile (p95 unless asked); the explanation after the colon follows the
mean's verdict (mix, latency, both, none); buckets named as slower or faster are those whose own
mean changed significantly (:meth:`Explanation.ranked`), shown with their figures at the headline
quantile, at most ``top`` of them. Adjacent buckets are named as one range (``8193-16384`` and
``16385+`` read ``8193+``).
"""

from __future__ import annotations

from collections.abc import Sequence

from servelens.core.decompose import FASTER, BucketChange, Explanation


def format_s(x: float | None) -> str:
    """A latency for one line: ``9.8 s``, ``0.31 s``, ``45 ms``, ``3.1 ms``; ``-`` for None."""
    if x is None:
        return "-"
    if abs(x) >= 1:
        return f"{x:.1f} s"
    if abs(x) >= 0.1:
        return f"{float(f'{x:.2g}'):g} s"
    return f"{float(f'{x * 1000:.2g}'):g} ms"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + format_s(abs(x))


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


def _moved(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return f"{format_s(a)} -> {format_s(b)}"
    # figures that read the same at the line's precision stayed, whatever their last digits
    word = "stayed at" if format_s(a) == format_s(b) else "rose" if b > a else "fell"
    return f"{word} {format_s(a)}" if word == "stayed at" else f"{word} {format_s(a)} -> {format_s(b)}"


def _figures(b: BucketChange, qi: int | None) -> tuple[float | None, float | None, str]:
    """The bucket's headline quantile in both windows; its mean (named so) when the quantile did not
    move the way the bucket changed (coarse ``le`` edges can put both in one bucket's interpolation)."""
    if qi is not None and b.quantiles_before_s[qi] is not None and b.quantiles_after_s[qi] is not None:
        a, z = b.quantiles_before_s[qi], b.quantiles_after_s[qi]
        assert a is not None and z is not None
        if (z - a) * (-1 if b.change == FASTER else 1) > 0:
            return a, z, ""
    return b.mean_before_s, b.mean_after_s, "mean "


def verdict_line(e: Explanation, q: float = 0.95, top: int = 3) -> str:
    """One line (module docstring). Raises KeyError when ``q`` is not among ``e``'s quantiles."""
    s = e.quantile(q)
    qi = next(i for i, x in enumerate(e.quantiles) if x is s)
    line = f"{e.metric} p{q * 100:g} {_moved(s.before_s, s.after_s)}"
    if s.counterfactual_s is not None:
        line += f"; at the earlier mix it would be {format_s(s.counterfactual_s)}"
    changed = e.ranked()
    shown, rest = changed[:top], len(changed) - top

    def items(also: str) -> str:
        parts = []
        for b in shown:
            a, z, what = _figures(b, qi)
            verb = "got faster" if b.change == FASTER else "slowed"
            parts.append(f"{b.label} {also}{verb}, {what}{format_s(a)} -> {format_s(z)}")
        if rest > 0:
            parts.append(f"{rest} more bucket{'s' if rest > 1 else ''} changed")
        return "; ".join(parts)

    mean = f"mean: mix {_signed(e.mix_effect_s)}, latency {_signed(e.latency_effect_s)}"
    if e.verdict == "mix":
        line += f": {'mostly ' if changed else ''}a traffic shift toward {shifted_toward(e)} prompts"
        line += f"; {items('also ')}" if shown else f", no bucket {'slower' if e.mix_effect_s >= 0 else 'faster'}"
    elif e.verdict == "latency":
        word = "slower" if e.latency_effect_s >= 0 else "faster"
        line += f": {word} within buckets, not a traffic shift"
        line += f"; {items('')}" if shown else ""
    elif e.verdict == "both":
        word = "slower" if e.latency_effect_s >= 0 else "faster"
        line += f": a traffic shift toward {shifted_toward(e)} prompts and {word} buckets ({mean})"
        line += f"; {items('')}" if shown else ""
    else:
        line += f": no significant change of the mean ({format_s(e.mean_before_s)} -> {format_s(e.mean_after_s)})"
        line += f"; {items('')}" if shown else ""
    return line
