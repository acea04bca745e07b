"""BFCL v3 multi-turn function calling: reading the data, the conversation as it is replayed, and
the tool results injected.

Data (the BFCL v3 multi-turn base format, JSON Lines; see ``servelens/data/eval/README.md``): a
questions file (``id``, ``question``: turns of user messages, ``initial_config``, ``involved_classes``,
``path``), ``possible_answer/<same name>`` (``ground_truth``: per turn a list of Python-call strings such
as ``"cd(folder='document')"``) and ``multi_turn_func_doc/*.json`` (one function doc per line; they
become OpenAI ``tools``, BFCL's types mapped to JSON Schema: ``dict`` -> ``object``, ``float`` ->
``number``, ``tuple`` -> ``array``, ``any`` -> no type).

Replay (one item per turn, teacher-forced): turn *t* is sent with the reference history of turns
before it (each turn's user messages, an assistant message with that turn's reference calls, and a
``tool`` message per call with its reference result; ``OK.`` as the assistant's reply to a turn whose
reference has no call), then turn *t*'s user messages. Each model reply with tool calls gets a ``tool``
result per call and the model is asked again, up to ``max_steps`` replies; the turn's calls are scored
against its reference (:func:`servelens.eval.scoring.score_turn`). So every turn of A and of B is
asked in the same context, and an early mistake does not spoil the turns after it.

Tool results come from a :class:`ToolBackend`:

* :class:`BfclExecutor` when the ``bfcl-eval`` package is importable (``pip install --no-deps bfcl-eval
  mpmath``: its API classes are plain Python; its other dependencies are for its own runner): the
  classes are loaded with the entry's ``initial_config``, the reference calls of earlier turns are
  executed on them, and each call (reference or model) is executed there, its result as BFCL
  formats it. The executor calls methods by name with parsed arguments (never ``eval``).
* :class:`StandInResults` otherwise (documented stand-in): a call whose arguments parse and whose
  function exists gets ``{"status": "ok"}`` (the reference calls too), an invented function, invalid
  JSON or a missing required argument gets ``{"error": "..."}``. The model then sees whether its call
  was well-formed, not what the API would have said.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servelens.eval.scoring import ExpectedCall, MadeCall, parse_arguments

QUESTIONS_FILE = "BFCL_v3_multi_turn_base.json"
CLASS_DOCS = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
"""API class -> its function-doc file stem and ``bfcl_eval`` module name (BFCL's own mapping)."""
STATELESS = frozenset({"MathAPI"})
_BFCL_MODULE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
_TYPES = {"dict": "object", "float": "number", "tuple": "array"}
EMPTY_TURN_REPLY = "OK."


@dataclass(frozen=True)
class Conversation:
    """One BFCL entry.

    Attributes:
        id: the entry id (``multi_turn_base_0``).
        group: the API class of the first ground-truth path step (the entry's main API).
        turns: per turn, its user messages.
        reference: per turn, the reference call strings (``"cd(folder='document')"``).
        expected: per turn, the reference calls parsed (positional arguments named).
        tools: the OpenAI ``tools`` of every function of the involved classes.
        required: function name -> required argument names.
        classes: the involved API classes.
        initial_config: the classes' starting state.
    """

    id: str
    group: str
    turns: tuple[tuple[Mapping[str, str], ...], ...]
    reference: tuple[tuple[str, ...], ...]
    expected: tuple[tuple[ExpectedCall, ...], ...]
    tools: tuple[Mapping[str, Any], ...] = field(repr=False)
    required: Mapping[str, tuple[str, ...]] = field(repr=False)
    classes: tuple[str, ...] = ()
    initial_config: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def item_id(self, turn: int) -> str:
        """The item id of ``turn`` (``bfcl/<id>/<turn>``)."""
        return f"bfcl/{self.id}/{turn}"


def _schema(obj: Any) -> Any:
    """BFCL's parameter schema as JSON Schema (types renamed; ``any`` dropped)."""
    if isinstance(obj, dict):
        out = {k: _schema(v) for k, v in obj.items()}
        t = obj.get("type")
        if t == "any":
            del out["type"]
        elif isinstance(t, str):
            out["type"] = _TYPES.get(t, t)
        return out
    if isinstance(obj, list):
        return [_schema(v) for v in obj]
    return obj


def read_docs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Function docs per class stem (``gorilla_file_system`` -> docs), from ``folder/*.json``."""
    docs: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(folder.glob("*.json")):
        docs[f.stem] = [_json_line(f, i, line, ("name", "parameters")) for i, line in
                        enumerate(f.read_text(encoding="utf-8").splitlines()) if line.strip()]
    return docs


def _json_line(path: Path, i: int, line: str, keys: Sequence[str]) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or any(k not in obj for k in keys):
        raise ValueError(f"{path} line {i + 1}: not BFCL v3 multi-turn format (a JSON object with "
                         f"{', '.join(repr(k) for k in keys)})")
    return obj


def parse_call(text: str, params: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """A reference call string (``"grep(file_name='a.txt',pattern='x')"``, ``"sort('a.txt')"``) as
    ``(name, arguments)``; positional arguments take the names of ``params`` in order. Values are
    Python literals (``ast.literal_eval``). Raises ValueError for anything else."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise ValueError(f"reference call {text!r} is not a Python call") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"reference call {text!r} is not a plain function call")
    args: dict[str, Any] = {}
    try:
        for i, a in enumerate(node.args):
            if i >= len(params):
                raise ValueError(f"reference call {text!r} has more positional arguments than its function")
            args[params[i]] = ast.literal_eval(a)
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError(f"reference call {text!r} uses **kwargs")
            args[kw.arg] = ast.literal_eval(kw.value)
    except (ValueError, SyntaxError) as exc:
        if "reference call" in str(exc):
            raise
        raise ValueError(f"reference call {text!r} has a non-literal argument") from None
    return node.func.id, args


def read_bfcl(folder: Path) -> tuple[list[Conversation], list[str]]:
    """Every entry of a BFCL v3 multi-turn base folder (questions, ``possible_answer/``,
    ``multi_turn_func_doc/``), and the ids of entries skipped because their ground truth has another
    number of turns than their questions (``multi_turn_base_154`` in v3: 5 turns, 6 answers).
    Raises ValueError (one line) for missing files or another format."""
    qpath, apath = folder / QUESTIONS_FILE, folder / "possible_answer" / QUESTIONS_FILE
    dpath = folder / "multi_turn_func_doc"
    for p in (qpath, apath, dpath):
        if not p.exists():
            raise ValueError(f"{folder}: no {p.relative_to(folder)} (BFCL v3 multi-turn base layout)")
    docs = read_docs(dpath)
    answers = {}
    for i, line in enumerate(apath.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            a = _json_line(apath, i, line, ("id", "ground_truth"))
            answers[a["id"]] = a["ground_truth"]
    out = []
    skipped = []
    for i, line in enumerate(qpath.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        q = _json_line(qpath, i, line, ("id", "question", "involved_classes"))
        if q["id"] not in answers:
            raise ValueError(f"{apath}: no ground truth for {q['id']}")
        if not isinstance(q["question"], list) or len(answers[q["id"]]) != len(q["question"]):
            skipped.append(q["id"])
            continue
        out.append(_conversation(q, answers[q["id"]], docs, qpath))
    return out, skipped


def _conversation(q: dict[str, Any], truth: list[list[str]], docs: Mapping[str, list[dict[str, Any]]],
                  path: Path) -> Conversation:
    classes = tuple(q["involved_classes"])
    funcs: list[dict[str, Any]] = []
    for c in classes:
        if CLASS_DOCS.get(c) not in docs:
            raise ValueError(f"{path}: {q['id']} uses class {c!r}, which has no function doc")
        funcs += docs[CLASS_DOCS[c]]
    params = {f["name"]: list(f["parameters"].get("properties", {})) for f in funcs}
    required = {f["name"]: tuple(f["parameters"].get("required", ())) for f in funcs}
    expected = []
    for turn in truth:
        calls = []
        for text in turn:
            name = text.split("(", 1)[0].strip()
            n, a = parse_call(text, params.get(name, []))
            calls.append(ExpectedCall(n, a))
        expected.append(tuple(calls))
    tools = tuple({"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                                    "parameters": _schema(f["parameters"])}} for f in funcs)
    path_steps = q.get("path") or []
    group = path_steps[0].split(".")[0] if path_steps else classes[0]
    turns = tuple(tuple({"role": str(m["role"]), "content": str(m["content"])} for m in t) for t in q["question"])
    return Conversation(q["id"], group, turns, tuple(tuple(t) for t in truth), tuple(expected), tools, required,
                        classes, q.get("initial_config") or {})


# --- tool results ------------------------------------------------------------------------------------


class ToolBackend(Protocol):
    """Where tool results come from (see the module docstring)."""

    name: str

    def session(self, conv: Conversation, turn: int) -> ToolSession:
        """A fresh state for ``turn``: the reference calls of the turns before it already applied."""
        ...


class ToolSession(Protocol):
    """The state of one turn being replayed."""

    def history(self) -> list[list[str]]:
        """The results of the reference calls of every turn before this one, per turn."""
        ...

    def call(self, call: MadeCall) -> str:
        """The result of a model call (applied to the state)."""
        ...


def _problem(conv: Conversation, call: MadeCall) -> str | None:
    if call.name not in conv.required:
        return f"unknown function {call.name!r}"
    args = parse_arguments(call.arguments)
    if args is None:
        return "arguments are not a valid JSON object"
    missing = [r for r in conv.required[call.name] if r not in args]
    return f"missing required argument(s): {', '.join(missing)}" if missing else None


OK_RESULT = json.dumps({"status": "ok"})


class StandInResults:
    """The documented stand-in: ``{"status": "ok"}`` for a well-formed call, ``{"error": ...}`` else."""

    name = "stand-in"

    def session(self, conv: Conversation, turn: int) -> _StandInSession:
        """A session for ``turn`` (stateless)."""
        return _StandInSession(conv, turn)


@dataclass
class _StandInSession:
    conv: Conversation
    turn: int

    def history(self) -> list[list[str]]:
        return [[OK_RESULT for _ in calls] for calls in self.conv.reference[: self.turn]]

    def call(self, call: MadeCall) -> str:
        problem = _problem(self.conv, call)
        return OK_RESULT if problem is None else json.dumps({"error": problem})


def bfcl_available() -> bool:
    """Whether ``bfcl-eval``'s API classes can be imported."""
    try:
        return importlib.util.find_spec(_BFCL_MODULE + "gorilla_file_system") is not None
    except ModuleNotFoundError:
        return False


class BfclExecutor:
    """Tool results from ``bfcl-eval``'s executable API classes (see the module docstring)."""

    name = "bfcl-eval"

    def session(self, conv: Conversation, turn: int) -> _ExecSession:
        """Fresh instances of the involved classes, the reference calls of turns before ``turn`` applied."""
        return _ExecSession(conv, turn)


class _ExecSession:
    def __init__(self, conv: Conversation, turn: int) -> None:
        self.conv = conv
        self.methods: dict[str, Any] = {}
        for c in conv.classes:
            cls = getattr(importlib.import_module(_BFCL_MODULE + CLASS_DOCS[c]), c)
            inst = cls()
            if c not in STATELESS:
                inst._load_scenario(copy.deepcopy(dict(conv.initial_config).get(c, {})), long_context=False)
            for name in dir(inst):
                if not name.startswith("_") and callable(getattr(inst, name)):
                    self.methods.setdefault(name, getattr(inst, name))
        self._history = [[self._run(call.name, dict(call.arguments)) for call in calls]
                         for calls in conv.expected[:turn]]

    def _run(self, name: str, args: dict[str, Any]) -> str:
        fn = self.methods.get(name)
        if fn is None or name not in self.conv.required:
            return json.dumps({"error": f"unknown function {name!r}"})
        try:
            out = fn(**args)
        except Exception as exc:  # the API's own error, as BFCL reports it to the model
            return f"Error during execution: {exc}"
        if isinstance(out, str):
            return out
        if isinstance(out, dict):
            try:
                return json.dumps(out)
            except (TypeError, ValueError):
                return str(out)
        return str(out)

    def history(self) -> list[list[str]]:
        return self._history

    def call(self, call: MadeCall) -> str:
        problem = _problem(self.conv, call)
        if problem is not None:
            return json.dumps({"error": problem})
        return self._run(call.name, parse_arguments(call.arguments) or {})


def backend(name: str) -> ToolBackend:
    """``"auto"`` (bfcl-eval when importable, else the stand-in), ``"bfcl-eval"`` or ``"stand-in"``.
    Raises ValueError when ``bfcl-eval`` is asked for and not importable."""
    if name == "stand-in" or (name == "auto" and not bfcl_available()):
        return StandInResults()
    if name in ("auto", "bfcl-eval"):
        if not bfcl_available():
            raise ValueError("--tool-results bfcl-eval needs the bfcl-eval package: pip install --no-deps "
                             "bfcl-eval mpmath")
        return BfclExecutor()
    raise ValueError(f"unknown tool-results backend {name!r} (auto, bfcl-eval, stand-in)")


def reference_messages(conv: Conversation, turn: int, results: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The teacher-forced history before ``turn`` plus ``turn``'s user messages (chat messages)."""
    msgs: list[dict[str, Any]] = []
    for t in range(turn):
        msgs += [dict(m) for m in conv.turns[t]]
        calls = conv.expected[t]
        if not calls:
            msgs.append({"role": "assistant", "content": EMPTY_TURN_REPLY})
            continue
        ids = [f"call_ref_{t}_{k}" for k in range(len(calls))]
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))}}
            for i, c in zip(ids, calls, strict=True)]})
        msgs += [{"role": "tool", "tool_call_id": i, "content": r} for i, r in zip(ids, results[t], strict=True)]
    msgs += [dict(m) for m in conv.turns[turn]]
    return msgs


def read_tool_calls(message: Any) -> tuple[list[MadeCall], list[dict[str, Any]]]:
    """The tool calls of a chat reply ``message`` as :class:`MadeCall` (a malformed entry becomes a
    call with an empty name or unparseable arguments, so it is counted, not dropped), and the calls as
    they go back into the conversation (each with an id)."""
    raw = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(raw, list):
        return [], []
    made: list[MadeCall] = []
    echo: list[dict[str, Any]] = []
    for k, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        args = fn.get("arguments") if isinstance(fn, dict) else None
        if isinstance(args, dict):  # some servers send an object, not a string
            args = json.dumps(args)
        if not isinstance(args, str):  # absent or not a string: kept as JSON that is no object (invalid)
            args = json.dumps(args)
        call = MadeCall(name if isinstance(name, str) else "", args)
        made.append(call)
        cid = c.get("id") if isinstance(c, dict) and isinstance(c.get("id"), str) else f"call_{k}"
        echo.append({"id": cid, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
    return made, echo
