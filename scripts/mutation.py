"""Mutation testing of servelens' measurement code with mutmut 3 (issue 21).

Each module runs on its own, against the test files that cover it (``MODULES`` below), in a scratch
copy of the tree under ``.scratch/mutation/<name>/`` (mutmut writes its mutants next to the
configuration it reads, so each module gets its own ``pyproject.toml`` with a ``[tool.mutmut]``
table). Prints killed / survived / timeout / no tests per module, the score against the accepted
equivalent mutants in ``scripts/mutation_equivalent.json``, and every surviving mutant not accepted
there, with its diff. Run from the repository root::

    nice -n 10 python scripts/mutation.py core                 # the five audited core modules
    nice -n 10 python scripts/mutation.py sse relay --json out.json
    python scripts/mutation.py --list

Exit status: 0 when every module run reaches ``--min-score`` (default 90 %) of non-equivalent
mutants killed, 1 when one does not, 2 on a usage error or when mutmut itself fails. A timed-out
mutant counts as killed (the tests did not pass on it).

The score of a module is ``killed / (total - equivalent)``, where ``equivalent`` counts the
survivors listed in the baseline whose diff is still the one recorded there (a mutant whose code
changed is no longer accepted and shows up as unexplained).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "mutation_equivalent.json"
SCRATCH = ROOT / ".scratch" / "mutation"

# Seconds of load-dependent budget per mutant: mutmut's limit is (tests' time + constant) * multiplier * 2 CPU s.
TIMEOUT_MULTIPLIER = 5.0


@dataclass(frozen=True)
class Module:
    """One module to mutate and the tests that cover it (files, plus pytest ``--deselect`` ids)."""

    name: str
    path: str
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()
    group: str = "core"


# Priority order (issue 21). The relay runs against tests/gateway/test_relay_mutants.py alone: the relay driven
# in-process, milliseconds per mutant (the gateway tests, which start servers, took seconds per mutant and
# killed fewer: docs/mutation.md).
# Hypothesis fuzz files are left out: they run seconds per mutant and every
# mutant they would kill is killed by a deterministic test (that is the goal of the tests added here).
MODULES: tuple[Module, ...] = (
    Module("sse", "src/servelens/core/sse.py",
           ("tests/core/test_sse.py", "tests/core/test_sse_mutants.py", "tests/core/test_core_robustness.py")),
    Module("openai", "src/servelens/core/openai.py",
           ("tests/core/test_openai.py", "tests/core/test_openai_mutants.py", "tests/core/test_stream.py",
            "tests/core/test_core_robustness.py")),
    Module("buckets", "src/servelens/core/buckets.py",
           ("tests/core/test_buckets.py", "tests/core/test_buckets_mutants.py", "tests/core/test_state.py",
            "tests/core/test_snapshot.py")),
    Module("timing", "src/servelens/core/timing.py",
           ("tests/core/test_timing.py", "tests/core/test_timing_mutants.py")),
    Module("quantiles", "src/servelens/core/quantiles.py",
           ("tests/core/test_quantiles.py", "tests/core/test_quantiles_mutants.py", "tests/core/test_edges.py")),
    Module("relay", "src/servelens/gateway/relay.py",
           ("tests/gateway/test_relay_mutants.py",), group="gateway"),
    Module("usage", "src/servelens/gateway/usage.py",
           ("tests/gateway/test_usage.py", "tests/gateway/test_usage_mutants.py",
            "tests/gateway/test_usage_span_mutants.py",
            "tests/gateway/test_meter.py"),
           group="gateway"),
    # which field an upstream's 400/422 blames (moved out of usage.py: the gateway and the middleware learn by it)
    Module("rejection", "src/servelens/gateway/rejection.py",
           ("tests/gateway/test_rejection.py", "tests/gateway/test_rejection_mutants.py"), group="gateway"),
    Module("collector", "src/servelens/prometheus/collector.py",
           ("tests/prometheus/test_collector.py", "tests/prometheus/test_collector_mutants.py",
            "tests/prometheus/test_exposition.py",
            "tests/prometheus/test_le_format.py"), group="gateway"),
    Module("decompose", "src/servelens/core/decompose.py",
           ("tests/core/test_decompose.py", "tests/core/test_decompose_mutants.py"), group="analysis"),
    Module("eval_stats", "src/servelens/eval/stats.py", ("tests/eval/test_stats.py",), group="analysis"),
    # The rest of core/, most important to the measurement first (group "core2").
    Module("state", "src/servelens/core/state.py",
           ("tests/core/test_state.py", "tests/core/test_state_mutants.py", "tests/core/test_snapshot.py",
            "tests/core/test_uncached_state.py", "tests/prometheus/test_collector.py",
            "tests/prometheus/test_collector_mutants.py", "tests/gateway/test_meter.py",
            "tests/gateway/test_slo_counters.py"),
           # the SLO counter tests that start a gateway, a sim or the CLI: seconds per mutant
           ("tests/gateway/test_slo_counters.py::test_cli_bad_slo_is_one_line",
            "tests/gateway/test_slo_counters.py::test_through_the_gateway_in_front_of_the_sim",
            "tests/gateway/test_slo_counters.py::test_report_reads_the_counters_exactly",
            "tests/gateway/test_slo_counters.py::test_config_file_numbers_are_slo_specs"), group="core2"),
    Module("stream", "src/servelens/core/stream.py", ("tests/core/test_stream.py",), group="core2"),
    Module("histogram", "src/servelens/core/histogram.py",
           ("tests/core/test_histogram.py", "tests/core/test_edges.py", "tests/core/test_state.py"), group="core2"),
    Module("edges", "src/servelens/core/edges.py",
           ("tests/core/test_edges.py", "tests/core/test_timing.py", "tests/core/test_state.py",
            "tests/prometheus/test_collector.py", "tests/prometheus/test_le_format.py"), group="core2"),
    Module("summary", "src/servelens/core/summary.py",
           ("tests/core/test_summary.py", "tests/core/test_summary_mutants.py", "tests/core/test_windows.py",
            "tests/core/test_decompose.py",
            "tests/formats/test_results.py", "tests/formats/test_table.py"), group="core2"),
    Module("windows", "src/servelens/core/windows.py",
           ("tests/core/test_windows.py", "tests/core/test_windows_mutants.py", "tests/core/test_decompose.py",
            "tests/core/test_decompose_mutants.py",
            "tests/core/test_uncertainty.py"), group="core2"),
    Module("verdict", "src/servelens/core/verdict.py",
           ("tests/core/test_verdict.py", "tests/core/test_verdict_mutants.py"), group="core2"),
    Module("slo", "src/servelens/core/slo.py", ("tests/core/test_slo.py", "tests/core/test_slo_mutants.py"),
           group="core2"),
    Module("compare", "src/servelens/core/compare.py",
           ("tests/core/test_compare.py", "tests/core/test_compare_mutants.py"), group="core2"),
    Module("uncertainty", "src/servelens/core/uncertainty.py",
           ("tests/core/test_uncertainty.py", "tests/core/test_uncertainty_mutants.py", "tests/core/test_decompose.py"),
           group="core2"),
    Module("capacity", "src/servelens/core/capacity.py",
           ("tests/core/test_capacity.py", "tests/core/test_capacity_mutants.py"), group="core2"),
    Module("prefill_fit", "src/servelens/core/prefill_fit.py",
           ("tests/core/test_capacity.py", "tests/core/test_prefill_fit_mutants.py"), group="core2"),
    Module("clumping", "src/servelens/core/clumping.py",
           ("tests/core/test_clumping.py", "tests/core/test_clumping_mutants.py"), group="core2"),
    Module("snapshot", "src/servelens/core/snapshot.py",
           ("tests/core/test_snapshot.py", "tests/core/test_snapshot_mutants.py", "tests/core/test_uncached_state.py"),
           group="core2"),
    Module("status", "src/servelens/core/status.py", ("tests/core/test_status.py",), group="core2"),
    Module("merge", "src/servelens/core/merge.py", ("tests/core/test_merge.py", "tests/core/test_merge_mutants.py"),
           group="core2"),
    # the columnar folder's other tests write and convert a 1,500-request run: only the exact-percentile one
    Module("selection", "src/servelens/core/selection.py",
           ("tests/formats/test_columnar.py::test_block_percentiles_equal_numpy_on_the_expanded_values",
            "tests/core/test_selection_mutants.py"), group="core2"),
    Module("binned_quantiles", "src/servelens/core/binned_quantiles.py",
           ("tests/core/test_binned_quantiles.py", "tests/core/test_binned_quantiles_mutants.py"), group="core2"),
    Module("units", "src/servelens/core/units.py", ("tests/core/test_units.py", "tests/core/test_units_mutants.py"),
           group="core2"),
)
MODULE_BY_NAME = {m.name: m for m in MODULES}
GROUPS = sorted({m.group for m in MODULES})


@dataclass
class ModuleResult:
    """Figures of one module's run (counts of mutants by mutmut's status)."""

    name: str
    path: str
    seconds: float
    counts: dict[str, int]
    equivalent: list[str] = field(default_factory=list)
    unexplained: list[dict[str, str]] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def killed(self) -> int:
        """Killed by a failing test, or by running past its time limit."""
        return self.counts.get("killed", 0) + self.counts.get("timeout", 0)

    @property
    def score(self) -> float:
        """Killed / non-equivalent, in [0, 1]; 1.0 when every mutant is equivalent."""
        denominator = self.total - len(self.equivalent)
        return self.killed / denominator if denominator > 0 else 1.0

    def as_json(self) -> dict[str, Any]:
        return {
            "module": self.path, "seconds": round(self.seconds, 1), "total": self.total,
            "killed": self.counts.get("killed", 0), "timeout": self.counts.get("timeout", 0),
            "survived": self.counts.get("survived", 0), "no_tests": self.counts.get("no tests", 0),
            "other": {k: v for k, v in self.counts.items() if k not in ("killed", "timeout", "survived", "no tests")},
            "equivalent": len(self.equivalent), "score": round(self.score, 4),
            "unexplained": self.unexplained, "stale_equivalent": self.stale,
        }


def _mutmut_table(module: Module) -> str:
    selection = [*module.tests, *[f"--deselect={d}" for d in module.deselect]]
    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = [{json.dumps(module.path)}]\n"
        f"pytest_add_cli_args_test_selection = {json.dumps(selection)}\n"
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}\n"
        "use_git_change_detection = false\n"
    )


def prepare(module: Module) -> Path:
    """A fresh scratch tree for ``module``: src/, tests/ and a pyproject.toml naming what to mutate."""
    work = SCRATCH / module.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src", work / "src", ignore=ignore)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text()
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml has its own [tool.mutmut]: this script writes one per module")
    (work / "pyproject.toml").write_text(pyproject + _mutmut_table(module))
    return work


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The tests must import the mutated copy (mutants/src), never this tree's src.
    env.pop("PYTHONPATH", None)
    return env


_READ_RESULTS = r"""
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code
meta = json.loads((Path("mutants") / (sys.argv[1] + ".meta")).read_text())
out = {}
for name, code in meta["exit_code_by_key"].items():
    status = status_by_exit_code[code]
    diff = get_diff_for_mutant(name, path=sys.argv[1]) if status not in ("killed", "timeout") else ""
    out[name] = {"status": status, "diff": diff}
