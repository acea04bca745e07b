"""Eval suites: readers of the public data formats, the prompts sent, and how a reply is scored.

Suites (name: format; item id; group):

* ``gsm8k``: GSM8K ``test.jsonl`` (``question``, ``answer`` ending ``#### <number>``); ``gsm8k/<row>``; none.
* ``mgsm``: a folder of MGSM ``mgsm_<lang>.tsv`` (question TAB answer, no header; row i is the same
  problem in every language); ``mgsm/<lang>/<row>``; the language.
* ``mmlu``: an MMLU folder with ``test/<subject>_test.csv`` (and ``dev/<subject>_dev.csv`` for
  few-shot exemplars), header ``question,choice0..choice3,answer`` with a 0-based answer index;
  ``mmlu/<subject>/<row>``; the subject.
* ``bfcl``: BFCL v3 multi-turn base (see :mod:`servelens.eval.bfcl`); one item per turn,
  ``bfcl/<entry id>/<turn>``; the entry's first API class.

Without ``data`` a suite reads the small cut shipped in the package (``servelens/data/eval``, with its
license and attribution); rows are numbered from 0 in file order, so a cut's item ids are those of the
full file.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

from servelens.eval.scoring import LETTERS, extract_letter, extract_number, normalize_number, numbers_equal

SUITE_NAMES = ("gsm8k", "mgsm", "mmlu", "bfcl")
DEFAULT_MAX_TOKENS = {"gsm8k": 512, "mgsm": 512, "mmlu": 32, "bfcl": 256}
"""Reply budget per request (``max_tokens``) when ``--max-tokens`` is not given."""

GSM8K_PROMPT = ("Solve the following math problem step by step. End your reply with a last line of the form "
                "'#### <number>' giving the final answer as a number.\n\nQuestion: {question}")
MMLU_PROMPT = ("The following is a multiple choice question about {subject}. Reply with 'Answer: X', where X "
               "is the letter (A, B, C or D) of the correct choice.\n\n{question}\n{choices}")
MMLU_HEADER = ["question", "choice0", "choice1", "choice2", "choice3", "answer"]


@dataclass(frozen=True)
class TextItem:
    """One single-request item.

    Attributes:
        id: stable item id (pairs items across deployments).
        group: language or subject; None for suites without groups.
        messages: the chat messages sent (few-shot exemplars included).
        gold: the gold answer (``"18"``, ``"B"``).
    """

    id: str
    group: str | None
    messages: tuple[Mapping[str, str], ...]
    gold: str


@dataclass(frozen=True)
class Scored:
    """A reply scored.

    Attributes:
        extracted: the answer read from the reply (None: extraction failed).
        method: how it was read (``"####"``, ``"last_number"``, ``"strict"``, ``"lenient"``; None on failure).
        correct: whether it equals the gold answer.
    """

    extracted: str | None
    method: str | None
    correct: bool


def packaged_data(suite: str) -> Path:
    """The folder or file of the cut shipped for ``suite``."""
    base = Path(str(resources.files("servelens").joinpath("data", "eval")))
    return {"gsm8k": base / "gsm8k" / "test.jsonl", "mgsm": base / "mgsm", "mmlu": base / "mmlu",
            "bfcl": base / "bfcl_v3_multi_turn"}[suite]


def _user(text: str) -> Mapping[str, str]:
    return {"role": "user", "content": text}


def read_gsm8k(path: Path) -> list[TextItem]:
    """GSM8K items from a ``test.jsonl``. Raises ValueError (one line) for another format, OSError
    when unreadable."""
    items = []
    with path.open(encoding="utf-8") as f:
        for row, line in enumerate(f):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not (isinstance(obj, dict) and isinstance(obj.get("question"), str)
                    and isinstance(obj.get("answer"), str) and "####" in obj["answer"]):
                raise ValueError(f"{path} line {row + 1}: not GSM8K test.jsonl format (a JSON object with "
                                 "'question' and an 'answer' ending '#### <number>')")
            gold = obj["answer"].rsplit("####", 1)[1].strip()
            items.append(TextItem(f"gsm8k/{row}", None, (_user(GSM8K_PROMPT.format(question=obj["question"])),),
                                  gold))
    return items


def read_mgsm(folder: Path) -> list[TextItem]:
    """MGSM items from a folder of ``mgsm_<lang>.tsv`` files (languages in name order). Raises
    ValueError for a folder without them or a row that is not ``question TAB answer``."""
    files = [folder] if folder.is_file() else sorted(folder.glob("mgsm_*.tsv"))
    if not files:
        raise ValueError(f"{folder}: no mgsm_<lang>.tsv files (MGSM format)")
    items = []
    for f in files:
        lang = f.stem.removeprefix("mgsm_")
        with f.open(encoding="utf-8", newline="") as fh:
            for row, line in enumerate(fh):
                parts = line.rstrip("\r\n").split("\t")
                if len(parts) != 2 or not parts[0].strip() or extract_number(parts[1]) is None:
                    raise ValueError(f"{f} line {row + 1}: not MGSM format (question TAB numeric answer)")
                items.append(TextItem(f"mgsm/{lang}/{row}", lang, (_user(GSM8K_PROMPT.format(question=parts[0])),),
                                      parts[1].strip()))
    return items


def _mmlu_rows(path: Path) -> list[list[str]]:
    text = path.read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or rows[0] != MMLU_HEADER:
        raise ValueError(f"{path}: not MMLU CSV format (header {','.join(MMLU_HEADER)})")
    for i, r in enumerate(rows[1:]):
        if len(r) != 6 or r[5] not in ("0", "1", "2", "3"):
            raise ValueError(f"{path} row {i + 1}: not MMLU CSV format (6 fields, answer 0-3)")
    return rows[1:]


def _mmlu_question(subject: str, row: Sequence[str]) -> str:
    choices = "\n".join(f"{LETTERS[i]}. {row[1 + i]}" for i in range(4))
    return MMLU_PROMPT.format(subject=subject.replace("_", " "), question=row[0], choices=choices)


def read_mmlu(folder: Path, shots: int = 0) -> list[TextItem]:
    """MMLU items from ``folder/test/*_test.csv`` (subjects in name order); with ``shots`` > 0 the
    first ``shots`` rows of ``folder/dev/<subject>_dev.csv`` go before each question as user/assistant
    turns answering ``Answer: X``. Raises ValueError for another format or missing dev rows."""
    test = folder / "test"
    files = sorted(test.glob("*_test.csv")) if test.is_dir() else []
    if not files:
        raise ValueError(f"{folder}: no test/<subject>_test.csv files (MMLU format)")
    items = []
    for f in files:
        subject = f.name.removesuffix("_test.csv")
        exemplars: list[Mapping[str, str]] = []
        if shots:
            dev = _mmlu_rows(folder / "dev" / f"{subject}_dev.csv")
            if len(dev) < shots:
                raise ValueError(f"{folder}/dev/{subject}_dev.csv has {len(dev)} rows, fewer than --shots {shots}")
            for r in dev[:shots]:
                exemplars += [_user(_mmlu_question(subject, r)),
                              {"role": "assistant", "content": f"Answer: {LETTERS[int(r[5])]}"}]
        for row, r in enumerate(_mmlu_rows(f)):
            items.append(TextItem(f"mmlu/{subject}/{row}", subject,
                                  (*exemplars, _user(_mmlu_question(subject, r))), LETTERS[int(r[5])]))
    return items


def score_text(suite: str, item: TextItem, reply: str) -> Scored:
    """Score a reply to a GSM8K, MGSM or MMLU item (rules in :mod:`servelens.eval.scoring`)."""
    if suite == "mmlu":
        letter = extract_letter(reply)
        if letter is None:
            return Scored(None, None, False)
        return Scored(letter.letter, letter.method, letter.letter == item.gold)
    number = extract_number(reply)
    if number is None:
        return Scored(None, None, False)
    return Scored(number.value, number.method, numbers_equal(number.value, item.gold))


def select(items: Sequence[Any], groups: Sequence[str] | None, limit: int | None) -> list[Any]:
    """Items of the named ``groups`` (all when None), at most ``limit`` per group (in total for items
    without a group), in file order. Raises ValueError for a group the suite does not have."""
    have = {i.group for i in items}
    if groups:
        unknown = [g for g in groups if g not in have]
        if unknown:
            listed = ", ".join(sorted(g for g in have if g is not None)) or "none"
            raise ValueError(f"no group {', '.join(unknown)} in this suite (groups: {listed})")
    out = []
    seen: dict[str | None, int] = {}
    for it in items:
        if groups and it.group not in groups:
            continue
        if limit is not None and seen.get(it.group, 0) >= limit:
            continue
        seen[it.group] = seen.get(it.group, 0) + 1
        out.append(it)
    return out


def dump_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as plain dicts (what goes into a request body)."""
    return [dict(m) for m in messages]


def read_text_suite(suite: str, data: Path | None, shots: int = 0) -> list[TextItem]:
    """Every item of a text suite (``gsm8k``, ``mgsm``, ``mmlu``) from ``data`` or the packaged cut."""
    path = data if data is not None else packaged_data(suite)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    if suite == "gsm8k":
        if path.is_dir():
            path = path / "test.jsonl"
        return read_gsm8k(path)
    if suite == "mgsm":
        return read_mgsm(path)
    if suite == "mmlu":
        return read_mmlu(path, shots)
    raise ValueError(f"unknown text suite {suite!r}")


def answer_key(suite: str, items: Sequence[TextItem]) -> list[dict[str, str]]:
    """Answer-key lines for :mod:`servelens.sim.answers`: per item its id, the text of its last user
    message, a reply this suite scores right (``#### <gold>``, ``Answer: <gold>``) and one it scores
    wrong (gold + 1; the next letter)."""
    out = []
    for it in items:
        if suite == "mmlu":
            right, wrong = f"Answer: {it.gold}", f"Answer: {LETTERS[(LETTERS.index(it.gold) + 1) % 4]}"
        else:
            gold = normalize_number(it.gold)
            assert gold is not None  # the readers refuse items without a numeric answer
            right, wrong = f"The answer is\n#### {gold}", f"The answer is\n#### {Decimal(gold) + 1}"
        out.append({"item": it.id, "prompt": it.messages[-1]["content"], "correct": right, "wrong": wrong})
    return out
