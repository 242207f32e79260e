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
* ``conveyor_schedules``: each schedule's definition and progress (``next_at``, the tick
  it fires at next, indexed where set).
* ``conveyor_enqueue``: an enqueue an application makes in its own transaction, from
  any language (v3, docs/postgres.md): the engine's guards, resolution and keys in SQL,
  its refusals raised as ``<code>: <field>: <problem>``.
* ``conveyor_deps``: job dependencies, an edge per dependency a job named (see
  ``_V_DEPS_TABLES``), and the functions that follow them (``conveyor_deps_*``).
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

# v3: conveyor_enqueue, an enqueue made by the caller's own transaction (docs/postgres.md):
# the engine's guards (ENQ-7 to ENQ-9, LIM-1, LIM-5, LIM-6) and resolution (ENQ-2, ENQ-5,
# ENQ-6) and the keys' rule (ENQ-10), written again in SQL because an application calls it
# from any language, with no broker in the call; tests/postgres/test_transactional.py holds
# the two to the same answers. Only functions: it may run in any order with other steps.
_V3 = r"""
CREATE OR REPLACE FUNCTION conveyor_refuse(code text, field text, problem text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- The message starts with the protocol's error code and the field, as the broker's
    -- error replies do; COLUMN carries the field alone for the drivers that show it.
    RAISE EXCEPTION USING
        MESSAGE = code || ': ' || field || ': ' || problem,
        ERRCODE = CASE code WHEN 'too_large' THEN '54000' ELSE '22023' END,
        COLUMN = field;
END $$;

-- A value as the engine's messages show it: quoted, cut to 40 characters.
CREATE OR REPLACE FUNCTION conveyor_describe(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(r) <= 40 THEN r ELSE left(r, 37) || '...' END
    FROM (SELECT '''' || value || '''' AS r) q
$$;

CREATE OR REPLACE FUNCTION conveyor_finite(field text, value float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) THEN
        PERFORM conveyor_refuse('invalid_argument', field, 'must be finite, got ' || value);
    END IF;
    RETURN value;
END $$;

-- An integer option: a count in [1, high] when low is 1, else a value in [low, high].
CREATE OR REPLACE FUNCTION conveyor_int(field text, value numeric, low numeric, high numeric)
RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value <> trunc(value) THEN
        PERFORM conveyor_refuse('invalid_argument', field, 'must be an int, got ' || value);
    ELSIF low = 1 AND value < 1 THEN
        PERFORM conveyor_refuse('invalid_argument', field, 'must be >= 1, got ' || value);
    ELSIF low = 1 AND value > high THEN
        PERFORM conveyor_refuse('invalid_argument', field,
            'must be at most ' || high || ', got ' || value);
    ELSIF NOT value BETWEEN low AND high THEN
        PERFORM conveyor_refuse('invalid_argument', field,
            'must be in [' || low || ', ' || high || '], got ' || value);
    END IF;
    RETURN value::int;
END $$;

CREATE OR REPLACE FUNCTION conveyor_enqueue(
    queue text,
    payload json,
    priority numeric DEFAULT 0,
    delay_s float8 DEFAULT NULL,
    run_at float8 DEFAULT NULL,
    expires_s float8 DEFAULT NULL,
    visibility_timeout_s float8 DEFAULT NULL,
    max_attempts numeric DEFAULT NULL,
    backoff_base_s float8 DEFAULT NULL,
    key text DEFAULT NULL
) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- One "now" for the whole job, from the database's clock (epoch seconds, as the
    -- brokers' clocks): clock_timestamp, not now(), which is the transaction's start.
    t float8 := extract(epoch FROM clock_timestamp())::float8;
    q_name text := conveyor_enqueue.queue;
    q conveyor_queues%ROWTYPE;
    prio int;
    delay float8 := conveyor_enqueue.delay_s;
    run float8 := conveyor_enqueue.run_at;
    expires float8 := conveyor_enqueue.expires_s;
    vis float8 := conveyor_enqueue.visibility_timeout_s;
    n_attempts int;
    base float8 := conveyor_enqueue.backoff_base_s;
    k text := conveyor_enqueue.key;
    doc text;
    parsed jsonb;
    data bytea;
    lim bigint;
    ready float8;
    got bigint;
    problem text;
BEGIN
    -- The queue's name first, as the broker checks it before the job (JOB-3).
    IF q_name IS NULL THEN
        PERFORM conveyor_refuse('invalid_argument', 'queue', 'must be a string, got null');
    END IF;
    IF q_name !~ '^[A-Za-z0-9._:-]{1,128}$' THEN
        PERFORM conveyor_refuse('invalid_argument', 'queue',
            'must be 1 to 128 of A-Z a-z 0-9 . _ - : (no spaces), got '
            || conveyor_describe(q_name));
    END IF;
    -- Made on first use with the plain defaults (ENQ-1), as a broker's enqueue makes it.
    -- (Looked for first, so that a queue that exists costs no identity number.)
    INSERT INTO conveyor_queues (name, visibility_timeout_s, max_attempts, backoff_base_s,
        backoff_max_s, expires_s, retention_s)
    SELECT q_name, 300, 3, 5, 3600, NULL, NULL
    WHERE NOT EXISTS (SELECT 1 FROM conveyor_queues cq WHERE cq.name = q_name)
    ON CONFLICT (name) DO NOTHING;
    SELECT * INTO STRICT q FROM conveyor_queues cq WHERE cq.name = q_name;

    -- The guards, in the engine's order (Queue.resolve); NULL means "not set".
    prio := conveyor_int('priority', coalesce(conveyor_enqueue.priority, 0),
        -2147483648, 2147483647);
    IF delay IS NOT NULL THEN
        IF conveyor_finite('delay_s', delay) < 0 THEN
            PERFORM conveyor_refuse('invalid_argument', 'delay_s', 'must be >= 0, got ' || delay);
        END IF;
    END IF;
    IF run IS NOT NULL THEN
        PERFORM conveyor_finite('run_at', run);
    END IF;
    IF expires IS NOT NULL THEN
        IF conveyor_finite('expires_s', expires) <= 0 THEN
            PERFORM conveyor_refuse('invalid_argument', 'expires_s',
                'must be > 0, got ' || expires);
        END IF;
    END IF;
    IF vis IS NOT NULL THEN
        IF conveyor_finite('visibility_timeout_s', vis) <= 0 THEN
            PERFORM conveyor_refuse('invalid_argument', 'visibility_timeout_s',
                'must be > 0, got ' || vis);
        END IF;
    END IF;
    IF conveyor_enqueue.max_attempts IS NOT NULL THEN
        n_attempts := conveyor_int('max_attempts', conveyor_enqueue.max_attempts, 1, 2147483647);
    END IF;
    IF base IS NOT NULL THEN
        IF conveyor_finite('backoff_base_s', base) < 0 THEN
            PERFORM conveyor_refuse('invalid_argument', 'backoff_base_s',
                'must be >= 0, got ' || base);
        END IF;
        IF base > q.backoff_max_s THEN
            PERFORM conveyor_refuse('invalid_argument', 'backoff_base_s',
                'must be <= the queue''s backoff_max_s (' || q.backoff_max_s || '), got '
                || base);
        END IF;
    END IF;
    IF length(k) > 1024 THEN  -- LIM-1
        PERFORM conveyor_refuse('invalid_argument', 'key',
            'must be at most 1024 characters, got ' || length(k));
    END IF;
    IF k = '' THEN
        k := NULL;  -- no key (LIM-1)
    END IF;

    -- The payload: kept as the caller wrote it (the json type keeps the text), checked as
    -- every frame's decoder will read it: valid Unicode (LIM-5), numbers a double holds,
    -- at most 254 levels deep (LIM-6), within the size limit.
    IF conveyor_enqueue.payload IS NULL THEN
        PERFORM conveyor_refuse('invalid_argument', 'payload',
            'must be JSON, got SQL NULL (a JSON null is ''null'')');
    END IF;
    doc := btrim(conveyor_enqueue.payload::text, E' \t\n\r');
    BEGIN
        -- jsonb reads the escapes json leaves as written; it refuses \u0000, which JSON
        -- allows, so that one is swapped for another escape for this check only.
        parsed := replace(doc, '\u0000', '\u0020')::jsonb;
    EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
        GET STACKED DIAGNOSTICS problem = PG_EXCEPTION_DETAIL;
        PERFORM conveyor_refuse('invalid_argument', 'payload',
            'must be strict JSON: ' || coalesce(nullif(problem, ''), SQLERRM));
    END;
    IF jsonb_path_exists(parsed, 'strict $.** ? (@.type() == "number" &&
            (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))') THEN
        PERFORM conveyor_refuse('invalid_argument', 'payload',
            'must be strict JSON, holds a number beyond the range of a double');
    END IF;
    IF jsonb_path_exists(parsed,
            'strict $.**{254} ? (@.type() == "array" || @.type() == "object")') THEN
        PERFORM conveyor_refuse('invalid_argument', 'payload', 'nests deeper than 254 levels');
    END IF;
    data := convert_to(doc, 'UTF8');
    -- The brokers' limit is their own setting; the database's is this one (1 MiB, the
    -- brokers' default, unless set: ALTER DATABASE ... SET conveyor.max_payload_bytes).
    lim := coalesce(nullif(current_setting('conveyor.max_payload_bytes', true), '')::bigint,
        1048576);
    IF octet_length(data) > lim THEN
        PERFORM conveyor_refuse('too_large', 'payload',
            'is ' || octet_length(data) || ' bytes encoded, over the limit of ' || lim
            || ' bytes');
    END IF;

    -- Resolved against the queue: the call wins, then the queue (ENQ-2, ENQ-5, ENQ-6).
    IF delay IS NOT NULL THEN
        ready := t + delay;
    ELSIF run IS NOT NULL THEN
        ready := greatest(run, t);
    ELSE
        ready := t;
    END IF;
    expires := coalesce(expires, q.expires_s);
    -- A key another live job of the queue holds gives that job's id, changing nothing
    -- (ENQ-10); if that job goes between the insert and the look-up, try again.
    FOR attempt IN 1..3 LOOP
        INSERT INTO conveyor_jobs (seq, queue, state, payload, priority, max_attempts,
            visibility_timeout_s, backoff_base_s, backoff_max_s, enqueued_at, ready_at,
            expires_at, key, sched)
        VALUES (nextval('conveyor_job_seq'), q_name, 'pending', data, prio,
            coalesce(n_attempts, q.max_attempts), coalesce(vis, q.visibility_timeout_s),
            coalesce(base, q.backoff_base_s), q.backoff_max_s, t, ready, t + expires, k,
            ready > t)
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING seq INTO got;
        IF got IS NOT NULL THEN
            -- The insert's trigger tells too; told here as well so that this function
            -- keeps its promise whatever the triggers become. PostgreSQL delivers the
            -- notice at commit (none for a rollback), one per queue and transaction.
            PERFORM pg_notify('conveyor', 'w:' || q_name);
            EXIT;
        END IF;
        SELECT j.seq INTO got FROM conveyor_jobs j WHERE j.queue = q_name AND j.key = k;
        EXIT WHEN got IS NOT NULL;
    END LOOP;
    IF got IS NULL THEN
        RAISE EXCEPTION 'key: kept changing hands during the enqueue; try again'
            USING ERRCODE = '40001', COLUMN = 'key';
    END IF;
    RETURN (SELECT m.id_prefix FROM conveyor_meta m) || to_hex(got);
END $$;

-- Its tables are found in the schema it was made in, whatever the caller's search_path
-- (and never in a temporary schema a caller could fill).
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, '
        'float8, numeric, float8, text) SET search_path = %I, pg_temp',
        current_schema()
    );
END $$;
"""

