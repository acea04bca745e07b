"""A small client for the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``), which
Prometheus and VictoriaMetrics both serve. Standard library HTTP only (blocking; the CLI is sync).

Source: https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Series:
    """One result series: its labels and its ``(unix time s, value)`` points (one for an instant query).

    Values are floats; Prometheus' ``NaN``/``+Inf`` strings become ``math.nan``/``math.inf``.
    """

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        """The last point's value (the only one for an instant query)."""
        return self.points[-1][1]


NOT_PROMETHEUS = ("not a Prometheus API (give the base URL of Prometheus or VictoriaMetrics, e.g. "
                  "http://host:9090; a gateway's or engine's /metrics goes to --metrics)")


class PromApiError(ValueError):
    """The server was unreachable or answered with an error (bad query, timeout, ...)."""


@dataclass(frozen=True)
class PromClient:
    """Queries one Prometheus-compatible server.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:9090`` (a trailing ``/`` is fine).
        timeout_s: per-request timeout in seconds.
    """

    url: str
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlparse(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"Prometheus URL must be http(s)://host:port, got {self.url!r}")
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def _get(self, path: str, params: dict[str, str]) -> Any:
        full = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):
                raise PromApiError(f"{self.url}{path}: HTTP {exc.code}: {NOT_PROMETHEUS}") from None
            if not isinstance(doc, dict) or doc.get("status") != "error":  # Prometheus' error replies have it
                raise PromApiError(f"{self.url}{path}: HTTP {exc.code}: {NOT_PROMETHEUS}") from None
            raise PromApiError(
                f"{self.url}{path}: {doc.get('errorType', 'error')}: {doc.get('error', exc.reason)}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PromApiError(f"cannot reach Prometheus API at {self.url}: {reason}") from None
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to decode
            raise PromApiError(f"{self.url}{path}: the answer is not JSON: {NOT_PROMETHEUS}") from None
        if not isinstance(doc, dict) or "status" not in doc or (doc["status"] == "success" and "data" not in doc):
            raise PromApiError(f"{self.url}{path}: the answer is not a Prometheus API reply: {NOT_PROMETHEUS}")
        if doc.get("status") != "success":
            raise PromApiError(f"{self.url}{path}: {doc.get('errorType', 'error')}: {doc.get('error', '')}")
        return doc["data"]

    def query(self, expr: str, time_s: float | None = None) -> list[Series]:
        """Instant query at ``time_s`` (unix seconds; None = now). Raises PromApiError."""
        params = {"query": expr}
        if time_s is not None:
            params["time"] = f"{time_s:.3f}"
        return _series(self._get("/api/v1/query", params))

    def query_range(self, expr: str, start_s: float, end_s: float, step_s: float) -> list[Series]:
        """Range query (unix seconds, step in seconds). Raises PromApiError."""
        params = {"query": expr, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": f"{step_s:g}"}
        return _series(self._get("/api/v1/query_range", params))

    def scalar(self, expr: str, time_s: float | None = None) -> float | None:
        """The value of a query expected to return at most one series; None when it returns none
        or NaN. Raises PromApiError (also when it returns several series)."""
        got = self.query(expr, time_s)
        if not got:
            return None
        if len(got) > 1:
            raise PromApiError(f"query returned {len(got)} series, expected one: {expr}")
        v = got[0].value
        return None if math.isnan(v) else v


def _series(data: dict[str, Any]) -> list[Series]:
    kind = data.get("resultType")
    out: list[Series] = []
    if kind == "vector":
        for r in data["result"]:
            out.append(Series(dict(r["metric"]), ((float(r["value"][0]), float(r["value"][1])),)))
    elif kind == "matrix":
        for r in data["result"]:
            out.append(Series(dict(r["metric"]), tuple((float(t), float(v)) for t, v in r["values"])))
    elif kind == "scalar":
        out.append(Series({}, ((float(data["result"][0]), float(data["result"][1])),)))
    else:
        raise PromApiError(f"unexpected resultType {kind!r}")
    return out


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration_s(text: str) -> float:
    """Seconds in a Prometheus duration such as ``5m``, ``90s``, ``1h30m``. Raises ValueError."""
    s = text.strip()
    total = 0.0
    num = ""
    i = 0
    if not s:
        raise ValueError("empty duration")
    while i < len(s):
        c = s[i]
        if c.isdigit():
            num += c
            i += 1
            continue
        unit = "ms" if s.startswith("ms", i) else c
        if unit not in _UNITS or not num:
            raise ValueError(f"not a Prometheus duration (like 5m, 90s, 1h): {text!r}")
        total += int(num) * _UNITS[unit]
        num = ""
        i += len(unit)
    if num or total <= 0:
        raise ValueError(f"not a Prometheus duration (like 5m, 90s, 1h): {text!r}")
    return total
