"""deploy/: the committed tree is ``servelens dashboard --kubernetes``'s output; every manifest of both
overlays (rendered as kustomize does) is valid against the Kubernetes API schemas (kubernetes-validate)
and the Prometheus Operator CRD schemas (tests/data/prometheus-operator); the rules pass promtool; the
pieces fit (selectors, port names, probe paths, command lines, grace periods); the Dockerfile is sound."""

from __future__ import annotations

import copy
import io
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from servelens.cli.gateway import config_from_args
from servelens.cli.main import build_parser, main
from servelens.core.buckets import IslBuckets
from servelens.dashboards import kubernetes as k8s
from servelens.dashboards.grafana import grafana_dashboard
from servelens.dashboards.output import dashboard_documents
from servelens.gateway import server
from servelens.gateway.app import build_app
from servelens.gateway.config import GatewayConfig
from servelens.prometheus.names import MetricNames

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = ROOT / "tests" / "data" / "prometheus-operator"
OVERLAYS = ("gateway", "vllm-sidecar")
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())  # the oldest release still kept, and the newest
BUCKETS = IslBuckets.default()


# -- kustomize ---------------------------------------------------------------------------------
def render(folder: Path) -> list[dict[str, Any]]:
    """``kustomize build`` of a kustomization that has only ``resources`` (files and folders): their
    documents in order. Fails on any other kustomize field, which this renderer does not apply."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(kust) <= {"apiVersion", "kind", "resources"}, f"{folder}: fields beyond resources: {set(kust)}"
    docs: list[dict[str, Any]] = []
    for res in kust["resources"]:
        path = (folder / res).resolve()
        docs.extend(render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d])
    return docs


def _key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(DEPLOY / "overlays" / request.param)


def test_committed_deploy_is_the_generated_tree(tmp_path: Path) -> None:
    with redirect_stdout(io.StringIO()) as out:
        assert main(["dashboard", "--kubernetes", str(tmp_path)]) == 0
    generated = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert generated == {Path(p).relative_to(tmp_path).as_posix() for p in out.getvalue().split()}
    committed = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*.yaml")}
    assert committed == generated, "deploy/ is stale: run servelens dashboard --kubernetes deploy"
    for rel in sorted(generated):
        assert (DEPLOY / rel).read_text() == (tmp_path / rel).read_text(), (
            f"deploy/{rel} differs from the generator: run servelens dashboard --kubernetes deploy")


def test_both_shapes_hold_the_rules_and_the_dashboard(overlay: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in overlay)
    assert kinds in (sorted(["PrometheusRule", "ConfigMap", "Deployment", "Service", "ServiceMonitor"]),
                     sorted(["PrometheusRule", "ConfigMap", "Deployment", "Service", "PodMonitor"]))
    assert len({_key(d) for d in overlay}) == len(overlay)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
@pytest.mark.parametrize("shape", OVERLAYS)
def test_kubectl_kustomize_renders_the_same(shape: str) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(DEPLOY / "overlays" / shape)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    theirs = sorted((d for d in yaml.safe_load_all(out) if d), key=_key)
    assert theirs == sorted(render(DEPLOY / "overlays" / shape), key=_key)


# -- schemas -----------------------------------------------------------------------------------
def _strict(schema: Any) -> Any:
    """An OpenAPI v3 schema from a CRD as JSON Schema that refuses unknown fields (the API server prunes
    them silently, so a misspelt field would be lost without a word)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get(
                "x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    out = {}
    for path in sorted(CRDS.glob("monitoring.coreos.com_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for v in crd["spec"]["versions"]:
            schema = _strict(v["schema"]["openAPIV3Schema"])
            api = f"{crd['spec']['group']}/{v['name']}"
            out[(api, crd["spec"]["names"]["kind"])] = jsonschema.Draft4Validator(schema)
    return out


CRD_VALIDATORS = _crd_validators()


def validate(doc: dict[str, Any]) -> None:
    """Raise ValidationError unless ``doc`` fits its kind's schema (built-in kinds: every version of
    :data:`K8S_VERSIONS`, strict: no unknown fields)."""
    crd = CRD_VALIDATORS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        crd.validate(doc)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def test_crd_schemas_are_the_recorded_files() -> None:
    import hashlib

    for line in (CRDS / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == digest, name
    assert {k for _, k in CRD_VALIDATORS} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_every_manifest_is_valid(overlay: list[dict[str, Any]]) -> None:
    for doc in overlay:
        validate(doc)


@pytest.mark.parametrize(("kind", "mutate"), [
    ("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(readinesProbe={})),
    ("Deployment", lambda d: d["spec"]["template"]["spec"].update(terminationGracePeriodSeconds="41s")),
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrapeInterval="15s")),
    ("PodMonitor", lambda d: d["spec"].update(podMetricsEndpoints="metrics")),
    ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(expr=["up"])),
])
def test_the_validation_catches_a_broken_manifest(kind: str, mutate: Any) -> None:
    docs = render(DEPLOY / "overlays" / "gateway") + render(DEPLOY / "overlays" / "vllm-sidecar")
    doc = copy.deepcopy(_by_kind(docs, kind)[0])
    mutate(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


@pytest.mark.binaries("promtool")
def test_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian package prometheus) is required"
    (rule,) = _by_kind(render(DEPLOY / "base"), "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    docs = dashboard_documents(MetricNames(), BUCKETS, 2.0)
    assert rule["spec"]["groups"] == docs.recording_rules["groups"] + docs.alert_rules["groups"]
    assert any("alert" in r for g in rule["spec"]["groups"] for r in g["rules"])


def test_dashboard_configmap_carries_the_dashboard_for_grafanas_sidecar() -> None:
    (cm,) = _by_kind(render(DEPLOY / "base"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    assert json.loads(text) == grafana_dashboard(MetricNames(), BUCKETS)


# -- the pieces fit ----------------------------------------------------------------------------
def _pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in _by_kind(docs, "Deployment")]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _gateways(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"]["containers"] if c["name"] == "gateway"]


def test_services_and_monitors_select_pods_and_ports_that_exist(overlay: list[dict[str, Any]]) -> None:
    (svc,) = _by_kind(overlay, "Service")
    (pod,) = _pods(overlay)
    assert _matches(svc["spec"]["selector"], pod["metadata"]["labels"])
    for dep in _by_kind(overlay, "Deployment"):
        assert _matches(dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"])
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    (gw,) = _gateways(pod)
    # clients reach the gateway, never the engine directly
    assert [p["targetPort"] for p in svc["spec"]["ports"] if p["name"] == "http"] == ["http"]
    assert {p["name"]: p["containerPort"] for p in gw["ports"]}["http"] == 8080
    for mon in _by_kind(overlay, "ServiceMonitor"):
        assert _matches(mon["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
        assert {e["port"] for e in mon["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
        assert "metrics" in {e["port"] for e in mon["spec"]["endpoints"]}
    for mon in _by_kind(overlay, "PodMonitor"):
        assert _matches(mon["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
        assert {e["port"] for e in mon["spec"]["podMetricsEndpoints"]} <= ports
        assert "metrics" in {e["port"] for e in mon["spec"]["podMetricsEndpoints"]}


def _gateway_config(args: list[str]) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(args))


def test_gateway_containers_run_a_valid_gateway_command(overlay: list[dict[str, Any]]) -> None:
    (pod,) = _pods(overlay)
    (gw,) = _gateways(pod)
    assert gw["command"] == ["servelens"]
    cfg = _gateway_config(gw["args"])
    ports = {p["name"]: p["containerPort"] for p in gw["ports"]}
    assert (cfg.host, cfg.port, cfg.metrics_port) == ("0.0.0.0", ports["http"], ports["metrics"])
    assert cfg.isl_buckets is not None and IslBuckets.parse(cfg.isl_buckets) == BUCKETS
    assert cfg.metrics_prefix == "servelens"
    sidecar = len(pod["spec"]["containers"]) > 1
    assert cfg.upstreams == (("http://127.0.0.1:8000",) if sidecar else (k8s.KubernetesOptions().engine_url,))
    if sidecar:
        (engine,) = [c for c in pod["spec"]["containers"] if c["name"] != "gateway"]
        assert {p["name"]: p["containerPort"] for p in engine["ports"]}["vllm-http"] == 8000


def test_probes_use_the_gateways_own_endpoints(overlay: list[dict[str, Any]]) -> None:
    (gw,) = _gateways(_pods(overlay)[0])
    assert gw["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    app = build_app(GatewayConfig(upstream="http://127.0.0.1:9"))
    gets = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource is not None}
    assert {"/ready", "/health"} <= gets


def test_gateway_runs_as_non_root_with_requests(overlay: list[dict[str, Any]]) -> None:
    (gw,) = _gateways(_pods(overlay)[0])
    sc = gw["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0 and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(gw["resources"]["requests"])


def _sleep_s(container: dict[str, Any]) -> int:
    cmd = container["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[0] == "sleep"
    return int(cmd[1])


def test_shutdown_fits_in_the_grace_period(overlay: list[dict[str, Any]]) -> None:
    assert server.CUT_S == k8s.CUT_S  # the generator's copy of the gateway's cut-off
    (pod,) = _pods(overlay)
    (gw,) = _gateways(pod)
    cfg = _gateway_config(gw["args"])
    # SIGTERM comes after the preStop hook; the gateway then drains for shutdown_timeout_s and waits
    # CUT_S twice (gateway/server.py: RunningGateway.close); all of it counts against the grace period
    gateway_done_s = _sleep_s(gw) + cfg.shutdown_timeout_s + 2 * server.CUT_S
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert gateway_done_s < grace
    assert _sleep_s(gw) >= 1  # the Service's endpoints drop the pod meanwhile
    for engine in (c for c in pod["spec"]["containers"] if c["name"] != "gateway"):
        # the engine keeps serving until the gateway has relayed its last stream, then has time to exit
        assert _sleep_s(engine) >= gateway_done_s
        assert grace - _sleep_s(engine) >= 15


def test_dynamo_names_make_a_sidecar_mode_gateway(tmp_path: Path) -> None:
    with redirect_stdout(io.StringIO()):
        assert main(["dashboard", "--kubernetes", str(tmp_path), "--metrics-prefix", "dynamo_frontend",
                     "--engine-url", "http://dynamo-frontend:8000/v1"]) == 0
    docs = render(tmp_path / "overlays" / "gateway")
    for doc in docs:
        validate(doc)
    (gw,) = _gateways(_pods(docs)[0])
    cfg = _gateway_config(gw["args"])
    assert cfg.by_isl_only and cfg.metrics_prefix == "dynamo_frontend"
    assert cfg.upstreams == ("http://dynamo-frontend:8000",)
    (rule,) = _by_kind(docs, "PrometheusRule")
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all("servelens_" not in e for e in exprs) and any("dynamo_frontend_" in e for e in exprs)


def test_bad_engine_url_is_one_line(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(["dashboard", "--kubernetes", str(tmp_path), "--engine-url", "engine:8000"]) == 2
    assert err.getvalue().count("\n") == 1 and "engine:8000" in err.getvalue()
    assert not any(tmp_path.iterdir())


def test_options_change_the_manifests() -> None:
    docs = dashboard_documents(MetricNames(), BUCKETS, 2.0)
    opts = k8s.KubernetesOptions(shutdown_timeout_s=100, endpoint_delay_s=9, replicas=5)
    dep = k8s.gateway_deployment(MetricNames(), BUCKETS, opts)
    assert dep["spec"]["replicas"] == 5
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 9 + 100 + 1 + 10
    assert "--shutdown-timeout" in (args := dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert args[args.index("--shutdown-timeout") + 1] == "100"
    assert set(k8s.kubernetes_files(MetricNames(), BUCKETS, docs, opts)) == set(
        k8s.kubernetes_files(MetricNames(), BUCKETS, docs))


# -- the image recipe --------------------------------------------------------------------------
def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, rest) per instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_copies_what_exists_and_installs_the_fast_extra() -> None:
    steps = _dockerfile()
    froms = [rest for op, rest in steps if op == "FROM"]
    assert froms and all(re.match(r"python:3\.\d+-slim", f) for f in froms)
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    version = re.match(r"python:(3\.\d+)", froms[-1])
    assert version and requires == ">=3.11" and int(version.group(1).split(".")[1]) >= 11
    for op, rest in steps:
        if op == "COPY" and not rest.startswith("--from"):
            *sources, _dest = shlex.split(rest)
            for src in sources:
                assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "fast" in extras
    runs = " ".join(rest for op, rest in steps if op == "RUN")
    assert "servelens[fast]" in runs and ".[fast]" in runs


def test_dockerfile_runs_as_a_numeric_non_root_user_a_valid_gateway() -> None:
    steps = _dockerfile()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    users = [rest for op, rest in steps[last_from:] if op == "USER"]
    assert users, "no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0  # numeric: runAsNonRoot can check it
    (gw,) = _gateways(_pods(render(DEPLOY / "overlays" / "gateway"))[0])
    assert (int(uid), int(gid)) == (gw["securityContext"]["runAsUser"], gw["securityContext"]["runAsGroup"])
    # the user and group the image creates are those it runs as
    runs = " ".join(rest for op, rest in steps[last_from:] if op == "RUN")
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs
    entry = json.loads(next(rest for op, rest in steps if op == "ENTRYPOINT"))
    cmd = json.loads(next(rest for op, rest in steps if op == "CMD"))
    assert entry == gw["command"] == ["servelens"]
    cfg = _gateway_config(cmd)
    assert (cfg.host, cfg.port, cfg.metrics_port) == ("0.0.0.0", 8080, 9100)
    exposed = {int(p) for op, rest in steps if op == "EXPOSE" for p in rest.split()}
    assert exposed == {cfg.port, cfg.metrics_port}


def test_flags_the_rules_need_go_into_the_gateways_command_line(tmp_path: Path) -> None:
    """Rules from the SLO counters or on the uncached families read series only a gateway started with
    those flags exports: the generated gateways get them (and the image asked for)."""
    with redirect_stdout(io.StringIO()):
        assert main(["dashboard", "--kubernetes", str(tmp_path), "--slo-from", "counters", "--slo-ttft",
                     "0.5+0.0002*isl", "--slo-itl", "0.05", "--uncached-buckets", "512,1024",
                     "--image", "reg.example/servelens:1"]) == 0
    for overlay in ("gateway", "vllm-sidecar"):
        (dep,) = _by_kind(render(tmp_path / "overlays" / overlay), "Deployment")
        (gw,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["image"] == "reg.example/servelens:1"]
        args = gw["args"]
        assert args[args.index("--slo-ttft") + 1] == "0.5+0.0002*isl", overlay
        assert args[args.index("--slo-itl") + 1] == "0.05", overlay
        assert args[args.index("--uncached-buckets") + 1] == "512,1024", overlay
    with redirect_stdout(io.StringIO()):  # without those flags, nothing more than the defaults
        assert main(["dashboard", "--kubernetes", str(tmp_path / "plain")]) == 0
    (dep,) = _by_kind(render(tmp_path / "plain" / "overlays" / "gateway"), "Deployment")
    assert not {"--slo-ttft", "--uncached-buckets"} & set(dep["spec"]["template"]["spec"]["containers"][0]["args"])
