"""``servelens explain``'s windows of one bench run from its ``results.cols`` folder
(:mod:`servelens.formats.columnar`), without per-request records.

The same windows as :func:`servelens.report.explain_windows.from_results` builds from records
(the tests compare them value for value): TTFT and request duration from per-request columns
(8 bytes a request each, held whole). ITL, ~365 values a request, is not held: :meth:`ColumnRun.itl_window`
keeps per request its token count and sum (``numpy.add.reduceat`` of its values, as
:meth:`~servelens.core.windows.BucketSamples.request_sums` of the record path) and per bucket the
tokens per value bin: a :class:`~servelens.core.windows.BinnedSampleWindow`, 16 bytes a request and
2 MiB of counts, whose quantiles read the values of a few bins in one pass over the bins
(:func:`~servelens.core.selection.hits`: the bins alone are tested, the request only for hits). The
totals and counts are the writer's (``itl_tokens``, ``itl_sum_s``, ``itl_bin_counts.npy``) where it
kept them for these buckets, else one pass over ``itl_s``, ``itl_bin`` (and ``itl_weight``) in blocks
of requests computes them.
:meth:`ColumnRun.itl` still builds the window of every value (``servelens report --compare`` resamples
quantiles and needs them). The SLOs' per-request mean ITL is the request's values added one after
another as Python's ``sum`` does (the same float as the records'), over their count; it is computed
only when asked (``servelens explain`` with an SLO).
"""

from __future__ import annotations

import math

import numpy as np

from servelens.core.binned_quantiles import BinnedValues
from servelens.core.buckets import IslBuckets
from servelens.core.selection import NBINS, add_block_counts, hits
from servelens.core.slo import SloRequest
from servelens.core.timing import NS_PER_S
from servelens.core.windows import BinnedSampleWindow, BucketSamples, SampleWindow
from servelens.formats.columnar import NULL, Columns, open_columns
from servelens.report.columnar import BLOCK, itl_files, itl_spans