# v4: the leases a worker holds, found without a scan (a worker subscribing through
# any broker: those it did not offer to re-attach are lapsed, see broker/dispatch.py).
# Its predicate is one that only a query naming a worker implies: were it "state =
# 'processing'", the planner would walk it for every ack and heartbeat by lease (which
# say that much too) instead of looking their jobs up by seq.
_V4 = """
CREATE INDEX conveyor_jobs_holder ON conveyor_jobs (worker_id) WHERE worker_id IS NOT NULL;
"""

# v5: the brokers on this table, each row renewed every second while its broker lives
# (the dashboard lists every broker's workers). Unlogged: nothing in it outlives a crash
# of the server that matters; a broker's next second writes it again.
_V5 = """
CREATE UNLOGGED TABLE conveyor_brokers (
    id text PRIMARY KEY,
    info jsonb NOT NULL,
    seen_at float8 NOT NULL
);
"""


def _changed(text: str, *edits: tuple[str, str]) -> str:
    """``text`` with each ``(old, new)`` made, each ``old`` found exactly once: a later
    version of a function is its earlier text with these edits, not a second copy."""
    for old, new in edits:
        if text.count(old) != 1:
            raise AssertionError(f"schema edit: {old!r} found {text.count(old)} times")
        text = text.replace(old, new)
    return text


def _function(version: str, name: str) -> str:
    """The text of function ``name`` as ``version`` made it (up to its closing ``$$;``)."""
    start = version.index(f"FUNCTION {name}(")
    start = version.rindex("CREATE", 0, start)
    return version[start : version.index("END $$;", start) + len("END $$;")]


# v6: a job's own handler time limit (``timeout_s``, docs/worker.md), stored with the
# job and carried in its push: conveyor_claim returns it too, and conveyor_enqueue takes
# it (checked as the engine checks it). A function's result or arguments cannot change
# in place: each is dropped and made again, the same but for these edits. (Every broker
# on the database must then be one that knows v6: an older one's claim reads one column
# too many.)
_V6 = (
    """
ALTER TABLE conveyor_jobs ADD COLUMN timeout_s float8;
DROP FUNCTION conveyor_claim(text, text[], int, float8, text);
"""
    + _changed(
        _function(_V1, "conveyor_claim"),
        (
            "ready_at float8, enqueued_at float8\n)",
            "ready_at float8, enqueued_at float8,\n    timeout_s float8\n)",
        ),
        (
            "j.deadline, j.priority, j.visibility_timeout_s, j.ready_at, j.enqueued_at\n",
            "j.deadline, j.priority, j.visibility_timeout_s, j.ready_at, j.enqueued_at,\n"
            "            j.timeout_s\n",
        ),
    )
    + """
DROP FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, float8, numeric,
    float8, text);
"""
    + _changed(
        _function(_V3, "conveyor_enqueue"),
        (
            "    key text DEFAULT NULL\n)",
            "    key text DEFAULT NULL,\n    timeout_s float8 DEFAULT NULL\n)",
        ),
        (
            "    k text := conveyor_enqueue.key;\n",
            "    k text := conveyor_enqueue.key;\n"
            "    lim_s float8 := conveyor_enqueue.timeout_s;\n",
        ),
        (
            "    IF length(k) > 1024 THEN  -- LIM-1\n",
            "    IF lim_s IS NOT NULL THEN\n"
            "        IF conveyor_finite('timeout_s', lim_s) <= 0 THEN\n"
            "            PERFORM conveyor_refuse('invalid_argument', 'timeout_s',\n"
            "                'must be > 0, got ' || lim_s);\n"
            "        END IF;\n"
            "    END IF;\n"
            "    IF length(k) > 1024 THEN  -- LIM-1\n",
        ),
        (
            "            expires_at, key, sched)\n",
            "            expires_at, key, timeout_s, sched)\n",
        ),
        (
            "t + expires, k,\n            ready > t)",
            "t + expires, k,\n            lim_s, ready > t)",
        ),
    )
    + """
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, '
        'float8, numeric, float8, text, float8) SET search_path = %I, pg_temp',
        current_schema()
    );
END $$;
"""
)

# v7: listing a queue's jobs by state page by page (list_jobs: keyset pagination, each
# state's order an index range), and the oldest ready time of a queue (stats) as one
# index probe. Ready and scheduled are told apart by ``sched``, which the listing and
# stats bring up to date first (_MATURE). Processing rows come in claim order: a lease
# is the table's prefix, "L" and the claim's count in hex without leading zeros, so
# (length, text) orders leases by that count. Dead rows use conveyor_jobs_dead.
_V7 = """
CREATE INDEX conveyor_jobs_list_ready ON conveyor_jobs (queue, (-(priority::bigint)), ready_at, seq)
    WHERE state = 'pending' AND NOT sched;
CREATE INDEX conveyor_jobs_list_sched ON conveyor_jobs (queue, ready_at, seq) WHERE sched;
CREATE INDEX conveyor_jobs_list_claims ON conveyor_jobs (queue, length(lease), lease)
    WHERE state = 'processing';
CREATE INDEX conveyor_jobs_ready_age ON conveyor_jobs (queue, ready_at)
    WHERE state = 'pending' AND NOT sched;
"""

# v8: flow control (docs/contract.md FLW-1 to FLW-10). A job's partition key ('' for
# none, so that the key is one comparable value), a queue's limits and ``flow_until``:
# 'Infinity' while it has limits, else when the last back-off of it or of one of its
# keys ends (NULL: never backed off). A claim takes the flow path (conveyor_claim_flow)
# only while ``flow_until`` is past its now, so a queue without limits claims as before.
# ``conveyor_parts`` holds, per queue and key ('' for the queue itself and its jobs of no
# key), the turn it was last served at (from conveyor_turn_seq), its bucket's ``tat``
# (NULL: full) and its back-off's end: shared by every broker, not kept for long (a
# change of limits empties the buckets). Slots held are counted from the processing
# rows whose lease is valid, so a lapsed lease frees its slot without a write.
_V8_TABLES = """
ALTER TABLE conveyor_jobs ADD COLUMN partition text NOT NULL DEFAULT '';
ALTER TABLE conveyor_queues
    ADD COLUMN concurrency int,
    ADD COLUMN rate int,
    ADD COLUMN per_s float8 NOT NULL DEFAULT 1,
    ADD COLUMN burst int,
    ADD COLUMN partition_concurrency int,
    ADD COLUMN partition_rate int,
    ADD COLUMN partition_per_s float8 NOT NULL DEFAULT 1,
    ADD COLUMN partition_burst int,
    ADD COLUMN flow_until float8;
CREATE SEQUENCE conveyor_turn_seq;
CREATE TABLE conveyor_parts (
    queue text NOT NULL,
    name text NOT NULL,
    turn bigint NOT NULL,
    tat float8,
    until float8,
    PRIMARY KEY (queue, name)
);
-- A key's claim order (the jobs of no key too: their lot takes turns as one more key,
-- and a walk of the queue's claim order to find its first would pass every keyed row);
-- a key's slots held, partial so that jobs of no key pay nothing for it. (A query on the
-- partial one says "partition <> ''" in so many words: the planner proves it from that.)
CREATE INDEX conveyor_jobs_part_claim ON conveyor_jobs (queue, partition, priority DESC, due, seq)
    WHERE due IS NOT NULL;
CREATE INDEX conveyor_jobs_part_held ON conveyor_jobs (queue, partition, deadline)
    WHERE state = 'processing' AND partition <> '';
"""

