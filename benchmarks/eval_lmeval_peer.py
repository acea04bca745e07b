"""Peer check: our GSM8K answer extraction against lm-evaluation-harness's ``flexible-extract`` filter,
on the same replies.

lm-eval runs in a side virtualenv (it is no dependency of servelens): its own ``RegexFilter`` with the
``flexible-extract`` settings of its ``gsm8k.yaml`` (pattern ``(-?[$0-9.,]{2,})|(-?[0-9]+)``,
``group_select -1``, then ``take_first``) and its ``exact_match`` metric with that file's settings
(``regexes_to_ignore`` ``,`` ``$`` ``(?s).*#### `` ``\\.$``, ``ignore_case``), read from the installed
package. Replies come from eval records (``records.jsonl`` of ``servelens eval run`` on GSM8K or MGSM:
a real model's replies) and a built-in list of hand-written edge cases.

    python3 -m venv .scratch/lmeval-venv
    .scratch/lmeval-venv/bin/pip install --no-deps lm-eval==0.4.13
    .scratch/lmeval-venv/bin/pip install numpy pyyaml sacrebleu
    python benchmarks/eval_lmeval_peer.py --lm-eval-python .scratch/lmeval-venv/bin/python \\
        --records .scratch/eval-llama/a/gsm8k/records.jsonl --records .scratch/eval-llama/a/mgsm/records.jsonl

Prints the agreement rate where both define an answer, and every disagreement with its reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from servelens.eval.scoring import extract_number, normalize_number, numbers_equal
from servelens.eval.suites import read_text_suite

HAND = [  # (reply, gold)
    ("#### 18", "18"), ("The answer is 18.", "18"), ("#### 1,234", "1234"), ("#### $18.00", "18"),
    ("#### -7", "-7"), ("16 - 3 - 4 = 9 eggs. #### 9", "9"), ("#### 13 #### 14", "14"),
    ("#### 13\nThat is 13 dollars for 2 days.", "13"), ("So 18.", "18"), ("It costs $5.", "5"),
    ("#### 18.0", "18"), ("She sold 3,000 eggs", "3000"), ("I don't know", "5"), ("16-3-4=9", "9"),
    ("5\u202f600 euros", "5600"), ("#### 0.5", "0.5"), ("About 12,34", "1234"),
]

LM_EVAL_SIDE = r"""
import json, re, sys
from pathlib import Path
from typing import Any

import yaml
import lm_eval
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter
from lm_eval.filters.selection import TakeFirstFilter

cfg = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml").read_text())
flex = next(f for f in cfg["filter_list"] if f["name"] == "flexible-extract")["filter"]
regex = next(f for f in flex if f["function"] == "regex")
metric = next(m for m in cfg["metric_list"] if m["metric"] == "exact_match")
rows = json.load(sys.stdin)
filt = RegexFilter(regex_pattern=regex["regex_pattern"], group_select=regex["group_select"])
extracted = list(TakeFirstFilter().apply(filt.apply([[r["reply"]] for r in rows], rows), rows))
out = []
for r, e in zip(rows, extracted):
    em = exact_match_hf_evaluate([e], [r["target"]], regexes_to_ignore=metric["regexes_to_ignore"],
                                 ignore_case=metric["ignore_case"], ignore_punctuation=metric["ignore_punctuation"])
    out.append({"extracted": e, "correct": bool(em["exact_match"])})
