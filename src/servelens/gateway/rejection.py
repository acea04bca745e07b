"""Reading an upstream's 400/422 to a request the gateway (or the middleware) added usage to (pure).

The gateway adds ``stream_options.include_usage`` and ``continuous_usage_stats`` to streams
(:mod:`.usage`). A strict server refuses a field it does not know; an ordinary bad request (a chat
request without ``messages``) is refused too, and FastAPI's 422 and vLLM's validation 400 echo the
whole request in their error, what was added included. So naming the field somewhere in the body
says nothing: what matters is whether the error *blames* it.

:func:`read_rejection` reads the shapes in which servers blame a field:

* FastAPI/pydantic's 422: ``{"detail": [{"loc": ["body", "stream_options", ...], "msg", "input"}]}``;
  the ``input`` echoes the request and is not read;
* vLLM's validation 400: ``{"error": {"message": "1 validation error:\\n  {'type': 'missing', 'loc':
  ('body', 'messages'), ..., 'input': {...}}", "param": "body.messages"}}``: the ``loc`` tuples of
  pydantic's errors as Python writes them, in the message, and ``param`` (older vLLM: no ``param``,
  the same ``loc`` tuples in the message);
* OpenAI's: ``{"error": {"message", "param": "stream_options.continuous_usage_stats"}}``.

When the error has any of these (a ``loc`` or a ``param``), the field is blamed only when one of
them names it. Otherwise (an error in words: ``"Unrecognized request argument supplied:
continuous_usage_stats"``) it is blamed when the error's message names it, as before.

What the caller does (:attr:`Rejection.resend`): a blamed ``continuous_usage_stats`` -> send the
request again without it (``include_usage`` kept, so the request still gets its usage); a blamed
``stream_options`` -> send the client's own body; not blamed, but the error shows what was added (an
echo) -> send the client's own body too, so the client gets the answer to the request it sent, not
one quoting fields it never sent; otherwise relay the answer as it is (one request upstream). An
upstream is taken to refuse a field only when the error blamed it *and* the request sent without
it was not refused (``_stream`` in :mod:`.measured`, ``_measure`` in :mod:`servelens.asgi.middleware`):
a wrong reading costs one request sent twice, never the usage of every later request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from servelens.core.openai import decode_json
from servelens.gateway.usage import Injection

CONTINUOUS = "continuous_usage_stats"
STREAM_OPTIONS = "stream_options"
RESEND_WITHOUT_CONTINUOUS = "continuous_usage_stats"
RESEND_CLIENTS_BODY = "client"

_PY_LOC = re.compile(r"""['"]loc['"]\s*:\s*[(\[]([^)\]]*)[)\]]""")
"""A ``loc`` of pydantic's errors written in a message: ``'loc': ('body', 'messages')`` (Python's repr, as
vLLM writes them) or ``"loc": ["body", "messages"]`` (JSON in text)."""
_SEGMENT = re.compile(r"""['"]([^'"]*)['"]|(\d+)""")


@dataclass(frozen=True)
class Rejection:
    """What a 400/422 says about what was added to the request.

    Attributes:
        blamed: the added field the error names as the offending one: ``continuous_usage_stats`` or
            ``stream_options`` (for ``stream_options`` or ``include_usage``); None.
        shows_added: the error's bytes show a field that was added (an echo of the request).
    """

    blamed: str | None
    shows_added: bool

    @property
    def resend(self) -> str | None:
        """How to send the request again: :data:`RESEND_WITHOUT_CONTINUOUS` (what was added, less
        ``continuous_usage_stats``), :data:`RESEND_CLIENTS_BODY` (the client's own body), or None
        (relay the answer as it is)."""
        if self.blamed == CONTINUOUS:
            return RESEND_WITHOUT_CONTINUOUS
        if self.blamed is not None or self.shows_added:
            return RESEND_CLIENTS_BODY
        return None


def _paths(obj: Any) -> tuple[list[str], list[str]]:
    """``(paths, messages)`` of an error body: the dotted paths it blames (``loc``, ``param``) and its
    message texts (where ``loc`` tuples written as text are looked for too)."""
    paths: list[str] = []
    messages: list[str] = []
    if not isinstance(obj, dict):
        return paths, messages
    detail = obj.get("detail")
    if isinstance(detail, list):  # FastAPI's 422
        for item in detail:
            loc = item.get("loc") if isinstance(item, dict) else None
            if isinstance(loc, list):
                paths.append(".".join(str(p) for p in loc))
    elif isinstance(detail, str):
        messages.append(detail)
    err = obj.get("error")
    if isinstance(err, dict):  # OpenAI's and vLLM's
        param = err.get("param")
        if isinstance(param, str) and param:
            paths.append(param)
        if isinstance(err.get("message"), str):
            messages.append(err["message"])
    elif isinstance(err, str):
        messages.append(err)
    if isinstance(obj.get("message"), str):
        messages.append(obj["message"])
    for text in messages:  # pydantic's errors written into a message (vLLM)
        for m in _PY_LOC.finditer(text):
            paths.append(".".join(a or b for a, b in _SEGMENT.findall(m.group(1))))
    return paths, messages


def _named(inj: Injection, names: list[str]) -> str | None:
    """The added field that one of ``names`` (paths split on ``.``, or words) is, if any."""
    words = {w for n in names for w in re.split(r"[^A-Za-z0-9_]+", n)}
    if inj.continuous and CONTINUOUS in words:
        return CONTINUOUS
    if STREAM_OPTIONS in words or "include_usage" in words:
        return STREAM_OPTIONS
    return None


def read_rejection(inj: Injection, text: bytes) -> Rejection:
    """What the 400/422 body ``text`` says about ``inj``, what was added to the request (see the module
    docstring for the shapes read). Never raises."""
    shows = (inj.include_usage and b"include_usage" in text) or (inj.continuous and CONTINUOUS.encode() in text)
    try:
        obj = decode_json(text)
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError):
        obj = None
    paths, messages = _paths(obj)
    if paths:  # the error says which fields are at fault: believe it
        return Rejection(_named(inj, paths), shows)
    if not messages:  # not JSON, or no message where servers put one: the whole text is the message
        messages = [text.decode("utf-8", "replace")]
    return Rejection(_named(inj, messages), shows)
