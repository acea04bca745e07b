"""Writing a ``results.cols`` folder (the layout: :mod:`servelens.formats.columnar`): record by record
as the bench finishes (:class:`ColumnarWriter`), in numpy batches (:meth:`ColumnarWriter.add_arrays`:
the converter, the benchmark's generator), or converted from a ``results.jsonl`` (:func:`convert_jsonl`).

Besides the columns the writer keeps what the readers would otherwise recompute from every ITL value,
while the values pass through it anyway: per request its ITL token count and sum (``itl_tokens``,
``itl_sum_s``), and the tokens of successful requests per ISL bucket and value bin
(``itl_bin_counts.npy``) for the run's ISL buckets."""

from __future__ import annotations

import itertools
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from servelens.core.buckets import IslBuckets
from servelens.core.selection import NBINS, add_block_counts, value_bins
from servelens.core.timing import NS_PER_S, itl_per_chunk
from servelens.formats.columnar import (
    BIN_COUNTS_FILE,
    BOOL_FIELDS,
    COLUMNS_DIR,
    FLOAT_FIELDS,
    FORMAT,
    HEADER,
    INT_FIELDS,
    NULL,
    iter_columns,
    source_stamp,
)
from servelens.formats.results import RESULTS_FILE, BenchRecord, iter_results, summary_isl_buckets, write_results

_FLUSH = 16384  # requests buffered before the chunk columns go to disk


