"""Timing model of the simulated engine (pure: no clock, no I/O).

One engine step runs a batch: some requests decode one token each, some prefill a chunk of their
prompt (chunked prefill shares the step's token budget with decode, as in vLLM v1). The simulated
duration of a step, in seconds, is

.. code-block:: text

    step_s = step_overhead_s
           + sum over prefill chunks (c tokens after p tokens already in the KV cache):
                 prefill_s_per_token * c                                  # linear (GEMMs)
               + prefill_attn_s_per_token_pair * c * (p + (c + 1) / 2)    # quadratic (attention)
           + if any request decodes (n of them, holding K KV tokens in total):
                 decode_base_s                                            # one read of the weights
               + decode_s_per_seq * n                                     # per-sequence work
               + decode_s_per_kv_token * K                                # reading the KV cache

Cached prompt tokens (prefix-cache hits) are never prefilled, so they cost nothing and only count
in ``p``. The wall-clock duration is ``step_s / speedup``. The first output token of a request is
emitted at the end of the step that completes its prefill; each later step that includes it in the
decode batch emits one more (``tokens_per_step`` with the ``multi_token`` fault).

The form follows the usual roofline view of transformer inference: prefill is compute-bound (cost
∝ tokens, plus attention ∝ tokens x context), decode is memory-bound (cost ≈ reading the weights
once per step plus reading each sequence's KV cache). Parameter values live in
:mod:`servelens.sim.presets` with their sources.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

MAX_COST_S = 3600.0
"""Largest value of one timing parameter (seconds): larger ones overflow the step clock."""
MIN_SPEEDUP = 1e-3
"""Smallest speedup (a thousand times slower than the model); smaller ones overflow the step clock."""


@dataclass(frozen=True)
class ModelParams:
    """Parameters of the timing model and the scheduler (seconds, tokens, sequences).

    Attributes:
        step_overhead_s: fixed cost of every step (scheduling, sampling, launch overhead).
        prefill_s_per_token: linear prefill cost per uncached prompt token.
        prefill_attn_s_per_token_pair: attention cost per (query token, context token) pair.
        decode_base_s: cost of a step with at least one decoding sequence (weights read once).
        decode_s_per_seq: extra decode cost per sequence in the batch.
        decode_s_per_kv_token: extra decode cost per KV-cache token held by decoding sequences.
        max_num_seqs: most sequences running at once (vLLM ``--max-num-seqs``).
        max_num_batched_tokens: token budget of one step, decode tokens + prefill chunk tokens
            (vLLM ``--max-num-batched-tokens``).
        kv_capacity_tokens: KV-cache size; a request is admitted only if its prompt plus its
            ``max_tokens`` fit next to what running requests reserved (no preemption).
        block_size: prefix-cache block size in tokens (vLLM ``--block-size``, default 16).
        prefix_cache_blocks: prefix-cache LRU capacity in blocks; 0 disables prefix caching.

    Raises ValueError on construction for costs outside ``[0, MAX_COST_S]`` (NaN and inf included: a
    step would never end) or non-positive sizes.
    """

    step_overhead_s: float = 0.0005
    prefill_s_per_token: float = 4.0e-5
    prefill_attn_s_per_token_pair: float = 1.0e-9
    decode_base_s: float = 0.006
    decode_s_per_seq: float = 3.0e-5
    decode_s_per_kv_token: float = 5.6e-8
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 350_000
    block_size: int = 16
    prefix_cache_blocks: int = 20_000

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.endswith("_s") or "_s_per_" in f.name:
                if not 0 <= v <= MAX_COST_S:
                    raise ValueError(f"{f.name} must be a number of seconds in [0, {MAX_COST_S:g}], got {v!r}")
            elif f.name == "prefix_cache_blocks":
                if v < 0:
                    raise ValueError(f"{f.name} must be >= 0, got {v!r}")
            elif v < 1:
                raise ValueError(f"{f.name} must be >= 1, got {v!r}")

    def with_overrides(self, **overrides: Any) -> ModelParams:
        """A copy with some fields replaced (None values are ignored). Raises ValueError for an
        unknown field name or a bad value."""
        known = {f.name for f in fields(self)}
        bad = [k for k in overrides if k not in known]
        if bad:
            raise ValueError(f"unknown model parameter(s): {', '.join(sorted(bad))}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def prefill_chunk_s(params: ModelParams, chunk_tokens: int, context_tokens: int) -> float:
    """Cost (s) of prefilling ``chunk_tokens`` after ``context_tokens`` already in the KV cache."""
    c = chunk_tokens
    return params.prefill_s_per_token * c + params.prefill_attn_s_per_token_pair * c * (
        context_tokens + (c + 1) / 2
    )


def decode_s(params: ModelParams, n_seqs: int, kv_tokens: int) -> float:
    """Cost (s) of the decode part of a step with ``n_seqs`` sequences holding ``kv_tokens``."""
    if n_seqs <= 0:
        return 0.0
    return params.decode_base_s + params.decode_s_per_seq * n_seqs + params.decode_s_per_kv_token * kv_tokens


def step_s(
    params: ModelParams, prefill_chunks: Iterable[tuple[int, int]], n_decode: int, decode_kv_tokens: int
) -> float:
    """Simulated duration (s) of one step (formula in the module docstring).

    Args:
        prefill_chunks: ``(chunk_tokens, context_tokens)`` per prefilling request.
        n_decode: sequences decoding in this step.
        decode_kv_tokens: KV tokens held by those sequences.
    """
    total = params.step_overhead_s
    for c, p in prefill_chunks:
        total += prefill_chunk_s(params, c, p)
    return total + decode_s(params, n_decode, decode_kv_tokens)


def idle_ttft_s(params: ModelParams, isl: int, cached_tokens: int = 0) -> float:
    """TTFT (s, simulated) of a lone request on an idle engine: its prefill steps, chunked by
    ``max_num_batched_tokens``, each with the step overhead."""
    done = cached_tokens
    total = 0.0
    while done < isl:
        c = min(params.max_num_batched_tokens, isl - done)
        total += params.step_overhead_s + prefill_chunk_s(params, c, done)
        done += c
    return total
