"""Prometheus export: the only package of servelens that imports ``prometheus_client``."""

from servelens.prometheus.collector import FrontendCollector
from servelens.prometheus.frontend import FrontendMetrics
from servelens.prometheus.names import MetricNames

__all__ = ["FrontendCollector", "FrontendMetrics", "MetricNames"]
