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
    histogram_attainment,
    histogram_share,
    parse_threshold,
    threshold_note,
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


def _hist(counts: list[float], edges: tuple[float, ...] = (0.5, 1.0, 2.0)) -> CumulativeHistogram:
    """Cumulative counts at ``edges`` and +Inf from per-bucket counts."""
    cum, total = [], 0.0
    for c in counts:
        total += c
        cum.append(total)
    return CumulativeHistogram(tuple(zip((*edges, INF), cum, strict=True)), 0.0)


def test_histogram_attainment_exact_at_an_edge_bounded_between() -> None:
    ttft = [_hist([8, 2, 0, 0]), _hist([1, 3, 4, 2]), _hist([0, 0, 0, 0])]
    itl = [_hist([90, 10, 0, 0]), _hist([50, 50, 0, 0]), _hist([0, 0, 0, 0])]
    rows = histogram_attainment(ttft, itl, B, Slo(ttft=Threshold(1.0)), duration_s=10.0)
    assert [r.label for r in rows] == ["0-512", "513-1024", "1025+", "all"]
    assert rows[0].ttft == ShareBounds(1.0, 1.0) and rows[1].ttft == ShareBounds(0.4, 0.4)  # 1.0 is an edge
    assert rows[1].goodput_rps == pytest.approx((0.4, 0.4)) and rows[2].ttft is None
    assert rows[3].ttft == ShareBounds(0.7, 0.7) and rows[3].observations == 20  # pooled by counts: 14 of 20
    between = histogram_attainment(ttft, itl, B, Slo(ttft=Threshold(1.5)))
    assert between[1].ttft == ShareBounds(0.4, 0.8) and between[1].goodput_rps is None  # no window length
    with_itl = histogram_attainment(ttft, itl, B, Slo(ttft=Threshold(1.0), itl=Threshold(0.5)), duration_s=10.0)
    assert with_itl[0].itl == ShareBounds(0.9, 0.9)  # a share of tokens
    assert all(r.goodput_rps is None for r in with_itl)  # token shares do not add up to requests
    with pytest.raises(ExplainError):
        histogram_attainment(ttft, itl, B, Slo())


def test_threshold_note_says_why_a_share_is_a_bound() -> None:
    edges = (0.5, 1.0, 2.0, INF)
    assert threshold_note("TTFT", Threshold(1.0), edges, B) is None
    note = threshold_note("TTFT", Threshold(1.5), edges, B)
    assert note is not None and "between le=1 and le=2" in note and "any bucket" in note
    table = parse_threshold("0-512=1,513-1024=1.5,1025+=2", B)
    note = threshold_note("TTFT", table, edges, B)
    assert note is not None and "bucket 513-1024 (" in note
    assert "grows with ISL" in (threshold_note("TTFT", parse_threshold("0.5+0.001*isl", B), edges, B) or "")


def test_threshold_spec_reads_back_the_same_and_same_as_ignores_spelling() -> None:
    """What the gateway exports (``{p}_slo_threshold_info{threshold=...}``) parses back to the threshold it
    counts against; ``same_as`` is what report compares with."""
    for text in ("2", "0.5+0.00002*isl", "0-512=0.5,513-1024=0.8,1025+=1.5", "0.001"):
        th = parse_threshold(text, B)
        back = parse_threshold(th.spec, B)
        assert back == th and back.spec == th.spec
    assert parse_threshold("0.5+0.00002*isl", B).spec == "0.5+2e-05*isl"
    assert parse_threshold("2", B).spec == "2.0"
    assert parse_threshold("0.5", B).same_as(parse_threshold("0.5+0*isl", B))
    assert parse_threshold("1025+=1.5,0-512=0.5,513-1024=0.8", B).same_as(
        parse_threshold("0-512=0.5,513-1024=0.8,1025+=1.5", B))
    assert not parse_threshold("0.5+2e-05*isl", B).same_as(parse_threshold("0.001", B))
    assert not parse_threshold("0-512=0.5,513-1024=0.5,1025+=0.5", B).same_as(parse_threshold("0.5", B))
