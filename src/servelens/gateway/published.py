"""The metric state of each worker of a gateway in a file of its own, and the ``/metrics`` that any
worker serves: the sum over all of them (:mod:`.workers` says why this design).

Files, in the directory the supervisor made for this gateway (``/dev/shm`` when there is one: memory,
no disk):

* ``worker-<key>.pkl``: one worker's :class:`Published` state, rewritten whole (a temporary file
  renamed over it: a reader sees the old or the new file, never part of one) each time the worker
  counts a request, before the request's connection goes on to anything else; at the end of the loop's
  turn when a request is begun (its ``inflight``); when it serves a scrape; once at start (its models at
  zero). ``key`` is ``<pid>-<n>``, ``n`` the supervisor's count of the workers it started: unique for
  the gateway's life even when the system gives a replacement the pid of a worker that ended.
* ``retired.pkl``: a :class:`Retired`: the sum of the workers that ended (written by the supervisor
  when it reaps one; their ``inflight`` and connection cap at 0) and their keys.

A scrape on a worker writes the worker's state and serves exactly what it wrote, plus every other
``worker-<key>.pkl`` whose key is not in ``retired.pkl``, and ``retired.pkl``'s sum. The supervisor
writes ``retired.pkl`` (naming the key) before it removes that worker's file, and a reader lists the
worker files before it reads ``retired.pkl``: so a worker's counts are added exactly once whatever the
interleaving. Every figure a scrape serves is a file version already written, and each worker's versions
only grow, so a later scrape on any worker never shows less than an earlier one on another (a worker's
live state, a TTFT observed at a first token say, reaches the others with its next write: a request
begun or counted, or a scrape on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import marshal
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from servelens.core.merge import merge_snapshots, without_inflight
from servelens.core.snapshot import HistogramCopy, ModelSnapshot, StateSnapshot, take_snapshot
from servelens.gateway.scrape import MetricsScrape
from servelens.prometheus import FrontendMetrics
from servelens.prometheus.connections import connections_exposition

log = logging.getLogger("servelens.gateway")

RETIRED_FILE = "retired.pkl"
WORKER_PREFIX = "worker-"
SUFFIX = ".pkl"


@dataclass(frozen=True)
class WorkerContext:
    """What a worker process gets from its supervisor (:mod:`.workers`).

    Attributes:
        directory: the gateway's state directory (mode 0700).
        ready_fd: the pipe on which the worker says ``ready <start-up summary>`` or ``error <reason>``.
        slot: the worker's number, 0 to N - 1 (a restarted worker keeps its slot).
        number: how many workers the supervisor had started before this one (its :func:`worker_key`
            with its pid).
    """

    directory: Path
    ready_fd: int
    slot: int
    number: int = 0

    @property
    def key(self) -> str:
        """This worker's :func:`worker_key` (call it in the worker's own process)."""
        return worker_key(os.getpid(), self.number)


@dataclass(frozen=True)
class Connections:
    """A worker's connection metrics (:mod:`servelens.prometheus.connections`): accept failures per
    reason, the client connections it takes at once, upstream retries."""

    failures: dict[str, int] = field(default_factory=dict)
    max_connections: int = 0
    retries: int = 0

    def __add__(self, other: Connections) -> Connections:
        failures = dict(self.failures)
        for reason, n in other.failures.items():
            failures[reason] = failures.get(reason, 0) + n
        return Connections(failures, self.max_connections + other.max_connections, self.retries + other.retries)


@dataclass(frozen=True)
class Published:
    """What one worker publishes: its metric state and its connection metrics."""

    snapshot: StateSnapshot
    connections: Connections


@dataclass(frozen=True)
class Retired:
    """The sum of the workers that ended (``inflight`` and connection cap at 0), and their keys."""

    keys: frozenset[str]
    published: Published | None


_FORMAT = 2
"""Version of the worker files' layout (:func:`encode`)."""

EncodeCache = dict[tuple[str, int], tuple[HistogramCopy, bytes]]
"""(model, histogram index) -> the copy last encoded there and its bytes."""


def _hists(model: str, hs: tuple[HistogramCopy, ...], cache: EncodeCache | None, base: int) -> tuple[bytes, ...]:
    out: list[bytes] = []
    for i, h in enumerate(hs):
        key = (model, base + i)
        hit = cache.get(key) if cache is not None else None
        if hit is not None and hit[0] is h:  # unchanged since the last write: the same copy, its bytes
            out.append(hit[1])
            continue
        b = marshal.dumps((h.counts, h.sum, h.total))
        if cache is not None:
            cache[key] = (h, b)
        out.append(b)
    return tuple(out)


