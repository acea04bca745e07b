"""Project skeleton (issue 2): the ``servelens`` console script with ``--help`` and ``--version``."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

import servelens
from servelens.cli.main import main


def test_console_script_entry_point() -> None:
    eps = importlib.metadata.entry_points(group="console_scripts", name="servelens")
    assert [ep.value for ep in eps] == ["servelens.cli.main:main"]


def test_version_matches_the_installed_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert servelens.__version__ == importlib.metadata.version("servelens")
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"servelens {servelens.__version__}"


def test_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: servelens")
    for cmd in ("demo", "sim", "gateway", "bench", "report", "dashboard", "eval"):
        assert f"    {cmd}" in out, cmd


def test_the_installed_script_runs() -> None:
    # the console script pip wrote (what a newcomer types), in a fresh process
    script = shutil.which("servelens", path=sysconfig.get_path("scripts")) or shutil.which("servelens")
    if script is None:
        pytest.skip("the servelens console script is not on PATH (package not installed with pip)")
    for args in (["--version"], ["--help"]):
        proc = subprocess.run([script, *args], capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: servelens")


@pytest.mark.parametrize(("argv", "says"), [
    (["bench"], "the following arguments are required: --url (see servelens bench --help)"),
    (["bench", "--url", "http://h:1", "--seed", "abc"], "argument --seed: invalid int value: 'abc'"),
    (["sim", "--preset", "x"], "argument --preset: invalid choice: 'x'"),
    (["report", "--results", "a", "--metrics", "b"], "not allowed with argument --results"),
    (["nope"], "invalid choice: 'nope'"),
    (["--bogus"], "unrecognized arguments: --bogus (see servelens --help)"),
    (["bench", "--url", "http://h:1", "--bogus"], "unrecognized arguments: --bogus (see servelens bench --help)"),
])
def test_bad_flags_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    # argparse printed its usage block (up to 20 lines) before the error, named by the subcommand
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and err.count("\n") == 1 and says in err, err


def test_file_errors_name_the_path_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # was "servelens: error: [Errno 2] No such file or directory: '/.../nope'"
    missing = tmp_path / "nope" / "deeper"
    (tmp_path / "nope").write_text("")  # a file where a folder is needed
    assert main(["dashboard", "--output-dir", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servelens: error: {tmp_path / 'nope'}"), err
    assert "[Errno" not in err and err.count("\n") == 1, err
