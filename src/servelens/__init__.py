"""servelens: per-input-length (ISL bucket) latency metrics for OpenAI-compatible LLM servers.

The library API is small: build :class:`FrontendMetrics` on a prometheus_client registry,
register your models, and feed it one :class:`LiveRequest` per request. The pure pieces
(:class:`IslBuckets`, :class:`RequestTimer`, :class:`HistogramState`, :class:`SSEDecoder`,
:func:`parse_chunk`, quantile helpers) are usable on their own.
"""

from servelens.core.buckets import DEFAULT_ISL_BOUNDARIES, IslBuckets, parse_isl_boundaries
from servelens.core.edges import MetricEdges
from servelens.core.histogram import HistogramState
from servelens.core.openai import ChunkInfo, Usage, parse_chunk
from servelens.core.quantiles import histogram_quantile, percentile
from servelens.core.sse import SSEBlock, SSEDecoder
from servelens.core.state import FrontendState, LiveRequest
from servelens.core.timing import RequestRecord, RequestTimer
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_ISL_BOUNDARIES",
    "ChunkInfo",
    "FrontendMetrics",
    "FrontendState",
    "HistogramState",
    "IslBuckets",
    "LiveRequest",
    "MetricEdges",
    "MetricNames",
    "RequestRecord",
    "RequestTimer",
    "SSEBlock",
    "SSEDecoder",
    "Usage",
    "__version__",
    "histogram_quantile",
    "parse_chunk",
    "parse_isl_boundaries",
    "percentile",
]
