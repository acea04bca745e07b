"""Replicas add up (issue 20): three gateway processes, started with deploy/'s container command line,
behind nginx's round robin, one real Prometheus scraping all three with deploy/'s PrometheusRule loaded.
In front of nginx a fourth gateway takes the very same requests alone (bench -> single gateway -> nginx
-> three gateways -> sim).

Per ISL bucket, the Requests from ``servelens report --prometheus`` equal the bench's and the single
gateway's exactly. TTFT mean and p95 from the report, from the dashboard's panel queries and from the
recording rules equal the three gateways' own observations (their request logs, merged) within what the
``le`` edges and ``rate()``'s extrapolation allow (a mean and a p95 inside the span of the
observations, since each instance's rate is extrapolated by its own factor). Against the bench and the
single gateway the TTFT is nested, request by request (the client's interval holds the single gateway's,
which holds a replica's), so per bucket the figures are ordered: replicas <= single gateway <= bench,
exactly for the exact figures and within the ``le`` resolution for the histogram ones (how far apart they
are is the hops' time, which on a loaded machine is scheduling delay and no property of servelens). The
recording rules sum across instances: one series per model and bucket, and each rule expression equals
the same figure computed here from the three instances' own series at the same evaluation time."""

from __future__ import annotations

import asyncio
import io
import json
import math
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelens.bench import BenchConfig, run_bench
from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.quantiles import bucket_bounds, histogram_quantile
from servelens.dashboards.grafana import grafana_dashboard, substitute_variables
from servelens.dashboards.rules import record_name
from servelens.formats.metrics_text import Scrape, parse_scrape
from servelens.gateway.requestlog import read_request_log
from servelens.process import ServerProcess, free_port
from servelens.prometheus.names import MetricNames, default_edges
from servelens.sim.testing import TEST_SPEEDUP
from servelens.testing.nginx import run_nginx
from servelens.testing.tsdb import run_prometheus

pytestmark = pytest.mark.binaries("prometheus", "nginx")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BUCKETS = IslBuckets.default()
NAMES = MetricNames()
REPLICAS = 3
REQUESTS = 48
USED = ("0-512", "513-1024", "1025-2048", "2049-4096")


def _deploy_docs(folder: Path) -> list[dict[str, Any]]:
    """The documents of a resources-only kustomization (tests/dashboards/test_kubernetes.py checks it)."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for res in kust["resources"]:
        path = (folder / res).resolve()
        docs.extend(_deploy_docs(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d])
    return docs


DOCS = _deploy_docs(DEPLOY / "overlays" / "gateway")
(DEPLOYMENT,) = (d for d in DOCS if d["kind"] == "Deployment")
(RULE,) = (d for d in DOCS if d["kind"] == "PrometheusRule")


def gateway_argv(upstream: str, metrics_port: int) -> list[str]:
    """The Deployment's gateway command line, on loopback: host, ports and upstream replaced."""
    (container,) = DEPLOYMENT["spec"]["template"]["spec"]["containers"]
    args = list(container["args"])
    for flag, value in (("--upstream", upstream), ("--host", "127.0.0.1"), ("--port", "0"),
                        ("--metrics-port", str(metrics_port))):
        args[args.index(flag) + 1] = value
    return args


@contextmanager
def run_gateway_process(upstream: str, request_log: Path) -> Iterator[tuple[ServerProcess, str]]:
    """A ``servelens gateway`` child with the Deployment's flags (and a request log: each request's own
    TTFT); yields it and its metrics URL."""
    for attempt in range(3):  # the free metrics port can be taken before the child binds it
        port = free_port()
        try:
            gw = ServerProcess([*gateway_argv(upstream, port), "--request-log", str(request_log)]).start()
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        try:
            yield gw, f"http://127.0.0.1:{port}/metrics"
        finally:
            gw.stop()
        return


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return parse_scrape(resp.read().decode())


def wait_for(what: str, predicate: Any, timeout_s: float = 30.0) -> None:
    """Poll ``predicate()`` (bounded) until it holds."""
    deadline = time.monotonic() + timeout_s
    tick = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not met in {timeout_s} s: {what}")
        tick.wait(0.1)


def counts(s: Scrape, family: str) -> dict[str, float]:
    """``{bucket: _count}`` of a by-ISL histogram in one scrape."""
    return {b: s.value(f"{family}_count", {"isl_bucket": b}) for b in BUCKETS.labels}


