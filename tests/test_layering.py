"""Imports go one way: core imports nothing of ours outside core; nothing imports cli;
only servelens.prometheus imports prometheus_client; core does no I/O-bound imports."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "servelens"
CORE_FORBIDDEN = {"asyncio", "aiohttp", "socket", "prometheus_client", "time", "subprocess", "rich"}


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def modules() -> list[tuple[str, set[str]]]:
    return [(str(p.relative_to(SRC)), imports(p)) for p in sorted(SRC.rglob("*.py"))]


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
