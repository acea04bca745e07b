"""What a bench runs: :class:`BenchConfig` (frozen), checked when it is built (one-line ValueErrors,
in the CLI's flag names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from servelens.bench.arrivals import ARRIVALS
from servelens.bench.client import ENDPOINTS
from servelens.bench.distributions import parse_length_dist
from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.core.slo import Slo, parse_threshold
from servelens.prometheus.names import DEFAULT_PREFIX, MetricNames

LONG_REQUEST_POLICIES = ("drop", "clip")


@dataclass(frozen=True)
class BenchConfig:
    """What to run. Lengths in tokens, times in seconds.

    Attributes:
        url: the endpoint's base URL (``http://host:port``; ``/v1/...`` is appended; a trailing ``/v1``
            is accepted).
        model: model name; None takes the first model ``GET /v1/models`` lists.
        endpoint: ``"chat"`` or ``"completions"``.
        trace, trace_format: a Mooncake JSONL or Azure CSV trace and its format (None: detect).
            With a trace, ``isl``/``osl``/``num_requests`` are not used.
        time_scale: trace timestamps are multiplied by this (0.1 replays ten times faster).
        isl, osl: synthetic length specs (see :mod:`servelens.bench.distributions`).
        num_requests: synthetic workload size.
        seed: seeds lengths, Poisson arrivals and prompt texts.
        max_requests: send at most this many requests (trace or synthetic).
        duration_s: stop starting new requests after this many seconds (in-flight ones finish).
        concurrency: closed loop with this many workers; with ``rate`` or a trace: cap on in-flight.
        rate: open loop at this many requests/s with ``arrival`` (``poisson`` or ``constant``).
        tokenizer: a ``tokenizer.json`` for a real engine; None uses the sim's documented tokenizer.
        max_context: requests whose ISL + OSL, plus the tokens the endpoint's chat template adds (learned
            from the probe request's usage), exceeds this are dropped or clipped (``long_requests``);
            None: the ``max_model_len`` that ``/v1/models`` reports, if any.
        isl_buckets: ISL bucket boundaries for the table.
        uncached_buckets: boundaries of a second table by uncached prompt tokens (ISL minus cached
            tokens, from each response's usage; server side the gateway's ``--uncached-buckets``
            families); None (default): no such table.
        metrics_url: a ``/metrics`` URL scraped before and after the run (server-side table).
        metrics_prefix: metric-name prefix of the by-ISL families at ``metrics_url``.
        output_dir: where ``results.jsonl`` and ``summary.json`` go (None: not written).
        request_timeout_s: per-read timeout of a request (s).
        lag_threshold_ms: event-loop lag p99 above which the client figures are not trustworthy.
        continuous_usage: ask for ``continuous_usage_stats``; None probes the endpoint once.
        ignore_eos: send ``ignore_eos``/``min_tokens`` so the output length equals the target.
        api_key: sent as ``Authorization: Bearer ...`` (never written to files).
        progress: show a rich progress bar (requests done, errors, elapsed) on stderr.
        ramp_up_s: closed loop: start the workers evenly over this many seconds (None: 1 ms per worker,
            at most 2 s). Each worker's first request opens a connection; starting 1,000 at once
            overflows a server's listen backlog and the retried SYNs add a second to their TTFT.
        slo_ttft, slo_itl: SLO thresholds (``2.0``, ``0.5+0.0002*isl`` or a per-bucket table, see
            :func:`servelens.core.slo.parse_threshold`): attainment per bucket and goodput in the table
            and the summary (None: no SLO).
    """

    url: str
    model: str | None = None
    endpoint: str = "chat"
    trace: str | None = None
    trace_format: str | None = None
    time_scale: float = 1.0
    isl: str = "512"
    osl: str = "128"
    num_requests: int = 100
    seed: int = 0
    max_requests: int | None = None
    duration_s: float | None = None
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    tokenizer: str | None = None
    max_context: int | None = None
    long_requests: str = "drop"
    isl_buckets: tuple[int, ...] = DEFAULT_ISL_BOUNDARIES
    uncached_buckets: tuple[int, ...] | None = None
    metrics_url: str | None = None
    metrics_prefix: str = DEFAULT_PREFIX
    output_dir: str | None = None
    request_timeout_s: float = 600.0
    lag_threshold_ms: float = 10.0
    continuous_usage: bool | None = None
    ignore_eos: bool = True
    api_key: str | None = field(default=None, repr=False)
    progress: bool = False
    ramp_up_s: float | None = None
    slo_ttft: str | None = None
    slo_itl: str | None = None

    def __post_init__(self) -> None:
        if self.rate is not None and math.isnan(self.rate):
            raise ValueError("rate must be a number of requests per second (inf: all at once), got nan")
        for name, value in (("duration", self.duration_s), ("ramp-up", self.ramp_up_s),
                            ("time-scale", self.time_scale), ("request-timeout", self.request_timeout_s),
                            ("max-loop-lag-ms", self.lag_threshold_ms)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request-timeout must be > 0 s, got {self.request_timeout_s}")
        if self.lag_threshold_ms < 0:
            raise ValueError(f"max-loop-lag-ms must be >= 0, got {self.lag_threshold_ms}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r}; expected chat or completions")
        if self.long_requests not in LONG_REQUEST_POLICIES:
            raise ValueError(f"--long-requests must be drop or clip, got {self.long_requests!r}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"unknown arrival process {self.arrival!r}; expected poisson or constant")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.num_requests < 1:
            raise ValueError(f"num-requests must be >= 1, got {self.num_requests}")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max-requests must be >= 1, got {self.max_requests}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError(f"duration must be > 0 s, got {self.duration_s}")
        if self.ramp_up_s is not None and self.ramp_up_s < 0:
            raise ValueError(f"ramp-up must be >= 0 s, got {self.ramp_up_s}")
        if self.time_scale < 0:
            raise ValueError(f"time-scale must be >= 0, got {self.time_scale}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max-context must be >= 2 tokens, got {self.max_context}")
        check_url("--url", self.url)
        if self.metrics_url is not None:
            check_url("--metrics-url", self.metrics_url)
        object.__setattr__(self, "isl_buckets", IslBuckets.parse(self.isl_buckets).boundaries)
        if self.uncached_buckets is not None:
            try:
                object.__setattr__(self, "uncached_buckets", IslBuckets.parse(self.uncached_buckets).boundaries)
            except ValueError as exc:
                raise ValueError(f"--uncached-buckets: {exc}") from None
        parse_length_dist(self.isl)
        parse_length_dist(self.osl)
        MetricNames(self.metrics_prefix)
        self.slo  # noqa: B018 - validates the SLO specs against the buckets

    @property
    def slo(self) -> Slo | None:
        """The SLOs to judge, or None. Raises ValueError (one line) for a malformed spec."""
        if not (self.slo_ttft or self.slo_itl):
            return None
        buckets = IslBuckets(self.isl_buckets)
        return Slo(parse_threshold(self.slo_ttft, buckets) if self.slo_ttft else None,
                   parse_threshold(self.slo_itl, buckets) if self.slo_itl else None)

    @property
    def base_url(self) -> str:
        """``url`` without a trailing ``/`` or ``/v1``."""
        u = self.url.rstrip("/")
        return u[:-3] if u.endswith("/v1") else u


def check_url(flag: str, url: str) -> None:
    """Raise ValueError (one line) unless ``url`` is an ``http(s)://host[:port]`` URL without a query or
    fragment (a bad one would otherwise fail later with the URL repeated as its own reason)."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{flag} must start with http:// or https://, got {url!r}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port number
    except ValueError as exc:
        raise ValueError(f"{flag} {url!r} is not a valid URL: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"{flag} {url!r} has no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{flag} must not have a query or fragment, got {url!r}")
