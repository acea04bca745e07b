"""Scoring eval replies: pure functions, no I/O.

* GSM8K / MGSM: :func:`extract_number` reads the final number of a reply; :func:`numbers_equal` compares
  it with the gold answer after normalisation.
* MMLU: :func:`extract_letter` reads the chosen letter, strictly first, then leniently.
* Function calling: :func:`score_turn` compares the tool calls a model made in one turn with the
  reference calls of that turn (:class:`TurnScore`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

# --- numbers (GSM8K, MGSM) ---------------------------------------------------------------------------

# A number: an optional minus (ASCII or U+2212) that does not follow a word character (so "16-3" is
# 16 and 3, not 16 and -3), an optional currency sign (a minus may follow it: "$-5"), digits with
# thousands groups (",", or the no-break and thin spaces French writes) or plain digits, an optional
# decimal part after ".".
# A comma not followed by exactly three digits ends the number: "." is the only decimal point.
_NUMBER = re.compile(
    r"(?:(?<![\w.])(?P<sign>[-\u2212]))?\s?(?:[$€£¥₹]\s?(?P<sign2>[-\u2212])?)?"
    r"(?P<int>\d{1,3}(?:[,\u00a0\u202f\u2009]\d{3})+(?!\d)|\d+)(?:\.(?P<frac>\d+))?"
)
ANSWER_MARK = "####"


@dataclass(frozen=True)
class ExtractedNumber:
    """A reply's final answer.

    Attributes:
        value: the number, normalised (``"-1234.5"``: no separators, no currency, no trailing zeros).
        method: ``"####"`` (the first number after the last ``####``) or ``"last_number"``.
    """

    value: str
    method: str


def normalize_number(text: str) -> str | None:
    """The first number in ``text`` in canonical form (``"$1,234.50"`` -> ``"1234.5"``, ``"18."`` -> ``"18"``,
    ``"−3"`` -> ``"-3"``), None when there is none."""
    m = _NUMBER.search(text)
    return None if m is None else _canonical(m)


def _canonical(m: re.Match[str]) -> str | None:
    digits = re.sub(r"[^\d]", "", m.group("int"))
    frac = m.group("frac")
    negative = bool(m.group("sign") or m.group("sign2"))
    try:
        d = Decimal(digits + ("." + frac if frac else ""))
    except InvalidOperation:  # pragma: no cover - the regex admits digits only
        return None
    if negative:
        d = -d
    out = format(d.normalize(), "f")
    return "0" if out in ("-0", "0") else out


def extract_number(reply: str) -> ExtractedNumber | None:
    """The final numeric answer of a GSM8K-style reply.

    The first number after the LAST ``####`` (the answer format GSM8K's own solutions end with);
    when there is no ``####``, or no number after the last one, the last number in the reply.
    Normalised by :func:`normalize_number`'s rules: thousands separators (``,`` before three digits,
    no-break or thin spaces), a currency sign, a trailing ``.0``/``.`` and trailing zeros are dropped;
    ``.`` is the only decimal point (``3,5`` is 3 and 5). None when the reply has no number at all
    (an extraction failure, counted apart from a wrong answer).
    """
    cut = reply.rfind(ANSWER_MARK)
    if cut >= 0:
        value = normalize_number(reply[cut + len(ANSWER_MARK):])
        if value is not None:
            return ExtractedNumber(value, ANSWER_MARK)
    last = None
    for m in _NUMBER.finditer(reply):
        last = m
    if last is None:
        return None
    value = _canonical(last)
    return None if value is None else ExtractedNumber(value, "last_number")


def numbers_equal(extracted: str, gold: str) -> bool:
    """Whether an extracted value equals the gold answer numerically (``"18"`` == ``"18.00"`` == ``"$18"``).
    A gold answer without a number never matches."""
    g = normalize_number(gold)
    if g is None:
        return False
    return Decimal(extracted) == Decimal(g)


# --- letters (MMLU) ----------------------------------------------------------------------------------

LETTERS = "ABCD"
_FULLWIDTH = str.maketrans({"Ａ": "A", "Ｂ": "B", "Ｃ": "C", "Ｄ": "D", "：": ":", "（": "(", "）": ")", "．": "."})
_STRICT_LONE = re.compile(r"\s*[(\[]?([ABCD])[)\].:]?\s*")
_STRICT_ANSWER = re.compile(r"Answer:\s*\(?([ABCD])(?![A-Za-z])")
# Answer prefixes in the languages of MGSM/MMMLU (English, German, French, Spanish, Italian,
# Portuguese, Russian, Chinese, Japanese, Korean, Swahili, Bengali, Telugu, Thai, Arabic, Hindi).
_PREFIXES = (
    r"(?:the\s+)?(?:correct\s+|final\s+)?answer(?:\s+is)?|antwort(?:\s+ist)?|(?:la\s+)?r[ée]ponse(?:\s+est)?"
    r"|(?:la\s+)?respuesta(?:\s+es)?|(?:la\s+)?risposta(?:\s+è)?|(?:a\s+)?resposta(?:\s+é)?|ответ"
    r"|正确答案是|答案是|答案|答え|回答|正解|정답|답|jibu|উত্তর|సమాధానం|คำตอบ|الإجابة|उत्तर"
)
_LENIENT = (
    re.compile(r"(?i:" + _PREFIXES + r")\s*(?:は|是|为|為|:|-)?\s*(?i:is\s+)?[*_]*\s*(?i:option\s+)?"
               r"[(\[]?([ABCD])(?![A-Za-z])"),
    re.compile(r"\*\*\s*\(?([ABCD])\)?[.:]?\s*\*\*"),
    re.compile(r"\(([ABCD])\)"),
    re.compile(r"(?i:option|choice)\s+([ABCD])(?![A-Za-z])"),
    re.compile(r"(?m)^\s*([ABCD])[).:](?:\s|$)"),
)


@dataclass(frozen=True)
class ExtractedLetter:
    """The choice a reply names.

    Attributes:
        letter: ``"A"``..``"D"``.
        method: ``"strict"`` (``Answer: X`` or a lone letter) or ``"lenient"`` (a localised prefix,
            a full-width letter, ``**B**``, ``(B)``, ``option B``, a line starting ``B)``).
    """

    letter: str
    method: str


def extract_letter(reply: str) -> ExtractedLetter | None:
    """The letter an MMLU-style reply chose: strict (the whole reply is one letter, optionally in
    brackets or followed by ``.``/``:``/``)``; or the last ``Answer: X``), else lenient (the last match of
    the first lenient pattern that matches: a localised answer prefix, ``**X**``, ``(X)``, ``option X``,
    ``X)`` at a line start), after mapping full-width letters to ASCII. None: a format failure."""
    m = _STRICT_LONE.fullmatch(reply)
    if m:
        return ExtractedLetter(m.group(1), "strict")
    hits = _STRICT_ANSWER.findall(reply)
    if hits:
        return ExtractedLetter(hits[-1], "strict")
    text = reply.translate(_FULLWIDTH)
    m = _STRICT_LONE.fullmatch(text)
    if m:
        return ExtractedLetter(m.group(1), "lenient")
    for pattern in _LENIENT:
        hits = pattern.findall(text)
        if hits:
            return ExtractedLetter(hits[-1], "lenient")
    return None


# --- tool calls (BFCL multi-turn) --------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedCall:
    """A reference call: function name and arguments (already named: positional ones mapped)."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class MadeCall:
    """A call the model made: function name and the raw ``arguments`` string it sent."""

    name: str
    arguments: str


