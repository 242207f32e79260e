"""How the SQLite store writes a commit's deletes: as ranges of consecutive seqs.

A wrong range would delete a job that was not acked, so the split is checked on its own
(hypothesis), and then through the store: jobs acked out of order, around ones still
pending and under a lease, come back exactly as the live table holds them.
"""

from __future__ import annotations

import random
from itertools import pairwise
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import given

from conveyor.broker.store import SqliteStore
from conveyor.broker.store.sqlite import _runs


@given(
    st.sets(st.integers(1, 200), min_size=1).map(
        lambda s: random.Random(len(s)).sample(sorted(s), len(s))
    )
)
def test_runs_cover_exactly_the_seqs_and_are_maximal(seqs: list[int]) -> None:
    runs = _runs(seqs)
    covered = [seq for first, last in runs for seq in range(first, last + 1)]
    assert covered == sorted(seqs)  # every seq once, nothing between them
    for (_, last), (first, _) in pairwise(runs):
        assert first > last + 1  # maximal: a gap separates two runs


def test_out_of_order_acks_delete_exactly_the_acked_rows(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    clock = lambda: 1000.0  # noqa: E731
    store = SqliteStore(path, sync="normal")
    table = store.load(clock=clock, rng=random.Random(1), max_payload_bytes=1 << 20)
    queue = table.queue("q")
    ids = [queue.enqueue({"i": i}) for i in range(40)]
    store.write(table.take_changes())
    handles = queue.claim_batch("w", 30)
    store.write(table.take_changes())
    acked = [h for i, h in enumerate(handles) if i % 5 != 2]  # one-job gaps between runs
    random.Random(2).shuffle(acked)
    assert table.ack_many([(h.id, h.lease) for h in acked]) == [True] * len(acked)
    store.write(table.take_changes())
    store.close()

    reopened = SqliteStore(path, sync="normal")
    try:
        restored = reopened.load(clock=clock, rng=random.Random(1), max_payload_bytes=1 << 20)
    finally:
        reopened.close()
    gone = {h.id for h in acked}
    for job_id in ids:
        assert restored.get_job(job_id) == table.get_job(job_id)
        assert (restored.get_job(job_id) is None) == (job_id in gone), job_id