def report_rows(*argv: str) -> dict[str, dict[str, Any]]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["report", *argv, "--format", "json"]) == 0
    return {r["bucket"]: r for r in json.loads(buf.getvalue())}


EDGES = default_edges(NAMES.prefix).ttft_s  # the fine edges the gateways export


@dataclass(frozen=True)
class Exact:
    """Exact per-bucket TTFT figures of one set of requests."""

    n: dict[str, int]
    mean: dict[str, float]
    values: dict[str, list[float]]  # sorted

    @classmethod
    def of(cls, pairs: list[tuple[str, float]]) -> Exact:
        by: dict[str, list[float]] = defaultdict(list)
        for bucket, ttft in pairs:
            by[bucket].append(ttft)
        return cls({b: len(v) for b, v in by.items()}, {b: sum(v) / len(v) for b, v in by.items()},
                   {b: sorted(v) for b, v in by.items()})

    def p95(self, b: str) -> float:
        """Nearest rank: the order statistic ``ceil(0.95 n)``, on which histogram_quantile's rank falls."""
        v = self.values[b]
        return v[math.ceil(0.95 * len(v)) - 1]

    def p95_range(self, b: str) -> tuple[float, float]:
        """Where a histogram p95 of these observations can lie: from the lower ``le`` edge of the order
        statistic before the nearest rank to the upper edge of the one after it (histogram_quantile
        interpolates inside the bucket its rank falls in). For counts taken as they are (a scrape)."""
        v = self.values[b]
        k = math.ceil(0.95 * len(v)) - 1
        return bucket_bounds(v[max(0, k - 1)], EDGES)[0], bucket_bounds(v[min(len(v) - 1, k + 1)], EDGES)[1]

    def allows_p95(self, b: str, x: float | None) -> bool:
        lo, hi = self.p95_range(b)
        return x is not None and lo <= x <= hi

    def allows_rate_mean(self, b: str, x: float | None) -> bool:
        """A mean over several instances' ``rate()``: each instance's sum and count are scaled by its own
        extrapolation factor, so the instances are weighed wrongly (seen: half the exact mean in one run).
        What holds whatever the weights: it lies between the smallest and the largest observation."""
        v = self.values[b]
        return x is not None and v[0] <= x <= v[-1]

    def upper(self, b: str) -> float:
        """The upper ``le`` edge of the largest observation: no quantile of them lies above it."""
        return bucket_bounds(self.values[b][-1], EDGES)[1]

    def allows_rate_p95(self, b: str, x: float | None) -> bool:
        """A p95 over several instances' ``rate()``: each instance's counts are scaled by its own
        extrapolation factor, so the rank can move by several observations (seen: a 15-request bucket's
        p95 two order statistics below the nearest rank). What holds whatever the weights: the quantile
        of a weighted mix of these observations lies in the ``le`` span from the smallest to the largest.
        That the rules add the instances up exactly is checked apart (check_rules_sum_across_instances)."""
        v = self.values[b]
        return x is not None and bucket_bounds(v[0], EDGES)[0] <= x <= bucket_bounds(v[-1], EDGES)[1]


def from_logs(*paths: Path) -> Exact:
    entries: list[dict[str, Any]] = [e for p in paths for e in read_request_log(p)]
    return Exact.of([(e["bucket"], e["ttft_s"]) for e in entries])