@dataclass(frozen=True)
class TurnScore:
    """One turn's tool-calling figures (counts are of calls unless said otherwise).

    Attributes:
        should_call, did_call: the turn's reference has calls / the model made any (the headline
            decision: precision, recall and F1 of "called a tool" over turns).
        expected, made: numbers of reference and model calls.
        name_matches: model calls matched to a reference call of the same function name (multiset).
        exact_matches: model calls matched with the same name and equal arguments (JSON values).
        invalid_json: model calls whose arguments are not a JSON object.
        missing_required: model calls of a known function lacking a required argument.
        unknown_functions: model calls of a function not among the turn's tools (invented).
    """

    should_call: bool
    did_call: bool
    expected: int
    made: int
    name_matches: int
    exact_matches: int
    invalid_json: int
    missing_required: int
    unknown_functions: int

    @property
    def decision_correct(self) -> bool:
        """Called a tool when it should, stayed quiet when it should not."""
        return self.should_call == self.did_call

    @property
    def exact(self) -> bool:
        """Every reference call made with equal arguments and nothing else."""
        return self.exact_matches == self.expected == self.made


def parse_arguments(raw: str) -> dict[str, Any] | None:
    """A tool call's ``arguments`` string as a dict; None when it is not a JSON object. An empty
    string is ``{}`` (engines send it for a call without arguments)."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _same_value(a: Any, b: Any) -> bool:
    """JSON equality, with ints and floats equal by value (``5`` == ``5.0``) and tuples as lists."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return bool(a == b)


