#!/usr/bin/env python3
"""Run NVIDIA Dynamo 1.6.1's OpenAI frontend and its simulated engine (the "mocker") locally.

Dynamo is the reference whose stock metrics servelens must match (issue 7). This harness:

- ``install``: pip-installs Dynamo 1.6.1 into its own venv (``.scratch/dynamo-venv`` by default),
  idempotently, as measured in the project notes: ``ai-dynamo`` and ``ai-dynamo-runtime`` with
  ``--no-deps`` (the full dependency set pulls ``aisimulate``, a stub that downloads from the
  network), then the few packages the frontend and the mocker import. No CUDA, no torch.
- builds a tiny local model directory for the mocker, which reads only the tokenizer and the
  config: a byte-level BPE tokenizer (vocab 4096) trained with ``tokenizers`` on the text of
  ``/usr/share/common-licenses``, a ChatML chat template and a small ``LlamaForCausalLM``-shaped
  ``config.json``.
- ``serve``: starts the mocker and the frontend with file-based discovery in a fresh folder per
  run, every host on 127.0.0.1, ``HF_HUB_OFFLINE=1``; waits until ``GET /v1/models`` lists the
  model; stops both with SIGTERM (SIGKILL after a timeout).
- ``run-in-netns -- CMD``: runs CMD in a private network namespace with only loopback
  (``unshare -rn`` then ``ip link set lo up``).

The mocker binds its ZMQ publisher sockets on 0.0.0.0 whatever the settings, so Dynamo, and
everything that talks to it, must run inside such a namespace; :func:`serve` refuses otherwise.

Library use (pytest)::

    from dynamo_harness import install, build_tiny_model, serve
    with serve(install(), build_tiny_model(path)) as stack:
        stack.frontend_url   # "http://127.0.0.1:<port>"

CLI::

    python scripts/dynamo_harness.py install
    python scripts/dynamo_harness.py run-in-netns -- \\
        python scripts/dynamo_harness.py serve -- sh -c 'curl -s "$DYNAMO_URL/v1/models"'
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DYNAMO_VERSION = "1.6.1"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO_ROOT / ".scratch" / "dynamo-venv"
DEFAULT_MODEL_DIR = REPO_ROOT / ".scratch" / "dynamo-tiny-model"
DEFAULT_MODEL_NAME = "tiny"
DEFAULT_MAX_MODEL_LEN = 32768

# The packages the frontend and the mocker import once ai-dynamo is installed without its deps
# (measured; pip's dependency-conflict warning about the rest is harmless).
RUNTIME_DEPS: tuple[str, ...] = (
    "pydantic>=2.10.6,<=2.13.5",
    "uvloop>=0.21.0",
    "packaging",
    "pyyaml",
    "msgspec>=0.19.0",
)
_INSTALL_MARKER = f".servelens-dynamo-{DYNAMO_VERSION}"

SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
TOKENIZER_VOCAB_SIZE = 4096
TOKENIZER_CORPUS_DIR = Path("/usr/share/common-licenses")


PIP_ATTEMPTS = 3
"""Tries of each pip step of :func:`install`."""
PIP_NETWORK_ENV = {"PIP_RETRIES": "10", "PIP_RESUME_RETRIES": "10", "PIP_TIMEOUT": "60"}
"""pip's retries, resumes of a cut download (pip 25.1+; older pips ignore it) and socket timeout."""


class HarnessError(RuntimeError):
    """Dynamo could not be installed, started or reached; the message says why."""


# --------------------------------------------------------------------------- install


def venv_python(venv: Path) -> Path:
    """The venv's interpreter path (``<venv>/bin/python``)."""
    return venv / "bin" / "python"


def installed(venv: Path = DEFAULT_VENV) -> bool:
    """Whether :func:`install` finished in ``venv`` (its marker file and the venv's python are there)."""
    venv = Path(venv)
    return (venv / _INSTALL_MARKER).exists() and venv_python(venv).exists()


