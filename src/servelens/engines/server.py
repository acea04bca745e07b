"""An engine's server process on a free loopback port: started in its own process group at lower
priority, ready when its health endpoint answers 200, stopped (the whole group) with SIGTERM, then
SIGKILL; and the ``serve`` CLI loop. Each harness subclasses :class:`EngineServer` with its
:meth:`~EngineServer.launch` (:mod:`servelens.engines.vllm_cpu`, :mod:`servelens.engines.llama_cpp`).

Only the standard library is imported here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from servelens.engines.harness import HarnessError, ScratchPaths, default_scratch, log_tail
from servelens.process import free_port

STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0

ENGINE_NICE = 5
"""Engines run this much nicer than the caller. On 2 cores the engine, the gateway and the client
share the machine; at equal priority a busy engine could starve the side that measures it (a client
disconnect then went unnoticed for seconds with vLLM). Where the engine has a core to itself its
speed is unchanged."""


def health_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET url`` answers 200 within ``timeout_s``."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def lower_priority() -> None:
    """Runs in the engine's child process before exec: :data:`ENGINE_NICE`."""
    os.nice(ENGINE_NICE)


@dataclass(frozen=True)
class Launch:
    """How to start an engine: ``cmd`` run in ``cwd`` with ``env``; its log is named
    ``<log_prefix>-<time>-<port>.log`` in the scratch folder's ``logs/``."""

    cmd: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    log_prefix: str


@dataclass(eq=False)
class EngineServer:
    """A running engine server on 127.0.0.1; use as a context manager (or start/stop).

    Subclasses set :attr:`engine_name` and :attr:`error`, and implement :meth:`launch` (install
    and build on first use, then return the command for a port). ``start()`` runs the command in
    its own process group, at :data:`ENGINE_NICE`, on a free loopback port (``port=0``), and
    returns once ``GET <url><health_path>`` is 200. ``stop()`` sends SIGTERM to the whole group,
    then SIGKILL after ``stop_timeout_s``; it also runs at interpreter exit.

    Attributes set by ``start()``: ``url`` (``http://127.0.0.1:PORT``), ``port``, ``pid``,
    ``log_path``.

    Raises (``start``): :attr:`error` when the install or build fails, the engine exits during
    startup (the message carries the log tail), or the health check is not 200 within
    ``startup_timeout_s``.
    """

    engine_name: ClassVar[str] = "engine"
    error: ClassVar[type[HarnessError]] = HarnessError
    health_path: ClassVar[str] = "/health"

    scratch: Path | None = None
    port: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    stop_timeout_s: float = STOP_TIMEOUT_S
    echo_log: bool = False
    url: str = field(default="", init=False)
    pid: int | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def launch(self, port: int) -> Launch:
        """Install and build what is missing; the command that serves on ``port``."""
        raise NotImplementedError

    @property
    def logs_dir(self) -> Path:
        """Where start() writes the server's log."""
        return ScratchPaths(Path(self.scratch).resolve() if self.scratch is not None else default_scratch()).logs

    def start(self) -> Self:
        """Install/build if needed, start the engine, wait for its health check; returns self."""
        if self._proc is not None:
            return self
        port = self.port or free_port()
        spec = self.launch(port)
        logs = self.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{spec.log_prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        log_fh = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                list(spec.cmd),
                env=dict(spec.env),
                cwd=str(spec.cwd),
                stdin=subprocess.DEVNULL,
                stdout=None if self.echo_log else log_fh,
                stderr=None if self.echo_log else subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lower_priority,
            )
        except OSError as exc:
            raise self.error(f"cannot start {self.engine_name}: {exc.strerror or exc} ({spec.cmd[0]})") from None
        finally:
            log_fh.close()
        _LIVE.add(self)
        try:
            self.pid = self._proc.pid
            self.port = port
            self.url = f"http://127.0.0.1:{port}"
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise self.error(
                    f"{self.engine_name} exited with status {self._proc.returncode} during startup "
                    f"(log: {self.log_path}):\n{log_tail(self.log_path) if self.log_path else ''}"
                )
            if health_ok(self.url + self.health_path):
                return
            # Poll the process and the health check together: wait on the process for a short bound.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=0.5)
        raise self.error(
            f"{self.engine_name} {self.health_path} not ready within {self.startup_timeout_s:.0f} s "
            f"(log: {self.log_path})"
        )

    def wait(self) -> int:
        """Block until the engine exits; its exit status (1 if it was never started)."""
        proc = self._proc
        return proc.wait() if proc is not None else 1

    def stop(self) -> int | None:
        """SIGTERM the engine's process group, SIGKILL it after ``stop_timeout_s``; idempotent.
        Returns the server's exit status (None if it was never started)."""
        with self._lock:
            proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: the server leads its own group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout_s)
        # Children may outlive the server: kill what is left, and wait for it to be gone (a SIGKILL
        # is delivered asynchronously)
        if not self._group_exited(proc, pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            self._group_exited(proc, pgid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout_s)
        return proc.returncode

    def _group_exited(self, proc: subprocess.Popen[bytes], pgid: int) -> bool:
        """Wait up to ``stop_timeout_s`` until no process of group ``pgid`` runs (reaping the server
        meanwhile); True when none does."""
        deadline = time.monotonic() + self.stop_timeout_s
        while group_members(pgid):
            if time.monotonic() >= deadline:
                return False
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2)
            else:
                time.sleep(0.02)
        return True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from ``/proc`` (Linux); elsewhere
    ``[pgid]`` while ``killpg(pgid, 0)`` succeeds. A zombie has exited and holds no resources, but
    it stays in the group until its new parent reaps it, so ``killpg`` alone would count it."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    out: list[int] = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


_LIVE: set[EngineServer] = set()


def _stop_all() -> None:
    for srv in list(_LIVE):
        srv.stop()


atexit.register(_stop_all)


def serve_until_signal(srv: EngineServer, prog: str, describe: str) -> int:
    """The CLI's ``serve``: start ``srv``, print ``<describe> listening on URL (...)``, and run
    until SIGTERM/SIGINT (exit 0, engine stopped) or until the engine exits by itself (exit 1)."""

    def _on_signal(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise SystemExit(0)  # unwinds through `with srv`, which stops the engine

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with srv:
        model = getattr(srv, "model", "?")
        print(f"{describe} listening on {srv.url} (model {model}, log {srv.log_path})", flush=True)
        code = srv.wait()
        print(f"{prog}: engine exited with status {code}", file=sys.stderr)
        return 1
