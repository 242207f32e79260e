"""The PostgreSQL backend: the job table in a database server, shared by brokers.

Every call is one transaction on this backend's connection, run as a task: its result
(the task) is there once the transaction committed, so a frame made from it waits for
nothing more (the gate is ``IMMEDIATE``). Calls of one backend run one at a time, in
call order; brokers on one database change the table side by side,
claims made safe by ``FOR UPDATE SKIP LOCKED`` (CLM-8) and keys by a unique index
(ENQ-10). The schema and the claim function are in ``_pg_schema``.

The rules are the engine's (``broker/engine``): arguments go through its guards, and
a job's options resolve against its queue's as the engine resolves them, so that every
answer is the local backend's. *Now* is the injected scheduler's clock, passed to each
statement (never the server's ``now()``); the retry curve draws from the injected rng,
once per retry that uses it, in the order of the reports (RTY-1). In production that
clock is the database's (``_pg_clock.database_scheduler``), one clock for every broker.

Two connections. The *main* one runs the calls. The *hearing* one listens on the
channel ``conveyor``, where the jobs' triggers tell of work other brokers made (enqueue,
retry, lapse, redrive, resume) and of their cancels; it also holds the leader lock, and
runs the fallback poll.

Lost connections. A connection lost (the server restarted, the network broke) fails the
call in flight and every call made until it is back with ``Unavailable`` (a
``StoreError``: retry later), among them a call whose COMMIT was sent but not answered
(its outcome is unknown: it is never reported as done). Each connection is made again in
the background with a bounded backoff; ``on_failure`` is not called. Once the main one
is back, or the hearing one (notices may have been missed meanwhile), listeners are told
that work may be waiting (``work_waiting(None)``) and the timer is set again. A
statement the server refuses for any other reason (a bug, a constraint) fails the
backend for good, as a broken store does: ``on_failure`` is called and every later call
raises that ``StoreError``.

Time: after each change one indexed query finds the table's next timed event (TIM-4:
a job maturing, a lease lapsing, an expiry, a dead row's retention ending) and one
timer on the scheduler is kept set for it. When it fires, listeners are told that work
may be waiting. The *leader* then sweeps the table at the time the timer fired, and
again at each later event the clock has already passed (a manual clock may jump past
several), before any other call runs. One broker on a database at a time is the
leader: the one holding the session advisory lock ``_LEADER_LOCK`` on its hearing
connection (it goes with the session, so a broker that dies or loses its connection
hands over by itself). The others try to take it every ``lead_retry_s`` of the
scheduler's clock; they keep a timer for the events that make work claimable (a job
maturing, a lease lapsing) only, and claim as the leader does: a matured job and a
lapsed lease are claimable without a sweep (the claim function reads ``due``, CLM-2 and
CLM-6, and kills the expired and used-up rows it meets, CLM-3 to CLM-5). Two leaders at
once for a moment (one that has not yet noticed it lost its session) only sweep twice:
sweeps are ordinary transactions, safe side by side.

A notice cannot be lost while the hearing connection is up, but a change may be made
without one (SQL run by hand with the triggers off). So every ``poll_s`` of the
scheduler's clock the hearing connection reads the server's transaction snapshot (one
tiny query, no table read): if any transaction ended since the last poll, listeners are
told that work may be waiting and the next timed event is looked up again. Any write on
the server changes the snapshot, so on a busy server this tells every poll: the cost is
one claim per queue with waiting workers per poll.

Advisory lock ids (``pg_advisory_lock``'s one-bigint key space of the database):

* ``0x636F6E76`` ("conv"): the migration's transaction (``_pg_schema._LOCK_ID``).
* ``0x636F6E77`` ("conw"): folding the counters (``_FOLD_LOCK``), per transaction.
* ``0x636F6E6C`` ("conl"): the leader (``_LEADER_LOCK``), per session, on the hearing
  connection.
* the pair (``0x636F6E66`` ("conf"), ``hashtext(queue)``), in the two-int key space:
  a queue under flow control, per transaction (``conveyor_flow_lock``). A transaction
  waits for these in the order of ``hashtext`` only; one out of that order is tried, and
  a claim that fails to get it hands out nothing of that queue and asks to be made again
  at once, while any other call runs its batch's calls each alone. So two brokers'
  batches never deadlock on them.

Flow control (FLW-1 to FLW-10). A queue with limits, or with a back-off in force, is
claimed by ``conveyor_claim_flow`` (``_pg_schema``, v9) under that queue's lock, so that
claims of every broker on it run one at a time and the slots they count (the processing
rows with a valid lease, so a lapse frees one without a write) stay true until each
commits; every other queue is claimed as before, without the lock. Turns, buckets and
back-offs live in ``conveyor_parts``, shared by the brokers: a key waits there either in
the turns (by the priority its first row may have) or for a time, so a claim takes the
next key by an index probe, never walking the keys. Enqueues, retries and back-offs tell
the parts of new work through ``conveyor_part_news`` (appended by the jobs' triggers, so
an enqueue never waits for a claim), which the next claim folds in. A release under
limits (an ack, a death, a cancel) tells the other brokers ("w:"); a claim held back by
time, or by slots whose leases will lapse, tells when it lets go ("t:"), and this
broker sets its timer for then.

Schedules (SCH-1 to SCH-11), in ``conveyor_schedules`` (``_pg_schema``): every broker keeps
one more timer, for the earliest ``next_at`` of any schedule (one probe of its partial
index), and fires what is due when it rings, racing the other brokers: the due rows are
taken ``FOR UPDATE SKIP LOCKED``, their ticks' jobs inserted as an enqueue inserts jobs
(keyed by ``tick_key``) and each row's next tick, last job and count written, in one
commit. A tick is fired by exactly one broker: its row is locked by one firing at a
time, and the commit that makes its job moves ``next_at`` past it (a firing that meets
the row afterwards finds it not due); a firing cut off commits nothing and leaves the
tick to the next one. A set or a resume tells the other brokers the schedule's next tick
("s:" and the time), which they arm for at once; a pause or a delete tells them with no
time, and they look up their earliest tick again.

Results (RES-1 to RES-7). An ack stores each result with its job where the job's queue
keeps finished jobs (state 'completed' until the leader's sweep lets it go), and deletes
the job otherwise. Followers: a broker's follows are rows of ``conveyor_follows`` under
its own random name; the statement that ends a followed job (an ack, a cancel, or any
update to dead, by the jobs' trigger) writes that end into the row and notifies
"f:<name>", and the broker then takes its ended rows in a call of its own and tells its
followers (the poll does the same, while it has followers, for a notice missed). A
follow holds the jobs' rows while it writes its follows (``FOR SHARE``); a statement
that began before they were committed does not see them, so once committed a second look
tells the followers of the jobs that ended meanwhile with no end written, from the table
(as ``unknown`` for one deleted: what ended it is not known then). An end committed
after that look by a statement begun before the follow committed is not told.

Dependencies (DEP-1 to DEP-14). A job enqueued with ``after`` is stored 'waiting' with its
edges (``conveyor_deps``, ``_pg_schema``) and filed by ``conveyor_deps_link``: waiting,
dead at once, or pending. The enqueue holds the jobs it names (``FOR SHARE``) until it
commits, so the change that acks, kills or cancels one of them either waits for the edge
or is seen by the enqueue (MUL-7). The ack statement calls ``conveyor_deps_met`` on the
rows it acked (``_RELEASED``: it sees the edges committed while the ack waited for the
rows): the edges met keep the results, and each job left with nothing to wait for
becomes pending, which the jobs' update trigger counts, files in its partition's line and
tells ("w:") as any row put back to pending; this broker's listeners are told at once.
A death, wherever it comes from, kills the jobs waiting for it through the update trigger
(``conveyor_deps_doom``, one level per statement); a cancel calls it itself. A group
(``enqueue_group``) is checked whole (Kahn's algorithm for cycles) before any row is
written, and written in one transaction, its members in an order where each comes after
those it names.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import math
import random
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from ..egress import IMMEDIATE, Gate
from ..engine import (
    LIST_STATES,
    MAX_PROGRESS_BYTES,
    SEARCH_SCAN,
    DependencyCycle,
    InvalidArgument,
    Job,
    JobState,
    JobTable,
    Limits,
    NewJob,
    QueueOpts,
    QueueStats,
    QueueTotals,
    RawJSON,
    ScheduleInfo,
    ScheduleSpec,
    SweepResult,
    check_list_key,
    lease_number,
)
from ..engine import _guards as guard
from ..engine._schedule import check_timing, fire, next_tick, next_when_set, tick_key
from ..engine._schedules import MAX_LIST_LIMIT
from ..scheduler import Handle, Scheduler
from ..store import StoreError
from ._base import (
    REDRIVE_CHUNK,
    Backend,
    BackOff,
    Claim,
    Claimed,
    Enqueue,
    Finished,
    JobList,
    Listener,
    Progress,
    Report,
    Step,
    WatchEvent,
    unknown,
)
from ._listeners import Listeners
from ._pg_conn import Conn, Unavailable, close_quietly, connect, unavailable, why
from ._pg_schema import migrate

__all__ = ["PostgresBackend", "Unavailable"]

log = logging.getLogger("conveyor.backend")

T = TypeVar("T")

_HEX_DIGITS = "0123456789abcdef"
_SEQ_MAX = 2**63 - 1
# The engine's clamp of the retry curve's exponent (RTY-4).
_MAX_EXPONENT = 1023
_N_MAX = 2**31 - 1
# Calls run together in one transaction, at most (see _call).
_MAX_CALLS_PER_COMMIT = 64
# What ``nearest`` returns when it cannot tell: the table is asked (_NEXT_EVENT).
_ASK = float("-inf")
# Queues whose options are remembered at most (past it, they are read each time).
_MAX_KNOWN_QUEUES = 100_000
# Held while the counters are folded (see _FOLD).
_FOLD_LOCK = 0x636F6E77
# Held, per session, by the one broker that sweeps (the leader), on its hearing connection.
_LEADER_LOCK = 0x636F6E6C
# How long the hearing connection waits for a notice before it looks at its chores (a
# leader attempt, a poll, closing): the real-time delay of those, at most.
_HEAR_TICK_S = 0.2
# The first wait before a connection is made again; it doubles up to reconnect_max_s.
_RECONNECT_FIRST_S = 0.05

EXPIRED = "expired"
MAX_ATTEMPTS_EXCEEDED = "max attempts exceeded"
FAILED = "failed"

_JOB_COLUMNS = (
    "seq, queue, state, payload, priority, attempts, max_attempts, visibility_timeout_s, "
    "backoff_base_s, backoff_max_s, enqueued_at, ready_at, expires_at, worker_id, deadline, "
    "last_error, died_at, key, timeout_s, partition, result, completed_at, progress, "
    "waiting_for, "
    "CASE WHEN deps > 0 THEN ARRAY(SELECT d.dep FROM conveyor_deps d WHERE d.job = seq "
    "ORDER BY d.pos) END"
)

# Where a listed row (``_JOB_COLUMNS`` then its lease) has its lease: after the columns.
_LISTED_LEASE = len(_JOB_COLUMNS.split(", "))

_QUEUE_OPTS = (
    "name, visibility_timeout_s, max_attempts, backoff_base_s, backoff_max_s, expires_s, "
    "retention_s, completed_retention_s"
)

_ADD_QUEUES = """
INSERT INTO conveyor_queues (name, visibility_timeout_s, max_attempts, backoff_base_s,
    backoff_max_s, expires_s, retention_s)
SELECT u.name, %(vis)s::float8, %(attempts)s::int, %(base)s::float8, %(cap)s::float8,
    %(expires)s::float8, %(retention)s::float8
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS u(name, ord)
WHERE NOT EXISTS (SELECT 1 FROM conveyor_queues q WHERE q.name = u.name)
ORDER BY u.ord
ON CONFLICT (name) DO NOTHING
"""

_INSERT_JOBS = """
WITH src AS (
    SELECT s.*, nextval('conveyor_job_seq') AS seq
    FROM unnest(%(queue)s::text[], %(payload)s::bytea[], %(priority)s::int[],
                %(attempts)s::int[], %(vis)s::float8[], %(base)s::float8[],
                %(cap)s::float8[], %(ready_at)s::float8[], %(expires_at)s::float8[],
                %(key)s::text[], %(timeout)s::float8[], %(partition)s::text[],
                %(deps)s::int[])
        WITH ORDINALITY AS s(queue, payload, priority, attempts, vis, base, cap, ready_at,
                             expires_at, key, timeout, partition, deps, ord)
), ins AS (
    INSERT INTO conveyor_jobs (seq, queue, state, payload, priority, max_attempts,
        visibility_timeout_s, backoff_base_s, backoff_max_s, enqueued_at, ready_at,
        expires_at, key, timeout_s, partition, sched, deps, waiting_for)
    SELECT seq, queue, CASE WHEN deps > 0 THEN 'waiting' ELSE 'pending' END, payload,
        priority, attempts, vis, base, cap, %(now)s, ready_at, expires_at, key, timeout,
        partition, deps = 0 AND ready_at > %(now)s, deps, deps
    FROM src ORDER BY ord
    ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING seq
)
SELECT src.seq, ins.seq IS NOT NULL FROM src LEFT JOIN ins USING (seq) ORDER BY src.ord
"""

_KEYED = """
SELECT j.queue, j.key, j.seq FROM conveyor_jobs j
JOIN unnest(%s::text[], %s::text[]) AS u(queue, key) ON j.queue = u.queue AND j.key = u.key
"""

# The validity predicate (HND-1) over a batch of (seq, lease).
_VALID = "j.state = 'processing' AND j.lease = u.lease AND j.deadline > %(now)s"
# The statements on a batch of leases are not prepared (``prepare=False``): a prepared
# statement's generic plan, which the server switches to after a few runs, cannot see
# how few leases a batch holds, and walked every held job for each ack instead of
# looking the batch's jobs up by seq: an ack's cost grew with the jobs held.

# The queues among ``d``'s whose slots are counted (under flow control): a release there
# may let a waiting job go (FLW-2), so the other brokers are told ("w:"). Its rows come
# after the statement's own, with a NULL seq.
_FREED = """
f AS (
    SELECT q.name, pg_notify('conveyor', 'w:' || q.name) FROM conveyor_queues q
    WHERE q.name IN (SELECT queue FROM d) AND q.flow_until > %(now)s
)"""

# The acks landing on dependencies (DEP-1, DEP-2): conveyor_deps_met, given every acked
# row (``{rows}``: it reads them all first, so it runs once the statement holds them), the
# jobs it released as (NULL, queue, ready_at) rows last. Being VOLATILE, each of its
# statements reads a fresh snapshot: the edges an enqueue that held an acked row
# committed while this statement waited for the row are seen.
_RELEASED = """
r AS (
    SELECT m.queue, m.ready_at FROM conveyor_deps_met(
        ARRAY(SELECT x.seq FROM {rows} x ORDER BY x.seq),
        ARRAY(SELECT x.result FROM {rows} x ORDER BY x.seq), %(now)s) m
)"""

# The queues that keep their jobs once acked (RES-3): a hashed set, read once a statement
# (and while no queue keeps any, the keeping branch is not run: a one-time EXISTS). While
# this broker knows that none does, its acks run _ACK_PLAIN, which plans in half the time.
_KEEPING = "SELECT name FROM conveyor_queues WHERE completed_retention_s IS NOT NULL"

# An ack (RES-1): a valid lease's job is deleted, or kept completed with its result where
# its queue keeps finished jobs. The followers of the acked jobs (RES-5) have their rows
# written and their brokers told ("f:"); with no follow in the table, the follows are
# not looked at (a one-time EXISTS). The notices' rows come last, as (NULL, '').
_ACK = f"""
WITH u AS (
    SELECT * FROM unnest(%(seqs)s::bigint[], %(leases)s::text[], %(results)s::bytea[])
        AS u(seq, lease, result)
), d AS (
    DELETE FROM conveyor_jobs j USING u
    WHERE j.seq = u.seq AND {_VALID} AND j.queue NOT IN ({_KEEPING})
    RETURNING j.seq, j.queue, u.lease, u.result
), k AS (
    UPDATE conveyor_jobs j SET state = 'completed', result = u.result,
        completed_at = %(now)s, worker_id = NULL, lease = NULL, deadline = NULL, sched = false
    FROM u
    WHERE EXISTS ({_KEEPING}) AND j.seq = u.seq AND {_VALID} AND j.queue IN ({_KEEPING})
    RETURNING j.seq, j.queue, u.lease, u.result
), a AS (
    SELECT * FROM d UNION ALL SELECT * FROM k
), t AS (
    INSERT INTO conveyor_counts (queue, completed) SELECT queue, count(*) FROM a GROUP BY queue
), fo AS (
    UPDATE conveyor_follows fw SET queue = a.queue, state = 'completed', result = a.result
    FROM a
    WHERE fw.seq = a.seq AND fw.state IS NULL AND EXISTS (SELECT 1 FROM conveyor_follows)
    RETURNING fw.broker
), {_FREED.replace("FROM d)", "FROM a)")}, {_RELEASED.format(rows="a")}
SELECT seq, lease, NULL::float8 FROM a UNION ALL SELECT NULL, name, NULL FROM f
UNION ALL SELECT NULL, pg_notify('conveyor', 'f:' || b.broker)::text, NULL
    FROM (SELECT DISTINCT broker FROM fo) b
UNION ALL SELECT NULL, queue, ready_at FROM r
"""

_HEARTBEAT = f"""
UPDATE conveyor_jobs j SET deadline = %(now)s + j.visibility_timeout_s
FROM unnest(%(seqs)s::bigint[], %(leases)s::text[]) AS u(seq, lease)
WHERE j.seq = u.seq AND {_VALID} AND (%(worker)s::text IS NULL OR j.worker_id = %(worker)s)
RETURNING j.seq, j.lease
"""

# A lapse the broker makes (HND-11: a worker gone past its grace) ends the lease now: the
# job is reclaimable. Its attempt is told to the job's watchers as a retry when attempts
# are left (a lapse of the last attempt is told as the end, by the sweep that kills it):
# the brokers following it are told "g:<broker>:<seq>:l<attempt>" in the same statement
# (PRG-8). Rows: (seq, lease, queue, attempts left, attempt); the notices' come last.
_LAPSE = f"""
WITH l AS (
    UPDATE conveyor_jobs j SET deadline = %(now)s
    FROM unnest(%(seqs)s::bigint[], %(leases)s::text[]) AS u(seq, lease)
    WHERE j.seq = u.seq AND {_VALID}
    RETURNING j.seq, j.lease, j.queue, j.attempts, j.max_attempts
)
SELECT seq, lease, queue, attempts < max_attempts, attempts FROM l
UNION ALL SELECT NULL,
    pg_notify('conveyor', 'g:' || fw.broker || ':' || fw.seq || ':l' || l.attempts)::text,
    NULL, NULL, NULL
    FROM conveyor_follows fw JOIN l ON fw.seq = l.seq
    WHERE fw.state IS NULL AND l.attempts < l.max_attempts
"""

# A broker's row says it is alive; rows not renewed for a minute are cleared, and with
# them the follows written under the follower id they name (a crashed broker's). (The
# statement's own upsert is not visible to its SELECT: the others' rows are.) Its last
# row says whether this broker's own row was made afresh: if it had been cleared (the
# broker was out of reach for a minute), its follows were too, and are written again.
_ANNOUNCE = """
WITH up AS (
    INSERT INTO conveyor_brokers (id, info, seen_at, follower)
    VALUES (%(me)s, %(info)s, %(now)s, %(follower)s)
    ON CONFLICT (id) DO UPDATE SET info = excluded.info, seen_at = excluded.seen_at,
        follower = excluded.follower
    RETURNING (xmax = 0) AS fresh
), gone AS (
    DELETE FROM conveyor_brokers WHERE seen_at < %(now)s - 60 AND id <> %(me)s
    RETURNING follower
), pruned AS (
    DELETE FROM conveyor_follows fw USING gone g WHERE fw.broker = g.follower
)
SELECT info, NULL::bool, id FROM conveyor_brokers
WHERE id <> %(me)s AND seen_at >= %(now)s - %(ttl)s AND seen_at <= %(now)s + %(ttl)s
UNION ALL SELECT NULL, fresh, NULL FROM up
ORDER BY 3
"""

_REPORTED = """
SELECT seq, queue, state, lease, deadline, attempts, max_attempts, backoff_base_s,
    backoff_max_s, last_error
