"""Trace readers: Mooncake JSONL and the Azure LLM inference trace CSV, into :class:`TraceRow`.

* Mooncake (kvcache-ai/Mooncake ``FAST25-release/traces``): one JSON object per line with
  ``timestamp`` (ms, relative), ``input_length``, ``output_length`` and ``hash_ids`` (ids of 512-token
  prefix blocks; requests with the same leading ids share that prefix).
* Azure (Azure/AzurePublicDataset ``AzureLLMInferenceTrace_*.csv``): header
  ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is wall-clock
  ``YYYY-MM-DD HH:MM:SS.fffffff`` (7 fractional digits); offsets are taken from the first row.

Cuts of both ship in ``servelens/data/traces`` (see its README for license and attribution).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per Mooncake ``hash_ids`` block."""

TRACE_FORMATS = ("mooncake", "azure")

PACKAGED_TRACES = {
    "mooncake_conversation_400.jsonl": "mooncake",
    "azure_conv_2023_500.csv": "azure",
}
"""Trace cuts shipped in the package (file name -> format)."""


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace.

    Attributes:
        offset_ns: arrival offset from the trace's first request (int ns, before ``--time-scale``).
        isl_tokens: input length in tokens.
        osl_tokens: output length in tokens.
        hash_ids: Mooncake prefix-block ids (empty for Azure).
    """

    offset_ns: int
    isl_tokens: int
    osl_tokens: int
    hash_ids: tuple[int, ...] = ()


def packaged_trace(name: str = "mooncake_conversation_400.jsonl") -> Path:
    """Path of a trace cut shipped inside the package. Raises ValueError for an unknown name."""
    if name not in PACKAGED_TRACES:
        raise ValueError(f"unknown packaged trace {name!r}; available: {', '.join(PACKAGED_TRACES)}")
    return Path(str(resources.files("servelens").joinpath("data", "traces", name)))


def resolve_trace(name_or_path: str) -> Path:
    """The trace file for ``--trace``: a path, or the name of a packaged cut (:data:`PACKAGED_TRACES`)
    when no such path exists. Raises ValueError (one line) for a missing file or a folder."""
    path = Path(name_or_path)
    if not path.exists() and name_or_path in PACKAGED_TRACES:
        path = packaged_trace(name_or_path)
    if not path.exists():
        raise ValueError(f"trace file not found: {name_or_path}")
    if path.is_dir():
        raise ValueError(f"--trace {name_or_path} is a folder; give a trace file in it (Mooncake .jsonl or Azure .csv)")
    return path


def detect_format(path: str | Path) -> str:
    """``"mooncake"`` or ``"azure"`` from the first non-empty line of the file.

    Raises ValueError when the file is empty (or blank) or neither format is recognised; OSError when
    unreadable.
    """
    blank = True
    with open(path, encoding="utf-8-sig") as f:
        for line in f:
            s = line.strip()
            if not s:
                continue
            blank = False
            if s.startswith("{"):
                return "mooncake"
            if "ContextTokens" in s and "GeneratedTokens" in s:
                return "azure"
            break
    if blank:
        raise ValueError(f"trace {path} is empty: no requests in it")
    raise ValueError(
        f"cannot tell the trace format of {path}: expected Mooncake JSONL (timestamp, input_length, "
        "output_length, hash_ids) or an Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens); "
        "use --trace-format"
    )


def _int_field(obj: dict[str, object], key: str, where: str, minimum: int = 0) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or v < minimum:
        raise ValueError(f"{where}: field {key!r} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def read_mooncake(path: str | Path, max_rows: int | None = None) -> list[TraceRow]:
    """Read a Mooncake JSONL trace. Offsets are relative to the first row's timestamp.

    Raises ValueError naming the line for a malformed row.
    """
    rows: list[TraceRow] = []
    t0: float | None = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if max_rows is not None and len(rows) >= max_rows:
                break
            s = line.strip()
            if not s:
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(s)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise ValueError(f"{where}: not JSON (nested too deeply)") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object")
            ts = obj.get("timestamp")
            if isinstance(ts, bool) or not isinstance(ts, int | float):
                raise ValueError(f"{where}: field 'timestamp' must be a number (ms), got {ts!r}")
            hids = obj.get("hash_ids", [])
            if not isinstance(hids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hids):
                raise ValueError(f"{where}: field 'hash_ids' must be a list of integers")
            if t0 is None:
                t0 = float(ts)
            rows.append(
                TraceRow(
                    offset_ns=round((float(ts) - t0) * 1_000_000),
                    isl_tokens=_int_field(obj, "input_length", where, 1),
                    osl_tokens=_int_field(obj, "output_length", where, 1),
                    hash_ids=tuple(hids),
                )
            )
    return rows


def _parse_azure_time(text: str, where: str) -> int:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` -> ns since the epoch (fraction kept to the ns). The traces'
    times are UTC; they are read so whatever the machine's time zone (read as local time, two rows on
    either side of a daylight-saving change were an hour off)."""
    s = text.strip()
    head, _, frac = s.partition(".")
    try:
        base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        frac_ns = int((frac + "000000000")[:9]) if frac else 0
    except ValueError:
        raise ValueError(f"{where}: TIMESTAMP {s!r} is not 'YYYY-MM-DD HH:MM:SS.fffffff'") from None
    return int(base.timestamp()) * 1_000_000_000 + frac_ns


