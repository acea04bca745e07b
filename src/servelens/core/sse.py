"""Incremental Server-Sent Events decoder (WHATWG HTML "event stream" parsing), no I/O.

``decode(bytes) -> list[SSEBlock]`` can be fed arbitrary splits of the stream: an event split
across reads, several events in one read, a multi-byte UTF-8 character split across reads,
``\\n``, ``\\r\\n`` or ``\\r`` line endings, and one UTF-8 byte order mark at the start of the stream,
which is skipped. ``flush()`` returns what remains at the end of stream.

A ``\\r`` that ends a read may be the first half of a ``\\r\\n``: it is held for the next read, unless
the stream has shown a bare ``\\r`` line end (as the spec allows). Then it ends its line at once (so
an event of a ``\\r``-framed stream is complete with the read that ends it, not one read late), and a
``\\n`` that starts the next read is the rest of that line end.

Every block (the lines up to a blank line) is returned, including comment-only blocks
(``: keep-alive``) and blocks with only ``id:``/``retry:`` fields, so that a relay can
re-emit the exact bytes (``raw``); consumers look at ``data`` (None when the block had no
``data:`` field, which the spec says is not dispatched as an event).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"\r\n|\r|\n")  # (no group: a capturing one makes the search 3x slower)
_BOM = b"\xef\xbb\xbf"


@dataclass(slots=True)
class SSEBlock:
    """One SSE block (one is made per streamed event: not frozen, whose ``__init__`` costs a call
    per field; treat it as read-only; not hashable).

    Attributes:
        data: the ``data`` fields joined with ``\\n`` (None when there was no ``data:`` line).
        event: the ``event:`` field, if any.
        id: the ``id:`` field, if any.
        raw: the exact bytes of the block, blank line included (without it after ``flush``).
        comments: the comment lines (text after ``:``), e.g. ``(" keep-alive",)``.
    """

    data: str | None
    event: str | None
    id: str | None
    raw: bytes
    comments: tuple[str, ...] = ()


class SSEDecoder:
    """Stateful incremental decoder. Not thread-safe; one per stream."""

    __slots__ = ("_bare_cr", "_bom_open", "_buf", "_comments", "_data", "_event", "_id", "_parsed", "_scanned",
                 "_skip", "bom_block")

    def __init__(self) -> None:
        self._buf = bytearray()  # bytes of the unfinished block (appended to: no copy per read)
        self._parsed = 0  # how many bytes of _buf were already parsed into fields
        self._scanned = 0  # _buf[_parsed:_scanned] holds no line end (a long line is scanned once)
        self._skip = _BOM  # bytes to pass over where parsing resumes: a BOM at the start, a \n after a \r
        self._bare_cr = False  # the stream has shown a \r line end not followed by \n
        self._bom_open = False
        self.bom_block: SSEBlock | None = None
        """The block whose ``raw`` starts with the byte order mark skipped at the start, if any."""
        self._reset()

    def _reset(self) -> None:
        self._data: list[str] | None = None
        self._event: str | None = None
        self._id: str | None = None
        self._comments: list[str] = []

    def _field(self, line: bytes | bytearray) -> None:
        text = line.decode("utf-8", errors="replace")
        if text.startswith(":"):
            self._comments.append(text[1:])
            return
        name, sep, value = text.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            if self._data is None:
                self._data = [value]
            else:
                self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        # "retry" and unknown fields are ignored (spec)

    def _emit(self, raw: bytes) -> SSEBlock:
        block = SSEBlock(
            data="\n".join(self._data) if self._data is not None else None,
            event=self._event,
            id=self._id,
            raw=raw,
            comments=tuple(self._comments),
        )
        self._reset()
        if self._bom_open:
            self._bom_open = False
            self.bom_block = block
        return block

    def decode(self, chunk: bytes) -> list[SSEBlock]:
        """Feed bytes; return the blocks completed by them (possibly none).

        A blank line with no field before it yields a block with ``data=None`` and only ``raw``
        (so a relay can re-emit stray blank lines byte for byte).
        """
        held = self._buf
        if self._skip:
            chunk = self._skip_prefix(chunk)
            if not chunk:
                return []
        if (
            not held
            and not self._parsed
            and chunk[:6] == b"data: "
            and chunk.find(b"\n") == len(chunk) - 2
            and chunk[-1] == 10
            and 13 not in chunk
        ):
            # the common case of a relay: exactly one one-line "data: ..." event per read
            return [SSEBlock(chunk[6:-2].decode("utf-8", errors="replace"), None, None, chunk)]
        buf: bytes | bytearray
        if held:
            held += chunk  # amortised O(len(chunk)): an event split over many reads is not recopied
            buf = held
        else:
            buf = chunk  # the common case: no copy
        out: list[SSEBlock] = []
        pos = self._parsed
        scan = self._scanned
        start = 0
        n = len(buf)
        search = _LINE_END.search
        while pos < n:
            m = search(buf, scan if scan > pos else pos)
            if m is None:
                break
            end = m.end()
            if buf[end - 1] == 13:  # a lone \r (a \r\n or \n match ends in \n)
                if end < n:
                    self._bare_cr = True  # not followed by \n: the stream uses bare \r line ends
                elif not self._bare_cr:
                    n -= 1  # it ends the read and may be half a \r\n: scanned again with the next read
                    break
                else:
                    self._skip = b"\n"  # it ends its line now; a \n that follows is the rest of it
            line = buf[pos : m.start()]
            pos = end
            if line:
                self._field(line)
            else:
                out.append(self._emit(bytes(buf[start:pos])))
                start = pos
        if buf is held:
            if start:
                del held[:start]
        elif start < len(buf):
            self._buf = bytearray(buf[start:])
        self._parsed = pos - start
        self._scanned = max(n, pos) - start
        return out

    def _skip_prefix(self, chunk: bytes) -> bytes:
        """Where parsing resumes, pass over what ``_skip`` names (the bytes stay in the next
        block's ``raw``). Returns ``chunk``, or b"" when it is held to see whether the prefix
        completes (a byte order mark split across reads)."""
        skip = self._skip
        held = self._buf
        have = bytes(held[self._parsed:]) + chunk if held else chunk
        if len(have) < len(skip) and skip.startswith(have):
            held += chunk
            self._scanned = len(held)
            return b""
        self._skip = b""
        if have.startswith(skip):
            self._parsed += len(skip)
            self._bom_open = skip is _BOM
        return chunk

    @property
    def pending_bytes(self) -> int:
        """Bytes held for the unfinished block (what an event with no end yet costs in memory)."""
        return len(self._buf)

    def discard(self) -> bytes:
        """Drop the unfinished block and return its bytes (nothing of it is parsed further)."""
        buf = bytes(self._buf)
        self._buf = bytearray()
        self._parsed = 0
        self._scanned = 0
        self._reset()
        return buf

    def flush(self) -> list[SSEBlock]:
        """End of stream: dispatch a final block that lacked its blank line, if any."""
        buf = bytes(self._buf)
        rest = buf[self._parsed :]
        if rest:
            self._field(rest.rstrip(b"\r\n"))
        out: list[SSEBlock] = []
        if buf:
            out.append(self._emit(buf))
        self._buf = bytearray()
        self._parsed = 0
        self._scanned = 0
        self._reset()
        return out
