#!/usr/bin/env python3
"""Screenshots of the ``servelens eval compare`` HTML page in headless Chromium, at desktop and laptop
widths, to look at the plots as a reader sees them.

    python scripts/eval_compare_screenshots.py --out .scratch/eval-shots            # simulated runs
    python scripts/eval_compare_screenshots.py --out .scratch/eval-shots --a DIR_A --b DIR_B

Without ``--a``/``--b`` it writes two simulated deployments first (answers drawn from the answer-key
policy of :mod:`servelens.sim.answers`, no engine): MGSM in 5 languages x 40 items, 3 runs each
(A 0.80, B 0.74: run-to-run spread and per-language pairs), and MMLU, one run (A 0.45, B 0.44). Writes
``OUT/compare.html`` and ``OUT/compare-<width>.png`` (1920 and 1366 px wide, the whole page). Needs
``chromium`` (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import servelens  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from servelens.eval.compare import compare_dirs
from servelens.eval.records import RECORDS_FILE, SUMMARY_FILE, EvalRecord, write_records
from servelens.eval.report import write_html
from servelens.sim.answers import AnswerPolicy, answers_right

WIDTHS = (1920, 1366)
"""Desktop and laptop viewport widths (px)."""
LANGS = ("de", "en", "es", "fr", "zh")
SUBJECTS = ("abstract_algebra", "astronomy", "college_biology", "world_religions")


def simulated_run(folder: Path, name: str, suite: str, groups: tuple[str, ...], per_group: int, runs: int,
                  accuracy: float, seed: int) -> None:
    """``folder/<suite>/`` with records and a summary, as ``eval run`` writes them."""
    out = folder / suite
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for k in range(runs):
        policy = AnswerPolicy(accuracy, seed=seed * 100 + k, shared_seed=1, independence=0.3)
        for g in groups:
            for i in range(per_group):
                right = answers_right(f"{suite}/{g}/{i}", policy)
                records.append(EvalRecord(f"{suite}/{g}/{i}", g, k, ({},), "", "1", "strict", right, float(right),
                                          0.1))
    write_records(out / RECORDS_FILE, records)
    summary = {"suite": suite, "model": name, "url": f"http://sim/{name}", "runs": runs,
               "temperature_sent": False, "temperature": None}
    (out / SUMMARY_FILE).write_text(json.dumps(summary) + "\n", encoding="utf-8")


def screenshot(chromium: str, page: Path, png: Path, width: int, height: int) -> None:
    """One PNG of ``page`` at ``width`` x ``height`` (the scripts, plotly's, run first)."""
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", f"--window-size={width},{height}",
                    "--virtual-time-budget=8000", f"--screenshot={png}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--a", type=Path, help="output folder of `eval run` for A (default: simulated)")
    ap.add_argument("--b", type=Path, help="output folder of `eval run` for B")
    ap.add_argument("--height", type=int, default=3400, help="page height captured (px)")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("eval_compare_screenshots: error: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    a, b = args.a, args.b
    if a is None or b is None:
        a, b = args.out / "sim-a", args.out / "sim-b"
        for folder, name, acc_m, acc_u, seed in ((a, "A", 0.80, 0.45, 1), (b, "B", 0.74, 0.44, 2)):
            simulated_run(folder, name, "mgsm", LANGS, 40, 3, acc_m, seed)
            simulated_run(folder, name, "mmlu", SUBJECTS, 25, 1, acc_u, seed)
    page = write_html(args.out / "compare.html", compare_dirs(a, b))
    for width in WIDTHS:
        png = args.out / f"compare-{width}.png"
        screenshot(chromium, page, png, width, args.height)
        print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
