"""The core against hostile input: nesting too deep to decode, junk usage values, huge events."""

from __future__ import annotations

import re

import msgspec
import pytest

from servelens.core import sse
from servelens.core.openai import decode_json, parse_chunk, parse_response, parse_usage
from servelens.core.sse import _LINE_END, SSEDecoder

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize("payload", [DEEP, b'{"choices":' + DEEP + b"}", DEEP.decode()],
                         ids=["array", "in_object", "str"])
def test_nesting_too_deep_is_malformed_not_an_exception(payload: bytes | str) -> None:
    assert parse_chunk(payload).malformed
    assert parse_response(payload).malformed
    with pytest.raises(msgspec.DecodeError, match="nested too deeply"):
        decode_json(payload)


@pytest.mark.parametrize("bad", [-1, -700, True, False, 1.5, "12", None, [3]])
def test_usage_counts_must_be_non_negative_ints(bad: object) -> None:
    u = parse_usage({"prompt_tokens": bad, "completion_tokens": bad, "prompt_tokens_details": {"cached_tokens": bad}})
    assert u is not None
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (None, None, None)
    ok = parse_usage({"prompt_tokens": 0, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 0}})
    assert ok is not None and (ok.prompt_tokens, ok.completion_tokens, ok.cached_tokens) == (0, 7, 0)


class _CountingLineEnd:
    """Stands in for the decoder's line-end pattern and counts the bytes its searches examine."""

    def __init__(self) -> None:
        self.scanned = 0

    def search(self, buf: bytes | bytearray, pos: int) -> re.Match[bytes] | None:
        m = _LINE_END.search(buf, pos)
        self.scanned += (m.end() if m else len(buf)) - pos
        return m


def _bytes_scanned(size: int, sep: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    """Decode one ``size``-byte event read 64 KiB at a time; the bytes searched for line ends (the
    events are checked whole)."""
    counting = _CountingLineEnd()
    monkeypatch.setattr(sse, "_LINE_END", counting)
    payload = b"x" * size
    data = b"data: " + payload + sep + sep + b"data: [DONE]\n\n"
    dec = SSEDecoder()
    blocks = []
    for i in range(0, len(data), 65536):
        blocks.extend(dec.decode(data[i : i + 65536]))
    blocks.extend(dec.flush())
    assert [b.data for b in blocks] == [payload.decode(), "[DONE]"]
    assert b"".join(b.raw for b in blocks) == data
    return counting.scanned


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_long_event_in_many_reads_is_decoded_in_linear_time(sep: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    # one 16 MiB event (e.g. a non-SSE body on a stream, or a huge logprobs chunk) read 64 KiB
    # at a time: rescanning the held bytes on every read took ~10 s of CPU (the gateway's event loop
    # blocked for all streams meanwhile). Counted in operations, not seconds: each byte is searched for
    # a line end about once (rescanning the held event at each of the 256 reads would search it ~128
    # times). The CPU seconds are a figure: benchmarks/sse_long_event.py
    size = 16 * 1024 * 1024
    scanned = _bytes_scanned(size, sep, monkeypatch)
    assert size <= scanned <= size + 64 * 1024, scanned
    assert _bytes_scanned(size // 16, sep, monkeypatch) * 16 == pytest.approx(scanned, rel=0.05)


@pytest.mark.parametrize("sep", [b"\n", b"\r\n", b"\r"])
def test_line_end_split_across_reads_after_a_long_partial_line(sep: bytes) -> None:
    # the resumed scan must still see a line end whose first byte ended the previous read
    data = b"data: " + b"y" * 5000 + sep + sep + b"data: z" + sep + sep
    for cut in range(4990, 5012):
        dec = SSEDecoder()
        blocks = dec.decode(data[:cut]) + dec.decode(data[cut : cut + 1]) + dec.decode(data[cut + 1 :])
        blocks += dec.flush()
        assert [b.data for b in blocks] == ["y" * 5000, "z"], cut
        assert b"".join(b.raw for b in blocks) == data
