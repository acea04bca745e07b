"""Aggregated frontend metric state per model and ISL bucket (pure; exported by
:mod:`servelens.prometheus.collector`).

Why one module past 400 lines: the model state and the live request share one lock and one set of
buckets (ISL, uncached, SLO counters), and :meth:`LiveRequest.finish` writes all of them in one
critical section; split apart, each half would reach into the other's private fields.

The life of a request (see :class:`LiveRequest`):

1. :meth:`FrontendState.begin` at arrival: ``inflight`` + 1.
2. :meth:`LiveRequest.output` per output-bearing chunk. The first one observes the stock TTFT
   (and the by-ISL TTFT if the bucket is already known); later ones only touch the
   request-local ITL histogram (no lock, no shared state).
3. :meth:`LiveRequest.set_isl` when the prompt length becomes known (first-chunk usage, final
   usage, or a local tokenizer at arrival). The bucket is fixed then, and the by-ISL TTFT is
   observed as soon as both the bucket and the TTFT are known.
4. :meth:`LiveRequest.finish` once: ITL merged, duration, ISL, OSL and cached tokens observed,
   ``requests_total`` counted, ``inflight`` - 1. Calling it again returns the first record.

A request that fails before its first output token gets no by-ISL observation, but it is
counted in ``requests_total`` and its duration goes to the stock duration histogram.

Uncached-prefill buckets (opt-in, ``uncached_buckets``): the same boundary rules as the ISL
buckets, applied to the uncached prompt tokens ``ISL - cached_tokens`` (the prefill work TTFT pays
for). The uncached bucket is latched when both numbers are known: at the first usage that carries
cached tokens (:meth:`LiveRequest.set_cached`, usually the final usage chunk), else at
:meth:`LiveRequest.finish`. TTFT is measured at the first token as always and observed into the
uncached bucket when the bucket is latched (so, mostly, at the end of the stream). Usage without
``prompt_tokens_details.cached_tokens`` means unknown (not zero): no uncached bucket, counted under
``source="no_cached_tokens"``. A request that fails before its first token gets no uncached bucket.
"""

from __future__ import annotations

import threading

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.histogram import HistogramState
from servelens.core.slo import Slo, SloRequest, meets
from servelens.core.status import ERROR, SUCCESS, UNKNOWN_MODEL, check_error_type, check_request_labels
from servelens.core.timing import RequestRecord, RequestTimer

ISL_SOURCES: tuple[str, ...] = ("first_chunk_usage", "final_usage", "tokenizer", "unknown")
"""How a request's ISL bucket was assigned (label ``source`` of the assignments counter)."""

UNCACHED_SOURCES: tuple[str, ...] = ("first_chunk_usage", "final_usage", "no_cached_tokens", "unknown")
"""How a request's uncached bucket was latched (label ``source`` of the uncached assignments counter):
from usage before the first output token, from usage after it (the final usage chunk, or the
response of a unary request), not at all because usage carried no cached tokens, or not at all
(no prompt length, or no output)."""

DEFAULT_MAX_MODELS = 64

SLO_KINDS: tuple[str, ...] = ("ttft", "itl", "all")
"""Values of the ``slo`` label of the per-bucket SLO counter: met the TTFT SLO, the ITL SLO, all."""


def slo_kind_on(slo: Slo, kind: str) -> bool:
    """Whether the counter of ``kind`` (:data:`SLO_KINDS`) is exported: ``ttft`` and ``itl`` with
    their SLO, ``all`` always."""
    return kind == "all" or (kind == "ttft" and slo.ttft is not None) or (kind == "itl" and slo.itl is not None)


class HistogramSet:
    """The histograms of one series group (one model, or one model x ISL bucket).

    ``prompt_tokens`` (a counter, by-ISL sets only) sums the ISL of the requests observed into
    ``cached``: the denominator of the bucket's prefix-cache hit ratio ``cached.sum / prompt_tokens``.
    """

    __slots__ = ("cached", "duration", "isl", "itl", "osl", "prompt_tokens", "ttft")

    def __init__(self, edges: MetricEdges, with_isl: bool) -> None:
        self.ttft = HistogramState(edges.ttft_s)
        self.itl = HistogramState(edges.itl_s)
        self.duration = HistogramState(edges.duration_s)
        self.isl: HistogramState | None = HistogramState(edges.isl_tokens) if with_isl else None
        self.osl = HistogramState(edges.osl_tokens)
        self.cached = HistogramState(edges.cached_tokens)
        self.prompt_tokens = 0


