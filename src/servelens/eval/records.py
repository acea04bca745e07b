"""The files of an eval run, and the figures of one run read from them.

A run of suite S with ``--output-dir DIR`` writes ``DIR/S/``: ``records.jsonl`` (one line per item and
run index, in item order), ``summary.json`` and ``cache.jsonl`` (:mod:`servelens.eval.cache`).
``servelens eval compare DIR_A DIR_B`` reads every suite folder the two have in common.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servelens.eval.scoring import call_counts, decision_counts

RECORDS_FILE = "records.jsonl"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class EvalRecord:
    """One item in one run.

    Attributes:
        item: the item id (``gsm8k/17``, ``mgsm/de/3``, ``bfcl/multi_turn_base_0/2``).
        group: language, subject or API class (None: the suite has no groups).
        run: the run index (0-based).
        requests: the request bodies as sent (one; for function calling one per model reply).
        reply: the reply text (function calling: the last reply's text).
        extracted: the answer read from the reply (None: extraction failed, or no reply); function
            calling: the names of the functions called in the turn, comma-separated.
        method: how it was read (:class:`~servelens.eval.suites.Scored`).
        correct: right or wrong (None when there is no score: a failed request or a cut turn).
        score: the value the paired tests use: 1.0/0.0 for right/wrong; function calling: 1.0 when the
            turn called a tool exactly when it should.
        latency_s: total request time (summed over the replies of a turn).
        usage: ``prompt_tokens`` and ``completion_tokens`` summed over the item's requests.
        error: why the item has no score (None when scored).
        cut: function calling: the prompt was longer than the context (counted, not scored).
        cached: every reply came from the cache.
        metrics: function calling: the turn's :class:`~servelens.eval.scoring.TurnScore` fields.
    """

    item: str
    group: str | None
    run: int
    requests: tuple[Any, ...]
    reply: str | None
    extracted: str | None
    method: str | None
    correct: bool | None
    score: float | None
    latency_s: float | None
    usage: Mapping[str, int] = field(default_factory=dict)
    error: str | None = None
    cut: bool = False
    cached: bool = False
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """One JSON line (no newline)."""
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EvalRecord:
        """A record from its JSON object. Raises KeyError/TypeError for a malformed one."""
        o = dict(obj)
        o["requests"] = tuple(o["requests"])
        return cls(**o)


def headline(suite: str, records: Sequence[EvalRecord]) -> float | None:
    """The suite's headline over scored ``records``: function calling: F1 of "called a tool when it
    should" over turns (:func:`~servelens.eval.scoring.decision_counts`); else accuracy (the mean score).
    None when nothing was scored."""
    scored = [r for r in records if r.score is not None]
    if not scored:
        return None
    if suite == "bfcl":
        return decision_counts([r.metrics for r in scored]).f1
    return sum(r.score for r in scored if r.score is not None) / len(scored)


HEADLINE_NAMES = {"bfcl": "tool-call F1"}


def headline_name(suite: str) -> str:
    """What the headline of ``suite`` is called (``accuracy`` or ``tool-call F1``)."""
    return HEADLINE_NAMES.get(suite, "accuracy")


def run_sd(values: Sequence[float]) -> float | None:
    """The sample SD (ddof 1) of per-run values; None for fewer than two runs."""
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def run_figures(suite: str, records: Sequence[EvalRecord]) -> dict[str, Any]:
    """Headline per run, their mean and SD (ddof 1, over runs), and the failure counts of ``records``."""
    runs = sorted({r.run for r in records})
    per_run = [headline(suite, [r for r in records if r.run == k]) for k in runs]
    values = [v for v in per_run if v is not None]
    out: dict[str, Any] = {
        "headline": headline_name(suite),
        "per_run": per_run,
        "mean": sum(values) / len(values) if values else None,
        "sd_over_runs": run_sd(values),
        "records": len(records),
        "scored": sum(1 for r in records if r.score is not None),
        "failed": sum(1 for r in records if r.error is not None and not r.cut),
        "extraction_failures": sum(1 for r in records if r.error is None and r.extracted is None and suite != "bfcl"),
    }
    if suite == "bfcl":
        scored = [r.metrics for r in records if r.score is not None]
        d, c = decision_counts(scored), call_counts(scored)
        made = sum(int(m["made"]) for m in scored)
        out |= {
            "tool_call_precision": d.precision, "tool_call_recall": d.recall, "tool_call_f1": d.f1,
            "function_name_precision": c.precision, "function_name_recall": c.recall, "function_name_f1": c.f1,
            "exact_turns": sum(1 for r in records if r.score is not None and r.metrics.get("exact")),
            "calls_made": made,
            "invalid_json_calls": sum(int(m["invalid_json"]) for m in scored),
            "missing_required_calls": sum(int(m["missing_required"]) for m in scored),
            "unknown_function_calls": sum(int(m["unknown_functions"]) for m in scored),
            "steps_capped_turns": sum(1 for m in scored if m.get("steps_capped")),
            "cut_turns": sum(1 for r in records if r.cut),
            "cut_conversations": len({(r.run, r.item.rsplit("/", 1)[0]) for r in records if r.cut}),
        }
    if len(runs) > 1:
        out["items_flipping_between_runs"] = flips_between_runs(records)
    return out


def flips_between_runs(records: Iterable[EvalRecord]) -> int:
    """Items whose correctness is not the same in every run (runs of one deployment)."""
    seen: dict[str, set[bool]] = {}
    for r in records:
        if r.correct is not None:
            seen.setdefault(r.item, set()).add(bool(r.score))
    return sum(1 for s in seen.values() if len(s) > 1)


def write_records(path: Path, records: Iterable[EvalRecord]) -> None:
    """Write ``records`` as JSON Lines (replacing the file)."""
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_json() + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class RunDir:
    """One suite's run as read back: the summary and the records."""

    path: Path
    suite: str
    summary: Mapping[str, Any]
    records: tuple[EvalRecord, ...]


def read_run(path: Path) -> RunDir:
    """Read ``path`` (a suite folder with ``summary.json`` and ``records.jsonl``). Raises ValueError
    (one line) when it is not one, OSError when unreadable."""
    summary_path, records_path = path / SUMMARY_FILE, path / RECORDS_FILE
    if not summary_path.exists() or not records_path.exists():
        raise ValueError(f"{path}: not an eval run folder (no {SUMMARY_FILE} and {RECORDS_FILE})")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        suite = summary["suite"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{summary_path}: not a servelens eval summary") from None
    records = []
    with records_path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            try:
                records.append(EvalRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{records_path} line {n + 1}: not a servelens eval record") from None
    return RunDir(path, str(suite), summary, tuple(records))


def suite_dirs(path: Path) -> dict[str, Path]:
    """The suite folders of an output folder (``DIR/<suite>/summary.json``), by suite; ``path`` may
    also be one suite folder itself. Raises ValueError when there is none."""
    if (path / SUMMARY_FILE).exists():
        return {read_run(path).suite: path}
    found = {p.parent.name: p.parent for p in sorted(path.glob(f"*/{SUMMARY_FILE}"))}
    if not found:
        raise ValueError(f"{path}: no eval runs (no {SUMMARY_FILE} in it or in its subfolders)")
    return found
