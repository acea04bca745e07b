"""The middleware's settings (keyword arguments, else ``SERVELENS_*`` environment variables) and the
metrics it records into, one set per prometheus_client registry and process.

vLLM builds its middleware with no arguments (``--middleware servelens.asgi.MetricsMiddleware``), so
everything can come from the environment:

========================== =============================================== ===========================
variable                   meaning                                         default
========================== =============================================== ===========================
``SERVELENS_MODEL``        model names registered at start (comma list)    the app's served models
``SERVELENS_ISL_BUCKETS``  ISL boundaries in tokens, or ``off``            ``512,...,16384``
``SERVELENS_METRICS_PREFIX`` metric name prefix                            ``servelens``
``SERVELENS_INJECT_USAGE`` add ``stream_options.include_usage`` (1/0)      ``1``
``SERVELENS_CONTINUOUS_USAGE`` add ``continuous_usage_stats``: auto/on/off ``auto``
``SERVELENS_MAX_LEARNED_MODELS`` models registered from answered requests  ``8``
========================== =============================================== ===========================
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets
from servelens.gateway.accounting import Accounting
from servelens.prometheus import CollectorRegistry, FrontendMetrics
from servelens.prometheus.names import DEFAULT_PREFIX

ENV_MODEL = "SERVELENS_MODEL"
ENV_ISL_BUCKETS = "SERVELENS_ISL_BUCKETS"
ENV_PREFIX = "SERVELENS_METRICS_PREFIX"
ENV_INJECT_USAGE = "SERVELENS_INJECT_USAGE"
ENV_CONTINUOUS_USAGE = "SERVELENS_CONTINUOUS_USAGE"
ENV_MAX_LEARNED_MODELS = "SERVELENS_MAX_LEARNED_MODELS"
DEFAULT_MAX_LEARNED_MODELS = 8
"""Models registered from requests the app answered with a 2xx, beyond those known at start: an app that
ignores ``model`` answers any name, and each name registered is ~3,600 series lines on ``/metrics``."""
CONTINUOUS_MODES = ("auto", "on", "off")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class AsgiSettings:
    """What the middleware measures and adds (see the module docstring for the environment variables).

    Attributes:
        models: names registered (every series at zero) at start, beside those the app serves.
        isl_buckets: boundaries spec (``"512,1024"``), or None: no by-ISL families.
        prefix: metric name prefix (``servelens``: the gateway's names, apart from vLLM's ``vllm:``).
        inject_usage: add ``stream_options.include_usage`` to streams that did not ask for it.
        continuous_usage: ``auto`` (add ``continuous_usage_stats`` until the app refuses it), ``on``, ``off``.
        max_learned_models: how many models a request may register (the app answered it with a 2xx) beyond
            ``models`` and those the app says it serves; requests naming others are counted under
            ``model="unknown_model"`` (0: none registered from requests).
    """

    models: tuple[str, ...] = ()
    isl_buckets: str | None = IslBuckets(DEFAULT_ISL_BOUNDARIES).spec
    prefix: str = DEFAULT_PREFIX
    inject_usage: bool = True
    continuous_usage: str = "auto"
    max_learned_models: int = DEFAULT_MAX_LEARNED_MODELS

    @classmethod
    def resolve(
        cls, environ: Mapping[str, str], *, model: str | list[str] | tuple[str, ...] | None = None,
        isl_buckets: str | None = None, prefix: str | None = None, inject_usage: bool | None = None,
        continuous_usage: str | None = None, max_learned_models: int | None = None,
    ) -> AsgiSettings:
        """Settings from the keyword arguments, else ``environ``, else the defaults.

        Raises ValueError naming the variable (or argument) and its bad value."""
        def env(name: str) -> str | None:
            v = environ.get(name)
            return v.strip() if v is not None and v.strip() else None

        names = model if model is not None else env(ENV_MODEL)
        if isinstance(names, str):
            names = [m.strip() for m in names.split(",") if m.strip()]
        # (set but empty is an error, as ``--isl-buckets ''`` is: not the defaults in silence)
        spec = isl_buckets if isl_buckets is not None else environ.get(ENV_ISL_BUCKETS)
        buckets = cls.isl_buckets
        if spec is not None:
            where = "isl_buckets" if isl_buckets is not None else ENV_ISL_BUCKETS
            if not spec.strip():
                raise ValueError(f"{where}={spec!r} is empty: give boundaries in tokens (e.g. 512,1024,2048) or "
                                 "'off' to turn the by-ISL metrics off")
            if spec.strip().lower() == "off":
                buckets = None
            else:
                try:
                    buckets = IslBuckets.parse(spec).spec
                except ValueError as exc:
                    raise ValueError(f"{where}={spec!r}: {exc}") from None
        if inject_usage is None:
            raw = env(ENV_INJECT_USAGE)
            if raw is not None and raw.lower() not in _TRUE | _FALSE:
                raise ValueError(f"{ENV_INJECT_USAGE}={raw!r}: give 1 or 0")
            inject_usage = raw is None or raw.lower() in _TRUE
        cont = continuous_usage if continuous_usage is not None else env(ENV_CONTINUOUS_USAGE) or "auto"
        if cont not in CONTINUOUS_MODES:
            where = "continuous_usage" if continuous_usage is not None else ENV_CONTINUOUS_USAGE
            raise ValueError(f"{where}={cont!r}: give one of {', '.join(CONTINUOUS_MODES)}")
        learned = max_learned_models
        if learned is None:
            raw = env(ENV_MAX_LEARNED_MODELS)
            try:
                learned = DEFAULT_MAX_LEARNED_MODELS if raw is None else int(raw)
            except ValueError:
                raise ValueError(f"{ENV_MAX_LEARNED_MODELS}={raw!r}: give a whole number >= 0") from None
        if isinstance(learned, bool) or not isinstance(learned, int) or learned < 0:
            given = f"max_learned_models={learned!r}" if max_learned_models is not None else \
                f"{ENV_MAX_LEARNED_MODELS}={env(ENV_MAX_LEARNED_MODELS)!r}"
            raise ValueError(f"{given}: give a whole number >= 0")
        return cls(tuple(names or ()), buckets, prefix or env(ENV_PREFIX) or DEFAULT_PREFIX, inject_usage, cont,
                   learned)


@dataclass(frozen=True)
class _Shared:
    registry: CollectorRegistry
    settings: AsgiSettings
    metrics: FrontendMetrics
    accounting: Accounting


_shared: dict[int, _Shared] = {}
_lock = threading.Lock()


def shared_metrics(registry: CollectorRegistry, settings: AsgiSettings) -> tuple[FrontendMetrics, Accounting]:
    """The metrics of ``registry`` in this process, created (and registered) on first use: every
    middleware on one registry records into the same families, so a second app, or the middleware
    added twice, neither registers a name twice nor counts a request twice (the outer one measures).

    Raises ValueError for bad settings (prefix) and for a second middleware on the same registry
    with other buckets or prefix."""
    with _lock:
        got = _shared.get(id(registry))
        if got is not None and got.registry is registry:
            if (got.settings.isl_buckets, got.settings.prefix) != (settings.isl_buckets, settings.prefix):
                raise ValueError(
                    f"another MetricsMiddleware in this process records into this registry with ISL buckets "
                    f"{got.settings.isl_buckets} and prefix {got.settings.prefix!r}: give both the same settings")
            return got.metrics, got.accounting
        metrics = FrontendMetrics(registry=registry, prefix=settings.prefix, isl_buckets=settings.isl_buckets)
        accounting = Accounting(metrics, None)
        _shared[id(registry)] = _Shared(registry, settings, metrics, accounting)
        return metrics, accounting
