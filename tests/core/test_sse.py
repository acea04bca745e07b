import pytest

from servelens.core.sse import SSEDecoder

STREAM = (
    'data: {"a":"é€"}\r\n\r\n'
    ": keep-alive\n\n"
    "id: 7\nretry: 100\n\n"
    "event: message\ndata: x\ndata: y\n\n"
    "data:nospace\r\rdata: [DONE]\n\n"
).encode()


def decode_all(chunks: list[bytes]) -> list:
    d = SSEDecoder()
    out = []
    for c in chunks:
        out.extend(d.decode(c))
    out.extend(d.flush())
    return out


def expected() -> list[tuple]:
    return [('{"a":"é€"}', None, None), (None, None, None), (None, None, "7"), ("x\ny", "message", None),
            ("nospace", None, None), ("[DONE]", None, None)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 1000])
def test_any_split_gives_same_events_and_exact_bytes(size: int) -> None:
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    blocks = decode_all(chunks)
    assert [(b.data, b.event, b.id) for b in blocks] == expected()
    assert b"".join(b.raw for b in blocks) == STREAM


def test_split_inside_multibyte_utf8_character() -> None:
    raw = 'data: {"t":"€"}\n\n'.encode()
    cut = raw.index("€".encode()) + 1  # inside the 3-byte character
    blocks = decode_all([raw[:cut], raw[cut:]])
    assert [b.data for b in blocks] == ['{"t":"€"}']


def test_comment_lines_recorded() -> None:
    blocks = decode_all([b": ping\n\n"])
    assert blocks[0].comments == (" ping",) and blocks[0].data is None


def test_lone_cr_at_end_waits_for_possible_lf() -> None:
    d = SSEDecoder()
    assert d.decode(b"data: a\r") == []
    blocks = d.decode(b"\n\r\n")
    assert [b.data for b in blocks] == ["a"]
    assert blocks[0].raw == b"data: a\r\n\r\n"


def test_flush_returns_unterminated_event() -> None:
    d = SSEDecoder()
    assert d.decode(b'data: {"x":1}') == []
    blocks = d.flush()
    assert [b.data for b in blocks] == ['{"x":1}']
    assert d.flush() == []


def test_several_events_in_one_read() -> None:
    blocks = SSEDecoder().decode(b"data: 1\n\ndata: 2\n\ndata: 3\n\n")
    assert [b.data for b in blocks] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("read", "events"),
    [
        (b'data: {"a":1}\n\n', [('{"a":1}', b'data: {"a":1}\n\n')]),  # the fast path: one one-line event per read
        (b'data:{"a":1}\n\n', [('{"a":1}', b'data:{"a":1}\n\n')]),
        (b"data: a\ndata: b\n\n", [("a\nb", b"data: a\ndata: b\n\n")]),
        (b"data: a\r\n\r\n", [("a", b"data: a\r\n\r\n")]),
        (b"data: a\n\n\n", [("a", b"data: a\n\n"), (None, b"\n")]),  # a stray blank line is a block of its own
        (b"data: a\n\ndata: b\n\n", [("a", b"data: a\n\n"), ("b", b"data: b\n\n")]),
        (b"data: \xe2\x82\xac\n\n", [("€", b"data: \xe2\x82\xac\n\n")]),
        (b"data: \xff\n\n", [("\ufffd", b"data: \xff\n\n")]),
        (b"data: a\n", [("a", b"data: a\n")]),  # from flush()
        (b"data: \n\n", [("", b"data: \n\n")]),
        (b": ping\n\n", [(None, b": ping\n\n")]),
        (b"data: a\r\rdata: b\r\r", [("a", b"data: a\r\r"), ("b", b"data: b\r\r")]),
        (b"\xef\xbb\xbfdata: a\n\n", [("a", b"\xef\xbb\xbfdata: a\n\n")]),
    ],
)
def test_one_read_decodes_as_byte_by_byte(read: bytes, events: list[tuple[str | None, bytes]]) -> None:
    whole = SSEDecoder()
    bytewise = SSEDecoder()
    got = whole.decode(read) + whole.flush()
    want = [b for i in range(len(read)) for b in bytewise.decode(read[i : i + 1])] + bytewise.flush()
    assert [(b.data, b.raw) for b in got] == events  # what the spec gives, not only what the other path gives
    assert got == want


