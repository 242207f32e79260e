"""The dashboard's files (the ``web`` package), served by the broker at ``/``.

Only files present in ``web/`` when the broker starts are served, looked up by exact
name in a table made then, so no request path can reach anything else: ``/../x``,
``/%2e%2e/x`` and friends are simply not in the table (404). The files are read from
the installed package (importlib.resources), so a normal, non-editable install works.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["StaticFiles"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


class StaticFiles:
    """Path -> (bytes, content type) for every file of the ``conveyor.web`` package."""

    def __init__(self, package: str = "conveyor.web") -> None:
        self._files: dict[str, tuple[bytes, str]] = {}
        try:
            root = resources.files(package)
        except ModuleNotFoundError:
            return  # no dashboard installed: every path is a 404
        for entry in root.iterdir():
            suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
            if entry.is_file() and suffix in _TYPES:
                self._files["/" + entry.name] = (entry.read_bytes(), _TYPES[suffix])
        if "/index.html" in self._files:
            self._files["/"] = self._files["/index.html"]

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The file at ``path`` (``/`` is ``/index.html``), or ``None``."""
        return self._files.get(path)