# The claim of one queue under flow control: up to ``want`` of its claimable rows, as
# FLW-5 orders them, each passing the queue's and its key's limits; the rows picked (the
# caller claims them) and ``wake``, the earliest time a back-off, a bucket or a slot held
# (when its lease lapses) that held something back lets it go (NULL: none did). Claims
# of one queue run one at a time across brokers (the transaction's advisory lock on the
# pair ("conf", hashtext(queue))), so that the counts read stay true until it commits.
# It walks the queue's keys for each job it picks (O(k) probes of the key index each).
_V8_CLAIM_FLOW = """
CREATE FUNCTION conveyor_claim_flow(
    q text, want int, p_now float8, busy bigint[], OUT picked bigint[], OUT wake float8
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    lim conveyor_queues%ROWTYPE;
    own_tat float8;
    own_until float8;
    t float8;
    tol float8;
    pt float8;
    ptol float8;
    held bigint := 0;
    held_p bigint;
    c record;
    blocked text[] := '{}';
    skip bigint[] := busy;
    keys text[] := '{}';
    expired bigint[] := '{}';
    used_up bigint[] := '{}';
    opens float8;
BEGIN
    picked := '{}';
    PERFORM pg_advisory_xact_lock(1668246118, hashtext(q));
    SELECT * INTO lim FROM conveyor_queues cq WHERE cq.name = q;
    INSERT INTO conveyor_parts (queue, name, turn) VALUES (q, '', 0) ON CONFLICT DO NOTHING;
    SELECT p.tat, p.until INTO own_tat, own_until
    FROM conveyor_parts p WHERE p.queue = q AND p.name = '';
    IF lim.rate IS NOT NULL THEN
        t := lim.per_s / lim.rate;
        tol := (coalesce(lim.burst, 1) - 1) * t;
    END IF;
    IF lim.partition_rate IS NOT NULL THEN
        pt := lim.partition_per_s / lim.partition_rate;
        ptol := (coalesce(lim.partition_burst, 1) - 1) * pt;
    END IF;
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO held FROM conveyor_jobs j
        WHERE j.queue = q AND j.state = 'processing' AND j.deadline > p_now;
    END IF;
    LOOP
        EXIT WHEN cardinality(picked) >= want;
        -- The queue's own back-off, concurrency and bucket (FLW-6, FLW-2, FLW-4).
        IF own_until > p_now THEN
            wake := own_until;
            EXIT;
        END IF;
        IF lim.concurrency IS NOT NULL AND held >= lim.concurrency THEN
            -- A slot frees by a release (which tells) or when a lease lapses: then.
            SELECT min(j.deadline) INTO wake FROM conveyor_jobs j
            WHERE j.queue = q AND j.state = 'processing' AND j.deadline > p_now;
            EXIT;
        END IF;
        IF t IS NOT NULL AND own_tat IS NOT NULL AND p_now < own_tat - tol THEN
            wake := own_tat - tol;
            EXIT;
        END IF;
        -- The key whose turn it is (FLW-5): the highest priority first, then the key
        -- served longest ago; keys held by time are left out, and keys found at their
        -- concurrency are (blocked) for the rest of this claim.
        SELECT p.name, f.seq, f.attempts, f.max_attempts, f.expires_at INTO c
        FROM conveyor_parts p
        CROSS JOIN LATERAL (
            SELECT j.seq, j.attempts, j.max_attempts, j.expires_at, j.priority
            FROM conveyor_jobs j
            WHERE j.queue = q AND j.partition = p.name AND j.due <= p_now
                AND j.seq <> ALL(skip)
            ORDER BY j.priority DESC, j.due, j.seq
            LIMIT 1
        ) f
        WHERE p.queue = q AND p.name <> ALL(blocked)
            AND (p.name = '' OR (
                (p.until IS NULL OR p.until <= p_now)
                AND (pt IS NULL OR p.tat IS NULL OR p_now >= p.tat - ptol)))
        ORDER BY f.priority DESC, p.turn
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF c.name <> '' AND lim.partition_concurrency IS NOT NULL THEN
            SELECT count(*) INTO held_p FROM conveyor_jobs j
            WHERE j.queue = q AND j.partition = c.name AND j.partition <> ''
                AND j.state = 'processing' AND j.deadline > p_now;
            held_p := held_p + (SELECT count(*) FROM unnest(keys) k WHERE k = c.name);
            IF held_p >= lim.partition_concurrency THEN
                blocked := blocked || c.name;
                wake := least(wake, (
                    SELECT min(j.deadline) FROM conveyor_jobs j
                    WHERE j.queue = q AND j.partition = c.name AND j.partition <> ''
                        AND j.state = 'processing' AND j.deadline > p_now
                ));
                CONTINUE;
            END IF;
        END IF;
        skip := skip || c.seq;
        -- Another transaction holds the row (a report, a cancel): not claimable now.
        PERFORM 1 FROM conveyor_jobs j WHERE j.seq = c.seq FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        IF c.expires_at IS NOT NULL AND p_now >= c.expires_at THEN
            expired := expired || c.seq;  -- CLM-4: it costs no limit
            CONTINUE;
        ELSIF c.attempts >= c.max_attempts THEN
            used_up := used_up || c.seq;  -- CLM-3
            CONTINUE;
        END IF;
        picked := picked || c.seq;
        keys := keys || c.name;
        held := held + 1;
        IF t IS NOT NULL THEN
            own_tat := greatest(coalesce(own_tat, p_now), p_now) + t;
        END IF;
        UPDATE conveyor_parts p SET turn = nextval('conveyor_turn_seq'),
            tat = CASE WHEN c.name = '' OR pt IS NULL THEN p.tat
                ELSE greatest(coalesce(p.tat, p_now), p_now) + pt END
        WHERE p.queue = q AND p.name = c.name;
    END LOOP;
    IF t IS NOT NULL THEN
        UPDATE conveyor_parts p SET tat = own_tat WHERE p.queue = q AND p.name = '';
    END IF;
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
    IF cardinality(picked) < want THEN
        -- When the first key that time holds back, and that has work, lets it go.
        SELECT min(greatest(coalesce(p.until, '-Infinity'),
            CASE WHEN pt IS NULL OR p.tat IS NULL THEN '-Infinity' ELSE p.tat - ptol END))
        INTO opens
        FROM conveyor_parts p
        WHERE p.queue = q AND p.name <> ''
            AND (p.until > p_now OR (pt IS NOT NULL AND p_now < p.tat - ptol))
            AND EXISTS (
                SELECT 1 FROM conveyor_jobs j
                WHERE j.queue = q AND j.partition = p.name AND j.due <= p_now
            );
        wake := least(wake, opens);
    END IF;
END $$;
"""


# conveyor_claim as v6 made it, taking the flow path for a queue under flow control: the
# rest of it (the path of every other queue) is the same text. A claim held back by time
# returns first a row of NULLs but for ``deadline``, the time it lets go (the caller
# skips it and sets its timer; the other brokers are told as "t:").
_V6_CLAIM = _V6[_V6.index("CREATE FUNCTION conveyor_claim(") :]
_V6_CLAIM = _V6_CLAIM[: _V6_CLAIM.index("END $$;") + len("END $$;")]
_V8 = (
    _V8_TABLES
    + _V8_CLAIM_FLOW
    + _changed(
        _V6_CLAIM,
        ("CREATE FUNCTION conveyor_claim(", "CREATE OR REPLACE FUNCTION conveyor_claim("),
        (
            "    used_up bigint[] := '{}';\nBEGIN\n",
            "    used_up bigint[] := '{}';\n    flow_at float8;\n    fl record;\n"
            "    wake float8;\nBEGIN\n",
        ),
        (
            "        CONTINUE WHEN NOT EXISTS (\n"
            "            SELECT 1 FROM conveyor_queues cq WHERE cq.name = q AND NOT cq.paused\n"
            "        );\n",
            "        SELECT cq.flow_until INTO flow_at FROM conveyor_queues cq\n"
            "        WHERE cq.name = q AND NOT cq.paused;\n"
            "        CONTINUE WHEN NOT FOUND;\n"
            "        IF flow_at > p_now THEN\n"
            "            fl := conveyor_claim_flow(q, p_n - got, p_now, taken);\n"
            "            taken := taken || fl.picked;\n"
            "            got := got + cardinality(fl.picked);\n"
            "            wake := least(wake, fl.wake);\n"
            "            CONTINUE;\n"
            "        END IF;\n",
        ),
        (
            "    IF cardinality(taken) = 0 THEN\n        RETURN;\n",
            "    IF wake IS NOT NULL THEN\n"
            "        PERFORM pg_notify('conveyor', 't:' || wake::text);\n"
            "        RETURN QUERY SELECT NULL::bigint, NULL::bigint, q, NULL::text, NULL::bytea,\n"
            "            NULL::int, NULL::int, wake, NULL::int, NULL::float8, NULL::float8,\n"
            "            NULL::float8, NULL::float8;\n"
            "    END IF;\n"
            "    IF cardinality(taken) = 0 THEN\n        RETURN;\n",
        ),
    )
)


# v9: flow control without walking the keys (FLW-10), idle keys leaving the turns, keyed
# jobs alone paying for the per-key index, transactional enqueue with a partition key,
# and flow locks taken in one order (no deadlock between two brokers' batches).
#
# ``conveyor_parts`` gains a key's place: ``head_pri`` (in the turns: an upper bound of
# the priority of its first claimable row; NULL: not in them) or ``opens`` (waiting: the
# time a bucket, a back-off or its first row not yet due lets it go), so that a claim
# takes the key whose turn it is by one index probe (conveyor_parts_turns) and wakes the
# keys whose time came by another (conveyor_parts_opens). ``idle`` marks a waiting key
# that had nothing left to remember (no slot held, bucket full, no back-off): when its
# work comes it joins the turns last, as a key new to the queue (the engine drops such a
# key, FLW-5). The queue's own row ('') keeps the no-key lot's bound in ``head_pri`` and,
# in ``resync``, a transaction id that a second look at the queue's keys waits for.
#
# Work that comes to a key (an insert, a row put back to pending, a lease ended early)
# is told to the claims by a row of ``conveyor_part_news`` that the jobs' triggers
# append, per statement, key and queue, in a queue with ``flow_until`` set: appending
# takes no lock, so an enqueue never waits for a claim; the next claim of the queue, or
# the leader's sweep at a timed event, folds them in under its lock. A queue whose
# ``flow_until`` is NULL gets no news (a claim sets it back to NULL once a queue's flow
# control ended); when it starts to flow (limits set, a back-off) its keys are read
# from its jobs once, and once more when every transaction that was running then has
# ended (one that enqueued without seeing the change has committed by then).
_V9_TABLES = """
ALTER TABLE conveyor_parts
    ADD COLUMN head_pri int,
    ADD COLUMN opens float8,
    ADD COLUMN idle boolean NOT NULL DEFAULT false,
    ADD COLUMN resync xid8;
CREATE INDEX conveyor_parts_turns ON conveyor_parts (queue, (-(head_pri::bigint)), turn)
    WHERE head_pri IS NOT NULL AND name <> '';
CREATE INDEX conveyor_parts_opens ON conveyor_parts (queue, opens) WHERE opens IS NOT NULL;
CREATE TABLE conveyor_part_news (
    queue text NOT NULL,
    name text NOT NULL,
    priority int NOT NULL,
    turn bigint NOT NULL,
    seqs bigint[] NOT NULL,
    ready boolean NOT NULL,
    at float8
);
CREATE INDEX conveyor_part_news_queue ON conveyor_part_news (queue);
-- Only keyed rows pay for the per-key claim order; the no-key lot is read from
-- conveyor_jobs_claim. (A query on it says "partition <> ''" in so many words.)
DROP INDEX conveyor_jobs_part_claim;
CREATE INDEX conveyor_jobs_part_keyed ON conveyor_jobs (queue, partition, priority DESC, due, seq)
    WHERE due IS NOT NULL AND partition <> '';
-- Parts as v8 left them: every key is looked at again by the next claim, and the no-key
-- lot probed once.
UPDATE conveyor_parts SET opens = '-Infinity' WHERE name <> '';
UPDATE conveyor_parts SET head_pri = 2147483647 WHERE name = '';
"""

# The news a statement's rows bring (see above), appended by the jobs' triggers: per
# queue and key, the best priority, the rows, whether one of them is ready now, and a
# turn taken now (a key new to the queue joins the turns at its first ready job's
# enqueue, as in the engine; with only rows to come, when the first of them is due).
_V9_NEWS = """
    INSERT INTO conveyor_part_news (queue, name, priority, turn, seqs, ready, at)
    SELECT h.queue, h.partition, h.priority,
        CASE WHEN h.partition = '' THEN 0 ELSE nextval('conveyor_turn_seq') END, h.seqs,
        h.ready, h.at
    FROM (
        SELECT n.queue, n.partition, max(n.priority) AS priority, array_agg(n.seq) AS seqs,
            bool_or(n.state <> 'pending' OR NOT n.sched) AS ready, {at} AS at
        FROM {rows}
        JOIN conveyor_queues q ON q.name = n.queue
        WHERE q.flow_until IS NOT NULL{which}
        GROUP BY n.queue, n.partition
        ORDER BY min(n.seq)
    ) h;
    RETURN NULL;
"""

