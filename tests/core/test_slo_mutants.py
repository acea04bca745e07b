"""SLO attainment from counts made at the source, the thresholds' notes and parse errors, exactly
(issue 21)."""

from __future__ import annotations

import math

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.slo import (
    Attainment,
    AttainmentBounds,
    ShareBounds,
    Slo,
    SloRequest,
    Threshold,
    attainment,
    bucket_shares,
    counted_attainment,
    histogram_attainment,
    meets,
    parse_threshold,
    threshold_note,
)
from servelens.core.summary import CumulativeHistogram
from servelens.core.windows import ExplainError

B = IslBuckets.parse("512")
EDGES = (0.1, 0.5, 1.0, math.inf)


def test_counted_attainment_rows_and_the_all_row() -> None:
    both = Slo(ttft=Threshold(0.5), itl=Threshold(0.01))
    rows = counted_attainment([("0-512", 4, 3, 2, 1), ("513+", 0, 0, 0, 0)], both, duration_s=2.0)
    assert rows == (
        Attainment("0-512", 4, 3, 2, 1, 0.75, 0.5, 0.25, 0.5),
        Attainment("513+", 0, 0, 0, 0, None, None, None, 0.0),
        Attainment("all", 4, 3, 2, 1, 0.75, 0.5, 0.25, 0.5),
    )
    two = counted_attainment([("0-512", 4, 3, None, 3), ("513+", 6, 1, None, 1)], Slo(ttft=Threshold(0.5)))
    assert two[-1] == Attainment("all", 10, 4, None, 4, 0.4, None, 0.4, None)  # no window length: no goodput
    assert two[0].itl_met is None and two[0].itl_share is None
    itl_only = counted_attainment([("0-512", 2, 1, 1, 1), ("513+", 2, None, 2, 2)], Slo(itl=Threshold(0.01)))
    assert itl_only[-1] == Attainment("all", 4, None, 3, 3, None, 0.75, 0.75, None)


def test_counted_attainment_refusals() -> None:
    slo = Slo(ttft=Threshold(0.5))
    with pytest.raises(ExplainError) as err:
        counted_attainment([("0-512", 2, 3, None, 1)], slo)
    assert str(err.value) == ("bucket 0-512: more requests meeting the SLO than finished (2): counters of "
                              "another window?")
    with pytest.raises(ExplainError):
        counted_attainment([("0-512", 2, -1, None, 1)], slo)
    with pytest.raises(ExplainError) as err:
        counted_attainment([("0-512", 2, 1, None, 1)], slo, duration_s=0.0)
    assert str(err.value) == "goodput needs a window longer than 0 s, got 0.0"
    assert counted_attainment([("0-512", 2, 2, None, 2)], slo)[0].all_met == 2  # met == requests is fine


def test_threshold_notes() -> None:
    assert threshold_note("TTFT", Threshold(0.5), EDGES, B) is None  # an edge in every bucket: exact
    tail = ": the share lies between the counts at the edges either side; a threshold at an edge would make it exact"
    assert threshold_note("TTFT", Threshold(0.3), EDGES, B) == \
        "TTFT SLO is not an le edge in any bucket (0.3 s, between le=0.1 and le=0.5)" + tail
    table = Threshold(table=(("0-512", 0.5), ("513+", 0.7)))
    assert threshold_note("TTFT", table, EDGES, B) == \
        "TTFT SLO is not an le edge in bucket 513+ (0.7 s, between le=0.5 and le=1)" + tail
    beyond = Threshold(table=(("0-512", 2.0), ("513+", 0.05)))
    assert threshold_note("ITL", beyond, EDGES, B) == \
        "ITL SLO is not an le edge in any bucket (e.g. 2 s, past le=1)" + tail
    assert threshold_note("TTFT", Threshold(table=(("0-512", 0.05), ("513+", 0.5))), EDGES, B) == \
        "TTFT SLO is not an le edge in bucket 0-512 (0.05 s, past le=0.1)" + tail
    assert threshold_note("TTFT", Threshold(0.1, 0.001), EDGES, B) == (
        "TTFT SLO grows with ISL inside each bucket: its share is bounded by the counts at the le edges below its "
        "lowest and above its highest value in the bucket")


