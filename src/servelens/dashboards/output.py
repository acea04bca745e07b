"""Writing the dashboard and rules files into a directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelens.core.buckets import IslBuckets
from servelens.core.edges import MetricEdges
from servelens.core.slo import Slo
from servelens.core.windows import aligned_mix
from servelens.dashboards.grafana import grafana_dashboard
from servelens.dashboards.mix import DEFAULT_REFERENCE, MixReference
from servelens.dashboards.rules import DEFAULT_TARGET, alert_rules, recording_rules, to_yaml
from servelens.prometheus.names import MetricNames

DASHBOARD_FILE = "grafana-dashboard.json"
RECORDING_FILE = "recording-rules.yml"
ALERT_FILE = "alert-rules.yml"


@dataclass(frozen=True)
class DashboardFiles:
    """Paths of the written files."""

    dashboard: Path
    recording_rules: Path
    alert_rules: Path


@dataclass(frozen=True)
class DashboardDocuments:
    """The dashboard and the two rules files as documents (dicts), before they are written."""

    dashboard: dict[str, Any]
    recording_rules: dict[str, Any]
    alert_rules: dict[str, Any]


def dashboard_documents(
    names: MetricNames,
    buckets: IslBuckets,
    ttft_p95_slo_s: float,
    window: str = "5m",
    reference: MixReference = DEFAULT_REFERENCE,
    slo: Slo | None = None,
    target: float = DEFAULT_TARGET,
    edges: MetricEdges | None = None,
    slo_source: str = "histograms",
    uncached_buckets: IslBuckets | None = None,
) -> DashboardDocuments:
    """The Grafana dashboard, the recording rules and the alert rules that :func:`write_dashboard_files`
    writes (and :mod:`servelens.dashboards.kubernetes` wraps in a ConfigMap and a PrometheusRule).
    Raises ValueError as :func:`write_dashboard_files`."""
    if reference.mix is not None:
        reference = MixReference(mix=aligned_mix(reference.mix, buckets.labels))
    alerts = alert_rules(names, ttft_p95_slo_s, window, slo=slo, target=target, buckets=buckets, edges=edges,
                         slo_source=slo_source)
    rules = recording_rules(names, window, reference=reference, slo=slo, buckets=buckets, edges=edges,
                            slo_source=slo_source, uncached=uncached_buckets is not None)
    dash = grafana_dashboard(names, buckets, reference=reference, uncached_buckets=uncached_buckets)
    return DashboardDocuments(dash, rules, alerts)


def write_dashboard_files(
    output_dir: str | Path,
    names: MetricNames,
    buckets: IslBuckets,
    ttft_p95_slo_s: float,
    window: str = "5m",
    reference: MixReference = DEFAULT_REFERENCE,
    slo: Slo | None = None,
    target: float = DEFAULT_TARGET,
    edges: MetricEdges | None = None,
    slo_source: str = "histograms",
    uncached_buckets: IslBuckets | None = None,
) -> DashboardFiles:
    """Write ``grafana-dashboard.json``, ``recording-rules.yml`` and ``alert-rules.yml`` into
    ``output_dir`` (created if missing): the mix-adjusted figures at ``reference``; with ``slo``,
    attainment rules and alerts below ``target`` (``edges``: the ``le`` edges the server exports,
    default the prefix's; ``slo_source="counters"``: from the gateway's exact SLO counters instead;
    ``uncached_buckets``: the panels and rules per uncached bucket too). Raises OSError when it cannot
    be written and ValueError for an SLO that is not a finite number > 0 or below every edge, or a
    target outside (0, 1]; nothing is written then."""
    # built first: bad values raise before anything is written
    docs = dashboard_documents(names, buckets, ttft_p95_slo_s, window, reference, slo, target, edges, slo_source,
                               uncached_buckets)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = DashboardFiles(out / DASHBOARD_FILE, out / RECORDING_FILE, out / ALERT_FILE)
    files.dashboard.write_text(json.dumps(docs.dashboard, indent=2) + "\n")
    files.recording_rules.write_text(to_yaml(docs.recording_rules))
    files.alert_rules.write_text(to_yaml(docs.alert_rules))
    return files
