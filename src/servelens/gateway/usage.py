"""Usage injection into streaming requests, and its exact removal from the relayed stream (pure).

To learn token counts the gateway may add ``stream_options.include_usage`` (OpenAI: a final
chunk with ``choices: []`` and ``usage``; every other chunk gets a ``usage`` key, null for
OpenAI, absent for vLLM) and ``stream_options.continuous_usage_stats`` (vLLM/SGLang extension:
cumulative ``usage`` on every chunk). What the client did not ask for is removed again:

* :data:`STRIP_ALL` (the client asked for no usage): the ``usage`` member is cut out of every
  chunk, and a chunk that exists only to carry usage (``choices`` empty) is dropped whole.
* :data:`STRIP_CONTINUOUS` / :data:`STRIP_CONTINUOUS_NULL` (the client asked for
  ``include_usage`` only): on chunks that carry choices the ``usage`` member is cut out (vLLM
  sends no key there) or its value replaced by ``null`` (OpenAI and the sim send
  ``"usage":null``); which one is learned per upstream from the first such request, which is
  sent without ``continuous_usage_stats``. The final usage chunk is kept.

Cutting is done on the bytes (the key, its value and one adjacent comma with its whitespace),
so the rest of each event is byte for byte what the upstream sent; for an upstream that omits
``usage`` when it was not requested (vLLM, OpenAI, the sim) the client gets exactly the bytes it
would have got without the injection. (An upstream that sends ``"usage":null`` even when usage
was not requested would lose that null member; clients read an absent and a null usage alike.)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

STRIP_NONE = 0
STRIP_ALL = 1
STRIP_CONTINUOUS = 2
STRIP_CONTINUOUS_NULL = 3

_msgspec_encode = msgspec.json.encode


def _encode(obj: Any, strict: bool = True) -> bytes:
    """JSON bytes of ``obj``. Of a body only Python's ``json`` read (``strict`` False), and of strings
    with lone surrogates, written by ``json``: ``NaN`` stays ``NaN`` (msgspec writes ``null``) and a
    lone surrogate a ``\\uXXXX`` escape, as the client sent them."""
    if strict:
        try:
            return _msgspec_encode(obj)
        except UnicodeEncodeError:
            pass
    return json.dumps(obj, separators=(",", ":")).encode()


_KEY = b'"usage"'
_KEY_RE = re.compile(rb'"usage"\s*:')
_STR = rb'"[^"]*"'
_FLAT = rb'\{[^{}"]*(?:' + _STR + rb'[^{}"]*)*\}'  # an object without nested objects
_TAIL_RE = re.compile(  # ',"usage":' + null or an object nesting objects one level deep, ending the line
    rb',"usage":(?:null|\{[^{}"]*(?:(?:' + _STR + rb"|" + _FLAT + rb')[^{}"]*)*\})(?=\}\r?\n)'
)
_WS = b" \t\r\n"


@dataclass(frozen=True)
class Injection:
    """What was added to one request.

    Attributes:
        body: the request body to send upstream (the client's bytes when nothing was added).
        strip: :data:`STRIP_NONE`, :data:`STRIP_ALL`, :data:`STRIP_CONTINUOUS` or
            :data:`STRIP_CONTINUOUS_NULL`.
        include_usage: ``include_usage`` was added.
        continuous: ``continuous_usage_stats`` was added.
        client_usage: the client asked for ``include_usage`` itself.
        client_continuous: the client asked for ``continuous_usage_stats`` itself.
    """

    body: bytes
    strip: int = STRIP_NONE
    include_usage: bool = False
    continuous: bool = False
    client_usage: bool = False
    client_continuous: bool = False


_LAX_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_LAX_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _lax_bool(value: Any) -> bool | None:
    """A ``stream_options`` flag as the engines read it: pydantic's lax bool (vLLM, SGLang), so
    ``1`` and ``"true"`` ask as ``true`` does; absent or null is False; None for a value they
    reject."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int | float):
        return bool(value) if value in (0, 1) else None  # 1.0 and 0.0 too
    if isinstance(value, str):
        v = value.lower()  # (no stripping: " true" is refused)
        return True if v in _LAX_TRUE else False if v in _LAX_FALSE else None
    return None


def stream_asked(obj: dict[str, Any]) -> bool | None:
    """Whether request ``obj`` asks for a stream, read as the engines read its ``stream``: pydantic's lax
    bool (vLLM's and SGLang's ``stream: bool | None = False``), so ``1`` and ``"true"`` ask for one as
    ``true`` does, and ``0``, ``"false"``, null or no ``stream`` do not; None for a value they refuse
    (``"maybe"``, ``2``, a list), which gets the client a 400."""
    return _lax_bool(obj.get("stream"))


def plan_injection(
    obj: dict[str, Any], body: bytes, *, inject_usage: bool, continuous: bool, null_usage: bool = False,
    strict: bool = True,
) -> Injection:
    """Decide what to add to a streaming request ``obj`` (already decoded from ``body``).

    ``continuous``: whether ``continuous_usage_stats`` may be added for this upstream.
    ``null_usage``: the upstream sends ``"usage": null`` on chunks of an ``include_usage``
    stream (selects :data:`STRIP_CONTINUOUS_NULL` over :data:`STRIP_CONTINUOUS`).
    ``strict``: ``body`` is strict JSON in UTF-8 (msgspec read it). Else only Python's ``json``
    did: escaped lone surrogates or ``NaN``/``Infinity`` are kept by writing with ``json`` (msgspec
    would write ``null`` for ``NaN``), and a UTF-16/32 body or one with a byte order mark is not
    edited at all (bytes inserted into it would break it).
    Returns the original ``body`` unchanged when nothing is added, or when ``stream_options``
    is present but not an object (the upstream will reject it, as it would without us).
    """
    so = obj.get("stream_options")
    if so is not None and not isinstance(so, dict):
        return Injection(body)
    so = so or {}
    asked_usage = _lax_bool(so.get("include_usage"))
    asked_cont = _lax_bool(so.get("continuous_usage_stats"))
    if asked_usage is None or asked_cont is None:  # a value the upstream will reject: untouched
        return Injection(body)
    client_usage = asked_usage
    client_cont = client_usage and asked_cont
    if not inject_usage or (not strict and (b"\x00" in body or body.startswith(b"\xef\xbb\xbf"))):
        return Injection(body, client_usage=client_usage, client_continuous=client_cont)
    add_usage = not client_usage
    add_cont = continuous and not client_cont
    if not add_usage and not add_cont:
        return Injection(body, client_usage=client_usage, client_continuous=client_cont)
    new_so = dict(so)
    new_so["include_usage"] = True
    if add_cont:
        new_so["continuous_usage_stats"] = True
    start = body.find(b"{")
    if "stream_options" not in obj and start >= 0 and obj:
        # the common case: insert the member after the opening brace (no re-encoding of a
        # possibly large prompt; the client's bytes are otherwise untouched)
        new_body = body[: start + 1] + b'"stream_options":' + _encode(new_so) + b"," + body[start + 1 :]
    else:
        new_obj = dict(obj)
        new_obj["stream_options"] = new_so
        new_body = _encode(new_obj, strict)
    strip = STRIP_ALL if add_usage else (STRIP_CONTINUOUS_NULL if null_usage else STRIP_CONTINUOUS)
    return Injection(
        new_body, strip, include_usage=add_usage, continuous=add_cont,
        client_usage=client_usage, client_continuous=client_cont,
    )


def plan_learned(
    obj: dict[str, Any], body: bytes, *, inject_usage: bool, continuous_usage: str, stream_options_ok: bool,
    continuous_ok: bool, usage_null: bool | None, strict: bool = True,
) -> tuple[Injection, bool]:
    """:func:`plan_injection` with what was learned of one upstream (the gateway's and the in-process
    middleware's plan): ``inject_usage`` as configured and ``stream_options_ok`` (the upstream takes
    ``stream_options``); ``continuous_usage`` ``on``, ``off`` or ``auto`` (then ``continuous_ok`` decides);
    ``usage_null``: the upstream sends ``"usage": null`` on chunks (None: not known yet).

    Returns the injection and whether this request teaches ``usage_null``: a client asking for
    ``include_usage`` only, to an upstream whose style is not known yet, is sent without
    ``continuous_usage_stats`` so its chunks show how it marks "no usage here"."""
    inject = inject_usage and stream_options_ok
    continuous = continuous_usage == "on" or (continuous_usage == "auto" and continuous_ok)
    inj = plan_injection(obj, body, inject_usage=inject, continuous=continuous, null_usage=bool(usage_null),
                         strict=strict)
    if usage_null is None and inj.strip in (STRIP_CONTINUOUS, STRIP_CONTINUOUS_NULL):
        return plan_injection(obj, body, inject_usage=inject, continuous=False, strict=strict), True
    return inj, False


def _skip_ws(buf: bytes, i: int) -> int:
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    return i


def _skip_string(buf: bytes, i: int) -> int:
    """``buf[i]`` is an opening quote; return the index just past the closing quote."""
    i += 1
    while True:
        j = buf.index(b'"', i)
        k = j - 1
        while buf[k] == 0x5C:  # count backslashes before the quote
            k -= 1
        if (j - 1 - k) % 2 == 0:
            return j + 1
        i = j + 1


def _skip_value(buf: bytes, i: int) -> int:
    """Index just past the JSON value starting at ``buf[i]`` (no whitespace before it)."""
    c = buf[i]
    if c == 0x22:  # "
        return _skip_string(buf, i)
    if c in b"{[":
        depth = 0
        n = len(buf)
        while i < n:
            c = buf[i]
            if c == 0x22:
                i = _skip_string(buf, i)
                continue
            if c in b"{[":
                depth += 1
            elif c in b"}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise ValueError("unterminated JSON value")
    n = len(buf)
    while i < n and buf[i] not in b",}] \t\r\n":
        i += 1
    return i


def _top_level_key(buf: bytes) -> int:
    """Start of the top-level ``"usage"`` key in a JSON object embedded in ``buf``, or -1."""
    start = buf.find(b"{")
    if start < 0:
        return -1
    i = start + 1
    n = len(buf)
    while i < n:
        i = _skip_ws(buf, i)
        if i >= n or buf[i] != 0x22:
            return -1
        key_start = i
        i = _skip_string(buf, i)
        if buf[key_start:i] == _KEY:
            return key_start
        i = _skip_ws(buf, i)
        if i >= n or buf[i] != 0x3A:  # :
            return -1
        i = _skip_value(buf, _skip_ws(buf, i + 1))
        i = _skip_ws(buf, i)
        if i >= n or buf[i] != 0x2C:  # ,
            return -1
        i += 1
    return -1


def _plainly_top_level(raw: bytes, key: int) -> bool:
    """True when the key starting at ``raw[key]`` is a member of the outermost JSON object: no
    object or array opens between that object's brace and the key (as in every OpenAI-shaped
    chunk, where scalar members come first). False means "not sure", not "nested"."""
    start = raw.find(b"{")
    return 0 <= start < key and raw.find(b"{", start + 1, key) < 0 and raw.find(b"[", start + 1, key) < 0


def usage_span(raw: bytes, known: bool = False) -> tuple[int, int, int] | None:
    """``(key start, value start, value end)`` of the top-level ``"usage"`` member of the one JSON
    object in ``raw`` (an SSE block with one ``data`` line), or None (no such member, or bytes
    that are not as expected). A nested ``usage`` (``{"x_groq": {"usage": ...}}``) is not it.

    ``known``: the caller decoded the event and it has a top-level ``usage``; then a ``"usage":``
    that occurs once in ``raw`` is that member wherever it is."""
    # fast path: compact JSON with usage as the last member (vLLM, SGLang, the sim): the value
    # is followed by the brace that ends the data line, so it is the top-level member
    tail = raw.rfind(b',"usage":')
    if tail >= 0:
        m = _TAIL_RE.match(raw, tail)
        if m is not None:
            return tail + 1, tail + 9, m.end()
    first = _KEY_RE.search(raw)
    if first is None:
        return None
    try:
        # a `"usage":` is always a key (a string value never has ':' after it); the first one is the
        # top-level key when no object or array opens before it, else scan for the top-level one
        # (known: one occurrence is the top-level member, which the caller's decoding proved there)
        plain = _KEY_RE.search(raw, first.end()) is None if known else _plainly_top_level(raw, first.start())
        key = first.start() if plain else _top_level_key(raw)
        if key < 0:
            return None
        colon = raw.index(b":", key + len(_KEY))
        value = _skip_ws(raw, colon + 1)
        return key, value, _skip_value(raw, value)
    except (ValueError, IndexError):
        return None


def remove_usage(raw: bytes) -> bytes:
    """Cut the top-level ``"usage": <value>`` member (and one adjacent comma) out of ``raw``.

    ``raw`` is one SSE block whose ``data`` was decoded: a JSON object with a top-level ``usage``.
    Returns ``raw`` unchanged when there is no such member or the bytes are not as expected.
    """
    span = usage_span(raw, known=True)
    if span is None:
        return raw
    return cut_member(raw, span[0], span[2])


def cut_member(raw: bytes, key: int, end: int) -> bytes:
    """``raw`` without the object member from ``key`` (its key's opening quote) to ``end`` (just
    past its value), and one adjacent comma with its whitespace."""
    before = key - 1
    while before >= 0 and raw[before] in _WS:
        before -= 1
    if before >= 0 and raw[before] == 0x2C:  # ', "usage": ...' -> cut from the comma
        return raw[:before] + raw[end:]
    after = _skip_ws(raw, end)
    if after < len(raw) and raw[after] == 0x2C:  # '"usage": ..., ' -> cut through the comma
        return raw[:key] + raw[_skip_ws(raw, after + 1):]
    return raw[:key] + raw[end:]  # the only member


_CHOICES_RE = re.compile(rb'"choices"\s*:\s*(.)')


def choices_empty(raw: bytes) -> bool | None:
    """Whether the JSON object in ``raw`` has empty, null or absent ``choices``, read on the bytes
    as :func:`is_usage_only` reads the decoded object; None when the bytes do not tell at a glance
    (then decode the event and ask :func:`is_usage_only`).

    A ``"choices"`` followed by ``:`` is always a key (a string value is never followed by ``:``,
    and a quote inside a string is escaped). It is the top-level key when no ``{`` or ``[`` comes
    between the object's opening brace and it, as in every OpenAI-shaped chunk (``id``,
    ``object``, ``created``, ``model`` come first); otherwise the answer is None."""
    m = _CHOICES_RE.search(raw)
    if m is None:
        return True  # absent
    if not _plainly_top_level(raw, m.start()):
        return None
    c = m.group(1)
    if c == b"[":
        end = _skip_ws(raw, m.end())
        return end < len(raw) and raw[end] == 0x5D  # ]
    if c == b"n":
        return True  # null
    return None


def null_usage(raw: bytes) -> bytes:
    """Replace the value of the top-level ``usage`` member of ``raw`` with ``null``.

    For upstreams that send ``"usage": null`` on every chunk of an ``include_usage`` stream
    (OpenAI, the sim). ``raw``: as for :func:`remove_usage`. Returns ``raw`` unchanged when there is
    no such member.
    """
    span = usage_span(raw, known=True)
    if span is None:
        return raw
    _, value, end = span
    return raw[:value] + b"null" + raw[end:]


def is_usage_only(obj: dict[str, Any]) -> bool:
    """A chunk that exists only to carry usage: ``usage`` set and ``choices`` empty or absent."""
    if obj.get("usage") is None:
        return False
    choices = obj.get("choices")
    return not choices