def test_parse_threshold_forms_and_errors() -> None:
    assert parse_threshold(" 0.5+0.0002*ISL ", B) == Threshold(0.5, 0.0002)
    assert parse_threshold("513+=0.8, 0-512=0.5", B) == Threshold(table=(("513+", 0.8), ("0-512", 0.5)))
    assert parse_threshold("2", B) == Threshold(2.0)
    with pytest.raises(ExplainError) as err:
        parse_threshold("0-512=0.5", B)
    assert str(err.value) == "SLO table names 0-512 but the ISL buckets are 0-512, 513+"
    with pytest.raises(ExplainError) as err:
        parse_threshold("fast", B)
    assert str(err.value) == ("SLO threshold 'fast' is not seconds (2.0), A+B*isl (0.5+0.0002*isl) or a table "
                              "(0-512=0.5,513-1024=0.8,...)")
    with pytest.raises(ExplainError) as err:
        Threshold(-1.0)
    assert str(err.value) == "SLO thresholds must be finite and >= 0 seconds"


def test_refusals_of_attainment_and_shares() -> None:
    h = CumulativeHistogram(((0.5, 1.0), (math.inf, 1.0)), 0.3)
    for call in (lambda: attainment([], B, Slo(), 1.0), lambda: histogram_attainment([h, h], [h, h], B, Slo())):
        with pytest.raises(ExplainError) as err:
            call()
        assert str(err.value) == "no SLO given (a TTFT or ITL threshold)"
    slo = Slo(ttft=Threshold(0.5))
    for call in (lambda: attainment([], B, slo, 0.0), lambda: histogram_attainment([h, h], [h, h], B, slo, 0.0)):
        with pytest.raises(ExplainError) as err:
            call()
        assert str(err.value) == "goodput needs a window longer than 0 s, got 0.0"
    with pytest.raises(ExplainError) as err:
        bucket_shares([h], B, Threshold(0.5))
    assert str(err.value) == "1 histograms for 2 ISL buckets"
    # half a second is a window; one observation is a share
    rows = histogram_attainment([h, h], [h, h], B, slo, 0.5)
    assert [(r.observations, r.ttft, r.goodput_rps) for r in rows][-1] == (2.0, rows[0].ttft, (4.0, 4.0))
    assert rows[0].ttft is not None and (rows[0].ttft.low, rows[0].ttft.high) == (1.0, 1.0)
    assert counted_attainment([("0-512", 1, 1, None, 1)], slo, duration_s=0.5)[0].goodput_rps == 2.0


def test_itl_only_attainment_and_thresholds_met_exactly() -> None:
    reqs = [SloRequest(100, True, 0.1, 0.005), SloRequest(100, True, 0.1, 0.05)]
    assert attainment(reqs, B, Slo(itl=Threshold(0.01)), 2.0)[0] == Attainment(
        "0-512", 2, None, 1, 1, None, 0.5, 0.5, 0.5)
    flat = Slo(ttft=Threshold(0.5))
    assert meets(flat, SloRequest(None, True, 0.5), None) == (True, True)  # no ISL: the flat limit, inclusive
    assert meets(Slo(ttft=Threshold(0.1, 0.004)), SloRequest(100, True, 0.5), "0-512") == (True, True)
    table = Slo(ttft=Threshold(table=(("0-512", 0.5), ("513+", 0.1))))
    assert meets(table, SloRequest(100, True, 0.5), "0-512") == (True, True)
    assert meets(Slo(ttft=Threshold(0.1, 0.001)), SloRequest(None, True, 0.05), "0-512") == (False, True)


