import pytest

from servelens.core.buckets import (
    DEFAULT_ISL_BOUNDARIES,
    MAX_ISL_BOUNDARIES,
    IslBuckets,
    label_sort_key,
    parse_isl_boundaries,
)


def test_default_labels_in_numeric_order() -> None:
    b = IslBuckets.parse("512,1024,2048,4096,8192,16384")
    assert b.boundaries == DEFAULT_ISL_BOUNDARIES
    assert b.labels == ("0-512", "513-1024", "1025-2048", "2049-4096", "4097-8192", "8193-16384", "16385+")
    assert len(b) == 7
    assert b.spec == "512,1024,2048,4096,8192,16384"


@pytest.mark.parametrize(
    ("isl", "label"),
    [(0, "0-512"), (1, "0-512"), (512, "0-512"), (513, "513-1024"), (1024, "513-1024"), (1025, "1025-2048"),
     (16384, "8193-16384"), (16385, "16385+"), (10**7, "16385+")],
)
def test_edge_isls(isl: int, label: str) -> None:
    assert IslBuckets.default().label(isl) == label


def test_list_and_string_are_equivalent() -> None:
    assert IslBuckets.parse([100, 200]) == IslBuckets.parse(" 100, 200 ")
    assert IslBuckets.parse([100, 200]).labels == ("0-100", "101-200", "201+")


def test_single_boundary() -> None:
    assert IslBuckets.parse("1").labels == ("0-1", "2+")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("512,1024,4096,2048", "ISL bucket boundaries must be strictly increasing: 2048 follows 4096"),
        ("512,512", "strictly increasing: 512 follows 512"),
        ("", "must not be empty"),
        ([], "must not be empty"),
        ("0,10", "positive integer, got 0"),
        ("-5", "positive integer, got -5"),
        ("12.5", "positive integer, got '12.5'"),
        ("abc", "positive integer, got 'abc'"),
        ("1,,2", "positive integer, got ''"),
        ([True], "positive integer"),
    ],
)
def test_validation_messages(spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_isl_boundaries(spec)  # type: ignore[arg-type]


def test_at_most_32_boundaries() -> None:
    assert len(IslBuckets.parse(range(1, MAX_ISL_BOUNDARIES + 1))) == 33
    with pytest.raises(ValueError, match="at most 32 ISL bucket boundaries are allowed, got 33"):
        IslBuckets.parse(range(1, MAX_ISL_BOUNDARIES + 2))


@pytest.mark.parametrize(("boundaries", "message"), [
    ((1024, 512), "strictly increasing: 512 follows 1024"),
    ((), "must not be empty"),
    ((0, 10), "positive integer, got 0"),
    (tuple(range(1, MAX_ISL_BOUNDARIES + 2)), "at most 32"),
])
def test_constructor_validates_as_parse_does(boundaries: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IslBuckets(boundaries)
    assert IslBuckets((100, 200)).boundaries == (100, 200)


def test_negative_isl_rejected() -> None:
    with pytest.raises(ValueError, match="ISL must be >= 0"):
        IslBuckets.default().label(-1)


def test_label_sort_key_orders_numerically() -> None:
    labels = list(IslBuckets.default().labels)
    assert sorted(labels) != labels  # string order is wrong: "1025-2048" < "513-1024"
    assert sorted(reversed(labels), key=label_sort_key) == labels
    # unknown labels (none of ours: "all", a typo) sort after every bucket, not first
    mixed = ["unknown", labels[-1], "all", labels[0], labels[3]]
    assert sorted(mixed, key=label_sort_key)[:3] == [labels[0], labels[3], labels[-1]]
