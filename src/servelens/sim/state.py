"""A sim app's state, shared by its handlers: the engine and its step loop, the truth log, the
metrics and the fault draw (one :class:`SimState` per app, under :data:`SIM_STATE`)."""

from __future__ import annotations

import time

from aiohttp import web

from servelens.prometheus.sim_engine import SimMetrics
from servelens.sim.answers import AnswerKey
from servelens.sim.config import SimConfig
from servelens.sim.faults import FaultInjector
from servelens.sim.scheduler import Engine
from servelens.sim.steploop import MonotonicClock, StepLoop
from servelens.sim.truth import TruthLog


class SimState:
    """Per-app state: engine, loop, truth log, metrics, faults, the eval answer key (None: none)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config.params)
        self.loop = StepLoop(self.engine, MonotonicClock(config.spin_us * 1000), config.speedup)
        self.truth = TruthLog(config.truth_log)
        self.metrics = SimMetrics(config.model, config.max_model_len)
        self.faults = FaultInjector(config.fault_rate, config.fault_modes, config.seed)
        self.created = int(time.time())
        self.answers = AnswerKey.read(config.answer_key) if config.answer_key else None
        self.answer_policy = config.answer_policy()


SIM_STATE: web.AppKey[SimState] = web.AppKey("servelens_sim_state", SimState)