def score_turn(
    expected: Sequence[ExpectedCall],
    made: Sequence[MadeCall],
    required: Mapping[str, Sequence[str]],
) -> TurnScore:
    """Score one turn's calls against its reference calls.

    Args:
        expected: the reference calls of the turn (BFCL ``ground_truth`` entry), in order.
        made: every call the model made in the turn (over all its replies in the turn), in order.
        required: the turn's tools: function name -> its required argument names (a name absent
            here is an invented function).

    Name matching is a multiset intersection of function names (order ignored); exact matching pairs
    each made call with an unused reference call of the same name and equal arguments.
    """
    parsed = [(c.name, parse_arguments(c.arguments)) for c in made]
    names_matched = sum((Counter(c.name for c in expected) & Counter(n for n, _ in parsed)).values())
    unused = list(expected)
    exact = 0
    for name, args in parsed:
        if args is None:
            continue
        for i, ref in enumerate(unused):
            if ref.name == name and _same_value(dict(ref.arguments), args):
                exact += 1
                del unused[i]
                break
    invalid = sum(1 for _, a in parsed if a is None)
    unknown = sum(1 for n, _ in parsed if n not in required)
    missing = sum(1 for n, a in parsed if a is not None and n in required and any(r not in a for r in required[n]))
    return TurnScore(
        should_call=bool(expected), did_call=bool(made), expected=len(expected), made=len(made),
        name_matches=names_matched, exact_matches=exact, invalid_json=invalid, missing_required=missing,
        unknown_functions=unknown,
    )


@dataclass(frozen=True)
class PrecisionRecall:
    """Precision, recall and F1 from counts; each None when its denominator is 0."""

    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float | None:
        """tp / (tp + fp)."""
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else None

    @property
    def recall(self) -> float | None:
        """tp / (tp + fn)."""
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else None

    @property
    def f1(self) -> float | None:
        """2 tp / (2 tp + fp + fn) (the harmonic mean of precision and recall)."""
        d = 2 * self.tp + self.fp + self.fn
        return 2 * self.tp / d if d else None


def decision_counts(turns: Sequence[Mapping[str, Any]]) -> PrecisionRecall:
    """The headline of a function-calling eval: over turns, tp = should and did call, fp = called
    when it should not, fn = stayed quiet when it should have called. ``turns`` are mappings with
    boolean ``should_call`` and ``did_call`` (a record's ``metrics``)."""
    tp = sum(1 for t in turns if t["should_call"] and t["did_call"])
    fp = sum(1 for t in turns if not t["should_call"] and t["did_call"])
    fn = sum(1 for t in turns if t["should_call"] and not t["did_call"])
    return PrecisionRecall(tp, fp, fn)


def call_counts(turns: Sequence[Mapping[str, Any]]) -> PrecisionRecall:
    """Function-name matching over calls: tp = matched names, fp = made - matched, fn = expected -
    matched (summed over turns; ``turns`` are records' ``metrics``)."""
    tp = sum(int(t["name_matches"]) for t in turns)
    return PrecisionRecall(tp, sum(int(t["made"]) for t in turns) - tp, sum(int(t["expected"]) for t in turns) - tp)
