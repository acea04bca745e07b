"""``servelens gateway --workers 2`` as a child process in front of the sim: one ``/metrics`` that is the
exact sum over the workers, a SIGKILLed worker replaced with its counts kept, and bad input refused
in one line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servelens.core.snapshot import take_snapshot
from servelens.gateway.config import GatewayConfig, available_cores, load_config_file
from servelens.gateway.published import decode
from servelens.gateway.workers import reserve_port
from servelens.process import ServerProcess
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.names import MetricNames
from servelens.serving import PARENT_PID_ENV, READY_RE

START_S = 60.0
REQUESTS = 24
MORE = 10
N = MetricNames()


class Child:
    """A ``servelens gateway`` child whose stdout and stderr lines are read into one queue."""

    def __init__(self, argv: list[str]) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{PARENT_PID_ENV: str(os.getpid())})
        self.proc = subprocess.Popen([sys.executable, "-m", "servelens", "gateway", *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.lines.put(raw.decode(errors="replace").rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, pattern: str, timeout_s: float = START_S) -> re.Match[str]:
        """The first line (seen before or coming) that matches ``pattern``; AssertionError after
        ``timeout_s`` or when the child's output ends."""
        rx = re.compile(pattern)
        for line in self.seen:
            if m := rx.search(line):
                return m
        deadline = time.monotonic() + timeout_s
        ended = 0
        while True:
            try:
                got = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in {timeout_s} s: {self.seen[-5:]}") from None
            if got is None:
                ended += 1
                if ended == 2:
                    raise AssertionError(f"output ended before a line matching {pattern!r}: {self.seen[-5:]}")
                continue
            self.seen.append(got)
            if m := rx.search(got):
                return m

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        return self.proc.returncode


@contextmanager
def gateway(upstream: str, *extra: str) -> Iterator[tuple[Child, str, list[int], Path]]:
    """A ``--workers 2`` gateway on a free port: the child, its URL, the workers' pids, its state folder."""
    child = Child(["--upstream", upstream, "--host", "127.0.0.1", "--port", "0", "--workers", "2", *extra])
    try:
        url = child.wait_line(READY_RE.pattern).group(2)
        summary = child.wait_line(r"2 workers \(pids (\d+), (\d+)\).*\(state in (\S+)\)")
        yield child, url, [int(summary.group(1)), int(summary.group(2))], Path(summary.group(3))
    finally:
        assert child.stop() == 0
        assert "Traceback" not in "\n".join(child.seen)


