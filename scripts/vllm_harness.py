#!/usr/bin/env python3
"""vLLM CPU engine with a tiny local model: ``install | build-model | serve | paths``.

Thin wrapper around :mod:`servelens.engines.vllm_cpu`; works from a source checkout without
installing servelens. Example: ``python scripts/vllm_harness.py serve --port 0``.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from servelens.engines.vllm_cpu import main
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from servelens.engines.vllm_cpu import main

if __name__ == "__main__":
    sys.exit(main())
