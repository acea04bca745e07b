"""Sending one eval request: a non-streaming chat completion, retried with backoff on 429, 5xx,
connection errors and timeouts, answered from the response cache when it can be. Only answers are
cached (a 200 with ``choices[0].message``): a failure, an error object sent with 200 or a body that is
not a completion is recorded as the item's error and asked again by a rerun."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servelens.bench.client import error_message
from servelens.eval.cache import ResponseCache, cache_key
from servelens.serving import client_error_reason

RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))
CONTEXT_WORDS = ("context length", "context_length", "maximum context", "context window", "too long",
                 "exceeds the available context", "n_ctx")
"""An HTTP 400 whose error message contains one of these is a prompt longer than the context."""


@dataclass(frozen=True)
class Reply:
    """The outcome of one request.

    Attributes:
        response: the decoded response body (None on failure).
        latency_ns: request start to the whole body read (the first time, for a cached reply).
        cached: answered from the cache (nothing sent).
        error: why it failed, in one line (None on success).
        context_exceeded: the endpoint refused the prompt as longer than its context.
        attempts: requests sent for it (0 when cached).
    """

    response: Any
    latency_ns: int
    cached: bool = False
    error: str | None = None
    context_exceeded: bool = False
    attempts: int = 0


@dataclass
class Sender:
    """Posts requests for one deployment (URL and model), with the cache and the retry policy.

    Attributes:
        session: the aiohttp session.
        url: the full chat-completions URL.
        model: the model name (part of the cache key).
        cache: the response cache.
        retries: retries after the first attempt, for 429, 5xx, connection errors and timeouts.
        backoff_s: the first backoff; it doubles per retry (with up to 25 % jitter), capped at 30 s;
            a ``Retry-After`` in seconds is honoured up to the same cap.
        timeout_s: per-request timeout (whole request).
        headers: request headers (content type, authorization).
        retried, sent: counters (retries made, requests sent), read for the summary.
    """

    session: aiohttp.ClientSession
    url: str
    model: str
    cache: ResponseCache
    retries: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)
    retried: int = 0
    sent: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    async def send(self, body: dict[str, Any], run: int) -> Reply:
        """The reply to ``body`` in repetition ``run``: from the cache, else posted (and cached on success)."""
        key = cache_key(self.url, self.model, body, run)
        hit = self.cache.get(key)
        if hit is not None:
            return Reply(hit.response, hit.latency_ns, cached=True)
        attempts = 0
        while True:
            attempts += 1
            self.sent += 1
            start = time.perf_counter_ns()
            retry_after: float | None = None
            try:
                async with self.session.post(self.url, json=body, headers=self.headers,
                                             timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
                    raw = await resp.read()
                    latency = time.perf_counter_ns() - start
                    if resp.status == 200:
                        try:
                            data = await resp.json(content_type=None)
                        except (ValueError, RecursionError):
                            return Reply(None, latency, error="the answer is not JSON", attempts=attempts)
                        if not has_message(data):  # not an answer: not cached, so a rerun asks again
                            return Reply(None, latency, error=no_message_error(data, raw), attempts=attempts)
                        self.cache.put(key, data, latency)
                        return Reply(data, latency, attempts=attempts)
                    message = error_message(raw)
                    error = f"HTTP {resp.status}: {message}"
                    if resp.status not in RETRY_STATUSES:
                        exceeded = resp.status == 400 and any(w in message.lower() for w in CONTEXT_WORDS)
                        return Reply(None, latency, error=error, context_exceeded=exceeded, attempts=attempts)
                    retry_after = _retry_after(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                latency = time.perf_counter_ns() - start
                error = client_error_reason(exc)
            if attempts > self.retries:
                return Reply(None, latency, error=f"{error} (after {attempts} attempts)", attempts=attempts)
            self.retried += 1
            wait = min(30.0, self.backoff_s * 2 ** (attempts - 1) * (1 + 0.25 * self._rng.random()))
            await asyncio.sleep(min(30.0, retry_after) if retry_after is not None else wait)


def has_message(data: Any) -> bool:
    """Whether a decoded 200 body is a chat completion with ``choices[0].message`` (an object)."""
    try:
        return isinstance(data["choices"][0]["message"], dict)
    except (KeyError, IndexError, TypeError):
        return False


def no_message_error(data: Any, raw: bytes) -> str:
    """One line for a 200 body without ``choices[0].message`` (an error object's message when it is one)."""
    if isinstance(data, dict) and "error" in data:
        return f"HTTP 200 with an error: {error_message(raw)}"
    return "the answer has no choices[0].message"


def _retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (the HTTP-date form is ignored)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
