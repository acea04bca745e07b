"""What a sim server is: :class:`SimConfig` (frozen; the CLI's flags map to it 1:1), checked when
built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from servelens.sim import faults as F
from servelens.sim.answers import AnswerPolicy
from servelens.sim.model import MIN_SPEEDUP, ModelParams
from servelens.sim.presets import DEFAULT_PRESET, get_preset

MAX_DATA_PARALLEL = 1024
"""Most engine replicas of one sim (``--data-parallel-size``); 1024 start and idle about as one does
(their loops sleep), 10**8 took minutes and gigabytes before this bound."""

@dataclass(frozen=True)
class SimConfig:
    """Everything a sim server needs (CLI flags map 1:1).

    Attributes:
        host, port: where to listen (``port=0``: a free port).
        model: served model name (``/v1/models``, the ``model`` field; others get 404).
        preset: name of the :mod:`~servelens.sim.presets` entry the timing starts from.
        params: timing-model parameters (default: the preset's); see :meth:`build` for overrides.
        speedup: simulated seconds per wall second (all modelled times are divided by it).
        seed: default generation seed and the fault-draw seed.
        default_max_tokens: output budget when the request sets none.
        eos_min_tokens, eos_max_tokens: range of the natural EOS point (see module docstring).
        max_model_len: prompt + max_tokens limit (400 beyond it).
        truth_log: JSONL path for truth records (None: memory only).
        debug: enable ``/debug/requests`` and ``/debug/stats``.
        fault_rate, fault_modes: global fault injection (see :mod:`~servelens.sim.faults`).
        data_parallel_size: independent engine replicas behind the one server, each request sent to
            the least loaded (:mod:`~servelens.sim.replicas`; vLLM's ``--data-parallel-size``).
        spin_us: the step loop yields instead of sleeping for the last ``spin_us`` before a deadline.
        keepalive_timeout_s: an idle keep-alive connection, or one without a whole request head, is
            closed after this many seconds (nginx's default, 75; aiohttp's own would be an hour).
            vLLM's API server (uvicorn) closes idle connections after 5 s.
        answer_key: a JSONL answer key (:mod:`~servelens.sim.answers`): chat requests that are eval items
            get the key's right or wrong reply instead of generated words (None: none).
        answer_accuracy, answer_independence, answer_shared_seed: how this deployment answers them
            (:class:`~servelens.sim.answers.AnswerPolicy`; its own draws come from ``seed``).
    """

    host: str = "127.0.0.1"
    port: int = 0
    model: str = "sim-model"
    preset: str = DEFAULT_PRESET
    params: ModelParams = field(default_factory=lambda: get_preset(DEFAULT_PRESET).params)
    speedup: float = 1.0
    seed: int = 0
    default_max_tokens: int = 128
    eos_min_tokens: int = 64
    eos_max_tokens: int = 2048
    max_model_len: int = 131072
    truth_log: str | None = None
    debug: bool = False
    fault_rate: float = 0.0
    fault_modes: tuple[str, ...] = ()
    spin_us: int = 1000
    data_parallel_size: int = 1
    keepalive_timeout_s: float = 75.0
    answer_key: str | None = None
    answer_accuracy: float = 1.0
    answer_independence: float = 1.0
    answer_shared_seed: int = 0

    def __post_init__(self) -> None:
        if not self.speedup >= MIN_SPEEDUP:
            raise ValueError(f"speedup must be >= {MIN_SPEEDUP:g} (inf: no waiting), got {self.speedup!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if not 1 <= self.eos_min_tokens <= self.eos_max_tokens:
            raise ValueError("need 1 <= eos_min_tokens <= eos_max_tokens")
        if not self.model:
            raise ValueError("model name must not be empty")
        if self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.data_parallel_size < 1:
            raise ValueError(f"data-parallel-size must be >= 1, got {self.data_parallel_size}")
        if self.data_parallel_size > MAX_DATA_PARALLEL:  # each is built at start: refuse before, not after minutes
            raise ValueError(f"data-parallel-size must be at most {MAX_DATA_PARALLEL}, got {self.data_parallel_size}")
        if self.spin_us < 0:
            raise ValueError(f"spin_us must be >= 0, got {self.spin_us}")
        if not 0 < self.keepalive_timeout_s < math.inf:
            raise ValueError(f"keepalive_timeout_s must be > 0 and finite, got {self.keepalive_timeout_s!r}")
        F.parse_modes(self.fault_modes)
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {self.fault_rate!r}")
        self.answer_policy()  # checks accuracy and independence

    def answer_policy(self) -> AnswerPolicy:
        """How this deployment answers eval items (raises ValueError for values outside [0, 1])."""
        return AnswerPolicy(self.answer_accuracy, self.seed, self.answer_shared_seed, self.answer_independence)

    @classmethod
    def build(cls, **overrides: Any) -> SimConfig:
        """A config from keyword overrides: any :class:`SimConfig` field, or any
        :class:`~servelens.sim.model.ModelParams` field (applied on top of ``preset``'s parameters).
        None values are ignored. Raises ValueError for unknown names or bad values."""
        own = {f.name for f in fields(cls)}
        model_kw = {k: v for k, v in overrides.items() if k not in own}
        kw = {k: v for k, v in overrides.items() if k in own and v is not None}
        preset = get_preset(kw.get("preset", DEFAULT_PRESET))
        base = kw.pop("params", preset.params)
        kw["params"] = base.with_overrides(**model_kw)
        if "fault_modes" in kw and isinstance(kw["fault_modes"], str):
            kw["fault_modes"] = tuple(m for m in kw["fault_modes"].split(",") if m.strip())
        return cls(**kw)
