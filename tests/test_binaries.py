"""Tests that need outside programs (promtool, prometheus, victoria-metrics, nginx): skipped with the
reason when one is missing, failed instead under ``SERVELENS_REQUIRE_BINARIES=1``, which ``.ci/run`` sets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelens.testing.binaries import REQUIRE_ENV, find_binary, missing_reason, required

ROOT = Path(__file__).resolve().parents[1]
A_PROMTOOL_TEST = "tests/prometheus/test_collector.py::test_exposition_passes_promtool_check_metrics"


def test_missing_reason_names_the_program_and_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = missing_reason(["promtool", "victoria-metrics"])
    assert reason == "needs promtool, victoria-metrics (not installed: apt-get install prometheus victoria-metrics)"
    (tmp_path / "promtool").write_text("#!/bin/sh\n")
    (tmp_path / "promtool").chmod(0o755)
    assert find_binary("promtool") == str(tmp_path / "promtool")
    assert missing_reason(["promtool"]) is None


def test_required_only_for_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert not required()
    monkeypatch.setenv(REQUIRE_ENV, "0")
    assert not required()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    assert required()


def _run_without_binaries(tmp_path: Path, require: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != REQUIRE_ENV}
    env["PATH"] = str(tmp_path)  # nothing on it: promtool is missing
    if require:
        env[REQUIRE_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", A_PROMTOOL_TEST], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_a_promtool_test_skips_with_the_reason_and_fails_when_required(tmp_path: Path) -> None:
    if find_binary("promtool") not in (None, "/usr/bin/promtool"):
        pytest.skip("promtool is installed outside /usr/bin: emptying PATH does not hide it")
    skipped = _run_without_binaries(tmp_path, require=False)
    assert skipped.returncode == 0, skipped.stdout[-2000:]
    assert "1 skipped" in skipped.stdout
    assert "needs promtool (not installed: apt-get install prometheus)" in skipped.stdout
    failed = _run_without_binaries(tmp_path, require=True)
    assert failed.returncode != 0 and "1 error" in failed.stdout, failed.stdout[-2000:]
    assert f"{REQUIRE_ENV}=1 requires it" in failed.stdout


def test_ci_requires_the_binaries() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"export {REQUIRE_ENV}=1" in ci
    # set before the test command runs
    assert ci.index(f"export {REQUIRE_ENV}=1") < ci.index("python -m pytest -q\n")
