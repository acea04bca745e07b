import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from servelens.bench.prompts import PromptBuilder
from servelens.bench.traces import (
    MOONCAKE_BLOCK_TOKENS,
    clip_row,
    detect_format,
    packaged_trace,
    read_trace,
)

MOONCAKE = packaged_trace("mooncake_conversation_400.jsonl")
AZURE = packaged_trace("azure_conv_2023_500.csv")


def test_packaged_cuts_have_license_and_readme() -> None:
    folder = MOONCAKE.parent
    assert (folder / "LICENSE-Mooncake-APACHE-2.0.txt").stat().st_size > 10_000
    assert "Attribution 4.0" in (folder / "LICENSE-AzurePublicDataset-CC-BY-4.0.txt").read_text("utf-8-sig")
    readme = (folder / "README.md").read_text()
    assert "head -n 400" in readme and "head -n 501" in readme
    assert MOONCAKE.stat().st_size < 1_000_000


def test_detect_format() -> None:
    assert detect_format(MOONCAKE) == "mooncake"
    assert detect_format(AZURE) == "azure"


def test_mooncake_rows_and_first_rows() -> None:
    rows = read_trace(MOONCAKE)
    assert len(rows) == 400
    first = rows[0]
    assert (first.offset_ns, first.isl_tokens, first.osl_tokens) == (0, 6758, 500)
    assert first.hash_ids == tuple(range(14))
    assert rows[1].hash_ids == (0, *range(14, 28))
    assert rows[-1].offset_ns == 141_000 * 1_000_000
    # every Mooncake row's blocks cover its input
    assert all(len(r.hash_ids) == -(-r.isl_tokens // MOONCAKE_BLOCK_TOKENS) for r in rows)


def test_azure_rows_and_first_rows() -> None:
    rows = read_trace(AZURE)
    assert len(rows) == 500
    assert (rows[0].offset_ns, rows[0].isl_tokens, rows[0].osl_tokens) == (0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900
    assert rows[1].offset_ns == 4_314_579_000
    assert (rows[1].isl_tokens, rows[1].osl_tokens) == (396, 109)
    assert rows[-1].hash_ids == ()
    assert read_trace(AZURE, max_rows=10)[-1] == rows[9]


def test_bad_trace_lines_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: not JSON"):
        read_trace(p)
    q = tmp_path / "t.csv"
    q.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot tell the trace format"):
        read_trace(q)
    with pytest.raises(ValueError, match="expected CSV columns"):
        read_trace(q, "azure")


@pytest.mark.parametrize("fmt", [None, "mooncake", "azure"])
@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_trace_says_it_is_empty(tmp_path: Path, fmt: str | None, content: str) -> None:
    """It was "cannot tell the trace format" (or "expected CSV columns")."""
    p = tmp_path / "t.jsonl"
    p.write_text(content)
    with pytest.raises(ValueError, match=r"is empty: no requests in it|has no requests"):
        read_trace(p, fmt)
    if fmt is None:
        with pytest.raises(ValueError, match=r"t.jsonl is empty: no requests in it"):
            read_trace(p)


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Australia/Lord_Howe"])
def test_azure_times_are_utc_whatever_the_machines_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        zone: str) -> None:
    """Two rows across New York's 2023-03-12 spring-forward (02:00 EST -> 03:00 EDT): 3,602 s apart in
    UTC, the traces' zone; read as local time they were 2 s apart under TZ=America/New_York."""
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-03-12 01:59:59.5000000,10,2\n"
                 "2023-03-12 03:00:01.5000000,10,2\n2023-11-05 01:30:00.0000000,10,2\n")
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        rows = read_trace(p)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [r.offset_ns for r in rows[:2]] == [0, 3_602_000_000_000]
    first = datetime(2023, 3, 12, 1, 59, 59, 500000, tzinfo=UTC)
    third = datetime(2023, 11, 5, 1, 30, tzinfo=UTC)  # New York's fall-back hour: ambiguous locally
    assert rows[2].offset_ns == round((third - first).total_seconds() * 1e9)


class StubTokenizer:
    """One token per space-separated word; text keyed deterministically."""

    name = "stub"

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def make_text(self, n_tokens: int, key: object) -> str:
        tag = abs(hash(repr(key))) % 10_000
        return "".join(f"w{tag}_{i} " for i in range(n_tokens))


def test_shared_hash_ids_give_shared_prefix_text() -> None:
    rows = read_trace(MOONCAKE, max_rows=2)
    b = PromptBuilder(StubTokenizer())
    p0 = b.build(rows[0].isl_tokens, 0, rows[0].hash_ids)
    p1 = b.build(rows[1].isl_tokens, 1, rows[1].hash_ids)
    tok = StubTokenizer()
    assert tok.count_tokens(p0) == 6758 and tok.count_tokens(p1) == 7322
    w0, w1 = p0.split(), p1.split()
    # hash id 0 is shared: the first 512 tokens are identical, the 513th differs
    assert w0[:512] == w1[:512]
    assert w0[512] != w1[512]


def test_real_sim_tokenizer_exact_lengths_and_shared_blocks() -> None:
    from servelens.bench.prompts import SimTokenizer
    from servelens.sim.tokenizer import count_tokens, tokenize

    rows = read_trace(MOONCAKE, max_rows=5)
    b = PromptBuilder(SimTokenizer())
    prompts = [b.build(r.isl_tokens, i, r.hash_ids) for i, r in enumerate(rows)]
    assert [count_tokens(p) for p in prompts] == [r.isl_tokens for r in rows]
    ids0, ids1 = tokenize(prompts[0]), tokenize(prompts[1])
    assert ids0[:512] == ids1[:512] and ids0[512:520] != ids1[512:520]
    # same inputs, same text (deterministic across builders)
    assert PromptBuilder(SimTokenizer()).build(rows[3].isl_tokens, 3, rows[3].hash_ids) == prompts[3]


def test_clip_row_cuts_blocks() -> None:
    row = read_trace(MOONCAKE, max_rows=1)[0]
    c = clip_row(row, 1000)
    assert c.isl_tokens == 1000 and c.hash_ids == (0, 1)
    assert clip_row(row, 10_000) is row