def encode(pub: Published, cache: EncodeCache | None = None) -> bytes:
    """``pub`` as plain tuples in :mod:`marshal` (what a worker writes per request: ~5x faster than
    pickling the dataclasses; the edges and labels are left out, every worker has the same). Each
    histogram is its own marshal blob; with ``cache`` (one per writer) an unchanged histogram's blob is
    reused, so a request costs the encoding of the ~11 histograms it touched."""
    snap = pub.snapshot
    models = tuple((m.name, _hists(m.name, m.histograms, cache, 0), m.isl_sources, m.requests, m.inflight,
                    m.output_tokens, m.slo_met, m.prompt_tokens_by_isl,
                    _hists(m.name, m.uncached, cache, len(m.histograms)), m.uncached_sources) for m in snap.models)
    unknown = snap.unknown_duration
    c = pub.connections
    return marshal.dumps((_FORMAT, models, snap.unknown_requests,
                          (unknown.counts, unknown.sum, unknown.total) if unknown is not None else None,
                          snap.disconnected_clients, tuple(c.failures.items()), c.max_connections, c.retries))


def decode(data: bytes, like: StateSnapshot) -> Published:
    """What :func:`encode` wrote, with ``like``'s edges, labels and SLO kinds (the reader's own state,
    the same config). Raises ValueError for another layout."""
    got = marshal.loads(data)
    if not isinstance(got, tuple) or not got or got[0] != _FORMAT:
        raise ValueError("not a worker state file of this version")
    _, models, unknown_requests, unknown, disconnected, failures, max_connections, retries = got
    snap = replace(like, models=tuple(ModelSnapshot(
        name=m[0], histograms=tuple(HistogramCopy(*marshal.loads(h)) for h in m[1]), isl_sources=m[2],
        requests=m[3], inflight=m[4], output_tokens=m[5], slo_met=m[6], prompt_tokens_by_isl=m[7],
        uncached=tuple(HistogramCopy(*marshal.loads(h)) for h in m[8]),
        uncached_sources=m[9]) for m in models), unknown_requests=unknown_requests,
        unknown_duration=HistogramCopy(*unknown) if unknown is not None else None, disconnected_clients=disconnected)
    return Published(snap, Connections(dict(failures), max_connections, retries))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it (readers never see a part)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _load(path: Path, like: StateSnapshot | None = None) -> object | None:
    """A worker file (:func:`decode` with ``like``) or, without ``like``, ``retired.pkl``; None when
    gone or unreadable (logged)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        if like is not None:
            return decode(data, like)
        return pickle.loads(data)  # our own files, in a directory only we can write (0700)
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as exc:
        log.warning("unreadable worker state %s: %s", path.name, exc)
        return None


def read_retired(directory: Path) -> Retired:
    """``retired.pkl`` (an empty :class:`Retired` when none was written yet)."""
    got = _load(directory / RETIRED_FILE)
    return got if isinstance(got, Retired) else Retired(frozenset(), None)


def worker_key(pid: int, number: int) -> str:
    """The name of a worker's state file and retirement (``<pid>-<number>``, ``number`` the
    supervisor's count of workers started): a pid can come back, the pair cannot."""
    return f"{pid}-{number}"


def retire(directory: Path, key: str, like: StateSnapshot) -> None:
    """Add worker ``key``'s last published state to ``retired.pkl``, then remove its file (the
    supervisor calls this once the worker is reaped: it writes no more). ``like``: a snapshot of the
    gateway's config (its edges and labels). Never raises OSError."""
    path = directory / f"{WORKER_PREFIX}{key}{SUFFIX}"
    try:
        old = read_retired(directory)
        got = _load(path, like)
        parts = [p for p in (old.published,) if p is not None]
        if isinstance(got, Published):
            parts.append(Published(without_inflight(got.snapshot), replace(got.connections, max_connections=0)))
        total = None
        if parts:
            conns = Connections()
            for p in parts:
                conns = conns + p.connections
            total = Published(merge_snapshots([p.snapshot for p in parts]), conns)
        write_atomic(directory / RETIRED_FILE, pickle.dumps(Retired(old.keys | {key}, total)))
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        for stray in directory.glob(f"{WORKER_PREFIX}{key}{SUFFIX}.*.tmp"):  # killed while writing
            stray.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot keep the counts of worker %s: %s", key, exc)


