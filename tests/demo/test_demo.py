"""`servelens demo` end to end with a short duration: the table has non-empty buckets and the
client and gateway columns agree (issue 6); --keep-running and --trace; SIGTERM stops the engine
and gateway; bad flags are one-line errors before anything starts."""

import io
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from servelens.cli.main import main
from servelens.core.edges import ITL_EDGES_S, TTFT_EDGES_S  # compared at Dynamo's (coarser) le resolution
from servelens.core.quantiles import bucket_bounds
from servelens.process import ServerStartError


def le_index(x: float, edges: tuple[float, ...] = TTFT_EDGES_S) -> int:
    _lower, upper = bucket_bounds(x, edges)
    return list(edges).index(upper) if upper in edges else len(edges)


def test_demo_short_run(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "servelens", "demo", "--trace", "mooncake_conversation_400.jsonl", "--duration", "8",
         "--output-dir", str(out)],
        capture_output=True, text=True, timeout=240, check=False,
        # os.environ as Python sees it: a COLUMNS put into the C environment behind its back (it is
        # there under pytest) would narrow the piped tables, which honour $COLUMNS
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # side by side when no cell wraps at the width, else one above the other: wider figures (a slow run
    # gives seconds where a quick one gives ms) choose the layout
    both = "Client vs server" in proc.stdout
    assert both or ("Client (exact percentiles)" in proc.stdout and "Server (gateway /metrics)" in proc.stdout)
    assert "16385+" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    client = {r["bucket"]: r for r in summary["client_rows"]}
    server = {r["bucket"]: r for r in summary["server_rows"]}
    assert summary["errors"] == 0
    busy = [b for b, r in client.items() if b != "all" and r["requests"] > 0]
    assert len(busy) >= 4, client  # the Mooncake cut spans 513-1024 .. 16385+
    for b in busy:
        c, s = client[b], server[b]
        assert s["requests"] == c["requests"], b  # the gateway counted every request in its bucket
        assert c["ttft_p50_s"] is not None and s["ttft_p50_s"] is not None
        # the gateway sees the request first and the first chunk last: its TTFT is a little lower;
        # its percentile is interpolated inside le buckets, so compare at le resolution
        assert abs(le_index(c["ttft_p50_s"]) - le_index(s["ttft_p50_s"])) <= 1, (b, c, s)
        # ITL: many tokens per bucket, so p50 and p95 both compare at le resolution
        for f in ("itl_p50_s", "itl_p95_s"):
            assert c[f] is not None and s[f] is not None, (b, f)
            assert abs(le_index(c[f], ITL_EDGES_S) - le_index(s[f], ITL_EDGES_S)) <= 1, (b, f, c, s)
        assert c["mean_cached_tokens"] == s["mean_cached_tokens"]
        # the printed table shows the same counts on the bucket's row: one `client/server` cell side by
        # side, else the client's table's row and then the server's (a slow run widens the cells)
        rows = [line for line in proc.stdout.splitlines() if line.startswith(f"│ {b} ")]
        counts = [row.split("│")[2].strip().rstrip("*~ ").strip() for row in rows]
        if both:
            assert counts[0] == f"{c['requests']:,}/{s['requests']:,}", rows
        else:
            assert counts[:2] == [f"{c['requests']:,}", f"{s['requests']:,}"], rows
    assert client["all"]["requests"] == server["all"]["requests"] == sum(client[b]["requests"] for b in client
                                                                         if b != "all")
    assert (out / "report.html").stat().st_size > 100_000  # plotly inlined: self-contained
    assert (out / "results.jsonl").exists()


