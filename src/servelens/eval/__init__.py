"""servelens.eval: quality of a deployment. Eval suites (GSM8K, MGSM, MMLU, BFCL v3 multi-turn) run
against an OpenAI-compatible endpoint, and a paired, noise-aware comparison of two deployments.

Modules: ``suites`` and ``bfcl`` (data readers, prompts), ``scoring`` (pure), ``cache`` and ``client``
(requests, retries, the response cache), ``runner`` (a run: records and summary), ``records`` (the run's
files), ``stats`` (scipy), ``compare`` and ``report`` (table, JSON, HTML), ``testing`` (a fake endpoint).

Public API::

    from servelens.eval import EvalConfig, run_eval, run_eval_sync, compare_dirs
"""

from servelens.eval.compare import CompareRow, Comparison, compare_dirs
from servelens.eval.records import EvalRecord, read_run
from servelens.eval.runner import EvalConfig, EvalResult, print_summary, run_eval, run_eval_sync

__all__ = [
    "CompareRow",
    "Comparison",
    "EvalConfig",
    "EvalRecord",
    "EvalResult",
    "compare_dirs",
    "print_summary",
    "read_run",
    "run_eval",
    "run_eval_sync",
]
