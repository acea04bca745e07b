"""The bench results as columns: a folder ``results.cols/`` of plain numpy ``.npy`` files.

The same requests as ``results.jsonl`` (:mod:`servelens.formats.results`), one array per field, so that
``servelens report`` reads a million requests in seconds with memory bounded by a few per-request
columns: it loads the per-request arrays whole (8 bytes a request each) and streams the per-chunk
ones in blocks. Every file is an ordinary ``.npy`` (``np.load(path, mmap_mode="r")`` opens one
without reading it) with a fixed 128-byte header, so a block is ``np.fromfile(path, offset=...)``.

Layout (``n`` requests, ``m`` output chunks, ``k`` ITL values; ints are int64 unless said):

==========================  ======  ==============================================================
``meta.json``                       format ``servelens-bench-columns/1``, ``requests``, ``chunks``,
                                    ``itl_values``, ``itl_weights`` (false: every weight is 1, no
                                    ``itl_weight.npy``), ``source`` (the JSONL it was made from:
                                    size and mtime, for the report's automatic use; else null)
per request (``n``)                 ``index``, ``scheduled_ns``, ``send_ns``, ``wall_send_ns``,
                                    ``first_output_ns``, ``end_ns``, ``isl_target``, ``isl_server``,
                                    ``osl_target``, ``osl``, ``cached_tokens``, ``http_status``:
                                    as in the JSONL, :data:`NULL` for None; ``ok``, ``tokens_from_usage``
                                    (bool); ``ttft_s``, ``wall_send_s`` (float64, NaN for None:
                                    the JSONL's derived values, computed once when written)
``chunk_start``, ``itl_start``  n+1     request ``i``'s chunks are ``[chunk_start[i], chunk_start[i+1])``,
                                    its ITL values ``[itl_start[i], itl_start[i+1])``
``chunk_offsets_ns``         m      every output chunk's arrival minus ``send_ns`` (ns)
``chunk_tokens``             m      int32, tokens of each chunk
``itl_s``                    k      float64, per-token ITL (s) of every chunk after a request's first
                                    (:func:`servelens.core.timing.itl_per_chunk`), failed requests too
``itl_bin``                  k      uint16, the value's bin (:func:`servelens.core.selection.value_bins`:
                                    the top 16 bits of its float32), what the percentiles' first
                                    pass reads (2 bytes a value)
``itl_weight``               k      int32, tokens of that chunk (only when ``itl_weights``)
``text.jsonl``               n      ``[request_id, status, error_type, error]`` per line
==========================  ======  ==============================================================

Why this and not Parquet: numpy is already a dependency, the report's exact percentiles need the raw
float64 ITL values in a form numpy streams without copies, and ``.npy`` opens anywhere numpy does
(pandas, Polars and DuckDB read numpy arrays too). The JSONL stays the export (``--export-jsonl``).
"""

from __future__ import annotations

import itertools
import math
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from servelens.core.selection import value_bins
from servelens.core.timing import NS_PER_S, itl_per_chunk
from servelens.formats.results import RESULTS_FILE, BenchRecord, iter_results

COLUMNS_DIR = "results.cols"
FORMAT = "servelens-bench-columns/1"
NULL = np.iinfo(np.int64).min
"""An int column's None."""
HEADER = 128
"""Bytes of every ``.npy`` header here (data starts there)."""

INT_FIELDS = ("index", "scheduled_ns", "send_ns", "wall_send_ns", "first_output_ns", "end_ns", "isl_target",
              "isl_server", "osl_target", "osl", "cached_tokens", "http_status")
