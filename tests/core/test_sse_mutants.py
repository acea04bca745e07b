"""SSE decoder behaviours that mutation testing found unchecked (scripts/mutation.py, docs/mutation.md).

Each test states a behaviour of :class:`~servelens.core.sse.SSEDecoder` with the exact blocks expected.
"""

from __future__ import annotations

import pytest

from servelens.core.sse import SSEBlock, SSEDecoder

BOM = b"\xef\xbb\xbf"


def fields(blocks: list[SSEBlock]) -> list[tuple[str | None, str | None, bytes]]:
    return [(b.data, b.event, b.raw) for b in blocks]


def assert_parses_afresh(d: SSEDecoder) -> None:
    """A blank line first (a line end at the very first byte), then a two-field event: the general path."""
    assert fields(d.decode(b"\nevent: e\ndata: b\n\n")) == [(None, None, b"\n"), ("b", "e", b"event: e\ndata: b\n\n")]
    assert d.pending_bytes == 0


def test_a_blank_line_as_the_first_byte_of_the_stream_is_a_block() -> None:
    assert_parses_afresh(SSEDecoder())


def test_discard_forgets_the_parsed_fields_and_positions() -> None:
    d = SSEDecoder()
    assert d.decode(b"event: old\ndata: a\ndat") == []
    assert d.discard() == b"event: old\ndata: a\ndat"
    assert_parses_afresh(d)


def test_discard_then_a_fast_path_read_then_the_general_path() -> None:
    d = SSEDecoder()
    d.decode(b"data: a\ndat")
    d.discard()
    assert fields(d.decode(b"data: x\n\n")) == [("x", None, b"data: x\n\n")]
    assert_parses_afresh(d)


def test_flush_resets_the_decoder_for_a_new_stream() -> None:
    d = SSEDecoder()
    assert d.decode(b"event: old\ndata: a") == []
    assert fields(d.flush()) == [("a", "old", b"event: old\ndata: a")]
    assert_parses_afresh(d)


@pytest.mark.parametrize(
    ("reads", "data"),
    [
        ([b"data: a\r"], "a"),  # a \r held as a possible half of \r\n: only line-end bytes are stripped
        ([b"data: a \r"], "a "),  # trailing spaces are data
        ([b"data: a\t\r"], "a\t"),
        ([b"data: XX\r"], "XX"),
        ([b"data: a\n", b"data: b"], "a\nb"),
    ],
)
def test_flush_dispatches_the_last_block_stripping_only_its_line_end(reads: list[bytes], data: str) -> None:
    d = SSEDecoder()
    assert [b for r in reads for b in d.decode(r)] == []
    blocks = d.flush()
    assert fields(blocks) == [(data, None, b"".join(reads))]


def test_a_read_that_starts_where_a_held_line_began_is_not_the_fast_path() -> None:
    # "x" is the start of a line: "xdata: a" is an unknown field, and the block keeps every byte
    d = SSEDecoder()
    assert d.decode(b"x") == []
    assert fields(d.decode(b"data: a\n\n")) == [(None, None, b"xdata: a\n\n")]


@pytest.mark.parametrize("read", [b"data: a\nx", b"data: a\n\x0b", b"data: a\n:"])
def test_one_data_line_without_its_blank_line_is_no_block_yet(read: bytes) -> None:
    d = SSEDecoder()
    assert d.decode(read) == []
    assert d.pending_bytes == len(read)
    assert [b.data for b in d.decode(b"\n\n")] == ["a"]


@pytest.mark.parametrize(
    ("read", "data"),
    [
        (b"data: a\r\n\n", "a"),  # \r\n then a bare \n: not the one-line fast path, no \r in data
        (b"data: a\rb\n\n", "a"),  # a bare \r ends the data line; "b" is an unknown field
        (b"data: \x0e\n\n", "\x0e"),
    ],
)
def test_carriage_returns_are_line_ends_never_data(read: bytes, data: str) -> None:
    assert fields(SSEDecoder().decode(read)) == [(data, None, read)]


def test_bom_block_is_none_until_a_bom_stream_dispatches_and_then_its_first_block() -> None:
    d = SSEDecoder()
    assert d.bom_block is None
    first = d.decode(BOM + b"data: a\n\n")
    assert d.bom_block is first[0] and d.bom_block.raw == BOM + b"data: a\n\n"
    d.decode(b"event: e\ndata: b\n\n")
    assert d.bom_block is first[0]  # later blocks do not replace it


def test_bom_block_stays_none_without_a_bom() -> None:
    d = SSEDecoder()
    d.decode(b"event: e\ndata: a\n\n")
    d.decode(b"data: b\n\n")
    assert d.bom_block is None


@pytest.mark.parametrize("first", [b"\n", b"\n\n", b"\r\n"])
def test_a_first_read_shorter_than_a_bom_is_parsed_at_once(first: bytes) -> None:
    # a read that cannot be the start of a byte order mark is not held back to see one
    blocks = SSEDecoder().decode(first)
    assert b"".join(b.raw for b in blocks) == first and all(b.data is None for b in blocks)
    assert blocks


def test_a_lone_cr_as_the_whole_first_read_is_scanned_again_with_the_next() -> None:
    d = SSEDecoder()
    assert d.decode(b"\r") == []
    assert fields(d.decode(b"\n")) == [(None, None, b"\r\n")]
    assert fields(d.decode(b"data: a\n\n")) == [("a", None, b"data: a\n\n")]


def test_the_lf_after_a_bare_cr_read_end_is_passed_over_and_the_line_not_parsed_again() -> None:
    d = SSEDecoder()
    assert [b.data for b in d.decode(b"data: a\r\r")] == ["a"]  # the stream uses bare \r line ends
    assert d.decode(b"xdata: c\r") == []  # an unknown field "xdata", ended by its \r at once
    # the \n completing that \r\n is skipped; "data: c" inside "xdata: c" must not be read as a field
    assert fields(d.decode(b"\n\r")) == [(None, None, b"xdata: c\r\n\r")]


def test_a_skipped_prefix_is_spent_once_checked() -> None:
    """The BOM is looked for at the stream's first byte and the LF of a split CR LF at the next read's:
    once checked, later reads are parsed from their first byte whatever it is (a field name that
    merely ends in "data", a BOM mid-stream: unknown fields, no data)."""
    d = SSEDecoder()
    assert fields(d.decode(b"data: a\r\r")) == [("a", None, b"data: a\r\r")]  # bare \r line ends
    assert fields(d.decode(b"XXXXdata: b\r")) == []  # its \r ends the line at once; a \n may follow
    assert fields(d.decode(b"\n\r")) == [(None, None, b"XXXXdata: b\r\n\r")]  # that \n passed over
    assert fields(d.decode(b"XXXXdata: c\n\n")) == [(None, None, b"XXXXdata: c\n\n")]
    assert fields(d.decode(BOM + b"data: d\n\n")) == [(None, None, BOM + b"data: d\n\n")]
    assert fields(d.decode(b"XX")) == []
    assert fields(d.decode(b"XXdata: e\n\n")) == [(None, None, b"XXXXdata: e\n\n")]
