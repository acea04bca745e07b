"""`servelens demo` tells the story (issue 17, section 6): three phases on the sim behind the gateway,
the per-bucket table for each, explain's verdicts against phase 1, report.html with the "without and
with" charts. Asserted by construction (the phases' traffic), not by timings: the shifted phase
moved the bucket shares toward long prompts (a positive mix effect); the slowed engine got phase 1's
very prompt lengths (no mix effect at all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servelens.bench.traces import read_trace
from servelens.core.decompose import VERDICTS
from servelens.demo_story import StoryConfig, phase_rate, write_trace


def test_the_shifted_phase_keeps_the_prompt_tokens_per_second(tmp_path: Path) -> None:
    config = StoryConfig(phase_s=400.0)
    rows = {}
    for name, share, seed in (("base", config.chat_share[0], 1), ("shift", config.chat_share[1], 2)):
        rows[name] = read_trace(write_trace(tmp_path / f"{name}.jsonl", config, share, seed))
        assert all(r.isl_tokens <= config.max_isl and r.osl_tokens == config.osl and not r.hash_ids
                   for r in rows[name])
    assert phase_rate(config, config.chat_share[0]) == config.rate
    assert phase_rate(config, config.chat_share[1]) < config.rate / 2  # fewer, longer prompts
    tokens = {k: sum(r.isl_tokens for r in v) / config.phase_s for k, v in rows.items()}
    assert tokens["shift"] == pytest.approx(tokens["base"], rel=0.15)  # the same prefill work per second
    assert np.mean([r.isl_tokens for r in rows["shift"]]) > 2 * np.mean([r.isl_tokens for r in rows["base"]])
    again = read_trace(write_trace(tmp_path / "again.jsonl", config, config.chat_share[0], 1))
    assert again == rows["base"]  # seeded


def test_demo_tells_the_story(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "servelens", "demo", "--duration", "6", "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout
    for heading in ("phase 1: baseline", "phase 2: traffic shifted toward long prompts",
                    "phase 3: phase 1's traffic, engine slowed on long prompts"):
        assert heading in text
    # per phase one client/server table, or the two one above the other where a cell would wrap
    assert text.count("Client vs server") + text.count("Client (exact percentiles)") == 3
    assert text.count("servelens explain: phase") == 2
    assert text.count("TTFT p50: the client-gateway hop") == 3  # which part of the gap is the hop, per phase
    assert text.count("\nTTFT p95 ") == 2 and "TTFT by ISL bucket, earlier→later" in text
    assert f"servelens explain --results {out / 'baseline'} {out / 'shift'}" in text
    shift = json.loads((out / "explain-shift.json").read_text())["metrics"]["TTFT"]
    slow = json.loads((out / "explain-slow.json").read_text())["metrics"]["TTFT"]
    assert shift["verdict"] in VERDICTS and slow["verdict"] in VERDICTS
    assert shift["mix_effect_s"] > 0 and shift["mix_effect_ci_s"][0] > 0  # the shares moved toward long prompts
    # phase 3 had phase 1's very prompt lengths: the same bucket counts, no mix effect
    assert [b["count_before"] for b in slow["buckets"]] == [b["count_after"] for b in slow["buckets"]]
    assert abs(slow["mix_effect_s"]) < 1e-12
    html = (out / "report.html").read_text()
    for title in ("Without per-bucket metrics: TTFT p95 of all requests over time", "at phase 1's bucket mix",
                  "With per-bucket metrics: p95 TTFT by input length over time", "engine slowed on long prompts"):
        assert title in html, title
    for name in ("baseline", "shift", "slow"):
        assert json.loads((out / name / "summary.json").read_text())["errors"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--time-scale", "2"], "--time-scale applies to a trace replay (--trace), not to the story"),
    (["--max-requests", "5"], "--max-requests applies to a trace replay"),
    (["--keep-running"], "--keep-running applies to a trace replay"),
    (["--duration", "-1"], "duration must be a finite number"),
])
def test_story_bad_flags_are_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from servelens.cli.main import main

    def no_servers(*_a: object, **_k: object) -> None:
        raise AssertionError("a server was started for bad flags")

    monkeypatch.setattr("servelens.demo.ServerProcess", no_servers)
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["demo", "--output-dir", str(tmp_path / "o"), *argv])
    assert rc == 2 and err.getvalue().count("\n") == 1 and message in err.getvalue(), err.getvalue()