BOOL_FIELDS = ("ok", "tokens_from_usage")
FLOAT_FIELDS = ("ttft_s", "wall_send_s")
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

    ``source``: the JSONL file the records come from (its size and mtime go to ``meta.json``).
    Use as a context manager; the folder is complete when it closes.
    """

    def __init__(self, path: str | Path, source: str | Path | None = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "meta.json").unlink(missing_ok=True)  # incomplete until closed
        self.source = Path(source) if source is not None else None
        self.rows: dict[str, list[Any]] = {f: [] for f in INT_FIELDS + BOOL_FIELDS + FLOAT_FIELDS}
        self.cols: dict[str, _Column] = {}
        for name, dtype in ((*((f, np.int64) for f in INT_FIELDS), *((f, np.bool_) for f in BOOL_FIELDS),
                             *((f, np.float64) for f in FLOAT_FIELDS), ("chunk_start", np.int64),
                             ("itl_start", np.int64), ("chunk_offsets_ns", np.int64), ("chunk_tokens", np.int32),
                             ("itl_s", np.float64), ("itl_bin", np.uint16), ("itl_weight", np.int32))):
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
        ok = fields["ok"]
        self.text.write(b"".join(text) if text is not None else b"".join(
            b'[null,"success","",""]\n' if k else b'[null,"error","",""]\n' for k in ok.tolist()))
        assert b == len(ok)

    def _flush(self) -> None:
        for f, values in self.rows.items():
            self.cols[f].append(values)
            values.clear()
        self.cols["chunk_start"].append(self.chunk_ends)
        self.cols["itl_start"].append(self.itl_ends)
        self.cols["chunk_offsets_ns"].append(self.offsets)
        self.cols["chunk_tokens"].append(self.tokens)
        itl = np.concatenate(self.itl) if self.itl else np.zeros(0)
        self.cols["itl_s"].append(itl)
        self.cols["itl_bin"].append(value_bins(itl))
        self.cols["itl_weight"].append(np.concatenate(self.weights) if self.weights else np.zeros(0))
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
        write_meta(self.path, self.cols["ok"].n, self.cols["chunk_offsets_ns"].n, self.cols["itl_s"].n,
                   self.weighted, self.source)
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


def _source_stamp(source: Path | None) -> dict[str, int] | None:
    if source is None:
        return None
    st = source.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_meta(path: Path, requests: int, chunks: int, itl_values: int, weighted: bool,
               source: Path | None = None) -> None:
    """Write ``meta.json`` (the last file written: a folder without it is incomplete)."""
    meta = {"format": FORMAT, "requests": requests, "chunks": chunks, "itl_values": itl_values,
            "itl_weights": weighted, "source": _source_stamp(source)}
    (path / "meta.json").write_bytes(msgspec.json.encode(meta))


def write_columnar(path: str | Path, records: Iterable[BenchRecord], source: str | Path | None = None) -> Path:
    """Write ``records`` as a ``results.cols`` folder at ``path``. Returns the folder."""
    with ColumnarWriter(path, source) as w:
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
    with ColumnarWriter(out, p) as w:
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


@dataclass(frozen=True)
class Columns:
    """An opened ``results.cols`` folder: its meta data; columns are read on demand."""

    path: Path
    requests: int
    chunks: int
    itl_values: int
    weighted: bool
    source: dict[str, int] | None

    def column(self, name: str) -> np.ndarray:
        """A whole column in memory (per-request ones: 8 bytes a request). Raises ValueError when its
        length is not the meta data's."""
        p = self.path / f"{name}.npy"
        try:
            a = np.load(p)
        except OSError as exc:
            raise ValueError(f"cannot read {p}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"{p}: not a whole .npy file ({exc}; a truncated folder?)") from None
        want = self.requests + 1 if name in ("chunk_start", "itl_start") else {
            "chunk_offsets_ns": self.chunks, "chunk_tokens": self.chunks, "itl_s": self.itl_values,
            "itl_weight": self.itl_values, "itl_bin": self.itl_values}.get(name, self.requests)
        if a.ndim != 1 or a.size != want:
            raise ValueError(f"{p} holds {a.size} values, meta.json says {want} (a truncated folder?)")
        return a

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Values ``[start, stop)`` of a column, read from the file (no mapping: memory is the slice).
        Raises ValueError for a file shorter than that."""
        p = self.path / f"{name}.npy"
        try:
            with open(p, "rb") as f:
                np.lib.format.read_magic(f)
                _, _, dtype = np.lib.format.read_array_header_1_0(f)
                f.seek(f.tell() + start * dtype.itemsize)
                out = np.fromfile(f, dtype=dtype, count=stop - start)
        except OSError as exc:
            raise ValueError(f"cannot read {p}: {exc.strerror or exc}") from None
        if out.size != stop - start:
            raise ValueError(f"{p} ends early (a truncated folder?)")
        return out


def is_columnar(path: str | Path) -> bool:
    """True when ``path`` is a ``results.cols`` folder (it has a ``meta.json``)."""
    return (Path(path) / "meta.json").is_file() and (Path(path) / "itl_s.npy").exists()


def open_columns(path: str | Path) -> Columns:
    """Open a ``results.cols`` folder. Raises ValueError (one line) for a missing, foreign or
    incomplete one."""
    p = Path(path)
    try:
        meta = msgspec.json.decode((p / "meta.json").read_bytes())
    except OSError as exc:
        raise ValueError(f"{p}: not a results.cols folder (no readable meta.json: {exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"{p}/meta.json: not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ValueError(f"{p}/meta.json: not a {FORMAT} folder (format {got!r})")
    try:
        return Columns(p, int(meta["requests"]), int(meta["chunks"]), int(meta["itl_values"]),
                       bool(meta["itl_weights"]), meta.get("source"))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{p}/meta.json: missing or bad field {exc}") from None


def columns_for(path: str | Path) -> Path | None:
    """The columns to read for a results path: the folder itself, a folder's ``results.cols``, or the
    ``results.cols`` beside a JSONL file when it was made from that very file (same size and mtime);
    else None (read the JSONL)."""
    p = Path(path)
    if is_columnar(p):
        return p
    if p.is_dir():
        cand, jsonl = p / COLUMNS_DIR, p / RESULTS_FILE
    else:
        cand, jsonl = p.parent / COLUMNS_DIR, p
    if not is_columnar(cand):
        return None
    if not jsonl.exists():
        return cand
    try:
        stamp = open_columns(cand).source
    except ValueError:
        return None
    return cand if stamp == _source_stamp(jsonl) else None


def export_jsonl(columns: str | Path, dst: str | Path) -> Path:
    """Write a columns folder back as ``results.jsonl`` (the same lines the bench writes)."""
    from servelens.formats.results import write_results

    return write_results(dst, iter_columns(columns))


def iter_columns(path: str | Path) -> Iterator[BenchRecord]:
    """The records of a columns folder, in order (for consumers that need whole records)."""
    c = open_columns(path)
    cols = {f: c.column(f) for f in INT_FIELDS + BOOL_FIELDS}
    starts = c.column("chunk_start")
    offsets = np.load(c.path / "chunk_offsets_ns.npy", mmap_mode="r")
    tokens = np.load(c.path / "chunk_tokens.npy", mmap_mode="r")
    ints = {f: cols[f].tolist() for f in INT_FIELDS}
    dec = msgspec.json.Decoder(tuple[str | None, str, str, str])
    with open(c.path / "text.jsonl", "rb") as text:
        for i, line in enumerate(text):
            if i >= c.requests:
                break
            rid, status, etype, err = dec.decode(line)
            a, b = int(starts[i]), int(starts[i + 1])
            vals: dict[str, Any] = {f: (None if ints[f][i] == NULL else ints[f][i]) for f in INT_FIELDS}
            yield BenchRecord(
                request_id=rid, chunk_offsets_ns=tuple(offsets[a:b].tolist()),
                chunk_tokens=tuple(tokens[a:b].tolist()), tokens_from_usage=bool(cols["tokens_from_usage"][i]),
                status=status, error_type=etype, error=err, **vals,
            )


def size_bytes(path: str | Path) -> int:
    """Bytes of the folder's files."""
    return sum(os.path.getsize(Path(path) / f) for f in os.listdir(path))
