"""Counting prompt tokens at arrival with a local ``tokenizer.json`` (the ``tokenizers`` library).

This assigns the ISL bucket before the first token (source ``tokenizer``). Chat requests:

* with a chat template (``--chat-template``: the model's Jinja template, or a Hugging Face
  ``tokenizer_config.json`` holding one), the messages (and ``tools``) are rendered as the engine
  renders them (``add_generation_prompt``, the config's ``bos_token``/``eos_token``) and the rendered
  text is counted, special tokens matched as single tokens: exactly the engine's prompt tokens when
  it serves with that template (llama-server with ``--jinja``, vLLM, SGLang); plus one when the
  config says the engine adds BOS itself (``add_bos_token``).
* without one, the message texts are joined with newlines and the template's own tokens are missing:
  the count is low by the template's tokens (role markers, a default system prompt: 30 tokens for
  SmolLM2 around one user message, about 5 per further message), so a prompt within that many tokens
  below a bucket boundary lands in the bucket below.

For completions the prompt text is tokenized as is; a prompt given as token ids is counted exactly.
A template that fails on a request (it raises, or the messages are not what it expects) falls back
to the count without template for that request.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any


class ChatTemplate:
    """A Jinja chat template rendered as Hugging Face's ``apply_chat_template`` renders it (sandboxed,
    ``trim_blocks``, ``lstrip_blocks``; ``raise_exception`` and ``strftime_now`` defined).

    Args:
        source: the template text.
        bos_token, eos_token: the strings the template may write as ``bos_token``/``eos_token``.
        add_bos: the engine puts a BOS token before the rendered text itself (counted as one token).

    Raises ValueError for a template that does not parse.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", add_bos: bool = False) -> None:
        try:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:  # pragma: no cover - jinja2 is in the tokenizers extra
            raise ValueError("--chat-template needs the 'jinja2' package (pip install jinja2)") from None

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ValueError(f"chat template does not parse: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos

    @classmethod
    def from_file(cls, path: str) -> ChatTemplate:
        """A ``tokenizer_config.json`` (its ``chat_template``, ``bos_token``, ``eos_token``,
        ``add_bos_token``; a name-to-template list takes ``default``) or, any other name, a Jinja file.
        Raises ValueError when the file cannot be read or holds no template."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read chat template {path}: {exc}") from None
        if p.suffix != ".json":
            return cls(text)
        try:
            config = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not JSON: {exc}") from None
        template = config.get("chat_template") if isinstance(config, dict) else None
        if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) or not template:
            raise ValueError(f"{path}: no chat_template in it")

        def token(name: str) -> str:
            v = config.get(name)
            if isinstance(v, dict):  # {"content": "<s>", ...} (AddedToken as saved by transformers)
                v = v.get("content")
            return v if isinstance(v, str) else ""

        return cls(template, token("bos_token"), token("eos_token"), config.get("add_bos_token") is True)

    def render(self, messages: list[Any], tools: Any = None) -> str:
        """The prompt text for ``messages`` (and ``tools``), ending with the assistant's turn opened.
        Raises ValueError when the template fails on them."""
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, tools=tools or None, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except (TemplateError, TypeError, KeyError, AttributeError, IndexError, ValueError) as exc:
            raise ValueError(f"chat template failed: {type(exc).__name__}: {exc}") from None


class PromptCounter:
    """Counts prompt tokens of a request body. Raises ValueError if the tokenizer (or the chat
    template, ``chat_template``: a path as :meth:`ChatTemplate.from_file` reads) cannot be loaded.

    :meth:`count` may run in a worker thread: the tokenizer releases the GIL while it encodes.
    """

    def __init__(self, path: str, chat_template: str | None = None) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - tokenizers is a declared extra
            raise ValueError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:  # the library raises its own exception type
            raise ValueError(f"cannot load tokenizer {path}: {exc}") from None
        self.template = ChatTemplate.from_file(chat_template) if chat_template else None

    def _count_text(self, text: str) -> int:
        # encode_batch releases the GIL while it works (encode holds it: run in a worker thread,
        # a long prompt would stall the gateway's event loop for the whole encoding)
        return len(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def count(self, obj: dict[str, Any]) -> int | None:
        """Prompt tokens of a chat or completions request body, or None when there is no prompt."""
        messages = obj.get("messages")
        if isinstance(messages, list):
            if self.template is not None:
                try:
                    text = self.template.render(messages, obj.get("tools"))
                except ValueError:
                    pass  # counted without the template below
                else:
                    return self._count_text(text) + self.template.add_bos
            parts: list[str] = []
            for m in messages:
                if not isinstance(m, dict):
                    continue
                content = m.get("content")
                if isinstance(content, str):
                    parts.append(content)
                elif isinstance(content, list):
                    parts.extend(
                        p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                    )
            return self._count_text("\n".join(parts))
        prompt = obj.get("prompt")
        if isinstance(prompt, str):
            return self._count_text(prompt)
        if isinstance(prompt, list) and prompt:
            if all(isinstance(t, int) for t in prompt):
                return len(prompt)
            if isinstance(prompt[0], str):
                return self._count_text(prompt[0])  # a batch: the first prompt
            if isinstance(prompt[0], list):
                return len(prompt[0])
        return None
