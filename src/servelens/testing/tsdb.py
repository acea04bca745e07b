"""Real Prometheus and VictoriaMetrics servers for tests: started on 127.0.0.1 free ports with a
temporary data directory and a 1 s scrape interval, always stopped (context managers).

Uses the Debian binaries ``prometheus`` (2.42) and ``victoria-metrics`` (1.79) from ``PATH``.

Example::

    with run_prometheus(["127.0.0.1:8000"], rule_files=[rules]) as prom:
        prom.wait_until("up", lambda s: any(x.value == 1 for x in s))
        print(prom.client.query("up"))
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from servelens.process import free_port
from servelens.report.promapi import PromApiError, PromClient, Series

PROMETHEUS_BIN = "prometheus"
VICTORIA_METRICS_BIN = "victoria-metrics"


class TsdbError(RuntimeError):
    """A server did not start, exited early, or a condition was not met in time."""


@dataclass(frozen=True)
class TsdbServer:
    """A running Prometheus-compatible server.

    Attributes:
        kind: ``prometheus`` or ``victoria-metrics``.
        url: base URL of its HTTP API (``http://127.0.0.1:PORT``).
        data_dir: its temporary data directory.
        log_path: its combined stdout/stderr.
    """

    kind: str
    url: str
    data_dir: Path
    log_path: Path

    @property
    def client(self) -> PromClient:
        """A :class:`PromClient` for this server."""
        return PromClient(self.url, timeout_s=5.0)

    def log_tail(self, n: int = 2000) -> str:
        """The last ``n`` characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_until(
        self, expr: str, predicate: Callable[[list[Series]], bool], timeout_s: float = 30.0, poll_s: float = 0.2
    ) -> list[Series]:
        """Poll the instant query ``expr`` until ``predicate(result)`` holds; return that result.

        Raises TsdbError after ``timeout_s`` seconds (with the last result or error).
        """
        deadline = time.monotonic() + timeout_s
        last: object = None
        tick = threading.Event()
        while True:
            try:
                got = self.client.query(expr)
                if predicate(got):
                    return got
                last = got
            except PromApiError as exc:
                last = exc
            if time.monotonic() > deadline:
                raise TsdbError(f"{self.kind}: condition on {expr!r} not met in {timeout_s} s; last: {last!r}")
            tick.wait(poll_s)


def _target(t: str) -> tuple[str, str]:
    """``host:port`` and metrics path of a target given as ``host:port`` or a URL."""
    if "://" in t:
        rest = t.split("://", 1)[1]
        hostport, _, path = rest.partition("/")
        return hostport, "/" + path if path else "/metrics"
    return t, "/metrics"


def scrape_config(targets: Sequence[str], scrape_interval: str = "1s", rule_files: Sequence[str] = ()) -> dict:
    """A Prometheus configuration scraping ``targets`` (``host:port`` or ``http://host:port/path``)."""
    jobs = []
    for i, t in enumerate(targets):
        hostport, path = _target(t)
        jobs.append({
            "job_name": f"servelens{i}",
            "metrics_path": path,
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "static_configs": [{"targets": [hostport]}],
        })
    cfg: dict = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }
    if rule_files:
        cfg["rule_files"] = [str(p) for p in rule_files]
    return cfg


def _wait_ready(proc: subprocess.Popen[bytes], url: str, kind: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    tick = threading.Event()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TsdbError(f"{kind} exited with {proc.returncode}: {log.read_text(errors='replace')[-1500:]}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        tick.wait(0.1)
    raise TsdbError(f"{kind} not ready at {url} within {timeout_s} s: {log.read_text(errors='replace')[-1500:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def _run(kind: str, argv_for: Callable[[int, Path], list[str]], ready_path: str,
         timeout_s: float, tmp: Path) -> Iterator[TsdbServer]:
    if shutil.which(argv_for(0, tmp)[0]) is None:
        raise TsdbError(f"{argv_for(0, tmp)[0]} not found on PATH (Debian package {kind})")
    last_error: TsdbError | None = None
    for _attempt in range(3):  # a free port can be taken between picking and binding it
        port = free_port()
        data = tmp / f"data-{port}"
        data.mkdir()
        log = tmp / f"{kind}-{port}.log"
        with open(log, "wb") as logf:
            proc = subprocess.Popen(argv_for(port, data), stdout=logf, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            try:
                _wait_ready(proc, url + ready_path, kind, log, timeout_s)
            except TsdbError as exc:
                last_error = exc
                if "address already in use" in str(exc):
                    continue
                raise
            yield TsdbServer(kind, url, data, log)
            return
        finally:
            _stop(proc)
    raise last_error or TsdbError(f"{kind} did not start")


@contextmanager
def run_prometheus(
    targets: Sequence[str],
    rule_files: Sequence[str | Path] = (),
    scrape_interval: str = "1s",
    timeout_s: float = 30.0,
) -> Iterator[TsdbServer]:
    """Run Prometheus on a free 127.0.0.1 port, scraping ``targets`` every ``scrape_interval`` and
    evaluating ``rule_files`` as often. Stopped (SIGTERM, then SIGKILL) and its data removed on exit.

    Raises TsdbError when the binary is missing or the server does not become ready.
    """
    with tempfile.TemporaryDirectory(prefix="servelens-prom-") as d:
        tmp = Path(d)
        rules = []
        for i, rf in enumerate(rule_files):  # copy: rule paths are resolved relative to the config
            dst = tmp / f"rules-{i}.yml"
            shutil.copyfile(rf, dst)
            rules.append(str(dst))
        cfg = tmp / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(scrape_config(targets, scrape_interval, rules)))

        def argv(port: int, data: Path) -> list[str]:
            return [
                PROMETHEUS_BIN,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                "--storage.tsdb.retention.time=1d",
            ]

        with _run("prometheus", argv, "/-/ready", timeout_s, tmp) as server:
            yield server


@contextmanager
def run_victoria_metrics(
    targets: Sequence[str], scrape_interval: str = "1s", timeout_s: float = 30.0
) -> Iterator[TsdbServer]:
    """Run single-node VictoriaMetrics on a free 127.0.0.1 port with its built-in scraper
    (``-promscrape.config``) on ``targets``. Query latency offset and response cache are off, so
    fresh samples are visible at once. Stopped and its data removed on exit.

    Raises TsdbError when the binary is missing or the server does not become ready.
    """
    with tempfile.TemporaryDirectory(prefix="servelens-vm-") as d:
        tmp = Path(d)
        cfg = tmp / "scrape.yml"
        cfg.write_text(yaml.safe_dump(scrape_config(targets, scrape_interval)))

        def argv(port: int, data: Path) -> list[str]:
            return [
                VICTORIA_METRICS_BIN,
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-storageDataPath={data}",
                f"-promscrape.config={cfg}",
                "-promscrape.config.strictParse=false",
                "-search.latencyOffset=0s",
                "-search.disableCache",
                "-retentionPeriod=1d",
                "-loggerLevel=WARN",
            ]

        with _run("victoria-metrics", argv, "/health", timeout_s, tmp) as server:
            yield server
