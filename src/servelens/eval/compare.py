"""``servelens eval compare``: two deployments' runs of the same suites, item by item.

For every suite present in both folders: the items must be the same (else ValueError); items without
a score on either side (a failed request, a cut turn) are left out of the pairing and counted. The
headline of each side is computed per run over the paired items (mean and SD over runs); the paired
figures come from :func:`servelens.eval.stats.compare_scores` on the per-item scores, and the verdict
from :func:`servelens.eval.stats.real_difference`. Per group (language, subject, API class) the same,
with Holm's adjustment over the groups of a suite when there are two or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servelens.eval.records import RunDir, headline, headline_name, read_run, run_sd, suite_dirs
from servelens.eval.stats import Paired, compare_scores, holm, mcnemar_exact, real_difference


@dataclass(frozen=True)
class CompareRow:
    """One eval (or one group of it) compared.

    Attributes:
        eval: the suite name, or ``suite/group`` for a group row.
        suite, group: which (group None for the suite row).
        headline: what ``accuracy_a``/``accuracy_b`` are (``accuracy`` or ``tool-call F1``).
        accuracy_a, accuracy_b: the headline per side (mean over runs; paired items only).
        sd_a, sd_b: its SD over runs (None with one run).
        runs_a, runs_a_values, runs_b, runs_b_values: run counts and the per-run headlines.
        excluded: items left out (no score on a side).
        paired: the paired figures (items, only A, only B, difference and its interval, p, test).
        p_holm: the Holm-adjusted p-value among the suite's groups (None for the suite row, or one group).
        real_difference: the verdict (on ``p_holm`` for group rows when it is set).
    """

    eval: str
    suite: str
    group: str | None
    headline: str
    accuracy_a: float
    accuracy_b: float
    sd_a: float | None
    sd_b: float | None
    runs_a_values: tuple[float, ...]
    runs_b_values: tuple[float, ...]
    excluded: int
    paired: Paired
    p_holm: float | None
    real_difference: bool


@dataclass(frozen=True)
class Comparison:
    """Everything compare found: rows (suite rows each followed by its group rows) and settings."""

    dir_a: str
    dir_b: str
    alpha: float
    rows: tuple[CompareRow, ...]
    notes: tuple[str, ...]


def _scores(run: RunDir) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in run.records:
        out.setdefault(r.item, [])
        if r.score is not None:
            out[r.item].append(r.score)
    return out


def _side(run: RunDir, items: set[str]) -> tuple[float, float | None, tuple[float, ...]]:
    per_run = []
    for k in sorted({r.run for r in run.records}):
        v = headline(run.suite, [r for r in run.records if r.run == k and r.item in items])
        if v is not None:
            per_run.append(v)
    return sum(per_run) / len(per_run), run_sd(per_run), tuple(per_run)


def _row(a: RunDir, b: RunDir, items: list[str], excluded: int, group: str | None, alpha: float,
         sa: dict[str, list[float]], sb: dict[str, list[float]]) -> CompareRow:
    acc_a, sd_a, runs_a = _side(a, set(items))
    acc_b, sd_b, runs_b = _side(b, set(items))
    p = compare_scores([sa[i] for i in items], [sb[i] for i in items])
    return CompareRow(
        eval=a.suite if group is None else f"{a.suite}/{group}", suite=a.suite, group=group,
        headline=headline_name(a.suite), accuracy_a=acc_a, accuracy_b=acc_b, sd_a=sd_a, sd_b=sd_b,
        runs_a_values=runs_a, runs_b_values=runs_b, excluded=excluded, paired=p, p_holm=None,
        real_difference=real_difference(p.p_value, alpha, acc_b - acc_a, sd_a, sd_b),
    )


def compare_runs(a: RunDir, b: RunDir, alpha: float = 0.05) -> list[CompareRow]:
    """The suite row and the group rows for one suite run on both sides. Raises ValueError when the
    item sets differ or no item is scored on both sides."""
    sa, sb = _scores(a), _scores(b)
    if sa.keys() != sb.keys():
        only_a = sorted(sa.keys() - sb.keys())
        only_b = sorted(sb.keys() - sa.keys())
        eg = ", ".join(f"e.g. {x[0]}" for x in (only_a, only_b) if x)
        raise ValueError(f"{a.suite}: A and B ran different items ({len(only_a)} only in A, {len(only_b)} only "
                         f"in B; {eg}); rerun with the same --limit/--groups/--data")
    paired = [i for i in sa if sa[i] and sb[i]]
    excluded = len(sa) - len(paired)
    if not paired:
        raise ValueError(f"{a.suite}: no item has a score on both sides ({excluded} failed or cut)")
    groups = {r.item: r.group for r in a.records}
    rows = [_row(a, b, paired, excluded, None, alpha, sa, sb)]
    names = sorted({g for g in groups.values() if g is not None})
    group_rows = []
    for g in names:
        members = [i for i in paired if groups[i] == g]
        if members:
            group_rows.append(_row(a, b, members, sum(1 for i in sa if groups[i] == g) - len(members), g, alpha,
                                   sa, sb))
    if len(group_rows) > 1:
        adjusted = holm([r.paired.p_value for r in group_rows])
        group_rows = [
            CompareRow(**{**r.__dict__, "p_holm": q, "real_difference": real_difference(
                q, alpha, r.accuracy_b - r.accuracy_a, r.sd_a, r.sd_b)})
            for r, q in zip(group_rows, adjusted, strict=True)]
    return rows + group_rows


def compare_dirs(dir_a: str | Path, dir_b: str | Path, alpha: float = 0.05) -> Comparison:
    """Compare every suite present in both output folders. Raises ValueError for folders without
    runs, no suite in common, or differing item sets."""
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must be in (0, 1), got {alpha}")
    da, db = suite_dirs(Path(dir_a)), suite_dirs(Path(dir_b))
    common = [s for s in da if s in db]
    if not common:
        raise ValueError(f"{dir_a} ({', '.join(da)}) and {dir_b} ({', '.join(db)}) have no suite in common")
    rows: list[CompareRow] = []
    notes: list[str] = []
    for s in common:
        a, b = read_run(da[s]), read_run(db[s])
        if a.suite != b.suite:  # pragma: no cover - folder names agree, summaries say otherwise
            raise ValueError(f"{da[s]} is suite {a.suite}, {db[s]} is suite {b.suite}")
        rows += compare_runs(a, b, alpha)
        notes += _notes(a, b)
    for s in sorted(set(da) ^ set(db)):
        notes.append(f"{s}: only in {'A' if s in da else 'B'}, not compared")
    return Comparison(str(dir_a), str(dir_b), alpha, tuple(rows), tuple(notes))


def _notes(a: RunDir, b: RunDir) -> list[str]:
    out = []
    for side, run in (("A", a), ("B", b)):
        s = run.summary
        temp = f"temperature {s.get('temperature')}" if s.get("temperature_sent") else "model's default temperature"
        out.append(f"{run.suite} {side}: {s.get('model')} at {s.get('url')}, {s.get('runs')} run(s), {temp}")
    if a.summary.get("model") == b.summary.get("model"):
        out.append(f"{a.suite}: A and B serve the same model name (if it is the same deployment, a self-comparison: "
                   "what differs flipped by itself)")
    replies_a = {(r.item, r.run): r.reply for r in a.records if r.reply is not None}
    shared = [(replies_a[(r.item, r.run)], r.reply) for r in b.records
              if r.reply is not None and (r.item, r.run) in replies_a]
    differ = sum(1 for x, y in shared if x != y)
    out.append(f"{a.suite}: {differ} of {len(shared)} replies differ in text between A and B (same item and run index)")
    if a.suite != "bfcl":
        out.append(_format_failures(a, b))
    return out


def _format_failures(a: RunDir, b: RunDir) -> str:
    """Extraction (format) failures per side, paired: items that failed only in A / only in B over the
    first run of each, and McNemar's exact p on them (a model can break its answer format while its
    accuracy, already at the floor, cannot drop)."""
    def failed(run: RunDir) -> dict[str, bool]:
        first = min(r.run for r in run.records)
        return {r.item: r.error is None and r.extracted is None for r in run.records if r.run == first}

    fa, fb = failed(a), failed(b)
    items = [i for i in fa if i in fb]
    only_a = sum(1 for i in items if fa[i] and not fb[i])
    only_b = sum(1 for i in items if fb[i] and not fa[i])
    return (f"{a.suite}: extraction failures A {sum(fa[i] for i in items)}, B {sum(fb[i] for i in items)} of "
            f"{len(items)} (only A {only_a}, only B {only_b}, McNemar exact p {mcnemar_exact(only_a, only_b):.3g}; "
            "first run of each)")


def group_rows(rows: Sequence[CompareRow], suite: str) -> list[CompareRow]:
    """The group rows of ``suite``."""
    return [r for r in rows if r.suite == suite and r.group is not None]
