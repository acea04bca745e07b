"""Run the whole test suite several times in a row with CPU-bound busy loops beside it (issue 21).

The check of "no test fails because the machine is busy": ``--busy`` processes spin on the CPU
(one per core of a 2-core machine, as ``stress --cpu 2`` would) for the whole time, and the README's
test command runs ``--runs`` times in a row with no retries. The first failing run stops it (the count
is "in a row"). Each run's line is printed and appended to ``--log`` as JSON: run number, exit status,
wall time (s), the one-minute load average at its start and end, pytest's summary line.

Usage::

    python scripts/suite_under_load.py --runs 10 --busy 2 --log .scratch/suite_under_load.jsonl

Exit status: 0 when every run passed, 1 at the first failing run (its output tail is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BUSY_LOOP = "while True:\n    pass\n"


def _summary(out: str) -> str:
    """The last non-empty line of pytest's output (``N passed in T s``)."""
    lines = [line for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    """Start the busy loops, run the suite ``--runs`` times, stop the loops; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="suite runs in a row (default 10)")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound busy loops beside it (default 2)")
    ap.add_argument("--log", type=Path, default=Path(".scratch/suite_under_load.jsonl"))
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (default: none, the README's command)")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.busy < 0:
        print("error: --runs must be at least 1 and --busy at least 0", file=sys.stderr)
        return 2
    args.log.parent.mkdir(parents=True, exist_ok=True)
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    try:
        for run in range(1, args.runs + 1):
            load0 = os.getloadavg()[0]
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
                capture_output=True,
                text=True,
                check=False,
            )
            row = {
                "run": run,
                "rc": proc.returncode,
                "wall_s": round(time.monotonic() - t0, 1),
                "load_start": round(load0, 2),
                "load_end": round(os.getloadavg()[0], 2),
                "busy": args.busy,
                "summary": _summary(proc.stdout),
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            print(json.dumps(row), flush=True)
            with args.log.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            if proc.returncode != 0:
                print(proc.stdout[-8000:], proc.stderr[-2000:], sep="\n", flush=True)
                return 1
        return 0
    finally:
        for p in busy:
            p.kill()
            p.wait()


if __name__ == "__main__":
    raise SystemExit(main())
