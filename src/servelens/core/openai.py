"""Reading OpenAI-compatible responses: output-bearing chunks, usage, cached tokens, errors.

Formats: OpenAI Chat Completions / Completions streaming chunks (``chat.completion.chunk``,
``text_completion``) and whole responses, plus the extensions of vLLM, SGLang and Dynamo
(``reasoning_content``/``reasoning`` deltas, ``continuous_usage_stats``,
``prompt_tokens_details.cached_tokens``). No I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

_decode = msgspec.json.Decoder().decode


def decode_json(data: bytes | str) -> Any:
    """Decode JSON (any value) with msgspec; what msgspec refuses but Python's ``json`` module (which
    vLLM's and most Python engines' request parsing uses) accepts is decoded by the latter: escaped
    lone surrogates (``"\\ud800"``), ``NaN``/``Infinity``, UTF-16 and UTF-32, a byte order mark.
    Raises ``msgspec.DecodeError`` for invalid JSON, including JSON nested too deeply to decode."""
    return decode_json_strictness(data)[0]


def decode_json_strictness(data: bytes | str) -> tuple[Any, bool]:
    """:func:`decode_json`, and whether the text is strict JSON in UTF-8 (False when only Python's
    ``json`` module accepted it: such a text is not safe to edit as UTF-8 bytes or to re-encode,
    which would turn ``NaN`` into ``null``). Raises ``msgspec.DecodeError`` as :func:`decode_json`."""
    try:
        return _decode(data), True
    except RecursionError:
        raise msgspec.DecodeError("JSON is nested too deeply") from None
    except msgspec.DecodeError as exc:
        try:
            return json.loads(data), False
        except (ValueError, RecursionError):
            raise exc from None


@dataclass(slots=True)
class Usage:
    """Token usage as an OpenAI ``usage`` object reports it (tokens); made per chunk with
    continuous usage, so not frozen (treat it as read-only; not hashable).

    ``cached_tokens`` is ``usage.prompt_tokens_details.cached_tokens``; None when absent or null
    (unknown, which is not the same as 0).
    """

    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None = None


@dataclass(slots=True)
class ChunkInfo:
    """What one SSE ``data:`` payload says (one is made per streamed chunk: not frozen, whose
    ``__init__`` costs a call per field; treat it as read-only; not hashable).

    Attributes:
        done: the ``[DONE]`` sentinel.
        malformed: the payload was not a JSON object.
        has_output: carries generated output (content, reasoning content, a tool-call delta, or
            completion text); a role-only chunk or empty content is not output.
        first_output: the first choice carries output (``index`` 0; also a missing ``index`` or one
            that is not an integer > 0).
        outputs: how many choices carry output.
        several_choices: a choice with an ``index`` other than 0 is present (a request with
            ``n`` > 1: each chunk normally carries one choice's delta, the choices interleaved).
        choices: how many choices (objects in ``choices``) the chunk carries.
        first_choice: one of them is the first choice (``index`` 0, as for ``first_output``).
        finish_reason: the first non-null ``finish_reason`` among the choices.
        usage: the chunk's usage (None when absent or null).
        error: the message of an in-stream error: an ``error`` object (OpenAI), a payload with
            ``"object": "error"`` (vLLM's ``ErrorResponse``), or any payload of an SSE ``event: error``;
            else None.
        obj: the decoded object (None when malformed or done).
    """

    done: bool = False
    malformed: bool = False
    has_output: bool = False
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
    obj: dict[str, Any] | None = None
    first_output: bool = False
    outputs: int = 0
    several_choices: bool = False
    choices: int = 0
    first_choice: bool = False


def choice_index(choice: dict[str, Any]) -> int:
    """A choice's ``index``: an int > 0 as it is, anything else (0, absent, junk) the first choice, 0."""
    index = choice.get("index")
    return index if type(index) is int and index > 0 else 0


MAX_TOKEN_COUNT = 2**31 - 1
"""The largest token count believed in a ``usage`` object (2,147,483,647): engines keep token counts in
32-bit integers (llama.cpp's ``int32_t``, vLLM's int32 token arrays), and no model's context comes
within a hundredfold of it (the longest are ~10 million tokens). A count above it is junk."""


def _count(value: Any) -> int | None:
    """A token count: an int from 0 to :data:`MAX_TOKEN_COUNT` (not a bool), else None (unknown)."""
    return value if type(value) is int and 0 <= value <= MAX_TOKEN_COUNT else None


def parse_usage(obj: Any) -> Usage | None:
    """Read an OpenAI ``usage`` object (dict) into :class:`Usage`; None when not a dict.

    A count that is not an integer from 0 to :data:`MAX_TOKEN_COUNT` (negative, absurdly large, a bool,
    a float, a string) is unknown (None), so junk from an upstream never reaches a histogram or a
    counter: an unknown ``completion_tokens`` leaves OSL to the counted output chunks, an unknown
    ``prompt_tokens`` leaves the request without an ISL bucket (docs/counting.md).
    """
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_count(obj.get("prompt_tokens")),
        completion_tokens=_count(obj.get("completion_tokens")),
        cached_tokens=_count(cached),
    )


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message")
        return str(msg) if msg is not None else str(err)
    return str(err)


def _choice_has_output(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    if isinstance(delta, dict):
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
        return bool(delta.get("tool_calls") or delta.get("function_call"))
    # completions chunk
    if choice.get("text"):
        return True
    message = choice.get("message")  # a whole chat response
    if isinstance(message, dict):
        return bool(
            message.get("content") or message.get("reasoning_content") or message.get("tool_calls")
        )
    return False


def _event_error(data: str | bytes) -> str:
    """The message of an SSE ``event: error``: its JSON ``error``/``message`` when it has one, else its text."""
    try:
        obj = decode_json(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        obj = None
    if isinstance(obj, dict):
        err = obj.get("error")
        if err is not None:
            return _error_text(err)
        if obj.get("message") is not None:
            return str(obj["message"])
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text or "(empty error event)"


def parse_chunk(data: str | bytes, event: str | None = None) -> ChunkInfo:
    """Interpret one SSE ``data`` payload of an OpenAI-compatible stream; ``event``: the block's SSE
    ``event:`` field, if any (``error`` makes the payload an error, whatever it holds).

    In-stream errors (``error`` set): an ``event: error``; an ``error`` object (OpenAI, vLLM's
    ``create_streaming_error_response``); ``"object": "error"`` with a ``message`` (vLLM's
    ``ErrorResponse``, the shape of its error replies and of older versions' in-stream errors).

    Never raises: bad JSON, or JSON nested too deeply to decode, gives ``ChunkInfo(malformed=True)``.
    """
    if event == "error":
        return ChunkInfo(error=_event_error(data))
    if data == "[DONE]" or data == b"[DONE]":
        return ChunkInfo(done=True)
    try:
        obj = decode_json(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return ChunkInfo(malformed=True)
    if not isinstance(obj, dict):
        return ChunkInfo(malformed=True)
    if "error" in obj and obj["error"] is not None:
        return ChunkInfo(error=_error_text(obj["error"]), obj=obj)
    if obj.get("object") == "error":
        return ChunkInfo(error=_error_text(obj), obj=obj)
    outputs = n_choices = 0
    first = several = has_first = False
    finish: str | None = None
    choices = obj.get("choices")
    if isinstance(choices, list):
        for ch in choices:
            if isinstance(ch, dict):
                n_choices += 1
                other = choice_index(ch) > 0
                if other:
                    several = True
                else:
                    has_first = True
                if _choice_has_output(ch):
                    outputs += 1
                    if not other:
                        first = True
                fr = ch.get("finish_reason")
                if fr and finish is None:
                    finish = str(fr)
    usage = obj.get("usage")
    return ChunkInfo(
        has_output=outputs > 0,
        finish_reason=finish,
        usage=parse_usage(usage) if usage is not None else None,
        obj=obj,
        first_output=first,
        outputs=outputs,
        several_choices=several,
        choices=n_choices,
        first_choice=has_first,
    )


def parse_response(body: bytes | str) -> ChunkInfo:
    """Interpret a whole (non-streaming) response body; same fields as :func:`parse_chunk`."""
    return parse_chunk(body)


def error_body(message: str, type_: str, code: int | str | None = None, param: str | None = None) -> bytes:
    """An OpenAI error object ``{"error": {"message", "type", "param", "code"}}`` as JSON bytes.

    Text echoing a client's lone surrogate (``"\\ud800"``, which :func:`decode_json` lets in) is
    written as a ``\\uXXXX`` escape, as the client sent it (never a UnicodeEncodeError)."""
    obj = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    try:
        return msgspec.json.encode(obj)
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()
