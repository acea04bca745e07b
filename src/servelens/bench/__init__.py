"""servelens.bench: a load generator that replays synthetic workloads or real traces against an
OpenAI-compatible endpoint and reports TTFT/ITL per input-length bucket.

Public API::

    from servelens.bench import BenchConfig, run_bench, run_bench_sync, load_results, to_samples
"""

from servelens.bench.runner import BenchConfig, BenchResult, print_result, run_bench, run_bench_sync
from servelens.formats.results import BenchRecord, load_results, to_samples

__all__ = [
    "BenchConfig",
    "BenchRecord",
    "BenchResult",
    "load_results",
    "print_result",
    "run_bench",
    "run_bench_sync",
    "to_samples",
]