FROM conveyor_jobs WHERE seq = ANY(%s::bigint[]) ORDER BY seq FOR UPDATE
"""

_SETTLE_REPORTS = """
UPDATE conveyor_jobs j SET state = u.state, ready_at = coalesce(u.ready_at, j.ready_at),
    last_error = u.last_error,
    died_at = u.died_at, sched = u.sched, worker_id = NULL, lease = NULL, deadline = NULL
FROM unnest(%s::bigint[], %s::text[], %s::float8[], %s::text[], %s::float8[], %s::bool[])
    AS u(seq, state, ready_at, last_error, died_at, sched)
WHERE j.seq = u.seq
"""

_CANCEL = f"""
WITH d AS (
    DELETE FROM conveyor_jobs j WHERE j.seq = ANY(%(seqs)s::bigint[])
    RETURNING j.seq, j.queue, j.partition
), t AS (
    INSERT INTO conveyor_counts (queue, cancelled) SELECT queue, count(*) FROM d GROUP BY queue
), fo AS (
    UPDATE conveyor_follows fw SET queue = d.queue, state = 'cancelled'
    FROM d
    WHERE fw.seq = d.seq AND fw.state IS NULL AND EXISTS (SELECT 1 FROM conveyor_follows)
    RETURNING fw.broker
), {_FREED}
SELECT seq, pg_notify('conveyor', 'c:' || seq)::text, partition FROM d
UNION ALL SELECT NULL, name, NULL FROM f
UNION ALL SELECT NULL, pg_notify('conveyor', 'f:' || b.broker)::text, NULL
    FROM (SELECT DISTINCT broker FROM fo) b
"""

# _ACK where no queue keeps finished jobs: every valid lease's job is deleted.
_ACK_PLAIN = f"""
WITH d AS (
    DELETE FROM conveyor_jobs j
    USING unnest(%(seqs)s::bigint[], %(leases)s::text[], %(results)s::bytea[])
        AS u(seq, lease, result)
    WHERE j.seq = u.seq AND {_VALID}
    RETURNING j.seq, j.queue, j.lease, u.result
), t AS (
    INSERT INTO conveyor_counts (queue, completed) SELECT queue, count(*) FROM d GROUP BY queue
), fo AS (
    UPDATE conveyor_follows fw SET queue = d.queue, state = 'completed', result = d.result
    FROM d
    WHERE fw.seq = d.seq AND fw.state IS NULL AND EXISTS (SELECT 1 FROM conveyor_follows)
    RETURNING fw.broker
), {_FREED}, {_RELEASED.format(rows="d")}
SELECT seq, lease, NULL::float8 FROM d UNION ALL SELECT NULL, name, NULL FROM f
UNION ALL SELECT NULL, pg_notify('conveyor', 'f:' || b.broker)::text, NULL
    FROM (SELECT DISTINCT broker FROM fo) b
UNION ALL SELECT NULL, queue, ready_at FROM r
"""

# Progress (PRG-1, PRG-2): each valid lease's job takes its latest value; the brokers
# following one of them (a watch follows its job) are told "g:<broker>:<seq>:p" and read
# it (PRG-8). The notices' rows come last, as (NULL, NULL).
_PROGRESS = f"""
WITH p AS (
    UPDATE conveyor_jobs j SET progress = u.progress
    FROM unnest(%(seqs)s::bigint[], %(leases)s::text[], %(values)s::bytea[])
        AS u(seq, lease, progress)
    WHERE j.seq = u.seq AND {_VALID}
    RETURNING j.seq, j.attempts
)
SELECT seq, attempts, NULL::text FROM p
UNION ALL SELECT NULL, NULL, pg_notify('conveyor', 'g:' || fw.broker || ':' || fw.seq || ':p')::text
    FROM conveyor_follows fw JOIN p ON fw.seq = p.seq
    WHERE fw.state IS NULL AND EXISTS (SELECT 1 FROM conveyor_follows)
"""

# The followers of jobs retried (PRG-5) told "g:<broker>:<seq>:r<attempt>" in the
# report's transaction, of jobs backed off "...:b<attempt>" in the back-off's: the
# attempt that ended rides the notice, so it is told right whatever the job did since.
_STEPPED_NOTICE = """
SELECT pg_notify('conveyor', 'g:' || fw.broker || ':' || fw.seq || ':' || u.step)
FROM unnest(%s::bigint[], %s::text[]) AS u(seq, step)
JOIN conveyor_follows fw ON fw.seq = u.seq AND fw.state IS NULL
"""

# A retry's notice, by its letter: "r" a worker's retry, "b" a back-off, "l" a lapse the
# broker made (_LAPSE), "x" a lease that ran out by time, told by the claim that takes
# the job again (the jobs' update trigger, schema v14). A lease the broker lapsed is told
# twice, "l" and then "x" at its reclaim: a watcher is told each attempt's lapse once.
_STEP_REASONS = {"r": "failed", "b": "backed_off", "l": "lapsed", "x": "lapsed"}

# What a broker reads of jobs whose steps it was told of (PRG-8).
_STEPPED = """
SELECT seq, attempts, progress, last_error FROM conveyor_jobs
WHERE seq = ANY(%s::bigint[])
"""

# Follow (RES-5, RES-6): each job as it stands, its row held until the follows are
# written (an ack or a cancel of it waits for them); a live one is followed by this
# broker from now on.
_FOLLOW = """
WITH j AS (
    SELECT j.seq, j.queue, j.state, j.result, j.last_error FROM conveyor_jobs j
    WHERE j.seq = ANY(%(seqs)s::bigint[]) FOR SHARE OF j
), ins AS (
    INSERT INTO conveyor_follows (seq, broker)
    SELECT seq, %(me)s FROM j WHERE state IN ('pending', 'processing', 'waiting')
    ON CONFLICT (seq, broker) DO NOTHING
)
SELECT seq, queue, state, result, last_error FROM j
"""

# The jobs this broker follows whose end its follow rows missed (RES-7): no longer live,
# and no end written; their follows dropped.
_MISSED = """
WITH m AS (
    DELETE FROM conveyor_follows fw
    WHERE fw.broker = %(me)s AND fw.seq = ANY(%(seqs)s::bigint[]) AND fw.state IS NULL
        AND NOT EXISTS (
            SELECT 1 FROM conveyor_jobs j
            WHERE j.seq = fw.seq AND j.state IN ('pending', 'processing', 'waiting')
        )
    RETURNING fw.seq
)
SELECT m.seq, j.queue, j.state, j.result, j.last_error
FROM m LEFT JOIN conveyor_jobs j ON j.seq = m.seq
"""

_LIVE = ("pending", "processing", "waiting")

# What finished of the jobs this broker follows, taken.
_TAKE_FINISHED = """
DELETE FROM conveyor_follows WHERE broker = %s AND state IS NOT NULL
RETURNING seq, queue, state, result, error
"""

# A redriven job with dependencies waits again (DEP-5): conveyor_deps_link files it.
# (Its dependencies not met are held first, in seq order, as an enqueue holds them:
# _HOLD_REDRIVEN.)
_HOLD_REDRIVEN = """
SELECT j.seq FROM conveyor_jobs j
WHERE j.seq IN (
    SELECT d.dep FROM conveyor_deps d WHERE d.job = ANY(%(seqs)s::bigint[]) AND NOT d.met
)
ORDER BY j.seq FOR SHARE
"""

_REDRIVE = """
UPDATE conveyor_jobs SET state = CASE WHEN deps > 0 THEN 'waiting' ELSE 'pending' END,
    attempts = 0, died_at = NULL, ready_at = %(now)s, sched = false
WHERE seq = ANY(%(seqs)s::bigint[]) AND state = 'dead'
RETURNING seq, queue, deps
"""

_REDRIVE_OLDEST = """
UPDATE conveyor_jobs SET state = CASE WHEN deps > 0 THEN 'waiting' ELSE 'pending' END,
    attempts = 0, died_at = NULL, ready_at = %(now)s, sched = false
WHERE seq IN (
    SELECT seq FROM conveyor_jobs WHERE queue = %(q)s AND state = 'dead'
    ORDER BY died_at, seq LIMIT %(n)s FOR UPDATE SKIP LOCKED
)
RETURNING seq, queue, deps
"""

# The edges of new jobs (DEP-1), then their filing (conveyor_deps_link).
_ADD_EDGES = """
INSERT INTO conveyor_deps (job, pos, dep)
SELECT * FROM unnest(%s::bigint[], %s::int[], %s::bigint[])
"""
_LINK = "SELECT * FROM conveyor_deps_link(%s::bigint[], %s)"
_DOOM = "SELECT conveyor_deps_doom(%s::bigint[], %s::text[], %s)"
# The dependencies an enqueue names, held until it commits (an ack or a death of one
# waits for the edge, DEP-1, DEP-3), in seq order.
_HOLD_DEPS = "SELECT seq FROM conveyor_jobs WHERE seq = ANY(%s::bigint[]) ORDER BY seq FOR SHARE"
# DEP-2: the results of a job's dependencies met so far, in the order named.
_DEP_RESULTS = """
SELECT j.seq, d.dep, d.result FROM conveyor_jobs j
LEFT JOIN conveyor_deps d ON d.job = j.seq AND d.met
WHERE j.seq = %s ORDER BY d.pos
"""

_DEAD = """
UPDATE conveyor_jobs SET state = 'dead', died_at = %(now)s, last_error = %(error)s,
    worker_id = NULL, lease = NULL, deadline = NULL, sched = false
"""

_SWEEP_EXPIRED = f"""
WITH k AS ({_DEAD} WHERE state <> 'dead' AND state <> 'completed' AND expires_at <= %(now)s
    RETURNING 1)
SELECT count(*) FROM k
"""

_SWEEP_USED_UP = f"""
WITH k AS ({_DEAD} WHERE state = 'processing' AND deadline <= %(now)s
    AND attempts >= max_attempts RETURNING 1)
SELECT count(*) FROM k
"""

_SWEEP_RETENTION = """
WITH k AS (
    DELETE FROM conveyor_jobs j USING conveyor_queues q
    WHERE j.queue = q.name AND q.retention_s IS NOT NULL AND j.state = 'dead'
        AND j.died_at + q.retention_s <= %(now)s
    RETURNING 1
)
SELECT count(*) FROM k
"""

# The completed jobs past their retention (RES-3), queue by queue over
# conveyor_jobs_completed (a queue that stopped keeping finished jobs lets go of those it
# kept, as the engine's does).
_SWEEP_COMPLETED = """
WITH k AS (
    DELETE FROM conveyor_jobs j USING conveyor_queues q
    WHERE j.queue = q.name AND j.state = 'completed'
        AND j.completed_at <= %(now)s - coalesce(q.completed_retention_s, 0)
    RETURNING 1
)
SELECT count(*) FROM k
"""

_NEXT_EVENT = """
SELECT least(
    (SELECT min(ready_at) FROM conveyor_jobs WHERE state = 'pending' AND ready_at > %(now)s),
    (SELECT min(deadline) FROM conveyor_jobs
        WHERE state = 'processing' AND deadline > %(now)s),
    (SELECT min(deadline) FROM conveyor_jobs
        WHERE state = 'processing' AND attempts >= max_attempts),
    (SELECT min(expires_at) FROM conveyor_jobs
        WHERE expires_at IS NOT NULL AND state <> 'dead' AND state <> 'completed'),
    (SELECT min(d.first + q.retention_s) FROM conveyor_queues q
        CROSS JOIN LATERAL (
            SELECT min(j.died_at) AS first FROM conveyor_jobs j
            WHERE j.queue = q.name AND j.state = 'dead'
        ) d
        WHERE q.retention_s IS NOT NULL),
    (SELECT min(c.first + coalesce(q.completed_retention_s, 0)) FROM conveyor_queues q
        CROSS JOIN LATERAL (
            SELECT min(j.completed_at) AS first FROM conveyor_jobs j
            WHERE j.queue = q.name AND j.state = 'completed'
        ) c)
)
"""

# A broker that does not sweep (not the leader) waits only for what makes work
# claimable: a job maturing, a lease lapsing. (The leader's events that are already past,
# an expiry or a retention ending, would fire its timer again at once until swept.)
_NEXT_CLAIMABLE = """
SELECT least(
    (SELECT min(ready_at) FROM conveyor_jobs WHERE state = 'pending' AND ready_at > %(now)s),
    (SELECT min(deadline) FROM conveyor_jobs
        WHERE state = 'processing' AND deadline > %(now)s)
)
"""

_MATURE = """
UPDATE conveyor_jobs SET sched = false
WHERE sched AND ready_at <= %(now)s AND (%(names)s::text[] IS NULL OR queue = ANY(%(names)s))
"""

# list_jobs, per state: (the rows of the state, the order, the keyset condition) over
# the v7 indexes. %(q)s is the queue; the key's members are %(k0)s, %(k1)s, %(k2)s.
_LIST: dict[str, tuple[str, str, str]] = {
    "ready": (
        "state = 'pending' AND NOT sched",
        "-(priority::bigint), ready_at, seq",
        "(-(priority::bigint), ready_at, seq) > (-(%(k0)s::bigint), %(k1)s, %(k2)s)",
    ),
    "scheduled": ("sched", "ready_at, seq", "(ready_at, seq) > (%(k0)s, %(k1)s)"),
    "processing": (
        "state = 'processing'",
        "length(lease), lease",
        "(length(lease), lease) > (length(%(k0)s::text), %(k0)s::text)",
    ),
    "dead": (
        "state = 'dead'",
        "died_at DESC, seq DESC",
        "(died_at, seq) < (%(k0)s, %(k1)s)",
    ),
    "completed": (
        "state = 'completed'",
        "completed_at DESC, seq DESC",
        "(completed_at, seq) < (%(k0)s, %(k1)s)",
    ),
    "waiting": (
        "state = 'waiting'",
        "enqueued_at, seq",
        "(enqueued_at, seq) > (%(k0)s, %(k1)s)",
    ),
}

_COUNTED = (
    "n_ready, n_scheduled, n_processing, n_dead, enqueued, completed, retried, dead, "
    "expired, cancelled, n_completed, n_waiting"
)
_SUMS = ", ".join(f"sum({c})::bigint AS {c}" for c in _COUNTED.split(", "))

# Fold each queue's delta rows into one. (Under _FOLD_LOCK, taken in an earlier statement,
# so that a fold that waited for another one sees the row that one left.)
_FOLD = f"""
WITH folded AS (
    DELETE FROM conveyor_counts c
    WHERE (%(names)s::text[] IS NULL OR c.queue = ANY(%(names)s))
    RETURNING c.*
)
INSERT INTO conveyor_counts (queue, {_COUNTED})
SELECT queue, {_SUMS} FROM folded GROUP BY queue
"""

_STATS = f"""
SELECT q.name, s.n_ready, s.n_scheduled, s.n_processing, s.n_dead, q.paused, s.enqueued,
    s.completed, s.retried, s.dead, s.expired, s.cancelled,
    (SELECT min(j.ready_at) FROM conveyor_jobs j
        WHERE j.queue = q.name AND j.state = 'pending' AND NOT j.sched) AS oldest,
    q.flow_until IS NOT NULL OR EXISTS (
        SELECT 1 FROM conveyor_jobs j
        WHERE j.queue = q.name AND j.partition <> '' AND j.due IS NOT NULL
    ) AS flows, s.n_completed, s.n_waiting
FROM conveyor_queues q
LEFT JOIN (SELECT queue, {_SUMS} FROM conveyor_counts GROUP BY queue) s ON s.queue = q.name
WHERE %(names)s::text[] IS NULL OR q.name = ANY(%(names)s)
ORDER BY q.made
"""


# Claims of a queue under flow control, and the changes of its limits and back-offs, run
# one at a time (see conveyor_claim_flow: the same lock). The locks are waited for in
# one order (conveyor_flow_lock): false says one was out of it and held elsewhere.
_FLOW_LOCK_SQL = "SELECT conveyor_flow_lock(%s)"
# The order the flow locks of some queues are waited for in.
_FLOW_LOCK_ORDER = "SELECT n FROM unnest(%s::text[]) AS n ORDER BY hashtext(n), n"

# The queues under flow control at now, in the order their locks are taken in.
_FLOWING = """
SELECT name FROM conveyor_queues WHERE flow_until > %(now)s ORDER BY hashtext(name), name
"""

_SET_LIMITS = """
WITH q AS (
    UPDATE conveyor_queues SET concurrency = %(concurrency)s, rate = %(rate)s,
        per_s = %(per_s)s, burst = %(burst)s,
        partition_concurrency = %(partition_concurrency)s,
        partition_rate = %(partition_rate)s, partition_per_s = %(partition_per_s)s,
        partition_burst = %(partition_burst)s,
        flow_until = CASE WHEN %(any)s THEN 'Infinity'::float8 ELSE (
            SELECT max(p.until) FROM conveyor_parts p WHERE p.queue = %(q)s
        ) END
    WHERE name = %(q)s
), own AS (
    INSERT INTO conveyor_parts (queue, name, turn, head_pri) VALUES (%(q)s, '', 0, 2147483647)
    ON CONFLICT DO NOTHING
)
UPDATE conveyor_parts SET tat = NULL,
    -- a key waiting on time is looked at again by the next claim (its bucket is full)
    opens = CASE WHEN opens IS NOT NULL THEN '-Infinity'::float8 END
WHERE queue = %(q)s AND (tat IS NOT NULL OR opens IS NOT NULL)
"""

_BACKING_OFF = """
SELECT seq, queue, state, lease, deadline, partition, attempts
FROM conveyor_jobs WHERE seq = ANY(%s::bigint[]) ORDER BY seq FOR UPDATE
"""

# Back to pending where it was (its ready time is past), the attempt not spent; the
# trigger counts the move as a retry, which it is not: taken back (QueueTotals).
_BACK_OFF_JOBS = """
WITH b AS (
    UPDATE conveyor_jobs SET state = 'pending', attempts = attempts - 1, worker_id = NULL,
        lease = NULL, deadline = NULL, sched = false
    WHERE seq = ANY(%s::bigint[])
    RETURNING queue
)
INSERT INTO conveyor_counts (queue, retried) SELECT queue, -count(*) FROM b GROUP BY queue
"""

# Each (queue, key) held until its time, a later hold winning ('' is the queue itself):
# a key leaves the turns and waits for its time (a claim looks at it again then).
_HOLD_PARTS = """
WITH u AS (
    SELECT * FROM unnest(%s::text[], %s::text[], %s::float8[]) AS u(queue, name, until)
), p AS (
    INSERT INTO conveyor_parts AS p (queue, name, turn, until, opens, head_pri)
    SELECT u.queue, u.name,
        CASE WHEN u.name = '' THEN 0 ELSE nextval('conveyor_turn_seq') END, u.until,
        CASE WHEN u.name <> '' THEN u.until END,
        CASE WHEN u.name = '' THEN 2147483647 END
    FROM u
    ON CONFLICT (queue, name) DO UPDATE
        SET until = greatest(coalesce(p.until, '-Infinity'), excluded.until),
            opens = CASE WHEN p.name <> ''
                THEN greatest(coalesce(p.until, '-Infinity'), excluded.until) ELSE p.opens END,
            head_pri = CASE WHEN p.name = '' THEN p.head_pri END,
            idle = false
)
UPDATE conveyor_queues q SET flow_until = greatest(coalesce(q.flow_until, '-Infinity'), m.until)
FROM (SELECT queue, max(until) AS until FROM u GROUP BY queue) m
WHERE q.name = m.queue
"""


# -- schedules (SCH-1 on) ---------------------------------------------------------------

# A spec's fields kept in the ``spec`` column (the others have columns of their own).
_SPEC_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(ScheduleSpec)
    if f.name not in ("id", "queue", "payload", "paused")
)

_SCHEDULE_COLUMNS = (
    "id, queue, payload, spec, paused, next_at, last_at, last_job, fired, created_at, updated_at"
)

# Due schedules, soonest first, each locked until the transaction that fires it commits;
# one another broker is firing is passed over (it advances next_at in that commit). Read
# through the partial index on next_at: schedules not due are never looked at.
_DUE_SCHEDULES = f"""
SELECT {_SCHEDULE_COLUMNS} FROM conveyor_schedules
WHERE next_at <= %(now)s
ORDER BY next_at, id
LIMIT %(n)s
FOR UPDATE SKIP LOCKED
"""

_FIRED = """
UPDATE conveyor_schedules s SET next_at = u.next_at,
    last_at = coalesce(u.last_at, s.last_at), last_job = coalesce(u.last_job, s.last_job),
    fired = s.fired + u.n