class LatencySet:
    """The histograms of one model x uncached bucket: TTFT, ITL, request duration."""

    __slots__ = ("duration", "itl", "ttft")

    def __init__(self, edges: MetricEdges) -> None:
        self.ttft = HistogramState(edges.ttft_s)
        self.itl = HistogramState(edges.itl_s)
        self.duration = HistogramState(edges.duration_s)


class ModelState:
    """Everything exported for one model: stock histograms, by-ISL histograms, counters."""

    __slots__ = ("by_isl", "by_uncached", "inflight", "isl_sources", "name", "output_tokens", "requests", "slo_met",
                 "stock", "uncached_sources")

    def __init__(self, name: str, edges: MetricEdges, buckets: IslBuckets | None, slo: Slo | None = None,
                 uncached: IslBuckets | None = None) -> None:
        self.name = name
        self.stock = HistogramSet(edges, with_isl=True)
        self.by_isl: dict[str, HistogramSet] | None = (
            {label: HistogramSet(edges, with_isl=False) for label in buckets.labels} if buckets else None
        )
        self.isl_sources: dict[str, int] | None = dict.fromkeys(ISL_SOURCES, 0) if buckets else None
        # per bucket: requests meeting the TTFT SLO, the ITL SLO, and all of them (None: no SLO)
        self.slo_met: dict[str, list[int]] | None = (
            {label: [0, 0, 0] for label in buckets.labels} if buckets and slo else None)
        self.by_uncached: dict[str, LatencySet] | None = (
            {label: LatencySet(edges) for label in uncached.labels} if uncached else None
        )
        self.uncached_sources: dict[str, int] | None = dict.fromkeys(UNCACHED_SOURCES, 0) if uncached else None
        self.inflight = 0
        self.output_tokens = 0
        # (endpoint, request_type, status, error_type) -> count; series appear on first use
        self.requests: dict[tuple[str, str, str, str], int] = {}


