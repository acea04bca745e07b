"""What servelens.asgi.MetricsMiddleware costs per token (issue 20 §3), side by side with the plain app.

A tiny OpenAI-shaped ASGI app (:class:`servelens.asgi.testing.TinyApp`, one token per SSE chunk, as
vLLM streams) is called directly, with no server and no socket, so only the app's and the
middleware's own Python work is timed: CPU seconds (``time.process_time``) over R requests of N tokens,
plain and through the middleware, alternating in rounds in one process (the same machine state for
both), the best round of each kept. Cases: the client asks for no usage (the middleware adds
``include_usage`` and ``continuous_usage_stats``, the app then writes usage on every chunk, and the
middleware cuts it out again: the worst case); the same with ``SERVELENS_CONTINUOUS_USAGE=off`` (only
the final usage chunk added, and dropped); and the client asks for continuous usage itself
(nothing added, nothing cut).

    python benchmarks/asgi_overhead.py [--tokens 200] [--requests 50] [--rounds 7]

Prints one JSON object: CPU us per token of the plain app, of the plain app given the body the
middleware sends it (usage added: the app's own extra work), and through the middleware; the
difference (``added``), the middleware's own share (``middleware_own``: through it minus the app given
the same body), the ratio; the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

from prometheus_client import CollectorRegistry

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import TinyApp, call

CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {  # case: (what the client asks, middleware settings)
    "no_usage_asked": ({}, {}),
    "no_usage_asked_continuous_off": ({}, {"continuous_usage": "off"}),
    "continuous_asked": ({"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, {}),
}


async def _cpu(app: Any, body: dict[str, Any], requests: int, scope: dict[str, Any]) -> float:
    t0 = time.process_time()
    for _ in range(requests):
        await call(app, "/v1/chat/completions", body, scope_extra=scope)
    return time.process_time() - t0


async def main_async(tokens: int, requests: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens_per_request": tokens, "requests_per_round": requests, "rounds": rounds,
                           "load_average_before": [round(x, 2) for x in os.getloadavg()]}
    for case, (extra, settings) in CASES.items():
        tiny = TinyApp()
        mw = MetricsMiddleware(tiny, registry=CollectorRegistry(), model="tiny", environ={}, **settings)
        body = {"model": "tiny", "messages": [], "stream": True, "max_tokens": tokens, "prompt_tokens": 700, **extra}
        scope = {"app": tiny}
        await _cpu(mw, body, 2, scope)  # warm both paths (and learn the app's usage style)
        injected = json.loads(tiny.bodies[-1])  # what the app got through the middleware
        await _cpu(tiny, body, 2, scope)
        plain, asked, measured = [], [], []
        for _ in range(rounds):
            plain.append(await _cpu(tiny, body, requests, scope))
            asked.append(await _cpu(tiny, injected, requests, scope))
            measured.append(await _cpu(mw, body, requests, scope))
        n = tokens * requests
        p, a, m = (min(x) / n * 1e6 for x in (plain, asked, measured))
        out[case] = {"plain_us_per_token": round(p, 2), "plain_with_added_usage_us_per_token": round(a, 2),
                     "middleware_us_per_token": round(m, 2), "added_us_per_token": round(m - p, 2),
                     "middleware_own_us_per_token": round(m - a, 2), "ratio": round(m / p, 2)}
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main_async(args.tokens, args.requests, args.rounds)), indent=1))


if __name__ == "__main__":
    main()