def abandon(directory: Path, key: str) -> None:
    """What a worker whose supervisor is gone (SIGKILLed: no one will retire it) does as it ends:
    remove its own file, then the whole directory when no other worker's file is left. Each worker
    removes its file before it looks for the others', so the last one to end always finds none and the
    directory does not outlive the gateway. Never raises OSError."""
    try:
        (directory / f"{WORKER_PREFIX}{key}{SUFFIX}").unlink(missing_ok=True)
        for stray in directory.glob(f"{WORKER_PREFIX}{key}{SUFFIX}.*.tmp"):
            stray.unlink(missing_ok=True)
        if not any(directory.glob(f"{WORKER_PREFIX}*{SUFFIX}")):
            shutil.rmtree(directory, ignore_errors=True)
    except OSError as exc:
        log.warning("cannot remove the state of worker %s: %s", key, exc)


def read_others(directory: Path, own_key: str, like: StateSnapshot) -> list[Published]:
    """Every other worker's published state and the retired sum (see the module docstring); ``like``:
    the reader's own snapshot (edges and labels)."""
    found: dict[str, Published] = {}
    for path in directory.glob(f"{WORKER_PREFIX}*{SUFFIX}"):
        key = path.name[len(WORKER_PREFIX):-len(SUFFIX)]
        if key == own_key:
            continue
        got = _load(path, like)
        if isinstance(got, Published):
            found[key] = got
    retired = read_retired(directory)  # after the worker files: see the module docstring
    out = [p for key, p in found.items() if key not in retired.keys]
    if retired.published is not None:
        out.append(retired.published)
    return out


class StatePublisher:
    """Writes one worker's :class:`Published` state to ``worker-<key>.pkl`` in ``directory``.

    Args:
        directory: the gateway's state directory (made by the supervisor).
        key: the worker's :func:`worker_key`.
        metrics: the worker's metrics.
        connections: its connection metrics now.
    """

    def __init__(self, directory: Path, key: str, metrics: FrontendMetrics,
                 connections: Callable[[], Connections]) -> None:
        self.directory = directory
        self.key = key
        self.metrics = metrics
        self.connections = connections
        self.path = directory / f"{WORKER_PREFIX}{key}{SUFFIX}"
        self._last: StateSnapshot | None = None
        self._cache: EncodeCache = {}
        self._soon = False

    def changed(self, counted: bool) -> None:
        """:attr:`Accounting.on_change <servelens.gateway.accounting.Accounting.on_change>`: a count is
        written now (so a worker killed later loses nothing it counted), a begin at the turn's end."""
        if counted:
            self.write()
        elif not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self.write)

    def write(self) -> StateSnapshot:
        """Write the state now (~0.1 ms at 7 ISL buckets and the fine edges) and return the snapshot
        written. A failure is logged."""
        self._soon = False
        snap = take_snapshot(self.metrics.state, self._last)  # unchanged histograms: their copies reused
        self._last = snap
        try:
            write_atomic(self.path, encode(Published(snap, self.connections()), self._cache))
        except OSError as exc:
            log.warning("cannot publish this worker's metrics to %s: %s", self.path, exc)
        return snap


class MergedScrape(MetricsScrape):
    """``GET /metrics`` of a gateway worker: its own state as it writes it now, plus every other
    worker's and the retired sum (:func:`read_others`), one set of families, no series twice, no
    ``worker`` label; never less than an earlier scrape on any worker (module docstring)."""

    def __init__(self, metrics: FrontendMetrics, publisher: StatePublisher) -> None:
        super().__init__(metrics)
        self.publisher = publisher
        self._others: list[Published] = []

    async def snapshot(self) -> StateSnapshot:
        """The sum of this worker's state, written now (what others will read from now on: serving
        its live state unwritten would let a later scrape on another worker show less), and the
        others' (read when the scrape begins)."""
        own = self.publisher.write()
        self._others = read_others(self.publisher.directory, self.publisher.key, own)
        return merge_snapshots([own, *(p.snapshot for p in self._others)])

    def added_exposition(self) -> bytes:
        """The connection metrics summed over the workers (the retired ones' failures and retries too)."""
        total = self.publisher.connections()
        for p in self._others:
            total = total + p.connections
        return connections_exposition(total.failures, total.max_connections, total.retries)
