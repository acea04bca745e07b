"""The bench results file: one JSON object per line (JSONL), one line per request.

Fields of every line (:class:`BenchRecord`; times are int ns from ``time.perf_counter_ns()`` of the
bench process unless the name says ``wall``):

=====================  =================================================================================
``index``              request number in the workload (0-based, workload order)
``request_id``         the response's ``x-request-id`` header (None when absent); joins with server logs
``scheduled_ns``       when the request was due, as an offset from the run start (ns)
``send_ns``            monotonic time just before the request was written (ns, perf_counter_ns)
``wall_send_ns``       wall-clock send time (ns since the Unix epoch; for "TTFT over time" plots)
``first_output_ns``    monotonic time the first output-bearing chunk's bytes arrived (None: no output)
``end_ns``             monotonic time the stream ended or the request failed
``chunk_offsets_ns``   every output-bearing chunk's arrival time minus ``send_ns`` (ns), in order
``chunk_tokens``       tokens in each of those chunks (from cumulative usage, else 1 each)
``tokens_from_usage``  True when ``chunk_tokens`` came from continuous usage (else 1 per chunk)
``isl_target``         the prompt length the bench built (tokens)
``isl_server``         the server's ``usage.prompt_tokens`` (None when not reported)
``osl_target``         the requested output length (``max_tokens``)
``osl``                ``usage.completion_tokens``, else the counted chunk tokens (None on no output)
``cached_tokens``      ``usage.prompt_tokens_details.cached_tokens`` (None: unknown, not 0)
``status``             ``"success"`` or ``"error"``
``error_type``         Dynamo's vocabulary (:mod:`servelens.core.status`), ``""`` on success
``error``              error text (HTTP body message, in-stream error, exception), ``""`` on success
``http_status``        HTTP status code (None when no response arrived)
=====================  =================================================================================

Derived (not stored): TTFT = ``first_output_ns - send_ns``; ITL by :class:`servelens.core.timing.RequestTimer`
over the chunk times and tokens (gap / tokens of the later chunk, once per token); the ISL used for the
bucket is ``isl_server`` when known, else ``isl_target``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from servelens.core.edges import ITL_EDGES_S
from servelens.core.slo import SloRequest
from servelens.core.summary import RequestSample
from servelens.core.timing import NS_PER_S, RequestTimer

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"

_ITL_EDGES = tuple(float(e) for e in ITL_EDGES_S)


@dataclass(frozen=True)
class BenchRecord:
    """One request as the bench measured it (one line of ``results.jsonl``; see the module table)."""

    index: int
    request_id: str | None
    scheduled_ns: int
    send_ns: int
    wall_send_ns: int
    first_output_ns: int | None
    end_ns: int
    chunk_offsets_ns: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    tokens_from_usage: bool
    isl_target: int
    isl_server: int | None
    osl_target: int
    osl: int | None
    cached_tokens: int | None
    status: str
    error_type: str = ""
    error: str = ""
    http_status: int | None = None

    @property
    def ok(self) -> bool:
        """True for a successful request."""
        return self.status == "success"

    @property
    def isl(self) -> int:
        """The ISL that decides the bucket: the server's ``prompt_tokens`` when known, else the target."""
        return self.isl_server if self.isl_server is not None else self.isl_target

    @property
    def ttft_s(self) -> float | None:
        """TTFT in seconds (first output chunk minus send), None without output."""
        if self.first_output_ns is None:
            return None
        return max(0, self.first_output_ns - self.send_ns) / NS_PER_S

    @property
    def duration_s(self) -> float:
        """Send to end of stream (s)."""
        return max(0, self.end_ns - self.send_ns) / NS_PER_S

    def itl_values_s(self) -> tuple[float, ...]:
        """Per-token ITL values (s) by the core definition (:class:`RequestTimer`)."""
        if len(self.chunk_offsets_ns) < 2:
            return ()
        timer = RequestTimer(self.send_ns, _ITL_EDGES, keep_values=True)
        base = self.send_ns
        for off, tok in zip(self.chunk_offsets_ns, self.chunk_tokens, strict=True):
            timer.output(base + off, tok)
        return timer.finish(self.end_ns, self.status).itl_values_s


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(BenchRecord)


