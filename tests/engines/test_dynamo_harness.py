"""Fast checks of scripts/dynamo_harness.py that need no Dynamo install (part of the default suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_harness() -> ModuleType:
    if "dynamo_harness" in sys.modules:
        return sys.modules["dynamo_harness"]
    spec = importlib.util.spec_from_file_location("dynamo_harness", REPO / "scripts" / "dynamo_harness.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dynamo_harness"] = mod
    spec.loader.exec_module(mod)
    return mod


harness = _load_harness()


def test_harness_retries_a_failed_install_step(tmp_path: Path) -> None:
    """A pip step cut off by the network once succeeds on its next try; one that always fails is
    reported once, after its last try, with its output."""
    marker = tmp_path / "tried"
    harness._run(["bash", "-c", f'[ -e "{marker}" ] || {{ touch "{marker}"; exit 1; }}'], "flaky", attempts=3)
    assert marker.exists()
    with pytest.raises(harness.HarnessError, match=r"could not broken \(exit 3, 2 tries\): always"):
        harness._run(["bash", "-c", "echo always >&2; exit 3"], "broken", attempts=2)
