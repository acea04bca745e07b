"""``servelens`` console script: subcommands register themselves from ``servelens.cli.<name>``.

Errors that are the user's (bad flags, bad files, unreachable URLs) print one readable line
``servelens: error: ...`` and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from servelens import __version__

# Each module defines add_parser(subparsers) which sets `func` (args -> int exit code).
SUBCOMMANDS: tuple[str, ...] = ("demo", "sim", "gateway", "bench", "report", "explain", "dashboard", "eval")


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a description or epilog written on several lines (examples,
    lists) is printed as written; a one-paragraph one is wrapped to the terminal as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors (a bad flag, a missing or malformed value) are one line
    ``servelens: error: ...`` pointing at ``--help``, exit status 2, like every other user error
    (subcommand parsers are of this class too: ``add_subparsers`` makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"servelens: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand (``only``: just that one, so that a
    command imports only its own modules)."""
    parser = _Parser(
        prog="servelens",
        description="Per-input-length latency metrics for OpenAI-compatible LLM inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"servelens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only in SUBCOMMANDS else SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"servelens.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"servelens.cli.{name}":
                continue  # not built yet
            raise
        mod.add_parser(sub)
    return parser


def interrupted(exc: KeyboardInterrupt) -> tuple[int, str]:
    """Exit status and wording for an interrupted command: Ctrl-C -> ``(130, "")``; a SIGTERM or SIGHUP
    turned into ``KeyboardInterrupt("SIGTERM")`` (the demo and the bench do) -> 128 + its number and
    ``" (SIGTERM)"``."""
    name = exc.args[0] if exc.args and isinstance(exc.args[0], str) else "SIGINT"
    signum = signal.Signals.__members__.get(name, signal.SIGINT)
    return 128 + int(signum), (f" ({name})" if signum != signal.SIGINT else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    try:
        args_list = list(sys.argv[1:] if argv is None else argv)
        # a subcommand named first: only its modules are imported (a Ctrl-C can come while they are)
        parser = build_parser(args_list[0] if args_list else None)
        args, extras = parser.parse_known_args(args_list)
        if extras:  # reported by the subcommand's parser, so the hint names its --help
            _parser_of(parser, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(extras)}")
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help()
            return 0
        return int(func(args) or 0)
    except KeyboardInterrupt as exc:
        status, which = interrupted(exc)
        print(f"servelens: interrupted{which}", file=sys.stderr)
        return status
    except (CliError, ValueError, OSError) as exc:
        print(f"servelens: error: {_reason(exc)}", file=sys.stderr)
        return 2


def _parser_of(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand ``command`` (the top-level one when None or unknown)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub: argparse.ArgumentParser = action.choices[command]
            return sub
    return parser


def _reason(exc: Exception) -> str:
    """The error's text; a file error as ``PATH: reason`` (not ``[Errno 2] No such file or directory: 'PATH'``)."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
