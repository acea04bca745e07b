"""Continuous-batching scheduler of the simulated engine: a pure step planner. The asyncio
loop that runs it in time is :mod:`servelens.sim.steploop`.

:class:`Engine` is pure (no clock reads, no asyncio): :meth:`Engine.plan` picks the next step's
batch and its simulated cost, :meth:`Engine.complete` applies it at a given time. Scheduling
follows vLLM v1: running requests first (each decoding request takes one token of the step's
``max_num_batched_tokens`` budget, unfinished prefills take chunks of what is left), then waiting
requests are admitted in FIFO order while there are fewer than ``max_num_seqs`` running, budget
is left, and the KV cache can hold the prompt plus ``max_tokens`` (reserved at admission; no
preemption). On admission the prefix cache is looked up; cached tokens are never prefilled.

:func:`simulate` runs the planner in virtual time, without a loop or a server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from servelens.sim.model import ModelParams, step_s
from servelens.sim.prefix_cache import PrefixCache


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine (mutable; owned by the engine once submitted).

    Args:
        request_id: the id joining the response to its truth record.
        block_hashes: prefix-cache block hashes of the prompt.
        isl: prompt tokens.
        osl_target: tokens to generate before finishing (``max_tokens`` or the natural EOS point).
        arrival_ns: when the request arrived (clock ns).
        tokens_per_step: tokens emitted per decode step (1; more with the ``multi_token`` fault).
        notify: called (no arguments) after every step that changed this request.
        on_done: called once when the engine lets go of the request (finished, or dropped after
            :meth:`Engine.cancel`); may be set at any time before that.
    """

    request_id: str
    block_hashes: Sequence[int]
    isl: int
    osl_target: int
    arrival_ns: int
    tokens_per_step: int = 1
    notify: Callable[[], None] | None = None
    cached_tokens: int = 0
    prefilled: int = 0
    generated: int = 0
    token_times_ns: list[int] = field(default_factory=list)
    admitted_ns: int | None = None
    finished: bool = False
    cancelled: bool = False
    cancel_ns: int | None = None
    tokens_at_cancel: int | None = None
    submitted: bool = False
    on_done: Callable[[], None] | None = None

    def _finish(self) -> None:
        self.finished = True
        if self.on_done is not None:
            cb, self.on_done = self.on_done, None
            cb()
        if self.notify is not None:  # a handler waiting for tokens learns it was let go
            self.notify()

    @property
    def kv_reserved(self) -> int:
        """KV tokens reserved for this request (prompt + all tokens it may generate)."""
        return self.isl + self.osl_target


@dataclass(frozen=True)
class Step:
    """A planned step: prefill chunks ``(request, tokens)``, decoding requests and the cost."""

    prefill: tuple[tuple[SimRequest, int], ...]
    decode: tuple[SimRequest, ...]
    cost_s: float


