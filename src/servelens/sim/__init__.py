"""servelens.sim: a simulated OpenAI-compatible LLM engine with a continuous-batching timing model,
ground truth per request and fault injection (``servelens sim``).

Modules, the engine first, then the HTTP server around it:

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
- :mod:`servelens.sim.config`: ``SimConfig``, what a server is (the CLI's flags).
- :mod:`servelens.sim.state`: ``SimState``, one app's engine, loop, truth log, metrics and faults.
- :mod:`servelens.sim.request`: an OpenAI request body read and validated (``parse_request``).
- :mod:`servelens.sim.completions`: a completion request from arrival to its truth record (the
  request semantics are in its docstring).
- :mod:`servelens.sim.replies`: the streamed and the whole reply, with the faults that act on them.
- :mod:`servelens.sim.chunks`, :mod:`servelens.sim.writer`: the bytes of the chunks, and the SSE
  writer with the transport-level faults.
- :mod:`servelens.sim.endpoints`: ``/v1/models``, ``/health``, ``/tokenize``, ``/metrics``, ``/debug/*``.
- :mod:`servelens.sim.server`: the aiohttp app (``make_app``, ``start_server``; ``SimConfig`` too).
- :mod:`servelens.sim.testing`: ``run_sim`` (tests) and ``capture``.

Imports: :mod:`servelens.core`, :mod:`servelens.prometheus` (the engine's vLLM-named metrics) and
:mod:`servelens.serving`; never the gateway, the bench, the report or ``cli``
(tests/test_layering.py). The bench imports the tokenizer from here.
"""
