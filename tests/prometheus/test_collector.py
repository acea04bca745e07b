import itertools
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.prometheus import FrontendMetrics, MetricNames

MS = 1_000_000
BUCKETS = "512,1024,2048,4096,8192,16384"


def families(reg: CollectorRegistry) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        out[fam.name] = fam.samples
    return out


@pytest.mark.parametrize(("prefix", "by_isl_series", "stock_series"), [
    ("servelens", 7 * (143 + 137 + 133 + 13 + 15), 456),  # the fine TTFT (140), ITL (134) and duration (130) edges
    ("dynamo_frontend", 7 * (21 + 23 + 13 + 13 + 15), 100),  # Dynamo 1.6.1's edges
])
def test_series_count_one_model_seven_buckets(prefix: str, by_isl_series: int, stock_series: int) -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS, prefix=prefix)
    m.register_model("m")
    e = m.state.edges
    per_hist = [len(x) + 1 + 2 for x in (e.ttft_s, e.itl_s, e.duration_s, e.osl_tokens, e.cached_tokens)]
    expected_by_isl = 7 * sum(per_hist)
    assert expected_by_isl == by_isl_series
    fams = families(reg)
    n = MetricNames(prefix)
    got = sum(len(fams[name.removesuffix("_total")]) for name in n.by_isl_histograms())
    assert got == expected_by_isl
    # every bucket's series exists at zero right after registration
    ttft = [s for s in fams[n.ttft_by_isl] if s.name.endswith("_count")]
    assert [s.labels["isl_bucket"] for s in ttft] == ["0-512", "513-1024", "1025-2048", "2049-4096", "4097-8192",
                                                      "8193-16384", "16385+"]
    assert all(s.value == 0 for s in ttft)
    # ... and every sample of every by-ISL histogram (buckets, _count, _sum) is at zero, per bucket
    for name in n.by_isl_histograms():
        per_bucket: dict[str, int] = {}
        for s in fams[name]:
            assert s.value == 0, (name, s)
            per_bucket[s.labels["isl_bucket"]] = per_bucket.get(s.labels["isl_bucket"], 0) + 1
        assert list(per_bucket) == list(IslBuckets.parse(BUCKETS).labels), name
        assert len(set(per_bucket.values())) == 1, name
    assert len(fams[n.isl_assignments.removesuffix("_total")]) == 4
    # stock: 6 histograms + inflight + output tokens + disconnected; requests_total appears on use
    stock_hist = sum(len(x) + 3 for x in (e.ttft_s, e.itl_s, e.duration_s, e.isl_tokens, e.osl_tokens,
                                          e.cached_tokens))
    got_stock = sum(len(fams[name]) for name in n.stock_histograms())
    assert got_stock == stock_hist == stock_series
    # series_per_model is what one model adds to the scrape (requests_total appears on use)
    per_model = sum(len(v) for k, v in fams.items() if k not in (n.disconnected, n.requests.removesuffix("_total")))
    # + the prompt-token counter per bucket (the hit ratio's denominator), at zero too
    prompt = fams[n.prompt_tokens_by_isl.removesuffix("_total")]
    assert [s.labels["isl_bucket"] for s in prompt] == list(IslBuckets.parse(BUCKETS).labels)
    assert all(s.value == 0 for s in prompt)
    assert m.series_per_model == per_model == by_isl_series + 7 + stock_series + 2 + 4


def test_off_means_nothing_by_isl_registered() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg)
    m.register_model("m")
    text = generate_latest(reg).decode()
    assert "_by_isl" not in text and "isl_bucket" not in text
    assert "servelens_time_to_first_token_seconds_bucket" in text