def _header(dtype: np.dtype[Any], n: int) -> bytes:
    body = f"{{'descr': {dtype.str!r}, 'fortran_order': False, 'shape': ({n},), }}".ljust(HEADER - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


class _Column:
    """One ``.npy`` file written in appends; the header gets its length on close."""

    def __init__(self, path: Path, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.n = 0
        self.f = open(path, "wb")  # noqa: SIM115 (open across appends; closed by close())
        self.f.write(_header(self.dtype, 0))

    def append(self, values: Any) -> None:
        a = np.asarray(values, dtype=self.dtype)
        self.f.write(a.tobytes())
        self.n += a.size

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(_header(self.dtype, self.n))
        self.f.close()


def _int(v: int | None) -> int:
    return NULL if v is None else v


class ColumnarWriter:
    """Writes ``results.cols/`` one record at a time (:meth:`add`), the chunk columns in batches.

    ``source``: the JSONL file the records come from (its size and mtime go to ``meta.json``);
    ``isl_buckets``: the buckets of ``itl_bin_counts.npy`` (default: :meth:`IslBuckets.default`).
    Use as a context manager; the folder is complete when it closes.
    """

    def __init__(self, path: str | Path, source: str | Path | None = None,
                 isl_buckets: IslBuckets | None = None) -> None:
        self.path = Path(path)
        self.buckets = isl_buckets or IslBuckets.default()
        self.edges = np.asarray(self.buckets.boundaries, dtype=np.int64)
        self.bin_counts = np.zeros((len(self.buckets.labels) + 2, NBINS), dtype=np.int64)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "meta.json").unlink(missing_ok=True)  # incomplete until closed
        self.source = Path(source) if source is not None else None
        self.rows: dict[str, list[Any]] = {f: [] for f in INT_FIELDS + BOOL_FIELDS + FLOAT_FIELDS}
        self.cols: dict[str, _Column] = {}
        for name, dtype in ((*((f, np.int64) for f in INT_FIELDS), *((f, np.bool_) for f in BOOL_FIELDS),
                             *((f, np.float64) for f in FLOAT_FIELDS), ("chunk_start", np.int64),
                             ("itl_start", np.int64), ("chunk_offsets_ns", np.int64), ("chunk_tokens", np.int32),
                             ("itl_s", np.float64), ("itl_bin", np.uint16), ("itl_weight", np.int32),
                             ("itl_tokens", np.int64), ("itl_sum_s", np.float64))):
            self.cols[name] = _Column(self.path / f"{name}.npy", dtype)
        self.cols["chunk_start"].append([0])
        self.cols["itl_start"].append([0])
        self.text = open(self.path / "text.jsonl", "wb")  # noqa: SIM115 (closed by close())
        self._enc = msgspec.json.Encoder()
        self.offsets: list[int] = []
        self.tokens: list[int] = []
        self.itl: list[np.ndarray] = []
        self.weights: list[np.ndarray] = []
        self.chunk_end = self.itl_end = 0
        self.chunk_ends: list[int] = []
        self.itl_ends: list[int] = []
        self.weighted = False

    def add(self, r: BenchRecord) -> None:
        """Append one request."""
        rows = self.rows
        for f in INT_FIELDS:
            rows[f].append(_int(getattr(r, f)))
        rows["ok"].append(r.ok)
        rows["tokens_from_usage"].append(r.tokens_from_usage)
        ttft = r.ttft_s
        rows["ttft_s"].append(math.nan if ttft is None else ttft)
        rows["wall_send_s"].append(r.wall_send_ns / NS_PER_S if r.wall_send_ns else math.nan)
        self.offsets.extend(r.chunk_offsets_ns)
        self.tokens.extend(r.chunk_tokens)
        multi = {i: k for i, k in enumerate(r.chunk_tokens) if k > 1}
        per, w = itl_per_chunk(r.chunk_offsets_ns, multi)
        self.itl.append(per)
        self.weights.append(np.ones(per.size, np.int32) if w is None else w.astype(np.int32))
        self.weighted = self.weighted or (w is not None and bool((w != 1).any()))
        self.chunk_end += len(r.chunk_offsets_ns)
        self.itl_end += per.size
        self.chunk_ends.append(self.chunk_end)
        self.itl_ends.append(self.itl_end)
        self.text.write(self._enc.encode([r.request_id, r.status, r.error_type, r.error]) + b"\n")
        if len(self.chunk_ends) >= _FLUSH:
            self._flush()

    def add_arrays(self, fields: Mapping[str, np.ndarray], chunk_counts: np.ndarray, offsets: np.ndarray,
                   tokens: np.ndarray, text: Sequence[bytes] | None = None) -> None:
        """Append a batch of ``b`` requests given as arrays (a generator's or a converter's fast path).

        ``fields``: every name of :data:`INT_FIELDS` and ``ok``, ``tokens_from_usage``, shape ``(b,)``
        (:data:`NULL` for None); ``chunk_counts`` ``(b,)``; ``offsets`` and ``tokens`` the chunks'
        ``chunk_offsets_ns`` and ``chunk_tokens`` one request after another; ``text`` one
        ``text.jsonl`` line per request (default: no request id, ``success`` or ``error``, no error
        text). The derived columns and the ITL values follow the same definitions as :meth:`add`.
        """
        self._flush()
        b = len(chunk_counts)
        for f in INT_FIELDS + BOOL_FIELDS:
            self.cols[f].append(fields[f])
        first, send = fields["first_output_ns"], fields["send_ns"]
        has = first != NULL
        self.cols["ttft_s"].append(np.where(has, np.maximum(np.where(has, first, send) - send, 0) / NS_PER_S,
                                            math.nan))
        # Python's int / int: the same float as the JSONL path for ns past 2**53
        self.cols["wall_send_s"].append([w / NS_PER_S if w else math.nan for w in fields["wall_send_ns"].tolist()])
        counts = np.asarray(chunk_counts, dtype=np.int64)
        self.cols["chunk_start"].append(self.chunk_end + np.cumsum(counts))
        self.chunk_end += int(counts.sum())
        itl_counts = np.maximum(counts - 1, 0)
        self.cols["itl_start"].append(self.itl_end + np.cumsum(itl_counts))
        self.itl_end += int(itl_counts.sum())
        self.cols["chunk_offsets_ns"].append(offsets)
        self.cols["chunk_tokens"].append(tokens)
        per, w = _itl_arrays(counts, np.asarray(offsets, dtype=np.int64), np.asarray(tokens, dtype=np.int64))
        self.cols["itl_s"].append(per)
        self.cols["itl_bin"].append(value_bins(per))
        self.cols["itl_weight"].append(w)
        self.weighted = self.weighted or bool((w != 1).any())
        self._totals(fields["ok"], fields["isl_server"], fields["isl_target"], itl_counts, per, w)
        ok = fields["ok"]
        self.text.write(b"".join(text) if text is not None else b"".join(
            b'[null,"success","",""]\n' if k else b'[null,"error","",""]\n' for k in ok.tolist()))
        assert b == len(ok)

    def _totals(self, ok: Any, server: Any, target: Any, lengths: Any, values: np.ndarray, weights: np.ndarray) -> None:
        """Per request of a batch its ITL tokens and sum (``numpy.add.reduceat`` of its values, each
        repeated by its weight: the per-request sums the readers use), and the bin counts."""
        ok = np.asarray(ok, dtype=bool)
        server, target = np.asarray(server, dtype=np.int64), np.asarray(target, dtype=np.int64)
        isl = np.where(server != NULL, server, target)
        nb = len(self.buckets.labels)
        groups = np.where(ok, np.where(isl != NULL, np.searchsorted(self.edges, isl, side="left"), nb), nb + 1)
        lengths = np.asarray(lengths, dtype=np.int64)
        w = np.asarray(weights, dtype=np.int64)
        cw = np.concatenate(([0], np.cumsum(w)))
        ends = np.cumsum(lengths)
        tok = cw[ends] - cw[ends - lengths]
        expanded = np.repeat(values, w) if bool((w != 1).any()) else values
        sums = np.zeros(lengths.size)
        some = tok > 0
        if some.any():
            sums[some] = np.add.reduceat(expanded, (cw[ends - lengths])[some])
        self.cols["itl_tokens"].append(tok)
        self.cols["itl_sum_s"].append(sums)
        add_block_counts(self.bin_counts, lengths, groups, value_bins(values), w)

    def _flush(self) -> None:
        rows = self.rows
        itl = np.concatenate(self.itl) if self.itl else np.zeros(0)
        weights = np.concatenate(self.weights) if self.weights else np.zeros(0, np.int32)
        self._totals(rows["ok"], rows["isl_server"], rows["isl_target"], [a.size for a in self.itl], itl, weights)
        for f, values in self.rows.items():
            self.cols[f].append(values)
            values.clear()
        self.cols["chunk_start"].append(self.chunk_ends)
        self.cols["itl_start"].append(self.itl_ends)
        self.cols["chunk_offsets_ns"].append(self.offsets)
        self.cols["chunk_tokens"].append(self.tokens)
        self.cols["itl_s"].append(itl)
        self.cols["itl_bin"].append(value_bins(itl))
        self.cols["itl_weight"].append(weights)
        for buf in (self.chunk_ends, self.itl_ends, self.offsets, self.tokens, self.itl, self.weights):
            buf.clear()

    def close(self) -> Path:
        """Flush, write the headers and ``meta.json``; returns the folder."""
        self._flush()
        for c in self.cols.values():
            c.close()
        self.text.close()
        if not self.weighted:
            (self.path / "itl_weight.npy").unlink()
        np.save(self.path / BIN_COUNTS_FILE, self.bin_counts[:-1])  # the failed requests' row is not kept
        write_meta(self.path, self.cols["ok"].n, self.cols["chunk_offsets_ns"].n, self.cols["itl_s"].n,
                   self.weighted, self.source, self.buckets.boundaries)
        return self.path

    def __enter__(self) -> ColumnarWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:  # leave no folder that looks complete
            for c in self.cols.values():
                c.f.close()
            self.text.close()


def _itl_arrays(counts: np.ndarray, offsets: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`itl_per_chunk` of every request of a batch, one after another, with int weights."""
    ends = np.cumsum(counts)
    starts = ends - counts
    steps = np.diff(offsets)
    inside = np.ones(steps.size, dtype=bool)  # a step between two chunks of one request
    inside[(starts[(counts > 0) & (starts > 0)] - 1)] = False
    steps = steps[inside]
    firsts = np.zeros(offsets.size, dtype=bool)
    firsts[starts[counts > 0]] = True
    later_tokens = tokens[~firsts]
    if (later_tokens == 1).all() and (steps != 0).all():
        return np.maximum(steps, 0).astype(np.float64) / NS_PER_S, np.ones(steps.size, np.int32)
    vals, weights = [], []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        multi = {i: k for i, k in enumerate(tokens[a:b].tolist()) if k > 1}
        per, w = itl_per_chunk(offsets[a:b].tolist(), multi)
        vals.append(per)
        weights.append(np.ones(per.size, np.int32) if w is None else w.astype(np.int32))
    return (np.concatenate(vals) if vals else np.zeros(0)), (np.concatenate(weights) if weights else
                                                               np.zeros(0, np.int32))


def write_meta(path: Path, requests: int, chunks: int, itl_values: int, weighted: bool,
               source: Path | None = None, bin_count_buckets: tuple[int, ...] | None = None) -> None:
    """Write ``meta.json`` (the last file written: a folder without it is incomplete);
    ``bin_count_buckets``: the boundaries of ``itl_bin_counts.npy``, and that ``itl_tokens`` and
    ``itl_sum_s`` are there (None: neither is)."""
    meta: dict[str, Any] = {"format": FORMAT, "requests": requests, "chunks": chunks, "itl_values": itl_values,
                            "itl_weights": weighted, "source": source_stamp(source)}
    if bin_count_buckets is not None:
        meta |= {"itl_totals": True, "itl_bin_counts_buckets": list(bin_count_buckets)}
    (path / "meta.json").write_bytes(msgspec.json.encode(meta))


def write_columnar(path: str | Path, records: Iterable[BenchRecord], source: str | Path | None = None,
                   isl_buckets: IslBuckets | None = None) -> Path:
    """Write ``records`` as a ``results.cols`` folder at ``path`` (``isl_buckets``: those of its bin
    counts, default :meth:`IslBuckets.default`). Returns the folder."""
    with ColumnarWriter(path, source, isl_buckets) as w:
        for r in records:
            w.add(r)
    return w.path


def convert_jsonl(src: str | Path, dst: str | Path | None = None) -> Path:
    """Convert a ``results.jsonl`` (or its folder) to columns, streaming (one record in memory at a
    time); ``dst`` defaults to ``results.cols`` beside it. Raises ValueError for a malformed line."""
    p = Path(src)
    if p.is_dir():
        p = p / RESULTS_FILE
    out = Path(dst) if dst is not None else p.parent / COLUMNS_DIR
    enc = msgspec.json.Encoder()
    bounds = summary_isl_buckets(p)  # the run's own buckets, as the report will use them
    with ColumnarWriter(out, p, IslBuckets(bounds) if bounds else None) as w:
        batch: list[BenchRecord] = []

        def flush() -> None:  # a batch at a time: the ITL values of simple requests in one numpy pass
            fields = {f: np.array([_int(getattr(r, f)) for r in batch], dtype=np.int64) for f in INT_FIELDS}
            fields["ok"] = np.array([r.ok for r in batch], dtype=bool)
            fields["tokens_from_usage"] = np.array([r.tokens_from_usage for r in batch], dtype=bool)
            offsets = np.fromiter(itertools.chain.from_iterable(r.chunk_offsets_ns for r in batch), np.int64)
            tokens = np.fromiter(itertools.chain.from_iterable(r.chunk_tokens for r in batch), np.int64)
            counts = np.array([len(r.chunk_offsets_ns) for r in batch], dtype=np.int64)
            text = [enc.encode([r.request_id, r.status, r.error_type, r.error]) + b"\n" for r in batch]
            w.add_arrays(fields, counts, offsets, tokens, text)
            batch.clear()

        for r in iter_results(p):
            batch.append(r)
            if len(batch) >= _FLUSH:
                flush()
        if batch:
            flush()
    return w.path


def export_jsonl(columns: str | Path, dst: str | Path) -> Path:
    """Write a columns folder back as ``results.jsonl`` (the same lines the bench writes)."""
    return write_results(dst, iter_columns(columns))