_V9_TRIGGERS = _changed(
    _function(_V2, "conveyor_count_insert"),
    ("    RETURN NULL;\n", _V9_NEWS.format(rows="new_rows n", which="", at="min(n.enqueued_at)")),
) + _changed(
    _function(_V2, "conveyor_count_update"),
    (
        "    RETURN NULL;\n",
        _V9_NEWS.format(
            rows="new_rows n JOIN old_rows o USING (seq)",
            at="NULL::float8",
            which=(
                "\n            AND ((n.state = 'pending' AND o.state <> 'pending')"
                "\n                OR (n.state = 'processing' AND o.state = 'processing'"
                "\n                    AND n.deadline < o.deadline))"
            ),
        ),
    ),
)

_V9_FUNCTIONS = """
-- The flow lock of queue q for this transaction (the pair ("conf", hashtext(q))). Locks
-- are waited for in one order, by hashtext, so that two transactions never wait for each
-- other: one taken out of that order is only tried, and then false says it is held.
CREATE FUNCTION conveyor_flow_lock(q text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    k int := hashtext(q);
    top int := nullif(current_setting('conveyor.flow_lock', true), '')::int;
BEGIN
    IF top IS NULL OR k >= top THEN
        PERFORM pg_advisory_xact_lock(1668246118, k);
        PERFORM set_config('conveyor.flow_lock', k::text, true);
    ELSIF NOT pg_try_advisory_xact_lock(1668246118, k) THEN
        RETURN false;
    END IF;
    RETURN true;
END $$;

-- The keys of queue q read from its jobs (under its lock): a key with no part gets one
-- (filed last, in the order of its first job), every key not in the turns is looked at
-- again by the next claim, and the no-key lot is probed. With ``watch`` (the queue starts
-- to flow: its news, if any, are older than this and dropped), the first claim once
-- every transaction running now has ended does it again (after folding the news that
-- came meanwhile, which keep the turns they gave).
CREATE FUNCTION conveyor_flow_resync(q text, watch boolean) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF watch THEN
        DELETE FROM conveyor_part_news n WHERE n.queue = q;
        UPDATE conveyor_parts p SET head_pri = NULL, opens = '-Infinity'
        WHERE p.queue = q AND p.name <> '';
    ELSE
        UPDATE conveyor_parts p SET opens = '-Infinity'
        WHERE p.queue = q AND p.name <> '' AND p.head_pri IS NULL;
    END IF;
    INSERT INTO conveyor_parts (queue, name, turn, opens)
    SELECT q, k.partition, nextval('conveyor_turn_seq'), '-Infinity'
    FROM (
        SELECT j.partition, min(j.seq) AS first FROM conveyor_jobs j
        WHERE j.queue = q AND j.partition <> '' AND j.state <> 'dead'
        GROUP BY j.partition ORDER BY 2
    ) k
    ON CONFLICT (queue, name) DO NOTHING;
    -- (With ``watch``, the first claim after this commits notes which transactions it
    -- must see end: a transaction begun before this commit has its id by then, or has
    -- not yet written.)
    INSERT INTO conveyor_parts AS p (queue, name, turn, head_pri, resync)
    VALUES (q, '', 0, 2147483647, CASE WHEN watch THEN '0'::xid8 END)
    ON CONFLICT (queue, name) DO UPDATE SET head_pri = 2147483647,
        resync = excluded.resync;
END $$;

-- Queue q starts to flow (limits, a back-off): its keys read once if it got no news.
CREATE FUNCTION conveyor_flow_on(q text) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF (SELECT cq.flow_until FROM conveyor_queues cq WHERE cq.name = q) IS NULL THEN
        PERFORM conveyor_flow_resync(q, true);
    END IF;
END $$;

-- File key k of queue q where its state at p_now says (under the queue's lock): waiting
-- for its back-off or bucket (``ptol``: its bucket's tolerance, NULL without a partition
-- rate); in the turns with its first claimable row's priority (rows of ``skip`` are
-- taken by this claim); waiting for its first row not yet due (a pending one, or a lease
-- that may lapse; ``mine``: the rows this claim picked of it); or, with nothing to wait
-- for and nothing to remember, gone. The priority it is filed with, or NULL.
CREATE FUNCTION conveyor_part_file(
    q text, k text, p_now float8, ptol float8, skip bigint[], mine bigint[]
) RETURNS int LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    p conveyor_parts%ROWTYPE;
    hold float8;
    best int;
    nxt float8;
    held boolean;
BEGIN
    SELECT * INTO p FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = k;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    hold := greatest(coalesce(p.until, '-Infinity'),
        CASE WHEN ptol IS NULL OR p.tat IS NULL THEN '-Infinity' ELSE p.tat - ptol END);
    IF hold > p_now THEN
        UPDATE conveyor_parts cp SET head_pri = NULL, opens = hold, idle = false
        WHERE cp.queue = q AND cp.name = k;
        RETURN NULL;
    END IF;
    SELECT j.priority INTO best FROM conveyor_jobs j
    WHERE j.queue = q AND j.partition = k AND j.partition <> '' AND j.due <= p_now
        AND j.seq <> ALL(skip)
    ORDER BY j.priority DESC, j.due, j.seq
    LIMIT 1;
    IF FOUND THEN
        UPDATE conveyor_parts cp SET head_pri = best, opens = NULL, idle = false,
            turn = CASE WHEN cp.idle THEN nextval('conveyor_turn_seq') ELSE cp.turn END
        WHERE cp.queue = q AND cp.name = k;
        RETURN best;
    END IF;
    SELECT min(j.due) INTO nxt FROM conveyor_jobs j
    WHERE j.queue = q AND j.partition = k AND j.partition <> '' AND j.due > p_now;
    IF cardinality(mine) > 0 THEN
        nxt := least(nxt, (
            SELECT min(p_now + j.visibility_timeout_s) FROM conveyor_jobs j
            WHERE j.seq = ANY(mine)
        ));
    END IF;
    held := cardinality(mine) > 0 OR EXISTS (
        SELECT 1 FROM conveyor_jobs j
        WHERE j.queue = q AND j.partition = k AND j.partition <> ''
            AND j.state = 'processing' AND j.deadline > p_now
    );
    IF NOT held AND coalesce(p.until <= p_now, true)
        AND (ptol IS NULL OR p.tat IS NULL OR p.tat <= p_now)
    THEN
        IF nxt IS NULL THEN
            DELETE FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = k;
        ELSE
            UPDATE conveyor_parts cp SET head_pri = NULL, opens = nxt, idle = true
            WHERE cp.queue = q AND cp.name = k;
        END IF;
    ELSE
        UPDATE conveyor_parts cp SET head_pri = NULL, opens = nxt, idle = false
        WHERE cp.queue = q AND cp.name = k;
    END IF;
    RETURN NULL;
END $$;

-- Fold queue q's news into its parts (under its lock), each key in the order of its
-- turn: a key with no part, or whose part had nothing left to remember but the rows the
-- news tells of, joins the turns last; a key in the turns has its bound raised.
CREATE FUNCTION conveyor_flow_news(q text, p_now float8) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ptol float8;
    p conveyor_parts%ROWTYPE;
    h record;
    due float8;
BEGIN
    SELECT (coalesce(cq.partition_burst, 1) - 1) * (cq.partition_per_s / cq.partition_rate)
    INTO ptol FROM conveyor_queues cq WHERE cq.name = q;
    FOR h IN
        WITH d AS (
            DELETE FROM conveyor_part_news n WHERE n.queue = q
            RETURNING n.name, n.priority, n.turn, n.seqs, n.ready, n.at
        )
        SELECT d.name, max(d.priority) AS priority,
            coalesce(min(d.turn) FILTER (WHERE d.ready), min(d.turn)) AS turn,
            array_agg(s.seq) AS seqs, bool_or(d.ready) AS ready,
            coalesce(min(d.at) FILTER (WHERE d.ready), p_now) AS at
        FROM d CROSS JOIN LATERAL unnest(d.seqs) AS s(seq)
        GROUP BY d.name ORDER BY 3
    LOOP
        IF h.name = '' THEN
            INSERT INTO conveyor_parts AS cp (queue, name, turn, head_pri)
            VALUES (q, '', 0, h.priority)
            ON CONFLICT (queue, name) DO UPDATE
                -- (Out of the turns, the lot's other rows are not in its bound: probe.)
                SET head_pri = CASE WHEN cp.head_pri IS NULL THEN 2147483647
                    ELSE greatest(cp.head_pri, excluded.head_pri) END,
                    opens = NULL;
            CONTINUE;
        END IF;
        SELECT * INTO p FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = h.name;
        IF NOT h.ready THEN
            -- Rows to come only: the key takes its turn when the first is due, with the
            -- other keys whose rows mature then, in that order (the settle's wake).
            due := (SELECT min(j.due) FROM conveyor_jobs j WHERE j.seq = ANY(h.seqs));
        END IF;
        IF NOT FOUND AND NOT h.ready THEN
            IF due IS NOT NULL THEN
                INSERT INTO conveyor_parts (queue, name, turn, idle, opens)
                VALUES (q, h.name, h.turn, true, due);
            END IF;
        ELSIF NOT FOUND THEN
            INSERT INTO conveyor_parts (queue, name, turn) VALUES (q, h.name, h.turn);
            PERFORM conveyor_part_file(q, h.name, p_now, ptol, '{}', '{}');
        ELSIF p.head_pri IS NOT NULL THEN
            IF h.priority > p.head_pri THEN
                UPDATE conveyor_parts cp SET head_pri = h.priority
                WHERE cp.queue = q AND cp.name = h.name;
            END IF;
        ELSE
            IF coalesce(p.until <= p_now, true)
                AND (ptol IS NULL OR p.tat IS NULL OR p.tat <= p_now)
                AND NOT EXISTS (
                    SELECT 1 FROM conveyor_jobs j
                    WHERE j.queue = q AND j.partition = h.name AND j.partition <> ''
                        AND j.state = 'processing' AND j.deadline > p_now
                )
                AND NOT EXISTS (
                    SELECT 1 FROM conveyor_jobs j
                    WHERE j.queue = q AND j.partition = h.name AND j.partition <> ''
                        AND j.due <= least(h.at, p_now) AND j.seq <> ALL(h.seqs)
                )
            THEN
                IF h.ready THEN
                    UPDATE conveyor_parts cp SET turn = h.turn, idle = false
                    WHERE cp.queue = q AND cp.name = h.name;
                ELSE
                    IF due IS NOT NULL THEN
                        UPDATE conveyor_parts cp SET turn = h.turn, idle = true,
                            opens = least(cp.opens, due)
                        WHERE cp.queue = q AND cp.name = h.name;
                    END IF;
                    CONTINUE;
                END IF;
            END IF;
            PERFORM conveyor_part_file(q, h.name, p_now, ptol, '{}', '{}');
        END IF;
    END LOOP;
END $$;
-- Bring queue q's parts up to p_now (under its lock): its news folded in, the second
-- look at its keys when it is due, and the no-key lot and the keys whose wait ran out
-- filed again (the keys in the order they were due). A claim does it first; the sweep
-- does it at each timed event too, so that a key whose job matured, or whose lease
-- lapsed, takes its turn then, as in the engine, not at the next claim.
CREATE FUNCTION conveyor_flow_settle(q text, p_now float8) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    own conveyor_parts%ROWTYPE;
    ptol float8;
    h record;
BEGIN
    SELECT (coalesce(cq.partition_burst, 1) - 1) * (cq.partition_per_s / cq.partition_rate)
    INTO ptol FROM conveyor_queues cq WHERE cq.name = q;
    PERFORM conveyor_flow_news(q, p_now);
    SELECT * INTO own FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = '';
    IF own.resync = '0'::xid8 THEN
        UPDATE conveyor_parts cp SET resync = pg_snapshot_xmax(pg_current_snapshot())
        WHERE cp.queue = q AND cp.name = '';
    ELSIF own.resync IS NOT NULL AND pg_snapshot_xmin(pg_current_snapshot()) >= own.resync THEN
        PERFORM conveyor_flow_resync(q, false);
    END IF;
    UPDATE conveyor_parts cp SET head_pri = 2147483647, opens = NULL
    WHERE cp.queue = q AND cp.name = '' AND cp.opens <= p_now;
    FOR h IN
        SELECT cp.name FROM conveyor_parts cp
        WHERE cp.queue = q AND cp.opens <= p_now AND cp.name <> ''
        ORDER BY cp.opens, cp.turn
    LOOP
        PERFORM conveyor_part_file(q, h.name, p_now, ptol, '{}', '{}');
    END LOOP;
END $$;

-- File keys ``ks`` of queue q again at p_now (under its lock), after its news: their
-- jobs went without a trace (cancelled), and one with nothing left leaves the turns now.
CREATE FUNCTION conveyor_flow_refile(q text, ks text[], p_now float8) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    ptol float8;
    k text;
BEGIN
    PERFORM conveyor_flow_settle(q, p_now);
    SELECT (coalesce(cq.partition_burst, 1) - 1) * (cq.partition_per_s / cq.partition_rate)
    INTO ptol FROM conveyor_queues cq WHERE cq.name = q;
    FOREACH k IN ARRAY ks LOOP
        PERFORM conveyor_part_file(q, k, p_now, ptol, '{}', '{}');
    END LOOP;
END $$;
"""

