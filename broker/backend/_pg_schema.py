"""The PostgreSQL backend's schema, versioned: ``MIGRATIONS[i]`` takes a database from
version ``i`` to ``i + 1``, and ``migrate`` applies the missing ones at start.

Tables:

* ``conveyor_schema``: the one row saying which version the database is at.
* ``conveyor_meta``: the table's id prefix (fixed when the database is made, so that
  ids stay unique over the table's whole life, JOB-3).
* ``conveyor_queues``: each queue's options and whether it is paused.
* ``conveyor_counts``: each queue's counts by state and running totals, as rows of
  deltas that stats sum (CST-4: counters, never the jobs). Statement triggers on
  ``conveyor_jobs`` add the counts and the totals a transition shows (enqueued,
  retried, dead, expired), one row per queue and statement; the statements that delete
  add the two a delete cannot tell apart (completed, cancelled).
* ``conveyor_jobs``: one row per live job, the engine's fields (JOB-3). ``due`` is when
  the row is claimable (its ready time while pending, its deadline while processing,
  CLM-2 and CLM-6); ``sched`` marks a pending row counted as scheduled, moved to ready
  when a ``stats`` call finds it matured (each once, as the engine does).
* ``conveyor_claim``: the claim of one request, a function so that a claim is one
  statement: it walks the claimable rows of each queue in order with ``FOR UPDATE
  SKIP LOCKED``, one row at a time, kills the expired and used-up rows it meets
  (CLM-3 to CLM-5) and claims the rest until it has ``n``.
"""

from __future__ import annotations

from psycopg import AsyncConnection

from ..store import StoreError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

# Taken for the migration's transaction, so that brokers starting together migrate once.
_LOCK_ID = 0x636F6E76  # "conv"

