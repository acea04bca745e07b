"""Answering eval items from the answer key with a set accuracy (the known truth for eval's method check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelens.sim.answers import AnswerEntry, AnswerKey, AnswerPolicy, answered, answers_right, uniform

ITEMS = [f"gsm8k/{i}" for i in range(10_000)]


def accuracy(policy: AnswerPolicy) -> float:
    return sum(answers_right(i, policy) for i in ITEMS) / len(ITEMS)


def test_deterministic_per_item_and_seed() -> None:
    p = AnswerPolicy(0.8, seed=3)
    assert [answers_right(i, p) for i in ITEMS[:200]] == [answers_right(i, p) for i in ITEMS[:200]]
    assert [answers_right(i, p) for i in ITEMS[:200]] != [answers_right(i, AnswerPolicy(0.8, seed=4))
                                                           for i in ITEMS[:200]]
    assert 0.0 <= uniform("x") < 1.0 and uniform("x") == uniform("x")


def test_accuracy_is_the_set_one() -> None:
    # 10,000 draws: the binomial SD is 0.004; these are fixed numbers (SHA-256), not a random test
    for acc in (0.0, 0.3, 0.8, 1.0):
        assert accuracy(AnswerPolicy(acc, seed=1, independence=0.5)) == pytest.approx(acc, abs=0.012)


def test_independence_sets_the_overlap() -> None:
    strong, weak = AnswerPolicy(0.8, seed=1, independence=0.0), AnswerPolicy(0.78, seed=2, independence=0.0)
    only_weak = sum(answers_right(i, weak) and not answers_right(i, strong) for i in ITEMS)
    assert only_weak == 0  # no own draws: the weaker one's right answers are a subset
    a, b = AnswerPolicy(0.8, seed=1, independence=1.0), AnswerPolicy(0.8, seed=2, independence=1.0)
    disagree = sum(answers_right(i, a) != answers_right(i, b) for i in ITEMS) / len(ITEMS)
    assert disagree == pytest.approx(2 * 0.8 * 0.2, abs=0.015)  # independent: 32 % disagree
    c, d = AnswerPolicy(0.8, seed=1, independence=0.2), AnswerPolicy(0.8, seed=2, independence=0.2)
    few = sum(answers_right(i, c) != answers_right(i, d) for i in ITEMS) / len(ITEMS)
    assert 0.02 < few < 0.12  # most items shared: a few percent disagree


def test_policy_checks() -> None:
    with pytest.raises(ValueError):
        AnswerPolicy(1.2)
    with pytest.raises(ValueError):
        AnswerPolicy(0.5, independence=-0.1)


def test_key_lookup_by_last_user_message(tmp_path: Path) -> None:
    key = AnswerKey([AnswerEntry("gsm8k/0", "What is 2+2?", "#### 4", "#### 5")])
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2+2?"}]
    assert key.reply(msgs, AnswerPolicy(1.0)) == "#### 4"
    assert key.reply(msgs, AnswerPolicy(0.0)) == "#### 5"
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]
    assert key.reply(parts, AnswerPolicy(1.0)) == "#### 4"
    assert key.reply([{"role": "user", "content": "What is 3+3?"}], AnswerPolicy(1.0)) is None
    path = tmp_path / "key.jsonl"
    path.write_text('{"item": "a", "prompt": "p", "correct": "c", "wrong": "w"}\n\n')
    assert len(AnswerKey.read(path)) == 1
    path.write_text('{"item": "a"}\n')
    with pytest.raises(ValueError, match="line 1: not an answer-key line"):
        AnswerKey.read(path)


def test_answered_words_for_the_server() -> None:
    key = AnswerKey([AnswerEntry("gsm8k/0", "What is 2+2?", "The answer is\n#### 4", "#### 5")])
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    assert answered(key, AnswerPolicy(1.0), msgs, 100) == (["The", "answer", "is", "####", "4"], "stop")
    assert answered(key, AnswerPolicy(1.0), msgs, 2) == (["The", "answer"], "length")
    assert answered(key, AnswerPolicy(1.0), [{"role": "user", "content": "other"}], 100) is None
    assert answered(None, AnswerPolicy(1.0), msgs, 100) is None
    assert answered(key, AnswerPolicy(1.0), "not a list", 100) is None
