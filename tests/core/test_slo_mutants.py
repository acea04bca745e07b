"""SLO attainment from counts made at the source, the thresholds' notes and parse errors, exactly
(issue 21)."""

from __future__ import annotations

import math

import pytest

from servelens.core.buckets import IslBuckets
from servelens.core.slo import (
    Attainment,
    Slo,
    Threshold,
    counted_attainment,
    histogram_attainment,
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
    from servelens.core.slo import attainment, bucket_shares, histogram_attainment
    from servelens.core.summary import CumulativeHistogram

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
    from servelens.core.slo import SloRequest, attainment, meets

    reqs = [SloRequest(100, True, 0.1, 0.005), SloRequest(100, True, 0.1, 0.05)]
    assert attainment(reqs, B, Slo(itl=Threshold(0.01)), 2.0)[0] == Attainment(
        "0-512", 2, None, 1, 1, None, 0.5, 0.5, 0.5)
    flat = Slo(ttft=Threshold(0.5))
    assert meets(flat, SloRequest(None, True, 0.5), None) == (True, True)  # no ISL: the flat limit, inclusive
    assert meets(Slo(ttft=Threshold(0.1, 0.004)), SloRequest(100, True, 0.5), "0-512") == (True, True)
    table = Slo(ttft=Threshold(table=(("0-512", 0.5), ("513+", 0.1))))
    assert meets(table, SloRequest(100, True, 0.5), "0-512") == (True, True)
    assert meets(Slo(ttft=Threshold(0.1, 0.001)), SloRequest(None, True, 0.05), "0-512") == (False, True)


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
