"""The common engine server (servelens.engines.server) with a stand-in engine: Python's
http.server on a free loopback port (default suite; no real engine)."""

from __future__ import annotations

import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from servelens.engines.harness import HarnessError, ScratchPaths, scratch_base_env
from servelens.engines.server import EngineServer, Launch, group_members


class StandInError(HarnessError):
    pass


@dataclass(eq=False)
class StandIn(EngineServer):
    """``python -m http.server`` as the engine ("/" answers 200 with a listing), or any command."""

    engine_name: ClassVar[str] = "stand-in"
    error: ClassVar[type[HarnessError]] = StandInError
    health_path: ClassVar[str] = "/"
    command: tuple[str, ...] = ()

    def launch(self, port: int) -> Launch:
        assert self.scratch is not None
        cmd = self.command or (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1")
        return Launch(cmd, scratch_base_env(ScratchPaths(self.scratch)), self.scratch, "stand-in")


def test_start_serves_on_loopback_and_stop_ends_it(tmp_path: Path) -> None:
    with StandIn(scratch=tmp_path, stop_timeout_s=5) as srv:
        assert srv.url.startswith("http://127.0.0.1:") and srv.port > 0
        with urllib.request.urlopen(srv.url + "/", timeout=5) as resp:
            assert resp.status == 200
        pid = srv.pid
        assert pid is not None and group_members(pid) == [pid]
        assert srv.log_path is not None and srv.log_path.parent == tmp_path / "logs"
        assert srv.log_path.name.startswith("stand-in-") and srv.log_path.name.endswith(f"-{srv.port}.log")
    assert group_members(pid) == []
    assert srv.stop() is None  # idempotent


def test_an_engine_that_exits_at_startup_is_reported_with_its_log(tmp_path: Path) -> None:
    srv = StandIn(scratch=tmp_path, command=("bash", "-c", "echo cannot load model; exit 3"))
    with pytest.raises(StandInError, match=r"stand-in exited with status 3 during startup .*\n.*cannot load model"):
        srv.start()
    assert srv._proc is None


def test_a_missing_program_is_a_harness_error(tmp_path: Path) -> None:
    srv = StandIn(scratch=tmp_path, command=(str(tmp_path / "no-such-server"),))
    with pytest.raises(StandInError, match="cannot start stand-in"):
        srv.start()


def test_an_engine_that_never_gets_healthy_times_out(tmp_path: Path) -> None:
    srv = StandIn(scratch=tmp_path, command=("sleep", "30"), startup_timeout_s=1.0, stop_timeout_s=2)
    with pytest.raises(StandInError, match=r"stand-in / not ready within 1 s"):
        srv.start()
    assert srv._proc is None  # stopped on the way out
