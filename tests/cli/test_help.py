"""Every command's ``--help`` (issue 19): each option has help text, a default (or says what happens
without it) and a unit-like metavar; nothing is wider than an 80-column terminal; lists are not cut
mid-word."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from servelens.cli.main import build_parser
from servelens.sim.faults import FAULT_MODES

WIDTH = 80


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _options() -> Iterator[tuple[str, argparse.ArgumentParser, argparse.Action]]:
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                continue
            yield " ".join(("servelens", *path)), parser, action


def _help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The action's help as --help prints it (``%(default)s`` expanded)."""
    return parser._get_formatter()._expand_help(action) if action.help else ""


OPTIONS = list(_options())
IDS = [f"{cmd} {a.option_strings[0] if a.option_strings else a.dest}" for cmd, _p, a in OPTIONS]


@pytest.mark.parametrize("cmd, parser, action", OPTIONS, ids=IDS)
def test_every_option_has_help_a_default_and_a_metavar(cmd: str, parser: argparse.ArgumentParser,
                                                       action: argparse.Action) -> None:
    text = _help_text(parser, action)
    assert text.strip(), "no help text"
    takes_value = action.nargs != 0
    one_of_required = any(action in g._group_actions for g in parser._mutually_exclusive_groups if g.required)
    if action.option_strings and takes_value and not action.required and not one_of_required:
        # what happens without the flag: its default, or what is done instead
        assert re.search(r"\bdefaults?\b", text, re.IGNORECASE), f"no default in {text!r}"
        default = action.default
        if isinstance(default, int | float | str) and not isinstance(default, bool) and default != "":
            shown = {str(default)} | ({f"{default:g}"} if isinstance(default, float) else set())
            assert any(s in text for s in shown), f"default {default!r} not in {text!r}"
    if takes_value:
        # a unit or kind (SECONDS, TOKENS, N, URL, PATH), not the flag's own name in capitals
        assert action.metavar is not None or action.choices is not None, "metavar is the flag's name"


@pytest.mark.parametrize("path, parser", list(_parsers(build_parser())), ids=lambda v: " ".join(v)
                         if isinstance(v, tuple) else "")
def test_help_fits_80_columns(monkeypatch: pytest.MonkeyPatch, path: tuple[str, ...],
                              parser: argparse.ArgumentParser) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    text = parser.format_help()
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, "\n".join(wide)  # a one-line 200-character description was one line


def test_sim_fault_modes_are_listed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    sim = dict(_parsers(build_parser()))[("sim",)]
    words = set(re.findall(r"[a-z0-9_]+", sim.format_help()))
    assert set(FAULT_MODES) <= words, set(FAULT_MODES) - words


def test_bench_examples_pair_the_url_with_its_own_metrics() -> None:
    bench = dict(_parsers(build_parser()))[("bench",)]
    epilog = bench.epilog or ""
    for line in epilog.replace("\\\n", " ").splitlines():
        url = re.search(r"--url (http://[^/\s]+)", line)
        metrics = re.search(r"--metrics-url (http://[^/\s]+)", line)
        if url and metrics:
            assert url[1] == metrics[1], line  # the gateway serves both on one port


@pytest.mark.parametrize("command", ["bench", "report", "explain", "gateway", "dashboard"])
def test_slo_itl_help_says_it_judges_each_requests_tpot(command: str) -> None:
    """``--slo-itl`` is judged on each request's mean ITL, which vLLM's benchmark calls TPOT: every
    command that takes it says so (the README named neither)."""
    (action, parser), = [(a, p) for cmd, p, a in OPTIONS
                         if cmd == f"servelens {command}" and "--slo-itl" in a.option_strings]
    text = _help_text(parser, action)
    assert "mean ITL" in text and "TPOT" in text, text