# The claim of one queue under flow control (v8's contract, see _V8_CLAIM_FLOW), without
# walking the keys: it folds in the news, wakes the keys whose time came (each by the
# index of ``opens``), then takes the key whose turn it is by the index of the turns,
# compares it with the no-key lot, and files the key again after each job (its next
# row's priority, or waiting). A bound found too high is lowered and the pick made again
# (a row cancelled or expired meanwhile): each correction is paid for by the change that
# made it. Keys found at their concurrency are passed over for the rest of the claim (the
# walk's position moves past them), not probed again for each job. A claim that cannot
# take the queue's lock in order (its transaction already holds one that comes later,
# and another transaction holds this one) hands out nothing of it and says "now" as its
# wake, so that it is claimed again at once.
_V9_CLAIM_FLOW = """
CREATE OR REPLACE FUNCTION conveyor_claim_flow(
    q text, want int, p_now float8, busy bigint[], OUT picked bigint[], OUT wake float8
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    lim conveyor_queues%ROWTYPE;
    own conveyor_parts%ROWTYPE;
    t float8;
    tol float8;
    pt float8;
    ptol float8;
    held bigint := 0;
    held_p bigint;
    p conveyor_parts%ROWTYPE;
    h record;
    r record;
    pos_h bigint := -9223372036854775808;
    pos_t bigint := -9223372036854775808;
    skip bigint[] := busy;
    keys text[] := '{}';
    expired bigint[] := '{}';
    used_up bigint[] := '{}';
    mine bigint[];
    plain boolean;
BEGIN
    picked := '{}';
    IF NOT conveyor_flow_lock(q) THEN
        wake := p_now;
        RETURN;
    END IF;
    SELECT * INTO lim FROM conveyor_queues cq WHERE cq.name = q;
    INSERT INTO conveyor_parts (queue, name, turn, head_pri) VALUES (q, '', 0, 2147483647)
    ON CONFLICT DO NOTHING;
    SELECT * INTO own FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = '';
    IF lim.rate IS NOT NULL THEN
        t := lim.per_s / lim.rate;
        tol := (coalesce(lim.burst, 1) - 1) * t;
    END IF;
    IF lim.partition_rate IS NOT NULL THEN
        pt := lim.partition_per_s / lim.partition_rate;
        ptol := (coalesce(lim.partition_burst, 1) - 1) * pt;
    END IF;
    PERFORM conveyor_flow_settle(q, p_now);
    SELECT * INTO own FROM conveyor_parts cp WHERE cp.queue = q AND cp.name = '';
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO held FROM conveyor_jobs j
        WHERE j.queue = q AND j.state = 'processing' AND j.deadline > p_now;
    END IF;
    LOOP
        EXIT WHEN cardinality(picked) >= want;
        -- The queue's own back-off, concurrency and bucket (FLW-6, FLW-2, FLW-4).
        IF own.until > p_now THEN
            wake := own.until;
            EXIT;
        END IF;
        IF lim.concurrency IS NOT NULL AND held >= lim.concurrency THEN
            -- A slot frees by a release (which tells) or when a lease lapses: then.
            SELECT min(j.deadline) INTO wake FROM conveyor_jobs j
            WHERE j.queue = q AND j.state = 'processing' AND j.deadline > p_now;
            EXIT;
        END IF;
        IF t IS NOT NULL AND own.tat IS NOT NULL AND p_now < own.tat - tol THEN
            wake := own.tat - tol;
            EXIT;
        END IF;
        -- The key whose turn it is (FLW-5), past those found at their concurrency.
        SELECT * INTO p FROM conveyor_parts cp
        WHERE cp.queue = q AND cp.head_pri IS NOT NULL AND cp.name <> ''
            AND (-(cp.head_pri::bigint), cp.turn) > (pos_h, pos_t)
        ORDER BY -(cp.head_pri::bigint), cp.turn
        LIMIT 1;
        IF NOT FOUND THEN
            p := NULL;
        END IF;
        plain := own.head_pri IS NOT NULL AND (p.name IS NULL
            OR (-(own.head_pri::bigint), own.turn) < (-(p.head_pri::bigint), p.turn));
        IF plain THEN
            -- The no-key lot's turn, if its first row has the priority its bound says.
            SELECT j.seq, j.priority, j.attempts, j.max_attempts, j.expires_at INTO r
            FROM conveyor_jobs j
            WHERE j.queue = q AND j.partition = '' AND j.due <= p_now
                AND j.seq <> ALL(skip)
            ORDER BY j.priority DESC, j.due, j.seq
            LIMIT 1;
            IF NOT FOUND THEN
                -- Out of the turns until a job of no key may be due: news of one, or
                -- the first row of the queue's to mature or lapse (an early look
                -- finds nothing and waits again).
                own.head_pri := NULL;
                own.opens := least(
                    (SELECT min(j.ready_at) FROM conveyor_jobs j
                    WHERE j.queue = q AND j.sched AND j.ready_at > p_now),
                    (SELECT min(j.deadline) FROM conveyor_jobs j
                    WHERE j.queue = q AND j.state = 'processing' AND j.deadline > p_now));
                CONTINUE;
            ELSIF r.priority < own.head_pri THEN
                own.head_pri := r.priority;
                CONTINUE;
            END IF;
            skip := skip || r.seq;
            -- Another transaction holds the row (a report, a cancel): not claimable now.
            PERFORM 1 FROM conveyor_jobs j WHERE j.seq = r.seq FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
        ELSE
            EXIT WHEN p.name IS NULL;
            IF lim.partition_concurrency IS NOT NULL THEN
                SELECT count(*) INTO held_p FROM conveyor_jobs j
                WHERE j.queue = q AND j.partition = p.name AND j.partition <> ''
                    AND j.state = 'processing' AND j.deadline > p_now;
                held_p := held_p + (SELECT count(*) FROM unnest(keys) k WHERE k = p.name);
                IF held_p >= lim.partition_concurrency THEN
                    pos_h := -(p.head_pri::bigint);
                    pos_t := p.turn;
                    wake := least(wake, (
                        SELECT min(j.deadline) FROM conveyor_jobs j
                        WHERE j.queue = q AND j.partition = p.name AND j.partition <> ''
                            AND j.state = 'processing' AND j.deadline > p_now
                    ));
                    CONTINUE;
                END IF;
            END IF;
            SELECT j.seq, j.priority, j.attempts, j.max_attempts, j.expires_at INTO r
            FROM conveyor_jobs j
            WHERE j.queue = q AND j.partition = p.name AND j.partition <> ''
                AND j.due <= p_now AND j.seq <> ALL(skip)
            ORDER BY j.priority DESC, j.due, j.seq
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                mine := ARRAY(SELECT u.s FROM unnest(picked, keys) AS u(s, k) WHERE u.k = p.name);
                PERFORM conveyor_part_file(q, p.name, p_now, ptol, skip, mine);
                CONTINUE;
            ELSIF r.priority < p.head_pri THEN
                UPDATE conveyor_parts cp SET head_pri = r.priority
                WHERE cp.queue = q AND cp.name = p.name;
                CONTINUE;
            END IF;
            skip := skip || r.seq;
        END IF;
        IF r.expires_at IS NOT NULL AND p_now >= r.expires_at THEN
            expired := expired || r.seq;  -- CLM-4: it costs no limit
            CONTINUE;
        ELSIF r.attempts >= r.max_attempts THEN
            used_up := used_up || r.seq;  -- CLM-3
            CONTINUE;
        END IF;
        picked := picked || r.seq;
        held := held + 1;
        IF t IS NOT NULL THEN
            own.tat := greatest(coalesce(own.tat, p_now), p_now) + t;
        END IF;
        IF plain THEN
            keys := keys || ''::text;
            own.turn := nextval('conveyor_turn_seq');
        ELSE
            keys := keys || p.name;
            UPDATE conveyor_parts cp SET turn = nextval('conveyor_turn_seq'),
                tat = CASE WHEN pt IS NULL THEN cp.tat
                    ELSE greatest(coalesce(cp.tat, p_now), p_now) + pt END
            WHERE cp.queue = q AND cp.name = p.name;
            mine := ARRAY(SELECT u.s FROM unnest(picked, keys) AS u(s, k) WHERE u.k = p.name);
            PERFORM conveyor_part_file(q, p.name, p_now, ptol, skip, mine);
        END IF;
    END LOOP;
    UPDATE conveyor_parts cp SET tat = own.tat, turn = own.turn, head_pri = own.head_pri,
        opens = own.opens
    WHERE cp.queue = q AND cp.name = '';
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
    IF cardinality(picked) < want THEN
        -- When the first key waiting on time lets it go (one index probe).
        wake := least(wake, (
            SELECT min(cp.opens) FROM conveyor_parts cp
            WHERE cp.queue = q AND cp.opens > p_now
        ));
    END IF;
END $$;
"""

