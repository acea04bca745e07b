"""The bytes of OpenAI stream chunks (chat and completions: role, tokens, tool calls, reasoning,
the final usage chunk) built from pre-encoded pieces, and the usage object.

With ``n`` > 1 every chunk carries one choice (its ``index``); continuous usage on a chunk is that
choice's own cumulative ``completion_tokens``, and the final usage chunk the sum over the choices,
as vLLM does (``serving_chat.py``: ``previous_num_tokens[i]`` per chunk, their sum at the end).
"""

from __future__ import annotations

from typing import Any

import msgspec

from servelens.sim.faults import FaultPlan
from servelens.sim.request import Parsed

_enc = msgspec.json.Encoder()


def usage_object(isl: int, osl: int, cached: int | None, null_details: bool = False) -> dict[str, Any]:
    """A usage object; ``prompt_tokens_details`` is ``null`` with ``null_details``, absent when
    ``cached`` is None (prefix cache off, or not admitted yet)."""
    u: dict[str, Any] = {"prompt_tokens": isl, "total_tokens": isl + osl, "completion_tokens": osl}
    if null_details:
        u["prompt_tokens_details"] = None
    elif cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


class ChunkBuilder:
    """Builds chunk payloads (bytes) for one streamed request with pre-encoded pieces."""

    def __init__(self, p: Parsed, rid: str, model: str, created: int, plan: FaultPlan, cache_on: bool) -> None:
        self.chat = p.endpoint == "chat_completions"
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        self.head = (b'{"id":' + _enc.encode(rid) + b',"object":"' + obj.encode() + b'","created":'
                     + str(created).encode() + b',"model":' + _enc.encode(model) + b',"choices":[')
        self.p = p
        self.isl = len(p.prompt_ids)
        self.cache_on = cache_on
        self.reasoning = self.chat and "reasoning" in plan
        self.tools = self.chat and "tool_calls" in plan
        self.null_details = "null_details" in plan
        self._call_id = "call_" + rid[-12:]

    def call_id(self, index: int = 0) -> str:
        """The tool call's id in choice ``index`` (``tool_calls`` fault)."""
        return self._call_id if index == 0 else f"{self._call_id}_{index}"

    def _usage_tail(self, osl: int, cached: int | None, final: bool = False) -> bytes:
        if not self.p.include_usage:
            return b"}"
        if self.p.continuous or final:
            usage = usage_object(self.isl, osl, cached if self.cache_on else None, self.null_details)
            return b',"usage":' + _enc.encode(usage) + b"}"
        return b',"usage":null}'

    def role(self, index: int = 0) -> bytes:
        """The role-only first chat chunk of choice ``index``."""
        return (self.head + b'{"index":' + str(index).encode() + b',"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}]' + self._usage_tail(0, None))

    def tokens(self, text: str, first: bool, last: bool, finish: str | None, osl: int, cached: int,
               index: int = 0) -> bytes:
        """A chunk of choice ``index`` carrying ``text`` (one or more tokens); ``finish`` on its last
        one; ``osl``: the choice's tokens so far (its continuous usage)."""
        fr = b"null" if finish is None else _enc.encode(finish)
        head = b'{"index":' + str(index).encode()
        if not self.chat:
            choice = (head + b',"text":' + _enc.encode(text) + b',"logprobs":null,"finish_reason":' + fr
                      + b',"stop_reason":null}]')
        else:
            if self.tools:
                args = ('{"text": "' if first else "") + text + ('"}' if last else "")
                call: dict[str, Any] = {"index": 0, "function": {"arguments": args}}
                if first:
                    call = {"index": 0, "id": self.call_id(index), "type": "function",
                            "function": {"name": "lookup", "arguments": args}}
                delta = b'{"tool_calls":' + _enc.encode([call]) + b"}"
            elif self.reasoning:
                delta = b'{"reasoning_content":' + _enc.encode(text) + b"}"
            else:
                delta = b'{"content":' + _enc.encode(text) + b"}"
            choice = head + b',"delta":' + delta + b',"logprobs":null,"finish_reason":' + fr + b"}]"
        return self.head + choice + self._usage_tail(osl, cached)

    def usage_chunk(self, osl: int, cached: int) -> bytes:
        """The final ``choices: []`` chunk with the whole usage (``osl``: the sum over the choices)."""
        return self.head + b"]" + self._usage_tail(osl, cached, final=True)