B3 = IslBuckets.parse("512,1024")
TAIL = ": the share lies between the counts at the edges either side; a threshold at an edge would make it exact"


def _cum(counts: list[float], edges: tuple[float, ...] = (0.5, 1.0, 2.0)) -> CumulativeHistogram:
    """Cumulative counts at ``edges`` and +Inf from per-bucket counts."""
    cum, total = [], 0.0
    for c in counts:
        total += c
        cum.append(total)
    return CumulativeHistogram(tuple(zip((*edges, math.inf), cum, strict=True)), 0.0)


def test_bucket_range_of_a_threshold_growing_with_isl() -> None:
    # 0.5 s + ISL / 1024 s (exact in binary): 0-512 is ISL 0..512, 513-1024 is 513..1024, 1025+ is 1025..
    grows = Threshold(0.5, 1 / 1024)
    assert grows.bucket_range_s(B3, 0) == (0.5, 1.0)
    assert grows.bucket_range_s(B3, 1) == (0.5 + 513 / 1024, 1.5)
    assert grows.bucket_range_s(B3, 2) == (0.5 + 1025 / 1024, math.inf)
    assert Threshold(0.5).bucket_range_s(B3, 2) == (0.5, 0.5)  # flat: the open bucket's top is the value


def test_threshold_note_names_the_buckets_off_an_edge_and_an_edgeless_histogram() -> None:
    table = Threshold(table=(("0-512", 0.3), ("513-1024", 0.5), ("1025+", 0.7)))
    assert threshold_note("TTFT", table, EDGES, B3) == \
        "TTFT SLO is not an le edge in bucket 0-512, 1025+ (e.g. 0.3 s, between le=0.1 and le=0.5)" + TAIL
    # a histogram with only the +Inf bucket has no finite edge on either side
    assert threshold_note("ITL", Threshold(0.5), (math.inf,), B) == \
        "ITL SLO is not an le edge in any bucket (0.5 s, past le=-)" + TAIL


def test_counted_attainment_drops_the_met_count_of_an_slo_not_set() -> None:
    # the report passes 0 for a kind the gateway does not count: no SLO is None, not 0 % met
    ttft_only = counted_attainment([("0-512", 4, 3, 0, 3)], Slo(ttft=Threshold(0.5)))
    assert ttft_only == (Attainment("0-512", 4, 3, None, 3, 0.75, None, 0.75, None),
                         Attainment("all", 4, 3, None, 3, 0.75, None, 0.75, None))
    itl_only = counted_attainment([("0-512", 4, 0, 2, 2)], Slo(itl=Threshold(0.01)))
    assert itl_only == (Attainment("0-512", 4, None, 2, 2, None, 0.5, 0.5, None),
                        Attainment("all", 4, None, 2, 2, None, 0.5, 0.5, None))


def test_itl_slo_by_bucket_judges_a_request_at_its_own_bucket() -> None:
    table = Slo(itl=Threshold(table=(("0-512", 0.05), ("513+", 0.01))))
    assert meets(table, SloRequest(100, True, 0.1, 0.02), "0-512") == (True, True)  # 0.02 <= 0.05
    assert meets(table, SloRequest(600, True, 0.1, 0.02), "513+") == (True, False)  # 0.02 > 0.01
    grows = Slo(itl=Threshold(0.0, 1 / 1024))  # 100 tokens: 100/1024 s
    assert meets(grows, SloRequest(100, True, 0.1, 0.09), "0-512") == (True, True)
    assert meets(grows, SloRequest(100, True, 0.1, 0.1), "0-512") == (True, False)
    reqs = [SloRequest(100, True, 0.1, 0.02), SloRequest(600, True, 0.1, 0.02), SloRequest(600, True, 0.1, 0.01)]
    assert attainment(reqs, B, table, 1.0) == (
        Attainment("0-512", 1, None, 1, 1, None, 1.0, 1.0, 1.0),
        Attainment("513+", 2, None, 1, 1, None, 0.5, 0.5, 1.0),
        Attainment("all", 3, None, 2, 2, None, 2 / 3, 2 / 3, 2.0),
    )