# conveyor_enqueue as v6 made it, with the job's partition key (FLW-3: at most 1,024
# characters; NULL or '' for none), last and defaulted so that every call written for
# v6 means what it meant. (Dropped first: another argument is another function, and two
# that a call could mean would make it ambiguous.)
_V6_ENQUEUE = _V6[_V6.index("CREATE OR REPLACE FUNCTION conveyor_enqueue(") :]
_V6_ENQUEUE = _V6_ENQUEUE[: _V6_ENQUEUE.index("END $$;") + len("END $$;")]
_V9_ENQUEUE = (
    """
DROP FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, float8, numeric,
    float8, text, float8);
"""
    + _changed(
        _V6_ENQUEUE,
        (
            "    timeout_s float8 DEFAULT NULL\n)",
            "    timeout_s float8 DEFAULT NULL,\n    partition text DEFAULT NULL\n)",
        ),
        (
            "    lim_s float8 := conveyor_enqueue.timeout_s;\n",
            "    lim_s float8 := conveyor_enqueue.timeout_s;\n"
            "    part text := coalesce(conveyor_enqueue.partition, '');\n",
        ),
        (
            "    IF k = '' THEN\n",
            "    IF length(part) > 1024 THEN  -- FLW-3\n"
            "        PERFORM conveyor_refuse('invalid_argument', 'partition',\n"
            "            'must be at most 1024 characters, got ' || length(part));\n"
            "    END IF;\n"
            "    IF k = '' THEN\n",
        ),
        ("expires_at, key, timeout_s, sched)\n", "expires_at, key, timeout_s, partition, sched)\n"),
        ("lim_s, ready > t)", "lim_s, part, ready > t)"),
    )
    + """
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, '
        'float8, numeric, float8, text, float8, text) SET search_path = %I, pg_temp',
        current_schema()
    );
END $$;
"""
)

# conveyor_claim as v8 made it, and a queue whose flow control ended (its last back-off
# ran out, it has no limits) gets no more news until it flows again.
_V9 = (
    _V9_TABLES
    + _V9_TRIGGERS
    + _V9_FUNCTIONS
    + _V9_CLAIM_FLOW
    + _V9_ENQUEUE
    + _changed(
        _function(_V8, "conveyor_claim"),
        (
            "        CONTINUE WHEN NOT FOUND;\n        IF flow_at > p_now THEN\n",
            "        CONTINUE WHEN NOT FOUND;\n"
            "        IF flow_at <= p_now THEN\n"
            "            -- (Never waiting for the row: a back-off may hold it, and then\n"
            "            -- the queue flows again anyway.)\n"
            "            UPDATE conveyor_queues cq SET flow_until = NULL\n"
            "            WHERE cq.name IN (\n"
            "                SELECT c2.name FROM conveyor_queues c2\n"
            "                WHERE c2.name = q AND c2.flow_until <= p_now\n"
            "                FOR UPDATE SKIP LOCKED\n"
            "            );\n"
            "            IF FOUND THEN\n"
            "                DELETE FROM conveyor_part_news n WHERE n.queue = q;\n"
            "            END IF;\n"
            "        END IF;\n"
            "        IF flow_at > p_now THEN\n",
        ),
    )
)


# Schedules (docs/contract.md, SCH-1 on): one row per schedule. ``spec`` holds its timing
# and the options of the jobs it makes, as given (resolved against the queue's options
# when a tick fires, as an enqueue then would be); ``payload`` is stored as the jobs store
# theirs. ``next_at`` is the tick it fires at next, NULL while paused or once its ticks
# have ended: the partial index on it is all that finding the due schedules, or the
# earliest tick to come, reads, so schedules that are not due cost nothing. This step
# reads and changes nothing of the others: it applies after any of them. Ids compare by
# code point (COLLATE "C"), so that a page in id order is the primary key's order, and
# every backend's order.
_V_SCHEDULES = """
CREATE TABLE conveyor_schedules (
    id text COLLATE "C" PRIMARY KEY,
    queue text NOT NULL,
    payload bytea NOT NULL,
    spec jsonb NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    next_at float8,
    last_at float8,
    last_job text,
    fired bigint NOT NULL DEFAULT 0,
    created_at float8 NOT NULL,
    updated_at float8 NOT NULL
);
CREATE INDEX conveyor_schedules_next ON conveyor_schedules (next_at) WHERE next_at IS NOT NULL;
"""

# Results (docs/contract.md, RES-1 on): the result an ack stored and when, a 'completed'
# state for the jobs a queue keeps once acked (``completed_retention_s``; its own count,
# and an index by queue and completion for the listing, the sweep and the next event), and
# ``conveyor_follows``: the jobs a broker follows, a row per job and broker. A followed
# job's end is written into its row (``state`` set: what finished, and its result or
# error) and the broker told "f:<broker>"; it then takes its finished rows. An ack and a
# cancel write their own (a deleted row has no result to read); a death, wherever it
# comes from (a report, a sweep, a claim meeting a used-up or expired row), is written by
# the jobs' update trigger, which looks at the follows only while the table has any, so
# that a job nobody follows costs one probe of an empty table per statement.
_V_RESULTS_TABLES = """
ALTER TABLE conveyor_jobs DROP CONSTRAINT conveyor_jobs_state_check;
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_state_check
    CHECK (state IN ('pending', 'processing', 'dead', 'completed'));
ALTER TABLE conveyor_jobs ADD COLUMN result bytea, ADD COLUMN completed_at float8;
ALTER TABLE conveyor_queues ADD COLUMN completed_retention_s float8;
ALTER TABLE conveyor_counts ADD COLUMN n_completed bigint NOT NULL DEFAULT 0;
CREATE INDEX conveyor_jobs_completed ON conveyor_jobs (queue, completed_at, seq)
    WHERE state = 'completed';
CREATE TABLE conveyor_follows (
    seq bigint NOT NULL,
    broker text NOT NULL,
    queue text,
    state text,
    result bytea,
    error text,
    PRIMARY KEY (seq, broker)
);
CREATE INDEX conveyor_follows_told ON conveyor_follows (broker) WHERE state IS NOT NULL;
"""

_V_RESULTS_DEATHS = """
    IF EXISTS (SELECT 1 FROM conveyor_follows WHERE state IS NULL) THEN
        UPDATE conveyor_follows f SET queue = n.queue, state = 'dead', error = n.last_error
        FROM new_rows n JOIN old_rows o USING (seq)
        WHERE f.seq = n.seq AND f.state IS NULL AND n.state = 'dead' AND o.state <> 'dead';
        PERFORM pg_notify('conveyor', 'f:' || b.broker) FROM (
            SELECT DISTINCT f.broker FROM conveyor_follows f JOIN new_rows n USING (seq)
            WHERE f.state = 'dead' AND n.state = 'dead'
        ) b;
    END IF;
    RETURN NULL;
"""

_V_RESULTS = (
    _V_RESULTS_TABLES
    + _changed(
        _function(_V9_TRIGGERS, "conveyor_count_update"),
        (
            "n_processing, n_dead,\n        retried, dead, expired)",
            "n_processing, n_dead,\n        n_completed, retried, dead, expired)",
        ),
        (
            "SELECT d.queue, d.r, d.s, d.p, d.x, d.ret,",
            "SELECT d.queue, d.r, d.s, d.p, d.x, d.c, d.ret,",
        ),
        (
            " AS x,\n",
            " AS x,\n"
            "               sum((n.state = 'completed')::int\n"
            "                   - (o.state = 'completed')::int) AS c,\n",
        ),
        (
            "WHERE (d.r, d.s, d.p, d.x, d.ret, d.died) <> (0, 0, 0, 0, 0, 0);",
            "WHERE (d.r, d.s, d.p, d.x, d.c, d.ret, d.died) <> (0, 0, 0, 0, 0, 0, 0);",
        ),
        ("    RETURN NULL;\n", _V_RESULTS_DEATHS),
    ).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    + "\n"
    + _changed(
        _function(_V1, "conveyor_count_delete"),
        ("n_processing, n_dead)", "n_processing, n_dead, n_completed)"),
        (
            "           -count(*) FILTER (WHERE state = 'dead')\n",
            "           -count(*) FILTER (WHERE state = 'dead'),\n"
            "           -count(*) FILTER (WHERE state = 'completed')\n",
        ),
    ).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    + "\n"
)

# Progress (docs/contract.md, PRG-1 on): the latest progress a lease holder reported,
# kept in the job's row. A broker's row names the follower id its follows are written
# under, so that when the row of a broker that stopped announcing is cleared, its
# follows go with it (a crashed broker's follows would otherwise stay, and every ack pay
# for looking at them).
_V_PROGRESS = """
ALTER TABLE conveyor_jobs ADD COLUMN progress bytea;
ALTER TABLE conveyor_brokers ADD COLUMN follower text;
CREATE INDEX conveyor_follows_broker ON conveyor_follows (broker);
"""

