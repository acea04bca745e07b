"""What every real-engine harness needs to install and build: scratch and cache folders, the
environment of its subprocesses, logged build steps with retries, a lock for a shared cache.

:mod:`servelens.engines.vllm_cpu` and :mod:`servelens.engines.llama_cpp` are built on this module
and on :mod:`servelens.engines.server` (the engine's server process: start, health, stop).

Folders:

- the *scratch* folder (per checkout): ``$SERVELENS_SCRATCH``, else ``<repo>/.scratch`` (git
  ignores it), else ``./.scratch``; it holds HOME, TMPDIR, pip's cache and the logs of every
  subprocess, so nothing lands in the user's home directory or /tmp.
- the *cache* folder (per machine, shared by checkouts): ``$SERVELENS_CACHE``, else
  ``$XDG_CACHE_HOME/servelens``, else ``~/.cache/servelens``; for builds worth keeping across clean
  clones (keyed by version by whoever writes there).

Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PIP_ATTEMPTS = 3
"""Tries of each pip step (a download cut off mid-wheel fails pip as a whole)."""

PIP_NETWORK_ENV = {"PIP_RETRIES": "10", "PIP_RESUME_RETRIES": "10", "PIP_TIMEOUT": "60"}
"""pip's own patience: connection retries, resumes of a cut download (pip 25.1+; older pips ignore
the variable) and a 60 s socket timeout instead of 15 s."""

class HarnessError(RuntimeError):
    """Installing, building or starting an engine failed; the message names the step and its log."""


def default_scratch() -> Path:
    """The scratch folder: ``$SERVELENS_SCRATCH``, else ``<repo>/.scratch`` for a source checkout
    (the folder holding ``pyproject.toml`` above this file), else ``./.scratch``."""
    env = os.environ.get("SERVELENS_SCRATCH")
    if env:
        return Path(env).resolve()
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file():
        return repo / ".scratch"
    return Path.cwd().resolve() / ".scratch"


def default_cache() -> Path:
    """The machine-wide cache folder: ``$SERVELENS_CACHE``, else ``$XDG_CACHE_HOME/servelens``,
    else ``~/.cache/servelens`` (outside any checkout, so a clean clone finds earlier builds)."""
    env = os.environ.get("SERVELENS_CACHE")
    if env:
        return Path(env).resolve()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return (base / "servelens").resolve()


@dataclass(frozen=True)
class ScratchPaths:
    """The folders every harness writes under ``scratch``."""

    scratch: Path

    @property
    def home(self) -> Path:
        return self.scratch / "home"

    @property
    def tmp(self) -> Path:
        return self.scratch / "tmp"

    @property
    def cache(self) -> Path:
        return self.scratch / "cache"

    @property
    def pip_cache(self) -> Path:
        return self.scratch / "pip-cache"

    @property
    def logs(self) -> Path:
        return self.scratch / "logs"


def scratch_base_env(paths: ScratchPaths, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a harness subprocess: HOME, TMPDIR, the XDG folders and pip's cache under
    the scratch folder (created), Hugging Face offline, unbuffered Python, no ``PYTHONPATH`` or
    ``VIRTUAL_ENV`` from the caller. ``base`` defaults to ``os.environ``."""
    env = dict(os.environ if base is None else base)
    for d in (paths.home, paths.tmp, paths.cache, paths.pip_cache):
        d.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(paths.home),
        TMPDIR=str(paths.tmp),
        XDG_CACHE_HOME=str(paths.cache),
        XDG_CONFIG_HOME=str(paths.home / ".config"),
        XDG_DATA_HOME=str(paths.home / ".local" / "share"),
        PIP_CACHE_DIR=str(paths.pip_cache),
        HF_HOME=str(paths.cache / "huggingface"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def pip_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (a :func:`scratch_base_env`) made fit for pip: pip still reads the user's own
    configuration (index mirrors, ``find-links``) from the real ``HOME``/``XDG_CONFIG_HOME``, and
    writes only to its cache (``PIP_CACHE_DIR``) and ``TMPDIR``; no version check; pip's network
    patience (:data:`PIP_NETWORK_ENV`) unless the user set it."""
    out = dict(env)
    for key in ("HOME", "XDG_CONFIG_HOME"):
        if key in os.environ:
            out[key] = os.environ[key]
        else:
            out.pop(key, None)
    out["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for key, value in PIP_NETWORK_ENV.items():
        out.setdefault(key, value)
    return out


def run_step(
    cmd: Sequence[str],
    env: Mapping[str, str],
    log: Path,
    step: str,
    timeout_s: float,
    attempts: int = 1,
    *,
    cwd: Path | None = None,
    error: type[HarnessError] = HarnessError,
) -> None:
    """Run ``cmd`` with its output appended to ``log``; up to ``attempts`` tries (at least one) while
    it exits non-zero; a try that runs past ``timeout_s`` ends the step.

    Downloads use a retry: a wheel cut off mid-transfer (CI saw a 286 MB triton wheel stop at
    221 MB six times in a row) fails pip, and a fresh try usually gets it; what pip finished is in
    its cache by then. Raises ``error`` (a :class:`HarnessError`) after the last failed try, with
    the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}" + (f"   # try {attempt} of {attempts}" if attempts > 1 else "") + "\n")
            fh.flush()
            try:
                proc = subprocess.run(
                    list(cmd), env=dict(env), cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise error(f"{step}: timed out after {timeout_s:.0f} s (log: {log})") from None
            except OSError as exc:  # the program is missing or not executable
                raise error(f"{step}: cannot run {cmd[0]}: {exc.strerror or exc} (log: {log})") from None
        if proc.returncode == 0:
            return
    tries = f", {attempts} tries" if attempts > 1 else ""
    raise error(f"{step}: exit status {proc.returncode}{tries} (log: {log}):\n{log_tail(log)}")


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created) for the block: two CI runs on one machine
    building into the same cache take turns; the second then finds the first one's build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