def _read_until(proc: subprocess.Popen[bytes], prefix: str, timeout_s: float = 60.0) -> list[str]:
    """The demo's stdout lines up to and including the first that starts with ``prefix``.

    Reads the pipe's file descriptor directly: a buffered reader would keep lines that arrived
    together in its buffer, where the selector cannot see them."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    lines: list[str] = []
    buf = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=deadline - time.monotonic()):
                continue
            data = os.read(fd, 65536)
            if not data:
                break  # the demo exited
            buf += data
            while b"\n" in buf:
                raw, buf = buf.split(b"\n", 1)
                lines.append(raw.decode(errors="replace"))
                if lines[-1].startswith(prefix):
                    return lines
    raise AssertionError(f"no line starting {prefix!r}: {chr(10).join(lines)[-2000:]}")


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:  # it has exited
        return []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


STOP_GUARD_S = 120
"""Bound on a demo's stop, for a hung test only: the demo stops its gateway and its engine one after the
other, each with up to 5 s of SIGTERM grace, 5 s after SIGKILL and 2 s for its log pump (24 s by design,
ServerProcess.stop). A 30 s bound was hit once at load 6: the demo's bench went on after the SIGTERM
(docs/testing.md); past the bound the test fails with the demo's output, to tell a missed signal from a
slow stop."""


def _wait_stopped(proc: subprocess.Popen[bytes]) -> int:
    """The demo's exit status once it has stopped. Past :data:`STOP_GUARD_S` it is killed and the test
    fails with the demo's output (its log lines, and any "Exception ignored" Python printed)."""
    try:
        return proc.wait(timeout=STOP_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the demo alone (its children have theirs)
        out = proc.communicate(timeout=30)[0].decode(errors="replace")
        pytest.fail(f"the demo did not stop within {STOP_GUARD_S} s; its output:\n{out[-4000:]}")


def _start_demo(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "servelens", "demo", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes], kids: list[int]) -> None:
    """Stop the demo and never leave its engine or gateway behind, even when an assertion failed
    before ``kids`` was read: SIGTERM (the demo stops them), then SIGKILL what is left."""
    if proc.poll() is None:
        kids = kids + _children(proc.pid)
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    for k in kids:
        if _running(k):
            os.kill(k, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from /proc (Linux)")
def test_demo_sigterm_mid_run_stops_engine_and_gateway(tmp_path: Path) -> None:
    # the engine and gateway run in their own sessions: a SIGTERM to the demo must stop them too
    proc = _start_demo("--duration", "60", "--output-dir", str(tmp_path / "demo"))
    kids: list[int] = []
    try:
        _read_until(proc, "bench")  # engine and gateway up, replay starting
        kids = _children(proc.pid)
        assert len(kids) == 2, kids
        proc.send_signal(signal.SIGTERM)
        assert _wait_stopped(proc) == 128 + signal.SIGTERM  # the shell's convention for "killed by SIGTERM"
        assert proc.stdout is not None and b"servelens: interrupted" in proc.stdout.read()
        assert [k for k in kids if _running(k)] == []
    finally:
        _stop(proc, kids)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads children from /proc (Linux)")
def test_demo_keep_running_with_another_trace(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    from servelens.process import free_port

    engine_port, gateway_port = free_port(), free_port()
    while gateway_port == engine_port:
        gateway_port = free_port()
    # fixed ports (issue 19): a Prometheus scrape config can be reused from run to run
    proc = _start_demo("--trace", "azure_conv_2023_500.csv", "--duration", "2", "--keep-running",
                       "--output-dir", str(out), "--engine-port", str(engine_port), "--gateway-port", str(gateway_port))
    kids: list[int] = []
    try:
        lines = _read_until(proc, "--keep-running")
        kids = _children(proc.pid)
        assert len(kids) == 2, kids
        gateway = next(re.search(r"gateway at (http://\S+)", line)[1] for line in lines  # type: ignore[index]
                       if line.startswith("gateway"))
        engine = next(re.search(r"servelens sim at (http://\S+)", line)[1] for line in lines  # type: ignore[index]
                      if line.startswith("engine"))
        assert (gateway, engine) == (f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{engine_port}")
        # the run is over (report written) and the gateway still serves its metrics for a dashboard
        assert (out / "report.html").exists()
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["trace"].endswith("azure_conv_2023_500.csv") and summary["succeeded"] > 0
        with urllib.request.urlopen(gateway + "/metrics", timeout=10) as resp:
            assert b"servelens_time_to_first_token_by_isl_seconds_bucket" in resp.read()
        proc.send_signal(signal.SIGINT)
        assert _wait_stopped(proc) == 0
        assert [k for k in kids if _running(k)] == []
    finally:
        _stop(proc, kids)


def _demo_in_process(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["demo", *argv])
    return rc, err.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["--duration", "nan"], "duration must be a finite number"),
    (["--duration", "0"], "duration must be a finite number"),
    (["--time-scale", "inf"], "time-scale must be a finite number"),
    (["--max-requests", "0"], "max-requests must be >= 1"),
    (["--speedup", "nan"], "speedup must be a finite number"),
    (["--speedup", "1e-300"], "speedup must be a finite number >= 0.001"),  # was the sim's refusal, once started
    (["--engine", "vllm", "--speedup", "2"], "--speedup applies to --engine sim only"),  # was ignored
    (["--engine", "llama.cpp", "--speedup", "2"], "--speedup applies to --engine sim only (llama.cpp runs"),
    (["--trace", "/nonexistent/trace.jsonl"], "trace file not found"),
    (["--trace", "/"], "--trace / is a folder"),  # was "[Errno 21] Is a directory", once both were up
    (["--output-dir", "/proc/version/o"], "cannot write to --output-dir /proc/version/o"),  # was "[Errno 20] ..."
    (["--engine-port", "8000"], "--engine-port applies to a trace replay (--trace), not to the story"),
    (["--trace", "azure_conv_2023_500.csv", "--gateway-port", "70000"], "gateway-port must be 0..65535"),
    (["--trace", "azure_conv_2023_500.csv", "--gateway-port", "8000", "--engine-port", "8000"],
     "engine-port and gateway-port must differ"),
])
def test_demo_bad_flags_are_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str
) -> None:
    def no_servers(*_a: Any, **_k: Any) -> None:
        raise AssertionError("a server was started for bad flags")

    monkeypatch.setattr("servelens.demo.ServerProcess", no_servers)
    rc, err = _demo_in_process("--output-dir", str(tmp_path / "o"), *argv)  # a later --output-dir wins
    assert rc == 2 and err.startswith("servelens: error:") and err.count("\n") == 1, err
    assert message in err, err


