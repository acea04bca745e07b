"""Rendering SLO attainment per ISL bucket (:mod:`servelens.core.slo`): exact rows from per-request
data (the bench, ``report --results``, ``explain`` on results files) and bounded rows from
histograms (``report``/``explain`` on scrapes or Prometheus), as rich tables and as JSON-ready dicts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from servelens.core.slo import Attainment, AttainmentBounds, ShareBounds, Slo, Threshold
from servelens.formats.table import display_label


def describe_threshold(th: Threshold) -> str:
    """A threshold as the flag takes it: ``2 s``, ``0.5 s + 0.0002 s * ISL``, or the table."""
    if th.table:
        return ", ".join(f"{label} {v:g} s" for label, v in th.table)
    if th.per_token_s:
        return f"{th.base_s:g} s + {th.per_token_s:g} s * ISL"
    return f"{th.base_s:g} s"


def describe_slo(slo: Slo, per_token: bool = False) -> str:
    """``TTFT <= 2 s; mean ITL per request <= 0.05 s`` (``per_token``: ``ITL per token``, as a
    histogram judges it)."""
    parts = []
    if slo.ttft is not None:
        parts.append(f"TTFT <= {describe_threshold(slo.ttft)}")
    if slo.itl is not None:
        parts.append(f"{'ITL per token' if per_token else 'mean ITL per request'} <= {describe_threshold(slo.itl)}")
    return "; ".join(parts)


def attainment_caption(slo: Slo) -> str:
    """The caption of :func:`attainment_table`."""
    return f"SLO: {describe_slo(slo)}; a failed request meets none"


def bounds_caption(slo: Slo) -> str:
    """The first caption line of :func:`bounds_table` (its notes follow)."""
    return f"SLO: {describe_slo(slo, per_token=True)}; from histograms, a-b% is a bound, one figure exact"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def share_text(b: ShareBounds | None) -> str:
    """``95.2%`` when exact, ``93.1-97.0%`` for bounds, ``-`` for no data."""
    if b is None:
        return "-"
    if b.exact:
        return _pct(b.low)
    return f"{b.low * 100:.1f}-{b.high * 100:.1f}%"


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def attainment_table(rows: Sequence[Attainment], slo: Slo, title: str | None = None, caption: bool = True) -> Table:
    """Per bucket, then "all requests": requests, the share meeting each SLO and all of them, and
    goodput (requests per second meeting all SLOs). Exact (per-request data). ``caption`` False
    leaves the caption (:func:`attainment_caption`) to the caller."""
    table = Table(title=title, caption=attainment_caption(slo) if caption else None)
    table.add_column("Input length\n(tokens)", no_wrap=True)
    for h in ("Requests", *(["TTFT met"] if slo.ttft else []), *(["ITL met"] if slo.itl else []),
              "All met", "Goodput\n(req/s)"):
        table.add_column(h, justify="right", no_wrap=True)
    for r in rows:
        if r.label == "all":
            table.add_section()
        cells = [display_label(r.label), f"{r.requests:,}",
                 *([_pct(r.ttft_share)] if slo.ttft else []), *([_pct(r.itl_share)] if slo.itl else []),
                 _pct(r.all_share), _rate(r.goodput_rps)]
        table.add_row(*cells, style="bold" if r.label == "all" else None)
    return table


def bounds_table(rows: Sequence[AttainmentBounds], slo: Slo, title: str | None = None,
                 notes: Sequence[str] = (), caption: bool = True) -> Table:
    """Per bucket, then "all": the TTFT observations, the share of TTFTs within the TTFT SLO, the
    share of tokens within the ITL SLO, and goodput where it can be bounded: ``low-high`` where the
    histograms only bound a figure (``notes`` say why). ``caption`` False leaves the caption
    (:func:`bounds_caption` and the notes) to the caller."""
    table = Table(title=title, caption="\n".join([bounds_caption(slo), *notes]) if caption else None)
    table.add_column("Input length\n(tokens)", no_wrap=True)
    for h in ("TTFTs", *(["TTFT within"] if slo.ttft else []), *(["Tokens within\nITL SLO"] if slo.itl else []),
              "Goodput\n(req/s)"):
        table.add_column(h, justify="right", no_wrap=True)
    for r in rows:
        if r.label == "all":
            table.add_section()
        good = "-" if r.goodput_rps is None else (
            _rate(r.goodput_rps[0]) if r.goodput_rps[0] == r.goodput_rps[1]
            else f"{_rate(r.goodput_rps[0])}-{_rate(r.goodput_rps[1])}")
        cells = [display_label(r.label), f"{r.observations:,.0f}",
                 *([share_text(r.ttft)] if slo.ttft else []), *([share_text(r.itl)] if slo.itl else []), good]
        table.add_row(*cells, style="bold" if r.label == "all" else None)
    return table


def slo_dict(slo: Slo) -> dict[str, Any]:
    """The SLOs as JSON data (``None`` for a metric without one)."""
    return {"ttft": asdict(slo.ttft) if slo.ttft else None, "itl": asdict(slo.itl) if slo.itl else None,
            "description": describe_slo(slo)}


def attainment_dicts(rows: Sequence[Attainment] | Sequence[AttainmentBounds]) -> list[dict[str, Any]]:
    """Rows as JSON data; bounds as ``{"low", "high", "exact"}``."""
    out = []
    for r in rows:
        d = asdict(r)
        for key in ("ttft", "itl"):
            b = getattr(r, key, None)
            if isinstance(b, ShareBounds):
                d[key] = {"low": b.low, "high": b.high, "exact": b.exact}
        out.append(d)
    return out