def test_no_created_series_and_dynamo_names() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, prefix="dynamo_frontend", isl_buckets=BUCKETS)
    m.register_model("m")
    r = m.begin("m", "chat_completions", "stream", arrival_ns=0)
    r.output(10 * MS)
    r.finish(20 * MS, "success", isl=10, osl=1)
    text = generate_latest(reg).decode()
    assert "_created" not in text
    for name in ("dynamo_frontend_time_to_first_token_seconds_bucket", "dynamo_frontend_inter_token_latency_seconds",
                 "dynamo_frontend_request_duration_seconds", "dynamo_frontend_input_sequence_tokens",
                 "dynamo_frontend_output_sequence_tokens", "dynamo_frontend_cached_tokens",
                 "dynamo_frontend_requests_total{", "dynamo_frontend_inflight_requests",
                 "dynamo_frontend_output_tokens_total", "dynamo_frontend_disconnected_clients",
                 "dynamo_frontend_time_to_first_token_by_isl_seconds_bucket"):
        assert name in text, name


def _edges(fams: dict[str, list], name: str, **match: str) -> list[float]:
    return [float(s.labels["le"]) for s in fams[name] if s.name.endswith("_bucket")
            and all(s.labels.get(k) == v for k, v in match.items())]


def test_le_edges_match_dynamo_and_by_isl_twins() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS, prefix="dynamo_frontend")
    m.register_model("m")
    fams = families(reg)
    n = MetricNames("dynamo_frontend")

    def edges(name: str, **match: str) -> list[float]:
        return _edges(fams, name, **match)

    assert edges(n.ttft)[:-1] == [0, 0.0022, 0.0047, 0.01, 0.022, 0.047, 0.1, 0.22, 0.47, 1, 2.2, 4.7, 10, 22, 48,
                                  100, 220, 480]
    assert edges(n.itl)[:-1] == [0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2,
                                 2.3, 4.1, 7.4, 13, 24, 44, 80]
    assert edges(n.duration)[:-1] == [0, 2, 4, 8, 16, 32, 64, 130, 260, 510]
    assert edges(n.isl)[:-1] == [0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000]
    assert edges(n.cached)[:-1] == edges(n.isl)[:-1]
    assert edges(n.osl)[:-1] == [0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000]
    for stock, twin in ((n.ttft, n.ttft_by_isl), (n.itl, n.itl_by_isl), (n.duration, n.duration_by_isl),
                        (n.osl, n.osl_by_isl), (n.cached, n.cached_by_isl)):
        assert edges(twin, isl_bucket="513-1024") == edges(stock)


def test_fine_edges_for_servelens_names_and_twins_share_them() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS)
    m.register_model("m")
    fams = families(reg)
    n = MetricNames()
    ttft, itl = _edges(fams, n.ttft), _edges(fams, n.itl)
    assert ttft[:4] == [0, 0.000977, 0.00106, 0.00116] and ttft[-4:] == [128, 220, 480, float("inf")]
    assert itl[:2] == [0, 0.000122] and itl[-6:] == [8, 13, 24, 44, 80, float("inf")]
    for fine in (ttft[1:-3], itl[1:-5]):  # the 2^(1/8) grid: neighbours 8.3-9.8 % apart
        ratios = [b / a for a, b in itertools.pairwise(fine)]
        assert min(ratios) > 1.08 and max(ratios) < 1.098
    assert 1 in ttft and 0.5 in ttft and 0.125 in itl  # powers of two are edges
    raw = generate_latest(reg).decode()
    assert 'le="0.000977"' in raw and 'le="1"' in raw and 'le="128"' in raw  # written as Dynamo writes le
    # the duration's fine edges too (Dynamo's 0, 2, 4, ... s held all of the demo's requests in one bucket)
    duration = _edges(fams, n.duration)
    assert duration[:3] == [0, 0.00781, 0.00852] and duration[-3:] == [470, 512, float("inf")]
    assert _edges(fams, n.osl)[:-1] == [0, 100, 210, 430, 880, 1800, 3700, 7600, 16000, 32000]  # the others: Dynamo's
    for stock, twin in ((n.ttft, n.ttft_by_isl), (n.itl, n.itl_by_isl), (n.duration, n.duration_by_isl),
                        (n.osl, n.osl_by_isl), (n.cached, n.cached_by_isl)):
        assert _edges(fams, twin, isl_bucket="16385+") == _edges(fams, stock)


