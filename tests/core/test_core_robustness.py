"""The core against hostile input: nesting too deep to decode, junk usage values, huge events."""

from __future__ import annotations

import time

import msgspec
import pytest

from servelens.core.openai import decode_json, parse_chunk, parse_response, parse_usage
from servelens.core.sse import SSEDecoder

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


def _decode_in_reads(size: int) -> float:
    """Decode one ``size``-byte event read 64 KiB at a time; the CPU seconds it took (checked whole)."""
    payload = b"x" * size
    data = b"data: " + payload + b"\r\n\r\ndata: [DONE]\n\n"
    dec = SSEDecoder()
    blocks = []
    t0 = time.process_time()
    for i in range(0, len(data), 65536):
        blocks.extend(dec.decode(data[i : i + 65536]))
    cpu_s = time.process_time() - t0
    blocks.extend(dec.flush())
    assert [b.data for b in blocks] == [payload.decode(), "[DONE]"]
    assert b"".join(b.raw for b in blocks) == data
    return cpu_s


def test_long_event_in_many_reads_is_decoded_in_linear_time() -> None:
    # one 16 MiB event (e.g. a non-SSE body on a stream, or a huge logprobs chunk) read 64 KiB
    # at a time: rescanning and recopying the held bytes on every read took ~10 s of CPU (the
    # gateway's event loop blocked for all streams meanwhile). Asserted as a ratio, not a bound in
    # seconds: 16 times the bytes cost about 16 times the CPU when linear, 256 times when quadratic
    # (the best of three runs of each, interleaved, so a busy machine slows both alike)
    small, large = 1024 * 1024, 16 * 1024 * 1024
    runs = [(_decode_in_reads(small), _decode_in_reads(large)) for _ in range(3)]
    t_small = max(min(r[0] for r in runs), 1e-4)  # below process_time's resolution: the ratio only grows
    t_large = min(r[1] for r in runs)
    assert t_large / t_small < 64, f"16x the bytes took {t_large / t_small:.0f}x the CPU ({runs})"


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