class ColumnRun:
    """One run's columns, with each request's bucket (``-1``: no ISL, in no bucket)."""

    def __init__(self, path: str, buckets: IslBuckets) -> None:
        """Open ``path`` (a ``results.cols`` folder). Raises ValueError (one line) for a bad one."""
        self.c: Columns = open_columns(path)
        c = self.c
        server, target = c.column("isl_server"), c.column("isl_target")
        isl = np.where(server != NULL, server, target)
        self.ok = c.column("ok").astype(bool)
        self.ttft = c.column("ttft_s")
        self.send, self.end = c.column("send_ns"), c.column("end_ns")
        self.itl_start = c.column("itl_start")
        self.boundaries = buckets.boundaries
        edges = np.asarray(buckets.boundaries, dtype=np.int64)
        self.key = np.where(isl != NULL, np.searchsorted(edges, isl, side="left"), -1).astype(np.int64)
        if c.requests and int(isl[isl != NULL].min(initial=0)) < 0:
            raise ValueError(f"{path}: a negative ISL")
        self.labels = buckets.labels

    def span_s(self) -> float:
        """First send to last end (s), as :func:`~servelens.report.explain_windows.span_s`."""
        return (int(self.end.max()) - int(self.send.min())) / NS_PER_S

    def _window(self, metric: str, values: np.ndarray, use: np.ndarray) -> SampleWindow:
        """Per-request ``values`` (one each) of the requests in ``use``, per bucket in request order."""
        got = tuple(BucketSamples(values[use & (self.key == k)]) for k in range(len(self.labels)))
        return SampleWindow(metric, self.labels, got, int((use & (self.key < 0)).sum()))

    def ttft_window(self) -> SampleWindow:
        """TTFT of the successful requests with output."""
        return self._window("TTFT", self.ttft, self.ok & ~np.isnan(self.ttft))

    def duration_window(self) -> SampleWindow:
        """Send to end of stream (s) of the successful requests."""
        d = np.maximum(self.end - self.send, 0) / NS_PER_S
        return self._window("duration", d, self.ok & (self.key >= 0))

    def itl(self, with_sums: bool = True) -> tuple[SampleWindow, np.ndarray, np.ndarray]:
        """The ITL window, and per request its token count and the sum of its values (s; failed
        requests: 0 and 0; all 0 unless ``with_sums``), read in blocks of about :data:`BLOCK` values."""
        n, starts, k_n = self.c.requests, self.itl_start, len(self.labels)
        sizes, sums = np.zeros(n, dtype=np.int64), np.zeros(n)
        parts: list[list[np.ndarray]] = [[] for _ in range(k_n)]
        size_parts: list[list[np.ndarray]] = [[] for _ in range(k_n)]
        cuts = np.unique(np.concatenate((np.searchsorted(starts, np.arange(0, int(starts[-1]), BLOCK), side="right")
                                         - 1, [0, n])))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            lo, hi = int(starts[a]), int(starts[b])
            vals = self.c.read("itl_s", lo, hi)
            w = self.c.read("itl_weight", lo, hi).astype(np.int64) if self.c.weighted else None
            local = starts[a:b + 1] - lo
            cw = np.concatenate(([0], np.cumsum(w))) if w is not None else local
            tok = (cw[local[1:]] - cw[local[:-1]]) if w is not None else np.diff(local)
            use = self.ok[a:b]
            tok = np.where(use, tok, 0)
            per_gap = np.repeat(np.where(use, self.key[a:b], -2), np.diff(local))
            sizes[a:b] = tok
            if with_sums:
                rep = np.repeat(vals, w) if w is not None else vals
                tok_start = (cw[local[:-1]] if w is not None else local[:-1])
                sums[a:b] = _sequential_sums(rep, tok_start, tok)
            for k in range(k_n):
                sel = per_gap == k
                v = vals[sel]
                parts[k].append(np.repeat(v, w[sel]) if w is not None else v)
                size_parts[k].append(tok[use & (self.key[a:b] == k)])
        buckets = tuple(BucketSamples(np.concatenate(p) if p else np.zeros(0),
                                      np.concatenate(s) if s else np.zeros(0, dtype=np.int64))
                        for p, s in zip(parts, size_parts, strict=True))
        unbucketed = int(sizes[self.key < 0].sum())
        return SampleWindow("ITL", self.labels, buckets, unbucketed), sizes, sums

    def _groups(self) -> np.ndarray:
        """Each request's group for the value bins: its bucket, ``len(labels)`` for a successful
        request in no bucket, ``len(labels) + 1`` for a failed one (int64, shape (requests,))."""
        k_n = len(self.labels)
        return np.where(self.ok, np.where(self.key >= 0, self.key, k_n), k_n + 1).astype(np.int64)

    def itl_window(self, slo: bool = False) -> tuple[BinnedSampleWindow, np.ndarray, np.ndarray]:
        """The ITL window held compactly (module docstring), and per request its token count and,
        with ``slo``, the sum of its values in Python's order (failed requests: 0 and 0; the sums
        all 0 without ``slo``). What the writer kept is read, not recomputed: the per-request token
        counts and sums (``itl_tokens``, ``itl_sum_s``) and, for the same ISL buckets, the tokens
        per bucket and bin (``itl_bin_counts.npy``); what it did not keep comes from one pass over
        the ITL columns in blocks of about :data:`BLOCK` values. Raises ValueError (one line) for a
        truncated folder."""
        c, k_n = self.c, len(self.labels)
        n = c.requests
        need_sums = slo or not c.totals
        counts = None
        if c.bin_count_buckets == self.boundaries:
            counts = np.concatenate((c.bin_counts(), np.zeros((1, NBINS), dtype=np.int64)))
        slo_sums = np.zeros(n)
        if need_sums or counts is None:
            tok, block_sums, slo_sums, counts = self._itl_pass(need_sums, slo, counts)
        if not need_sums:  # kept by the writer
            tok, block_sums = c.column("itl_tokens"), c.column("itl_sum_s")
        sizes = np.where(self.ok, tok, 0)
        sums = np.where(self.ok, block_sums, 0.0)
        in_bucket = [self.ok & (self.key == k) for k in range(k_n)]
        window = BinnedSampleWindow(
            "ITL", self.labels, tuple(sizes[m] for m in in_bucket), tuple(sums[m] for m in in_bucket),
            BinnedValues(counts[:k_n].copy(), self._gather),
            int(sizes[self.key < 0].sum()))
        return window, sizes, slo_sums

    def _itl_pass(
        self, sums_too: bool, slo: bool, counts: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One pass over the ITL columns: per request its tokens, with ``sums_too`` the
        ``numpy.add.reduceat`` sum of its values (else 0) and with ``slo`` their sum in Python's
        order (else 0); the tokens per group and bin (:meth:`_groups`) unless ``counts`` has them."""
        c, starts, k_n = self.c, self.itl_start, len(self.labels)
        n = c.requests
        tok_all, sums, slo_sums = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
        groups = self._groups()
        count = counts is None
        if counts is None:
            counts = np.zeros((k_n + 2, NBINS), dtype=np.int64)
        with itl_files(c) as (value_file, bin_file, weight_file):
            for r0, r1, lo, hi in itl_spans(starts, BLOCK):
                lengths = np.diff(starts[r0:r1 + 1])
                w = weight_file.read(lo, hi).astype(np.int64) if weight_file is not None else None
                if w is not None:  # a value standing for several tokens counts that often
                    cw = np.concatenate(([0], np.cumsum(w)))
                    local = starts[r0:r1 + 1] - lo
                    tok, tok_start = cw[local[1:]] - cw[local[:-1]], cw[local[:-1]]
                else:
                    tok, tok_start = lengths, starts[r0:r1] - lo
                tok_all[r0:r1] = tok
                if sums_too or slo:
                    vals = value_file.view(lo, hi)  # mapped: no copy
                    expanded = np.repeat(vals, w) if w is not None else vals
                    some = tok > 0
                    if sums_too and some.any():
                        sums[r0:r1][some] = np.add.reduceat(expanded, tok_start[some])  # its own values
                    if slo:
                        use = self.ok[r0:r1]
                        slo_sums[r0:r1] = _sequential_sums(expanded, tok_start, np.where(use, tok, 0))
                    del vals, expanded  # unmaps the block
                if count:
                    bins = bin_file.view(lo, hi)
                    add_block_counts(counts, lengths, groups[r0:r1], bins, w)
                    del bins
        return tok_all, sums, slo_sums, counts

    def _gather(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every ITL value (repeated by its weight) of a successful request whose (bucket, bin) is
        wanted (``(buckets, NBINS)`` bool), with its bucket: one pass over the bins, values read
        only where they are kept (:data:`~servelens.core.binned_quantiles.Gather`)."""
        c, starts, k_n = self.c, self.itl_start, len(self.labels)
        full = np.zeros((k_n + 2, NBINS), dtype=bool)
        full[:k_n] = want
        any_bin = np.asarray(full.any(axis=0))
        groups = self._groups()
        got_v, got_g = [np.zeros(0)], [np.zeros(0, dtype=np.int64)]
        with itl_files(c) as (value_file, bin_file, weight_file):
            for r0, r1, lo, hi in itl_spans(starts, BLOCK):
                pos, g = hits(any_bin, full, np.diff(starts[r0:r1 + 1]), groups[r0:r1], bin_file.view(lo, hi))
                v = value_file.at(lo, hi, pos)
                if weight_file is not None:
                    w = weight_file.at(lo, hi, pos).astype(np.int64)
                    v, g = np.repeat(v, w), np.repeat(g, w)
                got_v.append(v)
                got_g.append(g)
        return np.concatenate(got_v), np.concatenate(got_g)

    def slo_requests(self, sizes: np.ndarray, sums: np.ndarray) -> tuple[SloRequest, ...]:
        """What the SLOs judge of each request (:func:`~servelens.formats.results.to_slo_request`);
        ``sizes``, ``sums`` from :meth:`itl_window` (``slo``) or :meth:`itl` (``with_sums``)."""
        server, target = self.c.column("isl_server"), self.c.column("isl_target")
        isl = np.where(server != NULL, server, target).tolist()
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(sizes > 0, sums / np.maximum(sizes, 1), np.nan).tolist()
        return tuple(
            SloRequest(None if i == NULL else i, o, None if math.isnan(t) else t, None if math.isnan(m) else m)
            for i, o, t, m in zip(isl, self.ok.tolist(), self.ttft.tolist(), mean, strict=True)
        )


def _sequential_sums(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per segment ``values[starts[i]:starts[i] + lengths[i]]`` its sum added left to right (Python's
    ``sum``, not numpy's pairwise one: the record path's float), vectorised across segments: step ``j``
    adds every segment's ``j``-th value. Shape ``(segments,)``."""
    order = np.argsort(-lengths, kind="stable")
    ln, st = lengths[order], starts[order]
    acc = np.zeros(order.size)
    if order.size == 0 or ln[0] <= 0:
        return acc
    active = np.searchsorted(-ln, -np.arange(int(ln[0])), side="left")  # segments longer than j
    for j, c in enumerate(active.tolist()):
        acc[:c] += values[st[:c] + j]
    out = np.zeros(order.size)
    out[order] = acc
    return out
