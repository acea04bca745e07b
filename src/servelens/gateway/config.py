"""Gateway configuration: a frozen value built from CLI flags and/or a YAML file.

One module past 400 lines: every setting is checked in one place, whether it comes from a flag or the
file, so that both give the same one-line errors.

The README's example file (section Gateway) is tested to parse and start (tests/gateway/test_cli.py).
YAML file shape (every key optional; CLI flags given explicitly override it)::

    upstream: http://127.0.0.1:8000        # default upstream (its /v1/models is polled
                                           # when no models are listed below)
    models:                                # model name -> upstream base URL
      llama-3-8b: http://127.0.0.1:8000
      qwen-7b: {upstream: http://127.0.0.1:8001}
    isl_buckets: 512,1024,2048,4096,8192,16384   # or a list; off disables by-ISL series
    uncached_buckets: off                  # buckets by uncached prompt tokens (ISL - cached), opt-in: a list
                                           #   or "512,1024,..." as isl_buckets (true: the default boundaries)
    metrics_prefix: servelens
    ttft_edges_s: fine                     # le edges: fine (default), dynamo, or a list of seconds;
    itl_edges_s: fine                      #   Dynamo's prefix (dynamo_frontend) takes Dynamo's only
    duration_edges_s: fine
    max_series: 50000                      # series budget: models registered <= max_series / series per model
    continuous_usage: auto                 # auto | on | off
    by_isl_only: false
    tokenizer: /path/to/tokenizer.json
    chat_template: /path/to/tokenizer_config.json  # or a .jinja file: chat prompts counted as the engine renders them
    request_log: /tmp/requests.jsonl
    request_log_chunks: false              # also log every output chunk's time and tokens
    max_body_bytes: 16MiB                  # or bytes (16777216); 16M = 16MiB, 16MB = 16,000,000
    connect_timeout_s: 10
    response_timeout_s: 600
    read_timeout_s: 600
    client_timeout_s: 60
    models_refresh_s: 30
    shutdown_timeout_s: 25
    metrics_port: 9100                     # serve /metrics there only (the API port answers 404 for it)
    metrics_host: 127.0.0.1                # where that listener binds (default: host)
    workers: 1                             # processes on the same port(s), one /metrics summed; auto: the cores
    slo_ttft: 0.5+0.0002*isl               # count per bucket the requests meeting it (exact; as --slo-ttft)
    slo_itl: 0.05                          # the same for each request's mean ITL

Upstream URLs are base URLs (``http://host:port``); a trailing ``/v1`` (the OpenAI SDK's
``base_url`` habit) is accepted and removed, since the gateway forwards the client's ``/v1/...``
path unchanged.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from yarl import URL

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.core.edges import MetricEdges, parse_edges
from servelens.core.slo import Slo, parse_threshold
from servelens.core.status import UNKNOWN_MODEL
from servelens.prometheus.frontend import DEFAULT_MAX_SERIES
from servelens.prometheus.names import DEFAULT_PREFIX, DYNAMO_PREFIX, check_prefix, default_edges

ContinuousUsage = Literal["auto", "on", "off"]
CONTINUOUS_USAGE_MODES: tuple[str, ...] = ("auto", "on", "off")
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_OFF_WORDS = ("off", "none", "no", "false")
WORKERS_PER_CORE = 4
"""Most workers per core this process may run on: more is a mistake (each is a whole event loop and
copy of the state), refused at start."""


def available_cores() -> int:
    """The cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_workers(value: Any) -> int:
    """The worker count of ``value``: a positive integer (or its text) or ``auto`` (:func:`available_cores`).
    Raises ValueError (one line) for 0, a negative or non-integer value, or more than
    :data:`WORKERS_PER_CORE` x the cores available."""
    cores = available_cores()
    if isinstance(value, str) and value.strip().lower() == "auto":
        return cores
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"workers must be a positive integer or auto, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"workers must be a positive integer or auto, got {value!r}") from None
    if n < 1:
        raise ValueError(f"workers must be at least 1, got {n}")
    if n > WORKERS_PER_CORE * cores:
        raise ValueError(f"workers must be at most {WORKERS_PER_CORE * cores} ({WORKERS_PER_CORE} per core, "
                         f"{cores} core(s) available to this process), got {n}")
    return n


