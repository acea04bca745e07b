"""The Prometheus text exposition (format 0.0.4) of a :class:`~servelens.core.snapshot.StateSnapshot`,
written directly: the same bytes as ``prometheus_client.generate_latest`` over
:class:`~servelens.prometheus.collector.FrontendCollector` (families, order, sorted labels, ``le``
strings, and numbers through prometheus_client's own ``floatToGoString``), ~25x faster.

prometheus_client builds a ``Sample`` per line and formats its labels and value one at a time: 1.0-1.5 s
of CPU for the 107,000 lines of 10 models x 33 ISL buckets with ~140 ``le`` edges. Here a histogram's
lines are laid out by slice assignment into one list (line heads made of two strings per series, the
``le`` strings made once per family, the cumulative counts through C ``str``) and joined once: 40-65 ms
for the same lines (``benchmarks/scrape_stall.py``). A histogram whose copy is the one formatted last
time (unchanged, see :func:`~servelens.core.snapshot.take_snapshot`) costs nothing: its bytes are kept.

:meth:`TextExposition.pieces` gives the text in pieces (a family head, or one series' lines), so a
caller on an event loop can yield between them (:mod:`servelens.gateway.scrape`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate

from prometheus_client.utils import floatToGoString

from servelens.core.edges import MetricEdges
from servelens.core.snapshot import HistogramCopy, StateSnapshot
from servelens.core.status import UNKNOWN_MODEL
from servelens.prometheus.collector import format_le
from servelens.prometheus.names import BY_ISL_HELP, BY_UNCACHED_HELP, HELP, MetricNames

_GO_EXPONENT = 1_000_000
"""From 1e6 on Go (and prometheus_client) write a number with an exponent (``1.234567e+06``); below
it an integral value reads ``12.0``, which is ``str(int)`` and ``.0``."""

_STOCK_KEYS = ("ttft", "itl", "duration", "isl", "osl", "cached")
_BY_ISL_KEYS = ("ttft", "itl", "duration", "osl", "cached")


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it (backslash, newline and double quote escaped)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _head(name: str, help_text: str, kind: str) -> bytes:
    doc = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n".encode()


class _HistogramFamily:
    """One histogram family: its head and the per-family parts of its lines."""

    __slots__ = ("dot0_nl", "head", "les", "name", "nl")

    def __init__(self, name: str, help_text: str, edges: Sequence[float]) -> None:
        self.name = name
        self.head = _head(name, help_text, "histogram")
        self.les = [format_le(e) for e in edges] + ["+Inf"]
        self.dot0_nl = [".0\n"] * len(self.les)
        self.nl = ["\n"] * len(self.les)

    def series(self, h: HistogramCopy, labels_before_le: str, labels_after_le: str) -> bytes:
        """The lines of one series: ``_bucket`` per edge (labels sorted: those before ``le``, ``le``,
        those after), ``_count``, ``_sum``. Label strings are ``k="v"`` joined by commas, escaped."""
        name = self.name
        before = labels_before_le + "," if labels_before_le else ""
        after = "," + labels_after_le if labels_after_le else ""
        plain = ",".join(x for x in (labels_before_le, labels_after_le) if x)
        cum = list(accumulate(h.counts))
        k = len(cum)
        out: list[str] = [""] * (5 * k)
        out[0::5] = [f'{name}_bucket{{{before}le="'] * k
        out[1::5] = self.les
        out[2::5] = [f'"{after}}} '] * k
        if h.total < _GO_EXPONENT:
            out[3::5] = map(str, cum)
            out[4::5] = self.dot0_nl
            count = f"{h.total}.0"
        else:
            out[3::5] = map(floatToGoString, cum)
            out[4::5] = self.nl
            count = floatToGoString(h.total)
        out.append(f"{name}_count{{{plain}}} {count}\n{name}_sum{{{plain}}} {floatToGoString(h.sum)}\n")
        return "".join(out).encode()


class TextExposition:
    """Writes snapshots of one :class:`~servelens.core.state.FrontendState` as Prometheus text.

    Args:
        names: metric names (prefix).
        edges: the state's ``le`` edges.
        stock: write the stock families; by_isl: the by-ISL families and the assignment and prompt-token
            counters (of a snapshot that has ISL buckets); by_uncached: the by-uncached families (of a
            snapshot that has uncached buckets); as :class:`~servelens.prometheus.collector.FrontendCollector`.

    Bytes written for a series are kept with the copy they were written from and reused while a later
    snapshot holds that same copy; use one instance per state. Safe to call from several threads (a
    stale entry only misses).
    """

    def __init__(self, names: MetricNames, edges: MetricEdges, stock: bool = True, by_isl: bool = True,
                 by_uncached: bool = True) -> None:
        self.names = names
        self.stock = stock
        self.by_isl = by_isl
        self.by_uncached = by_uncached
        stock_edges = (edges.ttft_s, edges.itl_s, edges.duration_s, edges.isl_tokens, edges.osl_tokens,
                       edges.cached_tokens)
        self._stock = [_HistogramFamily(name, HELP[key], e) for name, key, e in
                       zip(names.stock_histograms(), _STOCK_KEYS, stock_edges, strict=True)]
        self._by_isl = [_HistogramFamily(name, HELP[key] + BY_ISL_HELP, e) for name, key, e in
                        zip(names.by_isl_histograms(), _BY_ISL_KEYS, (*stock_edges[:3], *stock_edges[4:]),
                            strict=True)]
        self._by_uncached = [_HistogramFamily(name, HELP[key] + BY_UNCACHED_HELP, e) for name, key, e in
                             zip(names.by_uncached_histograms(), _BY_ISL_KEYS[:3], stock_edges[:3], strict=True)]
        self._written: dict[tuple[int, str, str], tuple[HistogramCopy, bytes]] = {}

    def render(self, snap: StateSnapshot) -> bytes:
        """The whole exposition of ``snap``."""
        return b"".join(self.pieces(snap))

    def pieces(self, snap: StateSnapshot) -> Iterator[bytes]:
        """The exposition of ``snap`` in order, one piece per family head, series or counter family."""
        if self.stock:
            yield from self._stock_pieces(snap)
        if self.by_isl and snap.isl_labels:
            yield from self._by_isl_pieces(snap)
        if self.by_uncached and snap.uncached_labels:
            yield from self._by_uncached_pieces(snap)

    def _series(self, key: tuple[int, str, str], fam: _HistogramFamily, h: HistogramCopy, before_le: str,
                after_le: str) -> bytes:
        hit = self._written.get(key)
        if hit is not None and hit[0] is h:
            return hit[1]
        text = fam.series(h, before_le, after_le)
        self._written[key] = (h, text)
        return text

    def _stock_pieces(self, snap: StateSnapshot) -> Iterator[bytes]:
        n = self.names
        models = [(m, f'model="{escape_label_value(m.name)}"') for m in snap.models]
        for i, fam in enumerate(self._stock):
            yield fam.head
            for m, label in models:
                yield self._series((i, m.name, ""), fam, m.histograms[i], "", label)
            if i == 2 and snap.unknown_duration is not None:  # Dynamo records these durations too
                yield self._series((i, UNKNOWN_MODEL, ""), fam, snap.unknown_duration, "",
                                   f'model="{UNKNOWN_MODEL}"')
        go = floatToGoString
        lines = [_head(n.requests, HELP["requests"], "counter").decode()]
        for model, reqs in [(escape_label_value(m.name), m.requests) for m in snap.models] + [
                (UNKNOWN_MODEL, snap.unknown_requests)]:
            for (endpoint, rtype, status, etype), count in reqs:
                lines.append(f'{n.requests}{{endpoint="{escape_label_value(endpoint)}",error_type='
                             f'"{escape_label_value(etype)}",model="{model}",request_type='
                             f'"{escape_label_value(rtype)}",status="{escape_label_value(status)}"}} {go(count)}\n')
        lines.append(_head(n.inflight, HELP["inflight"], "gauge").decode())
        lines += [f"{n.inflight}{{{label}}} {go(m.inflight)}\n" for m, label in models]
        if snap.unknown_requests:  # Dynamo keeps an inflight series at 0 for unknown_model too
            lines.append(f'{n.inflight}{{model="{UNKNOWN_MODEL}"}} {go(0)}\n')
        lines.append(_head(n.output_tokens, HELP["output_tokens"], "counter").decode())
        lines += [f"{n.output_tokens}{{{label}}} {go(m.output_tokens)}\n" for m, label in models]
        lines.append(_head(n.disconnected, HELP["disconnected"], "gauge").decode())
        lines.append(f"{n.disconnected} {go(snap.disconnected_clients)}\n")
        yield "".join(lines).encode()

    def _by_isl_pieces(self, snap: StateSnapshot) -> Iterator[bytes]:
        n = self.names
        models = [(m, f'model="{escape_label_value(m.name)}"') for m in snap.models]
        buckets = [(label, f'isl_bucket="{escape_label_value(label)}"') for label in snap.isl_labels]
        for i, fam in enumerate(self._by_isl):
            yield fam.head
            for m, model_label in models:
                for (label, bucket_label), h in zip(buckets, m.by_isl(i), strict=True):
                    yield self._series((6 + i, m.name, label), fam, h, bucket_label, model_label)
        lines = [_head(n.isl_assignments, HELP["isl_assignments"], "counter").decode()]
        for m, model_label in models:
            lines += [f'{n.isl_assignments}{{{model_label},source="{escape_label_value(src)}"}} '
                      f"{floatToGoString(count)}\n" for src, count in m.isl_sources]
        if snap.slo_kinds:
            lines.append(_head(n.slo_by_isl, HELP["slo_by_isl"], "counter").decode())
            index = {"ttft": 1, "itl": 2, "all": 3}
            for m, model_label in models:
                for met in m.slo_met:
                    bucket = f'isl_bucket="{escape_label_value(met[0])}"'
                    lines += [f'{n.slo_by_isl}{{{bucket},{model_label},slo="{kind}"}} '
                              f"{floatToGoString(met[index[kind]])}\n" for kind in snap.slo_kinds]
        if snap.slo_thresholds:
            lines.append(_head(n.slo_threshold_info, HELP["slo_threshold_info"], "gauge").decode())
            lines += [f'{n.slo_threshold_info}{{slo="{kind}",threshold="{escape_label_value(spec)}"}} 1.0\n'
                      for kind, spec in snap.slo_thresholds]
        lines.append(_head(n.prompt_tokens_by_isl, HELP["prompt_tokens_by_isl"], "counter").decode())
        for m, model_label in models:
            lines += [f"{n.prompt_tokens_by_isl}{{{bucket_label},{model_label}}} {floatToGoString(count)}\n"
                      for (_, bucket_label), count in zip(buckets, m.prompt_tokens_by_isl, strict=True)]
        yield "".join(lines).encode()

    def _by_uncached_pieces(self, snap: StateSnapshot) -> Iterator[bytes]:
        n = self.names
        models = [(m, f'model="{escape_label_value(m.name)}"') for m in snap.models]
        buckets = [(label, f'uncached_bucket="{escape_label_value(label)}"') for label in snap.uncached_labels]
        offset = 6 + len(self._by_isl)
        for i, fam in enumerate(self._by_uncached):
            yield fam.head
            for m, model_label in models:
                for (label, bucket_label), h in zip(buckets, m.by_uncached(i), strict=True):
                    yield self._series((offset + i, m.name, label), fam, h, "", f"{model_label},{bucket_label}")
        lines = [_head(n.uncached_assignments, HELP["uncached_assignments"], "counter").decode()]
        for m, model_label in models:
            lines += [f'{n.uncached_assignments}{{{model_label},source="{escape_label_value(src)}"}} '
                      f"{floatToGoString(count)}\n" for src, count in m.uncached_sources]
        yield "".join(lines).encode()
