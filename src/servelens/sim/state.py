"""A sim app's state, shared by its handlers: the engine and its step loop, the truth log, the
metrics and the fault draw (one :class:`SimState` per app, under :data:`SIM_STATE`)."""

from __future__ import annotations

import time

from aiohttp import web

from servelens.prometheus.sim_engine import SimMetrics
from servelens.sim.answers import AnswerKey
from servelens.sim.config import SimConfig
from servelens.sim.faults import FaultInjector
from servelens.sim.replicas import Replicas
from servelens.sim.scheduler import Engine
from servelens.sim.steploop import MonotonicClock, StepLoop
from servelens.sim.truth import TruthLog


class SimState:
    """Per-app state: engine, loop, truth log, metrics, faults, the eval answer key (None: none).

    With ``config.data_parallel_size`` > 1, ``loop`` is a :class:`Replicas` over that many engines
    (``engines``; ``engine`` is the first, for what they share: the cache settings)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        clock = MonotonicClock(config.spin_us * 1000)
        self.engines = [Engine(config.params) for _ in range(config.data_parallel_size)]
        self.engine = self.engines[0]
        self.loop: StepLoop | Replicas = (StepLoop(self.engine, clock, config.speedup) if len(self.engines) == 1
                                          else Replicas.build(self.engines, clock, config.speedup))
        self.truth = TruthLog(config.truth_log)
        self.metrics = SimMetrics(config.model, config.max_model_len)
        self.faults = FaultInjector(config.fault_rate, config.fault_modes, config.seed)
        self.created = int(time.time())
        self.answers = AnswerKey.read(config.answer_key) if config.answer_key else None
        self.answer_policy = config.answer_policy()


SIM_STATE: web.AppKey[SimState] = web.AppKey("servelens_sim_state", SimState)
