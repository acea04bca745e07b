"""Start servelens servers (``servelens sim``, ``servelens gateway``) as child processes.

Each server command accepts ``--port 0`` and prints one line
``servelens <name> listening on http://127.0.0.1:<port>`` once it is ready; :class:`ServerProcess`
waits for that line (bounded), exposes the URL, relays the rest of the child's output to a log
file, and stops the child with SIGTERM (SIGKILL after a grace period) on exit.
"""

from __future__ import annotations

import contextlib
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from servelens.serving import PARENT_PID_ENV, READY_RE


class ServerStartError(RuntimeError):
    """A child server exited or stayed silent before printing its ready line."""



def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago (the OS picks it; a server started later may still
    lose a race for it, which its start-up error then says)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port

class ServerProcess:
    """A ``servelens <command> ... --port 0`` child process.

    Args:
        command: the subcommand and its arguments, e.g. ``["sim", "--preset", "h100-llama3-8b"]``
            (``--port 0`` and ``--host 127.0.0.1`` are added unless present). The child is
            SIGTERMed by Linux when this process dies, even by SIGKILL (see
            :func:`servelens.serving.die_with_parent`).
        log_path: where the child's stdout/stderr go after the ready line (None: discarded).
        start_timeout_s: how long to wait for the ready line.
        open_files: ``(soft, hard)`` ``RLIMIT_NOFILE`` of the child (None: this process's).

    Raises:
        ServerStartError: when the child exits or prints nothing ready-like in time; the message
            carries the last lines it printed.
    """

    def __init__(
        self, command: Sequence[str], log_path: Path | None = None, start_timeout_s: float = 30.0,
        open_files: tuple[int, int] | None = None,
    ) -> None:
        args = list(command)
        if "--port" not in args:
            args += ["--port", "0"]
        if "--host" not in args:
            args += ["--host", "127.0.0.1"]
        self.args = [sys.executable, "-m", "servelens", *args]
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self.open_files = open_files
        self.startup_lines: list[str] = []
        """What the child printed up to and including its ready line."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    def start(self) -> ServerProcess:
        """Start the child and wait for its ready line; returns self."""
        # the child asks Linux to SIGTERM it when this process dies, even by SIGKILL
        # (serving.die_with_parent): it lives in its own session, which our signals do not reach
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{PARENT_PID_ENV: str(os.getpid())})
        limits = self.open_files

        def child_limits() -> None:
            if limits is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, limits)

        self.proc = subprocess.Popen(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=child_limits if limits is not None else None,
        )
        assert self.proc.stdout is not None
        out: IO[bytes] = self.proc.stdout
        seen = self.startup_lines
        deadline = time.monotonic() + self.start_timeout_s
        sel = selectors.DefaultSelector()
        sel.register(out, selectors.EVENT_READ)
        buf = b""
        try:
            while not self.url:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServerStartError(self._failure("did not report ready in time", seen))
                if not sel.select(timeout=min(left, 0.5)):
                    if self.proc.poll() is not None:
                        raise ServerStartError(self._failure(f"exited with status {self.proc.returncode}", seen))
                    continue
                data = os.read(out.fileno(), 65536)
                if not data:
                    self.proc.wait(timeout=5)
                    raise ServerStartError(self._failure(f"exited with status {self.proc.returncode}", seen))
                buf += data
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    line = raw.decode(errors="replace")
                    seen.append(line)
                    m = READY_RE.match(line)
                    if m:
                        self.url = m.group(2).rstrip("/")
        except BaseException:
            self.stop()
            raise
        finally:
            sel.close()
        self._pump = threading.Thread(target=self._drain, args=(out, buf), daemon=True)
        self._pump.start()
        return self

    def _failure(self, what: str, seen: list[str]) -> str:
        tail = " | ".join(line for line in seen[-5:] if line.strip())
        return f"servelens {self.args[3]} {what}" + (f": {tail}" if tail else "")

    def _drain(self, out: IO[bytes], first: bytes) -> None:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            if log and first:
                log.write(first)
            while True:
                data = os.read(out.fileno(), 65536)
                if not data:
                    break
                if log:
                    log.write(data)
                    log.flush()
        except OSError:
            pass
        finally:
            if log:
                log.close()

    def stop(self, grace_s: float = 5.0) -> int | None:
        """SIGTERM the child (its whole process group), SIGKILL after ``grace_s``; returns its status
        (None if it has still not exited). Never raises."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                # never raise from here (it would mask the error that made us stop the child)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
        if self._pump is not None:
            self._pump.join(timeout=2)
        return proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