def test_dynamo_names_refuse_other_edges() -> None:
    with pytest.raises(ValueError, match="Dynamo's"):
        FrontendMetrics(prefix="dynamo_frontend", isl_buckets=BUCKETS, edges=MetricEdges())
    with pytest.raises(ValueError, match="Dynamo's"):  # the sidecar too: its twins join Dynamo's own stock series
        FrontendMetrics(prefix="dynamo_frontend", isl_buckets=BUCKETS, stock=False,
                        edges=MetricEdges(ttft_s=(0.1, 1.0)))
    custom = FrontendMetrics(isl_buckets=BUCKETS, edges=MetricEdges(ttft_s=(0.1, 1.0), itl_s=(0.01,)))
    assert custom.state.edges.ttft_s == (0.1, 1.0)


def test_series_budget_caps_models() -> None:
    m = FrontendMetrics(isl_buckets=BUCKETS, max_series=3 * 3556 + 100)
    assert m.series_per_model == 3556 and m.max_models == 3
    for i in range(3):
        m.register_model(f"m{i}")
    with pytest.raises(ValueError, match=r"at most 3 models \(3,556 series per model within max_series 10,768\)"):
        m.register_model("m3")
    m.register_model("m0")  # registered already: not a new model
    dyn = FrontendMetrics(isl_buckets=BUCKETS, prefix="dynamo_frontend")
    assert dyn.series_per_model == 708 and dyn.max_models == 64  # Dynamo's edges: max_models decides, as before
    assert FrontendMetrics(isl_buckets=BUCKETS, max_models=5).max_models == 5
    assert FrontendMetrics(isl_buckets=BUCKETS).max_models == 14  # the default budget, 50,000 (19 before the
    # fine duration edges; with Dynamo's duration edges 2,596 series and 19 models again)
    assert FrontendMetrics(isl_buckets=BUCKETS, edges=MetricEdges(duration_s=(2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0,
                                                                                260.0, 510.0))).max_models == 19
    with pytest.raises(ValueError, match="one model needs 3,556 series, over max_series 1,000"):
        FrontendMetrics(isl_buckets=BUCKETS, max_series=1000)


def test_requests_total_and_inflight_values() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS)
    m.register_model("m")
    live = m.begin("m", "completions", "stream", arrival_ns=0)
    fams = families(reg)
    assert [s.value for s in fams["servelens_inflight_requests"]] == [1]
    live.output(5 * MS)
    live.output(7 * MS, tokens=2)
    live.finish(9 * MS, "success", isl=800, osl=3, cached_tokens=256)
    m.begin("ghost", "completions", "unary", 0).finish(1, "error", "not_found")
    fams = families(reg)
    # Dynamo keeps an inflight series at 0 for unknown_model once such a request was counted
    assert {s.labels["model"]: s.value for s in fams["servelens_inflight_requests"]} == {"m": 0, "unknown_model": 0}
    req = {(s.labels["model"], s.labels["status"], s.labels["error_type"]): s.value
           for s in fams["servelens_requests"] if s.name.endswith("_total")}
    assert req == {("m", "success", ""): 1, ("unknown_model", "error", "not_found"): 1}
    assert [s.value for s in fams["servelens_output_tokens"] if s.name.endswith("_total")] == [3]
    dur = {s.labels["model"]: s.value for s in fams["servelens_request_duration_seconds"] if s.name.endswith("_count")}
    assert dur == {"m": 1, "unknown_model": 1}  # Dynamo also records unknown-model durations
    itl = {s.name: s.value for s in fams["servelens_inter_token_latency_by_isl_seconds"]
           if s.labels["isl_bucket"] == "513-1024" and not s.name.endswith("_bucket")}
    assert itl["servelens_inter_token_latency_by_isl_seconds_count"] == 2
    assert itl["servelens_inter_token_latency_by_isl_seconds_sum"] == pytest.approx(0.002)