@pytest.mark.parametrize("engine, missing, extra", [
    ("vllm", "tokenizers", "tokenizers"), ("llama.cpp", "tokenizers", "llamacpp"), ("llama.cpp", "gguf", "llamacpp"),
])
def test_demo_real_engine_without_its_extra_names_the_pip_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: str, missing: str, extra: str
) -> None:
    """The README's ``servelens demo --engine vllm`` after a plain ``pip install -e .``: one line naming
    the extra, before any engine is installed, built or started (it was the gateway's exit status 2)."""
    import importlib.util

    from servelens.engines import llama_cpp, vllm_cpu

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))

    def no_engine(*_a: Any, **_k: Any) -> None:
        raise AssertionError("an engine was started without its packages")

    monkeypatch.setattr(vllm_cpu, "VllmServer", no_engine)
    monkeypatch.setattr(llama_cpp, "LlamaServer", no_engine)
    monkeypatch.setattr("servelens.demo.ServerProcess", no_engine)
    rc, err = _demo_in_process("--engine", engine, "--output-dir", str(tmp_path / "o"))
    assert rc == 2 and err.count("\n") == 1, err
    assert f"--engine {engine} needs the '{missing}' package" in err
    assert f"pip install -e '.[{extra}]'" in err and f"pip install 'servelens[{extra}]'" in err
    assert not (tmp_path / "o").exists()


def test_demo_engine_that_fails_to_start_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing:
        def __init__(self, *_a: Any, **_k: Any) -> None: ...

        def __enter__(self) -> None:
            raise ServerStartError("servelens sim exited with status 1: address in use")

        def __exit__(self, *_a: Any) -> None: ...

    monkeypatch.setattr("servelens.demo.ServerProcess", Failing)
    rc, err = _demo_in_process("--output-dir", str(tmp_path / "o"))
    assert rc == 2 and err == "servelens: error: servelens sim exited with status 1: address in use\n"


def test_demo_real_engine_that_fails_to_build_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real engine's harness error (a failed build step; its message has the log's tail on
    further lines) is one line naming the step and the log, before the gateway starts."""
    from servelens.engines import llama_cpp

    class Failing:
        def __init__(self, *_a: Any, **_k: Any) -> None: ...

        def __enter__(self) -> None:
            raise llama_cpp.LlamaHarnessError("cmake configure: exit status 1 (log: /x/build.log):\nCMake Error")

        def __exit__(self, *_a: Any) -> None: ...

    def no_gateway(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the gateway was started without an engine")

    monkeypatch.setattr(llama_cpp, "LlamaServer", Failing)
    monkeypatch.setattr("servelens.demo.ServerProcess", no_gateway)
    rc, err = _demo_in_process("--engine", "llama.cpp", "--output-dir", str(tmp_path / "o"))
    assert (rc, err) == (2, "servelens: error: cmake configure: exit status 1 (log: /x/build.log):\n")
