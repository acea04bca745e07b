"""Named parameter sets for the timing model (:class:`~servelens.sim.model.ModelParams`).

The two H100 presets are first-principles roofline estimates from public specifications, not fits
to measurements; they give the right orders of magnitude and the right shapes (TTFT linear-plus-
quadratic in uncached prompt tokens, ITL growing with batch size and KV held), nothing more. The
``vllm-cpu-tiny-2core`` preset is the exception: it is fitted to measurements of a real vLLM CPU
engine (see its ``derivation``).

Sources used for the H100 presets:

- NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB.
- Model shapes from the models' Hugging Face ``config.json`` (layers, hidden size, KV heads).
- vLLM v1 engine defaults: ``--block-size 16``, ``--max-num-seqs 256``, ``--max-num-batched-tokens
  8192`` for the OpenAI server on >= 70 GiB GPUs (vllm/engine/arg_utils.py), ``gpu_memory_utilization
  0.9``.
- Assumed efficiencies: 40-50 % of peak FLOP/s in prefill, 70 % of peak bandwidth in decode,
  0.5 ms fixed step overhead (vLLM v1 scheduling + sampling), 30 us per sequence per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelens.sim.model import ModelParams


@dataclass(frozen=True)
class Preset:
    """A named parameter set with its derivation."""

    name: str
    description: str
    derivation: str
    params: ModelParams


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="llama-3.1-8b-h100",
            description="Llama 3.1 8B Instruct, BF16, one H100 SXM (vLLM v1 defaults)",
            derivation=(
                "prefill 2*8e9 FLOP/token at ~40% of 989 TFLOP/s = 40 us/token; attention "
                "4*32 layers*4096 = 0.52 MFLOP per token pair at ~50% = 1.0 ns/pair; decode reads "
                "16 GB of weights at 70% of 3.35 TB/s = 6 ms/step; KV 2*32*8*128*2 B = 128 KiB/token "
                "-> 56 ns/token; KV capacity (80*0.9 - 16 - ~6 activations) GB / 128 KiB = 350k tokens"
            ),
            params=ModelParams(
                step_overhead_s=0.0005,
                prefill_s_per_token=4.0e-5,
                prefill_attn_s_per_token_pair=1.0e-9,
                decode_base_s=0.006,
                decode_s_per_seq=3.0e-5,
                decode_s_per_kv_token=5.6e-8,
                max_num_seqs=256,
                max_num_batched_tokens=8192,
                kv_capacity_tokens=350_000,
                block_size=16,
                prefix_cache_blocks=20_000,
            ),
        ),
        Preset(
            name="qwen3-32b-tp2-h100",
            description="Qwen3 32B (dense, 30B class), BF16, tensor parallel 2 on two H100 SXM",
            derivation=(
                "prefill 2*32.8e9 FLOP/token over 2 GPUs at ~40% and 85% TP efficiency = 95 us/token; "
                "attention 4*64 layers*5120 = 1.3 MFLOP per pair over 2 GPUs = 1.6 ns/pair; decode "
                "reads 32.8 GB/GPU at 70% of 3.35 TB/s = 14 ms + 2 ms all-reduce = 16 ms/step; KV "
                "2*64*8*128*2 B = 256 KiB/token split over 2 GPUs -> 56 ns/token; KV capacity "
                "2*(72 - 32.8 - 6) GB / 256 KiB = 250k tokens"
            ),
            params=ModelParams(
                step_overhead_s=0.0007,
                prefill_s_per_token=9.5e-5,
                prefill_attn_s_per_token_pair=1.6e-9,
                decode_base_s=0.016,
                decode_s_per_seq=4.0e-5,
                decode_s_per_kv_token=5.6e-8,
                max_num_seqs=256,
                max_num_batched_tokens=8192,
                kv_capacity_tokens=250_000,
                block_size=16,
                prefix_cache_blocks=15_000,
            ),
        ),
        Preset(
            name="vllm-cpu-tiny-2core",
            description="vLLM 0.32.0 CPU build, tiny local Llama (2 layers, hidden 128, bf16), 2-core "
            "CI machine (servelens.engines.vllm_cpu)",
            derivation=(
                "fitted to measurements, not derived: benchmarks/vllm_cpu_reference.py, the median over "
                "runs of each run's median: client TTFT 0.021/0.165/1.94 s at ISL 500/4k/16k (7 runs), "
                "single-stream decode 402/345/199 tok/s (1 / mean vllm:inter_token_latency_seconds, "
                "5 runs); fitted minimax over the three points (TTFT worst 17 %, decode 3 %); "
                "chunked prefill 2048 tokens and "
                "128 seqs are vLLM's CPU defaults for the API server, prefix-cache blocks of 128 tokens "
                "and a 1,048,576-token KV cache (VLLM_CPU_KVCACHE_SPACE=1) are from the engine log; "
                "side-by-side table in docs/benchmarks.md"
            ),
            params=ModelParams(
                step_overhead_s=0.001,
                prefill_s_per_token=3.05e-5,
                prefill_attn_s_per_token_pair=8.7e-9,
                decode_base_s=0.0012,
                decode_s_per_seq=1.3e-4,
                decode_s_per_kv_token=1.6e-7,
                max_num_seqs=128,
                max_num_batched_tokens=2048,
                kv_capacity_tokens=1_048_576,
                block_size=128,
                prefix_cache_blocks=8192,
            ),
        ),
    )
}

DEFAULT_PRESET = "llama-3.1-8b-h100"


def get_preset(name: str) -> Preset:
    """The preset called ``name``. Raises ValueError naming the known presets otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown sim preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