def test_pending_bytes_and_discard_of_an_unfinished_block() -> None:
    d = SSEDecoder()
    assert d.decode(b"data: a\n\ndata: {\"x\":") != []
    assert d.pending_bytes == len(b'data: {"x":')
    d.decode(b"1}\n")
    assert d.discard() == b'data: {"x":1}\n' and d.pending_bytes == 0
    assert [b.data for b in d.decode(b"data: b\n\n")] == ["b"]  # parsing starts afresh


def test_bare_cr_framed_event_is_complete_with_the_read_that_ends_it() -> None:
    # a \r ending a read used to be held as the possible first half of \r\n, so every event of a
    # \r-framed stream came out (and was timed) one read late
    d = SSEDecoder()
    assert [b.data for b in d.decode(b"data: a\r\r")] == ["a"]  # a bare \r mid-read shows the framing
    assert [b.data for b in d.decode(b"data: b\r\r")] == ["b"]
    assert d.decode(b"data: c\r") == []
    # a \n starting the next read completes that \r\n: not a blank line, so c and d join
    blocks = d.decode(b"\ndata: d\r\r")
    assert [b.data for b in blocks] == ["c\nd"] and blocks[0].raw == b"data: c\r\ndata: d\r\r"


def test_first_bare_cr_waits_until_the_framing_is_known() -> None:
    d = SSEDecoder()
    assert d.decode(b"data: a\r") == []  # \r\n or \r: the next byte tells
    assert [b.data for b in d.decode(b"\r")] == ["a"]
    assert [b.data for b in d.decode(b"data: b\r")] == []
    assert [b.data for b in d.decode(b"\r")] == ["b"]


def test_crlf_stream_split_after_cr_is_unchanged() -> None:
    d = SSEDecoder()
    assert [b.raw for b in d.decode(b"data: a\r\n\r\ndata: b\r\n\r")] == [b"data: a\r\n\r\n"]
    blocks = d.decode(b"\n")
    assert [b.data for b in blocks] == ["b"] and blocks[0].raw == b"data: b\r\n\r\n"


@pytest.mark.parametrize("reads", [[b"\xef\xbb\xbfdata: a\n\n"], [b"\xef", b"\xbb", b"\xbfdata: a\n\n"]])
def test_byte_order_mark_at_the_start_is_skipped_and_kept_in_raw(reads: list[bytes]) -> None:
    # the WHATWG parser drops one leading U+FEFF; its field name was "\ufeffdata", an unknown field,
    # so the first event had no data and was not measured
    d = SSEDecoder()
    blocks = [b for r in reads for b in d.decode(r)]
    assert [b.data for b in blocks] == ["a"] and blocks[0].raw == b"".join(reads)
    assert d.bom_block is blocks[0]  # the relay keeps the mark in front of the block it rewrites
    later = d.decode(b"\xef\xbb\xbfdata: b\n\n")  # only at the start of the stream
    assert [b.data for b in later] == [None] and d.bom_block is blocks[0]
    plain = SSEDecoder()
    assert [b.data for b in plain.decode(b"data: a\n\n")] == ["a"] and plain.bom_block is None


def test_bare_cr_seen_in_any_read_ends_a_later_read_ending_in_cr() -> None:
    d = SSEDecoder()
    assert d.decode(b": c\rdata: a\n") == []  # a bare \r line end mid-read: the framing is known
    assert [b.data for b in d.decode(b"\r")] == ["a"]  # so this \r ends the event now, not a read later
