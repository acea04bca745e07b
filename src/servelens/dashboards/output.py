"""Writing the dashboard and rules files into a directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
) -> DashboardFiles:
    """Write ``grafana-dashboard.json``, ``recording-rules.yml`` and ``alert-rules.yml`` into
    ``output_dir`` (created if missing): the mix-adjusted figures at ``reference``; with ``slo``,
    attainment rules and alerts below ``target`` (``edges``: the ``le`` edges the server exports,
    default the prefix's; ``slo_source="counters"``: from the gateway's exact SLO counters instead).
    Raises OSError when it cannot be written and ValueError for an SLO that is not a finite number
    > 0 or below every edge, or a target outside (0, 1]; nothing is written then."""
    if reference.mix is not None:
        reference = MixReference(mix=aligned_mix(reference.mix, buckets.labels))
    # built first: bad values raise before anything is written
    alerts = alert_rules(names, ttft_p95_slo_s, window, slo=slo, target=target, buckets=buckets, edges=edges,
                         slo_source=slo_source)
    rules = recording_rules(names, window, reference=reference, slo=slo, buckets=buckets, edges=edges,
                            slo_source=slo_source)
    dash = grafana_dashboard(names, buckets, reference=reference)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = DashboardFiles(out / DASHBOARD_FILE, out / RECORDING_FILE, out / ALERT_FILE)
    files.dashboard.write_text(json.dumps(dash, indent=2) + "\n")
    files.recording_rules.write_text(to_yaml(rules))
    files.alert_rules.write_text(to_yaml(alerts))
    return files
