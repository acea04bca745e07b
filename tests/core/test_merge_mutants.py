"""core/merge on snapshots written by hand: one part is itself, sums series by series, the edges
kept, and every refusal word for word (issue 21)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelens.core.edges import MetricEdges
from servelens.core.merge import add_histograms, merge_models, merge_snapshots
from servelens.core.snapshot import HistogramCopy, ModelSnapshot, StateSnapshot

H1 = HistogramCopy((1, 2, 0), 0.5, 3)
H2 = HistogramCopy((0, 1, 4), 2.25, 5)


def test_one_histogram_is_itself_and_two_add_up() -> None:
    assert add_histograms([H1]) is H1
    assert add_histograms([H1, H2]) == HistogramCopy((1, 3, 4), 2.75, 8)
    with pytest.raises(ValueError) as e:
        add_histograms([H1, HistogramCopy((1, 2), 0.5, 3)])
    assert str(e.value) == "cannot add histograms with different edges"


def model(name: str, histograms: tuple[HistogramCopy, ...]) -> ModelSnapshot:
    return ModelSnapshot(name, histograms, (), (), 0, 0)


def test_models_of_other_buckets_do_not_add() -> None:
    with pytest.raises(ValueError) as e:
        merge_models([model("m", (H1, H2)), model("m", (H1,))])
    assert str(e.value) == "cannot add models with different ISL or uncached buckets"


def snapshot(edges: MetricEdges, *models: ModelSnapshot, slo_kinds: tuple[str, ...] = ()) -> StateSnapshot:
    return StateSnapshot(edges, (), models, (), None, 0, slo_kinds)


def test_merged_snapshot_keeps_the_parts_edges() -> None:
    edges = MetricEdges()
    merged = merge_snapshots([snapshot(edges, model("m", (H1,))), snapshot(edges, model("m", (H2,)))])
    assert merged.edges is edges
    assert merged.models == (model("m", (HistogramCopy((1, 3, 4), 2.75, 8),)),)


def test_refusals_word_for_word() -> None:
    edges = MetricEdges()
    with pytest.raises(ValueError) as e:
        merge_snapshots([])
    assert str(e.value) == "nothing to merge"
    with pytest.raises(ValueError) as e:
        merge_snapshots([snapshot(edges), replace(snapshot(edges), slo_kinds=("all",))])
    assert str(e.value) == "cannot merge snapshots of states with other edges, buckets or SLOs"
