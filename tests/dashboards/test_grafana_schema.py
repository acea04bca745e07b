"""The generated Grafana dashboard against Grafana's own dashboard schema: every field decodes
into grafana-foundation-sdk's types (generated from Grafana's schema; timeseries panel options and
Prometheus queries included) and comes back unchanged, so a misspelled or misplaced field, which
Grafana would silently ignore, fails here. No Grafana runs here; this is the check that stands in."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from servelens.core.buckets import IslBuckets
from servelens.core.windows import Mix
from servelens.dashboards.grafana import grafana_dashboard
from servelens.dashboards.mix import MixReference
from servelens.prometheus.names import MetricNames

register_default_plugins()  # typed panel options and data queries (timeseries, prometheus)

ALLOWED_EXTRA = {".templating.list[].definition"}
"""Fields not in the schema's types that are kept on purpose: a query variable's ``definition`` is
the text Grafana's own variable editor writes beside ``query`` and lists in the variables view."""


def schema_differences(ours: dict[str, Any]) -> list[str]:
    """Paths (list indexes as ``[]``) where ``ours`` does not survive a decode into the SDK's types
    and an encode back: fields the schema does not have, values it changes."""
    back = json.loads(json.dumps(Dashboard.from_json(copy.deepcopy(ours)), cls=JSONEncoder))

    def walk(a: Any, b: Any, path: str) -> list[str]:
        if isinstance(a, dict):
            if not isinstance(b, dict):
                return [f"{path}: not an object after decoding"]
            return [d for k, v in a.items()
                    for d in ([f"{path}.{k}"] if k not in b else walk(v, b[k], f"{path}.{k}"))]
        if isinstance(a, list):
            if not isinstance(b, list) or len(a) != len(b):
                return [f"{path}: list changed"]
            return [d for x, y in zip(a, b, strict=True) for d in walk(x, y, f"{path}[]")]
        return [] if a == b else [f"{path}: {a!r} became {b!r}"]

    return sorted({re.sub(r"\[\d+\]", "[]", d) for d in walk(ours, back, "")})


@pytest.mark.parametrize(("prefix", "buckets", "reference"), [
    ("servelens", IslBuckets.default(), None),
    ("dynamo_frontend", IslBuckets.default(),
     MixReference(mix=Mix(IslBuckets.default().labels, (0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.02)))),
    ("servelens", IslBuckets(tuple(256 * (i + 1) for i in range(32))), None),  # 33 buckets: refIds past Z
])
def test_dashboard_decodes_into_grafanas_schema_unchanged(prefix: str, buckets: IslBuckets,
                                                         reference: MixReference | None) -> None:
    ours = json.loads(json.dumps(grafana_dashboard(MetricNames(prefix), buckets, reference=reference)))
    assert set(schema_differences(ours)) <= ALLOWED_EXTRA
    panels = ours["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs), p["title"]
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels]
    assert len(set(cells)) == len(cells)  # no two panels on one spot


def test_the_schema_check_catches_a_misspelled_field() -> None:
    ours = json.loads(json.dumps(grafana_dashboard(MetricNames(), IslBuckets.default())))
    broken = copy.deepcopy(ours)
    broken["panels"][0]["targets"][0]["legendFromat"] = broken["panels"][0]["targets"][0].pop("legendFormat")
    broken["panels"][1]["options"]["legend"]["placment"] = "right"
    broken["panels"][2]["fieldConfig"]["defaults"]["custom"]["lineWidht"] = 2
    broken["graphTooltipp"] = 1
    got = set(schema_differences(broken)) - ALLOWED_EXTRA
    assert got == {".graphTooltipp", ".panels[].targets[].legendFromat", ".panels[].options.legend.placment",
                   ".panels[].fieldConfig.defaults.custom.lineWidht"}