def install(venv: Path = DEFAULT_VENV, quiet: bool = True) -> Path:
    """Install Dynamo 1.6.1 into ``venv`` unless it is already there; return the venv path.

    Idempotent: a marker file written after a successful install and import check short-cuts
    later calls. Raises HarnessError when a pip step or the import check fails.
    """
    venv = Path(venv)
    marker = venv / _INSTALL_MARKER
    if installed(venv):
        return venv
    py = venv_python(venv)
    if not py.exists():
        _run([sys.executable, "-m", "venv", str(venv)], "create the venv")
    q = ["-q"] if quiet else []
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    for key, value in PIP_NETWORK_ENV.items():  # pip's patience with the network, unless set already
        env.setdefault(key, value)
    _run([str(py), "-m", "pip", "install", *q, "--no-deps",
          f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"],
         "pip install ai-dynamo (--no-deps)", env=env, attempts=PIP_ATTEMPTS)
    _run([str(py), "-m", "pip", "install", *q, *RUNTIME_DEPS], "pip install Dynamo's runtime deps", env=env,
         attempts=PIP_ATTEMPTS)
    _run([str(py), "-c", "import dynamo.frontend, dynamo.mocker, dynamo.llm"], "import dynamo", env=env)
    marker.write_text(DYNAMO_VERSION + "\n")
    return venv


def _run(cmd: Sequence[str], what: str, env: dict[str, str] | None = None, attempts: int = 1) -> None:
    """Run ``cmd``, up to ``attempts`` tries (a pip download cut off mid-wheel fails the whole step;
    a fresh try usually gets it). Raises HarnessError with the output's tail after the last one."""
    attempts = max(1, attempts)
    for _ in range(attempts):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode == 0:
            return
    tail = (proc.stderr or proc.stdout)[-2000:]
    tries = f", {attempts} tries" if attempts > 1 else ""
    raise HarnessError(f"could not {what} (exit {proc.returncode}{tries}): {tail}")


# --------------------------------------------------------------------------- tiny model


def build_tiny_model(path: Path = DEFAULT_MODEL_DIR, max_position_embeddings: int = DEFAULT_MAX_MODEL_LEN) -> Path:
    """Write a tiny HF model directory the mocker can load (idempotent); return ``path``.

    Files: ``tokenizer.json`` (byte-level BPE, vocab 4096, trained on /usr/share/common-licenses,
    special tokens ``<unk> <s> </s> <pad> <|im_start|> <|im_end|>``), ``tokenizer_config.json``
    (ChatML chat template, eos ``<|im_end|>``) and ``config.json`` (LlamaForCausalLM-shaped; no
    weights: the mocker reads only the tokenizer and the config). Needs the ``tokenizers`` package
    in the calling interpreter. Raises HarnessError if the corpus folder is missing.
    """
    path = Path(path)
    files = [path / n for n in ("tokenizer.json", "tokenizer_config.json", "config.json")]
    if all(f.exists() for f in files):
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus = sorted(p for p in TOKENIZER_CORPUS_DIR.rglob("*") if p.is_file()) if TOKENIZER_CORPUS_DIR.is_dir() else []
    if not corpus:
        raise HarnessError(f"no tokenizer training text in {TOKENIZER_CORPUS_DIR}")
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in corpus], trainer)
    tmp = path / "tokenizer.json.tmp"
    tok.save(str(tmp))
    added = {
        str(tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    tokenizer_config = {
        "added_tokens_decoder": added,
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHATML_TEMPLATE,
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "bos_token_id": tok.token_to_id("<s>"),
        "eos_token_id": tok.token_to_id("<|im_end|>"),
        "pad_token_id": tok.token_to_id("<pad>"),
        "transformers_version": "4.56.0",
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}) + "\n")
    tmp.replace(path / "tokenizer.json")
    return path


# --------------------------------------------------------------------------- network namespace


def network_interfaces() -> list[str]:
    """Names of the network interfaces of this process's network namespace (/proc/self/net/dev;
    /sys/class/net would show the host's, since ``unshare -n`` does not remount sysfs)."""
    try:
        lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    except OSError:
        return []
    return sorted(line.split(":", 1)[0].strip() for line in lines if ":" in line)


def in_private_netns() -> bool:
    """True when the only network interface is ``lo`` (a private namespace made by ``unshare -rn``)."""
    return network_interfaces() == ["lo"]


NETNS_HINT = (
    "Dynamo's mocker binds sockets on 0.0.0.0, so it only runs inside a private network namespace "
    "with loopback alone; run e.g. `unshare -rn bash -c 'ip link set lo up && python -m pytest -q -m "
    "dynamo tests/engines'` or `python scripts/dynamo_harness.py run-in-netns -- CMD`"
)


def require_private_netns() -> None:
    """Raise HarnessError (with the command to use) unless in a private loopback-only namespace."""
    if not in_private_netns():
        raise HarnessError(f"not in a private network namespace (interfaces: {network_interfaces()}). {NETNS_HINT}")


def netns_command(cmd: Sequence[str]) -> list[str]:
    """``cmd`` wrapped to run in a fresh private network namespace with ``lo`` up."""
    return ["unshare", "-rn", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *cmd]


# --------------------------------------------------------------------------- serve


