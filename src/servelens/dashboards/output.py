"""Writing the dashboard and rules files into a directory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servelens.core.buckets import IslBuckets
from servelens.dashboards.grafana import grafana_dashboard
from servelens.dashboards.rules import alert_rules, recording_rules, to_yaml
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
    output_dir: str | Path, names: MetricNames, buckets: IslBuckets, ttft_p95_slo_s: float, window: str = "5m"
) -> DashboardFiles:
    """Write ``grafana-dashboard.json``, ``recording-rules.yml`` and ``alert-rules.yml`` into
    ``output_dir`` (created if missing). Raises OSError when it cannot be written and ValueError
    for an SLO that is not a finite number > 0."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    alerts = alert_rules(names, ttft_p95_slo_s, window)  # validates before anything is written
    files = DashboardFiles(out / DASHBOARD_FILE, out / RECORDING_FILE, out / ALERT_FILE)
    files.dashboard.write_text(json.dumps(grafana_dashboard(names, buckets), indent=2) + "\n")
    files.recording_rules.write_text(to_yaml(recording_rules(names, window)))
    files.alert_rules.write_text(to_yaml(alerts))
    return files