class Engine:
    """Pure step planner (see the module docstring).

    Raises ValueError from :meth:`submit` when a request can never fit in the KV cache.
    """

    def __init__(self, params: ModelParams) -> None:
        self.params = params
        self.cache = PrefixCache(params.block_size, params.prefix_cache_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv_reserved = 0
        self.steps = 0
        self.tokens_emitted = 0
        self.prompt_tokens = 0

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    def submit(self, req: SimRequest) -> None:
        """Queue a request. Raises ValueError if ``isl + osl_target`` exceeds the KV capacity."""
        if req.kv_reserved > self.params.kv_capacity_tokens:
            raise ValueError(
                f"prompt ({req.isl} tokens) plus max_tokens ({req.osl_target}) exceeds the KV cache "
                f"capacity of {self.params.kv_capacity_tokens} tokens"
            )
        req.submitted = True
        self.waiting.append(req)

    def cancel(self, req: SimRequest, now_ns: int) -> None:
        """Stop generating for ``req`` (it leaves the batch at the next :meth:`plan`)."""
        if not req.cancelled and not req.finished:
            req.cancelled = True
            req.cancel_ns = now_ns
            req.tokens_at_cancel = req.generated

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self.waiting):
            dropped = [r for r in self.waiting if r.cancelled]
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
            for r in dropped:
                r._finish()
        if any(r.cancelled for r in self.running):
            keep: list[SimRequest] = []
            for r in self.running:
                if r.cancelled:
                    self.kv_reserved -= r.kv_reserved
                    r._finish()
                else:
                    keep.append(r)
            self.running = keep

    def drop_all(self) -> None:
        """Let go of every request (engine shutdown); their ``on_done`` callbacks run, all of them even
        when one raises (the first such error is raised after the last)."""
        reqs = [*self.waiting, *self.running]
        self.waiting.clear()
        self.running = []
        self.kv_reserved = 0
        first: Exception | None = None
        for r in reqs:
            try:
                r._finish()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def plan(self) -> Step | None:
        """The next step, or None when nothing can run (idle)."""
        self._drop_cancelled()
        p = self.params
        budget = p.max_num_batched_tokens
        decode: list[SimRequest] = []
        prefill: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if r.prefilled >= r.isl:
                decode.append(r)
                budget -= 1
        for r in self.running:
            if r.prefilled < r.isl and budget > 0:
                c = min(r.isl - r.prefilled, budget)
                prefill.append((r, c))
                budget -= c
        waiting = self.waiting
        while waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            r = waiting[0]
            if self.kv_reserved + r.kv_reserved > p.kv_capacity_tokens:
                break
            waiting.popleft()
            r.cached_tokens = self.cache.match(r.block_hashes, r.isl)
            r.prefilled = r.cached_tokens
            self.prompt_tokens += r.isl
            self.running.append(r)
            self.kv_reserved += r.kv_reserved
            c = min(r.isl - r.prefilled, budget)
            prefill.append((r, c))
            budget -= c
        if not decode and not prefill:
            return None
        kv = sum(r.prefilled + r.generated for r in decode)
        cost = step_s(p, ((c, r.prefilled) for r, c in prefill), len(decode), kv)
        return Step(tuple(prefill), tuple(decode), cost)

    def admit_times(self, step: Step, now_ns: int) -> None:
        """Stamp the admission time of requests whose first prefill chunk is in ``step``."""
        for r, _ in step.prefill:
            if r.admitted_ns is None:
                r.admitted_ns = now_ns

    def complete(self, step: Step, now_ns: int) -> None:
        """Apply ``step`` at ``now_ns``: advance prefills, emit tokens, finish requests, notify."""
        self.steps += 1
        emitted = 0
        done = False
        for r, c in step.prefill:
            if r.cancelled:
                continue
            r.prefilled += c
            if r.prefilled >= r.isl:
                self.cache.insert(r.block_hashes)
                r.generated += 1
                r.token_times_ns.append(now_ns)
                emitted += 1
                done = done or r.generated >= r.osl_target
        for r in step.decode:
            if r.cancelled:
                continue
            k = min(r.tokens_per_step, r.osl_target - r.generated)
            r.generated += k
            r.token_times_ns.extend([now_ns] * k)
            emitted += k
            done = done or r.generated >= r.osl_target
        self.tokens_emitted += emitted
        if done:
            keep: list[SimRequest] = []
            for r in self.running:
                if r.generated >= r.osl_target:
                    self.kv_reserved -= r.kv_reserved
                    r._finish()
                else:
                    keep.append(r)
            self.running = keep
        for r, _ in step.prefill:
            if r.notify is not None:
                r.notify()
        for r in step.decode:
            if r.notify is not None:
                r.notify()


def simulate(engine: Engine, requests: Sequence[SimRequest], start_ns: int = 0) -> int:
    """Run ``requests`` to completion in virtual time (pure, no asyncio); returns the end time (ns).

    Each request is submitted at its ``arrival_ns``; steps take exactly their modelled cost
    (``speedup`` 1). Token times, admission times and cached tokens are filled in on the requests,
    so the model can be checked (and the bench's expectations computed) without a server.
    Raises ValueError if a request can never fit in the KV cache.
    """
    pending = deque(sorted(requests, key=lambda r: r.arrival_ns))
    now = start_ns
    while pending or engine.has_work():
        while pending and pending[0].arrival_ns <= now:
            engine.submit(pending.popleft())
        step = engine.plan()
        if step is None:
            if not pending:
                break
            now = max(now, pending[0].arrival_ns)
            continue
        engine.admit_times(step, now)
        now += int(step.cost_s * 1e9)
        engine.complete(step, now)
    return now
