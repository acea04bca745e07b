"""Grafana dashboard and Prometheus recording/alert rules, generated from
:mod:`servelens.prometheus.names`; the PromQL is shared with ``servelens report --prometheus``.

- :mod:`.queries`: the per-bucket PromQL (one query per bucket, in numeric order).
- :mod:`.grafana`: the dashboard JSON; :mod:`.rules`: recording and alert rules;
  :mod:`.output`: writing them into a folder (``servelens dashboard``); :mod:`.kubernetes`: the same
  documents as a PrometheusRule and a dashboard ConfigMap, beside the gateway's Deployment, Service,
  sidecar pod and monitors (``servelens dashboard --kubernetes``, the repository's ``deploy/``).

May import: :mod:`servelens.core`, :mod:`servelens.prometheus`; nothing above them.
"""

from servelens.dashboards.grafana import grafana_dashboard, panel_queries, substitute_variables
from servelens.dashboards.output import DashboardFiles, write_dashboard_files
from servelens.dashboards.queries import FIGURES, BucketQuery, Figure, bucket_queries
from servelens.dashboards.rules import alert_rules, recording_rules, to_yaml

__all__ = [
    "FIGURES",
    "BucketQuery",
    "DashboardFiles",
    "Figure",
    "alert_rules",
    "bucket_queries",
    "grafana_dashboard",
    "panel_queries",
    "recording_rules",
    "substitute_variables",
    "to_yaml",
    "write_dashboard_files",
]
