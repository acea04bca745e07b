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
The writer and the converter: :mod:`servelens.formats.columnar_write`. More: docs/results_columns.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from servelens.core.selection import NBINS
from servelens.formats.results import RESULTS_FILE, BenchRecord

log = logging.getLogger("servelens.results")

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
BIN_COUNTS_FILE = "itl_bin_counts.npy"
"""Tokens of the successful requests per ISL bucket and ITL value bin, shape ``(buckets + 1, NBINS)``
int64 (the last row: no known ISL), for the buckets in ``meta.json``'s ``itl_bin_counts_buckets``."""


def source_stamp(source: Path | None) -> dict[str, int] | None:
    """Size and mtime of the JSONL a folder stands for (None: none)."""
    if source is None:
        return None
    st = source.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass(frozen=True)
class Columns:
    """An opened ``results.cols`` folder: its meta data; columns are read on demand."""

    path: Path
    requests: int
    chunks: int
    itl_values: int
    weighted: bool
    source: dict[str, int] | None
    totals: bool = False
    bin_count_buckets: tuple[int, ...] | None = None

    def bin_counts(self) -> np.ndarray:
        """``itl_bin_counts.npy`` (:data:`BIN_COUNTS_FILE`). Raises ValueError (one line) when the
        folder has none or it does not have the shape its buckets say."""
        p = self.path / BIN_COUNTS_FILE
        if self.bin_count_buckets is None:
            raise ValueError(f"{self.path} has no {BIN_COUNTS_FILE} (written before servelens kept one)")
        try:
            a = np.load(p)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {p}: {exc} (a truncated folder?)") from None
        if a.shape != (len(self.bin_count_buckets) + 2, NBINS) or a.dtype != np.int64:
            raise ValueError(f"{p} has shape {a.shape}, meta.json's buckets say {len(self.bin_count_buckets) + 2} rows")
        return a

    def column(self, name: str) -> np.ndarray:
        """A whole column in memory (per-request ones: 8 bytes a request). Raises ValueError when its
        length is not the meta data's."""
        if name in ("itl_tokens", "itl_sum_s") and not self.totals:
            raise ValueError(f"{self.path} has no {name} (written before servelens kept one)")
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

    def open(self, name: str) -> ColumnFile:
        """A per-chunk or per-value column opened for block reads (:class:`ColumnFile`). Raises
        ValueError (one line) for a missing or short file."""
        length = {"chunk_offsets_ns": self.chunks, "chunk_tokens": self.chunks}.get(name, self.itl_values)
        return ColumnFile(self.path / f"{name}.npy", length)

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


class ColumnFile:
    """One column opened for many block reads: the header is read once, each read is one
    ``np.fromfile`` at an offset, and values at scattered positions come from a mapping of the block
    alone (no copy of the rest; the mapping is dropped right after, so resident memory stays one
    block). Use as a context manager, or :meth:`close`."""

    def __init__(self, path: Path, length: int) -> None:
        """Open ``path`` (an ``.npy`` file of ``length`` values). Raises ValueError (one line) for an
        unreadable or short file."""
        self.path = path
        try:
            self._f = open(path, "rb")  # noqa: SIM115 (closed by close())
            np.lib.format.read_magic(self._f)
            _, _, self.dtype = np.lib.format.read_array_header_1_0(self._f)
            self.offset = self._f.tell()
            size = os.fstat(self._f.fileno()).st_size
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"{path}: not a whole .npy file ({exc}; a truncated folder?)") from None
        if size < self.offset + length * self.dtype.itemsize:
            self._f.close()
            raise ValueError(f"{path} ends early (a truncated folder?)")

    def read(self, start: int, stop: int) -> np.ndarray:
        """Values ``[start, stop)`` (a copy: memory is the slice)."""
        self._f.seek(self.offset + start * self.dtype.itemsize)
        out = np.fromfile(self._f, dtype=self.dtype, count=stop - start)
        if out.size != stop - start:
            raise ValueError(f"{self.path} ends early (a truncated folder?)")
        return out

    def view(self, start: int, stop: int) -> np.ndarray:
        """Values ``[start, stop)`` mapped, not copied: numpy reads the page cache directly (no
        ``read`` copy). The mapping lives as long as the array: drop it before the next block, so
        that resident memory stays one block."""
        if stop <= start:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self._f, dtype=self.dtype, mode="r", offset=self.offset + start * self.dtype.itemsize,
                         shape=(stop - start,))

    def at(self, start: int, stop: int, positions: np.ndarray) -> np.ndarray:
        """Values at ``positions`` (int array, relative to ``start``) of the block ``[start, stop)``:
        only the pages that hold them are read (a mapping of the block, dropped on return)."""
        if positions.size == 0 or stop <= start:
            return np.zeros(0, dtype=self.dtype)
        block = self.view(start, stop)
        out = np.asarray(block[positions])  # a copy; the mapping goes with the last reference, here
        del block
        return out

    def close(self) -> None:
        """Close the file."""
        self._f.close()

    def __enter__(self) -> ColumnFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        bounds = meta.get("itl_bin_counts_buckets")
        return Columns(p, int(meta["requests"]), int(meta["chunks"]), int(meta["itl_values"]),
                       bool(meta["itl_weights"]), meta.get("source"), bool(meta.get("itl_totals", False)),
                       tuple(int(b) for b in bounds) if bounds is not None else None)
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
    if stamp == source_stamp(jsonl):
        return cand
    if cand not in _STALE_NOTED:  # once per folder: several readers ask for the same run
        _STALE_NOTED.add(cand)
        log.warning("note: %s was made from another version of %s (size or mtime differ): reading the JSONL; "
                    "`servelens report --results %s --convert` rebuilds the columns", cand, jsonl, jsonl)
    return None


_STALE_NOTED: set[Path] = set()


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
