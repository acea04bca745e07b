"""The gateway's exact SLO counters per ISL bucket (issue 17, section 3, server side): every
finished request with a bucket and a first token is judged once, by the same rule as the bench's
attainment (core.slo.meets), and counted in {p}_requests_within_slo_by_isl_total{slo=ttft|itl|all};
both exposition paths write the same lines; bad settings are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from servelens.cli.main import main
from servelens.core.buckets import IslBuckets
from servelens.core.slo import Slo, SloRequest, attainment, parse_threshold
from servelens.gateway.config import GatewayConfig
from servelens.gateway.testing import run_gateway, samples, value
from servelens.prometheus.frontend import FrontendMetrics, series_per_model
from servelens.sim.testing import run_sim

BUCKETS = IslBuckets((1000, 4000))
MS = 1_000_000

# (isl, status, ttft ms, gap ms between 3 tokens; None: no first token)
REQUESTS = [
    (200, "success", 100, 5), (300, "success", 600, 5), (900, "success", 100, 50),  # 0-1000: met ttft/itl/none
    (2000, "success", 700, 5),  # 1001-4000: 0.5 + 0.0002 * 2000 = 0.9 s: met
    (3900, "success", 1400, 5),  # over 0.5 + 0.78
    (8000, "error", 100, 5),  # failed after its first token: meets none, counted in the denominator
    (8000, "error", None, None),  # failed before its first token: no bucket, not counted
    (9000, "success", 10, None),  # one token: no gap, meets the ITL SLO
]


def feed(m: FrontendMetrics) -> list[SloRequest]:
    judged = []
    for isl, status, ttft, gap in REQUESTS:
        r = m.begin("m", "chat_completions", "stream", arrival_ns=0)
        later = [] if gap is None or ttft is None else [ttft * MS + k * gap * MS for k in (1, 2)]
        times = [] if ttft is None else [ttft * MS, *later]
        for t in times:
            r.output(t)
        r.finish(3_000 * MS, status, "" if status == "success" else "internal", isl=isl, osl=len(times))
        if ttft is not None:
            itl = gap / 1000 if gap is not None else None
            judged.append(SloRequest(isl, status == "success", ttft / 1000, itl))
    return judged


def met(m: FrontendMetrics, bucket: str, kind: str) -> float:
    return value(samples(m), m.names.slo_by_isl, model="m", isl_bucket=bucket, slo=kind)


def test_counts_equal_the_per_request_attainment_and_both_writers_agree() -> None:
    slo = Slo(parse_threshold("0.5+0.0002*isl", BUCKETS), parse_threshold("0.01", BUCKETS))
    registry = CollectorRegistry()
    m = FrontendMetrics(registry=registry, isl_buckets=BUCKETS, slo=slo)
    m.register_model("m")
    assert met(m, "4001+", "all") == 0  # every bucket's series at zero once the model is registered
    judged = feed(m)
    exact = {a.label: a for a in attainment(judged, BUCKETS, slo, 1.0)}
    s = samples(m)
    for label in BUCKETS.labels:
        a = exact[label]
        assert met(m, label, "ttft") == a.ttft_met
        assert met(m, label, "itl") == a.itl_met
        assert met(m, label, "all") == a.all_met
        # the denominator: the bucket's finished requests with a first token
        assert value(s, m.names.duration_by_isl + "_count", model="m", isl_bucket=label) == a.requests
    assert (met(m, "0-1000", "ttft"), met(m, "0-1000", "itl"), met(m, "0-1000", "all")) == (2, 2, 1)
    assert (met(m, "1001-4000", "all"), met(m, "4001+", "all"), met(m, "4001+", "itl")) == (1, 1, 1)
    ours = [line for line in m.exposition().decode().splitlines() if m.names.slo_by_isl in line]
    theirs = [line for line in generate_latest(registry).decode().splitlines() if m.names.slo_by_isl in line]
    assert ours == theirs and len(ours) == 2 + 3 * len(BUCKETS)


def test_only_the_given_slos_get_series_and_the_budget_counts_them() -> None:
    slo = Slo(ttft=parse_threshold("0-1000=0.2,1001-4000=1,4001+=2", BUCKETS))
    m = FrontendMetrics(isl_buckets=BUCKETS, slo=slo)
    m.register_model("m")
    feed(m)
    text = m.exposition().decode()
    assert 'slo="itl"' not in text and 'slo="ttft"' in text and 'slo="all"' in text
    assert met(m, "0-1000", "ttft") == 2  # 100 ms twice, 600 ms over 0.2 s
    edges = m.state.edges
    assert m.series_per_model == series_per_model(edges, BUCKETS) + 2 * len(BUCKETS)
    off = FrontendMetrics(isl_buckets=BUCKETS)
    off.register_model("m")
    assert off.names.slo_by_isl not in off.exposition().decode()


def test_bad_settings_are_errors() -> None:
    slo = Slo(ttft=parse_threshold("1", BUCKETS))
    with pytest.raises(ValueError, match="need ISL buckets"):
        FrontendMetrics(isl_buckets=None, slo=slo)
    with pytest.raises(ValueError, match="need --isl-buckets"):
        GatewayConfig(upstream="http://127.0.0.1:1", isl_buckets="off", slo_ttft="1")
    with pytest.raises(ValueError, match="SLO threshold 'fast'"):
        GatewayConfig(upstream="http://127.0.0.1:1", slo_ttft="fast")
    with pytest.raises(ValueError, match="SLO table names"):
        GatewayConfig(upstream="http://127.0.0.1:1", isl_buckets="1000", slo_itl="0-1000=0.1")


def test_cli_bad_slo_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--upstream", "http://127.0.0.1:1", "--slo-ttft", "soon"]) == 2
    err = capsys.readouterr().err
    assert "SLO threshold 'soon'" in err and len(err.strip().splitlines()) == 1


async def test_through_the_gateway_in_front_of_the_sim() -> None:
    async with run_sim(speedup=20) as sim, run_gateway(sim.url, slo_ttft="0", slo_itl="100") as gw:
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                async with s.post(gw.url + "/v1/completions", json={
                        "model": "sim-model", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True,
                        "stream": True}) as r:
                    assert r.status == 200
                    await r.read()
        await gw.gateway.wait_finished(3)
        m = gw.metrics
        # a TTFT of 0 s never (prefill takes time); a mean ITL within 100 s always (chunks read together
        # have gaps of 0, so an ITL SLO of 0 could be met under load)
        assert (met_sim(m, "ttft"), met_sim(m, "itl"), met_sim(m, "all")) == (0, 3, 0)


def met_sim(m: FrontendMetrics, kind: str) -> float:
    return value(samples(m), m.names.slo_by_isl, model="sim-model", isl_bucket="0-512", slo=kind)


def test_report_reads_the_counters_exactly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slo = Slo(parse_threshold("0.5+0.0002*isl", BUCKETS), parse_threshold("0.01", BUCKETS))
    m = FrontendMetrics(isl_buckets=BUCKETS, slo=slo)
    m.register_model("m")
    (tmp_path / "s0.txt").write_bytes(m.exposition())
    judged = feed(m)
    (tmp_path / "s1.txt").write_bytes(m.exposition())
    flags = ["--isl-buckets", "1000,4000", "--slo-ttft", "0.5+0.0002*isl", "--slo-itl", "0.01"]
    assert main(["report", "--metrics", str(tmp_path / "s1.txt"), "--metrics-before", str(tmp_path / "s0.txt"),
                 "--slo-from", "counters", "--format", "json", *flags]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["slo"]["exact"] is True
    got = {r["label"]: r for r in doc["slo"]["rows"]}
    for a in attainment(judged, BUCKETS, slo, 1.0)[:-1]:
        row = got[a.label]
        assert (row["requests"], row["ttft_met"], row["itl_met"], row["all_met"]) == (
            a.requests, a.ttft_met, a.itl_met, a.all_met)
        assert row["goodput_rps"] is None  # a scrape has no window length
    assert got["all"]["all_met"] == sum(a.all_met for a in attainment(judged, BUCKETS, slo, 1.0)[:-1])
    # the flags must name the SLOs the gateway counts
    assert main(["report", "--metrics", str(tmp_path / "s1.txt"), "--slo-from", "counters",
                 "--isl-buckets", "1000,4000", "--slo-ttft", "1"]) == 2
    assert "the gateway counts slo=all,itl,ttft" in capsys.readouterr().err
    off = FrontendMetrics(isl_buckets=BUCKETS)
    off.register_model("m")
    (tmp_path / "off.txt").write_bytes(off.exposition())
    assert main(["report", "--metrics", str(tmp_path / "off.txt"), "--slo-from", "counters", *flags]) == 2
    assert "no SLO counters" in capsys.readouterr().err
    # a bucket's counter series missing beside its finished requests is missing data, not 0 % met
    busy = next(a.label for a in attainment(judged, BUCKETS, slo, 1.0)[:-1] if a.requests)
    cut = [line for line in (tmp_path / "s1.txt").read_text().splitlines()
           if not (line.startswith(m.names.slo_by_isl) and f'isl_bucket="{busy}"' in line and 'slo="itl"' in line)]
    (tmp_path / "cut.txt").write_text("\n".join(cut) + "\n")
    assert main(["report", "--metrics", str(tmp_path / "cut.txt"), "--slo-from", "counters", *flags]) == 2
    assert f"bucket {busy}:" in capsys.readouterr().err


def test_gateway_exports_its_thresholds_and_report_refuses_others(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``report --slo-from counters --slo-ttft 0.001`` against a gateway counting ``0.5+0.00002*isl`` printed
    "met 100 %": only the kinds were compared. The gateway exports what it counts against (an info gauge,
    the threshold as a label) and report refuses a threshold that differs; a scrape without the gauge (an
    older gateway) is read with a note saying the thresholds were not checked."""
    slo = Slo(parse_threshold("0.5+0.00002*isl", BUCKETS), parse_threshold("1001-4000=0.05,0-1000=0.04,4001+=0.06",
                                                                            BUCKETS))
    m = FrontendMetrics(isl_buckets=BUCKETS, slo=slo)
    m.register_model("m")
    feed(m)
    text = m.exposition().decode()
    info = m.names.slo_threshold_info
    assert [line for line in text.splitlines() if line.startswith(info)] == [
        f'{info}{{slo="ttft",threshold="0.5+2e-05*isl"}} 1.0',
        f'{info}{{slo="itl",threshold="1001-4000=0.05,0-1000=0.04,4001+=0.06"}} 1.0']
    assert f"# TYPE {info} gauge" in text
    scrape = tmp_path / "s.txt"
    scrape.write_text(text)
    base = ["report", "--metrics", str(scrape), "--slo-from", "counters", "--isl-buckets", "1000,4000"]
    # the same thresholds spelt otherwise: accepted (a table in another order, 0.00002 as 2e-5)
    assert main([*base, "--slo-ttft", "0.5+2e-5*isl", "--slo-itl", "0-1000=0.04,1001-4000=0.05,4001+=0.06"]) == 0
    assert "not checked" not in capsys.readouterr().out
    assert main([*base, "--slo-ttft", "0.001", "--slo-itl", "0-1000=0.04,1001-4000=0.05,4001+=0.06"]) == 2
    assert capsys.readouterr().err == (
        f"servelens: error: {scrape}: the gateway counts TTFT against 0.5+2e-05*isl, --slo-ttft gives 0.001 "
        "(seconds): give the SLOs the gateway was started with (--slo-ttft '0.5+2e-05*isl')\n")
    assert main([*base, "--slo-ttft", "0.5+0.00002*isl", "--slo-itl", "0.05"]) == 2
    assert "the gateway counts ITL against 1001-4000=0.05,0-1000=0.04,4001+=0.06, --slo-itl gives 0.05" in (
        capsys.readouterr().err)
    older = tmp_path / "older.txt"  # the same scrape without the info gauge
    older.write_text("".join(line + "\n" for line in text.splitlines() if info not in line))
    assert main(["report", "--metrics", str(older), "--slo-from", "counters", "--isl-buckets", "1000,4000",
                 "--slo-ttft", "0.001", "--slo-itl", "0.05"]) == 0
    assert (f"{older} exports no SLO thresholds ({info}: a gateway older than it): the thresholds given are taken "
            "to be the ones it counts against, not checked") in capsys.readouterr().out


