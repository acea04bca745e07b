"""ISL bucket behaviours that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md)."""

from __future__ import annotations

import pytest

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets, label_sort_key


def test_the_constructor_validates_and_normalises_like_parse() -> None:
    b = IslBuckets(("512", " 1024 "))  # type: ignore[arg-type]
    assert b.boundaries == (512, 1024) and b.labels == ("0-512", "513-1024", "1025+")
    assert IslBuckets([512]).boundaries == (512,)  # type: ignore[arg-type]
    for bad in [(), (0,), (512, 512), (1024, 512), tuple(range(1, 34))]:
        with pytest.raises(ValueError):
            IslBuckets(bad)


def test_empty_spec_message() -> None:
    with pytest.raises(ValueError, match=r"^ISL bucket boundaries must not be empty \(example: 512,"):
        IslBuckets.parse("")


def test_label_sort_key_values() -> None:
    assert [label_sort_key(x) for x in ("0-512", "513-1024", "16385+", "7+")] == [0, 513, 16385, 7]


def test_unknown_labels_sort_last() -> None:
    labels = ["12X", "16385+", "", "513-1024", "other", "0-512", "x+", "1-2-3", "512", "-5", "1-", "٣+"]
    ordered = sorted(labels, key=label_sort_key)
    assert ordered[:3] == ["0-512", "513-1024", "16385+"]
    assert set(ordered[3:]) == {"12X", "", "other", "x+", "1-2-3", "512", "-5", "1-", "٣+"}
    assert label_sort_key("other") > label_sort_key(f"{2**40}+")


def test_from_labels_inverts_the_labels() -> None:
    assert IslBuckets.from_labels(IslBuckets.default().labels) == IslBuckets.default()
    assert IslBuckets.from_labels(["0-512", "513-1024", "1025+"]).boundaries == (512, 1024)
    assert IslBuckets.from_labels(("0-7", "8+")).boundaries == (7,)
    assert IslBuckets.default().boundaries == DEFAULT_ISL_BOUNDARIES


@pytest.mark.parametrize(
    "labels",
    [
        ["0-512", "600-1024", "1025+"],  # a gap
        ["513-1024", "0-512", "1025+"],  # not in numeric order
        ["0-512", "513-1024"],  # no open last bucket
        ["0-512"],
        ["0+"],
        ["0-x", "y+"],
    ],
)
def test_from_labels_refuses_what_no_boundaries_make(labels: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        IslBuckets.from_labels(labels)
    assert str(info.value) == f"not the labels of ISL buckets in numeric order: {', '.join(labels)}"
