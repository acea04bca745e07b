"""``servelens gateway --workers N``: N worker processes on the same port, one ``/metrics`` summed.

Shape: a small supervisor process (no event loop, no requests) and N workers forked from it. Each
worker is a whole gateway (:func:`~servelens.gateway.server.serve_worker`): its own event loop,
upstream connections and metric state, listening on the same port with ``SO_REUSEPORT``, so the
kernel spreads new connections over the workers' accept queues (no shared accept lock, no thundering
herd). The supervisor:

* binds the port(s) first (``SO_REUSEPORT``, not listening, so it takes no connection): a port in use is
  one error line before any worker starts, and ``--port 0`` picks one port for all the workers;
* forks the workers, waits until each says ``ready``, then prints the ready line (stdout) and the
  start-up summary (stderr);
* restarts a worker that dies (after 0.1 s, doubling up to 5 s while replacements die within a second
  of starting), keeping its counts (below), and says so on stderr;
* on SIGTERM/SIGINT passes SIGTERM to every worker (each drains as a single gateway does) and waits.

Workers live in their own process group (a Ctrl-C reaches the supervisor alone, which stops them in
order) and get SIGTERM from Linux when the supervisor dies (``PR_SET_PDEATHSIG``).

Why state files rather than asking the siblings at scrape time (:mod:`.published`): a worker writes its
whole state to a file of its own in memory (``/dev/shm``) each time it counts a request, before the
connection of that request does anything else; a scrape on any worker writes its own file and serves
that plus the files of the others (so no counter goes back between scrapes that different workers
answer). So (1) nothing a worker counted is lost when it is SIGKILLed: its file stays, and
the supervisor moves it into the retired sum when it reaps it; what is lost are the requests it had
in flight, which no one finished (their clients see the connection reset) and which no
``requests_total`` holds, as with a single gateway killed; (2) a scrape needs no answer from a sibling
that may be busy, stuck or dead; (3) the workers' ``inflight`` is exact once the turn of the loop in
which a request began has ended. The cost is one snapshot and write per request (~0.1 ms at the
default buckets and edges), against a few ms of relaying per streamed request; prometheus_client's
multiprocess mode writes on every observation instead, and cannot hold our own histogram state.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from servelens.core.snapshot import take_snapshot
from servelens.gateway.config import GatewayConfig
from servelens.gateway.published import WorkerContext, abandon, retire, worker_key
from servelens.prometheus import FrontendMetrics
from servelens.serving import PARENT_PID_ENV, die_with_parent, listen_error, raise_open_files_limit, ready_line

RESTART_MIN_S = 0.1
"""Delay before a dead worker's replacement starts; doubled (to :data:`RESTART_MAX_S`) while
replacements die within :data:`QUICK_DEATH_S` of their start."""
RESTART_MAX_S = 5.0
QUICK_DEATH_S = 1.0
STOP_GRACE_S = 10.0
"""After the shutdown timeout, how long the supervisor waits for a worker before it SIGKILLs it."""


def reserve_port(host: str, port: int) -> tuple[list[socket.socket], int]:
    """Bind ``host:port`` (0: a free port) with ``SO_REUSEPORT`` on every address ``host`` resolves to,
    without listening: the workers bind the same port, and a port already in use is an error here (one
    that another ``--workers`` gateway holds with ``SO_REUSEPORT`` too).
    Returns the sockets (keep them open while the workers run) and the port. Raises OSError (one line)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise listen_error(host, port, exc) from None
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            # First as a single gateway binds (no SO_REUSEPORT): Linux lets any socket of this user
            # with SO_REUSEPORT join a port, so another --workers gateway already there would
            # otherwise get half the connections of this one, silently.
            with socket.socket(family, kind, proto) as probe:
                _options(probe, family, reuse_port=False)
                probe.bind((addr[0], port, *addr[2:]))
                port = probe.getsockname()[1]  # the first one picks the port for 0
            s = socket.socket(family, kind, proto)
            held.append(s)
            _options(s, family, reuse_port=True)
            s.bind((addr[0], port, *addr[2:]))
    except OSError as exc:
        for s in held:
            s.close()
        raise listen_error(host, port, exc) from None
    return held, port


def _options(s: socket.socket, family: int, reuse_port: bool) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)


@dataclass
class _Worker:
    slot: int
    pid: int
    ready_fd: int
    started: float
    number: int = 0  # the supervisor's count of workers started before it: with the pid, its state's key
    ready: bool = False
    buffer: bytes = b""
    error: str = ""  # the reason it wrote when it could not start


