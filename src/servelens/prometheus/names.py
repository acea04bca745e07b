"""Metric names and help texts. With ``prefix="dynamo_frontend"`` the stock names equal
NVIDIA Dynamo's frontend metrics (1.6.1); the default prefix is ``servelens``.

Names follow Prometheus conventions: base units (seconds, tokens), ``_seconds`` and ``_total``
suffixes, the by-ISL twins insert ``_by_isl`` before the unit suffix.

The families by uncached prompt tokens (label ``uncached_bucket``, opt-in) insert ``_by_uncached``
the same way, and ``prompt_tokens_by_isl_total`` (the hit ratio's denominator) sits beside the by-ISL
cached tokens. Neither exists in any Dynamo release: with ``dynamo_frontend`` they are
``dynamo_frontend_*_by_uncached*`` and ``dynamo_frontend_prompt_tokens_by_isl_total``, servelens' own
series under Dynamo's prefix (so one prefix selects every frontend family), which collide with
nothing Dynamo exports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servelens.core.edges import (
    CACHED_EDGES_TOKENS,
    DURATION_EDGES_S,
    FINE_DURATION_EDGES_S,
    FINE_ITL_EDGES_S,
    FINE_TTFT_EDGES_S,
    ISL_EDGES_TOKENS,
    ITL_EDGES_S,
    OSL_EDGES_TOKENS,
    TTFT_EDGES_S,
    MetricEdges,
)

DEFAULT_PREFIX = "servelens"
DYNAMO_PREFIX = "dynamo_frontend"
_PREFIX_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

__all__ = [
    "CACHED_EDGES_TOKENS",
    "DEFAULT_PREFIX",
    "DURATION_EDGES_S",
    "DYNAMO_PREFIX",
    "FINE_DURATION_EDGES_S",
    "FINE_ITL_EDGES_S",
    "FINE_TTFT_EDGES_S",
    "ISL_EDGES_TOKENS",
    "ITL_EDGES_S",
    "OSL_EDGES_TOKENS",
    "TTFT_EDGES_S",
    "MetricNames",
    "check_prefix",
    "default_edges",
]


def check_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is a valid Prometheus metric-name prefix; raise ValueError otherwise."""
    if not _PREFIX_RE.match(prefix) or prefix.endswith("_"):
        raise ValueError(
            f"metrics prefix {prefix!r} is not a valid Prometheus name prefix "
            "(letters, digits and _, not starting with a digit, no trailing _)"
        )
    return prefix


def default_edges(prefix: str) -> MetricEdges:
    """The ``le`` edges for a prefix: Dynamo 1.6.1's, all six sets, for Dynamo's names (the by-ISL
    twins share their stock twin's edges, and Dynamo's own stock histograms have those); otherwise
    :class:`~servelens.core.edges.MetricEdges`' defaults (the fine TTFT, ITL and duration edges)."""
    return MetricEdges.dynamo() if prefix == DYNAMO_PREFIX else MetricEdges()


