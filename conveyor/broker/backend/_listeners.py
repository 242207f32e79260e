"""The listeners of one backend: news told to each, one listener's bug kept from the rest."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ._base import Listener

__all__ = ["Listeners"]

log = logging.getLogger("conveyor.backend")


class Listeners:
    """Every ``Listener`` a backend has, told as one: itself a ``Listener``. News with
    nothing in it (no queue, no job) is not told."""

    def __init__(self) -> None:
        self._all: list[Listener] = []

    def add(self, listener: Listener) -> None:
        self._all.append(listener)

    def work_waiting(self, queues: frozenset[str] | None) -> None:
        if queues is None or queues:
            self._tell(lambda listener: listener.work_waiting(queues))

    def cancelled(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._tell(lambda listener: listener.cancelled(job_ids))

    def _tell(self, news: Callable[[Listener], None]) -> None:
        for listener in self._all:
            try:
                news(listener)
            except Exception:  # one listener's bug must not keep news from the others
                log.exception("a listener failed")
