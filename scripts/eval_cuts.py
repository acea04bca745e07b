"""Cut the eval data shipped in ``src/servelens/data/eval/`` from the full files in ``../shared/data/eval``.

Every cut is the first rows of its file, byte for byte (a CSV row may span lines: rows are counted
by the csv module, the bytes copied as they are). Run from the repository root:
``python scripts/eval_cuts.py /path/to/shared/data/eval``.
"""

from __future__ import annotations

import csv
import io
import shutil
import sys
from pathlib import Path

DEST = Path(__file__).resolve().parents[1] / "src" / "servelens" / "data" / "eval"
GSM8K_ROWS = 100
MGSM_ROWS = 25
MMLU_ROWS = 20
MMLU_SUBJECTS = ("abstract_algebra", "high_school_computer_science", "college_biology", "world_religions",
                 "high_school_macroeconomics", "astronomy")
BFCL_ROWS = 10


def head_lines(src: Path, dst: Path, n: int) -> None:
    """The first ``n`` lines of ``src`` into ``dst``, bytes unchanged."""
    with src.open("rb") as f:
        lines = [f.readline() for _ in range(n)]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(b"".join(lines))


def head_csv_rows(src: Path, dst: Path, n: int) -> None:
    """The header and the first ``n`` CSV records of ``src`` into ``dst``, bytes unchanged."""
    text = src.read_bytes().decode("utf-8")
    end = 0
    for line in text.splitlines(keepends=True):
        end += len(line)
        if _complete(text[:end]) and len(list(csv.reader(io.StringIO(text[:end], newline="")))) == n + 1:
            break
    else:
        raise ValueError(f"{src} has fewer than {n} rows")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(text[:end].encode("utf-8"))


def _complete(text: str) -> bool:
    """Whether ``text`` ends outside a quoted field (an even number of quotes)."""
    return text.count('"') % 2 == 0


def main(shared: Path) -> None:
    """Write every cut."""
    head_lines(shared / "gsm8k" / "test.jsonl", DEST / "gsm8k" / "test.jsonl", GSM8K_ROWS)
    for f in sorted((shared / "mgsm").glob("mgsm_*.tsv")):
        head_lines(f, DEST / "mgsm" / f.name, MGSM_ROWS)
    for s in MMLU_SUBJECTS:
        head_csv_rows(shared / "mmlu" / "test" / f"{s}_test.csv", DEST / "mmlu" / "test" / f"{s}_test.csv", MMLU_ROWS)
        (DEST / "mmlu" / "dev").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shared / "mmlu" / "dev" / f"{s}_dev.csv", DEST / "mmlu" / "dev" / f"{s}_dev.csv")
    b = shared / "bfcl_v3_multi_turn"
    head_lines(b / "BFCL_v3_multi_turn_base.json", DEST / "bfcl_v3_multi_turn" / "BFCL_v3_multi_turn_base.json",
               BFCL_ROWS)
    head_lines(b / "possible_answer" / "BFCL_v3_multi_turn_base.json",
               DEST / "bfcl_v3_multi_turn" / "possible_answer" / "BFCL_v3_multi_turn_base.json", BFCL_ROWS)
    for f in sorted((b / "multi_turn_func_doc").glob("*.json")):
        (DEST / "bfcl_v3_multi_turn" / "multi_turn_func_doc").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, DEST / "bfcl_v3_multi_turn" / "multi_turn_func_doc" / f.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("../shared/data/eval"))
