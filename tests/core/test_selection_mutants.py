"""core/selection where the exact-percentile test's random data does not go: blocks with and without
weights together, more than 256 groups, the two lowest bins (zero and subnormal values), numpy's
interpolation in the last bit, the bins and keys themselves, and the refusal (issue 21)."""

from __future__ import annotations

import numpy as np
import pytest

from servelens.core.selection import NBINS, Block, add_block_counts, block_percentiles, numpy_linear, value_bins

QS = [0.0, 25.0, 50.0, 95.0, 100.0]


def block(groups: list[int], values: list[float], weights: list[int] | None = None) -> Block:
    v = np.array(values, dtype=float)

    def values_at(pos: np.ndarray) -> np.ndarray:
        return v[pos]

    return (np.ones(len(groups), np.int64), np.array(groups, np.int64), value_bins(v),
            None if weights is None else np.array(weights), values_at)


def expected(values: list[float], weights: list[int], q: float) -> float:
    return float(np.percentile(np.repeat(np.array(values), np.array(weights)), q))


def test_blocks_with_and_without_weights_together() -> None:
    # one block of single tokens, then one of weighted chunks, then single tokens again
    parts = [([0, 0, 0], [0.01, 0.03, 0.02], None), ([0, 0], [0.02, 0.05], [3, 2]), ([0, 0], [0.04, 0.01], None)]
    blocks = [block(g, v, w) for g, v, w in parts]
    values = [x for _, v, _ in parts for x in v]
    weights = [x for _, v, w in parts for x in (w if w is not None else [1] * len(v))]
    got = block_percentiles(lambda: iter(blocks), 1, [[0]], QS)
    assert got == [[expected(values, weights, q) for q in QS]]


def test_more_groups_than_a_byte_holds() -> None:
    # group 256 would wrap to 0 in a byte: its values must stay its own
    blocks = [block([0, 256, 256, 0], [0.5, 0.01, 0.02, 0.6])]
    got = block_percentiles(lambda: iter(blocks), 257, [[256], [0]], [50.0])
    assert got[0][0] == float(np.percentile([0.01, 0.02], 50))
    assert got[1][0] == float(np.percentile([0.5, 0.6], 50))


def test_zero_and_subnormal_values_in_the_two_lowest_bins() -> None:
    # float32 bins: 0.0 and 5e-41 are in bin 0, 1e-40 and 1.5e-40 in bin 1
    values = [1e-40, 0.0, 5e-41, 1.5e-40, 0.0, 1e-40]
    assert value_bins(np.array(values)).tolist() == [1, 0, 0, 1, 0, 1]
    blocks = [block([0] * len(values), values)]
    qs = [0.0, 20.0, 40.0, 50.0, 60.0, 80.0, 100.0]
    got = block_percentiles(lambda: iter(blocks), 1, [[0]], qs)
    assert got == [[float(np.percentile(values, q)) for q in qs]]


def test_numpy_linear_is_numpys_to_the_last_bit() -> None:
    # pairs where lo + diff * t and hi - diff * (1 - t) differ in the last bit: numpy takes the second
    # from t = 0.5 up
    for lo, hi, t in ((1.7697606436346462e-12, 4.564106784480361e-06, 0.5),
                      (0.700977998313343, 1.3002223326882505, 0.75),
                      (0.09523940052296576, 0.4401183780223562, 0.25)):
        want = float(np.percentile([lo, hi], 100 * t))
        assert numpy_linear(lo, hi, 3 + t) == want
        other = lo + (hi - lo) * t if t >= 0.5 else hi - (hi - lo) * (1 - t)
        assert other != want  # the pair does tell the two formulas apart


def test_value_bins_are_the_top_bits_of_the_float32() -> None:
    got = value_bins(np.array([0.0, 1.0, 1.5, 2.0, np.inf]))
    # 1.0f = 0x3F800000, 1.5f = 0x3FC00000, 2.0f = 0x40000000, inf = 0x7F800000
    assert got.tolist() == [0, 0x3F80, 0x3FC0, 0x4000, 0x7F80]
    assert got.dtype == np.uint16
    for bad in ([-1.0, 0.5], [0.5, float("nan")]):
        with pytest.raises(ValueError) as e:
            value_bins(np.array(bad))
        assert str(e.value) == "values must be >= 0 and not NaN"



def test_a_block_of_one_value_is_counted() -> None:
    # three blocks: 0.3 s alone between two others; the median of 0.1, 0.2, 0.3, 0.4, 0.5 is 0.3
    blocks = [block([0, 0], [0.1, 0.5]), block([0], [0.3]), block([0, 0], [0.4, 0.2])]
    assert block_percentiles(lambda: iter(blocks), 1, [[0]], [0.0, 50.0, 100.0]) == [[0.1, 0.3, 0.5]]


def test_pass_one_counts_given_read_the_blocks_once() -> None:
    """Counts given (what the writer kept: the weight per group and bin) stand for pass 1: the blocks are
    read once, for pass 2, and the percentiles are those of the expanded values. Group 1: 0.2 s weighing
    3 tokens and 0.6 s weighing 1: 0.2, 0.2, 0.2, 0.6; group 0: 0.1 and 0.4."""
    blocks = [block([0, 1, 1], [0.1, 0.2, 0.6], [1, 3, 1]), block([0], [0.4], [1])]
    counts = np.zeros((2, NBINS), dtype=np.int64)
    for lengths, runs, bins, w, _ in blocks:
        add_block_counts(counts, lengths, runs, bins, w)
    assert counts.sum(axis=1).tolist() == [2, 4]
    reads = []

    def once() -> list[Block]:
        reads.append(1)
        return blocks

    got = block_percentiles(once, 2, [[1], [0], [0, 1]], [0.0, 50.0, 100.0], counts)
    assert len(reads) == 1
    assert got == [[0.2, 0.2, 0.6], [0.1, 0.25, 0.4], [0.1, 0.2, 0.6]]
    with pytest.raises(ValueError) as e:
        block_percentiles(once, 2, [[0]], [50.0], np.zeros((2, 3), dtype=np.int64))
    assert str(e.value) == f"counts must have shape (2, {NBINS}), got (2, 3)"