def test_workers_merge_keeps_one_threshold_series() -> None:
    """The info gauge is the gateway's, not a count: summed over workers it would read 2, 3, ..."""
    from servelens.core.merge import merge_snapshots
    from servelens.core.snapshot import take_snapshot
    from servelens.prometheus.exposition import TextExposition

    slo = Slo(parse_threshold("2", BUCKETS), None)
    parts = []
    for _ in range(3):
        m = FrontendMetrics(isl_buckets=BUCKETS, slo=slo)
        m.register_model("m")
        parts.append(take_snapshot(m.state))
    merged = merge_snapshots(parts)
    text = TextExposition(m.names, m.state.edges).render(merged).decode()
    assert [line for line in text.splitlines() if line.startswith(m.names.slo_threshold_info)] == [
        f'{m.names.slo_threshold_info}{{slo="ttft",threshold="2.0"}} 1.0']
    other = FrontendMetrics(isl_buckets=BUCKETS, slo=Slo(parse_threshold("3", BUCKETS), None))
    other.register_model("m")
    with pytest.raises(ValueError, match="other edges, buckets or SLOs"):
        merge_snapshots([parts[0], take_snapshot(other.state)])


def test_config_file_numbers_are_slo_specs(tmp_path: Path) -> None:
    """`slo_itl: 0.05` in YAML is a number, as the config docstring's own example writes it."""
    from servelens.gateway.config import load_config_file

    path = tmp_path / "g.yaml"
    path.write_text("upstream: http://127.0.0.1:1\nslo_ttft: 2\nslo_itl: 0.05\n")
    cfg = GatewayConfig.from_mapping(load_config_file(path))
    assert (cfg.slo_ttft, cfg.slo_itl) == ("2.0", "0.05")
    assert cfg.slo is not None
    with pytest.raises(ValueError, match="slo_itl must be a string"):
        GatewayConfig(upstream="http://127.0.0.1:1", slo_itl=True)  # type: ignore[arg-type]