@dataclass(frozen=True)
class MetricNames:
    """Every exported metric name for one prefix (``{p}_...``)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    def _n(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}"

    # stock histograms (label: model)
    @property
    def ttft(self) -> str:
        return self._n("time_to_first_token_seconds")

    @property
    def itl(self) -> str:
        return self._n("inter_token_latency_seconds")

    @property
    def duration(self) -> str:
        return self._n("request_duration_seconds")

    @property
    def isl(self) -> str:
        return self._n("input_sequence_tokens")

    @property
    def osl(self) -> str:
        return self._n("output_sequence_tokens")

    @property
    def cached(self) -> str:
        return self._n("cached_tokens")

    # counters and gauges
    @property
    def requests(self) -> str:
        return self._n("requests_total")

    @property
    def inflight(self) -> str:
        return self._n("inflight_requests")

    @property
    def output_tokens(self) -> str:
        return self._n("output_tokens_total")

    @property
    def disconnected(self) -> str:
        return self._n("disconnected_clients")

    # by-ISL histograms (labels: model, isl_bucket)
    @property
    def ttft_by_isl(self) -> str:
        return self._n("time_to_first_token_by_isl_seconds")

    @property
    def itl_by_isl(self) -> str:
        return self._n("inter_token_latency_by_isl_seconds")

    @property
    def duration_by_isl(self) -> str:
        return self._n("request_duration_by_isl_seconds")

    @property
    def osl_by_isl(self) -> str:
        return self._n("output_sequence_tokens_by_isl")

    @property
    def cached_by_isl(self) -> str:
        return self._n("cached_tokens_by_isl")

    @property
    def isl_assignments(self) -> str:
        return self._n("isl_bucket_assignments_total")

    @property
    def slo_by_isl(self) -> str:
        """Requests meeting the gateway's SLOs per bucket (label ``slo``: ttft, itl, all); only
        with ``--slo-ttft``/``--slo-itl`` on the gateway."""
        return self._n("requests_within_slo_by_isl_total")

    @property
    def slo_threshold_info(self) -> str:
        """Info gauge (value 1; labels ``slo``: ttft, itl, and ``threshold``: the spec) of the thresholds
        the SLO counters judge against; only with ``--slo-ttft``/``--slo-itl`` on the gateway."""
        return self._n("slo_threshold_info")

    @property
    def prompt_tokens_by_isl(self) -> str:
        """Counter (labels ``model``, ``isl_bucket``): prompt tokens of the requests in ``cached_by_isl``."""
        return self._n("prompt_tokens_by_isl_total")

    # by-uncached histograms (labels: model, uncached_bucket), opt-in
    @property
    def ttft_by_uncached(self) -> str:
        return self._n("time_to_first_token_by_uncached_seconds")

    @property
    def itl_by_uncached(self) -> str:
        return self._n("inter_token_latency_by_uncached_seconds")

    @property
    def duration_by_uncached(self) -> str:
        return self._n("request_duration_by_uncached_seconds")

    @property
    def uncached_assignments(self) -> str:
        return self._n("uncached_bucket_assignments_total")

    def by_uncached_histograms(self) -> tuple[str, ...]:
        """The three by-uncached histogram names: TTFT, ITL, request duration."""
        return (self.ttft_by_uncached, self.itl_by_uncached, self.duration_by_uncached)

    def stock_histograms(self) -> tuple[str, ...]:
        """The six stock histogram names, TTFT first."""
        return (self.ttft, self.itl, self.duration, self.isl, self.osl, self.cached)

    def by_isl_histograms(self) -> tuple[str, ...]:
        """The five by-ISL histogram names, TTFT first."""
        return (self.ttft_by_isl, self.itl_by_isl, self.duration_by_isl, self.osl_by_isl, self.cached_by_isl)


HELP = {
    "ttft": "Time to first token: request arrival to the first chunk carrying generated output (seconds)",
    "itl": "Inter-token latency: gap between output chunks divided by the tokens in the later chunk, "
    "once per token (seconds)",
    "duration": "Request duration: arrival to the end of the response (seconds)",
    "isl": "Input sequence length: usage.prompt_tokens (tokens)",
    "osl": "Output sequence length: usage.completion_tokens (tokens)",
    "cached": "Prompt tokens served from the prefix cache: usage.prompt_tokens_details.cached_tokens (tokens)",
    "requests": "Requests finished, by endpoint, request type, status and error type",
    "inflight": "Requests currently in flight",
    "output_tokens": "Output tokens generated",
    "disconnected": "Clients that disconnected before their response was complete",
    "isl_assignments": "Requests by how their ISL bucket was assigned "
    "(first_chunk_usage, final_usage, tokenizer, unknown)",
    "slo_by_isl": "Finished requests with a first token that met the SLO (slo=ttft: TTFT; itl: mean ITL; all: "
    "every SLO), by ISL bucket; the denominator is request_duration_by_isl_seconds_count",
    "slo_threshold_info": "The SLO thresholds requests_within_slo_by_isl_total judges against (slo: ttft, itl; "
    "threshold: seconds, A+B*isl in seconds and seconds per prompt token, or a table per ISL bucket); always 1",
    "prompt_tokens_by_isl": "Prompt tokens (usage.prompt_tokens) of the requests whose usage reported cached "
    "tokens, by ISL bucket: the bucket's prefix-cache hit ratio is cached_tokens_by_isl_sum / this (tokens)",
    "uncached_assignments": "Requests by how their uncached-prompt-token bucket was latched "
    "(first_chunk_usage, final_usage, no_cached_tokens, unknown)",
}
"""Help texts by family key; a by-ISL family appends ``BY_ISL_HELP``, a by-uncached one ``BY_UNCACHED_HELP``."""

BY_ISL_HELP = ", by ISL bucket"
BY_UNCACHED_HELP = ", by uncached prompt tokens (ISL minus cached tokens, latched when both are known)"
