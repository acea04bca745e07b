"""``servelens eval``: ``run`` an eval suite against an endpoint; ``compare`` two deployments' runs; ``key``
writes a suite's answer key for the simulated engine."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console

from servelens.cli.main import HelpFormatter, interrupted
from servelens.eval.cache import CACHE_FILE
from servelens.eval.compare import compare_dirs
from servelens.eval.report import notes, rich_table, to_json, write_html
from servelens.eval.runner import DEFAULT_OUTPUT_DIR, EvalConfig, EvalInterrupted, print_summary, run_eval_sync
from servelens.eval.suites import DEFAULT_MAX_TOKENS, SUITE_NAMES, answer_key, read_text_suite
from servelens.formats.table import WIDE_WIDTH, fit_to, output_width

RUN_EPILOG = """\
examples:
  servelens eval run --url http://127.0.0.1:8000 --suite gsm8k --limit 50 \\
      --temperature 0
  servelens eval run --url http://127.0.0.1:8000 --suite mgsm \\
      --groups de,fr,es,ja,zh --limit 20 --output-dir bf16
  servelens eval run --url http://127.0.0.1:8000 --suite bfcl --runs 3
      # (no --temperature: the model's default temperature)

suites: gsm8k, mgsm (groups: languages), mmlu (groups: subjects), bfcl (BFCL
v3 multi-turn; groups: API classes); without --data each reads the small cut
shipped in the package. An interrupted run resumes where it stopped when run
again with the same options (answers are cached per endpoint and model in
DIR/SUITE/cache.jsonl)."""

COMPARE_EPILOG = """\
examples:
  servelens eval compare bf16 nvfp4
  servelens eval compare bf16 nvfp4 --format json --html compare.html"""


def _groups(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    groups = tuple(g.strip() for g in text.split(",") if g.strip())
    if not groups:
        raise ValueError("--groups needs at least one name")
    return groups


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``eval`` with its ``run`` and ``compare`` subcommands."""
    p = subparsers.add_parser("eval", help="quality of a deployment: run eval suites; compare two deployments",
                              description="Run eval suites against an OpenAI-compatible endpoint, and compare "
                              "two deployments item by item (McNemar, paired bootstrap, run-to-run spread).")
    sub = p.add_subparsers(dest="eval_command", metavar="COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])

    r = sub.add_parser("run", help="run a suite against an endpoint", epilog=RUN_EPILOG,
                       formatter_class=HelpFormatter,
                       description="Send every item of a suite to an endpoint (chat completions, not streamed), "
                       "score the replies, write per-item records and a summary, print the summary table.")
    r.add_argument("--url", required=True, metavar="URL",
                   help="endpoint base URL, e.g. http://127.0.0.1:8000 (/v1/... is appended)")
    r.add_argument("--model", metavar="NAME", help="model name (default: the first model GET /v1/models lists)")
    r.add_argument("--suite", required=True, choices=SUITE_NAMES, help="the eval suite: " + ", ".join(SUITE_NAMES))
    r.add_argument("--data", metavar="PATH",
                   help="the suite's full data file or folder (default: the packaged cut)")
    r.add_argument("--groups", metavar="NAME,NAME,...",
                   help="only these groups, comma-separated: languages, subjects, API classes (default: all)")
    r.add_argument("--limit", type=int, metavar="N", help="at most N items per group (suites without groups: in "
                   "total; bfcl: N conversations; default: all)")
    r.add_argument("--runs", type=int, default=1, metavar="K", help="repeat every item K times (default 1)")
    r.add_argument("--temperature", type=float, metavar="T",
                   help="sent with every request (default: none sent, the model's own default applies)")
    r.add_argument("--max-tokens", type=int, metavar="TOKENS", help="reply budget per request (default per suite: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_MAX_TOKENS.items()) + ")")
    r.add_argument("--shots", type=int, default=0, metavar="N",
                   help="mmlu: few-shot exemplars from the dev split, 0-5 (default 0)")
    r.add_argument("--concurrency", type=int, default=8, metavar="N", help="items in flight at once (default 8)")
    r.add_argument("--retries", type=int, default=4, metavar="N",
                   help="retries on 429, 5xx, connection errors, timeouts (default 4)")
    r.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                   help="per-request timeout in seconds (default 600)")
    r.add_argument("--tool-results", choices=("auto", "bfcl-eval", "stand-in"), default="auto",
                   help="bfcl: tool results from the bfcl-eval package's API classes, or the documented "
                   "stand-in (default auto: bfcl-eval when installed)")
    r.add_argument("--max-steps", type=int, default=4, metavar="N",
                   help="bfcl: model replies per turn at most (default 4)")
    r.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, metavar="DIR",
                   help=f"results go to DIR/SUITE/ (default {DEFAULT_OUTPUT_DIR})")
    r.add_argument("--no-cache", action="store_true", help="send every request afresh (answers are still stored)")
    r.add_argument("--api-key", metavar="KEY", default=os.environ.get("OPENAI_API_KEY"),
                   help="bearer token (default: $OPENAI_API_KEY)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run)

    c = sub.add_parser("compare", help="compare two deployments' runs", epilog=COMPARE_EPILOG,
                       formatter_class=HelpFormatter,
                       description="Compare the runs in DIR_A and DIR_B (output folders of `eval run`) item by "
                       "item: per eval and per group, A and B, items only A / only B got right, the p-value and "
                       "whether the difference is real.")
    c.add_argument("dir_a", metavar="DIR_A", help="deployment A's eval run --output-dir")
    c.add_argument("dir_b", metavar="DIR_B", help="deployment B's eval run --output-dir")
    c.add_argument("--alpha", type=float, default=0.05, metavar="LEVEL", help="significance level (default 0.05)")
    c.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    c.add_argument("--html", default="eval-compare.html", metavar="PATH",
                   help="write the plots here (default eval-compare.html)")
    c.add_argument("--no-html", action="store_true", help="write no HTML page")
    c.set_defaults(func=compare)

    k = sub.add_parser("key", help="write a suite's answer key for the simulated engine (method checks)",
                       description="Write the answer key of a text suite (gsm8k, mgsm, mmlu) as JSON Lines: per "
                       "item its id, its last user message, a reply the suite scores right and one it scores wrong. "
                       "`servelens sim --answer-key FILE --answer-accuracy P` then answers those items right with "
                       "probability P, so `eval compare` can be checked against a known truth.")
    key_suites = tuple(s for s in SUITE_NAMES if s != "bfcl")
    k.add_argument("--suite", required=True, choices=key_suites, help="the eval suite: " + ", ".join(key_suites))
    k.add_argument("--data", metavar="PATH",
                   help="the suite's data file or folder (default: the cut shipped in the package)")
    k.add_argument("--output", required=True, metavar="PATH", help="the answer key to write (JSONL)")
    k.set_defaults(func=write_key)


def run(args: argparse.Namespace) -> int:
    """``eval run``: exit 0, 1 when every item failed; 128 + the signal's number when stopped by Ctrl-C
    (130), SIGTERM (143) or SIGHUP (129), with one line saying how many items were done."""
    config = EvalConfig(
        url=args.url, suite=args.suite, model=args.model, data=args.data, groups=_groups(args.groups),
        limit=args.limit, runs=args.runs, temperature=args.temperature, max_tokens=args.max_tokens,
        shots=args.shots, concurrency=args.concurrency, retries=args.retries, timeout_s=args.timeout,
        output_dir=args.output_dir, use_cache=not args.no_cache, tool_results=args.tool_results,
        max_steps=args.max_steps, api_key=args.api_key, progress=not args.no_progress,
    )
    try:
        result = run_eval_sync(config)
    except EvalInterrupted as exc:
        status, which = interrupted(exc)
        print(f"servelens: interrupted{which}: {exc.done} of {exc.total} items done, their answers cached in "
              f"{exc.cache}; run the same command again to send only the missing {exc.total - exc.done}",
              file=sys.stderr)
        return status
    except KeyboardInterrupt as exc:  # before the run's loop took the signals
        status, which = interrupted(exc)
        cache = Path(config.output_dir) / config.suite / CACHE_FILE
        print(f"servelens: interrupted{which}; the answers so far are cached in {cache}: run the same command "
              "again to send only the missing items", file=sys.stderr)
        return status
    print_summary(result, Console(width=output_width() or WIDE_WIDTH))
    s = result.summary
    return 1 if s["records"] and s["failed"] == s["records"] else 0


def write_key(args: argparse.Namespace) -> int:
    """``eval key``: exit 0."""
    lines = answer_key(args.suite, read_text_suite(args.suite, Path(args.data) if args.data else None))
    out = Path(args.output)
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {out}: folder {out.parent} does not exist")
    out.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"{len(lines)} items of {args.suite} -> {out}", file=sys.stderr)
    return 0


def compare(args: argparse.Namespace) -> int:
    """``eval compare``: exit 0."""
    result = compare_dirs(args.dir_a, args.dir_b, args.alpha)
    html_path = None if args.no_html else write_html(args.html, result)
    if args.format == "json":
        print(to_json(result))
    else:
        width = output_width() or WIDE_WIDTH
        table = rich_table(result)
        fit_to(table, width)
        console = Console(width=width)
        console.print(table)
        for line in notes(result):
            console.print(line, highlight=False)
    if html_path is not None:
        print(f"plots: {html_path}", file=sys.stderr)
    return 0
