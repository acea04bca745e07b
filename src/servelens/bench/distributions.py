"""Token-length distributions for synthetic workloads (``--isl``, ``--osl``).

Spec grammar (tokens, positive integers):

* ``300``: fixed value.
* ``uniform:A-B``: integers uniform on ``[A, B]`` inclusive.
* ``lognormal:MEAN,SD``: lognormal whose *own* mean and standard deviation (in tokens, not of the
  underlying normal) are MEAN and SD, rounded to an integer and clamped to >= 1.
  The normal's parameters are ``sigma^2 = ln(1 + SD^2/MEAN^2)``, ``mu = ln(MEAN) - sigma^2/2``.
* ``300:0.6,12000:0.4``: weighted mix of fixed values (weights are normalised; need not sum to 1).

Sampling uses a ``numpy.random.Generator`` passed in by the caller, so a seed gives the same lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthDist:
    """A parsed length distribution.

    Attributes:
        kind: ``"fixed"``, ``"uniform"``, ``"lognormal"`` or ``"mix"``.
        params: fixed: ``(value,)``; uniform: ``(low, high)``; lognormal: ``(mean, sd)``;
            mix: ``(v1, w1, v2, w2, ...)`` with weights normalised to sum 1.
        spec: the text it was parsed from.
    """

    kind: str
    params: tuple[float, ...]
    spec: str

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` lengths (ints >= 1) drawn with ``rng``."""
        if n < 0:
            raise ValueError(f"sample count must be >= 0, got {n}")
        if self.kind == "fixed":
            return [int(self.params[0])] * n
        if self.kind == "uniform":
            lo, hi = int(self.params[0]), int(self.params[1])
            return [int(x) for x in rng.integers(lo, hi + 1, size=n)]
        if self.kind == "lognormal":
            mean, sd = self.params
            sigma2 = math.log(1.0 + (sd * sd) / (mean * mean))
            mu = math.log(mean) - sigma2 / 2
            draws = rng.lognormal(mu, math.sqrt(sigma2), size=n)
            return [max(1, round(float(x))) for x in draws]
        values = [int(v) for v in self.params[0::2]]
        weights = np.asarray(self.params[1::2], dtype=float)
        idx = rng.choice(len(values), size=n, p=weights)
        return [values[int(i)] for i in idx]

    @property
    def mean(self) -> float:
        """The distribution's mean in tokens (before rounding)."""
        if self.kind == "fixed":
            return self.params[0]
        if self.kind == "uniform":
            return (self.params[0] + self.params[1]) / 2
        if self.kind == "lognormal":
            return self.params[0]
        return float(sum(v * w for v, w in zip(self.params[0::2], self.params[1::2], strict=True)))


def _pos_int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{what} in {spec!r} must be a positive integer, got {text.strip()!r}") from None
    if value <= 0:
        raise ValueError(f"{what} in {spec!r} must be a positive integer, got {value}")
    return value


def _pos_float(text: str, what: str, spec: str, allow_zero: bool = False) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{what} in {spec!r} must be a number, got {text.strip()!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} in {spec!r} must be {'>= 0' if allow_zero else '> 0'}, got {text.strip()}")
    return value


def parse_length_dist(spec: str) -> LengthDist:
    """Parse a length spec (see the module docstring).

    Raises:
        ValueError: naming the spec and the bad part, for anything else.
    """
    text = spec.strip()
    if not text:
        raise ValueError("empty length distribution (examples: 300, uniform:100-2000, lognormal:1000,400, "
                         "300:0.6,12000:0.4)")
    low = text.lower()
    if low.startswith("uniform:"):
        body = text.split(":", 1)[1]
        a, sep, b = body.partition("-")
        if not sep:
            raise ValueError(f"uniform needs A-B, got {spec!r} (example: uniform:100-2000)")
        lo, hi = _pos_int(a, "lower bound", spec), _pos_int(b, "upper bound", spec)
        if hi < lo:
            raise ValueError(f"uniform upper bound below lower bound in {spec!r}")
        return LengthDist("uniform", (lo, hi), text)
    if low.startswith("lognormal:"):
        body = text.split(":", 1)[1]
        parts = body.split(",")
        if len(parts) != 2:
            raise ValueError(f"lognormal needs MEAN,SD, got {spec!r} (example: lognormal:1000,400)")
        mean = _pos_float(parts[0], "mean", spec)
        sd = _pos_float(parts[1], "standard deviation", spec, allow_zero=True)
        if sd == 0:
            return LengthDist("fixed", (round(mean),), text)
        return LengthDist("lognormal", (mean, sd), text)
    if ":" in text:
        params: list[float] = []
        for part in text.split(","):
            v, sep, w = part.partition(":")
            if not sep:
                raise ValueError(f"mix entries must be VALUE:WEIGHT, got {part.strip()!r} in {spec!r}")
            params.extend((_pos_int(v, "value", spec), _pos_float(w, "weight", spec, allow_zero=True)))
        total = sum(params[1::2])
        if total <= 0:
            raise ValueError(f"mix weights in {spec!r} sum to 0")
        for i in range(1, len(params), 2):
            params[i] /= total
        return LengthDist("mix", tuple(params), text)
    return LengthDist("fixed", (_pos_int(text, "length", spec),), text)