def normalize_upstream(url: str) -> str:
    """Validate an upstream base URL and return it without trailing ``/`` or ``/v1``.

    Raises ValueError (one line) unless it is an ``http``/``https`` URL with a host.
    """
    text = str(url).strip()
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed "["
        raise ValueError(f"upstream URL must look like http://host:port, got {url!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream URL must look like http://host:port, got {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"upstream URL must not have a query or fragment, got {url!r}")
    try:
        parts.port  # noqa: B018 - validates the port number
    except ValueError:
        raise ValueError(f"upstream URL has a bad port: {url!r}") from None
    try:
        URL(text)  # as the gateway's clients read it (stricter than urlsplit: "http://[::1]x")
    except ValueError as exc:
        raise ValueError(f"upstream URL must look like http://host:port, got {url!r} ({exc})") from None
    text = text.rstrip("/")
    if text.endswith("/v1"):
        text = text[: -len("/v1")]
    return text


_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(i?)(b?)\s*", re.IGNORECASE)


def parse_bytes(value: Any) -> int:
    """A byte count from an integer or a size: ``16777216``, ``16MiB``, ``16 MiB``, ``16M`` or ``16m`` (as
    nginx's ``client_max_body_size``: 1024-based), ``512KiB``, ``1GiB``; ``16MB``/``16kB`` are 1000-based.

    Raises ValueError (one line) for anything else, a negative or a fractional byte count.
    """
    if isinstance(value, bool):
        raise ValueError(f"a size must be a number of bytes or e.g. 16MiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must be >= 0 bytes, got {value}")
        return value
    m = _SIZE.fullmatch(str(value))
    if m is None:
        raise ValueError(f"a size must be a number of bytes or e.g. 16MiB, 512KiB, 16M, got {value!r}")
    number, prefix, binary, unit_b = m.groups()
    if prefix and unit_b and not binary:  # kB, MB, GB: SI
        base = 1000
    else:  # K, M, G, KiB, MiB, GiB (and a bare number or B)
        base = 1024
        if binary and not prefix:
            raise ValueError(f"a size must be a number of bytes or e.g. 16MiB, 512KiB, 16M, got {value!r}")
    size = float(number) * base ** " kmg".index(prefix.lower() or " ")
    if size != int(size):
        raise ValueError(f"a size must be a whole number of bytes, got {value!r}")
    return int(size)


def parse_isl_spec(spec: Any) -> str | None:
    """ISL boundaries from a flag/YAML value: ``"512,1024"``, a list, or off-words -> None.

    Returns the canonical comma-separated spec. Raises ValueError on bad boundaries, and on an empty
    string (an unset shell variable, most likely: ``off`` says it on purpose).
    """
    if spec is None:
        return None
    if isinstance(spec, bool):
        if spec:
            return IslBuckets.default().spec
        return None
    if isinstance(spec, str) and not spec.strip():
        raise ValueError("isl_buckets is empty: give boundaries in tokens (e.g. 512,1024,2048) or 'off' to turn "
                         "the by-ISL metrics off")
    if isinstance(spec, str) and spec.strip().lower() in _OFF_WORDS:
        return None
    if isinstance(spec, int):
        spec = [spec]
    if not isinstance(spec, str | list | tuple):
        raise ValueError(f"isl_buckets must be a list or a comma-separated string of token counts, got {spec!r}")
    return IslBuckets.parse(spec).spec


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway needs; validated on construction (ValueError, one line).

    Attributes:
        upstream: default upstream base URL (None when every model is mapped in ``models``).
        models: ``(model name, upstream base URL)`` pairs named explicitly; when empty the
            default upstream's ``GET /v1/models`` is polled and its models are registered.
        isl_buckets: ISL boundaries spec (``"512,1024,..."``), None disables by-ISL series.
        uncached_buckets: boundaries of the opt-in buckets by uncached prompt tokens (ISL minus cached
            tokens, label ``uncached_bucket``), the same rules as ``isl_buckets``; None (default): off.
        metrics_prefix: metric name prefix (``dynamo_frontend`` gives Dynamo's names).
        ttft_edges_s, itl_edges_s, duration_edges_s: ``le`` edges (seconds) of the TTFT, ITL and
            request-duration histograms, stock, by-ISL and by-uncached alike: ``fine``, ``dynamo``, a
            comma-separated string or a list (None: the prefix's default,
            :func:`~servelens.prometheus.names.default_edges`). Stored as tuples.
            With Dynamo's prefix only Dynamo's edges are accepted (its stock twins have them).
        max_series: series budget of the metrics (see
            :data:`~servelens.prometheus.frontend.DEFAULT_MAX_SERIES`); with ``max_models`` it caps
            the models registered.
        by_isl_only: export only the by-ISL families and the assignment counter (sidecar mode).
        continuous_usage: inject ``stream_options.continuous_usage_stats`` (exact tokens per
            chunk for ITL): ``on`` always, ``off`` never, ``auto`` try it and, when an upstream
            rejects it with a 400 naming the field, retry once without it and remember.
        inject_usage: add ``stream_options.include_usage`` to streams that did not ask for it
            (and strip it from what the client receives). Off: token counts come from the
            client's own request only.
        tokenizer: path of a ``tokenizer.json`` to count prompt tokens at arrival.
        chat_template: with ``tokenizer``, the model's chat template (a ``tokenizer_config.json`` or a
            Jinja file): chat prompts are counted as rendered by it, exactly the engine's count when it
            serves with the same template (:mod:`servelens.gateway.prompt`).
        request_log: path of a JSONL per-request debug log (None: no log).
        request_log_chunks: the request log also holds every output chunk's arrival time and tokens
            (for accuracy checks of ITL against an engine's token times; ~10 bytes per token).
        host, port: where to listen (port 0 picks a free port).
        metrics_port: serve ``/metrics`` on a listener of its own on this port (0 picks a free one)
            and answer 404 for it on the API port, so the API port does not expose the metrics; None
            (default): ``/metrics`` on the API port.
        metrics_host: the address of that listener (None: ``host``).
        workers: processes serving the same port(s) with ``SO_REUSEPORT``, each with its own loop and
            state, ``/metrics`` the sum over them (:mod:`servelens.gateway.workers`): a positive integer
            or ``auto`` (the cores available); stored as the count.
        max_body_bytes: request bodies above this get 413 (bytes; a size such as ``"16MiB"`` is
            accepted, see :func:`parse_bytes`).
        connect_timeout_s: TCP connect to the upstream.
        response_timeout_s: until the upstream's response headers (stream) or whole body (unary).
        read_timeout_s: longest silence between two reads of a streaming body.
        client_timeout_s: longest silence of a client while the gateway waits for its request: a
            connection with no complete request head that long (since it opened, or since the last
            response ended: an idle keep-alive connection) is closed; a request body that stops
            arriving for that long is answered 408 (counted ``validation``) and its connection closed.
            As nginx's ``client_header_timeout``/``client_body_timeout`` (60 s there too).
        models_refresh_s: period of ``/v1/models`` re-polls (0 disables periodic polls).
        shutdown_timeout_s: on stop (SIGTERM), how long requests in flight may run to their end; the
            rest are then cut (counted ``cancelled``, their upstream requests closed). Below
            Kubernetes' default 30 s grace, so they are counted before the pod is killed.
        repoll_min_interval_s: an unknown model triggers a re-poll at most this often.
        max_models: cardinality guard: at most this many model names are registered.
        slo_ttft, slo_itl: SLO specs (:func:`servelens.core.slo.parse_threshold`: ``2.0``,
            ``A+B*isl`` or a table per bucket) judged exactly for every finished request and counted
            per bucket in ``{prefix}_requests_within_slo_by_isl_total``; None: not counted. Need ISL
            buckets.
    """

    upstream: str | None = None
    models: tuple[tuple[str, str], ...] = ()
    isl_buckets: str | None = IslBuckets(DEFAULT_ISL_BOUNDARIES).spec
    uncached_buckets: str | None = None
    metrics_prefix: str = DEFAULT_PREFIX
    ttft_edges_s: tuple[float, ...] | None = None
    itl_edges_s: tuple[float, ...] | None = None
    duration_edges_s: tuple[float, ...] | None = None
    max_series: int = DEFAULT_MAX_SERIES
    by_isl_only: bool = False
    continuous_usage: ContinuousUsage = "auto"
    inject_usage: bool = True
    tokenizer: str | None = None
    chat_template: str | None = None
    request_log: str | None = None
    request_log_chunks: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = None
    metrics_host: str | None = None
    workers: int = 1
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    connect_timeout_s: float = 10.0
    response_timeout_s: float = 600.0
    read_timeout_s: float = 600.0
    client_timeout_s: float = 60.0
    models_refresh_s: float = 30.0
    shutdown_timeout_s: float = 25.0
    repoll_min_interval_s: float = 2.0
    max_models: int = 64
    slo_ttft: str | None = None
    slo_itl: str | None = None
    _upstreams: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:  # a YAML file or the flag may give a size such as 16MiB
            object.__setattr__(self, "max_body_bytes", parse_bytes(self.max_body_bytes))
        except ValueError as exc:
            raise ValueError(f"max_body_bytes: {exc}") from None
        for name in ("slo_ttft", "slo_itl"):  # YAML reads `slo_itl: 0.05` as a number
            v = getattr(self, name)
            if isinstance(v, int | float) and not isinstance(v, bool):
                object.__setattr__(self, name, repr(float(v)))
        self._check_types()
        object.__setattr__(self, "workers", parse_workers(self.workers))
        if self.upstream is not None:
            object.__setattr__(self, "upstream", normalize_upstream(self.upstream))
        models: list[tuple[str, str]] = []
        seen: set[str] = set()
        for name, url in self.models:
            if not isinstance(name, str) or not name:
                raise ValueError(f"model names must be non-empty strings, got {name!r}")
            if name in seen:
                raise ValueError(f"model {name!r} is listed twice")
            if name == UNKNOWN_MODEL:  # it would be served under the label of requests for unknown models
                raise ValueError(f"model name {name!r} is reserved for requests naming an unknown model")
            seen.add(name)
            models.append((name, normalize_upstream(url)))
        object.__setattr__(self, "models", tuple(models))
        if self.upstream is None and not models:
            raise ValueError("no upstream: give --upstream URL or map models to upstreams in the config file")
        object.__setattr__(self, "isl_buckets", parse_isl_spec(self.isl_buckets))
        try:
            object.__setattr__(self, "uncached_buckets", parse_isl_spec(self.uncached_buckets))
        except ValueError as exc:
            raise ValueError(f"uncached_buckets: {exc}") from None
        check_prefix(self.metrics_prefix)
        for name, kind in (("ttft_edges_s", "ttft"), ("itl_edges_s", "itl"), ("duration_edges_s", "duration")):
            spec = getattr(self, name)
            if spec is not None:
                object.__setattr__(self, name, parse_edges(spec, kind))
        if self.metrics_prefix == DYNAMO_PREFIX and not self.metric_edges.is_dynamo:
            raise ValueError("with --metrics-prefix dynamo_frontend the TTFT, ITL and duration edges are Dynamo's (the "
                             "by-ISL twins must share the edges of Dynamo's stock histograms): drop the edges setting")
        self.slo  # noqa: B018  # a bad SLO spec is an error at start, not at the first request
        if self.by_isl_only and self.isl_buckets is None:
            raise ValueError("--by-isl-only needs ISL bucket boundaries (--isl-buckets)")
        if self.continuous_usage not in CONTINUOUS_USAGE_MODES:
            raise ValueError(
                f"continuous_usage must be one of {', '.join(CONTINUOUS_USAGE_MODES)}, got {self.continuous_usage!r}"
            )
        if not 0 <= int(self.port) <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be 0..65535, got {self.metrics_port}")
        if self.metrics_port is not None and self.metrics_port == self.port != 0 and (
                self.metrics_host in (None, self.host)):
            raise ValueError(f"metrics_port must differ from port ({self.port}): the metrics listener is a port "
                             "of its own")
        if self.metrics_host is not None and self.metrics_port is None:
            raise ValueError("metrics_host needs metrics_port (a metrics listener of its own)")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes}")
        for name in ("connect_timeout_s", "response_timeout_s", "read_timeout_s", "client_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.models_refresh_s < 0 or self.repoll_min_interval_s < 0 or self.shutdown_timeout_s < 0:
            raise ValueError("models_refresh_s, repoll_min_interval_s and shutdown_timeout_s must be >= 0")
        if self.max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {self.max_models}")
        if self.max_series < 1:
            raise ValueError(f"max_series must be >= 1, got {self.max_series}")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            raise ValueError(f"tokenizer file not found: {self.tokenizer}")
        if self.chat_template is not None:
            if self.tokenizer is None:
                raise ValueError("chat_template needs a tokenizer (--tokenizer) to count the rendered prompt")
            if not Path(self.chat_template).is_file():
                raise ValueError(f"chat template file not found: {self.chat_template}")
        ups = [u for _, u in models]
        if self.upstream is not None:
            ups.insert(0, self.upstream)
        object.__setattr__(self, "_upstreams", tuple(dict.fromkeys(ups)))

    def _check_types(self) -> None:
        """ValueError (one line) for a setting of the wrong type (a YAML file can hold anything)."""
        for name in ("host", "metrics_prefix", "tokenizer", "chat_template", "request_log", "metrics_host", "slo_ttft",
                     "slo_itl"):
            v = getattr(self, name)
            if not isinstance(v, str) and (v is not None or name in ("host", "metrics_prefix")):
                raise ValueError(f"{name} must be a string, got {v!r}")
        for name in ("by_isl_only", "inject_usage", "request_log_chunks"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("port", "max_body_bytes", "max_models", "max_series", "metrics_port"):
            v = getattr(self, name)
            if v is None and name == "metrics_port":
                continue
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        for name in ("connect_timeout_s", "response_timeout_s", "read_timeout_s", "client_timeout_s",
                     "models_refresh_s", "repoll_min_interval_s", "shutdown_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
                raise ValueError(f"{name} must be a number of seconds, got {v!r}")

    @property
    def slo(self) -> Slo | None:
        """The SLOs the gateway counts (None without ``slo_ttft``/``slo_itl``). Raises ValueError for
        a bad spec, or SLOs without ISL buckets."""
        if self.slo_ttft is None and self.slo_itl is None:
            return None
        if self.isl_buckets is None:
            raise ValueError("--slo-ttft/--slo-itl count per ISL bucket: they need --isl-buckets")
        buckets = IslBuckets.parse(self.isl_buckets)
        return Slo(parse_threshold(self.slo_ttft, buckets) if self.slo_ttft is not None else None,
                   parse_threshold(self.slo_itl, buckets) if self.slo_itl is not None else None)

    @property
    def worker_count(self) -> int:
        """Worker processes (``workers``; 1: one process, no supervisor)."""
        return self.workers

    @property
    def metric_edges(self) -> MetricEdges:
        """The histograms' ``le`` edges: the prefix's defaults with the TTFT, ITL and duration edges set here."""
        edges = default_edges(self.metrics_prefix)
        return replace(edges, ttft_s=self.ttft_edges_s or edges.ttft_s, itl_s=self.itl_edges_s or edges.itl_s,
                       duration_s=self.duration_edges_s or edges.duration_s)

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every distinct upstream base URL, the default one first."""
        return self._upstreams

    @property
    def discover(self) -> bool:
        """True when models come from the default upstream's ``/v1/models`` (none were named)."""
        return not self.models

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GatewayConfig:
        """Build from a mapping (YAML file or keyword arguments); unknown keys raise ValueError.

        ``models`` may be a mapping ``name -> URL | {upstream: URL}``, a list of names (served by
        ``upstream``), or a list of ``(name, URL)`` pairs.
        """
        check_known_settings(values)
        kwargs = dict(values)
        if "models" in kwargs:
            kwargs["models"] = _parse_models(kwargs["models"], kwargs.get("upstream"))
        return cls(**kwargs)


def check_known_settings(values: Mapping[str, Any], where: str = "") -> None:
    """Raise ValueError (one line) naming every key of ``values`` that is not a
    :class:`GatewayConfig` setting, with the closest known name for each (``porrt`` -> ``port``).
    ``where`` prefixes the message (``config file gw.yaml: ``)."""
    allowed = sorted(f.name for f in fields(GatewayConfig) if f.init)
    unknown = sorted(set(values) - set(allowed))
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, allowed, n=1)
        named.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise ValueError(f"{where}unknown gateway setting(s): {', '.join(named)}")


def _parse_models(raw: Any, default_upstream: str | None) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    out: list[tuple[str, str]] = []
    if isinstance(raw, Mapping):
        for name, spec in raw.items():
            if isinstance(spec, Mapping):
                url = spec.get("upstream", default_upstream)
            else:
                url = spec if spec is not None else default_upstream
            if url is None:
                raise ValueError(f"model {name!r} has no upstream URL and there is no default upstream")
            out.append((str(name), str(url)))
        return tuple(out)
    if isinstance(raw, list | tuple):
        for item in raw:
            if isinstance(item, str):
                if default_upstream is None:
                    raise ValueError(f"model {item!r} has no upstream URL and there is no default upstream")
                out.append((item, default_upstream))
            elif isinstance(item, list | tuple) and len(item) == 2:
                out.append((str(item[0]), str(item[1])))
            elif isinstance(item, Mapping) and "name" in item:
                url = item.get("upstream", default_upstream)
                if url is None:
                    raise ValueError(f"model {item['name']!r} has no upstream URL")
                out.append((str(item["name"]), str(url)))
            else:
                raise ValueError(f"bad models entry {item!r}: expected a name, (name, url) or {{name, upstream}}")
        return tuple(out)
    raise ValueError("models must be a mapping of name -> upstream URL, or a list")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a gateway YAML file into a mapping for :meth:`GatewayConfig.from_mapping`.

    Raises ValueError (one line) when it is missing, not YAML, not a mapping, or names a key that is no
    setting (checked first, so a misspelt key is what the error names).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"config file {p} is not UTF-8 text ({exc.reason})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"config file {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping of settings")
    values = {str(k).replace("-", "_"): v for k, v in data.items()}
    check_known_settings(values, f"config file {p}: ")  # before any other complaint: a misspelt key explains it
    if "isl_buckets" in values and values["isl_buckets"] is None:  # `isl_buckets:` with nothing after it
        raise ValueError(f"config file {p}: isl_buckets is empty: give boundaries in tokens or 'off'")
    return values