# Dependencies (docs/contract.md, DEP-1 on). A job enqueued with ``after`` has a row of
# ``conveyor_deps`` per dependency named (``job``: the dependent, ``pos``: its place in
# ``after``, ``dep``: the dependency), indexed by ``dep`` while not met, so that an ack,
# a death or a cancel finds the jobs waiting for it by one probe, never a scan. An ack
# landing on a dependency sets ``met`` and stores its result on the edge. The job's
# ``deps`` (how many it named) and ``waiting_for`` (how many not met, while waiting) are
# columns of its row. A waiting job's state is 'waiting': its ``due`` is NULL, so no
# claim index holds it, no partition line knows it (the insert trigger files no news
# of it) and no count takes it for ready; its release (waiting -> pending, by
# conveyor_deps_met) is an update the triggers count, tell ("w:") and file in its
# partition's line as any row put back to pending. A dependency that dies (an update to
# dead, from wherever: a report, a sweep, a claim meeting an expired or used-up row) makes
# the jobs waiting for it die in the same statement, transitively: the update trigger
# calls conveyor_deps_doom, which walks the chain level by level (its own updates do not
# walk again: ``conveyor.dooming`` is set while it runs). An ack and a cancel call their
# function themselves, in a statement after the one that changed the job (so that it
# sees the edges an enqueue that held the job committed meanwhile). The edges of a job
# go with it (the delete trigger).
_V_DEPS_TABLES = """
ALTER TABLE conveyor_jobs DROP CONSTRAINT conveyor_jobs_state_check;
ALTER TABLE conveyor_jobs ADD CONSTRAINT conveyor_jobs_state_check
    CHECK (state IN ('pending', 'processing', 'dead', 'completed', 'waiting'));
ALTER TABLE conveyor_jobs ADD COLUMN deps int NOT NULL DEFAULT 0,
    ADD COLUMN waiting_for int NOT NULL DEFAULT 0;
ALTER TABLE conveyor_counts ADD COLUMN n_waiting bigint NOT NULL DEFAULT 0;
CREATE INDEX conveyor_jobs_waiting ON conveyor_jobs (queue, enqueued_at, seq)
    WHERE state = 'waiting';
CREATE TABLE conveyor_deps (
    job bigint NOT NULL,
    pos int NOT NULL,
    dep bigint NOT NULL,
    met boolean NOT NULL DEFAULT false,
    result bytea,
    PRIMARY KEY (job, pos)
);
CREATE INDEX conveyor_deps_unmet ON conveyor_deps (dep) WHERE NOT met;
"""

_V_DEPS_FUNCTIONS = """
-- A dependent's last error when its dependency ``id`` died of ``error`` (DEP-3), cut
-- to the length of any error (LIM-3), as the engine's _died.
CREATE FUNCTION conveyor_dep_died(id text, error text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(t) > 4096 THEN left(t, 4093) || '...' ELSE t END
    FROM (SELECT 'dependency ' || id || ' died: ' || coalesce(error, 'failed') AS t) x
$$;

-- Jobs ``seqs`` died or were cancelled: each job waiting for one of them dies at p_now
-- with the message given for it (``whys``), and so on down the chain, one level per
-- statement, each level's rows locked in seq order (DEP-3, DEP-13).
CREATE FUNCTION conveyor_deps_doom(seqs bigint[], whys text[], p_now float8)
RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    pre text := (SELECT m.id_prefix FROM conveyor_meta m);
BEGIN
    PERFORM set_config('conveyor.dooming', 'on', true);
    WHILE cardinality(seqs) > 0 LOOP
        WITH w AS (
            SELECT DISTINCT ON (d.job) d.job, f.why
            FROM unnest(seqs, whys) AS f(seq, why)
            JOIN conveyor_deps d ON d.dep = f.seq AND NOT d.met
            ORDER BY d.job, f.seq
        ), l AS (
            SELECT j.seq FROM conveyor_jobs j
            WHERE j.seq IN (SELECT w.job FROM w) AND j.state = 'waiting'
            ORDER BY j.seq FOR UPDATE OF j
        ), k AS (
            UPDATE conveyor_jobs j SET state = 'dead', died_at = p_now, last_error = w.why,
                waiting_for = 0, sched = false
            FROM w
            WHERE j.seq = w.job AND j.seq IN (SELECT l.seq FROM l) AND j.state = 'waiting'
            RETURNING j.seq, j.last_error
        )
        SELECT coalesce(array_agg(k.seq ORDER BY k.seq), '{}'),
            coalesce(array_agg(conveyor_dep_died(pre || to_hex(k.seq), k.last_error)
                ORDER BY k.seq), '{}')
        INTO seqs, whys FROM k;
    END LOOP;
    PERFORM set_config('conveyor.dooming', '', true);
END $$;

-- The acks of jobs ``seqs`` (results ``results``) landed at p_now: each edge waiting for
-- one is met and keeps its result (a dead dependent's too, for a redrive: DEP-5), and
-- each waiting job with nothing more to wait for becomes pending, ready at the later of
-- its own ready time and now (DEP-1, DEP-2, DEP-10). The jobs released: their queues and
-- ready times (a ready time to come told to the brokers, "t:"). The dependents are
-- locked in seq order. An ack statement calls it on the rows it acked (VOLATILE: each
-- statement here reads a fresh snapshot, so it sees the edges committed while the ack
-- waited for a row an enqueue held).
CREATE FUNCTION conveyor_deps_met(seqs bigint[], results bytea[], p_now float8)
RETURNS TABLE (queue text, ready_at float8) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    jobs bigint[];
    ns bigint[];
    queues text[];
    times float8[];
BEGIN
    -- (Most acks land on jobs nothing waits for: one probe says so.)
    IF NOT EXISTS (SELECT 1 FROM conveyor_deps d WHERE d.dep = ANY(seqs) AND NOT d.met) THEN
        RETURN;
    END IF;
    WITH m AS (
        UPDATE conveyor_deps d SET met = true, result = u.result
        FROM unnest(seqs, results) AS u(seq, result)
        WHERE d.dep = u.seq AND NOT d.met
        RETURNING d.job
    )
    SELECT array_agg(c.job ORDER BY c.job), array_agg(c.n ORDER BY c.job) INTO jobs, ns
    FROM (SELECT m.job, count(*) AS n FROM m GROUP BY m.job) c;
    IF jobs IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM conveyor_jobs j WHERE j.seq = ANY(jobs) AND j.state = 'waiting'
    ORDER BY j.seq FOR UPDATE;
    WITH r AS (
        UPDATE conveyor_jobs j SET waiting_for = j.waiting_for - c.n,
            state = CASE WHEN j.waiting_for <= c.n THEN 'pending' ELSE 'waiting' END,
            ready_at = CASE WHEN j.waiting_for <= c.n THEN greatest(j.ready_at, p_now)
                ELSE j.ready_at END,
            sched = j.waiting_for <= c.n AND j.ready_at > p_now
        FROM unnest(jobs, ns) AS c(seq, n)
        WHERE j.seq = c.seq AND j.state = 'waiting'
        RETURNING j.queue, j.state, j.ready_at
    )
    SELECT array_agg(r.queue), array_agg(r.ready_at) INTO queues, times
    FROM r WHERE r.state = 'pending';
    IF queues IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_notify('conveyor', 't:' || min(u.t)::text)
    FROM unnest(times) AS u(t) WHERE u.t > p_now HAVING count(*) > 0;
    RETURN QUERY SELECT * FROM unnest(queues, times);
END $$;

-- Link the waiting jobs ``seqs`` (new, or redriven) to their edges not met (DEP-1,
-- DEP-5, DEP-7), in seq order (a group's member after those it names): the
-- dependencies are held (FOR SHARE, in seq order) so that an ack or a death of one
-- waits for this, or this for it; one kept completed gives its result; a job with a
-- dependency dead or gone dies at once (its own dependents with it: the trigger); one
-- with nothing left to wait for becomes pending (as a release: DEP-10); the others
-- wait for the rest. The jobs released: their queues and ready times.
CREATE FUNCTION conveyor_deps_link(seqs bigint[], p_now float8)
RETURNS TABLE (queue text, ready_at float8) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    pre text := (SELECT m.id_prefix FROM conveyor_meta m);
    s bigint;
    bad record;
    n int;
    q text;
    at float8;
BEGIN
    PERFORM 1 FROM conveyor_jobs j
    WHERE j.seq IN (
        SELECT d.dep FROM conveyor_deps d WHERE d.job = ANY(seqs) AND NOT d.met
    )
    ORDER BY j.seq FOR SHARE;
    UPDATE conveyor_deps d SET met = true, result = j.result
    FROM conveyor_jobs j
    WHERE d.job = ANY(seqs) AND NOT d.met AND j.seq = d.dep AND j.state = 'completed';
    FOR s IN SELECT u.s FROM unnest(seqs) AS u(s) ORDER BY 1 LOOP
        SELECT d.dep, j.state, j.last_error INTO bad
        FROM conveyor_deps d LEFT JOIN conveyor_jobs j ON j.seq = d.dep
        WHERE d.job = s AND NOT d.met AND (j.seq IS NULL OR j.state = 'dead')
        ORDER BY d.pos LIMIT 1;
        IF FOUND THEN
            UPDATE conveyor_jobs j SET state = 'dead', died_at = p_now, waiting_for = 0,
                sched = false, last_error = CASE WHEN bad.state IS NULL
                    THEN 'dependency ' || pre || to_hex(bad.dep) || ' is gone'
                    ELSE conveyor_dep_died(pre || to_hex(bad.dep), bad.last_error) END
            WHERE j.seq = s AND j.state = 'waiting';
            CONTINUE;
        END IF;
        SELECT count(*) INTO n FROM conveyor_deps d WHERE d.job = s AND NOT d.met;
        IF n > 0 THEN
            UPDATE conveyor_jobs j SET waiting_for = n WHERE j.seq = s AND j.state = 'waiting';
            CONTINUE;
        END IF;
        UPDATE conveyor_jobs j SET state = 'pending', waiting_for = 0,
            ready_at = greatest(j.ready_at, p_now), sched = j.ready_at > p_now
        WHERE j.seq = s AND j.state = 'waiting'
        RETURNING j.queue, j.ready_at INTO q, at;
        IF FOUND THEN
            queue := q;
            ready_at := at;
            RETURN NEXT;
        END IF;
    END LOOP;
END $$;
"""

