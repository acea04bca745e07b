"""servelens.bench: a load generator that replays synthetic workloads or real traces against an
OpenAI-compatible endpoint and reports TTFT/ITL per input-length bucket.

Public API::

    from servelens.bench import BenchConfig, run_bench, run_bench_sync, load_results, to_samples

Modules, in the order a run uses them:

- :mod:`~servelens.bench.config`: :class:`BenchConfig`, what to run (checked when built).
- :mod:`~servelens.bench.traces`, :mod:`~servelens.bench.distributions`, :mod:`~servelens.bench.arrivals`:
  trace readers, synthetic length specs, Poisson/constant arrival times (seeded).
- :mod:`~servelens.bench.workload`: the requests of a run, in send order, fitted to the context.
- :mod:`~servelens.bench.prompts`: prompts of an exact token length (a ``tokenizer.json``, else the
  sim's tokenizer), with shared prefixes for traces' prefix blocks.
- :mod:`~servelens.bench.control`: model discovery, the option probe, the ``/metrics`` scrapes.
- :mod:`~servelens.bench.client`: one streamed request timed chunk by chunk into a ``BenchRecord``.
- :mod:`~servelens.bench.loops`, :mod:`~servelens.bench.progress`, :mod:`~servelens.bench.lag`: the open
  and closed loop, the progress bar, the event-loop lag that says whether the figures hold.
- :mod:`~servelens.bench.runner`: :func:`run_bench`, putting these together.
- :mod:`~servelens.bench.summary`, :mod:`~servelens.bench.printing`: :class:`BenchResult`,
  ``summary.json`` and the printed table.

The results file, the scrape reader and the table are :mod:`servelens.formats` (the report reads
what the bench writes). Imports: :mod:`servelens.core`, :mod:`servelens.prometheus`,
:mod:`servelens.formats`, :mod:`servelens.serving`, and :mod:`servelens.sim` for its tokenizer
only; never the report, the gateway or ``cli`` (tests/test_layering.py).
"""

from servelens.bench.config import BenchConfig
from servelens.bench.printing import print_result
from servelens.bench.runner import run_bench, run_bench_sync
from servelens.bench.summary import BenchResult
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
