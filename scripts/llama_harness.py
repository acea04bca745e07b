#!/usr/bin/env python3
"""llama.cpp (llama-server) with SmolLM2-135M-Instruct: ``build | build-model | serve | paths``.

Thin wrapper around :mod:`servelens.engines.llama_cpp`; works from a source checkout without
installing servelens. Example: ``python scripts/llama_harness.py serve --variant Q3_K_S``.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from servelens.engines.llama_cpp import main
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from servelens.engines.llama_cpp import main

if __name__ == "__main__":
    sys.exit(main())
