"""Conformance with NVIDIA Dynamo 1.6.1's released frontend (issue 7), against the real thing.

Runs only with ``-m dynamo`` and only inside a private network namespace with loopback alone
(Dynamo's mocker binds sockets on 0.0.0.0), as ``.ci/run`` does::

    python scripts/dynamo_harness.py install
    unshare -rn bash -c 'ip link set lo up && python -m pytest -q -m dynamo tests/engines'

Each test starts its own mocker + frontend (about a second) with a fresh discovery folder and
stops it with SIGTERM, so histogram values start at zero.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servelens.core.status import ERROR_TYPES, UNKNOWN_MODEL
from servelens.formats.metrics_text import parse_scrape
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.collector import format_le
from servelens.prometheus.names import DYNAMO_PREFIX, MetricNames

pytestmark = pytest.mark.dynamo

REPO = Path(__file__).resolve().parents[2]
ISL_BUCKETS = "512,1024,2048,4096,8192,16384"


def _load_script(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


harness = _load_script("dynamo_harness")
gap = _load_script("dynamo_gap")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def dyn_install() -> tuple[Path, Path]:
    """(venv, model_dir): Dynamo 1.6.1 installed and the tiny model built; refuses outside a netns."""
    if not harness.in_private_netns():
        pytest.fail(
            "the Dynamo conformance tests must run inside a private network namespace with only "
            f"loopback (interfaces seen: {harness.network_interfaces()}). {harness.NETNS_HINT}",
            pytrace=False,
        )
    if not harness.installed():
        # pip cannot reach the network in here: an install would wait out pip's retries, then fail
        pytest.fail(f"Dynamo {harness.DYNAMO_VERSION} is not installed in {harness.DEFAULT_VENV}: run "
                    "`python scripts/dynamo_harness.py install` first, outside the network namespace",
                    pytrace=False)
    try:
        venv = harness.install()
        model_dir = harness.build_tiny_model()
    except harness.HarnessError as e:
        pytest.fail(f"could not install Dynamo {harness.DYNAMO_VERSION}: {e}", pytrace=False)
    return venv, model_dir


@pytest.fixture
def dyn_stack(dyn_install: tuple[Path, Path]) -> Iterator[Any]:
    """A fresh Dynamo mocker + frontend (model ``tiny``), stopped with SIGTERM afterwards."""
    venv, model_dir = dyn_install
    with harness.serve(venv, model_dir) as stack:
        yield stack


# ----------------------------------------------------------------------------- helpers


def _post(url: str, body: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _chat(base: str, model: str = "tiny", max_tokens: int = 4, content: str = "hello world") -> tuple[int, bytes]:
    return _post(f"{base}/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "stream": True, "stream_options": {"include_usage": True},
    })


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode())


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _histogram_shape(fam: Any) -> tuple[str, list[str], list[str]]:
    """(type, sorted label names without le, le strings in order of the first series)."""
    buckets = [s for s in fam.samples if s.name.endswith("_bucket")]
    assert buckets, f"{fam.name} has no _bucket samples"
    first = {k: v for k, v in buckets[0].labels.items() if k != "le"}
    les = [s.labels["le"] for s in buckets if {k: v for k, v in s.labels.items() if k != "le"} == first]
    return fam.type, sorted(k for k in buckets[0].labels if k != "le"), les


def _log_tail(run_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(run_dir.glob("*.log")))


def _requests_total(fam: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name.endswith("_total")}


# ----------------------------------------------------------------------------- names and shapes


def test_refuses_outside_private_netns(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """We are inside a loopback-only namespace here; with another interface ``serve`` refuses to
    start anything and names the command to use."""
    assert harness.in_private_netns(), harness.network_interfaces()
    monkeypatch.setattr(harness, "network_interfaces", lambda: ["eth0", "lo"])
    with (pytest.raises(harness.HarnessError, match=r"not in a private network namespace.*unshare -rn"),
          harness.serve(run_dir=tmp_path / "run")):
        pass
    assert not (tmp_path / "run").exists(), "nothing started"


def test_harness_serve_cli_and_clean_stop(dyn_install: tuple[Path, Path], tmp_path: Path) -> None:
    """``dynamo_harness.py serve -- CMD`` runs CMD against a ready frontend; both processes are gone after."""
    import subprocess

    code = ("import os, urllib.request; "
            "print(urllib.request.urlopen(os.environ['DYNAMO_URL'] + '/v1/models').read().decode())")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "dynamo_harness.py"), "serve", "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dynamo frontend listening on http://127.0.0.1:" in proc.stdout
    assert '"id":"tiny"' in proc.stdout.replace(" ", ""), proc.stdout

    venv, model_dir = dyn_install
    run_dir = tmp_path / "run"
    stale = run_dir / "kv" / "v1" / "instances" / "stale-worker"
    stale.parent.mkdir(parents=True)
    stale.write_text("left by a SIGKILLed run")
    with harness.serve(venv, model_dir, run_dir=run_dir) as st:
        pids = (st.frontend_pid, st.mocker_pid)
        kv = st.run_dir / "kv"
        assert not stale.exists(), "the discovery folder starts fresh"
        assert any(p.is_file() for p in kv.rglob("*")), "discovery entries written"
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # SIGTERM, not SIGKILL: the mocker removed its discovery entries on the way out
    left = [str(p.relative_to(kv)) for p in kv.rglob("*") if p.is_file()]
    assert not left, f"discovery entries left behind: {left}\n{_log_tail(run_dir)}"


def test_stock_histograms_match_dynamo(dyn_stack: Any) -> None:
    """Each of the six stock histograms: same name, type, label names and ``le`` strings as Dynamo."""
    status, body = _chat(dyn_stack.frontend_url)
    assert status == 200 and b"[DONE]" in body
    dyn = _families(_get(f"{dyn_stack.frontend_url}/metrics"))

    ours = FrontendMetrics(prefix=DYNAMO_PREFIX, isl_buckets=ISL_BUCKETS)
    ours.register_model("tiny")
    mine = _families(ours.exposition().decode())

    names = MetricNames(DYNAMO_PREFIX)
    for name in names.stock_histograms():
        assert name in dyn, f"Dynamo 1.6.1 exports no {name}; it has {sorted(dyn)}"
        assert name in mine
        assert _histogram_shape(mine[name]) == _histogram_shape(dyn[name]), name
        assert _histogram_shape(dyn[name])[1] == ["model"]
    # the edges servelens ships are Dynamo's, written the way Dynamo writes them
    edges = ours.state.edges
    for name, e in zip(names.stock_histograms(), (edges.ttft_s, edges.itl_s, edges.duration_s, edges.isl_tokens,
                                                  edges.osl_tokens, edges.cached_tokens), strict=True):
        assert [format_le(x) for x in e] + ["+Inf"] == _histogram_shape(dyn[name])[2], name


def test_counters_and_gauges_match_dynamo(dyn_stack: Any) -> None:
    """requests_total, inflight_requests, output_tokens_total, disconnected_clients: type and label names."""
    assert _chat(dyn_stack.frontend_url)[0] == 200
    dyn = _families(_get(f"{dyn_stack.frontend_url}/metrics"))
    ours = FrontendMetrics(prefix=DYNAMO_PREFIX, isl_buckets=ISL_BUCKETS)
    ours.register_model("tiny")
    req = ours.begin("tiny", "chat_completions", "stream")
    req.output(time.perf_counter_ns())
    req.finish(time.perf_counter_ns(), "success", isl=20, osl=1, cached_tokens=0)
    mine = _families(ours.exposition().decode())
    n = MetricNames(DYNAMO_PREFIX)
    # prometheus_client strips the _total suffix from counter family names
    for full in (n.requests, n.inflight, n.output_tokens, n.disconnected):
        fam_name = full.removesuffix("_total")
        assert fam_name in dyn, f"Dynamo 1.6.1 exports no {full}"
        d, m = dyn[fam_name], mine[fam_name]
        assert d.type == m.type, f"{full}: Dynamo {d.type}, servelens {m.type}"
        d_labels = {tuple(sorted(s.labels)) for s in d.samples}
        m_labels = {tuple(sorted(s.labels)) for s in m.samples}
        assert d_labels == m_labels, f"{full}: Dynamo labels {d_labels}, servelens {m_labels}"


def test_requests_total_vocabulary_matches_dynamo(dyn_install: tuple[Path, Path], tmp_path: Path) -> None:
    """success, unknown model and upstream unavailable give the same ``requests_total`` label sets in
    Dynamo, in servelens's metrics library and in ``servelens gateway --metrics-prefix dynamo_frontend``.

    Dynamo's "unavailable" is a request to a model whose only worker died without deregistering
    (SIGKILL); the gateway's is an upstream it cannot reach. Both count ``status="error",
    error_type="unavailable"`` under the requested model; an unknown model is counted under
    ``model="unknown_model"`` with ``error_type="not_found"``.
    """
    from servelens.process import ServerProcess

    venv, model_dir = dyn_install
    with harness.serve(venv, model_dir) as st:
        url = st.frontend_url
        assert _chat(url)[0] == 200
        assert _chat(url, model="no-such-model")[0] == 404
        # the same two cases through the gateway
        with gap.start_gateway(st, tmp_path / "gw") as gw:
            assert _chat(gw.url)[0] == 200
            assert _chat(gw.url, model="no-such-model")[0] == 404
            gw_text = _get(f"{gw.url}/metrics")
        os.kill(st.mocker_pid, signal.SIGKILL)
        status, body = _chat(url)
        assert status == 503, body
        dyn = _requests_total(_families(_get(f"{url}/metrics"))["dynamo_frontend_requests"])

    # the gateway's upstream unavailable: nothing listens on its upstream port
    dead = f"http://127.0.0.1:{harness.free_port()}"
    with ServerProcess(["gateway", "--upstream", dead, "--model", "tiny", "--metrics-prefix", DYNAMO_PREFIX,
                        "--isl-buckets", ISL_BUCKETS], log_path=tmp_path / "gw-dead.log") as gw2:
        status, body = _chat(gw2.url)
        assert status in (502, 503), body
        gw2_text = _get(f"{gw2.url}/metrics")
    via_gateway = _requests_total(_families(gw_text)["dynamo_frontend_requests"])
    via_gateway.update(_requests_total(_families(gw2_text)["dynamo_frontend_requests"]))

    ours = FrontendMetrics(prefix=DYNAMO_PREFIX, isl_buckets=ISL_BUCKETS)
    ours.register_model("tiny")
    ok = ours.begin("tiny", "chat_completions", "stream")
    ok.output(time.perf_counter_ns())
    ok.finish(time.perf_counter_ns(), "success", isl=20, osl=4, cached_tokens=0)
    ours.state.count_unknown_model("chat_completions", "stream")
    ours.begin("tiny", "chat_completions", "stream").finish(time.perf_counter_ns(), "error", "unavailable")
    library = _requests_total(_families(ours.exposition().decode())["dynamo_frontend_requests"])

    assert set(dyn) == set(library), f"Dynamo: {sorted(dyn)}\nservelens library: {sorted(library)}"
    assert set(dyn) == set(via_gateway), f"Dynamo: {sorted(dyn)}\nservelens gateway: {sorted(via_gateway)}"
    for labels in dyn:
        assert dict(labels)["error_type"] in ("", *ERROR_TYPES)
        assert library[labels] == via_gateway[labels] == 1
        assert dyn[labels] >= 1  # Dynamo also counted what the gateway forwarded
    assert any(dict(k)["model"] == UNKNOWN_MODEL and dict(k)["error_type"] == "not_found" for k in dyn)
    assert any(dict(k)["error_type"] == "unavailable" and dict(k)["model"] == "tiny" for k in dyn)


# ----------------------------------------------------------------------------- values


def test_gateway_values_match_dynamo(dyn_stack: Any, tmp_path: Path) -> None:
    """Gateway in front of Dynamo, driven by ``servelens bench`` with a Mooncake cut (shared prefixes).

    ISL, OSL and cached-token sums equal Dynamo's exactly; ITL observations per request are
    completion tokens minus one, as Dynamo counts them; the gateway's TTFT sum is not below
    Dynamo's (it sees each request earlier and each first token later); the bench's own TTFT
    through the gateway is not below the gateway's (its clock starts before and stops after).
    """
    n = 12
    p = gap.measure(dyn_stack, concurrency=4, max_requests=n, out_dir=tmp_path)
    assert len(p.records) == n and all(r.ok for r in p.records), [r.error for r in p.records if not r.ok]
    dyn, gw = p.dynamo, p.gateway
    # the gateway itself (not only the metrics library) exports Dynamo's names, label names and edges
    dyn_fams, gw_fams = _families(p.dynamo_text), _families(p.gateway_text)
    for name in MetricNames(DYNAMO_PREFIX).stock_histograms():
        assert _histogram_shape(gw_fams[name]) == _histogram_shape(dyn_fams[name]), name
    for key in ("ttft", "itl", "duration", "isl", "osl", "cached"):
        assert gw.counts[key] == dyn.counts[key], (key, gw.counts, dyn.counts)
    # the bench's probe for the chat template's tokens (the cut comes near the context): one request of one
    # output token that the gateway and Dynamo count and the bench's records do not; told apart by its
    # lengths, since Dynamo sends no x-request-id
    extra = (Counter((int(e["isl"]), int(e["osl"])) for e in p.gateway_log)
             - Counter((r.isl_server, r.osl) for r in p.records))
    assert sum(extra.values()) <= 1 and all(osl == 1 for _, osl in extra), extra
    probe = [e for e in p.gateway_log if (int(e["isl"]), int(e["osl"])) in extra][:1]
    assert dyn.counts["ttft"] == n + len(probe)
    for key in ("isl", "osl", "cached"):
        assert gw.sums[key] == dyn.sums[key], (key, gw.sums[key], dyn.sums[key])
    assert dyn.sums["cached"] > 0, "the Mooncake cut shares prefixes: the mocker's prefix cache should hit"
    # the bench saw the same lengths
    assert sum(r.isl_server or 0 for r in p.records) + sum(int(e["isl"]) for e in probe) == dyn.sums["isl"]
    assert sum(r.osl or 0 for r in p.records) + sum(int(e["osl"]) for e in probe) == dyn.sums["osl"]
    assert (sum(r.cached_tokens or 0 for r in p.records) + sum(int(e["cached_tokens"] or 0) for e in probe)
            == dyn.sums["cached"])

    # ITL: one observation per token after the first, per request (Dynamo: completion_tokens - 1)
    assert len(p.gateway_log) == n + len(probe)
    for e in p.gateway_log:
        assert e["osl_source"] == "usage" and e["output_chunks"] == e["osl"], e
    assert gw.counts["itl"] == dyn.counts["itl"] == sum(e["osl"] - 1 for e in p.gateway_log)

    # TTFT: not below Dynamo's own; and the bench agrees with the gateway within a few ms
    assert gw.sums["ttft"] >= dyn.sums["ttft"], (gw.sums["ttft"], dyn.sums["ttft"])
    pairs = p.paired_ttft_s()
    assert len(pairs) == n
    diffs_ms = sorted((b - g) * 1e3 for b, g in pairs)
    # the bench starts its clock before the gateway does and sees each chunk after it
    assert diffs_ms[0] >= -0.5, f"bench - gateway TTFT per request (ms): {diffs_ms}"
    # how close they are is a figure, not a definition (a 5 ms median bound failed at 5.3 ms on a busy CI
    # machine): it is printed here and recorded by scripts/dynamo_gap.py with its load (docs/benchmarks.md)
    print(f"bench - gateway TTFT per request (ms): {[round(d, 2) for d in diffs_ms]}")


# ----------------------------------------------------------------------------- sidecar


SEED_QUERIES = (
    "histogram_quantile(0.95, sum by (le, isl_bucket) "
    "(rate(dynamo_frontend_time_to_first_token_by_isl_seconds_bucket[5m])))",
    "sum by (isl_bucket) (rate(dynamo_frontend_time_to_first_token_by_isl_seconds_sum[5m])) / "
    "sum by (isl_bucket) (rate(dynamo_frontend_time_to_first_token_by_isl_seconds_count[5m]))",
)
_SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
                  "scrape_samples_post_metric_relabeling", "scrape_series_added"}


def _sample_names(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_sidecar_with_prometheus(dyn_stack: Any, tmp_path: Path) -> None:
    """A real Prometheus scrapes Dynamo and a ``--by-isl-only`` gateway: the README's two seed queries
    return one series per ISL bucket, Dynamo's stock series are still there, no name is exported twice."""
    from servelens.core.buckets import IslBuckets
    from servelens.testing.tsdb import run_prometheus

    labels = set(IslBuckets.parse(gap.ISL_BUCKETS).labels)
    with gap.start_gateway(dyn_stack, tmp_path, by_isl_only=True) as gw:
        # the sidecar adds names, never repeats one of Dynamo's
        gw_names = _sample_names(_get(f"{gw.url}/metrics"))
        dyn_names = _sample_names(_get(f"{dyn_stack.frontend_url}/metrics"))
        assert gw_names and not (gw_names & dyn_names), sorted(gw_names & dyn_names)
        names = MetricNames(DYNAMO_PREFIX)
        # exactly the five by-ISL histograms, the bucket-assignment and prompt-token counters, nothing stock;
        # beside them only the gateway's own health series, which name the gateway (README, sidecar mode)
        expected = {f"{h}{suffix}" for h in names.by_isl_histograms() for suffix in ("_bucket", "_sum", "_count")}
        health = {"servelens_gateway_accept_failures_total", "servelens_gateway_max_connections",
                  "servelens_gateway_upstream_retries_total"}
        want = expected | {names.isl_assignments, names.prompt_tokens_by_isl} | health
        assert gw_names == want, sorted(gw_names ^ want)

        with run_prometheus([f"{dyn_stack.frontend_url}/metrics", f"{gw.url}/metrics"]) as prom:
            prom.wait_until("up", lambda r: len(r) == 2 and all(s.value == 1 for s in r), timeout_s=30)
            records, _ = gap.run_bench(gw.url, Path(dyn_stack.model_dir) / "tokenizer.json", 4, 8,
                                       tmp_path / "bench")
            assert all(r.ok for r in records)
            hit = {IslBuckets.parse(gap.ISL_BUCKETS).label(r.isl_server or 0) for r in records}
            total = float(len(records))
            # both scrapes saw the whole run
            prom.wait_until(f"sum({names.ttft}_count)", lambda r: len(r) == 1 and r[0].value == total)
            prom.wait_until(f"sum({names.ttft_by_isl}_count)", lambda r: len(r) == 1 and r[0].value == total)

            # Bounds by definition, not by speed: each gateway TTFT is at most its bench TTFT, so a mean is
            # at most the largest; histogram_quantile answers at most the upper edge of the bucket it lands in
            top = max(r.ttft_s or 0.0 for r in records) + 0.0005  # the slack test_gateway_values_match_dynamo allows
            les = parse_scrape(_get(f"{gw.url}/metrics")).label_values(names.ttft_by_isl, "le")
            edges = sorted(float(le) for le in les - {"+Inf"})
            assert edges, "the gateway exports its by-ISL TTFT edges"
            cap = next((e for e in edges if e >= top), top)
            for q in SEED_QUERIES:
                res = prom.wait_until(
                    q, lambda r: {s.labels.get("isl_bucket") for s in r if s.value == s.value} >= hit,
                    timeout_s=30)
                assert len(res) == len(labels), [s.labels for s in res]
                assert {s.labels["isl_bucket"] for s in res} == labels
                for s in res:
                    if s.labels["isl_bucket"] in hit:
                        assert 0.001 < s.value <= cap, (q, s, top, cap)

            # the stock Dynamo series are still there, from Dynamo alone
            stock = prom.client.query(f"{names.ttft}_count")
            assert [s.labels["job"] for s in stock] == ["servelens0"], [s.labels for s in stock]
            # and Prometheus holds no series name from both targets (besides its own scrape series)
            per_job = {}
            for job in ("servelens0", "servelens1"):
                got = prom.client.query(f'count by (__name__) ({{job="{job}"}})')
                per_job[job] = {s.labels["__name__"] for s in got} - _SCRAPE_SERIES
            assert per_job["servelens0"] and per_job["servelens1"]
            assert not (per_job["servelens0"] & per_job["servelens1"]), per_job["servelens0"] & per_job["servelens1"]