# The count of waiting rows in every count trigger; an insert files no news of a waiting
# row and tells no work of it; an update to dead dooms the rows waiting for it (unless
# conveyor_deps_doom made it); a delete takes the row's edges with it.
_V_DEPS_TRIGGERS = (
    _changed(
        _function(_V9_TRIGGERS, "conveyor_count_insert"),
        (
            "INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, enqueued)\n"
            "    SELECT queue, count(*) FILTER (WHERE NOT sched), "
            "count(*) FILTER (WHERE sched), count(*)\n",
            "INSERT INTO conveyor_counts (queue, n_ready, n_scheduled, n_waiting, enqueued)\n"
            "    SELECT queue, count(*) FILTER (WHERE state = 'pending' AND NOT sched),\n"
            "        count(*) FILTER (WHERE state = 'pending' AND sched),\n"
            "        count(*) FILTER (WHERE state = 'waiting'), count(*)\n",
        ),
        (
            "    FROM (SELECT DISTINCT queue FROM new_rows) d;\n",
            "    FROM (SELECT DISTINCT queue FROM new_rows WHERE state = 'pending') d;\n",
        ),
        (
            "        WHERE q.flow_until IS NOT NULL\n        GROUP BY",
            "        WHERE q.flow_until IS NOT NULL AND n.state = 'pending'\n        GROUP BY",
        ),
    )
    + "\n"
    + _changed(
        _function(_V_RESULTS, "conveyor_count_update"),
        (
            "n_processing, n_dead,\n        n_completed, retried, dead, expired)",
            "n_processing, n_dead,\n        n_completed, n_waiting, retried, dead, expired)",
        ),
        ("d.c, d.ret, d.died, d.exp FROM", "d.c, d.w, d.ret, d.died, d.exp FROM"),
        (
            " AS c,\n",
            " AS c,\n"
            "               sum((n.state = 'waiting')::int - (o.state = 'waiting')::int) AS w,\n",
        ),
        (
            "WHERE (d.r, d.s, d.p, d.x, d.c, d.ret, d.died) <> (0, 0, 0, 0, 0, 0, 0);",
            "WHERE (d.r, d.s, d.p, d.x, d.c, d.w, d.ret, d.died) <> (0, 0, 0, 0, 0, 0, 0, 0);",
        ),
        (
            "    END IF;\n    RETURN NULL;\n",
            "    END IF;\n"
            "    IF coalesce(current_setting('conveyor.dooming', true), '') <> 'on' THEN\n"
            "        PERFORM conveyor_deps_doom(array_agg(n.seq ORDER BY n.seq),\n"
            "            array_agg(conveyor_dep_died(m.id_prefix || to_hex(n.seq), n.last_error)\n"
            "                ORDER BY n.seq), max(n.died_at))\n"
            "        FROM new_rows n JOIN old_rows o USING (seq) CROSS JOIN conveyor_meta m\n"
            "        WHERE n.state = 'dead' AND o.state <> 'dead'\n"
            "        HAVING count(*) > 0;\n"
            "    END IF;\n"
            "    RETURN NULL;\n",
        ),
    )
    + "\n"
    + _changed(
        _function(_V_RESULTS, "conveyor_count_delete"),
        ("n_dead, n_completed)", "n_dead, n_completed, n_waiting)"),
        (
            "           -count(*) FILTER (WHERE state = 'completed')\n"
            "    FROM old_rows GROUP BY queue;\n",
            "           -count(*) FILTER (WHERE state = 'completed'),\n"
            "           -count(*) FILTER (WHERE state = 'waiting')\n"
            "    FROM old_rows GROUP BY queue;\n"
            "    DELETE FROM conveyor_deps d USING old_rows o\n"
            "    WHERE o.deps > 0 AND d.job = o.seq;\n",
        ),
    )
).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")

# conveyor_claim as v9 made it, returning how many dependencies each job had (DEP-2:
# ``Claimed.dependencies``). (Every broker on the database must then be one that knows
# this step: an older one's claim reads one column too few.)
_V_DEPS_CLAIM = (
    "DROP FUNCTION conveyor_claim(text, text[], int, float8, text);\n"
    + _changed(
        _function(_V9, "conveyor_claim"),
        (
            "ready_at float8, enqueued_at float8,\n    timeout_s float8\n)",
            "ready_at float8, enqueued_at float8,\n    timeout_s float8, dependencies int\n)",
        ),
        (
            "            NULL::float8, NULL::float8;\n",
            "            NULL::float8, NULL::float8, NULL::int;\n",
        ),
        ("            j.timeout_s\n", "            j.timeout_s, j.deps\n"),
    ).replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION")
    + "\n"
)

# conveyor_enqueue as v9 made it, taking ``after`` (DEP-1, DEP-7, DEP-9): the ids of the
# jobs it depends on, checked as the engine checks them (at most 1,000, each a job id,
# each named once), each one a job the table holds, held until the caller's transaction
# ends (MUL-7); the job is then stored waiting with its edges and filed by
# conveyor_deps_link. Last and defaulted, so that every call written before means what it
# meant.
_V9_ENQUEUE_TEXT = _V9_ENQUEUE[_V9_ENQUEUE.index("CREATE") :]
_ENQUEUE_AFTER = """    -- Its dependencies (DEP-7, DEP-9): each named once, in order, each one a
    -- job the table holds, held (in seq order) until this transaction ends.
    IF cardinality(conveyor_enqueue.after) > 1000 THEN
        PERFORM conveyor_refuse('invalid_argument', 'after',
            'must name at most 1000 jobs, got ' || cardinality(conveyor_enqueue.after));
    END IF;
    IF cardinality(conveyor_enqueue.after) > 0 THEN
        named := ARRAY(
            SELECT u.id FROM unnest(conveyor_enqueue.after) WITH ORDINALITY AS u(id, o)
            GROUP BY u.id ORDER BY min(u.o));
        pre := (SELECT m.id_prefix FROM conveyor_meta m);
        FOR i IN 1..cardinality(named) LOOP
            IF named[i] IS NULL OR named[i] = '' OR length(named[i]) > 1024 THEN
                PERFORM conveyor_refuse('invalid_argument', 'after[' || i - 1 || ']',
                    'is not a job id: ' || conveyor_describe(coalesce(named[i], '')));
            END IF;
            digits := substr(named[i], length(pre) + 1);
            dep_seq := NULL;
            IF left(named[i], length(pre)) = pre AND digits ~ '^[1-9a-f][0-9a-f]{0,15}$' THEN
                dep_seq := ('x' || lpad(digits, 16, '0'))::bit(64)::bigint;
            END IF;
            dep_seqs := dep_seqs || coalesce(dep_seq, -1);
        END LOOP;
        PERFORM 1 FROM conveyor_jobs j WHERE j.seq = ANY(dep_seqs) ORDER BY j.seq FOR SHARE;
        FOR i IN 1..cardinality(dep_seqs) LOOP
            IF dep_seqs[i] <= 0
                OR NOT EXISTS (SELECT 1 FROM conveyor_jobs j WHERE j.seq = dep_seqs[i])
            THEN
                PERFORM conveyor_refuse('invalid_argument', 'after[' || i - 1 || ']',
                    'no job ' || quote_literal(left(named[i], 80)) || ' is known (a '
                    || 'dependency must be a live job, a member of the same group, or a '
                    || 'finished job still kept: completed_retention_s)');
            END IF;
        END LOOP;
        n_deps := cardinality(dep_seqs);
    END IF;

"""
_V_DEPS_ENQUEUE = (
    """
DROP FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, float8, numeric,
    float8, text, float8, text);
"""
    + _changed(
        _function(_V9_ENQUEUE_TEXT, "conveyor_enqueue"),
        (
            "    partition text DEFAULT NULL\n)",
            "    partition text DEFAULT NULL,\n    after text[] DEFAULT NULL\n)",
        ),
        (
            "    part text := coalesce(conveyor_enqueue.partition, '');\n",
            "    part text := coalesce(conveyor_enqueue.partition, '');\n"
            "    named text[];\n"
            "    dep_seqs bigint[] := '{}';\n"
            "    n_deps int := 0;\n"
            "    pre text;\n"
            "    digits text;\n"
            "    dep_seq bigint;\n",
        ),
        (
            "    -- Resolved against the queue: the call wins",
            _ENQUEUE_AFTER + "    -- Resolved against the queue: the call wins",
        ),
        (
            "            expires_at, key, timeout_s, partition, sched)\n"
            "        VALUES (nextval('conveyor_job_seq'), q_name, 'pending', data, prio,\n",
            "            expires_at, key, timeout_s, partition, sched, deps, waiting_for)\n"
            "        VALUES (nextval('conveyor_job_seq'), q_name,\n"
            "            CASE WHEN n_deps > 0 THEN 'waiting' ELSE 'pending' END, data, prio,\n",
        ),
        (
            "            lim_s, part, ready > t)",
            "            lim_s, part, n_deps = 0 AND ready > t, n_deps, n_deps)",
        ),
        (
            "            PERFORM pg_notify('conveyor', 'w:' || q_name);\n            EXIT;\n",
            "            PERFORM pg_notify('conveyor', 'w:' || q_name);\n"
            "            IF n_deps > 0 THEN\n"
            "                INSERT INTO conveyor_deps (job, pos, dep)\n"
            "                SELECT got, u.o - 1, u.dep\n"
            "                FROM unnest(dep_seqs) WITH ORDINALITY AS u(dep, o);\n"
            "                PERFORM conveyor_deps_link(ARRAY[got], t);\n"
            "            END IF;\n"
            "            EXIT;\n",
        ),
    )
    + """
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION conveyor_enqueue(text, json, numeric, float8, float8, float8, '
        'float8, numeric, float8, text, float8, text, text[]) SET search_path = %I, pg_temp',
        current_schema()
    );
END $$;
"""
)

_V_DEPS = (
    _V_DEPS_TABLES + _V_DEPS_FUNCTIONS + _V_DEPS_TRIGGERS + "\n" + _V_DEPS_CLAIM + _V_DEPS_ENQUEUE
)

# v14: a lease that ran out by time (a worker hung but still connected) is told to the
# brokers following its job when the claim takes the job again (PRG-5, PRG-8): no other
# statement ends such a lease. The update trigger sees each reclaim as a row processing
# before and after under a new lease, and notifies "g:<broker>:<seq>:x<attempt>" (the
# attempt that lapsed). A lease the broker lapsed (_LAPSE) was told then already, as
# "l<attempt>"; the broker tells each attempt's lapse once.
_V_LAPSES = _changed(
    _function(_V_DEPS_TRIGGERS, "conveyor_count_update"),
    (
        "            WHERE f.state = 'dead' AND n.state = 'dead'\n        ) b;\n",
        "            WHERE f.state = 'dead' AND n.state = 'dead'\n        ) b;\n"
        "        PERFORM pg_notify('conveyor', 'g:' || f.broker || ':' || f.seq || ':x'\n"
        "            || o.attempts)\n"
        "        FROM new_rows n JOIN old_rows o USING (seq)\n"
        "        JOIN conveyor_follows f ON f.seq = n.seq AND f.state IS NULL\n"
        "        WHERE o.state = 'processing' AND n.state = 'processing'\n"
        "            AND n.lease <> o.lease\n"
        "        ORDER BY n.seq;\n",
    ),
)

MIGRATIONS: tuple[str, ...] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V_SCHEDULES,
    _V_RESULTS,
    _V_PROGRESS,
    _V_DEPS,
    _V_LAPSES,
)
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