_V1 = """
CREATE TABLE conveyor_meta (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    id_prefix text NOT NULL
);

CREATE TABLE conveyor_queues (
    name text PRIMARY KEY,
    made bigint GENERATED ALWAYS AS IDENTITY,
    visibility_timeout_s float8 NOT NULL,
    max_attempts int NOT NULL,
    backoff_base_s float8 NOT NULL,
    backoff_max_s float8 NOT NULL,
    expires_s float8,
    retention_s float8,
    paused boolean NOT NULL DEFAULT false
);

CREATE SEQUENCE conveyor_job_seq;
CREATE SEQUENCE conveyor_lease_seq;

CREATE TABLE conveyor_jobs (
    seq bigint PRIMARY KEY,
    queue text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'processing', 'dead')),
    payload bytea NOT NULL,
    priority int NOT NULL,
    attempts int NOT NULL DEFAULT 0,
    max_attempts int NOT NULL,
    visibility_timeout_s float8 NOT NULL,
    backoff_base_s float8 NOT NULL,
    backoff_max_s float8 NOT NULL,
    enqueued_at float8 NOT NULL,
    ready_at float8 NOT NULL,
    expires_at float8,
    worker_id text,
    deadline float8,
    lease text,
    last_error text,
    died_at float8,
    key text,
    sched boolean NOT NULL DEFAULT false,
    due float8 GENERATED ALWAYS AS (
        CASE state WHEN 'pending' THEN ready_at WHEN 'processing' THEN deadline END
    ) STORED
);

-- Claim order within a queue (CLM-6).
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, priority DESC, due, seq)
    WHERE due IS NOT NULL;
-- ENQ-10: one live job per key and queue.
CREATE UNIQUE INDEX conveyor_jobs_key ON conveyor_jobs (queue, key) WHERE key IS NOT NULL;
-- The timed events (TIM-4) and the sweep (DLQ-3).
CREATE INDEX conveyor_jobs_pending ON conveyor_jobs (ready_at) WHERE state = 'pending';
CREATE INDEX conveyor_jobs_sched ON conveyor_jobs (queue, ready_at) WHERE sched;
CREATE INDEX conveyor_jobs_leases ON conveyor_jobs (deadline) WHERE state = 'processing';
CREATE INDEX conveyor_jobs_used_up ON conveyor_jobs (deadline)
    WHERE state = 'processing' AND attempts >= max_attempts;
CREATE INDEX conveyor_jobs_expiry ON conveyor_jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state <> 'dead';
CREATE INDEX conveyor_jobs_dead ON conveyor_jobs (queue, died_at, seq) WHERE state = 'dead';

-- Counts and totals (CST-4), as deltas: each changing statement adds one row per queue it
-- changed, and nothing ever updates a shared row, so brokers never queue behind one
-- another's counter (nor deadlock on two). Stats sum a queue's rows and fold them into one.
CREATE TABLE conveyor_counts (
    queue text NOT NULL,
    n_ready bigint NOT NULL DEFAULT 0,
    n_scheduled bigint NOT NULL DEFAULT 0,
    n_processing bigint NOT NULL DEFAULT 0,
    n_dead bigint NOT NULL DEFAULT 0,
    enqueued bigint NOT NULL DEFAULT 0,
    completed bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    dead bigint NOT NULL DEFAULT 0,
    expired bigint NOT NULL DEFAULT 0,
    cancelled bigint NOT NULL DEFAULT 0
);
CREATE INDEX conveyor_counts_queue ON conveyor_counts (queue);

CREATE FUNCTION conveyor_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, enqueued)
    SELECT queue, count(*) FILTER (WHERE NOT sched), count(*) FILTER (WHERE sched), count(*)
    FROM new_rows GROUP BY queue;
    RETURN NULL;
END $$;

CREATE FUNCTION conveyor_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, n_processing, n_dead,
        retried, dead, expired)
    SELECT * FROM (
        SELECT n.queue,
               sum((n.state = 'pending' AND NOT n.sched)::int
                   - (o.state = 'pending' AND NOT o.sched)::int) AS r,
               sum((n.state = 'pending' AND n.sched)::int
                   - (o.state = 'pending' AND o.sched)::int) AS s,
               sum((n.state = 'processing')::int - (o.state = 'processing')::int) AS p,
               sum((n.state = 'dead')::int - (o.state = 'dead')::int) AS x,
               count(*) FILTER (WHERE o.state = 'processing' AND n.state = 'pending') AS ret,
               count(*) FILTER (WHERE o.state <> 'dead' AND n.state = 'dead') AS died,
               count(*) FILTER (
                   WHERE o.state <> 'dead' AND n.state = 'dead' AND n.last_error = 'expired'
               ) AS exp
        FROM new_rows n JOIN old_rows o USING (seq)
        GROUP BY n.queue
    ) d
    WHERE (d.r, d.s, d.p, d.x, d.ret, d.died) <> (0, 0, 0, 0, 0, 0);
    RETURN NULL;
END $$;

CREATE FUNCTION conveyor_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, n_processing, n_dead)
    SELECT queue,
           -count(*) FILTER (WHERE state = 'pending' AND NOT sched),
           -count(*) FILTER (WHERE state = 'pending' AND sched),
           -count(*) FILTER (WHERE state = 'processing'),
           -count(*) FILTER (WHERE state = 'dead')
    FROM old_rows GROUP BY queue;
    RETURN NULL;
END $$;

CREATE TRIGGER conveyor_jobs_inserted AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_insert();
CREATE TRIGGER conveyor_jobs_updated AFTER UPDATE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_update();
CREATE TRIGGER conveyor_jobs_deleted AFTER DELETE ON conveyor_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_count_delete();

CREATE FUNCTION conveyor_claim(
    p_worker text, p_queues text[], p_n int, p_now float8, p_prefix text
) RETURNS TABLE (
    ord bigint, seq bigint, queue text, lease text, payload bytea, attempts int,
    max_attempts int, deadline float8, priority int, visibility_timeout_s float8,
    ready_at float8, enqueued_at float8
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q text;
    cur refcursor;
    r record;
    got int := 0;
    taken bigint[] := '{}';
    expired bigint[] := '{}';
    used_up bigint[] := '{}';
BEGIN
    FOREACH q IN ARRAY p_queues LOOP
        EXIT WHEN got >= p_n;
        -- A queue that does not exist, or is paused, hands out nothing (OPS-4).
        CONTINUE WHEN NOT EXISTS (
            SELECT 1 FROM conveyor_queues cq WHERE cq.name = q AND NOT cq.paused
        );
        -- One row at a time, so that only the rows this claim meets are locked.
        OPEN cur FOR
            SELECT j.seq, j.attempts, j.max_attempts, j.expires_at
            FROM conveyor_jobs j
            WHERE j.queue = q AND j.due <= p_now
            ORDER BY j.priority DESC, j.due, j.seq
            FOR UPDATE SKIP LOCKED;
        LOOP
            EXIT WHEN got >= p_n;
            FETCH cur INTO r;
            EXIT WHEN NOT FOUND;
            IF r.expires_at IS NOT NULL AND p_now >= r.expires_at THEN
                expired := expired || r.seq;  -- CLM-4
            ELSIF r.attempts >= r.max_attempts THEN
                used_up := used_up || r.seq;  -- CLM-3
            ELSE
                taken := taken || r.seq;
                got := got + 1;
            END IF;
        END LOOP;
        CLOSE cur;
    END LOOP;
    IF cardinality(expired) > 0 THEN
        UPDATE conveyor_jobs j SET state = 'dead', died_at = p_now, last_error = 'expired',
            worker_id = NULL, lease = NULL, deadline = NULL, sched = false
        WHERE j.seq = ANY(expired);
    END IF;
    IF cardinality(used_up) > 0 THEN
        UPDATE conveyor_jobs j SET state = 'dead', died_at = p_now,
            last_error = 'max attempts exceeded',
            worker_id = NULL, lease = NULL, deadline = NULL, sched = false
        WHERE j.seq = ANY(used_up);
    END IF;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH t AS (
        SELECT u.seq, u.ord FROM unnest(taken) WITH ORDINALITY AS u(seq, ord)
    ), c AS (
        UPDATE conveyor_jobs j SET state = 'processing', attempts = j.attempts + 1,
            worker_id = p_worker, sched = false,
            lease = p_prefix || 'L' || to_hex(nextval('conveyor_lease_seq')),
            deadline = p_now + j.visibility_timeout_s
        FROM t WHERE j.seq = t.seq
        RETURNING t.ord, j.seq, j.queue, j.lease, j.payload, j.attempts, j.max_attempts,
            j.deadline, j.priority, j.visibility_timeout_s, j.ready_at, j.enqueued_at
    )
    SELECT * FROM c ORDER BY c.ord;
END $$;
"""