def read_azure(path: str | Path, max_rows: int | None = None) -> list[TraceRow]:
    """Read an Azure LLM inference trace CSV. Offsets are relative to the first row.

    Raises ValueError naming the line for a malformed row or a missing column.
    """
    rows: list[TraceRow] = []
    t0: int | None = None
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not need <= {n.strip() for n in reader.fieldnames}:
            raise ValueError(f"{path}: expected CSV columns TIMESTAMP,ContextTokens,GeneratedTokens")
        for rec in reader:
            if max_rows is not None and len(rows) >= max_rows:
                break
            where = f"{path}:{reader.line_num}"
            rec = {k.strip(): v for k, v in rec.items() if k is not None}
            t = _parse_azure_time(rec.get("TIMESTAMP") or "", where)
            if t0 is None:
                t0 = t
            try:
                isl = int(rec["ContextTokens"])
                osl = int(rec["GeneratedTokens"])
            except (TypeError, ValueError):
                raise ValueError(f"{where}: ContextTokens and GeneratedTokens must be integers") from None
            if isl < 1 or osl < 0:
                raise ValueError(f"{where}: ContextTokens must be >= 1 and GeneratedTokens >= 0")
            rows.append(TraceRow(offset_ns=t - t0, isl_tokens=isl, osl_tokens=max(1, osl)))
    return rows


def _blank(path: str | Path) -> bool:
    """True when the file holds nothing but whitespace (read until the first other byte)."""
    with open(path, "rb") as f:
        return not any(chunk.strip() for chunk in iter(lambda: f.read(1 << 16), b""))


def read_trace(path: str | Path, fmt: str | None = None, max_rows: int | None = None) -> list[TraceRow]:
    """Read a trace file in ``fmt`` (``mooncake``/``azure``) or the detected format.

    Rows come back sorted by offset (stable). Raises ValueError for an unknown format or bad rows,
    OSError when the file cannot be read.
    """
    try:
        fmt = fmt or detect_format(path)
        if fmt == "azure" and _blank(path):  # else "expected CSV columns" of nothing
            raise ValueError(f"trace {path} is empty: no requests in it")
        if fmt == "mooncake":
            rows = read_mooncake(path, max_rows)
        elif fmt == "azure":
            rows = read_azure(path, max_rows)
        else:
            raise ValueError(f"unknown trace format {fmt!r}; expected one of {', '.join(TRACE_FORMATS)}")
    except UnicodeDecodeError as exc:
        raise ValueError(f"trace {path} is not UTF-8 text ({exc.reason})") from None
    if not rows:
        raise ValueError(f"trace {path} has no requests")
    rows.sort(key=lambda r: r.offset_ns)
    return rows


def clip_row(row: TraceRow, max_isl_tokens: int) -> TraceRow:
    """The row with its input clipped to ``max_isl_tokens`` (prefix blocks cut to match)."""
    if row.isl_tokens <= max_isl_tokens:
        return row
    nblocks = -(-max_isl_tokens // MOONCAKE_BLOCK_TOKENS)
    return TraceRow(row.offset_ns, max_isl_tokens, row.osl_tokens, row.hash_ids[:nblocks])