FROM unnest(%s::text[], %s::float8[], %s::float8[], %s::text[], %s::int[])
    AS u(id, next_at, last_at, last_job, n)
WHERE s.id = u.id
"""

# The earliest tick to come of any schedule: one probe of the partial index.
_NEXT_SCHEDULE = "SELECT min(next_at) FROM conveyor_schedules WHERE next_at IS NOT NULL"

_PUT_SCHEDULE = """
INSERT INTO conveyor_schedules (id, queue, payload, spec, paused, next_at, last_at, last_job,
    fired, created_at, updated_at)
VALUES (%(id)s, %(queue)s, %(payload)s, %(spec)s, %(paused)s, %(next_at)s, %(last_at)s,
    %(last_job)s, %(fired)s, %(created_at)s, %(updated_at)s)
ON CONFLICT (id) DO UPDATE SET queue = excluded.queue, payload = excluded.payload,
    spec = excluded.spec, paused = excluded.paused, next_at = excluded.next_at,
    updated_at = excluded.updated_at
"""

# Schedules fired per transaction, at most: a transaction holds their rows' locks, and a
# schedule may make many jobs at once (``each``, up to its ``max_catch_up``).
_FIRE_BATCH = 100
# Firings at successive ticks the clock has already passed, at most, before the rest
# fire at once at the time it is (a stepped clock that jumped far, see _fire_when_due).
_MAX_FIRE_PASSES = 1000
# How long (the scheduler's clock) before looking again at a due schedule that another
# broker holds: it is firing it, and its commit moves next_at on.
_HELD_RETRY_S = 0.1
# How long before schedules are tried again after a firing failed for a reason other
# than a lost connection (a bug, logged).
_FIRE_FAILED_RETRY_S = 1.0


def _limit_row(limits: Limits) -> dict[str, int | float | None]:
    return limits.as_dict()


# stats' flow-control fields (FLW-8), per queue: its limits, its own back-off and bucket,
# its slots held (when it counts them), the keys with ready jobs and, of those, the ready
# jobs of the keys a limit holds back. It finds the queue's keys from its jobs, one
# probe of the per-key index each (O(k log n): the parts may not have heard of a key's
# jobs yet), and counts the ready jobs of the keys held back only.
_FLOW_STATS = """
SELECT q.name, q.concurrency, q.rate, q.per_s, q.burst, q.partition_concurrency,
    q.partition_rate, q.partition_per_s, q.partition_burst, o.until, o.tat,
    CASE WHEN q.concurrency IS NULL THEN 0 ELSE (
        SELECT count(*) FROM conveyor_jobs j
        WHERE j.queue = q.name AND j.state = 'processing' AND j.deadline > %(now)s
    ) END,
    k.busy, k.limited
FROM conveyor_queues q
LEFT JOIN conveyor_parts o ON o.queue = q.name AND o.name = ''
CROSS JOIN LATERAL (
    SELECT count(*) AS busy, coalesce(sum(CASE WHEN b.blocked THEN (
        SELECT count(*) FROM conveyor_jobs j
        WHERE j.queue = q.name AND j.partition = b.name AND j.state = 'pending'
            AND j.ready_at <= %(now)s
    ) END), 0)::bigint AS limited
    FROM (
        SELECT k.name, (
            coalesce(p.until > %(now)s, false)
            OR (q.partition_rate IS NOT NULL AND p.tat IS NOT NULL AND %(now)s
                < p.tat - (coalesce(q.partition_burst, 1) - 1)
                    * (q.partition_per_s / q.partition_rate))
            OR (q.partition_concurrency IS NOT NULL AND (
                SELECT count(*) FROM conveyor_jobs j
                WHERE j.queue = q.name AND j.partition = k.name AND j.partition <> ''
                    AND j.state = 'processing' AND j.deadline > %(now)s
            ) >= q.partition_concurrency)
        ) AS blocked
        FROM (
            WITH RECURSIVE k AS (
                (SELECT j.partition AS name FROM conveyor_jobs j
                WHERE j.queue = q.name AND j.partition <> '' AND j.due IS NOT NULL
                ORDER BY j.partition LIMIT 1)
                UNION ALL
                SELECT (
                    SELECT j.partition FROM conveyor_jobs j
                    WHERE j.queue = q.name AND j.partition <> '' AND j.due IS NOT NULL
                        AND j.partition > k.name
                    ORDER BY j.partition LIMIT 1
                ) FROM k WHERE k.name IS NOT NULL
            )
            SELECT k.name FROM k WHERE k.name IS NOT NULL
        ) k
        LEFT JOIN conveyor_parts p ON p.queue = q.name AND p.name = k.name
        WHERE EXISTS (
            SELECT 1 FROM conveyor_jobs j
            WHERE j.queue = q.name AND j.partition = k.name AND j.state = 'pending'
                AND j.ready_at <= %(now)s
        )
    ) b
) k
WHERE q.name = ANY(%(names)s::text[])
"""


def _flow_fields(row: tuple[Any, ...], now: float, ready: int) -> dict[str, Any]:
    """The flow-control fields of a queue's ``QueueStats`` from its ``_FLOW_STATS`` row."""
    limits = Limits(*row[1:9])
    until, tat, held, busy, limited = row[9:14]
    gated = until is not None and until > now
    if limits.concurrency is not None and held >= limits.concurrency:
        gated = True
    if limits.rate is not None and tat is not None:
        interval = limits.per_s / limits.rate
        if now < tat - ((limits.burst or 1) - 1) * interval:
            gated = True
    return {
        "limited": ready if gated else limited,
        "partitions": busy,
        "backoff_until": until if until is not None and until > now else None,
        "limits": limits,
    }


class _OutOfOrder(Exception):
    """A flow lock a call needs comes before one its batch's transaction holds in the
    locks' order, and another transaction holds it: waiting could deadlock. Raised out
    of the work, it makes ``_run_batch`` run each call of the batch alone."""


def _error(exc: BaseException) -> StoreError:
    return StoreError(f"postgres: {type(exc).__name__}: {exc}".rstrip())


@dataclass(frozen=True, slots=True)
class _Claimed:
    """One job a claim handed out (``Claimed``)."""

    id: str
    queue: str
    lease: str
    payload_json: bytes
    attempt: int
    max_attempts: int
    deadline: float
    priority: int
    visibility_timeout_s: float
    ready_since: float
    timeout_s: float | None
    partition: str | None = None
    dependencies: int = 0


