"""Reading an OpenAI request body (completions or chat completions) into a validated
:class:`Parsed` request, as vLLM reads it; bad input is a :class:`BadRequest` carrying the OpenAI
error's status, type and ``param``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servelens.sim.config import SimConfig
from servelens.sim.tokenizer import chat_prompt_tokens, tokenize


class BadRequest(Exception):
    """Client error with an OpenAI error object."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type_ = type_
        self.param = param


MAX_N = 128
"""The most choices (``n``) one request may ask for: each is an engine request of its own."""


@dataclass
class Parsed:
    """A validated request."""

    endpoint: str
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous: bool
    seed: int
    n: int = 1


def _int_field(obj: dict[str, Any], name: str, lo: int, default: int | None) -> int | None:
    v = obj.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{name}' must be an integer", param=name)
    if v < lo:
        raise BadRequest(f"'{name}' must be >= {lo}, got {v}", param=name)
    return v


def parse_request(obj: Any, endpoint: str, config: SimConfig) -> Parsed:
    """Validate an OpenAI request body. Raises :class:`BadRequest`."""
    if not isinstance(obj, dict):
        raise BadRequest("request body must be a JSON object")
    model = obj.get("model")
    if model is not None and model != config.model:
        raise BadRequest(f"The model `{model}` does not exist.", 404, "NotFoundError", "model")
    n = _int_field(obj, "n", 1, 1)
    assert n is not None
    if n > MAX_N:
        raise BadRequest(f"'n' must be <= {MAX_N}, got {n}", param="n")
    try:
        if endpoint == "chat_completions":
            messages = obj.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' must be a non-empty list", param="messages")
            ids = chat_prompt_tokens(messages)
        else:
            ids = prompt_ids(obj.get("prompt"))
    except ValueError as exc:
        raise BadRequest(str(exc), param="messages" if endpoint == "chat_completions" else "prompt") from None
    if not ids:  # as vLLM: "The decoder prompt cannot be empty"
        raise BadRequest("the prompt cannot be empty (0 tokens)",
                         param="messages" if endpoint == "chat_completions" else "prompt")
    max_tokens = _int_field(obj, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _int_field(obj, "max_tokens", 1, config.default_max_tokens)
    assert max_tokens is not None
    min_tokens = _int_field(obj, "min_tokens", 0, 0)
    assert min_tokens is not None
    if min_tokens > max_tokens:
        raise BadRequest(f"min_tokens ({min_tokens}) must be <= max_tokens ({max_tokens})", param="min_tokens")
    if len(ids) + max_tokens > config.max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {config.max_model_len} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the completion).",
            param="max_tokens")
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    so = obj.get("stream_options")
    if so is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object", param="stream_options")
    include_usage = bool(so and so.get("include_usage"))
    continuous = include_usage and bool(so and so.get("continuous_usage_stats"))
    seed = _int_field(obj, "seed", -(2**63), config.seed)
    assert seed is not None
    ignore_eos = obj.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("'ignore_eos' must be a boolean", param="ignore_eos")
    return Parsed(endpoint, ids, max_tokens, min_tokens, ignore_eos, stream, include_usage, continuous, seed, n)


_MAX_TOKEN_ID = 2**63 - 1  # ids are hashed as int64


def prompt_ids(prompt: Any) -> list[int]:
    """The token ids of a completions ``prompt``: a string (tokenized), a list of ids, or a list of
    one of those. Raises ValueError for anything else or an id outside int64."""
    if isinstance(prompt, str):
        return tokenize(prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t > _MAX_TOKEN_ID for t in prompt):
                raise ValueError(f"token ids must be in [0, {_MAX_TOKEN_ID}]")
            return list(prompt)
        if len(prompt) == 1:
            return prompt_ids(prompt[0])
        raise ValueError("'prompt' must be a string, a list of token ids, or a list with one of those")
    raise ValueError("'prompt' must be a string or a list of token ids")