class Supervisor:
    """Runs ``config.worker_count`` gateway workers (see the module docstring).

    Args:
        config: the gateway's configuration (``workers`` above 1).
        use_uvloop: the workers' event loop (as :func:`~servelens.gateway.server.run`).
    """

    def __init__(self, config: GatewayConfig, use_uvloop: bool = True) -> None:
        self.config = config
        self.use_uvloop = use_uvloop
        self.workers: dict[int, _Worker] = {}
        """By pid."""
        self._sel = selectors.DefaultSelector()
        self._wake_r = self._wake_w = -1
        self._stopping = False
        self._restart_at: dict[int, float] = {}
        self._delay: dict[int, float] = {}
        self._failure = ""
        self._told = False  # the workers were sent SIGTERM (a stop began)
        self._started = 0  # workers started so far (each one's number: its state file's key with its pid)
        self.directory = Path()
        self._like = take_snapshot(FrontendMetrics(
            prefix=config.metrics_prefix, isl_buckets=config.isl_buckets, uncached_buckets=config.uncached_buckets,
            edges=config.metric_edges, stock=not config.by_isl_only, slo=config.slo).state)
        """An empty snapshot of the config: the edges and labels of the workers' files."""

    def run(self) -> int:
        """Start the workers, print the ready line once all are ready, supervise until SIGTERM/SIGINT.
        Returns 0. Raises OSError for a port that cannot be bound, ValueError (one line) when a worker
        fails to start (its reason)."""
        die_with_parent()
        raise_open_files_limit()  # inherited by the workers
        cfg = self.config
        held, port = reserve_port(cfg.host, cfg.port)
        try:
            if cfg.metrics_port is not None:
                mhost = cfg.metrics_host if cfg.metrics_host is not None else cfg.host
                mheld, mport = reserve_port(mhost, cfg.metrics_port)
                held += mheld
                cfg = replace(cfg, metrics_port=mport)
            self.config = replace(cfg, port=port)
            shm = Path("/dev/shm")
            self.directory = Path(tempfile.mkdtemp(prefix="servelens-gateway-",
                                                   dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))
            return self._supervise()
        finally:
            for s in held:
                s.close()
            if self.directory != Path():
                shutil.rmtree(self.directory, ignore_errors=True)

    def _supervise(self) -> int:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous = signal.set_wakeup_fd(self._wake_w)
        handlers = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT)}
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            for slot in range(self.config.worker_count):
                self._spawn(slot)
            summary = self._wait_ready()
            if summary is None:
                return self._stop()
            pids = ", ".join(str(w.pid) for w in sorted(self.workers.values(), key=lambda w: w.slot))
            host = self.config.host if self.config.host not in ("0.0.0.0", "") else "127.0.0.1"
            print(f"{summary}; {self.config.worker_count} workers (pids {pids}), /metrics summed over them "
                  f"(state in {self.directory})",
                  file=sys.stderr, flush=True)
            print(ready_line("gateway", f"http://{host}:{self.config.port}"), flush=True)
            while not self._stopping:
                self._step(self._next_timeout())
            return self._stop()
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)
            signal.set_wakeup_fd(previous)
            self._sel.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    # -- workers ---------------------------------------------------------------------------
    def _spawn(self, slot: int) -> None:
        r, w = os.pipe()
        number = self._started
        self._started += 1
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(r)
            self._become_worker(slot, w, number)
        os.close(w)
        self.workers[pid] = _Worker(slot, pid, r, time.monotonic(), number)
        self._sel.register(r, selectors.EVENT_READ, pid)

    def _become_worker(self, slot: int, ready_fd: int, number: int) -> None:
        code = 0
        supervisor = os.getppid()
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            for fd in [self._wake_r, self._wake_w, *(w.ready_fd for w in self.workers.values())]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            os.setpgid(0, 0)  # a Ctrl-C reaches the supervisor alone, which stops the workers
            os.environ[PARENT_PID_ENV] = str(os.getppid())  # die_with_parent: SIGTERM when it dies
            from servelens.gateway.server import run_loop, serve_worker

            ctx = WorkerContext(self.directory, ready_fd, slot, number)
            run_loop(serve_worker(self.config, ctx), self.use_uvloop)
        except BaseException as exc:  # told to the supervisor, which prints one line
            if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
                reason = f"{exc.filename}: {exc.strerror}"
            else:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            with contextlib.suppress(OSError):
                os.write(ready_fd, f"error {reason}\n".encode())
            code = 2
        finally:
            if os.getppid() != supervisor:  # it was killed: no one will retire this worker's file
                abandon(self.directory, worker_key(os.getpid(), number))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _wait_ready(self) -> str | None:
        """The first worker's start-up summary once every worker is ready; None when told to stop
        first. Raises ValueError with a worker's reason when one fails to start."""
        summary: str | None = None
        while not all(w.ready for w in self.workers.values()) or len(self.workers) < self.config.worker_count:
            if self._stopping:
                return None
            for line, w in self._step(None):
                if line.startswith("error ") and not self._failure:
                    self._failure = line[6:]
                elif w.slot == 0:
                    summary = line[6:]
            if self._failure:
                self._stop()
                raise ValueError(self._failure)
        return summary or ""

    def _step(self, timeout: float | None) -> list[tuple[str, _Worker]]:
        """One wait: signals, workers' lines (returned), deaths, due restarts."""
        lines: list[tuple[str, _Worker]] = []
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    for signum in os.read(self._wake_r, 512):
                        if signum in (signal.SIGTERM, signal.SIGINT):
                            if self._told:  # a second signal during the drain: each worker cuts at once
                                self._tell_workers()
                            self._stopping = True
                continue
            w = self.workers.get(key.data)
            data = os.read(key.fd, 4096) if w is not None else b""
            if w is None or not data:
                self._sel.unregister(key.fd)
                os.close(key.fd)
                if w is not None:
                    w.ready_fd = -1
                continue
            w.buffer += data
            while b"\n" in w.buffer:
                raw, w.buffer = w.buffer.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith("error "):
                    w.error = line[6:]
                if line.startswith("ready"):
                    w.ready = True
                    if w.slot in self._delay:  # a replacement
                        print(f"servelens gateway: worker {w.slot} ready again (pid {w.pid})", file=sys.stderr,
                              flush=True)
                lines.append((line, w))
        self._reap()
        now = time.monotonic()
        for slot, at in list(self._restart_at.items()):
            if at <= now and not self._stopping:
                del self._restart_at[slot]
                self._spawn(slot)
        return lines

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            w = self.workers.pop(pid, None)
            if w is None:
                continue
            if w.ready_fd >= 0:
                self._last_words(w)
                self._sel.unregister(w.ready_fd)
                os.close(w.ready_fd)
            retire(self.directory, worker_key(pid, w.number), self._like)  # its counts stay in the sum
            how = (f"signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
                   if os.WIFSIGNALED(status) else f"status {os.waitstatus_to_exitcode(status)}")
            if self._stopping:
                continue
            if not w.ready and w.slot not in self._delay:  # at the first start: the gateway does not start
                ended = f"gateway worker {w.slot} ended with {how} before it was ready"
                self._failure = self._failure or w.error or ended
                continue
            quick = time.monotonic() - w.started < QUICK_DEATH_S
            delay = min(RESTART_MAX_S, self._delay.get(w.slot, RESTART_MIN_S) * 2) if quick else RESTART_MIN_S
            self._delay[w.slot] = delay
            self._restart_at[w.slot] = time.monotonic() + delay
            why = f" ({w.error})" if w.error else ""  # a replacement that could not start says why
            print(f"servelens gateway: worker {w.slot} (pid {pid}) ended with {how}{why}; its counts are kept; "
                  f"restarting it in {delay:g} s", file=sys.stderr, flush=True)

    @staticmethod
    def _last_words(w: _Worker) -> None:
        """Read what an ended worker wrote that the selector had not yet reported (its ``error`` line
        into ``w.error``): a reap in the same step as its exit would otherwise lose it."""
        os.set_blocking(w.ready_fd, False)
        with contextlib.suppress(OSError):
            while chunk := os.read(w.ready_fd, 4096):
                w.buffer += chunk
        for raw in w.buffer.split(b"\n"):
            if raw.startswith(b"error ") and not w.error:
                w.error = raw[6:].decode(errors="replace")

    def _tell_workers(self) -> None:
        """SIGTERM to every worker: the first starts its drain, a second cuts its requests at once
        (counted ``cancelled``), as two signals do to a single gateway."""
        for pid in list(self.workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _next_timeout(self) -> float | None:
        if not self._restart_at:
            return None
        return max(0.0, min(self._restart_at.values()) - time.monotonic())

    def _stop(self) -> int:
        """SIGTERM every worker, wait for them (the shutdown timeout, then :data:`STOP_GRACE_S`, then
        SIGKILL). Returns 0."""
        self._stopping = True
        self._restart_at.clear()
        self._tell_workers()
        self._told = True
        deadline = time.monotonic() + self.config.shutdown_timeout_s + STOP_GRACE_S
        while self.workers:
            left = deadline - time.monotonic()
            if left <= 0:
                for pid in list(self.workers):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + STOP_GRACE_S
                continue
            self._step(min(left, 0.5))
        return 0
