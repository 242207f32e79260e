"""``docs/contract.md``, "Enqueue and options" (ENQ-1 to ENQ-11) and the limits on keys
(LIM-1): options, guards, keys, batches."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.broker.engine import InvalidArgument, JobState, JobTable, NewJob, QueueOpts, RawJSON

if TYPE_CHECKING:
    from conftest import ManualClock

START = 1000.0  # where the conftest's ManualClock starts


NAN = float("nan")
INF = float("inf")


def counts(q: Any) -> tuple[Any, ...]:
    s = q.stats()
    t = s.totals
    return (
        s.ready,
        s.scheduled,
        s.processing,
        s.dead,
        s.pending,
        t.enqueued,
        t.completed,
        t.retried,
        t.dead,
        t.expired,
        t.cancelled,
    )


# --- option resolution -------------------------------------------------------------------


def test_plain_defaults_are_resolved_and_shown(table: JobTable) -> None:
    # Contract: ENQ-1, ENQ-2.
    q = table.queue("plain")
    job = q.get_job(q.enqueue({"a": 1}))
    assert job is not None
    assert job.visibility_timeout_s == 300
    assert job.max_attempts == 3
    assert job.backoff_base_s == 5
    assert job.backoff_max_s == 3600
    assert job.expires_at is None
    assert job.priority == 0
    assert job.attempts == 0
    assert job.state == JobState.PENDING
    assert job.state == "pending"
    assert job.enqueued_at == START
    assert job.ready_at == START
    assert job.worker_id is None
    assert job.deadline is None
    assert job.last_error is None
    assert job.died_at is None
    assert job.key is None
    assert job.queue == "plain"
    assert job.payload == {"a": 1}


def test_queue_options_override_plain_defaults(table: JobTable) -> None:
    # Contract: ENQ-2.
    opts = QueueOpts(
        visibility_timeout_s=10,
        max_attempts=7,
        backoff_base_s=1,
        backoff_max_s=50,
        expires_s=60,
    )
    q = table.queue("custom", opts)
    job = q.get_job(q.enqueue(None))
    assert job is not None
    assert (job.visibility_timeout_s, job.max_attempts) == (10, 7)
    assert (job.backoff_base_s, job.backoff_max_s) == (1, 50)
    assert job.expires_at == START + 60


def test_call_options_override_queue_options(table: JobTable) -> None:
    # Contract: ENQ-2.
    opts = QueueOpts(visibility_timeout_s=10, max_attempts=7, backoff_base_s=1, expires_s=60)
    q = table.queue("custom", opts)
    job_id = q.enqueue(
        None,
        priority=9,
        visibility_timeout_s=20,
        max_attempts=2,
        backoff_base_s=3,
        expires_s=30,
    )
    job = q.get_job(job_id)
    assert job is not None
    assert job.priority == 9
    assert (job.visibility_timeout_s, job.max_attempts, job.backoff_base_s) == (20, 2, 3)
    assert job.backoff_max_s == 3600
    assert job.expires_at == START + 30


def test_each_job_keeps_its_own_options_among_neighbours_that_differ(table: JobTable) -> None:
    # Contract: ENQ-2. Jobs enqueued one after another with and without overrides each
    # show and claim with their own.
    q = table.queue("mixed", QueueOpts(visibility_timeout_s=10, max_attempts=4))
    plain = q.enqueue(1)
    custom = q.enqueue(2, visibility_timeout_s=20, max_attempts=2, timeout_s=5)
    plain_again = q.enqueue(3)
    other = q.enqueue(4, visibility_timeout_s=20, max_attempts=2, timeout_s=6)
    same_again = q.enqueue(5, visibility_timeout_s=20, max_attempts=2, timeout_s=6)

    def shown(job_id: str) -> tuple[Any, ...]:
        job = q.get_job(job_id)
        assert job is not None
        return (job.visibility_timeout_s, job.max_attempts, job.timeout_s)

    assert shown(plain) == shown(plain_again) == (10, 4, None)
    assert shown(custom) == (20, 2, 5)
    assert shown(other) == shown(same_again) == (20, 2, 6)
    handles = {h.id: h for h in q.claim_batch("w", 5)}
    assert handles[plain].visibility_timeout_s == 10
    assert handles[custom].max_attempts == 2 and handles[custom].timeout_s == 5
    assert handles[plain_again].deadline == START + 10
    assert handles[custom].deadline == START + 20
    assert handles[other].timeout_s == 6 and handles[same_again].timeout_s == 6


def test_queue_opts_defaults_are_the_plain_defaults() -> None:
    # Contract: ENQ-1.
    o = QueueOpts()
    assert o.visibility_timeout_s == 300
    assert o.max_attempts == 3
    assert o.backoff_base_s == 5
    assert o.backoff_max_s == 3600
    assert o.expires_s is None
    assert o.dead_letter_retention_s is None


def test_same_name_gives_same_queue_and_reopts_apply_to_later_enqueues(table: JobTable) -> None:
    # Contract: ENQ-3.
    q = table.queue("q", QueueOpts(max_attempts=4))
    before = q.enqueue(1)
    assert table.queue("q") is q
    assert q.opts.max_attempts == 4  # no opts: options left as they were
    after_plain = q.enqueue(2)
    assert table.queue("q", QueueOpts(max_attempts=9)) is q
    after_reopt = q.enqueue(3)
    assert q.get_job(before).max_attempts == 4  # type: ignore[union-attr]
    assert q.get_job(after_plain).max_attempts == 4  # type: ignore[union-attr]
    assert q.get_job(after_reopt).max_attempts == 9  # type: ignore[union-attr]
    assert table.queues() == ["q"]


def test_queues_lists_every_queue_name(table: JobTable) -> None:
    table.queue("b")
    table.queue("a")
    assert sorted(table.queues()) == ["a", "b"]


def test_find_queue_knows_the_queues_made_and_no_other(table: JobTable) -> None:
    assert table.find_queue("a") is None
    table.queue("a")
    table.queue("b").enqueue(RawJSON(b"1"))
    assert table.find_queue("a") is table.queue("a") and table.find_queue("b") is not None
    assert table.find_queue("c") is None and table.find_queue("A") is None
    assert table.queues() == ["a", "b"]  # (asking made no queue)


# --- ready_at ----------------------------------------------------------------------------


def test_ready_at_is_now_without_delay_or_run_at(table: JobTable, clock: ManualClock) -> None:
    # Contract: ENQ-5.
    clock.set(1500.25)
    q = table.queue("q")
    assert q.get_job(q.enqueue(1)).ready_at == 1500.25  # type: ignore[union-attr]


def test_delay_s_sets_ready_at_relative_to_now(table: JobTable) -> None:
    # Contract: ENQ-5.
    q = table.queue("q")
    assert q.get_job(q.enqueue(1, delay_s=7.5)).ready_at == START + 7.5  # type: ignore[union-attr]
    assert q.get_job(q.enqueue(1, delay_s=0)).ready_at == START  # type: ignore[union-attr]


def test_delay_wins_over_run_at(table: JobTable) -> None:
    # Contract: ENQ-5.
    q = table.queue("q")
    job = q.get_job(q.enqueue(1, delay_s=2, run_at=START + 100))
    assert job is not None
    assert job.ready_at == START + 2


def test_run_at_in_the_future_is_used_verbatim(table: JobTable) -> None:
    # Contract: ENQ-5.
    q = table.queue("q")
    assert q.get_job(q.enqueue(1, run_at=START + 42.5)).ready_at == START + 42.5  # type: ignore[union-attr]


def test_run_at_in_the_past_is_clamped_to_now(table: JobTable) -> None:
    # Contract: ENQ-5.
    q = table.queue("q")
    assert q.get_job(q.enqueue(1, run_at=START - 500)).ready_at == START  # type: ignore[union-attr]
    assert q.get_job(q.enqueue(1, run_at=-1e9)).ready_at == START  # type: ignore[union-attr]


# --- expires_at --------------------------------------------------------------------------


def test_expires_s_is_relative_to_now(table: JobTable, clock: ManualClock) -> None:
    # Contract: ENQ-6.
    clock.set(2000.0)
    q = table.queue("q")
    assert q.get_job(q.enqueue(1, expires_s=0.5)).expires_at == 2000.5  # type: ignore[union-attr]


def test_expiry_falls_back_to_queue_default_relative_to_enqueue(
    table: JobTable, clock: ManualClock
) -> None:
    # Contract: ENQ-6.
    q = table.queue("q", QueueOpts(expires_s=30))
    first = q.enqueue(1)
    clock.advance(10)
    second = q.enqueue(2)
    assert q.get_job(first).expires_at == START + 30  # type: ignore[union-attr]
    assert q.get_job(second).expires_at == START + 40  # type: ignore[union-attr]


def test_expiry_is_independent_of_delay(table: JobTable) -> None:
    # Contract: ENQ-6.
    q = table.queue("q")
    job = q.get_job(q.enqueue(1, delay_s=100, expires_s=10))
    assert job is not None
    assert (job.ready_at, job.expires_at) == (START + 100, START + 10)


# --- guards ------------------------------------------------------------------------------

BAD_ENQUEUE_ARGS = [
    ("priority", 2**31),
    ("priority", -(2**31) - 1),
    ("priority", True),
    ("priority", False),
    ("priority", 1.0),
    ("priority", "1"),
    ("delay_s", NAN),
    ("delay_s", INF),
    ("delay_s", -INF),
    ("delay_s", -0.001),
    ("delay_s", True),
    ("delay_s", "5"),
    ("run_at", NAN),
    ("run_at", INF),
    ("run_at", -INF),
    ("run_at", True),
    ("run_at", "soon"),
    ("expires_s", NAN),
    ("expires_s", INF),
    ("expires_s", -INF),
    ("expires_s", 0),
    ("expires_s", -1),
    ("expires_s", True),
    ("expires_s", "10"),
    ("visibility_timeout_s", NAN),
    ("visibility_timeout_s", INF),
    ("visibility_timeout_s", -INF),
    ("visibility_timeout_s", 0),
    ("visibility_timeout_s", -5),
    ("visibility_timeout_s", True),
    ("visibility_timeout_s", "30"),
    ("max_attempts", 0),
    ("max_attempts", -1),
    ("max_attempts", 1.0),
    ("max_attempts", 2.5),
    ("max_attempts", True),
    ("max_attempts", "3"),
    ("backoff_base_s", NAN),
    ("backoff_base_s", INF),
    ("backoff_base_s", -INF),
    ("backoff_base_s", -0.5),
    ("backoff_base_s", True),
    ("backoff_base_s", "5"),
    ("max_attempts", 2**31),
    ("max_attempts", 2**63),  # would overflow a store's integer column
    ("key", 5),
    ("key", b"k"),
    ("key", "k" * 1025),
    ("key", "\ud800"),  # a lone surrogate: no store or encoder can write it
    ("key", "ok\udfff"),
]


@pytest.mark.parametrize(("field", "value"), BAD_ENQUEUE_ARGS)
def test_enqueue_guard_rejects_and_names_the_field(table: JobTable, field: str, value: Any) -> None:
    # Contract: ENQ-7, ENQ-8, ENQ-9, LIM-1, LIM-4, LIM-5.
    q = table.queue("q")
    with pytest.raises(InvalidArgument) as info:
        q.enqueue({"x": 1}, **{field: value})
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert isinstance(info.value, ValueError)
    assert q.stats().totals.enqueued == 0
    assert q.stats().pending == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 2**31 - 1),
        ("priority", -(2**31)),
        ("delay_s", 0),
        ("delay_s", 0.0),
        ("run_at", -5.0),
        ("expires_s", 1e-9),
        ("visibility_timeout_s", 1),
        ("max_attempts", 1),
        ("max_attempts", 2**31 - 1),
        ("backoff_base_s", 0),
    ],
)
def test_enqueue_accepts_values_at_the_edges(table: JobTable, field: str, value: Any) -> None:
    # Contract: ENQ-9.
    q = table.queue("q")
    job = q.get_job(q.enqueue(1, **{field: value}))
    assert job is not None
    if field in ("priority", "visibility_timeout_s", "max_attempts", "backoff_base_s"):
        assert getattr(job, field) == value


def test_backoff_base_above_queue_max_is_rejected_on_resolved_values(table: JobTable) -> None:
    # Contract: ENQ-9.
    q = table.queue("q", QueueOpts(backoff_base_s=1, backoff_max_s=10))
    with pytest.raises(InvalidArgument) as info:
        q.enqueue(1, backoff_base_s=10.5)
    assert "backoff" in info.value.field
    assert q.stats().totals.enqueued == 0
    job = q.get_job(q.enqueue(1, backoff_base_s=10))  # base == max is fine
    assert job is not None
    assert (job.backoff_base_s, job.backoff_max_s) == (10, 10)


def test_backoff_base_above_plain_default_max_is_rejected(table: JobTable) -> None:
    # Contract: ENQ-9.
    q = table.queue("q")
    with pytest.raises(InvalidArgument):
        q.enqueue(1, backoff_base_s=3600.5)
    assert q.get_job(q.enqueue(1, backoff_base_s=3600)).backoff_base_s == 3600  # type: ignore[union-attr]


@pytest.mark.parametrize("n", [1, 128])
def test_queue_name_length_edges_accepted(table: JobTable, n: int) -> None:
    # Contract: JOB-3.
    name = "a" * n
    assert table.queue(name).name == name


def test_queue_name_allows_every_listed_character(table: JobTable) -> None:
    # Contract: JOB-3.
    name = "AZaz09._-:"
    assert table.queue(name).name == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a" * 129,
        "a b",
        " a",
        "a\n",
        "a/b",
        "a*b",
        "é",
        "naïve",
        "١٢",
        "\uff51",
        "ß",
        "a\x00",
        5,
        None,
    ],
)
def test_bad_queue_name_is_rejected(table: JobTable, name: Any) -> None:
    # Contract: JOB-3, ENQ-3.
    with pytest.raises(InvalidArgument):
        table.queue(name)
    assert table.queues() == []


BAD_QUEUE_OPTS = [
    ("visibility_timeout_s", 0),
    ("visibility_timeout_s", -1),
    ("visibility_timeout_s", NAN),
    ("visibility_timeout_s", INF),
    ("visibility_timeout_s", True),
    ("max_attempts", 0),
    ("max_attempts", 1.5),
    ("max_attempts", True),
    ("backoff_base_s", -1),
    ("backoff_base_s", NAN),
    ("backoff_base_s", INF),
    ("backoff_base_s", True),
    ("backoff_max_s", -1),
    ("backoff_max_s", NAN),
    ("backoff_max_s", INF),
    ("backoff_max_s", False),
    ("backoff_max_s", 4.99),  # below the default base of 5
    ("expires_s", 0),
    ("expires_s", -1),
    ("expires_s", NAN),
    ("expires_s", INF),
    ("expires_s", True),
    ("dead_letter_retention_s", -1),
    ("dead_letter_retention_s", NAN),
    ("dead_letter_retention_s", INF),
    ("dead_letter_retention_s", True),
]


@pytest.mark.parametrize(("field", "value"), BAD_QUEUE_OPTS)
def test_bad_queue_opts_are_rejected(table: JobTable, field: str, value: Any) -> None:
    # Contract: ENQ-3, ENQ-4, ENQ-8.
    with pytest.raises(InvalidArgument) as info:
        table.queue("q", QueueOpts(**{field: value}))
    assert field.split("_")[0] in info.value.field
    assert table.queues() == []


def test_bad_reopts_leave_the_queue_options_alone(table: JobTable) -> None:
    # Contract: ENQ-3, ENQ-7.
    q = table.queue("q", QueueOpts(max_attempts=4))
    with pytest.raises(InvalidArgument):
        table.queue("q", QueueOpts(max_attempts=0))
    assert q.opts.max_attempts == 4
    assert q.get_job(q.enqueue(1)).max_attempts == 4  # type: ignore[union-attr]


def test_queue_opts_edges_accepted(table: JobTable) -> None:
    # Contract: ENQ-4, ENQ-9.
    q = table.queue(
        "q",
        QueueOpts(
            visibility_timeout_s=0.001,
            max_attempts=1,
            backoff_base_s=0,
            backoff_max_s=0,
            expires_s=0.001,
            dead_letter_retention_s=0,
        ),
    )
    assert q.opts.dead_letter_retention_s == 0


# --- payload -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        NAN,
        INF,
        -INF,
        {"a": [1, NAN]},
        {"a": {"b": INF}},
        {1: "x"},
        {"a": {None: 1}},
        {(1, 2): 3},
        {1, 2},
        [set()],
        object(),
        b"bytes",
        {"a": object()},
        1 + 2j,
    ],
)
def test_payload_must_be_strict_json(table: JobTable, payload: Any) -> None:
    # Contract: ENQ-9.
    q = table.queue("q")
    with pytest.raises(InvalidArgument) as info:
        q.enqueue(payload)
    assert info.value.field == "payload"
    assert q.stats().totals.enqueued == 0


@pytest.mark.parametrize(
    "payload",
    [None, True, 0, -5, 2.5, "s", [], {}, {"a": [1, 2.5, None, True, "x", {"b": []}]}, 2**40],
)
def test_payload_round_trips(table: JobTable, payload: Any) -> None:
    # Contract: JOB-3.
    q = table.queue("q")
    job = q.get_job(q.enqueue(payload))
    assert job is not None
    assert job.payload == payload
    assert type(job.payload) is type(payload)


def test_huge_integer_payload_is_stored_or_rejected_as_payload(table: JobTable) -> None:
    # Contract: ENQ-7.
    # 5001 digits: valid JSON, far below the size limit, beyond Python's default int-str limit
    q = table.queue("q")
    try:
        job_id = q.enqueue({"n": 10**5000})
    except InvalidArgument as exc:
        assert exc.field == "payload"
        assert q.stats().totals.enqueued == 0
    else:
        assert q.get_job(job_id) is not None


def test_raw_json_payload_is_stored_as_given(table: JobTable) -> None:
    # Contract: ENQ-9.
    q = table.queue("q")
    job = q.get_job(q.enqueue(RawJSON(b'{"a":[1,2]}')))
    assert job is not None
    assert job.payload == {"a": [1, 2]}
    assert job.payload_json == b'{"a":[1,2]}'


def test_payload_size_limit(clock: ManualClock) -> None:
    # Contract: ENQ-9.
    table = JobTable(clock=clock, rng=random.Random(1), id_prefix="t", max_payload_bytes=16)
    q = table.queue("q")
    q.enqueue("a" * 14)  # '"' + 14 + '"' = 16 bytes: at the limit
    with pytest.raises(InvalidArgument) as info:
        q.enqueue("a" * 15)  # 17 bytes
    assert info.value.field == "payload"
    q.enqueue(RawJSON(b'"' + b"b" * 14 + b'"'))
    with pytest.raises(InvalidArgument) as info:
        q.enqueue(RawJSON(b'"' + b"b" * 15 + b'"'))
    assert info.value.field == "payload"
    assert q.stats().totals.enqueued == 2


def test_default_payload_limit_is_one_mib(table: JobTable) -> None:
    # Contract: ENQ-9.
    q = table.queue("q")
    q.enqueue("a" * ((1 << 20) - 2))
    with pytest.raises(InvalidArgument):
        q.enqueue("a" * ((1 << 20) - 1))


# --- a rejected call changes nothing -----------------------------------------------------


def test_rejected_enqueue_changes_nothing(clock: ManualClock) -> None:
    # Contract: ENQ-7.
    rng_a, rng_b = random.Random(7), random.Random(7)
    a = JobTable(clock=clock, rng=rng_a, id_prefix="t")
    b = JobTable(clock=clock, rng=rng_b, id_prefix="t")
    qa, qb = a.queue("q"), b.queue("q")
    assert qa.enqueue(1) == qb.enqueue(1)
    before = counts(qa)
    for bad in (
        {"priority": 2**31},
        {"delay_s": NAN},
        {"max_attempts": True},
        {"key": "k", "expires_s": -1},
    ):
        with pytest.raises(InvalidArgument):
            qa.enqueue(2, **bad)
    with pytest.raises(InvalidArgument):
        qa.enqueue({"bad": NAN}, key="k")
    with pytest.raises(InvalidArgument):
        qa.enqueue_batch([NewJob(1), NewJob(2, priority=True)])
    assert counts(qa) == before
    assert rng_a.getstate() == rng_b.getstate()
    # the ids and seqs handed out afterwards are those of a table that saw no rejected call
    ida, idb = qa.enqueue(3, key="k"), qb.enqueue(3, key="k")
    assert ida == idb
    assert qa.get_job(ida).seq == qb.get_job(idb).seq  # type: ignore[union-attr]
    assert counts(qa) == counts(qb)


# --- idempotency key ---------------------------------------------------------------------


def test_key_returns_existing_pending_job_and_changes_nothing(table: JobTable) -> None:
    # Contract: ENQ-10.
    q = table.queue("q")
    first = q.enqueue({"v": 1}, key="k", priority=1)
    before = counts(q)
    again = q.enqueue({"v": 2}, key="k", priority=5, delay_s=100)
    assert again == first
    assert counts(q) == before
    job = q.get_job(first)
    assert job is not None
    assert (job.payload, job.priority, job.ready_at, job.key) == ({"v": 1}, 1, START, "k")


def test_key_returns_existing_processing_job(table: JobTable) -> None:
    # Contract: ENQ-10.
    q = table.queue("q")
    first = q.enqueue(1, key="k")
    h = q.claim_one("w")
    assert h is not None
    assert q.enqueue(2, key="k") == first
    assert q.stats().processing == 1
    assert q.stats().pending == 0
    assert h.ack() is True


def test_key_returns_existing_dead_job(table: JobTable) -> None:
    # Contract: ENQ-10.
    q = table.queue("q")
    first = q.enqueue(1, key="k")
    h = q.claim_one("w")
    assert h is not None
    assert h.fail("x") is True
    assert q.enqueue(2, key="k") == first
    assert q.stats().dead == 1
    assert q.stats().pending == 0


@pytest.mark.parametrize("how", ["ack", "cancel", "purge"])
def test_key_is_reusable_once_the_job_is_gone(table: JobTable, how: str) -> None:
    # Contract: ENQ-10.
    q = table.queue("q")
    first = q.enqueue(1, key="k")
    if how == "cancel":
        assert q.cancel(first) is True
    else:
        h = q.claim_one("w")
        assert h is not None
        if how == "ack":
            assert h.ack() is True
        else:
            assert h.fail() is True
            assert q.purge_dead() == 1
    second = q.enqueue(2, key="k")
    assert second != first
    job = q.get_job(second)
    assert job is not None
    assert (job.payload, job.key) == (2, "k")


def test_key_is_reusable_after_retention_deletes_dead_row(table: JobTable) -> None:
    # Contract: ENQ-10, DLQ-4.
    q = table.queue("q", QueueOpts(dead_letter_retention_s=0))
    first = q.enqueue(1, key="k")
    h = q.claim_one("w")
    assert h is not None
    h.fail()
    assert q.sweep_expired().purged == 1
    assert q.enqueue(1, key="k") != first


def test_key_is_per_queue(table: JobTable) -> None:
    # Contract: ENQ-10.
    a, b = table.queue("a"), table.queue("b")
    ida, idb = a.enqueue(1, key="k"), b.enqueue(1, key="k")
    assert ida != idb
    assert b.get_job(idb).queue == "b"  # type: ignore[union-attr]


def test_guards_are_checked_before_the_key(table: JobTable) -> None:
    # Contract: ENQ-7.
    q = table.queue("q")
    q.enqueue(1, key="k")
    with pytest.raises(InvalidArgument):
        q.enqueue(1, key="k", priority=2**31)
    with pytest.raises(InvalidArgument):
        q.enqueue({"x": NAN}, key="k")
    with pytest.raises(InvalidArgument):
        q.enqueue(1, key="k", backoff_base_s=5000)


# --- batch -------------------------------------------------------------------------------


def test_batch_enqueues_in_order_with_options(table: JobTable) -> None:
    # Contract: ENQ-11.
    q = table.queue("q")
    ids = q.enqueue_batch([NewJob("a"), NewJob("b", priority=3, delay_s=5), NewJob("c", key="k")])
    assert len(ids) == 3
    assert len(set(ids)) == 3
    jobs = [q.get_job(i) for i in ids]
    assert [j.payload for j in jobs] == ["a", "b", "c"]  # type: ignore[union-attr]
    assert jobs[1].priority == 3  # type: ignore[union-attr]
    assert jobs[1].ready_at == START + 5  # type: ignore[union-attr]
    assert jobs[2].key == "k"  # type: ignore[union-attr]
    assert jobs[0].seq < jobs[1].seq < jobs[2].seq  # type: ignore[union-attr]
    assert q.stats().totals.enqueued == 3


def test_batch_key_of_existing_job_returns_its_id(table: JobTable) -> None:
    # Contract: ENQ-11, ENQ-10.
    q = table.queue("q")
    existing = q.enqueue(0, key="k")
    ids = q.enqueue_batch([NewJob(1), NewJob(2, key="k")])
    assert ids[1] == existing
    assert q.stats().totals.enqueued == 2


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (NewJob(9, priority=2**31), "jobs[2].priority"),
        (NewJob(9, delay_s=-1), "jobs[2].delay_s"),
        (NewJob(9, max_attempts=True), "jobs[2].max_attempts"),
        (NewJob({"x": INF}), "jobs[2].payload"),
    ],
)
def test_batch_is_all_or_nothing_and_names_the_index(table: JobTable, bad: Any, field: str) -> None:
    # Contract: ENQ-11.
    q = table.queue("q")
    q.enqueue(0)
    before = counts(q)
    with pytest.raises(InvalidArgument) as info:
        q.enqueue_batch([NewJob(1), NewJob(2, key="fresh"), bad, NewJob(4)])
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert counts(q) == before
    # nothing of the batch was stored: its key is still free, only the first job is claimable
    q.enqueue(5, key="fresh")
    assert q.stats().totals.enqueued == 2
    hs = q.claim_batch("w", 10)
    assert [h.job.payload for h in hs] == [0, 5]


def test_batch_size_limit_names_the_index(clock: ManualClock) -> None:
    # Contract: ENQ-11.
    table = JobTable(clock=clock, rng=random.Random(1), id_prefix="t", max_payload_bytes=16)
    q = table.queue("q")
    with pytest.raises(InvalidArgument) as info:
        q.enqueue_batch([NewJob("a" * 14), NewJob("a" * 15)])
    assert info.value.field == "jobs[1].payload"
    assert q.stats().totals.enqueued == 0


def test_empty_batch_is_no_error(table: JobTable) -> None:
    # Contract: ENQ-11.
    q = table.queue("q")
    assert q.enqueue_batch([]) == []
    assert q.stats().totals.enqueued == 0


def test_ids_are_unique_strings(table: JobTable) -> None:
    # Contract: JOB-3.
    q = table.queue("q")
    ids = [q.enqueue(i) for i in range(50)]
    assert all(isinstance(i, str) for i in ids)
    assert len(set(ids)) == 50


def test_an_empty_key_means_no_key(table: JobTable) -> None:
    # Contract: LIM-1.
    q = table.queue("q")
    first, second = q.enqueue(1, key=""), q.enqueue(2, key="")
    assert first != second
    job = q.get_job(first)
    assert job is not None and job.key is None


def test_a_key_of_1024_characters_and_one_outside_ascii_are_kept(table: JobTable) -> None:
    # Contract: LIM-1.
    q = table.queue("q")
    for key in ("k" * 1024, "clé-ü-\U0001f600"):
        job = q.get_job(q.enqueue(1, key=key))
        assert job is not None and job.key == key


def test_enqueue_each_takes_each_job_on_its_own_at_one_instant(table: JobTable) -> None:
    # (queue, payload, priority, delay_s, run_at, expires_s, visibility_timeout_s,
    #  max_attempts, backoff_base_s, key): enqueue's options, in its order.
    plain = (None, None, None, None, None, None, None)
    results = table.enqueue_each(
        [
            ("a", 1, 0, *plain),
            ("a", 2, 0, -1.0, *plain[1:]),  # a negative delay: this job alone is refused
            ("bad name!", 3, 0, *plain),
            ("b", 4, 5, 10.0, *plain[1:]),
            ("a", 5, 0, *plain[:-1], "k"),
            ("a", 6, 0, *plain[:-1], "k"),  # the key the job before took
        ]
    )
    first, bad_delay, bad_queue, delayed, keyed, same = results
    assert isinstance(bad_delay, InvalidArgument) and bad_delay.field == "delay_s"
    assert isinstance(bad_queue, InvalidArgument) and bad_queue.field == "queue"
    assert isinstance(first, str) and isinstance(delayed, str) and keyed == same
    assert table.queues() == ["a", "b"]  # made on first use; nothing for the refused name
    job = table.get_job(delayed)
    assert job is not None and job.priority == 5 and job.ready_at == job.enqueued_at + 10.0
    assert table.queue("a").stats().ready == 2
