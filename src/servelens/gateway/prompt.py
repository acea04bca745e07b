"""Counting prompt tokens at arrival with a local ``tokenizer.json`` (the ``tokenizers`` library).

This assigns the ISL bucket before the first token (source ``tokenizer``). It is an estimate
for chat requests: the message texts are joined with newlines and the chat template's own
tokens are not added (a few tokens per message), so a prompt within a few tokens of a bucket
boundary can land in the neighbouring bucket. For completions the prompt text is tokenized
as is; a prompt given as token ids is counted exactly.
"""

from __future__ import annotations

from typing import Any


class PromptCounter:
    """Counts prompt tokens of a request body. Raises ValueError if the file cannot be loaded.

    :meth:`count` may run in a worker thread: the tokenizer releases the GIL while it encodes.
    """

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - tokenizers is a declared extra
            raise ValueError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:  # the library raises its own exception type
            raise ValueError(f"cannot load tokenizer {path}: {exc}") from None

    def _count_text(self, text: str) -> int:
        # encode_batch releases the GIL while it works (encode holds it: run in a worker thread,
        # a long prompt would stall the gateway's event loop for the whole encoding)
        return len(self._tok.encode_batch([text], add_special_tokens=False)[0].ids)

    def count(self, obj: dict[str, Any]) -> int | None:
        """Prompt tokens of a chat or completions request body, or None when there is no prompt."""
        messages = obj.get("messages")
        if isinstance(messages, list):
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
