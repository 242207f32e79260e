"""The import rules of docs/architecture.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports(path: Path) -> set[str]:
    """Top-level module names and in-project modules a file imports (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
    return found


def files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_sdk_never_imports_broker() -> None:
    for path in files("sdk"):
        bad = {m for m in imports(path) if m == "broker" or m.startswith("broker.")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_orjson_lives_in_the_wire_module_only() -> None:
    users = [
        path.relative_to(ROOT).as_posix()
        for path in [*files("broker"), *files("sdk")]
        if any(m == "orjson" or m.startswith("orjson.") for m in imports(path))
    ]
    assert users == ["sdk/_wire.py"]


@pytest.mark.parametrize("path", files("broker/engine"), ids=lambda p: p.name)
def test_engine_imports_nothing_outside_itself_but_the_standard_library(path: Path) -> None:
    banned = {"time", "asyncio", "socket", "sqlite3", "threading", "websockets", "anyio", "orjson"}
    for module in imports(path):
        top = module.split(".")[0]
        assert top not in banned, f"{path.name} imports {module}"
        if top in {"broker", "sdk"}:
            assert module.startswith("broker.engine"), f"{path.name} imports {module}"


def test_dispatcher_does_not_reach_up_into_the_server() -> None:
    for module in imports(ROOT / "broker" / "dispatch.py"):
        assert module not in {"broker.server", "broker.ops", "broker.cli"}, module


@pytest.mark.parametrize("path", files("broker/store"), ids=lambda p: p.name)
def test_stores_know_only_the_engine(path: Path) -> None:
    for module in imports(path):
        if module.startswith("broker."):
            assert module.startswith(("broker.engine", "broker.store")), f"{path.name}: {module}"


def test_the_commit_gate_knows_only_engine_and_store() -> None:
    for module in imports(ROOT / "broker" / "commit.py"):
        if module.startswith("broker."):
            assert module.startswith(("broker.engine", "broker.store")), module


def _broker_node(module: str) -> str | None:
    """The node of the import graph a ``broker`` module belongs to: a top-level module of
    its own, or its subpackage (``broker.engine``, ``broker.store``) as one."""
    parts = module.split(".")
    if parts[0] != "broker" or len(parts) == 1:
        return None  # not ours, or the package's __init__ (its version string)
    return ".".join(parts[:2])


def test_no_import_cycles_among_the_brokers_modules() -> None:
    graph: dict[str, set[str]] = {}
    for path in files("broker"):
        node = _broker_node(".".join(path.relative_to(ROOT).with_suffix("").parts))
        if node is None:
            continue
        edges = graph.setdefault(node, set())
        for module in imports(path):
            target = _broker_node(module)
            if target is not None and target != node:
                edges.add(target)

    def cycle_from(start: str, node: str, seen: list[str]) -> list[str] | None:
        for target in sorted(graph.get(node, ())):
            if target == start:
                return [*seen, target]
            if target not in seen:
                found = cycle_from(start, target, [*seen, target])
                if found:
                    return found
        return None

    for start in sorted(graph):
        cycle = cycle_from(start, start, [start])
        assert cycle is None, " -> ".join(cycle)
    assert {"broker.server", "broker.connection", "broker.ops", "broker.http"} <= set(graph)


def test_the_egress_rules_are_pure() -> None:
    for module in imports(ROOT / "broker" / "egress.py"):
        top = module.split(".")[0]
        assert top in {"__future__", "enum", "collections", "typing"}, module
