"""Fixtures for the engine's contract tests: a manual clock and a seeded table."""

from __future__ import annotations

import random

import pytest

from broker.engine import JobTable

START = 1000.0


class ManualClock:
    """A clock the test drives by hand. It stands still until told to move, never backwards."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> float:
        assert dt >= 0, "the clock never goes backwards"
        self.now += dt
        return self.now

    def set(self, t: float) -> float:
        assert t >= self.now, "the clock never goes backwards"
        self.now = t
        return self.now


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)


@pytest.fixture
def table(clock: ManualClock, rng: random.Random) -> JobTable:
    return JobTable(clock=clock, rng=rng, id_prefix="t")
