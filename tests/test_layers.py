"""The import rules of docs/architecture.md, checked on the source."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

# Module names are given below as within the ``conveyor`` package (``broker.engine`` is
# ``conveyor.broker.engine``), the way the rules of docs/architecture.md speak of them.
ROOT = Path(__file__).resolve().parent.parent / "conveyor"


def imports(path: Path) -> set[str]:
    """Top-level module names and in-project modules a file imports (relative ones resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.removeprefix("conveyor.") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module.removeprefix("conveyor."))
    return found


def files(folder: str) -> list[Path]:
    found = sorted((ROOT / folder).rglob("*.py"))
    assert found, f"no Python files under {ROOT / folder}"
    return found


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


def test_the_commit_gate_knows_only_engine_store_and_its_decisions() -> None:
    allowed = ("broker.engine", "broker.store", "broker.group_commit")
    for module in imports(ROOT / "broker" / "commit.py"):
        if module.startswith("broker."):
            assert module.startswith(allowed), module


def test_the_commit_gates_decisions_are_pure() -> None:
    # broker/group_commit.py: the standard library only, and nothing that waits or does I/O.
    banned = {"time", "asyncio", "socket", "sqlite3", "threading", "selectors", "subprocess"}
    for module in imports(ROOT / "broker" / "group_commit.py"):
        top = module.split(".")[0]
        assert top not in banned, module
        assert top in sys.stdlib_module_names or module.startswith("broker.engine"), module


@pytest.mark.parametrize("path", files("broker/backend"), ids=lambda p: p.name)
def test_backends_stand_below_the_server(path: Path) -> None:
    # A backend is the job table and what keeps it: the engine, a store, the commit gate,
    # the egress rules and the scheduler. Never the wire, the dispatcher or the server.
    allowed = ("broker.engine", "broker.store", "broker.backend", "broker.commit",
               "broker.egress", "broker.scheduler")  # fmt: skip
    for module in imports(path):
        if module.startswith("broker."):
            assert module.startswith(allowed), f"{path.name}: {module}"
        assert module.split(".")[0] not in {"sdk", "websockets"}, f"{path.name}: {module}"


@pytest.mark.parametrize("name", ["postgres.py", "_pg_schema.py", "_pg_conn.py", "_pg_clock.py"])
def test_the_postgres_backend_knows_only_the_table_and_psycopg(name: str) -> None:
    # The engine (its rules and guards), the store's error, the scheduler, the backend
    # interface, the egress gate, and psycopg: no commit gate (every call commits itself).
    allowed = ("broker.engine", "broker.store", "broker.scheduler", "broker.backend._base",
               "broker.backend._listeners", "broker.backend._pg_schema",
               "broker.backend._pg_conn", "broker.egress")  # fmt: skip
    for module in imports(ROOT / "broker/backend" / name):
        if module.startswith("broker."):
            assert module.startswith(allowed), f"{name}: {module}"
    psycopg_users = [
        path.name for path in files("broker") if any(
            module.split(".")[0] == "psycopg" for module in imports(path)
        )
    ]  # fmt: skip
    assert sorted(psycopg_users) == ["_pg_clock.py", "_pg_conn.py", "_pg_schema.py", "postgres.py"]


def engine_names(path: Path) -> set[str]:
    """The names a file imports from the engine (``from .engine import JobTable``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("engine"):
            names.update(alias.name for alias in node.names)
    return names


# The modules that may hold the engine's table itself: the backend that owns it, the
# store that keeps it, the commit gate that commits it, and the configuration's check of
# a queues file (on a table of its own, thrown away).
TABLE_HOLDERS = {"broker/commit.py", "broker/config.py"}


@pytest.mark.parametrize("path", files("broker"), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_server_reaches_the_table_only_through_the_backend(path: Path) -> None:
    where = path.relative_to(ROOT).as_posix()
    if where.startswith(("broker/engine/", "broker/store/", "broker/backend/")):
        return
    if where in TABLE_HOLDERS:
        return
    held = engine_names(path) & {"JobTable", "Queue", "JobHandle", "Changes"}
    assert not held, f"{where} imports {held} from the engine: go through broker/backend"


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


# websockets' modules the broker and the SDK may import: those its documentation describes
# as public (the sans-I/O protocols and what they hand out). Anything else (its asyncio
# connection, its frame parser's reader, its C speedups) may change in any release.
WEBSOCKETS_PUBLIC = {
    "websockets.client",
    "websockets.server",
    "websockets.frames",
    "websockets.http11",
    "websockets.datastructures",
    "websockets.exceptions",
    "websockets.typing",
    "websockets.uri",
    "websockets.protocol",  # for State
}
# Attributes of websockets' protocol objects that its documentation does not describe:
# the parser's buffer, the queue of bytes to write, the parser itself.
WEBSOCKETS_PROTOCOL_INTERNALS = {"reader", "writes", "parser", "events", "eof_sent"}


def files_on_websockets() -> list[Path]:
    return [*files("broker"), *files("sdk")]


def websockets_names(tree: ast.AST) -> set[str]:
    """The local names a module binds to websockets' modules, classes and functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "websockets":
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "websockets":
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def base_root(base: ast.expr) -> str | None:
    """The name a base class expression starts from: ``a`` of ``a.b.C`` or ``a[T]``."""
    while isinstance(base, (ast.Attribute, ast.Subscript, ast.Call)):
        base = base.value if not isinstance(base, ast.Call) else base.func
    return base.id if isinstance(base, ast.Name) else None


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", files_on_websockets(), ids=_rel)
def test_only_websockets_public_modules_and_names_are_imported(path: Path) -> None:
    for module in imports(path):
        if module.split(".")[0] == "websockets":
            assert module in WEBSOCKETS_PUBLIC, f"{_rel(path)} imports {module}"
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("websockets"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{_rel(path)} imports {private} from {node.module}"


@pytest.mark.parametrize("path", files_on_websockets(), ids=_rel)
def test_nothing_subclasses_a_websockets_class(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    theirs = websockets_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bad = [ast.unparse(b) for b in node.bases if base_root(b) in theirs]
            assert not bad, f"{_rel(path)}: class {node.name} subclasses {bad}"


@pytest.mark.parametrize("path", files_on_websockets(), ids=_rel)
def test_no_protocol_internals_are_read(path: Path) -> None:
    # ``protocol.reader.buffer``, ``protocol.writes``: what the broker once read.
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in WEBSOCKETS_PROTOCOL_INTERNALS:
            owner = ast.unparse(node.value)
            assert not owner.endswith("protocol"), f"{_rel(path)} reads {owner}.{node.attr}"


def test_the_subclass_check_sees_websockets_classes_however_imported() -> None:
    tree = ast.parse(
        "from websockets.asyncio.connection import Connection\n"
        "import websockets.client as wc\n"
        "class A(Connection): pass\n"
        "class B(wc.ClientProtocol): pass\n"
        "class C(dict[str, int]): pass\n"
    )
    theirs = websockets_names(tree)
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    assert [base_root(c.bases[0]) in theirs for c in classes] == [True, True, False]
