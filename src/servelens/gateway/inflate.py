"""Decoding a response body that the upstream compressed although the gateway asked for
``Accept-Encoding: identity``: gzip (every member, RFC 1952) and deflate (a zlib or raw-gzip header,
as RFC 9110 allows), read by read, with a bound on what one read may decode to."""

from __future__ import annotations

import zlib

MAX_INFLATE_BYTES = 16 * 1024 * 1024
"""Most bytes one read of a gzip or deflate body may decode to (a compressed event is a few hundred)."""
DECODED_CODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 47}
"""The ``Content-Encoding`` values decoded, and their zlib ``wbits``: gzip; zlib or gzip header."""


class Inflater:
    """Decodes a gzip body (every member of it, RFC 1952) or a deflate one, read by read; bytes after
    the last member that do not start another one are ignored, as gzip readers do with padding."""

    __slots__ = ("_between", "_d", "_gzip", "_wbits", "fed")

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._gzip = wbits == 31
        self._d = zlib.decompressobj(wbits)
        self._between = b""  # after a member: the start of what follows, until it can be told apart
        self.fed = False

    def decode(self, data: bytes) -> bytes:
        """Raises ``zlib.error`` for broken data, ``OverflowError`` when ``data`` decodes to over
        :data:`MAX_INFLATE_BYTES`."""
        out: list[bytes] = []
        budget = MAX_INFLATE_BYTES
        while data:
            self.fed = True
            d = self._d
            if d.eof:  # between members, or after the last one
                if not self._gzip:
                    break
                data = self._between + data
                if len(data) < 2:
                    self._between = data
                    break
                self._between = b""
                if not data.startswith(b"\x1f\x8b"):
                    self._gzip = False  # not another member: this and all after it ignored
                    break
                d = self._d = zlib.decompressobj(self._wbits)
            if budget <= 0:
                raise OverflowError
            out.append(d.decompress(data, budget))
            if d.unconsumed_tail:
                raise OverflowError
            budget -= len(out[-1])
            data = d.unused_data if d.eof else b""
        return b"".join(out)

    def finish(self) -> bytes:
        """The body ended: what is left to decode. Raises ``zlib.error`` when the body stops inside a
        member (nothing at all is an empty body)."""
        if not self.fed:
            return b""
        if not self._d.eof:
            raise zlib.error("the compressed body ends inside a member")
        return self._d.flush()