async def _one(host: str, port: int, model: str, i: int) -> dict[str, int]:
    """One streamed chat request with ``Connection: close``, read to the connection's end (the gateway
    closes it after counting the request); returns the usage the client asked for."""
    body = json.dumps({"model": model, "stream": True, "max_tokens": 4 + i % 5,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": "word " * (10 + 40 * (i % 4))}]}).encode()
    r, w = await asyncio.open_connection(host, port)
    w.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await w.drain()
    data = await r.read()  # to EOF
    w.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert b"data: [DONE]" in data
    usage = [json.loads(line[6:])["usage"] for line in data.decode().split("\n")
             if line.startswith("data: {") and '"usage"' in line and json.loads(line[6:]).get("usage")]
    return {"isl": usage[-1]["prompt_tokens"], "osl": usage[-1]["completion_tokens"]}


def load(url: str, model: str, n: int, start: int = 0) -> list[dict[str, int]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def go() -> list[dict[str, int]]:
        sem = asyncio.Semaphore(6)

        async def one(i: int) -> dict[str, int]:
            async with sem:
                return await _one(host, int(port), model, i)

        return list(await asyncio.gather(*(one(i) for i in range(start, start + n))))

    return asyncio.run(go())


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed by prometheus_client: sample (name, sorted labels) -> value; a series that
    appears twice fails."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    seen = Counter[tuple[str, tuple[tuple[str, str], ...]]]()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            seen[key] += 1
            out[key] = s.value
    assert not [k for k, c in seen.items() if c > 1], "a series is written twice"
    assert not any("worker" in dict(labels) for _, labels in out), "no worker label"
    return out


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def check_sums(url: str, usages: list[dict[str, int]]) -> None:
    """On several scrapes (new connections: any worker answers), the sums are those of the requests sent."""
    n = len(usages)
    for _ in range(6):
        s = scrape(url)
        assert total(s, N.requests, status="success") == total(s, N.requests) == n
        assert total(s, N.inflight) == 0
        for h in (N.ttft, N.duration, N.isl, N.osl, N.cached, N.ttft_by_isl, N.duration_by_isl, N.osl_by_isl):
            assert total(s, f"{h}_count") == n, h
            assert total(s, f"{h}_bucket", le="+Inf") == n, h
        assert total(s, f"{N.isl}_sum") == sum(u["isl"] for u in usages)
        assert total(s, f"{N.osl}_sum") == total(s, f"{N.osl_by_isl}_sum") == sum(u["osl"] for u in usages)
        assert total(s, N.output_tokens) == sum(u["osl"] for u in usages)
        assert total(s, N.prompt_tokens_by_isl) == sum(u["isl"] for u in usages)
        # ITL: one observation per token after the first of each request
        assert total(s, f"{N.itl}_count") == total(s, f"{N.itl_by_isl}_count") == sum(u["osl"] - 1 for u in usages)


def _counted(folder: Path, pid: int) -> int:
    like = take_snapshot(FrontendMetrics(isl_buckets=GatewayConfig(upstream="http://x:1").isl_buckets).state)
    (path,) = folder.glob(f"worker-{pid}-*.pkl")  # worker-<pid>-<number>.pkl
    pub = decode(path.read_bytes(), like)
    return sum(c for m in pub.snapshot.models for _, c in m.requests)


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    with ServerProcess(["sim", "--speedup", "50", "--seed", "5"]) as s:
        yield s


def _model(sim: ServerProcess) -> str:
    with urllib.request.urlopen(f"{sim.url}/v1/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def test_two_workers_serve_one_exact_sum_and_keep_a_killed_workers_counts(sim: ServerProcess) -> None:
    model = _model(sim)
    with gateway(sim.url) as (child, url, pids, folder):
        usages = load(url, model, REQUESTS)
        check_sums(url, usages)
        counted = {pid: _counted(folder, pid) for pid in pids}
        assert sum(counted.values()) == REQUESTS

        victim = max(pids, key=lambda p: counted[p])  # the one that counted most: its counts must stay
        os.kill(victim, signal.SIGKILL)
        child.wait_line(rf"worker \d \(pid {victim}\) ended with signal SIGKILL; its counts are kept")
        replacement = int(child.wait_line(r"worker \d ready again \(pid (\d+)\)").group(1))
        assert replacement not in pids
        check_sums(url, usages)

        usages += load(url, model, MORE, start=REQUESTS)  # the gateway still serves, on both workers
        check_sums(url, usages)
    assert not folder.exists()  # SIGTERM: the workers stopped, the state folder removed
    for pid in (*pids, replacement):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_metrics_listener_of_two_workers_serves_the_sum(sim: ServerProcess) -> None:
    model = _model(sim)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        mport = probe.getsockname()[1]
    with gateway(sim.url, "--metrics-port", str(mport)) as (_, url, _pids, _folder):
        usages = load(url, model, 12)
        with pytest.raises(urllib.error.HTTPError):  # the API port does not expose the metrics
            scrape(url)
        check_sums(f"http://127.0.0.1:{mport}", usages)


def _refused(argv: list[str]) -> str:
    """Run the gateway with ``argv``; it must exit 2 with one line on stderr and no traceback."""
    done = subprocess.run([sys.executable, "-m", "servelens", "gateway", *argv], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servelens: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize(("workers", "message"), [
    ("0", "workers must be at least 1, got 0"),
    (str(4 * available_cores() + 1), f"workers must be at most {4 * available_cores()} (4 per core"),
    ("two", "workers must be a positive integer or auto"),
])
def test_bad_worker_counts_are_one_line(workers: str, message: str) -> None:
    assert message in _refused(["--upstream", "http://127.0.0.1:9", "--port", "0", "--workers", workers])


def test_ports_in_use_are_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _refused(["--upstream", "http://127.0.0.1:9", "--port", "0", "--workers", "2", "--metrics-port",
                         str(port)])
        assert f"cannot listen on 127.0.0.1:{port}" in line
        line = _refused(["--upstream", "http://127.0.0.1:9", "--port", str(port), "--workers", "2"])
        assert f"cannot listen on 127.0.0.1:{port}" in line


def test_a_port_that_another_workers_gateway_serves_is_in_use() -> None:
    # its workers listen with SO_REUSEPORT, which Linux lets any socket of the same user join: the
    # second gateway started and took half of the first one's connections
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            reserve_port("127.0.0.1", port)
    held, free = reserve_port("127.0.0.1", 0)
    try:
        assert free > 0 and all(s.getsockname()[1] == free for s in held)
    finally:
        for s in held:
            s.close()


def test_a_worker_that_cannot_start_stops_the_gateway_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "requests.jsonl"
    line = _refused(["--upstream", "http://127.0.0.1:9", "--port", "0", "--workers", "2", "--request-log",
                     str(missing)])
    assert line == f"servelens: error: {missing}: No such file or directory"


def test_workers_in_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "gateway.yaml"
    f.write_text("upstream: http://127.0.0.1:9\nworkers: 2\n")
    assert GatewayConfig.from_mapping(load_config_file(f)).worker_count == 2
    f.write_text("upstream: http://127.0.0.1:9\nworkers: auto\n")
    assert GatewayConfig.from_mapping(load_config_file(f)).worker_count == available_cores()
    assert GatewayConfig(upstream="http://127.0.0.1:9").worker_count == 1
    with pytest.raises(ValueError, match="at least 1"):
        GatewayConfig(upstream="http://127.0.0.1:9", workers=0)


def _wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Wait (on a pidfd: an event, not a sleep) until process ``pid`` has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        assert ready, f"process {pid} still runs after {timeout_s} s"
    finally:
        os.close(fd)


def test_a_killed_supervisor_leaves_no_worker_nor_state_folder(sim: ServerProcess) -> None:
    model = _model(sim)
    child = Child(["--upstream", sim.url, "--host", "127.0.0.1", "--port", "0", "--workers", "2"])
    try:
        url = child.wait_line(READY_RE.pattern).group(2)
        summary = child.wait_line(r"2 workers \(pids (\d+), (\d+)\).*\(state in (\S+)\)")
        pids, folder = [int(summary.group(1)), int(summary.group(2))], Path(summary.group(3))
        load(url, model, 4)
        child.proc.kill()  # SIGKILL: the supervisor can neither stop the workers nor remove the folder
        child.proc.wait(timeout=10)
        for pid in pids:  # Linux's SIGTERM (PR_SET_PDEATHSIG): each drains and ends
            _wait_gone(pid)
        assert not folder.exists()
    finally:
        child.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