# v2: the jobs' triggers tell the other brokers, on the channel "conveyor" (delivered at
# commit), of the queues where work may be waiting: "w:" and the queue's name, for a job
# enqueued, put back to pending (retry, redrive) or whose lease was ended early (lapse).
# Cancels ("c:" and the seq) and resumes are told by the statements that make them.
_V2 = """
CREATE OR REPLACE FUNCTION conveyor_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, enqueued)
    SELECT queue, count(*) FILTER (WHERE NOT sched), count(*) FILTER (WHERE sched), count(*)
    FROM new_rows GROUP BY queue;
    PERFORM pg_notify('conveyor', 'w:' || d.queue)
    FROM (SELECT DISTINCT queue FROM new_rows) d;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION conveyor_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, n_processing, n_dead,
        retried, dead, expired)
    SELECT d.queue, d.r, d.s, d.p, d.x, d.ret, d.died, d.exp FROM (
        SELECT n.queue,
               sum((n.state = 'pending' AND NOT n.sched)::int
                   - (o.state = 'pending' AND NOT o.sched)::int) AS r,
               sum((n.state = 'pending' AND n.sched)::int
                   - (o.state = 'pending' AND o.sched)::int) AS s,
               sum((n.state = 'processing')::int - (o.state = 'processing')::int) AS p,
               sum((n.state = 'dead')::int - (o.state = 'dead')::int) AS x,
               count(*) FILTER (WHERE o.state = 'processing' AND n.state = 'pending') AS ret,
               count(*) FILTER (WHERE o.state <> 'dead' AND n.state = 'dead') AS died,
               count(*) FILTER (
                   WHERE o.state <> 'dead' AND n.state = 'dead' AND n.last_error = 'expired'
               ) AS exp
        FROM new_rows n JOIN old_rows o USING (seq)
        GROUP BY n.queue
    ) d
    WHERE (d.r, d.s, d.p, d.x, d.ret, d.died) <> (0, 0, 0, 0, 0, 0);
    PERFORM pg_notify('conveyor', 'w:' || n.queue)
    FROM (
        SELECT DISTINCT n.queue FROM new_rows n JOIN old_rows o USING (seq)
        WHERE (n.state = 'pending' AND o.state <> 'pending')
            OR (n.state = 'processing' AND o.state = 'processing' AND n.deadline < o.deadline)
    ) n;
    RETURN NULL;
END $$;
"""

MIGRATIONS: tuple[str, ...] = (_V1, _V2)
SCHEMA_VERSION = len(MIGRATIONS)


async def migrate(conn: AsyncConnection[tuple[object, ...]], id_prefix: str) -> str:
    """Bring the database to ``SCHEMA_VERSION``; the table's id prefix (``id_prefix``
    for a new one). Raises ``StoreError`` for a schema newer than this code."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_ID,))
        await conn.execute("CREATE TABLE IF NOT EXISTS conveyor_schema (version int NOT NULL)")
        cur = await conn.execute("SELECT version FROM conveyor_schema")
        row = await cur.fetchone()
        if row is None:
            await conn.execute("INSERT INTO conveyor_schema (version) VALUES (0)")
            version = 0
        else:
            version = int(row[0])  # type: ignore[call-overload]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"postgres: the database's schema is version {version}, newer than this "
                f"broker's {SCHEMA_VERSION}; run a newer broker"
            )
        for step in MIGRATIONS[version:]:
            await conn.execute(step.encode())
        if version < SCHEMA_VERSION:
            await conn.execute("UPDATE conveyor_schema SET version = %s", (SCHEMA_VERSION,))
        await conn.execute(
            "INSERT INTO conveyor_meta (id_prefix) VALUES (%s) ON CONFLICT DO NOTHING",
            (id_prefix,),
        )
        cur = await conn.execute("SELECT id_prefix FROM conveyor_meta")
        meta = await cur.fetchone()
        assert meta is not None
        return str(meta[0])
