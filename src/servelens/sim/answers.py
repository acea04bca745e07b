"""Answering eval items from their answer key with a set accuracy: the known truth that checks
``servelens eval``'s statistics (how often ``compare`` calls a true gap real, and a null gap real).

Pure: no I/O but :meth:`AnswerKey.read`, no clock, no randomness beyond SHA-256 of the inputs.

An answer key is JSON Lines, one object per item: ``item`` (the eval's item id), ``prompt`` (the text
of the last user message the eval sends for it), ``correct`` (a reply the eval scores right) and
``wrong`` (a reply it scores wrong); ``servelens.eval.suites.answer_key`` writes them. A request is
matched to its item by the SHA-256 of its last user message.

Whether a deployment answers an item right (:func:`answers_right`) is deterministic per item and
seeds. Each deployment has an ``accuracy`` and a ``seed``; the item draws ``u`` uniform in [0, 1) and is
answered right when ``u < accuracy``, so the expected accuracy is exactly ``accuracy``. Two
deployments share an item's difficulty (the same ``u`` from ``shared_seed``) except for a fraction
``independence`` of items, where each deployment draws its own ``u`` from its ``seed`` (which items
those are is drawn per deployment too). ``independence=1``: the deployments err independently;
``0``: the weaker one's right answers are a subset of the stronger one's. Real models sit between:
two quantizations of one model disagree on a few percent of items.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCALE = float(2**64)


def uniform(*key: object) -> float:
    """A number in [0, 1) fixed by ``key`` (the first 8 bytes of SHA-256 of its ``repr``)."""
    digest = hashlib.sha256(repr(key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


@dataclass(frozen=True)
class AnswerPolicy:
    """How one simulated deployment answers.

    Attributes:
        accuracy: the expected fraction of items answered right, in [0, 1].
        seed: this deployment's own draws (a rerun of "the same deployment" uses the same seed; a
            second sample from the same model uses another).
        shared_seed: the draws shared by deployments of one model (item difficulty).
        independence: the fraction of items whose draw is the deployment's own, in [0, 1].
    """

    accuracy: float
    seed: int = 0
    shared_seed: int = 0
    independence: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.accuracy <= 1.0:
            raise ValueError(f"accuracy must be in [0, 1], got {self.accuracy!r}")
        if not 0.0 <= self.independence <= 1.0:
            raise ValueError(f"independence must be in [0, 1], got {self.independence!r}")


def answers_right(item: str, policy: AnswerPolicy) -> bool:
    """Whether a deployment with ``policy`` answers ``item`` right (see the module docstring)."""
    own = uniform("own?", policy.seed, item) < policy.independence
    u = uniform("u", policy.seed, item) if own else uniform("shared", policy.shared_seed, item)
    return u < policy.accuracy


@dataclass(frozen=True)
class AnswerEntry:
    """One item of an answer key (fields as in the module docstring)."""

    item: str
    prompt: str
    correct: str
    wrong: str


def prompt_digest(text: str) -> str:
    """The hex SHA-256 of a prompt text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _last_user_text(messages: Sequence[Any]) -> str | None:
    for m in reversed(messages):
        if isinstance(m, Mapping) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):  # content parts: the text parts joined
                return "".join(p.get("text", "") for p in c if isinstance(p, Mapping) and p.get("type") == "text")
            return None
    return None


class AnswerKey:
    """Answer-key entries by the digest of their prompt."""

    def __init__(self, entries: Iterable[AnswerEntry]) -> None:
        self._by_prompt = {prompt_digest(e.prompt): e for e in entries}

    def __len__(self) -> int:
        return len(self._by_prompt)

    @classmethod
    def read(cls, path: str | Path) -> AnswerKey:
        """Read a JSON Lines answer key. Raises ValueError (one line) for a malformed line, OSError
        when unreadable."""
        entries = []
        p = Path(path)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines()):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                entries.append(AnswerEntry(str(o["item"]), str(o["prompt"]), str(o["correct"]), str(o["wrong"])))
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{p} line {n + 1}: not an answer-key line (item, prompt, correct, wrong)") from None
        return cls(entries)

    def lookup(self, messages: Sequence[Any]) -> AnswerEntry | None:
        """The entry whose prompt is the last user message of ``messages`` (chat messages), or None."""
        text = _last_user_text(messages)
        return None if text is None else self._by_prompt.get(prompt_digest(text))

    def reply(self, messages: Sequence[Any], policy: AnswerPolicy) -> str | None:
        """The reply a deployment with ``policy`` gives to ``messages``: the entry's ``correct`` or
        ``wrong`` text by :func:`answers_right`; None when the prompt is not in the key."""
        entry = self.lookup(messages)
        if entry is None:
            return None
        return entry.correct if answers_right(entry.item, policy) else entry.wrong


def answered(
    key: AnswerKey | None, policy: AnswerPolicy, messages: Any, max_tokens: int
) -> tuple[list[str], str] | None:
    """What the simulated engine sends for a chat request that is an eval item: the reply's words (one
    token each, sent as ``" " + word`` as the sim's generated words are) and the finish reason
    (``"stop"``, or ``"length"`` when ``max_tokens`` cuts the reply). None when there is no key, the
    messages are not a list, or their last user message is not in the key (the sim generates as usual)."""
    if key is None or not isinstance(messages, list):
        return None
    reply = key.reply(messages, policy)
    if reply is None:
        return None
    words = reply.split()
    if len(words) > max_tokens:
        return words[:max_tokens], "length"
    return words, "stop"
