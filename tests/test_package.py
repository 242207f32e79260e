"""What ``pip install conveyor`` puts on a user's machine: one top-level package.

The wheel is built from a copy of the tree and installed into a clean virtual environment
(no source tree on its path) beside an application that has packages of its own named
``web``, ``sdk`` and ``broker``: the application keeps them, ``conveyor`` imports, and the
broker finds and serves the dashboard's files from the installed package.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "conveyor" / "web"
SERVED = (".html", ".js", ".css", ".svg", ".png", ".ico")


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=180, cwd=cwd, check=False
    )
    assert done.returncode == 0, f"{cmd}:\n{done.stdout}\n{done.stderr}"
    return done


def _wheel(tmp_path: Path) -> Path:
    # Built from a copy, so that the build leaves nothing in the work tree.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "conveyor", src / "conveyor", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path / "dist"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "-q")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", out, src)
    [wheel] = out.glob("conveyor-*.whl")
    return wheel


def test_the_wheel_holds_one_top_level_package_with_the_dashboard(tmp_path: Path) -> None:
    names = zipfile.ZipFile(_wheel(tmp_path)).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"conveyor"}
    served = [p.name for p in WEB.iterdir() if p.suffix in SERVED]
    assert {"index.html", "app.js", "style.css"} <= set(served)
    for name in ["py.typed", "web/__init__.py", *(f"web/{n}" for n in served)]:
        assert f"conveyor/{name}" in names, f"conveyor/{name} is not in the wheel"


def test_the_installed_wheel_imports_beside_an_application_named_web(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    env = tmp_path / "env"
    _run(sys.executable, "-m", "venv", "--without-pip", env)
    python = env / "bin" / "python"
    _run(sys.executable, "-m", "pip", "-q", "--python", python, "install", "--no-deps", wheel)
    # The dependencies come from this environment's site-packages as a plain path entry
    # (its .pth files, the editable install of the work tree among them, are not read).
    site = Path(
        _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    app = tmp_path / "app"
    for package in ("web", "sdk", "broker"):
        (app / package).mkdir(parents=True)
        (app / package / "__init__.py").write_text(f"MINE = {package!r}\n")
    served = sorted(p.name for p in WEB.iterdir() if p.suffix in SERVED)
    probe = (
        "import hashlib, json\n"
        "import web, sdk, broker\n"
        "import conveyor\n"
        "from conveyor import Client, SyncClient, Worker, Job, Retry, Fail\n"
        "from conveyor.broker.static import StaticFiles\n"
        "assert (web.MINE, sdk.MINE, broker.MINE) == ('web', 'sdk', 'broker')\n"
        f"assert not conveyor.__file__.startswith({str(ROOT)!r}), conveyor.__file__\n"
        "files = StaticFiles()\n"
        "print(json.dumps({p: hashlib.sha256(files.get(p)[0]).hexdigest()\n"
        f"                  for p in ['/', *('/' + n for n in {served!r})]}}))\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, timeout=60, cwd=app, env=environ
    )
    assert run.returncode == 0, run.stderr
    digests = json.loads(run.stdout)

    def digest(name: str) -> str:
        return hashlib.sha256((WEB / name).read_bytes()).hexdigest()

    assert digests == {"/": digest("index.html"), **{"/" + n: digest(n) for n in served}}

    version = subprocess.run(
        [env / "bin" / "conveyor", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=app,
        env=environ,
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "conveyor 0.1.0"
