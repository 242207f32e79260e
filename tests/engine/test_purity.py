"""The engine is a pure core: no I/O, event loop, clock or thread library (``docs/contract.md``,
TIM-2)."""

from __future__ import annotations

import ast
from pathlib import Path

from conveyor import broker

ENGINE_DIR = Path(broker.engine.__file__).parent
BANNED = {"websockets", "anyio", "orjson", "asyncio", "time", "socket", "threading", "sqlite3"}
API = {
    "InvalidArgument",
    "Job",
    "JobHandle",
    "JobState",
    "JobTable",
    "NewJob",
    "QueueOpts",
    "QueueStats",
    "QueueTotals",
    "RawJSON",
    "SweepResult",
}


def imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            roots.add(node.args[0].value.split(".")[0])
    return roots


def test_imported_roots_sees_every_import_form() -> None:
    src = (
        "import time\nimport os.path as p\nfrom asyncio import sleep\nfrom . import x\n"
        "def f():\n    import socket\n    importlib.import_module('anyio')\n"
    )
    assert imported_roots(ast.parse(src)) == {"time", "os", "asyncio", "socket", "anyio"}


def test_engine_imports_no_io_loop_clock_or_thread_library() -> None:
    # Contract: TIM-2.
    files = sorted(ENGINE_DIR.rglob("*.py"))
    assert len(files) >= 2
    offenders = {}
    for path in files:
        bad = imported_roots(ast.parse(path.read_text(encoding="utf-8"), str(path))) & BANNED
        if bad:
            offenders[str(path.relative_to(ENGINE_DIR))] = sorted(bad)
    assert offenders == {}


def test_all_matches_the_exports() -> None:
    exported = broker.engine.__all__
    assert len(exported) == len(set(exported))
    assert API <= set(exported)
    for name in exported:
        assert hasattr(broker.engine, name), name
    public = {
        name
        for name, value in vars(broker.engine).items()
        if not name.startswith("_") and not isinstance(value, type(broker.engine))
    }
    assert public - {"annotations"} == set(exported)
    star: dict[str, object] = {}
    exec("from conveyor.broker.engine import *", star)
    assert set(star) - {"__builtins__"} == set(exported)
