"""Prompt tokens at arrival (servelens.gateway.prompt): with a chat template the rendered prompt is
counted, special tokens as one token each; without one the bound is the template's own tokens."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from servelens.gateway.prompt import ChatTemplate, PromptCounter
from servelens.gateway.testing import FAKE_MODEL, ScriptedUpstream, run_gateway

CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '<|im_start|>system\\nbe kind"
          "<|im_end|>\\n' }}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if tools %}{{ 'tools: ' + tools | map(attribute='function.name') | join(' ') + '\\n' }}"
          "{% endif %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture
def tokenizer(tmp_path: Path) -> str:
    """Words split on whitespace and punctuation; ``<|im_start|>`` and ``<|im_end|>`` special tokens."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def config_file(tmp_path: Path, **extra: object) -> str:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": CHATML, "bos_token": "<s>", "eos_token": "<|im_end|>", **extra}))
    return str(path)


def test_the_rendered_prompt_is_counted_special_tokens_as_one(tokenizer: str, tmp_path: Path) -> None:
    body = {"messages": [{"role": "user", "content": "one two three"}]}
    plain = PromptCounter(tokenizer)
    templated = PromptCounter(tokenizer, config_file(tmp_path))
    assert plain.count(body) == 3
    # <|im_start|> system be kind <|im_end|> <|im_start|> user one two three <|im_end|> <|im_start|> assistant
    assert templated.count(body) == 13
    with_bos = PromptCounter(tokenizer, config_file(tmp_path, add_bos_token=True))
    assert with_bos.count(body) == 14, "the engine's own BOS"
    tools = [{"type": "function", "function": {"name": "ls"}}, {"type": "function", "function": {"name": "cd"}}]
    assert templated.count({**body, "tools": tools}) == 13 + 4  # "tools", ":", "ls", "cd"
    jinja = tmp_path / "t.jinja"
    jinja.write_text(CHATML)
    assert PromptCounter(tokenizer, str(jinja)).count(body) == 13
    assert templated.count({"prompt": "a b"}) == 2, "completions: the prompt as it is"


def test_a_template_failing_on_a_request_falls_back_to_the_text_count(tokenizer: str, tmp_path: Path) -> None:
    path = tmp_path / "strict.jinja"
    path.write_text("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
                    "<|im_start|>{{ messages[0]['content'] }}")
    counter = PromptCounter(tokenizer, str(path))
    assert counter.count({"messages": [{"role": "user", "content": "a b"}]}) == 3
    assert counter.count({"messages": [{"role": "system", "content": "a b"}]}) == 2  # raised: without template
    assert counter.count({"messages": [{"role": "user"}]}) == 1  # no content: the template renders it empty


def test_bad_templates_are_one_line_errors(tokenizer: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="chat template does not parse"):
        PromptCounter(tokenizer, str(broken))
    none = tmp_path / "tokenizer_config.json"
    none.write_text('{"bos_token": "<s>"}')
    with pytest.raises(ValueError, match="no chat_template in it"):
        PromptCounter(tokenizer, str(none))
    with pytest.raises(ValueError, match="cannot read chat template"):
        ChatTemplate.from_file(str(tmp_path / "missing.jinja"))


def test_named_templates_take_default(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"},
                                                  {"name": "default", "template": "D{{ bos_token }}"}],
                                "bos_token": {"content": "<s>", "special": True}}))
    assert ChatTemplate.from_file(str(path)).render([]) == "D<s>"


async def test_the_gateway_buckets_a_chat_prompt_by_its_rendered_length(
    fake: ScriptedUpstream, tokenizer: str, tmp_path: Path
) -> None:
    """505 words of text: bucket 0-512 by the text, 513-1024 once the template's 10 tokens are in."""
    fake.usage_style = "vllm"
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": " ".join(["w"] * 505)}], "max_tokens": 2,
            "stream": True}
    got = {}
    for name, template in (("plain", None), ("templated", config_file(tmp_path))):
        async with run_gateway(fake.url, tokenizer=tokenizer, chat_template=template, inject_usage=False) as gw, \
                aiohttp.ClientSession() as s:  # fmt: skip
            async with s.post(gw.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
            await gw.gateway.wait_finished(1)
            st = gw.metrics.state.models[FAKE_MODEL]
            assert st.by_isl is not None
            got[name] = {label: b.ttft.count for label, b in st.by_isl.items() if b.ttft.count}
    assert got == {"plain": {"0-512": 1}, "templated": {"513-1024": 1}}


async def test_a_chat_template_needs_a_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chat_template needs a tokenizer"):
        async with run_gateway("http://127.0.0.1:9", chat_template=config_file(tmp_path)):
            pass
