"""The commit gate's decisions (``broker/group_commit.py``), told events by hand: no
loop, no store. Frames are strings; flush keys name a connection.

The last test drives it with random events against a model of the table and the store,
and checks the rules that matter: no frame leaves before what it waits for, frames leave
in the order they were held (within each kind), none is lost or sent twice, and at most
one slow commit is in flight, and only once no fsync is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.group_commit import (
    COMMIT,
    SCHEDULE,
    SLOW_COMMIT,
    Action,
    AwaitFsync,
    Commit,
    Drain,
    GroupCommit,
    Release,
    Schedule,
    SendEarly,
    SlowCommit,
)

Core = GroupCommit[str, str]


def test_frames_with_no_changes_and_nothing_in_flight_leave_at_once() -> None:
    g: Core = GroupCommit()
    assert g.hold("r1") is True  # schedule a flush
    assert g.hold("r2") is False  # ... it is scheduled already
    assert g.hold_early("p1", "c1") is False
    assert g.flush(has_changes=False) == [Release(["p1", "r1", "r2"])]
    assert g.drain(has_changes=False) is Drain.DONE


def test_a_commit_durable_at_once_releases_its_frames_early_ones_first() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.hold_early("p1", "c1")
    assert g.flush(has_changes=True) == [COMMIT]
    assert g.committed(fsync=False) == [Release(["p1", "r1"])]
    assert g.commits == 1


def test_frames_with_no_changes_wait_for_the_fsync_in_flight() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    assert g.flush(True) == [COMMIT]
    assert g.written() == []  # no early frame in it
    assert g.committed(fsync=True) == [AwaitFsync(1)]
    assert g.hold("same-key reply") is True
    assert g.flush(has_changes=False) == []  # it may describe what fsync 1 makes durable
    assert g.drain(False) is Drain.WAIT
    assert g.synced(1) == [Release(["r1"]), SCHEDULE]
    assert g.flush(False) == [Release(["same-key reply"])]
    assert g.drain(False) is Drain.DONE


def test_commits_group_while_an_fsync_is_in_flight() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    assert g.hold("r2") is True
    assert g.flush(has_changes=True) == []  # waits for fsync 1
    for frame in ["r3", "r4"]:  # more loop turns while the disk syncs
        assert g.hold(frame) is True  # (the flush lets the turn's dispatch pass run)
        assert g.flush(has_changes=True) == []  # ... and waits again
    assert g.changed() is True
    assert g.synced(1) == [Release(["r1"])]  # a flush is scheduled already
    assert g.flush(True) == [COMMIT]  # one commit for all that gathered
    assert g.committed(fsync=True) == [AwaitFsync(2)]
    assert g.synced(2) == [Release(["r2", "r3", "r4"])]


def test_the_flush_after_an_fsync_is_asked_for_when_none_is_scheduled() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.flush(has_changes=True)  # waits for fsync 1
    assert g.synced(1) == [Release(["r1"]), SCHEDULE]
    assert g.flush(True) == [COMMIT]
    assert g.committed(fsync=True) == [AwaitFsync(2)]
    assert g.synced(2) == [Release(["r2"])]


def test_a_commit_with_early_frames_is_written_behind_the_fsync_in_flight() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    assert g.hold_early("p2", "c1") is False  # scheduled by r2 already
    assert g.flush(True) == [COMMIT]  # a worker waits: written at once
    assert g.written() == [SendEarly(["p2"], ["c1"])]
    assert g.committed(fsync=True) == [AwaitFsync(2)]
    assert g.synced(1) == [Release(["r1"])]
    assert g.synced(2) == [Release(["r2"])]


def test_an_early_frame_held_while_a_flush_waits_asks_for_a_flush() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.flush(True)  # waits for fsync 1
    assert g.hold_early("p3", "c1") is True
    assert g.flush(True) == [COMMIT]
    assert g.written() == [SendEarly(["p3"], ["c1"])]
    assert g.committed(fsync=True) == [AwaitFsync(2)]


def test_early_frames_go_before_the_fsync_with_one_flush_per_connection() -> None:
    g: Core = GroupCommit()
    for frame, conn in [("p1", "a"), ("p2", "b"), ("p3", "a")]:
        g.hold_early(frame, conn)
    g.hold("r1")
    assert g.flush(True) == [COMMIT]
    assert g.written() == [SendEarly(["p1", "p2", "p3"], ["a", "b"])]
    assert g.written() == []  # once
    assert g.committed(fsync=True) == [AwaitFsync(1)]  # not again after the write
    g.hold_early("p4", "a")
    g.flush(True)
    assert g.written() == [SendEarly(["p4"], ["a"])]  # a new commit flushes again


def test_early_frames_not_sent_at_the_write_go_with_the_commit() -> None:
    g: Core = GroupCommit()
    g.hold_early("p1", "a")
    g.flush(True)
    # No fsync follows (--sync normal, not claims only): the store never calls written.
    assert g.committed(fsync=False) == [Release(["p1"])]
    g.hold_early("p2", "a")
    g.hold("r2")
    g.flush(True)
    assert g.committed(fsync=True) == [Release(["p2"]), AwaitFsync(1)]


def test_an_early_frame_with_no_changes_overtakes_the_fsync_in_flight() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.hold_early("p2", "a")
    assert g.flush(False) == [Release(["p2"])]  # its claims are written already
    assert g.synced(1) == [Release(["r1", "r2"])]


def test_releases_follow_the_order_of_commits() -> None:
    g: Core = GroupCommit()
    for i in range(1, 4):
        g.hold(f"r{i}")
        g.hold_early(f"p{i}", "a")
        assert g.flush(True) == [COMMIT]
        assert g.written() == [SendEarly([f"p{i}"], ["a"])]
        assert g.committed(fsync=True) == [AwaitFsync(i)]
    assert g.synced(1) == [Release(["r1"])]
    assert g.synced(3) == [Release(["r2", "r3"])]  # a later fsync covers the earlier
    assert g.synced(2) == []


def test_a_commit_durable_at_once_still_waits_for_the_fsyncs_before_it() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold_early("p2", "a")
    g.hold("r2")
    g.flush(True)
    assert g.committed(fsync=False) == [Release(["p2"])]
    assert g.synced(1) == [Release(["r1", "r2"])]


def test_a_checkpointing_commit_waits_for_the_fsync_in_flight_and_blocks_commits() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.hold_early("p2", "a")
    assert g.flush(True) == [COMMIT]
    assert g.checkpoint_due() == []  # not while fsync 1 is out
    assert not g.may_flush
    assert g.hold("r3") is False and g.hold_early("p3", "a") is False
    assert g.changed() is False
    assert g.flush(True) == []
    assert g.drain(True) is Drain.WAIT
    assert g.synced(1) == [Release(["r1"]), SLOW_COMMIT]
    assert g.slow_committed(has_changes=True) == [Release(["p2", "r2"]), SCHEDULE]
    assert g.may_flush
    assert g.flush(True) == [COMMIT]
    assert g.written() == [SendEarly(["p3"], ["a"])]
    assert g.committed(fsync=False) == [Release(["r3"])]
    assert g.commits == 3


def test_a_checkpointing_commit_with_nothing_in_flight_starts_at_once() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    assert g.checkpoint_due() == [SLOW_COMMIT]
    assert g.written() == []
    assert g.slow_committed(has_changes=False) == [Release(["r1"])]


def test_a_failure_holds_every_frame_back_and_stops_everything_after() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.hold_early("p2", "a")
    g.flush(True)
    g.written()
    g.committed(fsync=True)
    assert g.fail() is True  # fsync 1 failed: stop the broker
    assert g.fail() is False  # fsync 2 too: once is enough
    assert g.synced(2) == []
    assert g.hold("r3") is False and g.hold_early("p3", "a") is False
    assert g.changed() is False
    assert g.flush(True) == []
    assert g.drain(True) is Drain.DONE


def test_a_failed_commit_releases_none_of_its_frames() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.hold_early("p1", "a")
    g.flush(True)
    assert g.fail() is True  # commit_now raised
    assert g.written() == [] and g.committed(fsync=False) == []


def test_drain_waits_for_what_is_in_flight_and_commits_what_is_left() -> None:
    g: Core = GroupCommit()
    g.hold("r1")
    g.flush(True)
    g.committed(fsync=True)
    g.hold("r2")
    g.flush(True)
    assert g.drain(True) is Drain.WAIT
    g.synced(1)
    assert g.drain(True) is Drain.FLUSH
    assert g.flush(True) == [COMMIT]
    g.committed(fsync=True)
    assert g.drain(False) is Drain.WAIT
    assert g.synced(2) == [Release(["r2"])]
    assert g.drain(False) is Drain.DONE
    assert g.drain(True) is Drain.FLUSH  # a last change (a lapsed lease, say)


# -- random event sequences against a model ----------------------------------------------


@dataclass
class Model:
    """The table, the store and the driver around a core, with every frame's wait.

    A frame ``("r", i, c)`` is the ``i``-th held frame; ``("e", i, c)`` the ``i``-th
    early one; ``c`` is the last change made before it was held."""

    core: GroupCommit[tuple[str, int, int], int] = field(default_factory=GroupCommit)
    changes = 0  # changes made so far, numbered 1..
    taken = 0  # changes taken for a commit so far
    written = 0  # changes 1..written are written (a killed broker keeps them)
    durable = 0  # changes 1..durable are durable (a power loss keeps them)
    fsyncs: list[tuple[int, int]] = field(default_factory=list)  # (n, last change)
    writing = 0  # the last change of the commit being made
    slow: int | None = None  # the last change of the slow commit, once in flight
    scheduled = 0  # flushes asked for and not yet run
    held = 0
    early = 0
    released: list[tuple[str, int, int]] = field(default_factory=list)
    stopped = False

    def has_changes(self) -> bool:
        return self.changes > self.taken

    def do(self, actions: list[Action[tuple[str, int, int], int]], data: st.DataObject) -> None:
        for action in actions:
            if isinstance(action, Release):
                self.release(action.frames)
            elif isinstance(action, SendEarly):
                assert len(set(action.flushes)) == len(action.flushes)
                self.release(action.frames)
            elif isinstance(action, Schedule):
                self.scheduled += 1
            elif isinstance(action, Commit):
                assert self.slow is None, "no commit while a slow one is in flight"
                self.commit(data)
            elif isinstance(action, AwaitFsync):
                self.fsyncs.append((action.n, self.writing))
            elif isinstance(action, SlowCommit):
                assert self.slow is None, "at most one slow commit in flight"
                assert not self.fsyncs, "a slow commit goes after the fsyncs in flight"
                self.slow = self.writing

    def release(self, frames: list[tuple[str, int, int]]) -> None:
        assert not self.stopped, "nothing is released after a failure"
        for frame in frames:
            kind, _, before = frame
            if kind == "r":
                assert before <= self.durable, f"{frame} before its changes are durable"
            else:
                assert before <= self.written, f"{frame} before its changes are written"
            assert frame not in self.released, f"{frame} released twice"
            self.released.append(frame)

    def commit(self, data: st.DataObject) -> None:
        self.writing = self.changes
        self.taken = self.changes
        answer = data.draw(st.sampled_from(["durable", "fsync", "checkpoint", "error"]))
        if answer == "error":
            self.fail()
        elif answer == "checkpoint":
            self.do(self.core.checkpoint_due(), data)
        else:
            self.written = self.writing
            if answer == "fsync" or data.draw(st.booleans()):  # claims only: the claim log
                self.do(self.core.written(), data)
            if answer == "durable":
                if self.fsyncs:  # durable once the commits before it are
                    self.fsyncs[-1] = (self.fsyncs[-1][0], self.writing)
                else:
                    self.durable = self.writing
            self.do(self.core.committed(fsync=answer == "fsync"), data)

    def fail(self) -> None:
        if self.core.fail():
            self.stopped = True

    def step(self, event: str, data: st.DataObject) -> None:
        core = self.core
        if event == "change":
            self.changes += 1
            self.scheduled += core.changed()
        elif event == "hold":
            self.held += 1
            self.scheduled += core.hold(("r", self.held, self.changes))
        elif event == "hold_early":
            self.early += 1
            conn = data.draw(st.integers(0, 2))
            self.scheduled += core.hold_early(("e", self.early, self.changes), conn)
        elif event == "turn" and self.scheduled:
            self.scheduled -= 1
            self.do(core.flush(self.has_changes()), data)
        elif event == "fsync" and self.fsyncs:
            n, last = self.fsyncs.pop(0)  # they end in order
            self.durable = max(self.durable, last)
            self.do(core.synced(n), data)
        elif event == "checkpoint" and self.slow is not None:
            last, self.slow = self.slow, None
            self.written = last
            if data.draw(st.booleans()):
                self.do(core.written(), data)
            self.durable = last
            self.do(core.slow_committed(self.has_changes()), data)
        elif event == "fail":
            self.fail()

    def drain(self, data: st.DataObject) -> None:
        for _ in range(1000):
            step = self.core.drain(self.has_changes())
            if step is Drain.DONE:
                return
            if step is Drain.FLUSH:
                self.do(self.core.flush(self.has_changes()), data)
            elif self.slow is not None:
                self.step("checkpoint", data)
            else:
                assert self.fsyncs, "drain waits for nothing"
                self.step("fsync", data)
        raise AssertionError("drain did not end")


EVENTS = ["change", "hold", "hold_early", "turn", "turn", "fsync", "checkpoint", "fail"]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_events_keep_the_rules(data: st.DataObject) -> None:
    m = Model()
    n = data.draw(st.integers(0, 60))
    failing = data.draw(st.booleans())
    events = EVENTS if failing else EVENTS[:-1]
    for _ in range(n):
        m.step(data.draw(st.sampled_from(events)), data)
        assert m.scheduled <= 1, "one flush per turn"
    m.drain(data)
    for kind in "re":
        numbers = [i for k, i, _ in m.released if k == kind]
        assert numbers == sorted(numbers), f"{kind} frames out of hold order"
    if not m.stopped:
        assert len(m.released) == m.held + m.early, "every frame is released"
        assert not m.has_changes() and m.durable == m.changes
