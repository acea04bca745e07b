"""Property-based tests (hypothesis) of the SSE decoder and the chunk parser: any split of any byte
stream into reads gives the events one read gives, and nothing raises."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from servelens.core.openai import parse_chunk
from servelens.core.sse import SSEBlock, SSEDecoder

EOLS = [b"\n", b"\r\n", b"\r"]
# pieces SSE streams are made of, and the bytes that trouble decoders
PIECES = st.one_of(
    st.sampled_from([b"data: ", b"data:", b"event: ", b"event: error", b"id: 7", b"retry: 10", b": ping", b"",
                     b"\xef\xbb\xbf", b"data: [DONE]", b'data: {"choices":[]}', b"\xc3", b"\xa9", b"\xf0\x9f\x99",
                     b"\x82", b"data", b":", b" "]),
    st.text(max_size=12).map(str.encode),
    st.binary(max_size=8),
)
LINE = st.lists(PIECES, max_size=4).map(b"".join)
STREAM = st.lists(st.tuples(LINE, st.sampled_from(EOLS)), max_size=30).map(
    lambda lines: b"".join(a + b for a, b in lines))


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def decode_all(parts: list[bytes]) -> list[SSEBlock]:
    dec = SSEDecoder()
    out: list[SSEBlock] = []
    for part in parts:
        out.extend(dec.decode(part))
    out.extend(dec.flush())
    return out


def view(blocks: list[SSEBlock]) -> tuple[object, ...]:
    """What a split must not change: the events dispatched (blocks with data), the comments, and the bytes.
    Which block a byte's ``raw`` lands in may differ: a ``\n`` read after a bare ``\r`` that already ended
    a block is the rest of that line end, and goes into the next block's ``raw``."""
    events = [(b.data, b.event, b.id) for b in blocks if b.data is not None]
    return events, [c for b in blocks for c in b.comments], b"".join(b.raw for b in blocks)


@given(STREAM, st.lists(st.integers(min_value=0), max_size=40))
def test_any_split_gives_the_events_of_one_read(data: bytes, cuts: list[int]) -> None:
    whole = decode_all([data])
    assert view(decode_all(splits(data, cuts))) == view(whole)
    assert b"".join(b.raw for b in whole) == data  # every byte is in exactly one block


@given(STREAM)
def test_byte_by_byte_gives_the_events_of_one_read(data: bytes) -> None:
    assert view(decode_all([data[i:i + 1] for i in range(len(data))])) == view(decode_all([data]))


@given(st.binary(max_size=300), st.lists(st.integers(min_value=0), max_size=20))
def test_arbitrary_bytes_never_raise(data: bytes, cuts: list[int]) -> None:
    for blk in decode_all(splits(data, cuts)):
        if blk.data is not None:
            parse_chunk(blk.data, blk.event)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["choices", "usage", "delta", "content", "index", "error", "object", "message",
                         "finish_reason", "completion_tokens", "prompt_tokens", "prompt_tokens_details",
                         "cached_tokens", "text", "tool_calls", "x"]) | st.text(max_size=5), inner, max_size=5),
    max_leaves=25,
)


@given(JSON, st.sampled_from([None, "error", "message", ""]))
def test_the_chunk_parser_reads_any_json_without_raising(obj: object, event: str | None) -> None:
    import json

    text = json.dumps(obj)
    info = parse_chunk(text, event)
    assert info.outputs >= info.first_output
    if event == "error":
        assert info.error is not None
    if info.usage is not None:
        for n in (info.usage.prompt_tokens, info.usage.completion_tokens, info.usage.cached_tokens):
            assert n is None or (type(n) is int and n >= 0)
    assert parse_chunk(text.encode(), event) == info