class _Call(Generic[T]):
    """One call waiting for the connection (``PostgresBackend._call``)."""

    __slots__ = ("alone", "changes", "future", "nearest", "work")

    def __init__(
        self,
        work: Callable[[float], Awaitable[T]],
        changes: bool,
        nearest: Callable[[T], float | None] | None,
        alone: bool = False,
    ) -> None:
        self.work = work
        self.changes = changes
        self.nearest = nearest
        # Run in a transaction of its own (its work commits as it goes), never batched.
        self.alone = alone
        self.future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

    def succeed(self, result: T) -> None:
        if not self.future.done():  # (its caller may have given up: cancelled)
            self.future.set_result(result)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class PostgresBackend:
    """``Backend`` on a PostgreSQL database. Make it with ``await PostgresBackend.open``
    on the running event loop; call it there.

    ``scheduler``'s clock is the table's. A lost connection makes calls raise
    ``Unavailable`` until it is back (see the module docstring). ``on_failure`` is
    called once if the database refuses a statement for any other reason; that call and
    every later one raise ``StoreError``.
    """

    name = "postgres"
    durable = True
    shared = True
    # A result comes once its transaction committed: a frame made from it waits for
    # nothing more.
    gate: Gate = IMMEDIATE

    def __init__(
        self,
        conn: Conn,
        scheduler: Scheduler,
        id_prefix: str,
        *,
        dsn: str,
        max_payload_bytes: int,
        rng: random.Random,
        on_failure: Callable[[StoreError], None],
        poll_s: float = 1.0,
        lead_retry_s: float = 1.0,
        reconnect_max_s: float = 2.0,
    ) -> None:
        """Use ``open``: this takes a connection already migrated."""
        for field, value in (
            ("poll_s", poll_s),
            ("lead_retry_s", lead_retry_s),
            ("reconnect_max_s", reconnect_max_s),
        ):
            if not value > 0:
                raise ValueError(f"{field}: must be > 0, got {value!r}")
        self._dsn = dsn
        # The main connection; None while it is lost (``_down`` says why).
        self._main: Conn | None = conn
        self._own_pid = conn.info.backend_pid
        self._down: str | None = None
        self._reviver: asyncio.Task[None] | None = None
        self._scheduler = scheduler
        self.id_prefix = id_prefix
        self._rng = rng
        self._on_failure = on_failure
        self._poll_s = poll_s
        self._lead_retry_s = lead_retry_s
        self._reconnect_max_s = reconnect_max_s
        # The engine checks each job's options and resolves them against its queue's:
        # a table holding no job, whose queues carry the options read from the database.
        self._rules = JobTable(
            clock=scheduler.now, id_prefix=id_prefix, max_payload_bytes=max_payload_bytes
        )
        self._lock = asyncio.Lock()
        # Calls waiting for the connection, oldest first, and the task that runs them.
        self._calls: collections.deque[_Call[Any]] = collections.deque()
        self._runner: asyncio.Task[None] | None = None
        self._listeners = Listeners()
        self._timer: Handle | None = None
        self._timer_at: float | None = None
        # When the timer fired, while the sweep it asks for has not run.
        self._due_at: float | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.failed: StoreError | None = None
        self._closed = False
        # Each queue's options as last read, so that an enqueue need not read them again;
        # a change (set_queue, by any broker) is told on the channel ("q:" and the name).
        self._opts: dict[str, QueueOpts] = {}
        # The followers of each job this broker follows (RES-5), its name in
        # conveyor_follows and the notice that says one of them finished.
        self._followers: dict[str, list[Callable[[Finished], None]]] = {}
        self._follower_id = secrets.token_hex(8)
        self._told_note = f"f:{self._follower_id}"
        self._followed_any = False
        # The callbacks watching each job (PRG-5): each is one of its followers too (its
        # end comes as any follower's); its steps come here. The jobs whose steps a
        # notice told of, and what kind ("p", "r3", "x2"...), to be read in one call.
        self._watchers: dict[str, list[Callable[[WatchEvent], None]]] = {}
        # The last attempt whose lapse each watched job's watchers were told.
        self._lapse_told: dict[str, int] = {}
        self._stepped: dict[int, list[str]] = {}
        self._reading_steps = False
        # Whether some queue keeps its jobs once acked (RES-3), as last read; None: read
        # it at the next ack (a change of any queue's options, here or told, clears it).
        self._keeping: bool | None = None
        self._side_tasks: set[asyncio.Task[None]] = set()
        # The hearing connection (see the module docstring); None while it is lost.
        self._hearing: Conn | None = None
        self._heard: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None
        self._last: asyncio.Task[Any] | None = None
        self._leading = False
        # Chores of the hearing connection, asked for by the scheduler's timers: exactly
        # one of (timer set, chore asked for) holds for each while it is due.
        self._lead_timer: Handle | None = None
        self._want_lead = False
        self._poll_timer: Handle | None = None
        self._want_poll = False
        self._snapshot: str | None = None
        # Schedules: one timer for the earliest tick to come of every schedule on the
        # database (``_sched_at``); when it fired, the time it fired at (``_fire_at``)
        # while the firing it asks for has not run, or ``_fire_asap`` after a firing that
        # failed (retried at the time it then is); ``_sched_stale``: the earliest tick
        # is to be looked up again (another broker changed a schedule, or notices may
        # have been missed).
        self._sched_timer: Handle | None = None
        self._sched_at: float | None = None
        self._sched_fire_at: float | None = None
        self._fire_at: float | None = None
        self._fire_asap = False
        self._sched_stale = False
        self._firer: asyncio.Task[None] | None = None
        self._fire_queued = False
        self._sched_refresher: asyncio.Task[None] | None = None
        # Whether the first timer was set (``open``): none is set before.
        self._sched_ready = False

    @classmethod
    async def open(
        cls,
        dsn: str,
        scheduler: Scheduler,
        *,
        max_payload_bytes: int,
        rng: random.Random | None = None,
        id_prefix: str | None = None,
        on_failure: Callable[[StoreError], None] = lambda exc: None,
        poll_s: float = 1.0,
        lead_retry_s: float = 1.0,
        reconnect_max_s: float = 2.0,
    ) -> PostgresBackend:
        """Connect to ``dsn``, make or migrate the schema, try to become the leader and
        find the next timed event. ``id_prefix`` is used for a new database only.

        ``poll_s``: the fallback poll's period, ``lead_retry_s``: how often a broker
        that is not the leader tries to become it, both on ``scheduler``'s clock;
        ``reconnect_max_s``: the longest wait between two attempts to make a lost
        connection again (real time). Raises ``StoreError`` (the database cannot be
        reached now: ``Unavailable``)."""
        if id_prefix is None:
            id_prefix = secrets.token_hex(4) + "-"
        try:
            conn: Conn = await connect(dsn)
        except (psycopg.Error, OSError) as exc:
            raise unavailable(f"cannot connect: {exc}") from exc
        backend: PostgresBackend | None = None
        try:
            prefix = await migrate(conn, id_prefix)
            backend = cls(
                conn,
                scheduler,
                prefix,
                dsn=dsn,
                max_payload_bytes=max_payload_bytes,
                rng=random.Random() if rng is None else rng,
                on_failure=on_failure,
                poll_s=poll_s,
                lead_retry_s=lead_retry_s,
                reconnect_max_s=reconnect_max_s,
            )
            await backend._start_hearing()
            backend._arm_timer(await backend._next_event(scheduler.now()))
            # (Set on a later turn: calls made as soon as it is open run before what
            # was due while no broker was there, as on the local backend.)
            scheduler.call_soon(backend._first_sched_timer, await backend._next_schedule())
        except BaseException as exc:
            if backend is not None:
                await backend.close()
            else:
                await close_quietly(conn)
            if isinstance(exc, psycopg.OperationalError | OSError):
                raise unavailable(why(exc)) from exc
            if isinstance(exc, psycopg.Error):
                raise _error(exc) from exc
            raise
        return backend

    # -- plumbing --------------------------------------------------------------------------

    def now(self) -> float:
        return self._scheduler.now()

    def listen(self, listener: Listener) -> None:
        self._listeners.add(listener)

    @property
    def is_leader(self) -> bool:
        """Whether this broker is the one on its database that sweeps (holds the leader
        lock)."""
        return self._leading

    @property
    def available(self) -> bool:
        """Whether the main connection is up (calls raise ``Unavailable`` while not)."""
        return self._main is not None and self.failed is None and not self._closed

    @property
    def _conn(self) -> Conn:
        """The main connection; raises ``Unavailable`` while it is lost."""
        conn = self._main
        if conn is None:
            raise unavailable(self._down or "no connection")
        return conn

    def _check(self) -> None:
        if self.failed is not None:
            raise self.failed
        if self._closed:
            raise StoreError("backend: closed")

    def _fail(self, exc: BaseException) -> StoreError:
        if self.failed is None:
            self.failed = exc if isinstance(exc, StoreError) else _error(exc)
            for timer in (self._timer, self._lead_timer, self._poll_timer, self._sched_timer):
                if timer is not None:
                    timer.cancel()
            self._timer = self._lead_timer = self._poll_timer = self._sched_timer = None
            self._on_failure(self.failed)
        return self.failed

    def _trouble(self, conn: Conn, exc: BaseException) -> StoreError:
        """What ``exc``, raised by a call on ``conn``, makes of the backend and the call:
        a lost connection (made again in the background) and a transaction the server
        gave up on (a deadlock, a cancel, a full disk) are ``Unavailable``; anything else
        fails the backend."""
        if isinstance(exc, OSError) or conn.closed or conn.broken:
            self._lose_main(conn, exc)
            return unavailable(why(exc))
        if isinstance(exc, psycopg.OperationalError):
            return unavailable(why(exc))
        return self._fail(exc)

    async def _call(
        self,
        work: Callable[[float], Awaitable[T]],
        *,
        changes: bool,
        nearest: Callable[[T], float | None] | None = None,
    ) -> T:
        """Run ``work(now)`` on the connection, after every call made before it and any
        sweep the timer asked for; after a change, re-arm the timer for the table's next
        event. The result comes once the work is committed.

        Calls made while others run are run together, in order, in one transaction (one
        commit for them all: a commit's flush to disk is most of what a small call
        costs), up to ``_MAX_CALLS_PER_COMMIT``.

        ``changes=False``: the work brings no event nearer (it reads, or it only takes
        events away or puts them later: a timer that then fires early finds nothing and
        is set again). ``nearest``: the earliest event the work's result says it made,
        so that the table need not be asked (``None``: it made none)."""
        self._check()
        call: _Call[T] = _Call(work, changes, nearest)
        self._calls.append(call)
        runner = self._runner
        if runner is None or runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run_calls())
        return await call.future

    async def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            batch: list[_Call[Any]] = []
            while calls and len(batch) < _MAX_CALLS_PER_COMMIT:
                if calls[0].alone and batch:
                    break
                batch.append(calls.popleft())
                if batch[-1].alone:
                    break
            async with self._lock:
                await self._run_batch(batch)

    async def _run_batch(self, batch: list[_Call[Any]]) -> None:
        """Run ``batch``'s works in one transaction (a work alone: as it is), then tell
        each its result; all fail together if the transaction does."""
        try:
            self._check()
            conn = self._conn
        except StoreError as exc:
            for call in batch:
                call.fail(exc)
            return
        try:
            await self._catch_up()
            now = self.now()
            if len(batch) == 1:
                results = [await batch[0].work(now)]
            else:
                async with conn.transaction():
                    results = [await call.work(now) for call in batch]
        except (psycopg.Error, OSError) as exc:
            problem = self._trouble(conn, exc)
            for call in batch:
                call.fail(problem)
            return
        except Exception as exc:
            if len(batch) == 1:
                batch[0].fail(exc)
                return
            # One work failed and took the others' transaction with it: each alone now,
            # in order, so that only the failing one fails.
            for call in batch:
                await self._run_batch([call])
            return
        ask = False
        for call, result in zip(batch, results, strict=True):
            if not call.changes:
                continue
            at = _ASK if call.nearest is None else call.nearest(result)
            if at == _ASK:
                ask = True
            elif at is not None:
                self._arm_timer(at)
        if ask:
            try:
                self._arm_timer(await self._next_event(now))
            except (psycopg.Error, OSError) as exc:
                problem = self._trouble(conn, exc)
                if not isinstance(problem, Unavailable):
                    for call in batch:
                        call.fail(problem)
                    return
                # The works committed: their results stand. The timer is set again
                # once the connection is back.
        for call, result in zip(batch, results, strict=True):
            call.succeed(result)

    # -- lost connections ------------------------------------------------------------------

    def _lose_main(self, conn: Conn, exc: BaseException) -> None:
        if self._main is not conn:
            return
        self._main = None
        self._down = why(exc)
        log.warning("postgres: lost the connection (%s); making it again", self._down)
        if self._reviver is None or self._reviver.done():
            self._reviver = asyncio.get_running_loop().create_task(self._revive(conn))

    async def _revive(self, lost: Conn) -> None:
        """Make the main connection again, with a bounded backoff; then tell listeners
        that work may be waiting (calls failed meanwhile, claims among them) and set the
        timer again."""
        await close_quietly(lost)
        delay = _RECONNECT_FIRST_S
        while not self._closed:
            try:
                conn = await connect(self._dsn)
            except (psycopg.Error, OSError) as exc:
                self._down = f"cannot connect: {why(exc)}"
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._reconnect_max_s)
                continue
            if self._closed:
                await close_quietly(conn)
                return
            self._main = conn
            self._own_pid = conn.info.backend_pid
            self._down = None
            log.warning("postgres: connected again")
            self._listeners.work_waiting(None)
            self._refresh_timer()
            return

    def _atomic(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A transaction around statements that must commit together, unless the call
        runs in one already (a batch's): then that one."""
        conn = self._conn
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            return contextlib.nullcontext()
        return conn.transaction()

    def _id(self, seq: int) -> str:
        return f"{self.id_prefix}{seq:x}"

    def _seq(self, job_id: object) -> int | None:
        """The seq an id names, or ``None``: only the canonical form the engine writes
        (lowercase hex, no leading zero) names a job, as in the engine."""
        prefix = self.id_prefix
        if not isinstance(job_id, str) or not job_id.startswith(prefix):
            return None
        digits = job_id[len(prefix) :]
        if not 0 < len(digits) <= 32 or digits[0] == "0" or digits.strip(_HEX_DIGITS):
            return None
        seq = int(digits, 16)
        return seq if seq <= _SEQ_MAX else None

    # -- other brokers, the leader lock, the fallback poll ---------------------------------

    async def _start_hearing(self) -> None:
        """Make the hearing connection, try to become the leader, and hear from then on
        (making the connection again whenever it is lost)."""
        hearing = await self._listen()
        self._hearing = hearing
        await self._try_lead(hearing)
        await self._poll(hearing)
        self._heard = asyncio.get_running_loop().create_task(self._hear_forever())

    async def _listen(self) -> Conn:
        hearing = await connect(self._dsn)
        try:
            await hearing.execute("LISTEN conveyor")
        except BaseException:
            await close_quietly(hearing)
            raise
        return hearing

    async def _hear_forever(self) -> None:
        delay = _RECONNECT_FIRST_S
        while not self._closed:
            hearing = self._hearing
            if hearing is None:
                try:
                    hearing = await self._listen()
                except (psycopg.Error, OSError):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._reconnect_max_s)
                    continue
                if self._closed:
                    await close_quietly(hearing)
                    return
                delay = _RECONNECT_FIRST_S
                self._hearing = hearing
                self._snapshot = None
                log.warning("postgres: hearing other brokers again")
                # Notices sent while the connection was lost are lost with it.
                self._opts.clear()
                self._keeping = None
                self._listeners.work_waiting(None)
                self._refresh_timer()
            try:
                await self._hear(hearing)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # (any: hearing must go on whatever broke it)
                if self._closed:
                    return
                log.warning("postgres: no longer hearing other brokers (%s)", why(exc))
                self._hearing = None
                if self._leading:
                    self._leading = False
                    log.warning("postgres: no longer the leader")
                if self._lead_timer is not None:
                    self._lead_timer.cancel()
                    self._lead_timer = None
                self._want_lead = True  # at once, when connected again
                await close_quietly(hearing)

    async def _hear(self, hearing: Conn) -> None:
        """Tell listeners what the notices say, and do the chores the timers asked for,
        until the connection fails (raises) or the backend closes."""
        while not self._closed:
            async for note in hearing.notifies(timeout=_HEAR_TICK_S):
                self._heard_note(note)
            if self._want_lead and not self._closed:
                self._want_lead = False
                await self._try_lead(hearing)
            if self._want_poll and not self._closed:
                self._want_poll = False
                await self._poll(hearing)

    def _heard_note(self, note: psycopg.Notify) -> None:
        if note.payload == self._told_note:
            # A job this broker follows finished, here or on another broker (RES-7).
            self._background(self._take_finished())
            return
        kind, _, what = note.payload.partition(":")
        if note.pid == self._own_pid and not (kind == "g" and what.rpartition(":")[2][:1] == "x"):
            # This backend's own change: its call told the listeners. (A claim of its own
            # that took a job again cannot: the trigger knows what it reclaimed.)
            return
        if kind == "g":
            # A job this broker follows made a step on another broker, or was taken
            # again by a claim of any broker after its lease ran out (PRG-8).
            broker, _, rest = what.partition(":")
            seq_text, _, step = rest.partition(":")
            if broker == self._follower_id and seq_text.isascii() and seq_text.isdigit():
                self._stepped.setdefault(int(seq_text), []).append(step)
                if not self._reading_steps:
                    self._reading_steps = True
                    self._background(self._read_steps())
            return
        if kind == "w":
            # (A timed event it brought is told as "t:"; one from a retry's delay or an
            # enqueue in an application's transaction is found by the poll.)
            self._listeners.work_waiting(frozenset([what]))
        elif kind == "t":
            try:
                at = float(what)
            except ValueError:
                return
            if math.isfinite(at):
                self._arm_timer(at)  # another broker's enqueue made an event for then
        elif kind == "c" and what.isascii() and what.isdigit():
            self._listeners.cancelled([self._id(int(what))])
        elif kind == "q":
            self._opts.pop(what, None)  # its options changed: read them again when used
            self._keeping = None
        elif kind == "s":
            # Another broker made, changed, paused, resumed or deleted a schedule: the
            # earliest tick to come may have changed. A tick told is armed for at once
            # (as "t:"); otherwise the table is asked.
            try:
                tick = float(what) if what else math.nan
            except ValueError:
                tick = math.nan
            if math.isfinite(tick):
                self._sched_earlier(tick)
            else:
                self._sched_refresh()

    async def _try_lead(self, hearing: Conn) -> None:
        """Take the leader lock if it is free; if not, try again in ``lead_retry_s``."""
        if self._leading:
            return
        cur = await hearing.execute("SELECT pg_try_advisory_lock(%s)", (_LEADER_LOCK,))
        row = await cur.fetchone()
        if row is not None and row[0]:
            self._leading = True
            log.info("postgres: this broker is the leader (it sweeps)")
            self._refresh_timer()  # the leader's timer waits for more events
        elif not self._closed and self.failed is None:
            self._lead_timer = self._scheduler.call_at(
                self.now() + self._lead_retry_s, self._on_lead_timer
            )

    def _on_lead_timer(self) -> None:
        self._lead_timer = None
        self._want_lead = True

    async def _poll(self, hearing: Conn) -> None:
        """The fallback poll: if any transaction ended since the last poll, the table
        may have changed without a notice."""
        cur = await hearing.execute("SELECT pg_current_snapshot()::text")
        row = await cur.fetchone()
        snapshot = None if row is None else str(row[0])
        if self._snapshot is not None and snapshot != self._snapshot:
            self._listeners.work_waiting(None)
            self._refresh_timer()
            if self._followers:  # (a notice missed while the hearing one was down)
                self._background(self._take_finished())
        self._snapshot = snapshot
        if not self._closed and self.failed is None:
            self._poll_timer = self._scheduler.call_at(
                self.now() + self._poll_s, self._on_poll_timer
            )

    def _on_poll_timer(self) -> None:
        self._poll_timer = None
        self._want_poll = True

    def _refresh_timer(self) -> None:
        """Look up the next timed event again soon (once for a burst of news)."""
        if self._closed or self.failed is not None:
            return
        self._sched_refresh()  # (its notices may have been missed too)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._refresh_now())

    async def _refresh_now(self) -> None:
        try:
            await self._call(lambda now: _nothing(), changes=True)
        except StoreError:
            pass  # unavailable (looked up again once connected) or failed (on_failure told)

    # -- time ------------------------------------------------------------------------------

    async def _next_event(self, now: float) -> float | None:
        query = _NEXT_EVENT if self._leading else _NEXT_CLAIMABLE
        cur = await self._conn.execute(query, {"now": now})
        row = await cur.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _arm_timer(self, at: float | None, *, sweep_now: bool = True) -> None:
        if at is not None and sweep_now and self._due_at is None and at <= self.now():
            # Due already: the sweep is at this time, whenever the timer's callback runs.
            self._due_at = self.now()
        if self._timer is not None and self._timer_at is not None:
            if at is not None and self._timer_at <= at:
                return  # the timer set fires no later than needed; an early one re-arms
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None and not self._closed and self.failed is None:
            self._timer = self._scheduler.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed or self.failed is not None:
            return
        if self._due_at is None:
            self._due_at = self.now()
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_when_due())
        # Which queues gained claimable jobs is not known without asking each one.
        self._listeners.work_waiting(None)

    async def _sweep_when_due(self) -> None:
        try:
            await self._call(lambda now: _nothing(), changes=False)
        except StoreError:
            pass  # unavailable (swept once connected) or failed (on_failure was told)

    async def _catch_up(self) -> None:
        """The leader sweeps at the time the timer fired, then at each later event
        already passed, in time order: what sweeping at each event as it came would have
        done. Another broker only sets its timer again."""
        at = self._due_at
        if at is None:
            return
        self._due_at = None
        try:
            if not self._leading:
                self._arm_timer(await self._next_event(self.now()), sweep_now=False)
                return
            while True:
                await self._sweep_at(at)
                nxt = await self._next_event(at)
                if nxt is not None and at < nxt <= self.now():
                    at = nxt
                    continue
                self._arm_timer(nxt, sweep_now=False)
                return
        except BaseException:
            if self._due_at is None:
                self._due_at = at  # not done: the next call does it (a sweep is idempotent)
            raise

    async def _sweep_at(self, now: float) -> SweepResult:
        conn = self._conn
        async with conn.transaction():
            counts = []
            for statement, params in (
                (_SWEEP_EXPIRED, {"now": now, "error": EXPIRED}),
                (_SWEEP_USED_UP, {"now": now, "error": MAX_ATTEMPTS_EXCEEDED}),
                (_SWEEP_RETENTION, {"now": now}),
                (_SWEEP_COMPLETED, {"now": now}),
            ):
                cur = await conn.execute(statement, params)
                row = await cur.fetchone()
                counts.append(0 if row is None else int(row[0]))
            counts[2] += counts.pop()  # (kept completed jobs let go count as purged)
            # The counters' deltas are folded here too, so that they stay few whether
            # or not anyone asks for stats.
            await self._fold(None)
            # Queues under flow control have their keys brought up to this time: a job
            # matured or a lease lapsed now takes its key's turn now (FLW-5).
            cur = await conn.execute(_FLOWING, {"now": now})
            for (queue,) in await cur.fetchall():
                cur = await conn.execute(_FLOW_LOCK_SQL, (queue,))
                row = await cur.fetchone()
                if row is not None and row[0]:
                    await conn.execute("SELECT conveyor_flow_settle(%s, %s)", (queue, now))
        return SweepResult(*counts)

    async def _fold(self, names: list[str] | None) -> None:
        await self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_FOLD_LOCK,))
        await self._conn.execute(_FOLD, {"names": names})

    # -- schedules: when they fire ---------------------------------------------------------

    async def _next_schedule(self) -> float | None:
        cur = await self._conn.execute(_NEXT_SCHEDULE)
        row = await cur.fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def _set_sched_timer(
        self, at: float | None, fire_at: float | None = None, *, at_now: bool = False
    ) -> None:
        """Set the schedules' timer for ``at`` (``None``: no tick to come), in place of
        the one set. When it fires, it fires the schedules due at ``fire_at`` (by
        default ``at``; with ``at_now``, the time it fires at).

        A broker that is up fires each tick at the tick's time, however late its timer
        runs (a stepped clock's jump, a busy loop): a tick is missed (``fire``'s
        policies) only when no broker was there to fire it, that is at a broker's start
        and after a firing cut off by a lost connection, which fire at the time it is."""
        if self._sched_timer is not None:
            self._sched_timer.cancel()
        self._sched_timer = None
        self._sched_at = at
        self._sched_fire_at = None if at_now else at if fire_at is None else fire_at
        if at is not None and not self._closed and self.failed is None:
            self._sched_timer = self._scheduler.call_at(at, self._on_sched_timer)

    def _first_sched_timer(self, at: float | None) -> None:
        self._sched_ready = True
        if at is not None and at <= self.now():
            # Due while no broker was there: fired at the time it is, by its policy.
            self._set_sched_timer(at, at_now=True)
        else:
            self._sched_earlier(at)  # (a schedule set meanwhile may have set it)
        if self._sched_stale:
            self._sched_refresh()  # (news heard since ``at`` was read)

    def _sched_earlier(self, at: float | None) -> None:
        """A schedule of this broker's now fires next at ``at``: the timer fires no later.
        (One set too early only looks, finds nothing due and is set again.)"""
        if at is not None and (
            self._sched_timer is None or self._sched_at is None or at < self._sched_at
        ):
            self._set_sched_timer(at)

    def _on_sched_timer(self) -> None:
        self._sched_timer = None
        self._sched_at = None
        if self._closed or self.failed is not None:
            return
        when = self.now() if self._sched_fire_at is None else self._sched_fire_at
        self._sched_fire_at = None
        self._fire_at = when if self._fire_at is None else min(self._fire_at, when)
        self._queue_firing()
        # The jobs due are made before any call made from now on (the firing is queued
        # first), so a claim made on this news finds them; which queues they are on is
        # not known without asking the table.
        self._listeners.work_waiting(None)

    def _queue_firing(self) -> None:
        """Queue, as the next call, what the schedules' timer or a notice asked for (a
        call of its own: calls made before it run first, those made after it see what
        it fired)."""
        if self._fire_queued or self._closed or self.failed is not None:
            return
        self._fire_queued = True
        call: _Call[None] = _Call(self._fire_work, False, None, alone=True)
        self._calls.append(call)
        runner = self._runner
        if runner is None or runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run_calls())
        self._firer = asyncio.get_running_loop().create_task(self._fired(call))

    def _sched_refresh(self) -> None:
        """Look up the earliest tick again soon, and fire now what a firing cut off by a
        lost connection left (once for a burst of news)."""
        if self._closed or self.failed is not None:
            return
        self._sched_stale = True
        if self._sched_refresher is None or self._sched_refresher.done():
            self._sched_refresher = asyncio.get_running_loop().create_task(
                self._sched_refresh_now()
            )

    async def _sched_refresh_now(self) -> None:
        async def work(now: float) -> None:
            if self._fire_asap:
                self._queue_firing()
            elif self._sched_stale:
                await self._look_again()

        try:
            await self._call(work, changes=False)
        except StoreError:
            pass  # unavailable (looked up again once connected) or failed (on_failure told)

    async def _look_again(self) -> None:
        """Set the schedules' timer from the table's earliest tick."""
        if not self._sched_ready:
            return  # (the first timer is still to be set: it looks again then)
        self._sched_stale = False
        try:
            nxt = await self._next_schedule()
        except BaseException:
            self._sched_stale = True
            raise
        # (One due already while a timer is set: that timer is a look again at a
        # schedule another broker holds, or fires at once; it stays.)
        if nxt is None or nxt > self.now() or self._sched_timer is None:
            self._set_sched_timer(nxt)

    async def _fire_work(self, now: float) -> None:
        self._fire_queued = False
        await self._fire_when_due()

    async def _fired(self, call: _Call[None]) -> None:
        try:
            await call.future
        except StoreError:
            # Unavailable: fired at the time it is once connected (or failed:
            # on_failure was told).
            self._fire_at = None
            self._fire_asap = True

    async def _fire_when_due(self) -> None:
        """Fire the schedules due at the time the timer asked for (``_set_sched_timer``
        says which), then at each later tick the clock has already passed, in time order
        (what a timer set for each would have done); then set the timer for the earliest
        tick to come. A firing cut off by a lost connection is done again at the time it
        is once the connection is back (its ticks then missed or not by their policy);
        what it committed stands, and what it did not left the schedules as they were,
        so no tick fires twice."""
        at = self._fire_at
        if at is None and self._fire_asap:
            at = self.now()
        if at is None:
            if self._sched_stale:
                await self._look_again()
            return
        self._fire_at = None
        self._fire_asap = False
        self._sched_stale = False
        touched: set[str] = set()
        try:
            passes = 1
            while True:
                await self._fire_at_time(at, touched)
                nxt = await self._next_schedule()
                if nxt is not None and nxt <= at:
                    # Due, yet passed over: another broker holds it, firing it (its
                    # commit moves it on). Look again shortly, in case that one fails,
                    # as at this time: what is then due was due now (a look at the time
                    # it then is would take its tick for a missed one).
                    self._set_sched_timer(max(at, self.now()) + _HELD_RETRY_S, fire_at=at)
                    return
                if nxt is not None and nxt <= self.now():
                    passes += 1
                    at = nxt if passes < _MAX_FIRE_PASSES else self.now()
                    continue
                self._set_sched_timer(nxt)
                return
        except (psycopg.Error, OSError):
            self._fire_asap = True
            self._sched_stale = True
            raise
        except Exception:
            # A bug: the calls go on; the schedules are tried again later.
            log.exception("postgres: firing schedules failed")
            self._set_sched_timer(self.now() + _FIRE_FAILED_RETRY_S)
        finally:
            if touched:
                self._listeners.work_waiting(frozenset(touched))

    async def _fire_at_time(self, now: float, touched: set[str]) -> None:
        """Fire every schedule due at ``now`` that no other broker is firing, a batch per
        transaction: the rows locked, each one's ticks (``fire``) enqueued as any
        enqueue is (keyed by ``tick_key``: the same tick never makes two live jobs), and
        each one's next tick, last job and count written, all in one commit. Adds to
        ``touched`` the queues that got jobs."""
        conn = self._conn
        while True:
            events: list[float] = []
            async with conn.transaction():
                cur = await conn.execute(_DUE_SCHEDULES, {"now": now, "n": _FIRE_BATCH})
                rows = await cur.fetchall()
                if not rows:
                    return
                infos = [_schedule_info(row) for row in rows]
                payloads = [RawJSON(bytes(row[2])) for row in rows]
                opts = await self._queues([info.spec.queue for info in infos])
                jobs: list[tuple[str, tuple[Any, ...], float]] = []
                made: list[tuple[int, float]] = []  # (which schedule, which tick) per job
                nexts: list[float | None] = []
                for index, info in enumerate(infos):
                    spec = info.spec
                    assert info.next_at is not None
                    ticks, nxt = fire(spec, info.next_at, now)
                    nexts.append(nxt)
                    for tick in ticks:
                        job = _schedule_job(spec, payloads[index], tick_key(spec.id, tick))
                        try:
                            jobs.append(self._resolve(spec.queue, opts[spec.queue], job))
                        except InvalidArgument as exc:
                            # The queue's options changed since the schedule was set, so
                            # that its jobs' options no longer pass (an enqueue of them
                            # would be refused too): this tick makes no job.
                            log.warning(
                                "schedule %r: its job of %s was refused: %s", spec.id, tick, exc
                            )
                            continue
                        made.append((index, tick))
                ids = await self._insert(now, jobs, events) if jobs else []
                counts = [0] * len(infos)
                last_at: list[float | None] = [None] * len(infos)
                last_job: list[str | None] = [None] * len(infos)
                for (index, tick), job_id in zip(made, ids, strict=True):
                    counts[index] += 1
                    last_at[index] = tick
                    last_job[index] = job_id
                    touched.add(infos[index].spec.queue)
                await conn.execute(
                    _FIRED,
                    ([info.spec.id for info in infos], nexts, last_at, last_job, counts),
                    prepare=False,
                )
            if events:
                self._arm_timer(min(events))
            if len(rows) < _FIRE_BATCH:
                return

    # -- queues ----------------------------------------------------------------------------

    async def _queues(self, names: Sequence[str]) -> dict[str, QueueOpts]:
        """Make the queues of ``names`` that do not exist (with the plain defaults, as
        the engine makes a queue on first use) and give each one's options."""
        known = self._opts
        try:
            return {name: known[name] for name in names}
        except KeyError:
            pass  # one not seen yet (or changed since): ask the table
        conn = self._conn
        plain = QueueOpts()
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        await conn.execute(
            _ADD_QUEUES,
            {
                "names": wanted,
                "vis": plain.visibility_timeout_s,
                "attempts": plain.max_attempts,
                "base": plain.backoff_base_s,
                "cap": plain.backoff_max_s,
                "expires": plain.expires_s,
                "retention": plain.dead_letter_retention_s,
            },
        )
        cur = await conn.execute(
            f"SELECT {_QUEUE_OPTS} FROM conveyor_queues WHERE name = ANY(%s::text[])",
            (wanted,),
        )
        found = {row[0]: _opts(row) for row in await cur.fetchall()}
        if len(known) < _MAX_KNOWN_QUEUES:
            known.update(found)
        return found

    def _known_opts(self, names: Sequence[str]) -> bool:
        """Whether every queue of ``names`` has its options remembered (``_opts``)."""
        known = self._opts
        return all(name in known for name in names)

    async def _known(self, names: Sequence[str]) -> set[str]:
        cur = await self._conn.execute(
            "SELECT name FROM conveyor_queues WHERE name = ANY(%s::text[])", (list(names),)
        )
        return {row[0] for row in await cur.fetchall()}

    # -- the interface: each call runs in call order, its result a task --------------

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task; tasks take the connection in the order they were made
        (each one's first wait is for the lock), so calls take effect in call order."""
        try:
            self._check()
        except StoreError:
            work.close()
            raise
        task = asyncio.get_running_loop().create_task(work)
        self._last = task
        return task

    def enqueue(self, jobs: Sequence[Enqueue]) -> asyncio.Task[list[str | Exception]]:
        return self._spawn(self._enqueue(jobs))

    def enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> asyncio.Task[list[str]]:
        return self._spawn(self._enqueue_all(queue, jobs))

    def enqueue_group(self, jobs: Sequence[Enqueue]) -> asyncio.Task[list[str]]:
        return self._spawn(self._enqueue_group(jobs))

    def dependency_results(
        self, job_id: str
    ) -> asyncio.Task[list[tuple[str, bytes | None]] | None]:
        return self._spawn(self._dependency_results(job_id))

    def claim(
        self, claims: Sequence[Claim], *, round_robin: bool = False
    ) -> asyncio.Task[list[list[Claimed]]]:
        return self._spawn(self._claim(claims, round_robin))

    def claim_bound(self, queue: str) -> int | None:
        return None  # (the table is shared: counting its ready rows is a query)

    def ack(
        self,
        leases: Sequence[tuple[str, str]],
        results: Sequence[bytes | None] | None = None,
    ) -> asyncio.Task[list[bool]]:
        return self._spawn(self._ack(leases, results))

    def follow(
        self, ids: Sequence[str], on_finished: Callable[[Finished], None]
    ) -> asyncio.Task[list[Finished | None]]:
        return self._spawn(self._follow(ids, on_finished))

    def unfollow(self, ids: Sequence[str], on_finished: Callable[[Finished], None]) -> None:
        gone = [job_id for job_id in ids if self._drop_follower(job_id, on_finished)]
        seqs = [seq for job_id in gone if (seq := self._seq(job_id)) is not None]
        if seqs and not self._closed and self.failed is None:
            self._background(self._unfollow_rows(seqs))

    def progress(self, items: Sequence[Progress]) -> asyncio.Task[list[bool | InvalidArgument]]:
        return self._spawn(self._progress(items))

    def watch(
        self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]
    ) -> asyncio.Task[list[Job | Finished]]:
        return self._spawn(self._watch(ids, on_event))

    def unwatch(self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]) -> None:
        for job_id in ids:
            self._drop_watcher(job_id, on_event)
        self.unfollow(ids, on_event)

    def _drop_watcher(self, job_id: str, on_event: Callable[[WatchEvent], None]) -> None:
        """Take ``on_event`` off ``job_id``'s watchers (if it is one)."""
        callbacks = self._watchers.get(job_id)
        if callbacks is not None and on_event in callbacks:
            callbacks.remove(on_event)
            if not callbacks:
                del self._watchers[job_id]
                self._lapse_told.pop(job_id, None)

    def report(self, reports: Sequence[Report]) -> asyncio.Task[list[bool | InvalidArgument]]:
        return self._spawn(self._report(reports))

    def heartbeat(self, leases: Sequence[tuple[str, str]]) -> asyncio.Task[list[bool]]:
        return self._spawn(self._heartbeat(leases))

    def lapse(self, leases: Sequence[tuple[str, str]]) -> asyncio.Task[list[bool]]:
        return self._spawn(self._lapse(leases))

    def reattach(
        self, worker_id: str, leases: Sequence[tuple[str, str]]
    ) -> asyncio.Task[list[tuple[str, str]]]:
        return self._spawn(self._reattach(worker_id, leases))

    def announce(
        self, broker_id: str, info: dict[str, Any], ttl_s: float
    ) -> asyncio.Task[list[dict[str, Any]]]:
        return self._spawn(self._announce(broker_id, info, ttl_s))

    def held_leases(self, worker_id: str | None = None) -> asyncio.Task[list[tuple[str, str, str]]]:
        return self._spawn(self._held_leases(worker_id))

    def cancel(self, ids: Sequence[str]) -> asyncio.Task[list[bool]]:
        return self._spawn(self._cancel(ids))

    def get_jobs(self, ids: Sequence[str]) -> asyncio.Task[list[Job | None]]:
        return self._spawn(self._get_jobs(ids))

    def set_queue(self, name: str, opts: QueueOpts | None = None) -> asyncio.Task[None]:
        return self._spawn(self._set_queue(name, opts))

    def queues(self) -> asyncio.Task[list[str]]:
        return self._spawn(self._queues_made())

    def pause(self, queue: str) -> asyncio.Task[None]:
        return self._spawn(self._pause(queue))

    def resume(self, queue: str) -> asyncio.Task[bool]:
        return self._spawn(self._resume(queue))

    def redrive(self, ids: Sequence[str]) -> asyncio.Task[list[bool]]:
        return self._spawn(self._redrive(ids))

    def purge_dead(self, queue: str) -> asyncio.Task[int | None]:
        return self._spawn(self._purge_dead(queue))

    def dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> asyncio.Task[list[Job]]:
        return self._spawn(self._dead_jobs(queue, offset, limit))

    def list_jobs(
        self,
        queue: str,
        state: str,
        after: tuple[Any, ...] | None = None,
        limit: int = 50,
        search: str | None = None,
    ) -> asyncio.Task[JobList | None]:
        return self._spawn(self._list_jobs(queue, state, after, limit, search))

    def redrive_all(self, queue: str) -> asyncio.Task[int | None]:
        return self._spawn(self._redrive_all(queue))

    def stats(self, queues: Sequence[str] | None = None) -> asyncio.Task[dict[str, QueueStats]]:
        return self._spawn(self._stats(queues))

    def set_limits(self, name: str, limits: Limits) -> asyncio.Task[None]:
        return self._spawn(self._set_limits(name, limits))

    def back_off(self, items: Sequence[BackOff]) -> asyncio.Task[list[bool | InvalidArgument]]:
        return self._spawn(self._back_off(items))

    async def _set_limits(self, name: str, limits: Limits) -> None:
        """FLW-1: the queue's limits replaced, from the next claim of any broker on; its
        buckets start afresh (FLW-9), its back-offs stand (as in the engine)."""
        guard.queue_name(name)
        checked = guard.check_limits(limits)

        async def work(now: float) -> None:
            conn = self._conn
            async with conn.transaction():
                await self._queues([name])
                await self._flow_lock(name)
                if checked.any:
                    await conn.execute("SELECT conveyor_flow_on(%s)", (name,))
                await conn.execute(
                    _SET_LIMITS, {"q": name, "any": checked.any, **_limit_row(checked)}
                )
                # Limits raised may let waiting jobs go: every broker's workers are told.
                await conn.execute("SELECT pg_notify('conveyor', 'w:' || %s)", (name,))

        await self._call(work, changes=True)
        self._listeners.work_waiting(frozenset([name]))

    async def _flow_lock(self, queue: str) -> None:
        """Take ``queue``'s flow lock for this transaction; raises ``_OutOfOrder`` when an
        earlier call of the batch took a lock that comes later in the locks' order and
        another transaction holds this one (the batch then runs each call alone)."""
        cur = await self._conn.execute(_FLOW_LOCK_SQL, (queue,))
        row = await cur.fetchone()
        if row is None or not row[0]:
            raise _OutOfOrder(queue)

    async def _back_off(self, items: Sequence[BackOff]) -> list[bool | InvalidArgument]:
        """FLW-6, on each item in order: its job back to ready, its attempt given back,
        and its key (or queue) held until now plus its delay, never sooner than a
        back-off already in force."""
        checked: list[tuple[BackOff, float, str | None, bool] | InvalidArgument] = []
        for item in items:
            try:
                whole = item.whole_queue
                if not isinstance(whole, bool):
                    raise InvalidArgument(
                        "whole_queue", f"must be a bool, got {type(whole).__name__}"
                    )
                delay = guard.nonneg("delay_s", item.delay_s)
                part = guard.key(item.partition, "partition")
            except InvalidArgument as exc:
                checked.append(exc)
                continue
            checked.append((item, delay, part, whole))
        seqs = sorted(
            {
                seq
                for entry in checked
                if not isinstance(entry, InvalidArgument)
                and (seq := self._seq(entry[0].id)) is not None
            }
        )
        touched: set[str] = set()
        untils: list[float] = []
        # The jobs backed off: (seq, the attempt given back) (PRG-5).
        backed_attempts: list[tuple[int, int]] = []

        async def work(now: float) -> list[bool | InvalidArgument]:
            conn = self._conn
            results: list[bool | InvalidArgument] = []
            backed_attempts.clear()
            async with conn.transaction():
                rows: dict[int, list[Any]] = {}
                if seqs:
                    cur = await conn.execute(_BACKING_OFF, (seqs,))
                    rows = {row[0]: list(row) for row in await cur.fetchall()}
                backed: list[int] = []
                holds: dict[tuple[str, str], float] = {}
                for entry in checked:
                    if isinstance(entry, InvalidArgument):
                        results.append(entry)
                        continue
                    item, delay, part, whole = entry
                    seq = self._seq(item.id)
                    row = rows.get(seq) if seq is not None else None
                    # row: seq queue state lease deadline partition
                    if (
                        row is None
                        or row[2] != "processing"
                        or row[3] != item.lease
                        or not now < row[4]
                    ):
                        results.append(False)
                        continue
                    row[2] = "pending"  # (a second back-off of the lease in the batch: False)
                    backed.append(row[0])
                    backed_attempts.append((row[0], row[6]))
                    key = "" if whole else part if part is not None else row[5]
                    until = now + delay
                    if holds.get((row[1], key), -math.inf) < until:
                        holds[(row[1], key)] = until
                    touched.add(row[1])
                    results.append(True)
                if backed:
                    await conn.execute(_BACK_OFF_JOBS, (backed,), prepare=False)
                    await conn.execute(
                        _STEPPED_NOTICE,
                        (
                            [seq for seq, _ in backed_attempts],
                            [f"b{n}" for _, n in backed_attempts],
                        ),
                    )  # (PRG-8)
                if holds:
                    cur = await conn.execute(
                        _FLOW_LOCK_ORDER, (sorted({queue for queue, _ in holds}),)
                    )
                    for (queue,) in await cur.fetchall():
                        await self._flow_lock(queue)
                        # A queue that starts to flow has its keys read; the news
                        # are folded first, so that a key's turn is the one its jobs
                        # gave it, and this back-off's own job counts as come back.
                        await conn.execute("SELECT conveyor_flow_on(%s)", (queue,))
                        await conn.execute("SELECT conveyor_flow_news(%s, %s)", (queue, now))
                    await conn.execute(
                        _HOLD_PARTS,
                        (
                            [queue for queue, _ in holds],
                            [key for _, key in holds],
                            list(holds.values()),
                        ),
                        prepare=False,
                    )
                    untils.extend(holds.values())
                    # The other brokers' timers fire when the hold ends: their workers
                    # may be the ones waiting for it.
                    await conn.execute(
                        "SELECT pg_notify('conveyor', %s)", (f"t:{min(holds.values())!r}",)
                    )
            return results

        # The job is ready again (another key's, or this one's later, may be claimable).
        results = await self._call(work, changes=True, nearest=lambda _: min(untils, default=None))
        if touched:
            self._listeners.work_waiting(frozenset(touched))
        if self._watchers:
            for seq, attempt in backed_attempts:
                self._tell_step(Step(self._id(seq), "retry", attempt, None, "backed_off", None))
        return results

    def sweep(self) -> asyncio.Task[SweepResult]:
        return self._spawn(self._sweep())

    # -- schedules: the calls (SCH-1 on) ---------------------------------------------------

    def set_schedule(self, spec: ScheduleSpec) -> asyncio.Task[ScheduleInfo]:
        return self._spawn(self._set_schedule(spec))

    def delete_schedule(self, schedule_id: str) -> asyncio.Task[bool]:
        return self._spawn(self._delete_schedule(schedule_id))

    def pause_schedule(self, schedule_id: str, paused: bool) -> asyncio.Task[ScheduleInfo | None]:
        return self._spawn(self._pause_schedule(schedule_id, paused))

    def run_schedule(self, schedule_id: str) -> asyncio.Task[str | None]:
        return self._spawn(self._run_schedule(schedule_id))

    def schedules(
        self, ids: Sequence[str] | None = None, after: str | None = None, limit: int = 100
    ) -> asyncio.Task[list[ScheduleInfo]]:
        return self._spawn(self._schedules(ids, after, limit))

    async def _opts_of(self, name: str) -> QueueOpts:
        """Queue ``name``'s options (the plain ones for a queue not made yet), making
        nothing."""
        known = self._opts.get(name)
        if known is not None:
            return known
        cur = await self._conn.execute(
            f"SELECT {_QUEUE_OPTS} FROM conveyor_queues WHERE name = %s", (name,)
        )
        row = await cur.fetchone()
        return QueueOpts() if row is None else _opts(row)

    async def _locked_schedule(self, schedule_id: str) -> tuple[ScheduleInfo, bytes] | None:
        """The schedule and its payload's bytes, its row locked until the transaction
        ends (a firing of it by another broker finishes first, or waits)."""
        cur = await self._conn.execute(
            f"SELECT {_SCHEDULE_COLUMNS} FROM conveyor_schedules WHERE id = %s FOR UPDATE",
            (schedule_id,),
        )
        row = await cur.fetchone()
        return None if row is None else (_schedule_info(row), bytes(row[2]))

    async def _told(self, next_at: float | None) -> None:
        """Tell the other brokers, at the commit, that a schedule changed: of its next
        tick, for which they set their timers at once; of none (paused), and they look up
        their earliest tick again."""
        what = "" if next_at is None else repr(next_at)
        await self._conn.execute("SELECT pg_notify('conveyor', %s)", (f"s:{what}",))

    async def _set_schedule(self, spec: ScheduleSpec) -> ScheduleInfo:
        """SCH-1, SCH-5: the timing checked (``check_timing``), then the jobs' options and
        payload as an enqueue checks them, against the queue's options (the plain ones
        for a queue it makes). A new schedule fires next at its first tick after now; a
        change that keeps the timing keeps the progress, one that changes it (or a
        resume) fires next at the new timing's first tick after now; a paused one has no
        next tick."""
        if not isinstance(spec, ScheduleSpec):
            raise InvalidArgument("spec", "must be a ScheduleSpec")
        check_timing(spec)
        guard.queue_name(spec.queue)

        async def work(now: float) -> ScheduleInfo:
            nonlocal spec
            conn = self._conn
            async with conn.transaction():
                opts = await self._opts_of(spec.queue)
                _, resolved, _ = self._resolve(
                    spec.queue, opts, _schedule_job(spec, spec.payload, None)
                )
                # What is kept, and shown, is the JSON value the jobs carry (SCH-1).
                try:
                    spec = dataclasses.replace(spec, payload=json.loads(resolved[0]))
                except ValueError:
                    raise InvalidArgument(
                        "payload", "RawJSON does not hold one JSON value"
                    ) from None
                kept = await self._locked_schedule(spec.id)
                old = None if kept is None else kept[0]
                # The same definition again changes nothing, its times neither (SCH-5).
                # (The payloads' bytes too: 1 == True == 1.0 in Python, not in JSON.)
                if kept is not None and kept[0].spec == spec and kept[1] == resolved[0]:
                    return kept[0]
                await self._queues([spec.queue])
                next_at = next_when_set(
                    None if old is None else old.spec,
                    None if old is None else old.next_at,
                    spec,
                    now,
                )
                info = ScheduleInfo(
                    spec=spec,
                    next_at=next_at,
                    last_at=None if old is None else old.last_at,
                    last_job=None if old is None else old.last_job,
                    fired=0 if old is None else old.fired,
                    created_at=now if old is None else old.created_at,
                    updated_at=now,
                )
                await conn.execute(
                    _PUT_SCHEDULE,
                    {
                        "id": spec.id,
                        "queue": spec.queue,
                        "payload": resolved[0],
                        "spec": Jsonb({name: getattr(spec, name) for name in _SPEC_FIELDS}),
                        "paused": spec.paused,
                        "next_at": next_at,
                        "last_at": info.last_at,
                        "last_job": info.last_job,
                        "fired": info.fired,
                        "created_at": info.created_at,
                        "updated_at": now,
                    },
                )
                await self._told(next_at)
            return info

        info = await self._call(work, changes=False)
        self._sched_earlier(info.next_at)
        return info

    async def _delete_schedule(self, schedule_id: str) -> bool:
        if not isinstance(schedule_id, str):
            return False

        async def work(now: float) -> bool:
            cur = await self._conn.execute(
                "WITH d AS (DELETE FROM conveyor_schedules WHERE id = %s RETURNING id) "
                "SELECT id, pg_notify('conveyor', 's:') FROM d",
                (schedule_id,),
            )
            return bool(await cur.fetchall())

        # (The timer, if it was set for this one, fires early, finds nothing, is set again.)
        return await self._call(work, changes=False)

    async def _pause_schedule(self, schedule_id: str, paused: bool) -> ScheduleInfo | None:
        """SCH-6: paused, no next tick; resumed, the first tick after now. Pausing a
        paused schedule, or resuming a running one, changes nothing."""
        if not isinstance(paused, bool):
            raise InvalidArgument("paused", "must be true or false")
        if not isinstance(schedule_id, str):
            return None

        async def work(now: float) -> ScheduleInfo | None:
            conn = self._conn
            async with conn.transaction():
                kept = await self._locked_schedule(schedule_id)
                if kept is None or kept[0].spec.paused == paused:
                    return None if kept is None else kept[0]
                old = kept[0]
                next_at = None if paused else next_tick(old.spec, now)
                await conn.execute(
                    "UPDATE conveyor_schedules SET paused = %s, next_at = %s, updated_at = %s "
                    "WHERE id = %s",
                    (paused, next_at, now, schedule_id),
                )
                await self._told(next_at)
            return dataclasses.replace(
                old,
                spec=dataclasses.replace(old.spec, paused=paused),
                next_at=next_at,
                updated_at=now,
            )

        info = await self._call(work, changes=False)
        if info is not None:
            self._sched_earlier(info.next_at)
        return info

    async def _run_schedule(self, schedule_id: str) -> str | None:
        """SCH-7: one job of the schedule now (keyed ``schedule:<id>:run:<ms>``), counted
        as the schedule's latest; its next tick unchanged."""
        if not isinstance(schedule_id, str):
            return None
        events: list[float] = []
        queue: list[str] = []

        async def work(now: float) -> str | None:
            conn = self._conn
            async with conn.transaction():
                cur = await conn.execute(
                    "SELECT queue, payload, spec FROM conveyor_schedules WHERE id = %s FOR UPDATE",
                    (schedule_id,),
                )
                row = await cur.fetchone()
                if row is None:
                    return None
                spec = _spec_of(schedule_id, row[0], row[2], False)
                opts = await self._queues([spec.queue])
                key = f"schedule:{schedule_id}:run:{round(now * 1000)}"
                job = self._resolve(
                    spec.queue, opts[spec.queue], _schedule_job(spec, RawJSON(bytes(row[1])), key)
                )
                (job_id,) = await self._insert(now, [job], events)
                await conn.execute(
                    "UPDATE conveyor_schedules SET fired = fired + 1, last_at = %s, "
                    "last_job = %s WHERE id = %s",
                    (now, job_id, schedule_id),
                )
                queue.append(spec.queue)
            return job_id

        job_id = await self._call(work, changes=True, nearest=lambda _: min(events, default=None))
        if queue:
            self._listeners.work_waiting(frozenset(queue))
        return job_id

    async def _schedules(
        self, ids: Sequence[str] | None, after: str | None, limit: int
    ) -> list[ScheduleInfo]:
        if ids is None:
            if after is not None and not isinstance(after, str):
                raise InvalidArgument("after", "must be a schedule id or None")
            guard.positive_int("limit", limit, MAX_LIST_LIMIT)
        else:
            wanted = [i for i in ids if isinstance(i, str)]

        async def work(now: float) -> list[ScheduleInfo]:
            if ids is None:
                cur = await self._conn.execute(
                    f"SELECT {_SCHEDULE_COLUMNS} FROM conveyor_schedules "
                    "WHERE %(after)s::text IS NULL OR id > %(after)s ORDER BY id LIMIT %(n)s",
                    {"after": after, "n": min(limit, _N_MAX)},
                )
                return [_schedule_info(row) for row in await cur.fetchall()]
            cur = await self._conn.execute(
                f"SELECT {_SCHEDULE_COLUMNS} FROM conveyor_schedules WHERE id = ANY(%s::text[])",
                (wanted,),
            )
            found = {row[0]: _schedule_info(row) for row in await cur.fetchall()}
            return [found[i] for i in wanted if i in found]

        return await self._call(work, changes=False)

    async def settle(self) -> None:
        """Every call made so far has committed (each commits before its result), and so
        has every call the backend made of its own (a sweep its timer asked for)."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait([last])  # (its failure, or its cancelling, is its caller's)
        for task in (self._sweeper, self._sched_refresher, self._firer, self._runner):
            if task is not None and not task.done():
                await asyncio.wait([task])
        self._check()

    # -- the job table -----------------------------------------------------------------------

    async def _insert(
        self,
        now: float,
        jobs: list[tuple[str, tuple[Any, ...], float]],
        events: list[float],
        deps: Sequence[int] | None = None,
        fresh: set[int] | None = None,
    ) -> list[str]:
        """Store each ``(queue, resolved, backoff_max_s)`` job; the ids. A job whose key
        a live job of its queue holds gets that job's id and changes nothing (ENQ-10),
        and so does one whose key an earlier job of ``jobs`` holds (ENQ-11). Adds to
        ``events`` the timed events the stored jobs bring (a ready time to come, an
        expiry: TIM-4), and tells the other brokers of the earliest ("t:" and the time).

        ``deps``: how many dependencies each job names (stored waiting where > 0, for
        ``_link`` to file); ``fresh``: gets the indexes of the jobs stored (not those
        that got a key's holder)."""
        conn = self._conn
        ids: list[str | None] = [None] * len(jobs)
        first: dict[tuple[str, str], int] = {}
        todo: list[int] = []
        for index, (name, resolved, _) in enumerate(jobs):
            key = resolved[8]
            if key is None or first.setdefault((name, key), index) == index:
                todo.append(index)
        for _ in range(3):
            if not todo:
                break
            columns: dict[str, list[Any]] = {
                column: []
                for column in (
                    "queue", "payload", "priority", "attempts", "vis", "base", "cap",
                    "ready_at", "expires_at", "key", "timeout", "partition", "deps",
                )
            }  # fmt: skip
            for index in todo:
                name, resolved, cap = jobs[index]
                payload, prio, delay_s, run_at, expires_s, vis, attempts, base, key, limit, part = (
                    resolved
                )
                if delay_s is not None:  # ENQ-5
                    ready_at = now + delay_s
                elif run_at is not None:
                    ready_at = run_at if run_at > now else now
                else:
                    ready_at = now
                columns["queue"].append(name)
                columns["payload"].append(payload)
                columns["priority"].append(prio)
                columns["attempts"].append(attempts)
                columns["vis"].append(vis)
                columns["base"].append(base)
                columns["cap"].append(cap)
                columns["ready_at"].append(ready_at)
                columns["expires_at"].append(None if expires_s is None else now + expires_s)
                columns["key"].append(key)
                columns["timeout"].append(limit)
                columns["partition"].append("" if part is None else part)
                columns["deps"].append(0 if deps is None else deps[index])
                if ready_at > now:
                    events.append(ready_at)
                if expires_s is not None:
                    events.append(now + expires_s)
            cur = await conn.execute(_INSERT_JOBS, {**columns, "now": now})
            taken: list[int] = []
            for index, (seq, inserted) in zip(todo, await cur.fetchall(), strict=True):
                if inserted:
                    ids[index] = self._id(seq)
                    if fresh is not None:
                        fresh.add(index)
                else:
                    taken.append(index)
            todo = []
            if not taken:
                break
            pairs = [(jobs[i][0], jobs[i][1][8]) for i in taken]
            cur = await conn.execute(
                _KEYED, ([name for name, _ in pairs], [key for _, key in pairs])
            )
            holders = {(row[0], row[1]): int(row[2]) for row in await cur.fetchall()}
            for index, pair in zip(taken, pairs, strict=True):
                seq = holders.get(pair)
                if seq is None:
                    todo.append(index)  # its holder went meanwhile: the key is free again
                else:
                    ids[index] = self._id(seq)
        if todo:
            raise StoreError("postgres: a key kept changing hands during an enqueue")
        if events:
            # The other brokers' timers fire then too (told at the commit, with the jobs):
            # their workers may be the ones waiting for it.
            await conn.execute("SELECT pg_notify('conveyor', %s)", (f"t:{min(events)!r}",))
        out: list[str] = []
        for index, (name, resolved, _) in enumerate(jobs):
            job_id = ids[index]
            if job_id is None:
                job_id = ids[first[(name, resolved[8])]]
            assert job_id is not None
            out.append(job_id)
        return out

    def _resolve(
        self, name: str, opts: QueueOpts, job: NewJob | Enqueue
    ) -> tuple[str, tuple[Any, ...], float]:
        """The engine's check and resolution of one job's options against its queue's
        (ENQ-2 to ENQ-9), and the queue's ``backoff_max_s``."""
        queue = self._rules.queue(name, opts)
        resolved: tuple[Any, ...] = queue.resolve(
            job.payload,
            job.priority,
            job.delay_s,
            job.run_at,
            job.expires_s,
            job.visibility_timeout_s,
            job.max_attempts,
            job.backoff_base_s,
            job.key,
            job.timeout_s,
            job.partition,
        )
        return name, resolved, opts.backoff_max_s

    async def _enqueue(self, jobs: Sequence[Enqueue]) -> list[str | Exception]:
        results: list[str | Exception | None] = [None] * len(jobs)
        names: list[str] = []
        for index, item in enumerate(jobs):
            try:
                names.append(guard.queue_name(item.queue))
            except InvalidArgument as exc:
                results[index] = exc
        linked = any(item.after for item in jobs)

        nearest: list[float] = []
        released: list[tuple[str, float]] = []

        async def work(now: float) -> None:
            # With every queue's options known, the insert is the one statement: no
            # transaction around it (each statement commits alone, atomically).
            known = self._known_opts(names) and not linked
            async with contextlib.nullcontext() if known else self._conn.transaction():
                opts = await self._queues(names)
                good: list[int] = []
                resolved: list[tuple[str, tuple[Any, ...], float]] = []
                named: list[list[int | None]] = []
                for index, item in enumerate(jobs):
                    if results[index] is not None:
                        continue
                    try:
                        resolved.append(self._resolve(item.queue, opts[item.queue], item))
                        after = guard.after(item.after) if item.after else ()
                    except InvalidArgument as exc:
                        if len(resolved) > len(named):
                            resolved.pop()
                        results[index] = exc
                        continue
                    good.append(index)
                    named.append([self._seq(job_id) for job_id in after])
                if linked:
                    # DEP-7: every dependency named is a job the table holds (held
                    # until this commits); a job naming one it does not is refused.
                    found = await self._hold_deps(named)
                    keep = []
                    for k, (index, seqs) in enumerate(zip(good, named, strict=True)):
                        missing = next(
                            (pos for pos, seq in enumerate(seqs) if seq not in found), None
                        )
                        if missing is None:
                            keep.append(k)
                        else:
                            after = guard.after(jobs[index].after)
                            results[index] = _unknown(f"after[{missing}]", after[missing])
                    good = [good[k] for k in keep]
                    resolved = [resolved[k] for k in keep]
                    named = [named[k] for k in keep]
                fresh: set[int] = set()
                ids = await self._insert(
                    now, resolved, nearest, [len(seqs) for seqs in named], fresh
                )
                if linked:
                    edges = [
                        (seq, [dep for dep in seqs if dep is not None])
                        for k, seqs in enumerate(named)
                        if k in fresh and seqs and (seq := self._seq(ids[k])) is not None
                    ]
                    released.extend(await self._link(now, edges, nearest))
            for index, job_id in zip(good, ids, strict=True):
                results[index] = job_id

        await self._call(work, changes=True, nearest=lambda _: min(nearest, default=None))
        out: list[str | Exception] = []
        touched: set[str] = {queue for queue, _ in released}
        for item, result in zip(jobs, results, strict=True):
            assert result is not None
            out.append(result)
            if isinstance(result, str):
                touched.add(item.queue)
        self._listeners.work_waiting(frozenset(touched))
        return out

    async def _hold_deps(self, named: Sequence[Sequence[int | None]]) -> set[int]:
        """The seqs of ``named`` that name a job of the table, each held (``FOR
        SHARE``, in seq order) until the transaction ends: an ack, a death or a cancel
        of one waits for the edges this makes (DEP-1, DEP-3)."""
        wanted = sorted({seq for seqs in named for seq in seqs if seq is not None})
        if not wanted:
            return set()
        cur = await self._conn.execute(_HOLD_DEPS, (wanted,))
        return {int(row[0]) for row in await cur.fetchall()}

    async def _link(
        self, now: float, edges: Sequence[tuple[int, Sequence[int]]], events: list[float]
    ) -> list[tuple[str, float]]:
        """Store the edges of new jobs stored waiting (each ``(seq, its dependencies'
        seqs in the order named)``) and file the jobs (conveyor_deps_link): waiting, dead
        (DEP-3, DEP-7) or, with nothing to wait for, pending. The jobs made pending, as
        ``(queue, ready_at)``; a ready time to come is added to ``events``."""
        if not edges:
            return []
        jobs: list[int] = []
        places: list[int] = []
        deps: list[int] = []
        for seq, named in edges:
            for pos, dep in enumerate(dict.fromkeys(named)):
                jobs.append(seq)
                places.append(pos)
                deps.append(dep)
        conn = self._conn
        await conn.execute(_ADD_EDGES, (jobs, places, deps))
        cur = await conn.execute(_LINK, ([seq for seq, _ in edges], now))
        return await self._released(now, await cur.fetchall(), events)

    async def _released(
        self, now: float, rows: list[tuple[Any, ...]], events: list[float]
    ) -> list[tuple[str, float]]:
        """Jobs made pending by dependencies (``(queue, ready_at)`` rows): a ready time
        to come is an event, here and for the other brokers ("t:")."""
        later = [float(row[1]) for row in rows if row[1] > now]
        if later:
            events.extend(later)
            await self._conn.execute("SELECT pg_notify('conveyor', %s)", (f"t:{min(later)!r}",))
        return [(str(row[0]), float(row[1])) for row in rows]

    async def _enqueue_group(self, jobs: Sequence[Enqueue]) -> list[str]:
        count = len(jobs)
        nearest: list[float] = []
        released: list[tuple[str, float]] = []

        async def work(now: float) -> list[str]:
            made_before = set(self._opts)
            try:
                async with self._conn.transaction():
                    return await group(now)
            except BaseException:
                # Queues made by a group that was refused are not made (rolled back).
                for job in jobs:
                    if isinstance(job.queue, str) and job.queue not in made_before:
                        self._opts.pop(job.queue, None)
                raise

        async def group(now: float) -> list[str]:
            for i, job in enumerate(jobs):
                try:
                    guard.queue_name(job.queue)
                except InvalidArgument as exc:
                    raise exc.within(f"jobs[{i}]") from None
            opts = await self._queues([job.queue for job in jobs])
            # Each member checked as the engine checks it, in order: its options, its
            # after, then its ids (DEP-6, DEP-7); the first bad one refuses the group.
            resolved: list[tuple[str, tuple[Any, ...], float]] = []
            afters: list[tuple[str | int, ...]] = []
            problems: list[InvalidArgument | None] = []
            for i, job in enumerate(jobs):
                try:
                    resolved.append(self._resolve(job.queue, opts[job.queue], job))
                    after = guard.after(job.after, count)
                    if i in after:
                        raise DependencyCycle("after", "a job cannot depend on itself")
                except InvalidArgument as exc:
                    problems.append(exc.within(f"jobs[{i}]"))
                    afters.append(())
                    continue
                problems.append(None)
                afters.append(after)
            named = [
                [self._seq(item) if isinstance(item, str) else None for item in after]
                for after in afters
            ]
            found = await self._hold_deps(named)
            for i, problem in enumerate(problems):
                if problem is not None:
                    raise problem
                for pos, item in enumerate(afters[i]):
                    if isinstance(item, str) and named[i][pos] not in found:
                        raise _unknown(f"jobs[{i}].after[{pos}]", item)
            order = guard.group_order(afters)  # (each member after those it names)
            # Stored in that order (each after those it names), at one instant.
            fresh: set[int] = set()
            stored = await self._insert(
                now, [resolved[i] for i in order], nearest, [len(afters[i]) for i in order], fresh
            )
            ids = [""] * count
            for place, i in enumerate(order):
                ids[i] = stored[place]
            edges: list[tuple[int, list[int]]] = []
            for place, i in enumerate(order):
                if place not in fresh or not afters[i]:
                    continue
                deps: list[int] = []
                for pos, item in enumerate(afters[i]):
                    dep = self._seq(ids[item]) if isinstance(item, int) else named[i][pos]
                    assert dep is not None
                    deps.append(dep)
                seq = self._seq(ids[i])
                assert seq is not None
                edges.append((seq, deps))
            released.extend(await self._link(now, edges, nearest))
            return ids

        ids = await self._call(work, changes=True, nearest=lambda _: min(nearest, default=None))
        self._listeners.work_waiting(frozenset(job.queue for job in jobs))
        return ids

    async def _dependency_results(self, job_id: str) -> list[tuple[str, bytes | None]] | None:
        seq = self._seq(job_id)
        if seq is None:
            return None

        async def work(now: float) -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(_DEP_RESULTS, (seq,))
            return await cur.fetchall()

        rows = await self._call(work, changes=False)
        if not rows:
            return None
        return [
            (self._id(dep), None if result is None else bytes(result))
            for _, dep, result in rows
            if dep is not None
        ]

    async def _enqueue_all(self, queue: str, jobs: Sequence[NewJob]) -> list[str]:
        guard.queue_name(queue)
        refused: list[InvalidArgument] = []

        async def work(now: float) -> list[str]:
            async with self._conn.transaction():
                opts = (await self._queues([queue]))[queue]
                resolved: list[tuple[str, tuple[Any, ...], float]] = []
                afters: list[tuple[str | int, ...]] = []
                problem: tuple[int, InvalidArgument] | None = None
                for index, spec in enumerate(jobs):
                    if not isinstance(spec, NewJob):
                        problem = (index, InvalidArgument(f"jobs[{index}]", "must be a NewJob"))
                        break
                    try:
                        resolved.append(self._resolve(queue, opts, spec))
                        afters.append(guard.after(spec.after) if spec.after else ())
                    except InvalidArgument as exc:
                        problem = (index, exc.within(f"jobs[{index}]"))
                        break
                # The ids named before the first bad job: each a job the table holds
                # (DEP-7), held until this commits; the first that is not refuses all.
                named = [[self._seq(job_id) for job_id in after] for after in afters]
                found = await self._hold_deps(named)
                for index, seqs in enumerate(named):
                    missing = next((pos for pos, seq in enumerate(seqs) if seq not in found), None)
                    if missing is not None:
                        unknown = _unknown(f"after[{missing}]", afters[index][missing])
                        problem = (index, unknown.within(f"jobs[{index}]"))
                        break
                if problem is not None:
                    refused.append(problem[1])
                    return []  # the queue made stays made, as in the engine
                fresh: set[int] = set()
                ids = await self._insert(
                    now, resolved, nearest, [len(seqs) for seqs in named], fresh
                )
                edges = [
                    (seq, [dep for dep in seqs if dep is not None])
                    for k, seqs in enumerate(named)
                    if k in fresh and seqs and (seq := self._seq(ids[k])) is not None
                ]
                await self._link(now, edges, nearest)
                return ids

        nearest: list[float] = []
        ids = await self._call(work, changes=True, nearest=lambda _: min(nearest, default=None))
        if refused:
            raise refused[0]
        self._listeners.work_waiting(frozenset([queue]))
        return ids

    async def _claim(self, claims: Sequence[Claim], round_robin: bool) -> list[list[Claimed]]:
        refused: list[InvalidArgument] = []
        # When a back-off or a bucket that held jobs back lets them go (FLW-4, FLW-6):
        # the claim function says so in a row of its own, with no seq.
        wakes: list[float] = []

        async def one(claim: Claim, n: int, now: float) -> list[Claimed]:
            cur = await self._conn.execute(
                "SELECT * FROM conveyor_claim(%s, %s::text[], %s, %s, %s)",
                (claim.worker_id, list(claim.queues), min(n, _N_MAX), now, self.id_prefix),
            )
            got: list[Claimed] = []
            for row in await cur.fetchall():
                if row[1] is None:
                    wakes.append(row[7])
                else:
                    got.append(self._claimed(row))
            return got

        async def refuses(claim: Claim, problem: InvalidArgument | None) -> bool:
            # The engine's guards (CLM-9) run where the local backend reaches a queue's
            # claim: at the first of the claim's queues that exists.
            if problem is None or not await self._known(claim.queues):
                return False
            refused.append(problem)
            return True

        async def work(now: float) -> list[list[Claimed]]:
            results: list[list[Claimed]] = [[] for _ in claims]
            # One claim is one statement: it needs no transaction around it.
            several = sum(1 for claim in claims if claim.queues and claim.n > 0) > 1
            async with self._conn.transaction() if several else contextlib.nullcontext():
                if round_robin:
                    # One job each in turn; a claim that got nothing has nothing left.
                    open_ = [i for i, claim in enumerate(claims) if claim.n > 0]
                    while open_:
                        still = []
                        for i in open_:
                            claim = claims[i]
                            if not claim.queues:
                                continue
                            if await refuses(claim, _worker_problem(claim)):
                                return results  # the claims before stand, as in the engine
                            # The last one left in turn takes the rest at once.
                            take = claim.n - len(results[i]) if len(open_) == 1 else 1
                            got = await one(claim, take, now)
                            if got:
                                results[i].extend(got)
                                if len(results[i]) < claim.n:
                                    still.append(i)
                        open_ = still
                    return results
                for i, claim in enumerate(claims):
                    if not claim.queues or claim.n <= 0:
                        continue  # meets no row (CLM-1)
                    if await refuses(claim, _claim_problem(claim)):
                        break  # the claims before it stand, as in the engine
                    results[i] = await one(claim, claim.n, now)
            return results

        def nearest(results: list[list[Claimed]]) -> float | None:
            # The leases' deadlines; and a job the claim killed on its way (expired,
            # attempts used up) is dead from now, so its queue's retention may end
            # from now on: the timer fires then, at the latest (early is harmless).
            at = [job.deadline for got in results for job in got]
            now = self.now()
            for claim in claims:
                for name in claim.queues:
                    opts = self._opts.get(name)
                    if opts is None:
                        return _ASK  # (not known here: the table says)
                    if opts.dead_letter_retention_s is not None:
                        at.append(now + opts.dead_letter_retention_s)
            return min(at, default=None)

        results = await self._call(work, changes=True, nearest=nearest)
        if wakes:
            self._arm_timer(min(wakes))
        if refused:
            raise refused[0]
        return results

    def _claimed(self, row: tuple[Any, ...]) -> Claimed:
        (
            _,
            seq,
            queue,
            lease,
            payload,
            attempts,
            max_attempts,
            deadline,
            priority,
            vis,
            ready_at,
            enqueued_at,
            timeout_s,
            dependencies,
        ) = row
        return _Claimed(
            id=self._id(seq),
            queue=queue,
            lease=lease,
            payload_json=bytes(payload),
            attempt=attempts,
            max_attempts=max_attempts,
            deadline=deadline,
            priority=priority,
            visibility_timeout_s=vis,
            ready_since=ready_at if ready_at > enqueued_at else enqueued_at,
            timeout_s=timeout_s,
            dependencies=dependencies,
        )

    def _lease_batch(self, leases: Sequence[tuple[str, str]]) -> tuple[list[int], list[str]]:
        seqs: list[int] = []
        tokens: list[str] = []
        for job_id, lease in leases:
            seq = self._seq(job_id)
            if seq is not None and isinstance(lease, str):
                seqs.append(seq)
                tokens.append(lease)
        return seqs, tokens

    async def _by_lease(
        self,
        statement: str,
        leases: Sequence[tuple[str, str]],
        *,
        changes: bool,
        worker: str | None = None,
    ) -> list[tuple[Any, ...]]:
        """Run ``statement`` over the leases of ``leases`` (``worker``'s only, if the
        statement takes one); its rows."""
        seqs, tokens = self._lease_batch(leases)

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            cur = await self._conn.execute(
                statement,
                {"now": now, "seqs": seqs, "leases": tokens, "worker": worker},
                prepare=False,
            )
            return await cur.fetchall()

        return await self._call(work, changes=changes)

    async def _extend(
        self, leases: Sequence[tuple[str, str]], worker: str | None = None
    ) -> list[bool]:
        """Extend the valid leases of ``leases`` (of ``worker``'s jobs only, if given);
        whether each landed."""
        # (A heartbeat puts a deadline later: it brings no event nearer.)
        rows = await self._by_lease(_HEARTBEAT, leases, changes=False, worker=worker)
        hit = {(self._id(row[0]), row[1]) for row in rows}
        return [(job_id, lease) in hit for job_id, lease in leases]

    async def _ack(
        self, leases: Sequence[tuple[str, str]], results: Sequence[bytes | None] | None
    ) -> list[bool]:
        seqs, tokens = self._lease_batch(leases)
        if results is None:
            kept: list[bytes | None] = [None] * len(seqs)
        else:
            if len(results) != len(leases):
                raise InvalidArgument("result", "must be one per lease")
            for result in results:
                if result is not None:
                    guard.result(result, self._rules.max_payload_bytes)
            # (The results of the leases _lease_batch kept, in its order.)
            kept = [
                result
                for (job_id, lease), result in zip(leases, results, strict=True)
                if self._seq(job_id) is not None and isinstance(lease, str)
            ]

        nearest: list[float] = []
        released: list[tuple[str, float]] = []

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            conn = self._conn
            if self._keeping is None:
                cur = await conn.execute(f"SELECT EXISTS ({_KEEPING})")
                row = await cur.fetchone()
                self._keeping = bool(row and row[0])
            cur = await conn.execute(
                _ACK if self._keeping else _ACK_PLAIN,
                {"now": now, "seqs": seqs, "leases": tokens, "results": kept},
                prepare=False,
            )
            rows = await cur.fetchall()
            # (The jobs the acks released, DEP-1: a ready time to come is an event.)
            released.extend((row[1], row[2]) for row in rows if row[2] is not None)
            nearest.extend(row[2] for row in rows if row[2] is not None and row[2] > now)
            return rows

        # (An ack takes events away, but for a dependent it releases for later.)
        rows = await self._call(work, changes=True, nearest=lambda _: min(nearest, default=None))
        freed = frozenset(row[1] for row in rows if row[0] is None and row[1])
        freed |= {queue for queue, _ in released}
        if freed:
            self._listeners.work_waiting(freed)
        return _once({(self._id(row[0]), row[1]) for row in rows if row[0] is not None}, leases)

    async def _report(self, reports: Sequence[Report]) -> list[bool | InvalidArgument]:
        checked: list[tuple[Report, float | None, str | None] | InvalidArgument] = []
        for item in reports:
            try:
                delay = None
                if item.retry:
                    delay = guard.optional(guard.nonneg, "delay_s", item.delay_s)
                text = guard.error_text("error", item.error)
            except InvalidArgument as exc:
                checked.append(exc)
                continue
            checked.append((item, delay, text))
        seqs = sorted(
            {
                seq
                for entry in checked
                if not isinstance(entry, InvalidArgument)
                and (seq := self._seq(entry[0].id)) is not None
            }
        )
        requeued: set[str] = set()
        # The retried jobs that will run again: (seq, attempt, error) (PRG-5).
        retried: list[tuple[int, int, str | None]] = []

        async def work(now: float) -> list[bool | InvalidArgument]:
            conn = self._conn
            results: list[bool | InvalidArgument] = []
            died: set[str] = set()
            retried.clear()
            async with conn.transaction():
                rows: dict[int, list[Any]] = {}
                if seqs:
                    cur = await conn.execute(_REPORTED, (seqs,))
                    rows = {row[0]: list(row) for row in await cur.fetchall()}
                changed: dict[int, list[Any]] = {}
                for entry in checked:
                    if isinstance(entry, InvalidArgument):
                        results.append(entry)
                        continue
                    item, delay, text = entry
                    seq = self._seq(item.id)
                    row = rows.get(seq) if seq is not None else None
                    # row: seq queue state lease deadline attempts max base cap last_error
                    if (
                        row is None
                        or row[2] != "processing"
                        or row[3] != item.lease
                        or not now < row[4]
                    ):
                        results.append(False)
                        continue
                    # The row as it will be: [state, ready_at, last_error, died_at, sched]
                    if item.retry:
                        requeued.add(row[1])
                        if row[5] >= row[6]:
                            update = ["dead", None, text or MAX_ATTEMPTS_EXCEEDED, now, False]
                        else:
                            if delay is None:
                                delay = _backoff(row[5], row[7], row[8], self._rng)
                            last = text if text is not None else row[9]
                            ready_at = now + delay
                            update = ["pending", ready_at, last, None, ready_at > now]
                            retried.append((row[0], row[5], text))
                    else:
                        update = ["dead", None, text or FAILED, now, False]
                    changed[row[0]] = update
                    if update[0] == "dead":
                        died.add(row[1])
                    row[2] = update[0]
                    row[3] = None
                    row[9] = update[2]
                    results.append(True)
                if changed:
                    cols: list[list[Any]] = [[], [], [], [], [], []]
                    for seq_, update in changed.items():
                        cols[0].append(seq_)
                        for column, value in zip(cols[1:], update, strict=True):
                            column.append(value)
                    await conn.execute(_SETTLE_REPORTS, cols, prepare=False)
                if retried:  # their watchers on other brokers are told (PRG-8)
                    await conn.execute(
                        _STEPPED_NOTICE,
                        ([seq for seq, _, _ in retried], [f"r{n}" for _, n, _ in retried]),
                    )
                if died:
                    # A death frees a slot too (FLW-2); a retry is told by the trigger.
                    cur = await conn.execute(
                        "SELECT name, pg_notify('conveyor', 'w:' || name) FROM conveyor_queues "
                        "WHERE name = ANY(%s::text[]) AND flow_until > %s",
                        (sorted(died), now),
                    )
                    requeued.update(row[0] for row in await cur.fetchall())
            return results

        results = await self._call(work, changes=True)
        self._listeners.work_waiting(frozenset(requeued))
        if self._watchers:
            for seq, attempt, error in retried:
                self._tell_step(Step(self._id(seq), "retry", attempt, None, "failed", error))
        return results

    async def _heartbeat(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        return await self._extend(leases)

    async def _lapse(self, leases: Sequence[tuple[str, str]]) -> list[bool]:
        rows = await self._by_lease(_LAPSE, leases, changes=True)
        rows = [row for row in rows if row[0] is not None]  # (the notices' rows are not)
        hit = {(self._id(row[0]), row[1]): row[2] for row in rows}
        # A second lapse of one lease finds it lapsed already (HND-1): the first lands.
        landed = _first([(job_id, lease) in hit for job_id, lease in leases], leases)
        self._listeners.work_waiting(frozenset(hit.values()))
        if self._watchers:
            for seq, _, _, attempts_left, attempt in rows:
                if attempts_left:  # (the last attempt's lapse is told as the end)
                    self._tell_step(Step(self._id(seq), "retry", attempt, None, "lapsed", None))
        return landed

    async def _reattach(
        self, worker_id: str, leases: Sequence[tuple[str, str]]
    ) -> list[tuple[str, str]]:
        landed = await self._extend(leases, worker=worker_id)
        return [pair for pair, ok in zip(leases, landed, strict=True) if ok]

    async def _announce(
        self, broker_id: str, info: dict[str, Any], ttl_s: float
    ) -> list[dict[str, Any]]:
        async def work(now: float) -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(
                _ANNOUNCE,
                {
                    "me": broker_id,
                    "info": Jsonb(info),
                    "now": now,
                    "ttl": ttl_s,
                    "follower": self._follower_id,
                },
            )
            return await cur.fetchall()

        rows = await self._call(work, changes=False)
        if self._followers and any(row[1] for row in rows):
            self._background(self._refollow())
        return [row[0] for row in rows if isinstance(row[0], dict)]

    async def _refollow(self) -> None:
        """Write again the follows of every job followed here (pruned while this broker's
        row was gone); tell the followers of those that ended meanwhile."""
        ids = list(self._followers)
        seqs = sorted({seq for job_id in ids if (seq := self._seq(job_id)) is not None})

        async def work(now: float) -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(
                _FOLLOW, {"seqs": seqs, "me": self._follower_id}, prepare=False
            )
            return await cur.fetchall()

        found = {self._id(row[0]): row for row in await self._call(work, changes=False)}
        for job_id in ids:
            row = found.get(job_id)
            if row is not None and row[2] in _LIVE:
                continue
            if row is None:
                told = Finished(job_id, "", "unknown", None, None)
            elif row[2] == "completed":
                result = None if row[3] is None else bytes(row[3])
                told = Finished(job_id, row[1], "completed", result, None)
            else:
                told = Finished(job_id, row[1], "dead", None, row[4])
            self._tell_end(told)

    async def _held_leases(self, worker_id: str | None) -> list[tuple[str, str, str]]:
        async def work(now: float) -> list[tuple[Any, ...]]:
            if worker_id is None:
                cur = await self._conn.execute(
                    "SELECT seq, lease, worker_id FROM conveyor_jobs "
                    "WHERE state = 'processing' AND deadline > %s",
                    (now,),
                )
            else:  # (the index of v4)
                cur = await self._conn.execute(
                    "SELECT seq, lease, worker_id FROM conveyor_jobs "
                    "WHERE state = 'processing' AND worker_id = %s AND deadline > %s",
                    (worker_id, now),
                )
            return await cur.fetchall()

        rows = await self._call(work, changes=False)
        return [(self._id(seq), lease, worker) for seq, lease, worker in rows]

    async def _cancel(self, ids: Sequence[str]) -> list[bool]:
        seqs = [seq for job_id in ids if (seq := self._seq(job_id)) is not None]

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            conn = self._conn
            async with conn.transaction():
                cur = await conn.execute(_CANCEL, {"seqs": seqs, "now": now})
                rows = await cur.fetchall()
                # The jobs waiting for one die (DEP-3, DEP-13): a statement of its own,
                # begun once the cancelled rows are held (see _ack).
                gone = sorted(row[0] for row in rows if row[0] is not None)
                if gone:
                    await conn.execute(
                        _DOOM,
                        (gone, [f"dependency {self._id(seq)} was cancelled" for seq in gone], now),
                    )
                # A key under flow control whose jobs were cancelled is filed again at
                # once, as the engine files it: one with nothing left leaves the turns,
                # and its next job files it last (FLW-5).
                flowing = {row[1] for row in rows if row[0] is None}
                keys = {(row[1], row[2]) for row in rows if row[0] is not None and row[2]}
                keys = {(queue, key) for queue, key in keys if queue in flowing}
                if keys:
                    cur = await conn.execute(
                        _FLOW_LOCK_ORDER, (sorted({queue for queue, _ in keys}),)
                    )
                    for (queue,) in await cur.fetchall():
                        await self._flow_lock(queue)
                        await conn.execute(
                            "SELECT conveyor_flow_refile(%s, %s::text[], %s)",
                            (queue, sorted(key for q, key in keys if q == queue), now),
                        )
            return rows

        rows = await self._call(work, changes=False)  # (a cancel only takes events away)
        freed = frozenset(row[1] for row in rows if row[0] is None and row[1])
        rows = [row for row in rows if row[0] is not None]
        if freed:
            self._listeners.work_waiting(freed)
        done = _once({self._id(row[0]) for row in rows}, ids)
        self._listeners.cancelled([job_id for job_id, ok in zip(ids, done, strict=True) if ok])
        return done

    # -- following (RES-5 to RES-7) ----------------------------------------------------

    async def _follow(
        self, ids: Sequence[str], on_finished: Callable[[Finished], None]
    ) -> list[Finished | None]:
        seqs = sorted({seq for job_id in ids if (seq := self._seq(job_id)) is not None})
        # Listed before the answer, so that a notice taken in the very next call finds
        # them; those the answer shows finished or unknown are dropped again below.
        for job_id in ids:
            self._followers.setdefault(job_id, []).append(on_finished)
        self._followed_any = True

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            cur = await self._conn.execute(
                _FOLLOW, {"seqs": seqs, "me": self._follower_id}, prepare=False
            )
            return await cur.fetchall()

        try:
            rows = await self._call(work, changes=False)
        except BaseException:
            for job_id in ids:
                self._drop_follower(job_id, on_finished)
            raise
        found = {self._id(row[0]): row for row in rows}
        known: list[Finished | None] = []
        for job_id in ids:
            row = found.get(job_id) if isinstance(job_id, str) else None
            if row is not None and row[2] in ("pending", "processing"):
                known.append(None)
                continue
            self._drop_follower(job_id, on_finished)
            if row is None:
                known.append(Finished(job_id, "", "unknown", None, None))
            elif row[2] == "completed":
                result = None if row[3] is None else bytes(row[3])
                known.append(Finished(job_id, row[1], "completed", result, None))
            else:
                known.append(Finished(job_id, row[1], "dead", None, row[4]))
        live = [seq for seq in seqs if (row := found.get(self._id(seq))) and row[2] in _LIVE]
        if live:
            # A second look, once the follows are committed: a job that ended through a
            # statement that began before they were (and so did not see them) is told
            # from the table now (RES-7).
            self._background(self._second_look(live))
        return known

    # -- progress and watching (PRG-1 on) ----------------------------------------------

    async def _progress(self, items: Sequence[Progress]) -> list[bool | InvalidArgument]:
        limit = min(MAX_PROGRESS_BYTES, self._rules.max_payload_bytes)
        answers: list[bool | InvalidArgument] = []
        # The latest value of each (seq, lease): a batch's earlier one is replaced (PRG-2).
        latest: dict[tuple[int, str], bytes] = {}
        for item in items:
            try:
                guard.progress(item.value_json, limit)
            except InvalidArgument as exc:
                answers.append(exc)
                continue
            answers.append(False)
            seq = self._seq(item.id)
            if seq is not None:
                latest[(seq, item.lease)] = item.value_json

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not latest:
                return []
            keys = list(latest)
            cur = await self._conn.execute(
                _PROGRESS,
                {
                    "seqs": [key[0] for key in keys],
                    "leases": [key[1] for key in keys],
                    "values": list(latest.values()),
                    "now": now,
                },
                prepare=False,
            )
            return await cur.fetchall()

        rows = await self._call(work, changes=True)
        landed = {seq: attempts for seq, attempts, _ in rows if seq is not None}
        for i, item in enumerate(items):
            if answers[i] is False and self._seq(item.id) in landed:
                answers[i] = True
        watchers = self._watchers
        if watchers:
            for (seq, _lease), value in latest.items():
                attempts = landed.get(seq)
                if attempts is not None:
                    self._tell_step(Step(self._id(seq), "progress", attempts, value))
        return answers

    def _tell_step(self, step: Step) -> None:
        """Tell the watchers of ``step``'s job (until its end is told, or unwatched); a
        lapse once per attempt (see _STEP_REASONS). (A back-off spends no attempt: its
        attempt may back off again.)"""
        if step.id not in self._watchers:
            return
        if step.reason == "lapsed":
            if self._lapse_told.get(step.id, 0) >= step.attempt:
                return
            self._lapse_told[step.id] = step.attempt
        for callback in list(self._watchers[step.id]):
            try:
                callback(step)
            except Exception:  # (a watcher's bug must not stop the others)
                log.exception("a watcher of %s failed", step.id)

    async def _read_steps(self) -> None:
        """Read the jobs whose steps notices told of, and tell their watchers (PRG-8):
        one call for every notice heard meanwhile; progress read is the latest."""
        try:
            while self._stepped:
                stepped, self._stepped = self._stepped, {}
                seqs = sorted(seq for seq in stepped if self._id(seq) in self._watchers)
                if not seqs:
                    continue

                async def work(now: float, seqs: list[int] = seqs) -> list[tuple[Any, ...]]:
                    cur = await self._conn.execute(_STEPPED, (seqs,))
                    return await cur.fetchall()

                rows = {row[0]: row for row in await self._call(work, changes=False)}
                for seq in seqs:
                    job_id = self._id(seq)
                    row = rows.get(seq)  # (None: gone since; its retries are still told)
                    told = stepped[seq]
                    # In the order told; the progress read is the latest, told where the
                    # last progress notice was.
                    last = max((i for i, step in enumerate(told) if step == "p"), default=-1)
                    for i, step in enumerate(told):
                        reason = _STEP_REASONS.get(step[:1])
                        if reason is not None and step[1:].isdigit():
                            failed = reason == "failed"
                            self._tell_step(
                                Step(
                                    job_id,
                                    "retry",
                                    int(step[1:]),
                                    None,
                                    reason,
                                    row[3] if failed and row is not None else None,
                                )
                            )
                        elif i == last and row is not None and row[2] is not None:
                            self._tell_step(Step(job_id, "progress", row[1], bytes(row[2])))
        finally:
            self._reading_steps = False

    async def _watch(
        self, ids: Sequence[str], on_event: Callable[[WatchEvent], None]
    ) -> list[Job | Finished]:
        # Followed first, then read as they stand: a step committed after the follow is
        # told (a notice) and one committed before the read is in it, so only a step
        # whose statement began before the follow committed and ended after the read is
        # not told (a later one carries the latest value). A job that ends after the
        # follow is told its end through it; one gone before the read is ``unknown``.
        # Listed before the follow, so that a step told meanwhile finds them.
        for job_id in ids:
            self._watchers.setdefault(job_id, []).append(on_event)
        try:
            known = await self._follow(ids, on_event)
            live = [job_id for job_id, finished in zip(ids, known, strict=True) if finished is None]
            jobs = dict(zip(live, await self._get_jobs(live), strict=True)) if live else {}
        except BaseException:
            self.unwatch(ids, on_event)
            raise
        out: list[Job | Finished] = []
        for job_id, finished in zip(ids, known, strict=True):
            job = jobs.get(job_id)
            if finished is None and job is None:  # (gone before the read: not watched)
                self.unwatch([job_id], on_event)
                finished = unknown(job_id)
            if finished is not None:
                self._drop_watcher(job_id, on_event)
                out.append(finished)
                continue
            assert job is not None
            out.append(job)
        return out

    async def _second_look(self, seqs: list[int]) -> None:
        async def work(now: float) -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(
                _MISSED, {"seqs": seqs, "me": self._follower_id}, prepare=False
            )
            return await cur.fetchall()

        for seq, queue, state, result, error in await self._call(work, changes=False):
            job_id = self._id(seq)
            if state is None:  # gone, and what ended it not known: told as unknown
                told = Finished(job_id, "", "unknown", None, None)
            elif state == "completed":
                told = Finished(
                    job_id, queue, state, None if result is None else bytes(result), None
                )
            else:
                told = Finished(job_id, queue, "dead", None, error)
            self._tell_end(told)

    def _tell_end(self, told: Finished) -> None:
        """Tell each follower of a job its end, once; the job is watched no more."""
        job_id = told.id
        self._watchers.pop(job_id, None)
        self._lapse_told.pop(job_id, None)
        for callback in self._followers.pop(job_id, ()):
            try:
                callback(told)
            except Exception:  # (a follower's bug must not stop the others)
                log.exception("a follower of %s failed", job_id)

    def _drop_follower(self, job_id: str, on_finished: Callable[[Finished], None]) -> bool:
        """Take ``on_finished`` off ``job_id``'s followers: whether none is left."""
        callbacks = self._followers.get(job_id)
        if callbacks is None or on_finished not in callbacks:
            return False
        callbacks.remove(on_finished)
        if callbacks:
            return False
        del self._followers[job_id]
        return True

    async def _unfollow_rows(self, seqs: list[int]) -> None:
        async def work(now: float) -> None:
            await self._conn.execute(
                "DELETE FROM conveyor_follows WHERE broker = %s AND seq = ANY(%s::bigint[])",
                (self._follower_id, seqs),
            )

        await self._call(work, changes=False)

    async def _take_finished(self) -> None:
        """Take what finished of the jobs this broker follows, and tell their followers."""

        async def work(now: float) -> list[tuple[Any, ...]]:
            cur = await self._conn.execute(_TAKE_FINISHED, (self._follower_id,))
            return await cur.fetchall()

        for seq, queue, state, result, error in await self._call(work, changes=False):
            job_id = self._id(seq)
            told = Finished(job_id, queue, state, None if result is None else bytes(result), error)
            self._tell_end(told)

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a call of its own, its failure logged (the backend's own
        failure is reported by the backend)."""

        async def run() -> None:
            try:
                await work
            except StoreError:
                pass  # (unavailable or failed: the backend says so itself)
            except Exception:
                log.exception("following: a call failed")

        task = asyncio.get_running_loop().create_task(run())
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _drop_my_follows(self, now: float) -> None:
        await self._conn.execute(
            "DELETE FROM conveyor_follows WHERE broker = %s", (self._follower_id,)
        )

    async def _get_jobs(self, ids: Sequence[str]) -> list[Job | None]:
        seqs = [seq for job_id in ids if (seq := self._seq(job_id)) is not None]

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            cur = await self._conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM conveyor_jobs WHERE seq = ANY(%s::bigint[])",
                (seqs,),
            )
            return await cur.fetchall()

        rows = await self._call(work, changes=False)
        found = {self._id(row[0]): self._job(row) for row in rows}
        return [found.get(job_id) if isinstance(job_id, str) else None for job_id in ids]

    def _job(self, row: tuple[Any, ...]) -> Job:
        (
            seq,
            queue,
            state,
            payload,
            priority,
            attempts,
            max_attempts,
            vis,
            base,
            cap,
            enqueued_at,
            ready_at,
            expires_at,
            worker_id,
            deadline,
            last_error,
            died_at,
            key,
            timeout_s,
            partition,
            result,
            completed_at,
            progress,
            waiting_for,
            after,
        ) = row
        return Job(
            id=self._id(seq),
            queue=queue,
            state=JobState(state),
            payload_json=bytes(payload),
            priority=priority,
            attempts=attempts,
            max_attempts=max_attempts,
            visibility_timeout_s=vis,
            backoff_base_s=base,
            backoff_max_s=cap,
            enqueued_at=enqueued_at,
            ready_at=ready_at,
            expires_at=expires_at,
            worker_id=worker_id,
            deadline=deadline,
            last_error=last_error,
            died_at=died_at,
            key=key,
            seq=seq,
            timeout_s=timeout_s,
            partition=partition or None,
            result_json=None if result is None else bytes(result),
            completed_at=completed_at,
            progress_json=None if progress is None else bytes(progress),
            after=tuple(self._id(dep) for dep in after) if after else (),
            waiting_for=waiting_for if state == "waiting" else 0,
        )

    async def _set_queue(self, name: str, opts: QueueOpts | None = None) -> None:
        guard.queue_name(name)
        checked = None if opts is None else guard.check_opts(opts)

        async def work(now: float) -> None:
            async with self._conn.transaction():
                await self._queues([name])
                if checked is not None:
                    await self._conn.execute(
                        "UPDATE conveyor_queues SET visibility_timeout_s = %s, "
                        "max_attempts = %s, backoff_base_s = %s, backoff_max_s = %s, "
                        "expires_s = %s, retention_s = %s, completed_retention_s = %s "
                        "WHERE name = %s",
                        (
                            checked.visibility_timeout_s,
                            checked.max_attempts,
                            checked.backoff_base_s,
                            checked.backoff_max_s,
                            checked.expires_s,
                            checked.dead_letter_retention_s,
                            checked.completed_retention_s,
                            name,
                        ),
                    )
                    await self._conn.execute("SELECT pg_notify('conveyor', 'q:' || %s)", (name,))
            if checked is not None:
                self._opts.pop(name, None)
                self._keeping = None

        await self._call(work, changes=True)

    async def _queues_made(self) -> list[str]:
        async def work(now: float) -> list[str]:
            cur = await self._conn.execute("SELECT name FROM conveyor_queues ORDER BY made")
            return [row[0] for row in await cur.fetchall()]

        return await self._call(work, changes=False)

    async def _pause(self, queue: str) -> None:
        guard.queue_name(queue)

        async def work(now: float) -> None:
            async with self._conn.transaction():
                await self._queues([queue])
                await self._conn.execute(
                    "UPDATE conveyor_queues SET paused = true WHERE name = %s", (queue,)
                )

        await self._call(work, changes=True)

    async def _resume(self, queue: str) -> bool:
        async def work(now: float) -> bool:
            cur = await self._conn.execute(
                "WITH r AS (UPDATE conveyor_queues SET paused = false WHERE name = %s "
                "RETURNING name) SELECT name, pg_notify('conveyor', 'w:' || name) FROM r",
                (queue,),
            )
            return bool(await cur.fetchall())

        resumed = await self._call(work, changes=True)
        if resumed:
            self._listeners.work_waiting(frozenset([queue]))
        return resumed

    async def _redrive(self, ids: Sequence[str]) -> list[bool]:
        seqs = [seq for job_id in ids if (seq := self._seq(job_id)) is not None]

        async def work(now: float) -> list[tuple[Any, ...]]:
            if not seqs:
                return []
            conn = self._conn
            async with conn.transaction():
                await conn.execute(_HOLD_REDRIVEN, {"seqs": seqs})
                cur = await conn.execute(_REDRIVE, {"now": now, "seqs": seqs})
                rows = await cur.fetchall()
                await self._relink(now, rows)
            return rows

        rows = await self._call(work, changes=True)
        done = _once({self._id(row[0]) for row in rows}, ids)
        self._listeners.work_waiting(frozenset(row[1] for row in rows))
        return done

    async def _relink(self, now: float, rows: list[tuple[Any, ...]]) -> None:
        """File again the redriven rows (``(seq, queue, deps)``) that have dependencies:
        they wait for those not acked yet, or die again at once (DEP-5)."""
        linked = sorted(row[0] for row in rows if row[2])
        if linked:
            cur = await self._conn.execute(_LINK, (linked, now))
            await self._released(now, await cur.fetchall(), [])

    async def _purge_dead(self, queue: str) -> int | None:
        async def work(now: float) -> int | None:
            if not await self._known([queue]):
                return None
            cur = await self._conn.execute(
                "WITH d AS (DELETE FROM conveyor_jobs WHERE queue = %s AND state = 'dead' "
                "RETURNING 1) SELECT count(*) FROM d",
                (queue,),
            )
            row = await cur.fetchone()
            return 0 if row is None else int(row[0])

        return await self._call(work, changes=True)

    async def _dead_jobs(self, queue: str, offset: int = 0, limit: int = 20) -> list[Job]:
        async def work(now: float) -> list[Job]:
            conn = self._conn
            if not await self._known([queue]):
                return []
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgument("offset", f"must be an int >= 0, got {offset!r}")
            guard.positive_int("limit", limit)
            cur = await conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM conveyor_jobs WHERE queue = %s AND state = 'dead' "
                "ORDER BY died_at DESC, seq DESC OFFSET %s LIMIT %s",
                (queue, offset, limit),
            )
            return [self._job(row) for row in await cur.fetchall()]

        return await self._call(work, changes=False)

    async def _stats(self, queues: Sequence[str] | None = None) -> dict[str, QueueStats]:
        names = None if queues is None else [name for name in queues if isinstance(name, str)]

        async def work(now: float) -> dict[str, QueueStats]:
            async with self._conn.transaction():
                return await self._stats_at(now, names)

        return await self._call(work, changes=False)

    async def _stats_at(self, now: float, names: list[str] | None) -> dict[str, QueueStats]:
        """The stats of the queues ``names`` (every queue for ``None``), in the caller's
        transaction."""
        conn = self._conn
        # Scheduled jobs that matured since move to ready, each once (CST-2).
        await conn.execute(_MATURE, {"now": now, "names": names})
        await self._fold(names)
        cur = await conn.execute(_STATS, {"names": names})
        rows = await cur.fetchall()
        flowing = [row[0] for row in rows if row[13]]
        flows: dict[str, tuple[Any, ...]] = {}
        if flowing:
            # (The planner's guess of its cost is far above what it costs, and JIT
            # compiling it would cost more than running it.)
            await conn.execute("SET LOCAL jit = off")
            cur = await conn.execute(_FLOW_STATS, {"now": now, "names": flowing}, prepare=False)
            flows = {row[0]: row for row in await cur.fetchall()}
        found = {
            row[0]: QueueStats(
                ready=row[1] or 0,
                scheduled=row[2] or 0,
                processing=row[3] or 0,
                dead=row[4] or 0,
                paused=row[5],
                totals=QueueTotals(*(count or 0 for count in row[6:12])),
                oldest_ready_at=row[12],
                completed=row[14] or 0,
                waiting=row[15] or 0,
                **(_flow_fields(flows[row[0]], now, row[1] or 0) if row[0] in flows else {}),
            )
            for row in rows
        }
        if names is None:
            return found
        return {name: found[name] for name in names if name in found}

    async def _list_jobs(
        self,
        queue: str,
        state: str,
        after: tuple[Any, ...] | None,
        limit: int,
        search: str | None,
    ) -> JobList | None:
        if state not in LIST_STATES:
            raise InvalidArgument("state", f"must be one of {', '.join(LIST_STATES)}")
        guard.positive_int("limit", limit)
        if after is not None:
            check_list_key(state, after)
        if search is not None and not isinstance(search, str):
            raise InvalidArgument("search", "must be a string")
        rows_of, order, keyset = _LIST[state]
        params: dict[str, Any] = {"q": queue}
        where = f"queue = %(q)s AND {rows_of}"
        if after is not None:
            where += f" AND {keyset}"
            if state == "processing":
                params["k0"] = f"{self.id_prefix}L{after[0]:x}"
            else:
                params.update({f"k{i}": value for i, value in enumerate(after)})
        if search is None:
            sql = f"SELECT {_JOB_COLUMNS}, lease FROM conveyor_jobs WHERE {where} "
            sql += f"ORDER BY {order} LIMIT %(n)s"
            params["n"] = limit + 1  # (one more: whether a next page exists)
        else:
            # At most SEARCH_SCAN rows are looked at (LST-4); the last one comes too, so
            # that the next call goes on after it, match or not.
            sql = (
                f"WITH w AS (SELECT {_JOB_COLUMNS}, lease, "
                f"row_number() OVER (ORDER BY {order}) AS n "
                f"FROM (SELECT * FROM conveyor_jobs WHERE {where} ORDER BY {order} "
                "LIMIT %(scan)s) s) "
                "SELECT * FROM w WHERE n = (SELECT max(n) FROM w) OR seq = %(seq)s "
                "OR key = %(search)s OR position(%(needle)s::bytea IN payload) > 0 "
                "ORDER BY n"
            )
            params.update(
                scan=SEARCH_SCAN,
                seq=self._seq(search),
                search=search,
                needle=search.encode(),
            )

        async def work(now: float) -> tuple[list[tuple[Any, ...]], dict[str, QueueStats]]:
            async with self._conn.transaction():
                stats = await self._stats_at(now, [queue])
                if not stats:
                    return [], stats
                cur = await self._conn.execute(sql, params, prepare=False)
                return await cur.fetchall(), stats

        rows, stats = await self._call(work, changes=False)
        counts = stats.get(queue)
        if counts is None:
            return None
        total = counts.count(state)
        if search is None:
            more = len(rows) > limit
            page = rows[:limit]
            next_key = _list_key(state, page[-1]) if more else None
            return JobList([self._job(row[:-1]) for row in page], next_key, total)
        # The window's rows that matched, and its last row (a match or not).
        last_n = rows[-1][-1] if rows else 0
        needle = search.encode()
        seq = self._seq(search)
        jobs: list[tuple[Any, ...]] = []
        for row in rows:
            if row[0] == seq or row[17] == search or needle in bytes(row[3]):
                if len(jobs) == limit:
                    return JobList(
                        [self._job(r[:-2]) for r in jobs], _list_key(state, jobs[-1]), total
                    )
                jobs.append(row)
        next_key = _list_key(state, rows[-1]) if last_n >= SEARCH_SCAN else None
        return JobList([self._job(r[:-2]) for r in jobs], next_key, total)

    async def _redrive_all(self, queue: str) -> int | None:
        """OPS-8: the queue's dead rows at the call, longest dead first, one transaction
        per REDRIVE_CHUNK rows (each a range of conveyor_jobs_dead)."""
        counted = await self._stats([queue])
        if queue not in counted:
            return None
        left = counted[queue].dead
        done = 0
        while done < left:
            step = min(left - done, REDRIVE_CHUNK)

            async def work(now: float, step: int = step) -> list[tuple[Any, ...]]:
                async with self._atomic():
                    cur = await self._conn.execute(
                        _REDRIVE_OLDEST, {"now": now, "q": queue, "n": step}, prepare=False
                    )
                    rows = await cur.fetchall()
                    await self._relink(now, rows)
                return rows

            rows = await self._call(work, changes=True)
            if not rows:
                break
            done += len(rows)
            self._listeners.work_waiting(frozenset([queue]))
        return done

    async def _sweep(self) -> SweepResult:
        return await self._call(self._sweep_at, changes=True)

    async def close(self) -> None:
        if self._closed:
            return
        if self._followed_any and self.failed is None:
            # This broker's follows end with it: a row left behind would keep the
            # follows' look-ups running for every ack.
            with contextlib.suppress(Exception):
                await self._call(self._drop_my_follows, changes=False)
        self._closed = True
        for timer in (self._timer, self._lead_timer, self._poll_timer, self._sched_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._lead_timer = self._poll_timer = self._sched_timer = None
        for task in (self._sweeper, self._refresh, self._sched_refresher, self._firer):
            if task is not None and not task.done():
                await task  # (it raises nothing)
        for task in (self._heard, self._reviver):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        hearing, self._hearing = self._hearing, None
        if hearing is not None:
            if self._leading:
                # Hand the lead over now, not when the server notices the session ended:
                # a broker started next on the database is the leader from its start.
                with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                    await asyncio.wait_for(
                        hearing.execute("SELECT pg_advisory_unlock(%s)", (_LEADER_LOCK,)), 5
                    )
            self._leading = False
            await close_quietly(hearing)
        async with self._lock:
            main, self._main = self._main, None
            if main is not None:
                await close_quietly(main)


async def _nothing() -> None:
    return None


def _spec_of(
    schedule_id: str, queue: str, fields: dict[str, Any], paused: bool, payload: Any = None
) -> ScheduleSpec:
    return ScheduleSpec(
        id=schedule_id,
        queue=queue,
        payload=payload,
        paused=paused,
        **{name: fields[name] for name in _SPEC_FIELDS if name in fields},
    )


def _schedule_info(row: tuple[Any, ...]) -> ScheduleInfo:
    """A ``_SCHEDULE_COLUMNS`` row as the interface gives it."""
    sid, queue, payload, fields, paused, next_at, last_at, last_job, fired, made, changed = row
    return ScheduleInfo(
        spec=_spec_of(sid, queue, fields, paused, json.loads(bytes(payload))),
        next_at=next_at,
        last_at=last_at,
        last_job=last_job,
        fired=int(fired),
        created_at=made,
        updated_at=changed,
    )


def _schedule_job(spec: ScheduleSpec, payload: Any, key: str | None) -> Enqueue:
    """The job a tick (or a run-now) of ``spec`` enqueues: its payload, its options."""
    return Enqueue(
        spec.queue,
        payload,
        priority=spec.priority,
        expires_s=spec.expires_s,
        visibility_timeout_s=spec.visibility_timeout_s,
        max_attempts=spec.max_attempts,
        backoff_base_s=spec.backoff_base_s,
        key=key,
        timeout_s=spec.timeout_s,
        partition=spec.partition,
    )


def _worker_problem(claim: Claim) -> InvalidArgument | None:
    try:
        guard.worker_id(claim.worker_id)
    except InvalidArgument as exc:
        return exc
    return None


def _claim_problem(claim: Claim) -> InvalidArgument | None:
    """What the engine's claim guards say of ``claim`` (CLM-9: the worker id first)."""
    problem = _worker_problem(claim)
    if problem is not None:
        return problem
    if isinstance(claim.n, bool) or not isinstance(claim.n, int):
        return InvalidArgument("n", f"must be an int, got {type(claim.n).__name__}")
    return None


def _list_key(state: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The list_jobs key of a listed row (``_JOB_COLUMNS`` then its lease), as
    ``engine.Queue.list_jobs`` makes it."""
    if state == "ready":
        return (row[4], row[11], row[0])  # priority, ready_at, seq
    if state == "scheduled":
        return (row[11], row[0])
    if state == "processing":
        return (lease_number(row[_LISTED_LEASE]),)
    if state == "completed":
        return (row[21], row[0])  # completed_at, seq
    if state == "waiting":
        return (row[10], row[0])  # enqueued_at, seq
    return (row[16], row[0])  # died_at, seq


def _opts(row: tuple[Any, ...]) -> QueueOpts:
    _, vis, attempts, base, cap, expires, retention, keep = row
    return QueueOpts(
        visibility_timeout_s=vis,
        max_attempts=attempts,
        backoff_base_s=base,
        backoff_max_s=cap,
        expires_s=expires,
        dead_letter_retention_s=retention,
        completed_retention_s=keep,
    )


def _backoff(attempts: int, base: float, cap: float, rng: random.Random) -> float:
    """The engine's equal-jitter delay (RTY-2 to RTY-4): one draw."""
    exponent = min(attempts - 1, _MAX_EXPONENT)
    exp = min(cap, base * 2.0**exponent)
    return exp / 2 + rng.random() * (exp / 2)


def _unknown(field: str, job_id: object) -> InvalidArgument:
    """The refusal of a dependency the table does not hold (DEP-7), in the engine's words."""
    return InvalidArgument(
        field,
        f"no job {str(job_id)[:80]!r} is known (a dependency must be a live job, a member "
        "of the same group, or a finished job still kept: completed_retention_s)",
    )


def _once(hit: set[Any], items: Sequence[Any]) -> list[bool]:
    """For each item, whether it is in ``hit`` and not an earlier item: a one-shot
    operation repeated in one batch lands once."""
    seen: set[Any] = set()
    out: list[bool] = []
    for item in items:
        try:
            ok = item in hit and item not in seen
        except TypeError:
            ok = False
        if ok:
            seen.add(item)
        out.append(ok)
    return out


def _first(landed: list[bool], items: Sequence[Any]) -> list[bool]:
    """``landed``, each item after its first landing answered ``False``."""
    seen: set[Any] = set()
    out: list[bool] = []
    for item, ok in zip(items, landed, strict=True):
        ok = ok and item not in seen
        if ok:
            seen.add(item)
        out.append(ok)
    return out


def _implements(backend: PostgresBackend) -> Backend:
    return backend  # (mypy checks here that the class is a Backend)