print(json.dumps(out))
"""


def _changed_lines(diff: str) -> str:
    """The -/+ lines of a unified diff, stripped: the part of a mutant that identifies it."""
    keep = [ln[0] + ln[1:].strip() for ln in diff.splitlines()
            if ln[:1] in "-+" and not ln.startswith(("---", "+++"))]
    return "\n".join(keep)


def run_module(module: Module, max_children: int, baseline: dict[str, dict[str, dict[str, str]]]) -> ModuleResult:
    """Mutate ``module``, run its tests on each mutant and read back the verdicts."""
    work = prepare(module)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)],
                          cwd=work, env=_env(), capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"mutmut failed on {module.path} (exit {proc.returncode})")
    read = subprocess.run([sys.executable, "-c", _READ_RESULTS, module.path], cwd=work, env=_env(),
                          capture_output=True, text=True, check=True)
    verdicts: dict[str, dict[str, str]] = json.loads(read.stdout)
    counts: dict[str, int] = {}
    for v in verdicts.values():
        counts[v["status"]] = counts.get(v["status"], 0) + 1
    accepted = baseline.get(module.name, {})
    result = ModuleResult(module.name, module.path, seconds, counts)
    for name, v in sorted(verdicts.items()):
        if v["status"] in ("killed", "timeout"):
            continue
        short = name.removeprefix(_dotted(module.path) + ".")
        change = _changed_lines(v["diff"])
        known = accepted.get(short)
        if known is not None and v["status"] == "survived" and known.get("change") == change:
            result.equivalent.append(short)
        else:
            result.unexplained.append({"mutant": short, "status": v["status"], "change": change})
    result.stale = sorted(set(accepted) - set(result.equivalent))
    return result


def _dotted(path: str) -> str:
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def _print(result: ModuleResult, min_score: float) -> None:
    c = result.counts
    flag = "ok" if result.score >= min_score else "LOW"
    print(f"{result.path}: {result.total} mutants, killed {c.get('killed', 0)}, timeout {c.get('timeout', 0)}, "
          f"survived {c.get('survived', 0)}, no tests {c.get('no tests', 0)}, equivalent {len(result.equivalent)}; "
          f"score {100 * result.score:.1f} % [{flag}] ({result.seconds:.0f} s)")
    for u in result.unexplained:
        print(f"  {u['status']}: {u['mutant']}")
        for line in u["change"].splitlines():
            print(f"      {line}")
    for s in result.stale:
        print(f"  baseline entry no longer surviving as recorded (remove or update it): {s}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("modules", nargs="*",
                        help=f"module names or groups ({', '.join(GROUPS)}, all); default: core")
    parser.add_argument("--json", type=Path, help="write the figures (and unexplained survivors) here")
    parser.add_argument("--min-score", type=float, default=0.90, help="fail under this score (default 0.90)")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant runs (default 2)")
    parser.add_argument("--list", action="store_true", help="print the modules and their tests, run nothing")
    args = parser.parse_args(argv)
    if args.list:
        for m in MODULES:
            print(f"{m.name:<16} {m.group:<9} {m.path}  <- {' '.join(m.tests)}")
        return 0
    chosen: list[Module] = []
    for word in args.modules or ["core"]:
        picked = (list(MODULES) if word == "all" else [m for m in MODULES if m.group == word]
                  or ([MODULE_BY_NAME[word]] if word in MODULE_BY_NAME else []))
        if not picked:
            parser.error(f"unknown module or group {word!r} (see --list)")
        chosen += [m for m in picked if m not in chosen]
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    results = []
    for module in chosen:
        result = run_module(module, args.max_children, baseline)
        _print(result, args.min_score)
        results.append(result)
        if args.json:  # after each module: a long run stopped half-way keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({
                "tool": "mutmut " + _mutmut_version(), "min_score": args.min_score,
                "load_average_at_start": [round(x, 2) for x in load],
                "modules": [r.as_json() for r in results]}, indent=2) + "\n")
    low = [r.path for r in results if r.score < args.min_score]
    if low:
        print(f"under {100 * args.min_score:.0f} %: {', '.join(low)}")
        return 1
    return 0


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except tomllib.TOMLDecodeError as e:  # a broken pyproject.toml: one line, not a traceback
        sys.exit(f"pyproject.toml: {e}")