class FrontendState:
    """Metric state of an OpenAI-compatible frontend (thread-safe at request granularity).

    Args:
        isl_buckets: ISL buckets, or None to disable every by-ISL series (nothing registered,
            nothing paid per request).
        edges: histogram ``le`` edges (default :class:`~servelens.core.edges.MetricEdges`: the fine
            TTFT and ITL edges, Dynamo 1.6.1's for the rest).
        max_models: registering more models than this raises ValueError (cardinality guard).
        limit_reason: what ``max_models`` was derived from, named in that error (e.g. a series budget).
        slo: SLOs to count per bucket (:data:`SLO_KINDS`): each finished request with a bucket and a
            first token is judged once, exactly (:func:`servelens.core.slo.meets`: its TTFT, its mean
            ITL). None: nothing counted. Needs ``isl_buckets`` (ValueError otherwise).
        uncached_buckets: buckets of the uncached prompt tokens ``ISL - cached_tokens`` (the same
            boundary rules as ``isl_buckets``), or None (default: nothing registered, nothing paid).
    """

    def __init__(
        self,
        isl_buckets: IslBuckets | None = None,
        edges: MetricEdges | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        limit_reason: str = "",
        slo: Slo | None = None,
        uncached_buckets: IslBuckets | None = None,
    ) -> None:
        if slo is not None and isl_buckets is None:
            raise ValueError("SLO counters are per ISL bucket: they need ISL buckets")
        if slo is not None and slo.ttft is None and slo.itl is None:
            slo = None
        self.slo = slo
        self.isl_buckets = isl_buckets
        self.uncached_buckets = uncached_buckets
        self.edges = edges or MetricEdges()
        self.max_models = max_models
        self.limit_reason = limit_reason
        self.lock = threading.Lock()
        self.models: dict[str, ModelState] = {}
        self.unknown_requests: dict[tuple[str, str, str, str], int] = {}
        self.unknown_duration: HistogramState | None = None
        """Durations of requests counted under ``unknown_model`` (created on the first one)."""
        self.disconnected_clients = 0

    def register_model(self, name: str) -> ModelState:
        """Create every series of ``name`` at zero (idempotent).

        Raises ValueError for an empty name, the reserved ``unknown_model``, or beyond ``max_models``.
        """
        if not name:
            raise ValueError("model name must not be empty")
        if name == UNKNOWN_MODEL:
            raise ValueError(f"{UNKNOWN_MODEL!r} is reserved for requests naming an unknown model")
        with self.lock:
            existing = self.models.get(name)
            if existing is not None:
                return existing
            if len(self.models) >= self.max_models:
                raise ValueError(
                    f"cannot register model {name!r}: at most {self.max_models} models"
                    + (f" ({self.limit_reason})" if self.limit_reason else "")
                    + " (raise max_models if this is intended)"
                )
            state = ModelState(name, self.edges, self.isl_buckets, self.slo, self.uncached_buckets)
            self.models[name] = state
            return state

    def is_registered(self, name: str) -> bool:
        """True when ``name`` was registered."""
        return name in self.models

    def begin(
        self,
        model: str,
        endpoint: str,
        request_type: str,
        arrival_ns: int,
        keep_itl_values: bool = False,
    ) -> LiveRequest:
        """Start tracking a request at ``arrival_ns`` (int ns, monotonic).

        ``model`` must be registered; an unregistered name is tracked as ``unknown_model``
        (only ``requests_total`` is counted for it). ``endpoint`` is ``chat_completions`` or
        ``completions``; ``request_type`` is ``stream`` or ``unary``.

        Raises ValueError for another ``endpoint`` or ``request_type``.
        """
        check_request_labels(endpoint, request_type)
        ms = self.models.get(model)
        if ms is not None:
            with self.lock:
                ms.inflight += 1
        return LiveRequest(self, ms, endpoint, request_type, arrival_ns, keep_itl_values)

    def count_unknown_model(
        self, endpoint: str, request_type: str, error_type: str = "not_found", duration_s: float | None = None
    ) -> None:
        """Count one failed request naming an unknown model under ``model="unknown_model"``; its duration
        (seconds), when given, goes to the stock duration histogram under that label (Dynamo does both).

        Raises ValueError for an unknown ``endpoint``, ``request_type`` or ``error_type``.
        """
        check_request_labels(endpoint, request_type)
        key = (endpoint, request_type, ERROR, check_error_type(error_type))
        with self.lock:
            self.unknown_requests[key] = self.unknown_requests.get(key, 0) + 1
            if duration_s is not None:
                self._observe_unknown_duration(duration_s)

    def _observe_unknown_duration(self, duration_s: float) -> None:
        if self.unknown_duration is None:
            self.unknown_duration = HistogramState(self.edges.duration_s)
        self.unknown_duration.observe(duration_s)

    def client_disconnected(self) -> None:
        """Count a client that went away before its response was complete."""
        with self.lock:
            self.disconnected_clients += 1