def test_histogram_attainment_with_an_itl_slo_alone_pools_tokens() -> None:
    # TTFT: 10 and 12 observations; ITL: 100 and 300 tokens, edges 0.5, 1, 2, +Inf
    ttft = [_cum([8, 2, 0, 0]), _cum([1, 3, 4, 4])]
    itl = [_cum([90, 10, 0, 0]), _cum([150, 75, 75, 0])]
    slo = Slo(itl=Threshold(table=(("0-512", 1.0), ("513+", 1.5))))
    # 0-512 at the edge 1.0: 100 of 100 tokens; 513+ at 1.5, between le=1 (225 of 300) and le=2 (300)
    # all: weighted by tokens, (1 * 100 + 0.75 * 300) / 400 = 13/16 to (100 + 300) / 400 = 1
    assert histogram_attainment(ttft, itl, B, slo, duration_s=2.0) == (
        AttainmentBounds("0-512", 10.0, None, ShareBounds(1.0, 1.0), None),
        AttainmentBounds("513+", 12.0, None, ShareBounds(0.75, 1.0), None),
        AttainmentBounds("all", 22.0, None, ShareBounds(0.8125, 1.0), None),
    )


def test_histogram_attainment_of_one_observation_in_all() -> None:
    one = CumulativeHistogram(((0.5, 1.0), (math.inf, 1.0)), 0.3)
    none = CumulativeHistogram(((0.5, 0.0), (math.inf, 0.0)), 0.0)
    rows = histogram_attainment([one, none], [one, none], B, Slo(ttft=Threshold(0.5)), duration_s=4.0)
    assert rows == (
        AttainmentBounds("0-512", 1.0, ShareBounds(1.0, 1.0), None, (0.25, 0.25)),
        AttainmentBounds("513+", 0.0, None, None, None),
        AttainmentBounds("all", 1.0, ShareBounds(1.0, 1.0), None, (0.25, 0.25)),
    )


def test_histogram_attainment_refuses_lists_not_matching_the_buckets_whichever_slo_is_set() -> None:
    h = CumulativeHistogram(((0.5, 1.0), (math.inf, 1.0)), 0.3)
    cases = [
        ([h], [h, h], Slo(itl=Threshold(0.5)), "1 TTFT histograms for 2 ISL buckets"),
        ([h, h, h], [h, h], Slo(itl=Threshold(0.5)), "3 TTFT histograms for 2 ISL buckets"),
        ([h, h], [h], Slo(ttft=Threshold(0.5)), "1 ITL histograms for 2 ISL buckets"),
        ([h, h], [h, h, h], Slo(ttft=Threshold(0.5)), "3 ITL histograms for 2 ISL buckets"),
        ([h, h, h], [h, h], Slo(ttft=Threshold(0.5)), "3 TTFT histograms for 2 ISL buckets"),
    ]
    for ttft, itl, slo, message in cases:
        with pytest.raises(ExplainError) as err:
            histogram_attainment(ttft, itl, B, slo)
        assert str(err.value) == message


def test_parse_threshold_table_messages() -> None:
    with pytest.raises(ExplainError) as err:
        parse_threshold("0-512=0.5,513-2048=0.8", B)
    assert str(err.value) == "SLO table names 0-512, 513-2048 but the ISL buckets are 0-512, 513+"
    # a second '=' in a value is not a number, never part of a label
    with pytest.raises(ExplainError) as err:
        parse_threshold("0-512=1=2,513+=1", B)
    assert str(err.value) == ("SLO threshold '0-512=1=2,513+=1' is not seconds (2.0), A+B*isl (0.5+0.0002*isl) or "
                              "a table (0-512=0.5,513-1024=0.8,...)")