def encode_record(record: BenchRecord) -> bytes:
    """One JSONL line (with the trailing newline)."""
    return _encoder.encode(record) + b"\n"


def write_results(path: str | Path, records: Iterable[BenchRecord]) -> Path:
    """Write records as JSONL to ``path`` (parent folders created). Returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "wb") as f:
        for r in records:
            f.write(encode_record(r))
    return p


def load_results(path: str | Path) -> list[BenchRecord]:
    """Read a results file into records: a ``results.jsonl``, a folder holding one, or a
    ``results.cols`` folder (:mod:`servelens.formats.columnar`).

    Raises ValueError naming the line for a line that is not a bench record; OSError when unreadable.
    """
    from servelens.formats.columnar import columns_for, iter_columns  # it builds on this module

    cols = columns_for(path)
    if cols is not None:
        return list(iter_columns(cols))
    return list(iter_results(path))


def results_file_in(folder: str | Path) -> Path:
    """The ``results.jsonl`` of a bench output folder. Raises ValueError (one line) when the folder
    holds neither it nor a ``results.cols`` folder (an empty folder read as "No such file" before)."""
    p = Path(folder) / RESULTS_FILE
    if not p.exists() and not (Path(folder) / "results.cols").exists():
        raise ValueError(f"{folder}: the folder holds no {RESULTS_FILE} or results.cols (give a bench --output-dir "
                         "or a results file)")
    return p


def iter_results(path: str | Path) -> Iterator[BenchRecord]:
    """The records of a results JSONL file (or its folder) one at a time (blank lines skipped).

    Raises ValueError naming the line for a line that is not a bench record; OSError when unreadable.
    """
    p = Path(path)
    if p.is_dir():
        p = results_file_in(p)
    elif p.name == SUMMARY_FILE:
        raise ValueError(f"{p} is the bench's summary; give its {RESULTS_FILE} (or the folder)")
    with open(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield _decoder.decode(line)
            except msgspec.ValidationError as exc:
                hint = " (a gateway --request-log? it is not a bench results file)" if b'"isl_source"' in line else ""
                raise ValueError(f"{p}:{lineno}: not a bench result line: {exc}{hint}") from None
            except msgspec.DecodeError as exc:
                hint = " (Prometheus text? use --metrics)" if line.lstrip().startswith(b"#") else ""
                raise ValueError(f"{p}:{lineno}: not JSON: {exc}{hint}") from None


def summary_isl_buckets(path: str | Path) -> tuple[int, ...] | None:
    """The ISL bucket boundaries a bench run used, from the ``summary.json`` beside a results file
    (``path``: the file or its folder); None when there is no readable summary that says."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if (folder / "meta.json").is_file() and not (folder / SUMMARY_FILE).is_file():
        folder = folder.parent  # a results.cols folder: the run's summary is beside it
    summary = folder / SUMMARY_FILE
    try:
        cfg = msgspec.json.decode(summary.read_bytes()).get("config") or {}
        bounds = tuple(int(b) for b in cfg["isl_buckets"])
    except (OSError, msgspec.DecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return bounds or None


def to_sample(record: BenchRecord) -> RequestSample:
    """The table's view of one record (ISL for the bucket, ok, TTFT, ITL values, cached tokens)."""
    return RequestSample(
        isl=record.isl,
        ok=record.ok,
        ttft_s=record.ttft_s,
        itl_s=record.itl_values_s() if record.ok else (),
        cached_tokens=record.cached_tokens,
    )


def to_samples(records: Sequence[BenchRecord]) -> list[RequestSample]:
    """:func:`to_sample` for every record, in order."""
    return [to_sample(r) for r in records]


def to_slo_request(record: BenchRecord) -> SloRequest:
    """What the SLOs judge of one record (:mod:`servelens.core.slo`): its ISL, success, TTFT, and its
    mean ITL over its tokens after the first (its TPOT; None with one output token)."""
    itl = record.itl_values_s() if record.ok else ()
    return SloRequest(record.isl, record.ok, record.ttft_s, sum(itl) / len(itl) if itl else None)