class LiveRequest:
    """One request in flight (see the module docstring for the order of calls)."""

    __slots__ = (
        "_bucket",
        "_by_isl_ttft_done",
        "_isl_source",
        "_model",
        "_record",
        "_state",
        "_times_ns",
        "_ubucket",
        "_ubucket_ttft_done",
        "_usource",
        "cached_tokens",
        "endpoint",
        "isl",
        "request_type",
        "timer",
    )

    def __init__(
        self,
        state: FrontendState,
        model: ModelState | None,
        endpoint: str,
        request_type: str,
        arrival_ns: int,
        keep_itl_values: bool,
    ) -> None:
        self._state = state
        self._model = model
        self.endpoint = endpoint
        self.request_type = request_type
        self.timer = RequestTimer(arrival_ns, state.edges.itl_s, keep_itl_values)
        self._times_ns = self.timer.times_ns
        self.isl: int | None = None
        self._bucket: HistogramSet | None = None
        self._isl_source = "unknown"
        self._by_isl_ttft_done = False
        self._record: RequestRecord | None = None
        self.cached_tokens: int | None = None
        self._ubucket: LatencySet | None = None
        self._ubucket_ttft_done = False
        self._usource = "unknown"

    @property
    def model(self) -> str:
        """The model label this request counts under."""
        return self._model.name if self._model is not None else UNKNOWN_MODEL

    @property
    def bucket_label(self) -> str | None:
        """The ISL bucket label once fixed, else None."""
        if self.isl is None or self._state.isl_buckets is None:
            return None
        return self._state.isl_buckets.label(self.isl)

    @property
    def uncached_enabled(self) -> bool:
        """True when this request's model has uncached buckets (callers skip :meth:`set_cached` else)."""
        return self._model is not None and self._model.by_uncached is not None

    @property
    def uncached_bucket_label(self) -> str | None:
        """The uncached bucket label once latched, else None."""
        ub = self._state.uncached_buckets
        if self._ubucket is None or ub is None or self.isl is None or self.cached_tokens is None:
            return None
        return ub.label(max(self.isl - self.cached_tokens, 0))

    @property
    def chunk_times_ns(self) -> list[int]:
        """The request's output-chunk timestamps (int ns). Hot-path callers may bind
        ``chunk_times_ns.append`` once and call it for single-token chunks after the first one
        (the first must go through :meth:`output`, which observes TTFT); multi-token chunks
        go through :meth:`output` with their token count."""
        return self.timer.times_ns

    @property
    def isl_source(self) -> str:
        """How the ISL bucket was assigned (see :data:`ISL_SOURCES`); ``unknown`` until it is."""
        return self._isl_source

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` ran."""
        return self._record is not None

    def output(self, t_ns: int, tokens: int = 1) -> None:
        """An output-bearing chunk arrived at ``t_ns`` (int ns) with ``tokens`` tokens (< 1 counts as 1).

        The per-chunk hot path: after the first chunk this is one append of the timestamp (the
        same work as :meth:`RequestTimer.output`, inlined to save a call); the first chunk also
        observes the stock TTFT, and the by-ISL TTFT when the bucket is already fixed.
        """
        times = self._times_ns
        times.append(t_ns)
        if tokens > 1:
            self.timer.chunk_tokens[len(times) - 1] = tokens
        if len(times) != 1 or self._model is None or self._record is not None:
            return
        ttft = self.timer.ttft_s
        assert ttft is not None
        with self._state.lock:
            self._model.stock.ttft.observe(ttft)
            if self._bucket is not None and not self._by_isl_ttft_done:
                self._bucket.ttft.observe(ttft)
                self._by_isl_ttft_done = True
            if self._ubucket is not None and not self._ubucket_ttft_done:
                self._ubucket.ttft.observe(ttft)
                self._ubucket_ttft_done = True

    def set_isl(self, isl_tokens: int, source: str) -> None:
        """The prompt length is known (``source`` in :data:`ISL_SOURCES`); the first call wins."""
        if self.isl is not None or isl_tokens < 0:
            return
        self.isl = isl_tokens
        if self.cached_tokens is not None:
            self._latch_uncached()
        if self._model is None or self._model.by_isl is None or self._state.isl_buckets is None:
            return
        self._isl_source = source
        self._bucket = self._model.by_isl[self._state.isl_buckets.label(isl_tokens)]
        ttft = self.timer.ttft_s
        if ttft is not None and self._record is None:
            with self._state.lock:
                self._bucket.ttft.observe(ttft)
                self._by_isl_ttft_done = True

    def set_cached(self, cached_tokens: int, source: str) -> None:
        """Usage reported ``cached_tokens`` (``prompt_tokens_details.cached_tokens``; ``source`` in
        :data:`UNCACHED_SOURCES`: ``first_chunk_usage`` before the first output token, else
        ``final_usage``); the first call wins. Latches the uncached bucket once the ISL is known too
        (and observes TTFT into it if it is known). A no-op without uncached buckets or after finish.
        """
        if self.cached_tokens is not None or cached_tokens < 0 or self._record is not None:
            return
        self.cached_tokens = cached_tokens
        self._usource = source
        if self.isl is not None:
            self._latch_uncached()

    def _latch_uncached(self) -> None:
        ms = self._model
        ub = self._state.uncached_buckets
        if ms is None or ms.by_uncached is None or ub is None or self._ubucket is not None:
            return
        assert self.isl is not None and self.cached_tokens is not None
        self._ubucket = ms.by_uncached[ub.label(max(self.isl - self.cached_tokens, 0))]
        ttft = self.timer.ttft_s
        if ttft is not None and self._record is None:
            with self._state.lock:
                self._ubucket.ttft.observe(ttft)
                self._ubucket_ttft_done = True

    def finish(
        self,
        end_ns: int,
        status: str,
        error_type: str = "",
        isl: int | None = None,
        osl: int | None = None,
        cached_tokens: int | None = None,
        isl_source: str = "final_usage",
    ) -> RequestRecord:
        """Close the request once; later calls return the first record unchanged.

        ``status`` is ``success`` or ``error``; ``error_type`` from Dynamo's vocabulary.
        ``osl`` is ``usage.completion_tokens`` when known (else pass the counted output tokens).
        Raises ValueError for an unknown status or error_type.
        """
        if self._record is not None:
            return self._record
        if status not in (SUCCESS, ERROR):
            raise ValueError(f"status must be 'success' or 'error', got {status!r}")
        check_error_type(error_type)
        if isl is not None and self.isl is None:
            self.set_isl(isl, isl_source)
        if cached_tokens is not None and self.cached_tokens is None and self._model is not None \
                and self._model.by_uncached is not None:
            self.set_cached(cached_tokens, "final_usage")
        rec = self.timer.finish(end_ns, status, error_type, self.isl, osl, cached_tokens)
        self._record = rec
        ms = self._model
        state = self._state
        key = (self.endpoint, self.request_type, status, error_type)
        if ms is None:
            with state.lock:
                state.unknown_requests[key] = state.unknown_requests.get(key, 0) + 1
                state._observe_unknown_duration(rec.duration_s)
            return rec
        got_output = rec.first_output_ns is not None or (self.request_type == "unary" and status == SUCCESS)
        with state.lock:
            ms.inflight -= 1
            ms.requests[key] = ms.requests.get(key, 0) + 1
            stock = ms.stock
            stock.duration.observe(rec.duration_s)
            if rec.output_chunks > 1:
                stock.itl.merge(rec.itl)
            if self.isl is not None and stock.isl is not None:
                stock.isl.observe(self.isl)
            if osl is not None:
                stock.osl.observe(osl)
                ms.output_tokens += osl
            elif rec.output_tokens:
                ms.output_tokens += rec.output_tokens
            if cached_tokens is not None:
                stock.cached.observe(cached_tokens)
            if ms.isl_sources is not None:
                src = self._isl_source if (self._bucket is not None and got_output) else "unknown"
                ms.isl_sources[src] += 1
            b = self._bucket
            if b is not None and got_output:
                if rec.ttft_s is not None and not self._by_isl_ttft_done:
                    b.ttft.observe(rec.ttft_s)
                    self._by_isl_ttft_done = True
                if rec.output_chunks > 1:
                    b.itl.merge(rec.itl)
                b.duration.observe(rec.duration_s)
                if osl is not None:
                    b.osl.observe(osl)
                if cached_tokens is not None:
                    b.cached.observe(cached_tokens)
                    b.prompt_tokens += self.isl or 0
                if ms.slo_met is not None and state.slo is not None:
                    self._count_slo(ms.slo_met, state.slo, rec)
            if ms.uncached_sources is not None:
                self._finish_uncached(ms.uncached_sources, rec, got_output)
        return rec

    def _count_slo(self, met: dict[str, list[int]], slo: Slo, rec: RequestRecord) -> None:
        """Judge the finished request against the SLOs once (under the state's lock)."""
        label = self.bucket_label
        if label is None:
            return
        n = rec.itl.count
        itl = rec.itl.sum / n if n else None
        ttft_ok, itl_ok = meets(slo, SloRequest(self.isl, rec.ok, rec.ttft_s, itl), label)
        t = met[label]
        t[0] += ttft_ok
        t[1] += itl_ok
        t[2] += ttft_ok and itl_ok

    def _finish_uncached(self, sources: dict[str, int], rec: RequestRecord, got_output: bool) -> None:
        """The uncached bucket's share of :meth:`finish` (under the state's lock)."""
        u = self._ubucket
        if u is None or not got_output:
            no_cached = got_output and self.isl is not None and self.cached_tokens is None
            sources["no_cached_tokens" if no_cached else "unknown"] += 1
            return
        sources[self._usource] += 1
        if rec.ttft_s is not None and not self._ubucket_ttft_done:
            u.ttft.observe(rec.ttft_s)
            self._ubucket_ttft_done = True
        if rec.output_chunks > 1:
            u.itl.merge(rec.itl)
        u.duration.observe(rec.duration_s)