def test_sidecar_mode_exports_only_by_isl() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, prefix="dynamo_frontend", isl_buckets=BUCKETS, stock=False)
    m.register_model("m")
    names = set(families(reg))
    assert names and all("_by_isl" in n or "isl_bucket_assignments" in n for n in names)
    with pytest.raises(ValueError, match="needs ISL bucket boundaries"):
        FrontendMetrics(stock=False)


def test_bad_prefix_rejected() -> None:
    with pytest.raises(ValueError, match="not a valid Prometheus name prefix"):
        FrontendMetrics(prefix="9bad-prefix")


@pytest.mark.binaries("promtool")
def test_exposition_passes_promtool_check_metrics() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, prefix="dynamo_frontend", isl_buckets=BUCKETS)
    m.register_model("m")
    r = m.begin("m", "chat_completions", "stream", arrival_ns=0)
    r.output(10 * MS)
    r.output(20 * MS)
    r.finish(30 * MS, "success", isl=900, osl=2, cached_tokens=0)
    m.begin("x", "chat_completions", "stream", 0).finish(1, "error", "not_found")
    proc = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(reg), capture_output=True,
                          timeout=30, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_edges_are_overridable_and_by_isl_twins_follow() -> None:
    reg = CollectorRegistry()
    edges = MetricEdges(ttft_s=(0.05, 0.5, 5.0), osl_tokens=(10, 100))
    m = FrontendMetrics(registry=reg, isl_buckets="100", edges=edges)
    m.register_model("m")
    r = m.begin("m", "chat_completions", "stream", arrival_ns=0)
    r.output(200 * MS)
    r.finish(300 * MS, "success", isl=50, osl=20)
    fams = families(reg)
    n = MetricNames()
    for name in (n.ttft, n.ttft_by_isl):
        les = [(s.labels["le"], s.value) for s in fams[name]
               if s.name.endswith("_bucket") and s.labels.get("isl_bucket", "0-100") == "0-100"]
        assert les == [("0.05", 0), ("0.5", 1), ("5", 1), ("+Inf", 1)], name
    for name in (n.osl, n.osl_by_isl):
        les = [s.labels["le"] for s in fams[name] if s.name.endswith("_bucket")
               and s.labels.get("isl_bucket", "0-100") == "0-100"]
        assert les == ["10", "100", "+Inf"], name
    # the sets not overridden keep Dynamo's edges
    assert len([s for s in fams[n.itl] if s.name.endswith("_bucket")]) == len(MetricEdges().itl_s) + 1


def test_model_past_max_models_creates_no_series() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS, max_models=1)
    m.register_model("a")
    before = generate_latest(reg)
    with pytest.raises(ValueError, match="at most 1 models"):
        m.register_model("b")
    assert generate_latest(reg) == before
    assert 'model="b"' not in before.decode()


def test_uncached_families_at_zero_on_registration_and_counted_in_the_budget() -> None:
    reg = CollectorRegistry()
    m = FrontendMetrics(registry=reg, isl_buckets=BUCKETS, uncached_buckets="256,4096")
    m.register_model("m")
    fams = families(reg)
    n = MetricNames()
    labels = ["0-256", "257-4096", "4097+"]
    for name in n.by_uncached_histograms():
        samples = fams[name]
        assert samples and all(s.value == 0 for s in samples), name
        assert list(dict.fromkeys(s.labels["uncached_bucket"] for s in samples)) == labels, name
        assert all("isl_bucket" not in s.labels for s in samples)
    sources = fams[n.uncached_assignments.removesuffix("_total")]
    assert {s.labels["source"]: s.value for s in sources} == {
        "first_chunk_usage": 0, "final_usage": 0, "no_cached_tokens": 0, "unknown": 0}
    per_model = sum(len(v) for k, v in fams.items() if k not in (n.disconnected, n.requests.removesuffix("_total")))
    assert m.series_per_model == per_model
    assert FrontendMetrics(isl_buckets=BUCKETS).series_per_model + 3 * (143 + 137 + 133) + 4 == per_model
    with pytest.raises(ValueError, match="uncached buckets: ISL bucket boundaries must be strictly increasing"):
        FrontendMetrics(uncached_buckets="512,256")