def test_three_replicas_add_up_to_one_gateway_and_the_bench(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": RULE["spec"]["groups"]}))
    logs = [tmp_path / f"replica-{i}.jsonl" for i in range(REPLICAS)]
    with ExitStack() as stack:
        sim = stack.enter_context(ServerProcess(["sim", "--speedup", str(TEST_SPEEDUP), "--seed", "3"]))
        replicas = [stack.enter_context(run_gateway_process(sim.url, log)) for log in logs]
        lb = stack.enter_context(run_nginx([gw.url for gw, _ in replicas]))
        single, single_metrics = stack.enter_context(run_gateway_process(lb.url, tmp_path / "single.jsonl"))
        prom = stack.enter_context(run_prometheus([m for _, m in replicas], rule_files=[rules]))
        prom.wait_until("up", lambda r: len(r) == REPLICAS and all(x.value == 1 for x in r))
        # every bucket's series at zero on every replica before the first request: exact counts
        prom.wait_until(f"{NAMES.ttft_by_isl}_count", lambda r: len(r) == REPLICAS * len(BUCKETS))

        result = asyncio.run(run_bench(BenchConfig(
            url=single.url, isl="300:1,800:1,1800:1,3000:1", osl="12", num_requests=REQUESTS, concurrency=6,
            seed=5, isl_buckets=BUCKETS.boundaries, output_dir=str(tmp_path / "bench"),
            continuous_usage=True,  # no probe request: the bench's requests are all there is
        )))
        assert result.errors == 0 and len(result.records) == REQUESTS

        # the replicas' own scrapes: each took its turn, and together they hold what the single one does
        # each gateway counts a request once it has relayed its end: just after the bench has read it
        wait_for("every gateway counted every request", lambda: (
            scrape(single_metrics).value(NAMES.requests) == REQUESTS
            and sum(scrape(m).value(NAMES.requests) for _, m in replicas) == REQUESTS
            and sum(len(read_request_log(p)) for p in [*logs, tmp_path / "single.jsonl"]) == 2 * REQUESTS))
        per_replica = [scrape(m) for _, m in replicas]
        alone = scrape(single_metrics)
        assert all(s.value(f"{NAMES.duration_by_isl}_count") > 0 for s in per_replica)
        for family in (NAMES.ttft_by_isl, NAMES.duration_by_isl, NAMES.itl_by_isl):
            summed: dict[str, float] = defaultdict(float)
            for s in per_replica:
                for b, n in counts(s, family).items():
                    summed[b] += n
            assert dict(summed) == counts(alone, family), family
        assert sum(s.value(NAMES.requests) for s in per_replica) == alone.value(NAMES.requests) == REQUESTS
        assert sum(s.value(NAMES.inflight) for s in per_replica) == alone.value(NAMES.inflight) == 0

        prom.wait_until(f"sum({NAMES.duration_by_isl}_count)", lambda r: len(r) == 1 and r[0].value == REQUESTS)
        prom.wait_until(f"{record_name(NAMES.ttft_by_isl, 'p95')}{{isl_bucket=\"2049-4096\"}}",
                        lambda r: len(r) == 1 and not math.isnan(r[0].value))

        replicas_exact = from_logs(*logs)
        single_exact = from_logs(tmp_path / "single.jsonl")
        bench_exact = Exact.of([(BUCKETS.label(r.isl), r.ttft_s) for r in result.records if r.ttft_s is not None])
        client = {r.bucket: r for r in result.client_rows}
        three = report_rows("--prometheus", prom.url, "--window", "5m")
        one = report_rows("--metrics", single_metrics)
        assert list(three) == [*BUCKETS.labels, "all"]
        for b in [*BUCKETS.labels, "all"]:
            # counts: exact, the same on every side
            assert three[b]["requests"] == one[b]["requests"] == client[b].requests, b
            if b == "all":
                assert three[b]["requests"] == REQUESTS
                continue
            if b not in USED:
                assert client[b].requests == 0 and three[b]["ttft_p95_s"] is None
                continue
            assert replicas_exact.n[b] == single_exact.n[b] == bench_exact.n[b] == client[b].requests, b
            # the three replicas through Prometheus: their own observations, within the le edges
            assert replicas_exact.allows_rate_mean(b, three[b]["ttft_mean_s"]), (b, three[b])
            assert replicas_exact.allows_rate_p95(b, three[b]["ttft_p95_s"]), (b, three[b])
            # the single gateway's scrape: its own observations (no extrapolation: exact mean)
            assert one[b]["ttft_mean_s"] == pytest.approx(single_exact.mean[b], rel=1e-6), b
            assert single_exact.allows_p95(b, one[b]["ttft_p95_s"]), b
            # nested intervals: replicas <= single gateway <= bench, per request, hence per bucket
            assert replicas_exact.mean[b] <= single_exact.mean[b] <= bench_exact.mean[b], b
            assert replicas_exact.p95(b) <= single_exact.p95(b) <= bench_exact.p95(b), b
            assert client[b].ttft_mean_s == pytest.approx(bench_exact.mean[b], rel=1e-9), b
            assert three[b]["ttft_mean_s"] <= single_exact.values[b][-1], b
            assert three[b]["ttft_p95_s"] <= single_exact.upper(b), b  # rate()-weighted: below the largest
            assert one[b]["ttft_p95_s"] <= bench_exact.p95_range(b)[1], b
            assert one[b]["ttft_mean_s"] <= client[b].ttft_mean_s, b

        # the dashboard's panel queries, as Grafana runs them
        dash = grafana_dashboard(NAMES, BUCKETS)
        panels = {p["title"]: p for p in dash["panels"]}
        for title in ("TTFT mean by input length", "TTFT p95 by input length"):
            for target in panels[title]["targets"]:
                b = target["legendFormat"]
                series = prom.client.query(substitute_variables(target["expr"], "5m", ".*"))
                if b not in USED:
                    assert all(math.isnan(s.value) for s in series), (title, b)
                    continue
                (found,) = series
                assert found.labels.get("isl_bucket") == b
                v = found.value
                if "mean" in title:
                    assert replicas_exact.allows_rate_mean(b, v), (title, b, v)
                    assert v <= single_exact.values[b][-1], (title, b, v)
                else:
                    assert replicas_exact.allows_rate_p95(b, v), (title, b, v)
                    assert v <= single_exact.upper(b), (title, b, v)

        check_rules_sum_across_instances(prom, replicas_exact)


def check_rules_sum_across_instances(prom: Any, exact: Exact) -> None:
    """The recorded series carry no instance: one per model and bucket, equal to the replicas' own
    observations. Each rule expression, evaluated at one instant, equals the figure built here from the
    instances' own ``rate()`` series at that instant."""
    by_record = {r["record"]: r["expr"] for g in RULE["spec"]["groups"] for r in g.get("rules", []) if "record" in r}
    h = NAMES.ttft_by_isl
    for stat in ("p95", "mean"):
        recorded = prom.client.query(record_name(h, stat))
        assert sorted(s.labels["isl_bucket"] for s in recorded) == sorted(BUCKETS.labels), stat
        for s in recorded:
            assert set(s.labels) - {"__name__"} == {"model", "isl_bucket"}, s.labels
            b = s.labels["isl_bucket"]
            if b in USED and stat == "mean":
                assert exact.allows_rate_mean(b, s.value), (stat, s)
            elif b in USED:
                assert exact.allows_rate_p95(b, s.value), (stat, s)
    # An instant whose data is final: every target's last scrape is at or after it, so no sample at or
    # before it can still arrive between the queries below (at "now", a scrape ingested between two
    # queries moved one of them: seen under a busy machine).
    # rate() needs two samples of every instance at or before that instant: with a 1 s interval and every
    # target's first scrape within the first second, three scrapes of each one are enough (on a fast
    # machine the whole run can fit in two, and an instance then had one sample before the instant).
    prom.wait_until("count_over_time(up[5m])", lambda r: len(r) == REPLICAS and all(x.value >= 3 for x in r))
    at = min(s.value for s in prom.client.query("timestamp(up)"))
    w = "5m"

    def values(expr: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for s in prom.client.query(expr, time_s=at):
            out[s.labels["isl_bucket"]].append((s.labels, s.value))
        return out

    sums, cnts = values(f"rate({h}_sum[{w}])"), values(f"rate({h}_count[{w}])")
    les = values(f"rate({h}_bucket[{w}])")
    dur = values(f"rate({NAMES.duration_by_isl}_count[{w}])")
    mean = values(by_record[record_name(h, "mean")])
    p95 = values(by_record[record_name(h, "p95")])
    rate = values(by_record[f"model_isl_bucket:{NAMES.duration_by_isl}_count:rate5m"])
    for b in BUCKETS.labels:
        assert len({lab["instance"] for lab, _ in cnts[b]}) == REPLICAS, b
        assert len(mean[b]) == len(p95[b]) == len(rate[b]) == 1, b
        assert rate[b][0][1] == pytest.approx(sum(v for _, v in dur[b]), rel=1e-9), b
        if b not in USED:
            continue
        assert mean[b][0][1] == pytest.approx(sum(v for _, v in sums[b]) / sum(v for _, v in cnts[b]), rel=1e-9), b
        le: dict[float, float] = defaultdict(float)
        for lab, v in les[b]:
            le[float(lab["le"])] += v
        assert p95[b][0][1] == pytest.approx(histogram_quantile(0.95, sorted(le.items())), rel=1e-9), b
