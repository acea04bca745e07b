"""Per-bucket SLO attainment and goodput: exact from requests, bounded from histograms."""

import math

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.slo import (
    ShareBounds,
    Slo,
    SloRequest,
    Threshold,
    attainment,
    both_bounds,
    bucket_shares,
    histogram_share,
    parse_threshold,
)
from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import ExplainError

B = IslBuckets.parse("512,1024")
INF = math.inf


def test_parse_threshold_forms() -> None:
    assert parse_threshold("2.0", B) == Threshold(2.0)
    lin = parse_threshold("0.5 + 0.001*ISL", B)
    assert (lin.base_s, lin.per_token_s) == (0.5, 0.001)
    assert lin.limit_s(1000, "513-1024") == pytest.approx(1.5)
    tab = parse_threshold("0-512=0.5, 513-1024=0.8, 1025+=2", B)
    assert tab.limit_s(700, "513-1024") == 0.8 and tab.limit_s(5000, "1025+") == 2.0


@pytest.mark.parametrize("spec", ["fast", "1+2*osl", "0-512=0.5,513-1024=x", "-1", "nan"])
def test_parse_threshold_rejects_nonsense(spec: str) -> None:
    with pytest.raises(ExplainError) as e:
        parse_threshold(spec, B)
    assert "\n" not in str(e.value)


def test_table_must_name_exactly_the_buckets() -> None:
    with pytest.raises(ExplainError) as e:
        parse_threshold("0-512=0.5,513-2048=0.8", B)
    assert "0-512, 513-1024, 1025+" in str(e.value)


def test_attainment_per_bucket_known_answer() -> None:
    slo = Slo(ttft=parse_threshold("0.2+0.001*isl", B), itl=Threshold(0.05))
    reqs = [
        SloRequest(100, True, 0.25, 0.01),  # limit 0.3: meets both
        SloRequest(500, True, 0.75, 0.01),  # limit 0.7: TTFT missed
        SloRequest(512, False, 0.1, 0.01),  # failed: meets none
        SloRequest(800, True, 0.9, 0.08),  # limit 1.0: ITL missed
        SloRequest(900, True, 1.0, None),  # one output token: no gap to miss
        SloRequest(2000, True, None, None),  # no TTFT: missed
        SloRequest(None, False, None, None),  # failed before its ISL: "all" only
    ]
    rows = {r.label: r for r in attainment(reqs, B, slo, duration_s=2.0)}
    assert list(rows) == ["0-512", "513-1024", "1025+", "all"]
    low, mid, top, every = rows["0-512"], rows["513-1024"], rows["1025+"], rows["all"]
    assert (low.requests, low.ttft_met, low.itl_met, low.all_met) == (3, 1, 2, 1)
    assert (mid.requests, mid.ttft_met, mid.itl_met, mid.all_met) == (2, 2, 1, 1)
    assert (top.requests, top.ttft_met, top.itl_met, top.all_met) == (1, 0, 1, 0)
    assert (every.requests, every.all_met) == (7, 2)
    assert low.ttft_share == pytest.approx(1 / 3) and mid.all_share == 0.5
    assert every.goodput_rps == 1.0 and low.goodput_rps == 0.5


def test_attainment_without_isl_meets_only_a_flat_threshold() -> None:
    reqs = [SloRequest(None, True, 0.1)]
    assert attainment(reqs, B, Slo(ttft=Threshold(0.5)), 1.0)[-1].ttft_met == 1
    assert attainment(reqs, B, Slo(ttft=Threshold(0.5, 0.001)), 1.0)[-1].ttft_met == 0
    only = attainment(reqs, B, Slo(ttft=Threshold(0.5)), 1.0)[-1]
    assert only.itl_met is None and only.itl_share is None and only.all_met == 1


def test_attainment_errors() -> None:
    with pytest.raises(ExplainError):
        attainment([], B, Slo(ttft=Threshold(1.0)), 0.0)
    with pytest.raises(ExplainError):
        attainment([], B, Slo(), 1.0)
    rows = attainment([], B, Slo(ttft=Threshold(1.0)), 1.0)
    assert all(r.requests == 0 and r.ttft_share is None for r in rows)


H = CumulativeHistogram(((0.5, 10.0), (1.0, 30.0), (2.2, 36.0), (INF, 40.0)), 40.0)


def test_histogram_share_exact_only_at_an_edge() -> None:
    assert histogram_share(H, 1.0) == ShareBounds(0.75, 0.75) and ShareBounds(0.75, 0.75).exact
    between = histogram_share(H, 1.5)
    assert between == ShareBounds(0.75, 0.9) and not between.exact
    assert histogram_share(H, 0.1) == ShareBounds(0.0, 0.25)
    assert histogram_share(H, 5.0) == ShareBounds(0.9, 1.0)
    assert histogram_share(H, 0.5, 2.2) == ShareBounds(0.25, 0.9)
    assert histogram_share(CumulativeHistogram(((1.0, 0.0), (INF, 0.0)), 0.0), 1.0) is None


def test_bucket_shares_span_a_growing_threshold() -> None:
    hs = (H, H, H)
    assert bucket_shares(hs, B, Threshold(1.0)) == (ShareBounds(0.75, 0.75),) * 3
    # 0.5 + 0.001 * ISL: 0-512 spans 0.5..1.012, 513-1024 1.013..1.524, 1025+ 1.525..inf
    got = bucket_shares(hs, B, Threshold(0.5, 0.001))
    assert got == (ShareBounds(0.25, 0.9), ShareBounds(0.75, 0.9), ShareBounds(0.75, 1.0))
    tab = parse_threshold("0-512=0.5,513-1024=1,1025+=2.2", B)
    assert bucket_shares(hs, B, tab) == (ShareBounds(0.25, 0.25), ShareBounds(0.75, 0.75), ShareBounds(0.9, 0.9))
    with pytest.raises(ExplainError):
        bucket_shares((H,), B, Threshold(1.0))


def test_both_bounds_frechet() -> None:
    got = both_bounds(ShareBounds(0.9, 0.9), ShareBounds(0.8, 0.8))
    assert (got.low, got.high) == (pytest.approx(0.7), 0.8)
    assert both_bounds(ShareBounds(0.3, 0.4), ShareBounds(0.5, 0.6)) == ShareBounds(0.0, 0.4)
