"""``servelens bench`` as a user runs it (a child process)."""

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from servelens.cli.main import main


async def run_cli(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    """The real console script in a child process."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "servelens", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def run_main(capsys: Any, *args: str) -> tuple[int, str, str]:
    """``servelens bench`` in this process (its own event loop)."""
    code = main(["bench", *args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


async def test_cli_runs_and_prints_the_table(upstream: Any, tmp_path: Path) -> None:
    code, out, err = await run_cli("--url", upstream.url, "--isl", "100:0.5,2000:0.5", "--osl", "3",
                                   "--num-requests", "12", "--concurrency", "3", "--output-dir", str(tmp_path),
                                   "--no-progress")
    assert code == 0, err
    for text in ("Input length", "TTFT p95", "0-512", "1025-2048", "all", "trustworthy"):
        assert text in out.lower() or text in out, (text, out)
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"] == 12 and summary["model"] == "tiny"
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 12


async def test_cli_trace_by_packaged_name(upstream: Any, tmp_path: Path, capsys: Any) -> None:
    code, _out, err = await asyncio.to_thread(
        run_main, capsys, "--url", upstream.url, "--trace", "azure_conv_2023_500.csv", "--time-scale", "0",
        "--max-requests", "5", "--output-dir", str(tmp_path), "--no-progress")
    assert code == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["requests"] == 5
    # the synthetic workload's settings were not used: not recorded as if they were
    assert [summary["config"][k] for k in ("isl", "osl", "num_requests")] == [None, None, None]


def test_cli_errors_are_one_line(tmp_path: Path, capsys: Any) -> None:
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--num-requests", "1", "--output-dir",
                                   str(tmp_path), "--no-progress")
    assert code == 2 and err.startswith("servelens: error: cannot reach") and err.count("\n") == 1, err
    assert "ssl:default" not in err and "cannot connect (" in err, err  # the OS's reason, not aiohttp's noise
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--isl", "lognormal:5")
    assert code == 2 and "MEAN,SD" in err and "Traceback" not in err
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--trace", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "trace file not found" in err
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--trace", str(tmp_path))
    assert code == 2 and "is a folder" in err and err.count("\n") == 1, err


def test_cli_help_lists_the_options(capsys: Any) -> None:
    try:
        main(["bench", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    text = capsys.readouterr().out
    for opt in ("--trace-format", "--time-scale", "--isl-buckets", "--metrics-url", "--tokenizer", "--long-requests",
                "--arrival", "--rate", "--concurrency", "--duration", "--max-requests"):
        assert opt in text


def test_cli_rejects_synthetic_flags_with_a_trace(capsys: Any) -> None:
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--trace", "mooncake_conversation_400.jsonl",
                               "--isl", "300")
    assert code == 2 and "--isl" in err and "--trace" in err and err.count("\n") == 1, err


def test_cli_unwritable_output_dir_fails_before_any_load(tmp_path: Path, capsys: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # nothing listens on port 9: had the bench tried to send anything, the error would be "cannot reach"
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--num-requests", "1", "--output-dir",
                               str(blocker / "out"), "--no-progress")
    assert code == 2 and "cannot write results to" in err and err.count("\n") == 1, err


async def test_cli_unknown_model_says_what_the_server_said(tmp_path: Path, capsys: Any) -> None:
    from servelens.sim.testing import run_sim

    async with run_sim() as sim:
        code, _out, err = await asyncio.to_thread(
            run_main, capsys, "--url", sim.url, "--model", "gpt-4", "--num-requests", "1", "--output-dir",
            str(tmp_path), "--no-progress")
    assert code == 2 and "HTTP 404" in err and "gpt-4" in err and "does not exist" in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("flags", "says"), [
    (["--duration", "inf"], "duration must be a finite number, got inf"),  # was an OverflowError traceback
    (["--duration", "nan"], "duration must be a finite number"),  # was "cannot convert float NaN to integer"
    (["--rate", "nan"], "rate must be a number of requests per second"),
    (["--ramp-up", "inf", "--concurrency", "2"], "ramp-up must be a finite number"),  # the workers never started
    (["--ramp-up", "nan", "--concurrency", "2"], "ramp-up must be a finite number"),
    (["--time-scale", "nan", "--trace", "mooncake_conversation_400.jsonl"], "time-scale must be a finite number"),
    (["--request-timeout", "0"], "request-timeout must be > 0 s"),  # every request failed
    (["--request-timeout", "-1"], "request-timeout must be > 0 s"),  # was "cannot reach ...: Timeout"
    (["--request-timeout", "nan"], "request-timeout must be a finite number"),
    (["--max-loop-lag-ms", "-1"], "max-loop-lag-ms must be >= 0"),
    (["--max-loop-lag-ms", "nan"], "max-loop-lag-ms must be a finite number"),
    (["--url", "http://127.0.0.1:99999"], "is not a valid URL: Port out of range"),  # the URL was its own reason
    (["--url", "http://[::1"], "is not a valid URL"),
    (["--url", "http://"], "has no host"),
    (["--url", "http://127.0.0.1:9/?a=1"], "must not have a query or fragment"),
    (["--metrics-url", "metrics.txt"], "--metrics-url must start with http:// or https://"),
])
def test_cli_bad_numbers_and_urls_are_one_line_before_any_load(tmp_path: Path, capsys: Any, flags: list[str],
                                                                says: str) -> None:
    # nothing listens on port 9: had the bench tried to send anything, the error would be "cannot reach"
    size = ["--max-requests", "1"] if "--trace" in flags else ["--num-requests", "1"]
    args = ["--url", "http://127.0.0.1:9", *size, "--output-dir", str(tmp_path), "--no-progress"]
    code, _out, err = run_main(capsys, *args, *flags)
    assert code == 2 and err.startswith("servelens: error: ") and err.count("\n") == 1, err
    assert says in err, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
async def test_cli_kill_mid_run_keeps_the_finished_requests(tmp_path: Path, sig: signal.Signals) -> None:
    # kill, timeout(1) or a closed terminal: the bench ended on the spot (status -15) and wrote nothing;
    # now it stops as on Ctrl-C: the finished requests are written and it says so, status 128 + signal
    from servelens.sim.testing import run_sim

    async with run_sim(speedup=2) as sim:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "servelens", "bench", "--url", sim.url, "--isl", "64", "--osl", "400",
            "--num-requests", "200", "--concurrency", "2", "--output-dir", str(tmp_path), "--no-progress",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            await sim.wait_truth_count(4, timeout=60)  # the probe and a few of the run's requests are done
            proc.send_signal(sig)
            _out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 128 + sig, err
    text = err.decode()
    assert text.startswith(f"servelens: interrupted ({sig.name}); the requests that finished are in ")
    assert text.count("\n") == 1 and "Traceback" not in text
    assert (tmp_path / "results.jsonl").exists()


def test_cli_interrupted_before_any_result_does_not_point_at_an_older_run(tmp_path: Path, capsys: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # a results.jsonl left in the folder by an earlier run was named as this run's finished requests
    (tmp_path / "results.jsonl").write_text("")
    import servelens.cli.bench as bench_cli

    def interrupted_early(config: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "run_bench_sync", interrupted_early)
    code, _out, err = run_main(capsys, "--url", "http://127.0.0.1:9", "--output-dir", str(tmp_path), "--no-progress")
    assert (code, err) == (130, "servelens: interrupted\n")