def free_port(below: int | None = None) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (``< below`` when given).

    Dynamo reads ``DYN_SYSTEM_PORT`` as a signed 16-bit int, so the mocker's system port must be
    below 32768, while the kernel's ephemeral range usually starts above it.
    Raises HarnessError when no port below ``below`` is free.
    """
    if below is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    start = 20000 + (os.getpid() * 7919) % max(1, below - 20000)
    for i in range(below - 20000):
        port = 20000 + (start - 20000 + i) % (below - 20000)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise HarnessError(f"no free TCP port on 127.0.0.1 in 20000..{below - 1}")


@dataclass(frozen=True)
class DynamoStack:
    """A running mocker + frontend.

    Attributes:
        frontend_url: ``http://127.0.0.1:<port>`` of the OpenAI frontend (/v1/*, /metrics).
        model: the served model name.
        model_dir: the HF model directory (its ``tokenizer.json`` is the bench's tokenizer).
        mocker_metrics_url: the mocker's system server (its own ``/metrics``).
        run_dir: the per-run folder (discovery files in ``kv/``, logs ``*.log``).
        frontend_pid, mocker_pid: process ids.
    """

    frontend_url: str
    model: str
    model_dir: Path
    mocker_metrics_url: str
    run_dir: Path
    frontend_pid: int
    mocker_pid: int

    def log_tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of both logs (for failure messages)."""
        return _log_tail(self.run_dir, chars)


def _log_tail(run_dir: Path, chars: int) -> str:
    parts = []
    for name in ("mocker.log", "frontend.log"):
        p = run_dir / name
        if p.exists():
            parts.append(f"--- {name}\n{p.read_text(errors='replace')[-chars:]}")
    return "\n".join(parts)


def dynamo_env(run_dir: Path, system_port: int | None = None) -> dict[str, str]:
    """The environment for both processes: file discovery in ``run_dir/kv``, every host 127.0.0.1."""
    env = dict(os.environ)
    env.update(
        DYN_DISCOVERY_BACKEND="file",
        DYN_FILE_KV=str(run_dir / "kv"),
        DYN_TCP_RPC_HOST="127.0.0.1",
        DYN_TCP_RESPONSE_STREAM_HOST="127.0.0.1",
        DYN_EVENT_PLANE_HOST="127.0.0.1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    if system_port is not None:
        env.update(DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT=str(system_port))
    env.pop("VIRTUAL_ENV", None)
    return env


def wait_for_model(url: str, model: str, timeout_s: float, procs: Sequence[subprocess.Popen[bytes]] = ()) -> None:
    """Poll ``GET url/v1/models`` until it lists ``model``; bounded by ``timeout_s``.

    Raises HarnessError on timeout or when one of ``procs`` exits first.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    tick = threading.Event()
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise HarnessError(f"a Dynamo process exited with {p.returncode} during startup")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                body = json.loads(resp.read())
            ids = [m.get("id") for m in body.get("data", [])]
            if model in ids:
                return
            last = f"models listed: {ids}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        tick.wait(0.05)  # next poll of the readiness condition; the loop is bounded by the deadline
    raise HarnessError(f"Dynamo frontend at {url} did not list model {model!r} within {timeout_s}s ({last})")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout_s)


@contextlib.contextmanager
def serve(
    venv: Path = DEFAULT_VENV,
    model_dir: Path = DEFAULT_MODEL_DIR,
    model_name: str = DEFAULT_MODEL_NAME,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    speedup_ratio: float = 1.0,
    frontend_port: int | None = None,
    startup_timeout_s: float = 60.0,
    stop_timeout_s: float = 10.0,
    extra_mocker_args: Sequence[str] = (),
    run_dir: Path | None = None,
) -> Iterator[DynamoStack]:
    """Start the mocker and the frontend, yield a :class:`DynamoStack` once the model is listed.

    Both processes get a fresh discovery folder (``DYN_FILE_KV=<run_dir>/kv``, emptied first when
    ``run_dir`` is given; default ``run_dir``: a new temporary folder, removed afterwards) and are
    stopped with SIGTERM on exit (SIGKILL to their process group after ``stop_timeout_s``), mocker
    first.

    Raises:
        HarnessError: not in a private network namespace, Dynamo not installed in ``venv``, or
            the model not listed within ``startup_timeout_s`` (the message has the log tails).
    """
    require_private_netns()
    py = venv_python(Path(venv))
    if not py.exists():
        raise HarnessError(f"Dynamo is not installed in {venv}: run `python scripts/dynamo_harness.py install`")
    own_dir = run_dir is None
    rd = Path(tempfile.mkdtemp(prefix="servelens-dynamo-")) if run_dir is None else Path(run_dir)
    # a fresh discovery folder: entries left by a SIGKILLed run would route requests to a dead worker
    shutil.rmtree(rd / "kv", ignore_errors=True)
    (rd / "kv").mkdir(parents=True)
    port = frontend_port or free_port()
    system_port = free_port(below=32768)
    env = dynamo_env(rd, system_port)
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        mlog = open(rd / "mocker.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(mlog)
        procs.append(subprocess.Popen(
            [str(py), "-m", "dynamo.mocker", "--model-path", str(model_dir), "--model-name", model_name,
             "--max-model-len", str(max_model_len), "--speedup-ratio", str(speedup_ratio),
             *extra_mocker_args],
            env=env, stdout=mlog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        ))
        fenv = dict(env)
        fenv.pop("DYN_SYSTEM_PORT", None)
        fenv.pop("DYN_SYSTEM_HOST", None)
        flog = open(rd / "frontend.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(flog)
        procs.append(subprocess.Popen(
            [str(py), "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port)],
            env=fenv, stdout=flog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        ))
        try:
            wait_for_model(url, model_name, startup_timeout_s, procs)
        except HarnessError as e:
            raise HarnessError(f"{e}\n{_log_tail(rd, 3000)}") from None
        yield DynamoStack(
            frontend_url=url, model=model_name, model_dir=Path(model_dir),
            mocker_metrics_url=f"http://127.0.0.1:{system_port}", run_dir=rd,
            frontend_pid=procs[1].pid, mocker_pid=procs[0].pid,
        )
    finally:
        for p in procs:  # mocker first: it removes its discovery entries on SIGTERM
            _stop(p, stop_timeout_s)
        for f in logs:
            f.close()
        if own_dir and os.environ.get("SERVELENS_KEEP_DYNAMO_LOGS") != "1":
            shutil.rmtree(rd, ignore_errors=True)


# --------------------------------------------------------------------------- CLI


def _cmd_install(args: argparse.Namespace) -> int:
    venv = install(Path(args.venv), quiet=not args.verbose)
    model = build_tiny_model(Path(args.model_dir))
    print(f"dynamo {DYNAMO_VERSION} in {venv}; tiny model in {model}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    venv = install(Path(args.venv))
    model_dir = build_tiny_model(Path(args.model_dir))
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]

    def _on_signal(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        with serve(venv, model_dir, args.model_name, args.max_model_len, args.speedup_ratio,
                   args.port or None) as stack:
            print(f"dynamo frontend listening on {stack.frontend_url} (model {stack.model!r}, "
                  f"tokenizer {model_dir / 'tokenizer.json'})", flush=True)
            if cmd:
                env = dict(os.environ, DYNAMO_URL=stack.frontend_url, DYNAMO_MODEL=stack.model,
                           DYNAMO_TOKENIZER=str(model_dir / "tokenizer.json"))
                return subprocess.call(cmd, env=env)
            signal.pause()
    except KeyboardInterrupt:
        return 0
    return 0


def _cmd_netns(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise HarnessError("run-in-netns needs a command after --")
    return subprocess.call(netns_command(cmd))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (see the module docstring); one-line errors, exit 2."""
    ap = argparse.ArgumentParser(prog="dynamo_harness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("install", help="install Dynamo 1.6.1 into its venv and build the tiny model")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=_cmd_install)
    p = sub.add_parser("serve", help="start mocker + frontend (inside a private netns); run CMD against it")
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    p.add_argument("--speedup-ratio", type=float, default=1.0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("cmd", nargs=argparse.REMAINDER,
                   help="-- CMD: run it with $DYNAMO_URL, $DYNAMO_MODEL, $DYNAMO_TOKENIZER set, then stop")
    p.set_defaults(func=_cmd_serve)
    p = sub.add_parser("run-in-netns", help="run CMD in a private network namespace with only lo")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD")
    p.set_defaults(func=_cmd_netns)
    args = ap.parse_args(argv)
    try:
        return int(args.func(args))
    except HarnessError as e:
        first = str(e).splitlines()[0] if str(e) else "error"
        print(f"dynamo_harness: error: {first}", file=sys.stderr)
        rest = "\n".join(str(e).splitlines()[1:])
        if rest:
            print(rest, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "DEFAULT_MODEL_DIR",
    "DEFAULT_MODEL_NAME",
    "DEFAULT_VENV",
    "DYNAMO_VERSION",
    "DynamoStack",
    "HarnessError",
    "build_tiny_model",
    "dynamo_env",
    "free_port",
    "in_private_netns",
    "install",
    "netns_command",
    "require_private_netns",
    "serve",
    "wait_for_model",
]
