"""Imports go one way: core imports nothing of ours outside core; nothing imports cli;
only servelens.prometheus imports prometheus_client; core does no I/O-bound imports.

Between packages, every import of ours follows :data:`ALLOWED`: each top-level package or module of
``servelens`` declares the others it may import; the declared map has no cycle, names every unit
that exists, and every actual import (module level or inside a function) is in it."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "servelens"
CORE_FORBIDDEN = {"asyncio", "aiohttp", "socket", "prometheus_client", "time", "subprocess", "rich"}

ROOT = "servelens"  # the package's own __init__ (the small library API, __version__)
BASE = {"core", "prometheus"}  # what most packages above these two may import
ALLOWED: dict[str, set[str]] = {
    # the bottom: pure measurement, then the one door to prometheus_client
    "core": set(),
    "prometheus": {"core"},
    ROOT: {"core", "prometheus"},
    # plumbing shared by servers and the code that starts them
    "serving": set(),
    "process": {"serving"},
    # formats shared by bench, report and eval (results file, /metrics scrape, per-bucket table)
    "formats": BASE,
    # adapters around the core
    "dashboards": BASE,
    "gateway": BASE | {"serving", "process"},  # process: multi-worker serving, coming
    "asgi": BASE | {"gateway"},  # coming: the gateway's stream measurement, in process
    "sim": BASE | {"serving"},
    "bench": BASE | {"formats", "serving", "sim"},  # sim: its tokenizer, the default one
    "report": BASE | {"formats", "dashboards"},  # dashboards: the PromQL it shares
    "engines": {"process"},
    # quality comparison: tables and files via formats; sim: its answers from a key, for eval.testing
    "eval": BASE | {"formats", "serving", "bench", "report", "sim"},
    # sim, formats: runs whose truth is known; gateway: a tap in front of a real engine (testing.engines)
    "testing": BASE | {"process", "formats", "report", "sim", "gateway"},
    "demo": BASE | {"process", "serving", "bench", "report", "sim", "engines"},
    "demo_hop": BASE | {"formats", "gateway"},  # gateway: its request log's reader
    "demo_story": BASE | {"bench", "report", "sim", "demo", "demo_hop"},  # the story; demo: its launcher
    # the top: thin commands over everything
    "cli": {
        ROOT, "core", "prometheus", "serving", "process", "formats", "dashboards", "gateway", "asgi", "sim",
        "bench", "report", "engines", "eval", "testing", "demo", "demo_hop", "demo_story",
    },
    "__main__": {"cli"},
}


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == ROOT:  # ``from servelens import demo`` imports the module servelens.demo
                out.update(f"{ROOT}.{a.name}" for a in node.names if a.name in ALLOWED)
    return out


def modules() -> list[tuple[str, set[str]]]:
    return [(str(p.relative_to(SRC)), imports(p)) for p in sorted(SRC.rglob("*.py"))]


def unit_of_path(rel: str) -> str:
    """``bench/runner.py`` -> ``bench``; ``demo.py`` -> ``demo``; ``__init__.py`` -> the root."""
    head = rel.split("/")[0]
    if head == "__init__.py":
        return ROOT
    return head.removesuffix(".py")


def unit_of_import(name: str) -> str | None:
    """``servelens.bench.client`` -> ``bench``; ``servelens`` -> the root; not ours -> None."""
    parts = name.split(".")
    if parts[0] != ROOT:
        return None
    return parts[1] if len(parts) > 1 else ROOT


def test_core_is_pure() -> None:
    for rel, imps in modules():
        if rel.startswith("core/"):
            ours = {i for i in imps if i.startswith("servelens")}
            assert all(i.startswith("servelens.core") for i in ours), (rel, ours)
            assert not {i.split(".")[0] for i in imps} & CORE_FORBIDDEN, (rel, imps)


def test_nothing_imports_cli() -> None:
    for rel, imps in modules():
        if not rel.startswith("cli/") and rel != "__main__.py":
            assert not any(i.startswith("servelens.cli") for i in imps), rel


def test_only_prometheus_package_imports_prometheus_client() -> None:
    for rel, imps in modules():
        if any(i.split(".")[0] == "prometheus_client" for i in imps):
            assert rel.startswith("prometheus/"), rel


def test_no_relative_imports() -> None:
    """Relative imports would hide a package's dependencies from this test."""
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            assert not (isinstance(node, ast.ImportFrom) and node.level), (str(path.relative_to(SRC)), node.lineno)


def test_declared_map_is_acyclic_and_closed() -> None:
    for unit, deps in ALLOWED.items():
        assert unit not in deps, unit
        assert deps <= ALLOWED.keys(), (unit, deps - ALLOWED.keys())
    try:
        TopologicalSorter(ALLOWED).prepare()
    except CycleError as exc:
        raise AssertionError(f"the declared import map has a cycle: {exc.args[1]}") from None
    assert not ALLOWED["core"]
    assert "cli" not in {d for unit, deps in ALLOWED.items() if unit != "__main__" for d in deps}


def test_every_unit_is_declared() -> None:
    """A new top-level package or module takes its place in the map before it is imported."""
    units = {unit_of_path(str(p.relative_to(SRC))) for p in SRC.rglob("*.py")}
    assert units <= ALLOWED.keys(), sorted(units - ALLOWED.keys())


def test_every_import_between_packages_is_declared() -> None:
    bad = []
    for rel, imps in modules():
        unit = unit_of_path(rel)
        for name in imps:
            target = unit_of_import(name)
            if target is not None and target != unit and target not in ALLOWED[unit]:
                bad.append(f"{rel} imports {name} ({unit} -> {target} is not declared)")
    assert not bad, "\n".join(bad)
