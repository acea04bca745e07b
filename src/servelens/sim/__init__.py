"""servelens.sim: a simulated OpenAI-compatible LLM engine with a continuous-batching timing model,
ground truth per request and fault injection (``servelens sim``).

Modules:

- :mod:`servelens.sim.tokenizer`: the deterministic tokenizer (``tokenize``, ``count_tokens``,
  ``make_text``, ``chat_prompt_tokens``).
- :mod:`servelens.sim.model`: the timing formulas (:class:`~servelens.sim.model.ModelParams`).
- :mod:`servelens.sim.presets`: named parameter sets with their sources.
- :mod:`servelens.sim.prefix_cache`: block-hash LRU prefix cache.
- :mod:`servelens.sim.scheduler`: the pure step planner (``Engine``) and ``simulate`` (virtual time,
  no server).
- :mod:`servelens.sim.steploop`: the asyncio ``StepLoop`` that runs it, with an injected clock.
- :mod:`servelens.sim.faults`: fault modes and the seeded global draw.
- :mod:`servelens.sim.truth`: ``TruthRecord`` and the truth log.
- :mod:`servelens.sim.server`: the aiohttp app (``SimConfig``, ``make_app``, ``start_server``).
- :mod:`servelens.sim.testing`: ``run_sim`` (tests) and ``capture``.
"""
