"""The soak benchmark (``benchmarks/soak.py``), short: 20 s at 50 streams through the gateway into the sim,
with the soak's seeded share of 503s, mid-stream errors and clients that leave. Asserted: counts only
(client = gateway = sim, by outcome; inflight back to 0; served after). The 10-minute, 500-stream run
and its memory and descriptor figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_short_soak_counts_every_request_once(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--duration-s", "20", "--streams", "50", "--sample-s", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["client"] == r["gateway"] == r["sim"], proc.stdout
    assert sum(r["client"].values()) == r["sent"] > 50
    assert r["client"]["success"] > r["sent"] / 2
    assert set(r["client"]) <= {"success", "overload", "backend_error", "cancelled"}, r["client"]
    assert r["gateway_inflight_after"] == 0 and r["sim_busy_after"] == 0 and r["served_after"]
    assert r["counts_match"] and r["ok"] and proc.returncode == 0
    # descriptors: the gateway's idle connections to clients and the sim close after the load
    assert r["after_idle"]["gateway"]["fds"] <= r["before"]["gateway"]["fds"] + 2, r["after_idle"]
