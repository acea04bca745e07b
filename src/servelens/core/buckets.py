"""ISL (input sequence length) buckets: boundaries, labels and lookup.

Boundaries are inclusive upper bounds in tokens, strictly increasing positive integers,
at most :data:`MAX_ISL_BOUNDARIES`. ``n`` boundaries make ``n + 1`` buckets; for
``512,1024,...,16384`` the labels are ``0-512``, ``513-1024``, ..., ``16385+``.
An ISL equal to a boundary belongs to the bucket that boundary closes (512 -> ``0-512``).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_ISL_BOUNDARIES = 32
"""At most this many boundaries (so at most 33 buckets) are accepted."""

DEFAULT_ISL_BOUNDARIES: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
"""The default boundaries in tokens: seven buckets from ``0-512`` to ``16385+``."""


def parse_isl_boundaries(spec: str | Iterable[int | str]) -> tuple[int, ...]:
    """Validate ISL bucket boundaries given as ``"512,1024,..."`` or a sequence of ints.

    Returns the boundaries as a tuple of ints (tokens).

    Raises:
        ValueError: with a message naming the offending value, when the spec is empty,
            a value is not a positive integer, the values are not strictly increasing,
            or there are more than :data:`MAX_ISL_BOUNDARIES`.
    """
    if isinstance(spec, str):
        parts: list[int | str] = [p.strip() for p in spec.split(",")]
        if parts == [""]:
            parts = []
    else:
        parts = list(spec)
    if not parts:
        raise ValueError("ISL bucket boundaries must not be empty (example: 512,1024,2048,4096,8192,16384)")
    values: list[int] = []
    for raw in parts:
        if isinstance(raw, bool):
            raise ValueError(f"ISL bucket boundary must be a positive integer, got {raw!r}")
        if isinstance(raw, int):
            value = raw
        else:
            text = str(raw).strip()
            try:
                value = int(text)
            except ValueError:
                raise ValueError(
                    f"ISL bucket boundary must be a positive integer, got {text!r}"
                ) from None
        if value <= 0:
            raise ValueError(f"ISL bucket boundary must be a positive integer, got {value}")
        if values and value <= values[-1]:
            raise ValueError(
                f"ISL bucket boundaries must be strictly increasing: {value} follows {values[-1]}"
            )
        values.append(value)
    if len(values) > MAX_ISL_BOUNDARIES:
        raise ValueError(
            f"at most {MAX_ISL_BOUNDARIES} ISL bucket boundaries are allowed, got {len(values)}"
        )
    return tuple(values)


def _labels(boundaries: tuple[int, ...]) -> tuple[str, ...]:
    labels: list[str] = []
    low = 0
    for upper in boundaries:
        labels.append(f"{low}-{upper}")
        low = upper + 1
    labels.append(f"{low}+")
    return tuple(labels)


@dataclass(frozen=True)
class IslBuckets:
    """A validated set of ISL buckets.

    Attributes:
        boundaries: inclusive upper bounds in tokens, strictly increasing.
        labels: ``len(boundaries) + 1`` label values in numeric order, e.g. ``("0-512", ..., "16385+")``.

    Build one with :meth:`parse` (accepts a string or a sequence); the constructor validates too.
    """

    boundaries: tuple[int, ...]
    labels: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        checked = parse_isl_boundaries(self.boundaries)
        object.__setattr__(self, "boundaries", checked)
        object.__setattr__(self, "labels", _labels(checked))

    @classmethod
    def parse(cls, spec: str | Iterable[int | str]) -> IslBuckets:
        """Build buckets from ``"512,1024,..."`` or a sequence. Raises ValueError (see above)."""
        return cls(parse_isl_boundaries(spec))

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> IslBuckets:
        """The buckets whose labels are ``labels`` in numeric order (``0-512, 513-1024, 1025+`` ->
        ``512,1024``). Raises ValueError when they are not the labels of any boundaries."""
        given = tuple(labels)
        uppers = [label.partition("-")[2] for label in given[:-1]]
        try:
            got = cls(tuple(int(u) for u in uppers))
        except ValueError:
            got = None
        if got is None or got.labels != given:
            raise ValueError(f"not the labels of ISL buckets in numeric order: {', '.join(given)}")
        return got

    @classmethod
    def default(cls) -> IslBuckets:
        """The default seven buckets ``0-512`` ... ``16385+``."""
        return cls(DEFAULT_ISL_BOUNDARIES)

    def index(self, isl_tokens: int) -> int:
        """Index (0-based, numeric order) of the bucket holding ``isl_tokens``.

        Raises ValueError for a negative ISL.
        """
        if isl_tokens < 0:
            raise ValueError(f"ISL must be >= 0 tokens, got {isl_tokens}")
        return bisect_left(self.boundaries, isl_tokens)

    def label(self, isl_tokens: int) -> str:
        """Label of the bucket holding ``isl_tokens`` (512 -> ``"0-512"``, 513 -> ``"513-1024"``)."""
        return self.labels[self.index(isl_tokens)]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def spec(self) -> str:
        """The boundaries as the comma-separated string the CLI accepts."""
        return ",".join(str(b) for b in self.boundaries)


_LABEL = re.compile(r"([0-9]+)(?:-[0-9]+|\+)")  # "513-1024" or "16385+": what IslBuckets.labels makes


def label_sort_key(label: str) -> int:
    """Numeric sort key for a bucket label (``"513-1024"`` -> 513, ``"16385+"`` -> 16385).

    Label values sort as strings in Prometheus and Grafana (``1025-2048`` before ``513-1024``);
    use this key to order them numerically. Unknown labels sort last.
    """
    m = _LABEL.fullmatch(label)
    return int(m.group(1)) if m else 1 << 62