print(json.dumps({"version": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?", "rows": out}))
"""


def reason(reply: str, ours: str | None, method: str | None, theirs_raw: str, theirs_num: str | None) -> str:
    """Why the two disagree, in a few words (the rules that differ)."""
    if ours is not None and theirs_num is not None and ours == theirs_num:
        return "same number; lm-eval compares strings after its regexes (e.g. '18.00' or '5.' vs '18'/'5')"
    if method == "####" and theirs_num is not None:
        return "ours: the number after the last ####; lm-eval: the last number-like text in the whole reply"
    if theirs_raw.startswith("-") and ours is not None and not ours.startswith("-"):
        return "lm-eval reads a hyphen between numbers as a minus sign"
    if "\u202f" in reply or "\u00a0" in reply:
        return "thousands separated by a (thin) no-break space: ours joins them, lm-eval splits"
    if "," in theirs_raw and theirs_num != ours:
        return "a comma not followed by three digits: lm-eval drops it ('12,34' -> 1234), ours ends the number"
    if theirs_raw.count(".") > 1:
        return "a run of dotted numbers ('1.1.1...'): lm-eval keeps the whole run as one token, ours the last number"
    return f"other: ours {ours!r}, lm-eval {theirs_raw!r}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval-python", required=True, help="python of the side venv with lm-eval")
    ap.add_argument("--records", action="append", type=Path, default=[], help="records.jsonl of a GSM8K/MGSM run")
    ap.add_argument("--gsm8k", type=Path, help="the GSM8K file the records were run on (default: the packaged cut)")
    ap.add_argument("--mgsm", type=Path, help="the MGSM folder the records were run on (default: the packaged cut)")
    args = ap.parse_args()
    # lm-eval's target is GSM8K's whole answer, which its regexes cut to the text after "#### "
    rows = [{"source": "hand", "item": "", "reply": r, "gold": g, "target": f"#### {g}"} for r, g in HAND]
    golds = {i.id: i.gold for s, d in (("gsm8k", args.gsm8k), ("mgsm", args.mgsm)) for i in read_text_suite(s, d)}
    for f in args.records:
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec["reply"] is not None:
                gold = golds[rec["item"]]
                rows.append({"source": f.parent.name, "item": rec["item"], "reply": rec["reply"], "gold": gold,
                             "target": f"#### {gold}"})
    proc = subprocess.run([args.lm_eval_python, "-c", LM_EVAL_SIDE], input=json.dumps(rows), capture_output=True,
                          text=True, check=True)
    side = json.loads(proc.stdout)["rows"]
    pairs = list(zip(rows, side, strict=True))
    report("hand-written replies", [(r, t) for r, t in pairs if r["source"] == "hand"])
    report("model replies (records)", [(r, t) for r, t in pairs if r["source"] != "hand"])


def report(title: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    """Agreement of one set of replies: on right/wrong and on the extracted number, and every
    disagreement with its reason."""
    both = agree = same = only_ours = only_theirs = 0
    verdict: list[str] = []
    value: list[str] = []
    reasons: Counter[str] = Counter()
    value_reasons: Counter[str] = Counter()
    for r, t in pairs:
        ours = extract_number(r["reply"])
        if ours is None or t["extracted"] == "[invalid]":
            only_ours += ours is not None
            only_theirs += ours is None and t["extracted"] != "[invalid]"
            continue
        both += 1
        theirs = normalize_number(t["extracted"].replace(",", ""))  # lm-eval's metric drops every comma
        tail = r["reply"][-90:].replace("\n", "\\n")
        why = reason(r["reply"], ours.value, ours.method, t["extracted"], theirs)
        if theirs == ours.value:
            same += 1
        else:
            value_reasons[why] += 1
            value.append(f"- {r['item'] or 'hand'}: ours {ours.value} ({ours.method}); lm-eval "
                         f"{t['extracted'][:40]!r}; {why}; reply ends ...{tail!r}")
        right = numbers_equal(ours.value, r["gold"])
        if right == t["correct"]:
            agree += 1
            continue
        reasons[why] += 1
        verdict.append(f"- {r['item'] or 'hand'}: gold {r['gold']}; ours {ours.value} ({ours.method}, "
                       f"{'right' if right else 'wrong'}); lm-eval {t['extracted'][:40]!r} "
                       f"({'right' if t['correct'] else 'wrong'}); {why}; reply ends ...{tail!r}")
    print(f"== {title}: {len(pairs)}; both define an answer: {both}; only ours: {only_ours}; only lm-eval: "
          f"{only_theirs}")
    if not both:
        return
    print(f"agree on right/wrong: {agree} of {both} ({agree / both:.1%}); same extracted number: {same} of {both} "
          f"({same / both:.1%})")
    for name, counts, lines in (("right/wrong", reasons, verdict), ("extracted-number", value_reasons, value)):
        print(f"{name} disagreements by reason:")
        for why, n in counts.most_common():
            print(f"  {n:4d}  {why}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
