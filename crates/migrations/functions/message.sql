-- Events and streams (migration 0023): what a running workflow publishes to its callers.
--
-- Each write is the run's own: a fenced journal step (`event:<key>#<n>`, `stream:<key>#<n>`,
-- `stream:<key>#end`) applied by `keiro_journal_append_to`, which locks the instance row and
-- checks the fence, and only when it was appended the row a reader reads, in the same
-- transaction. So a replayed write (already_present) writes nothing, a stale holder
-- (lease_lost) writes nothing, and readers see exactly what the journal holds. A write to a
-- `watched` instance (migration 0023: a reader elsewhere follows it) notifies
-- `msg:<name>/<id>` at commit, which wakes the readers of that instance only; an unwatched
-- one notifies nothing, since a NOTIFY serializes commits (notify.sql's terminal trigger says
-- why), and its readers, all in the writing process, are woken there.

-- event_set: journals an event's write and makes its value the event's current one (its
-- version one more). Outcomes: those of `keiro_journal_append_to`.
-- Called by: keiro_postgres ops::message::event_set; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_event_set(p_name text, p_id text, p_generation integer,
                                           p_step text, p_kind text, p_payload jsonb,
                                           p_owner text, p_epoch bigint, p_renew_ms bigint,
                                           p_key text,
                                           OUT outcome text, OUT recorded jsonb,
                                           OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    SELECT a.outcome, a.recorded, a.marker
    INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        INSERT INTO workflow_events AS e (workflow_name, workflow_id, key, value)
        VALUES (p_name, p_id, p_key, p_payload)
        ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE
            SET value = excluded.value, version = e.version + 1, updated_at = now();
        PERFORM keiro_notify_message_if_watched(p_name, p_id);
    END IF;
END;
$$;

-- stream_write: journals a stream's append and adds the item at the stream's next offset.
-- A step not journaled yet is first checked against the stream's state, read before the
-- append: a closed stream answers stream_closed, one the item would take past p_items_max
-- items or p_bytes_max bytes (p_len is the item's encoded length, as the caller measures it
-- on every store) answers stream_full with its length; nothing is written then. A step
-- already journaled goes to the append rules whatever the stream's state (already_present).
-- The head row is written after the append locked the instance row, so appends to one stream
-- are numbered in commit order without gaps; the bounds are exact for one writer at a time
-- (a run's concurrent branches writing one stream may pass them by the items in flight).
-- Outcomes: those of `keiro_journal_append_to`, stream_closed, stream_full.
-- Called by: keiro_postgres ops::message::stream_write; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_stream_write(p_name text, p_id text, p_generation integer,
                                              p_step text, p_kind text, p_payload jsonb,
                                              p_owner text, p_epoch bigint, p_renew_ms bigint,
                                              p_key text, p_len bigint, p_items_max bigint,
                                              p_bytes_max bigint,
                                              OUT outcome text, OUT recorded jsonb,
                                              OUT marker text, OUT stream_items bigint,
                                              OUT stream_bytes bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_head workflow_stream_heads%ROWTYPE;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM journal j
                   WHERE j.workflow_name = p_name AND j.workflow_id = p_id
                     AND j.generation = p_generation AND j.step_name = p_step) THEN
        SELECT * INTO v_head FROM workflow_stream_heads h
        WHERE h.workflow_name = p_name AND h.workflow_id = p_id AND h.key = p_key;
        stream_items := coalesce(v_head.next_offset, 0);
        stream_bytes := coalesce(v_head.bytes, 0);
        IF coalesce(v_head.closed, false) THEN
            outcome := 'stream_closed';
            RETURN;
        END IF;
        IF stream_items + 1 > p_items_max OR stream_bytes + p_len > p_bytes_max THEN
            outcome := 'stream_full';
            RETURN;
        END IF;
    END IF;
    SELECT a.outcome, a.recorded, a.marker
    INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        INSERT INTO workflow_stream_heads AS h (workflow_name, workflow_id, key, next_offset,
                                                bytes)
        VALUES (p_name, p_id, p_key, 1, p_len)
        ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE
            SET next_offset = h.next_offset + 1, bytes = h.bytes + excluded.bytes,
                updated_at = now()
        RETURNING h.next_offset, h.bytes INTO stream_items, stream_bytes;
        INSERT INTO workflow_streams (workflow_name, workflow_id, key, stream_offset, value)
        VALUES (p_name, p_id, p_key, stream_items - 1, p_payload);
        PERFORM keiro_notify_message_if_watched(p_name, p_id);
    END IF;
END;
$$;

-- stream_close: journals a stream's close and marks the stream closed (an empty one when it
-- was never written). Outcomes: those of `keiro_journal_append_to`.
-- Called by: keiro_postgres ops::message::stream_close; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_stream_close(p_name text, p_id text, p_generation integer,
                                              p_step text, p_kind text, p_payload jsonb,
                                              p_owner text, p_epoch bigint, p_renew_ms bigint,
                                              p_key text,
                                              OUT outcome text, OUT recorded jsonb,
                                              OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    SELECT a.outcome, a.recorded, a.marker
    INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        INSERT INTO workflow_stream_heads AS h (workflow_name, workflow_id, key, closed)
        VALUES (p_name, p_id, p_key, true)
        ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE
            SET closed = true, updated_at = now();
        PERFORM keiro_notify_message_if_watched(p_name, p_id);
    END IF;
END;
$$;

-- messages_write: several writes of events and streams (`keiro_event_set`, `keiro_stream_write`,
-- `keiro_stream_close`, by p_ops[i] = 'event', 'stream' or 'close'), from concurrent runs, in
-- one transaction: the group commit of the message lane (keiro_postgres lanes::message). Each
-- request runs exactly as its own function would, in the order of the instances' keys (then
-- of the requests), so two batches lock instance rows in one order. A request whose instance
-- row another transaction holds is not run: it answers `busy` (SKIP LOCKED), and the store
-- sends it alone, where it waits as a single write would; the batch never waits for a row. A
-- row already locked by an earlier request of this batch (two writes of one run) is its own.
-- The p_keys are the event or stream keys; p_lens, p_items_max and p_bytes_max are read for
-- stream writes only. Answers one row per request: n (its 1-based position), and the outcome
-- columns of its function (stream_items and stream_bytes NULL but for stream writes).
-- Called by: keiro_postgres ops::message::messages_write; tested by
-- crates/postgres/tests/postgres/message_batch.rs and, through the store, contract::message.
CREATE OR REPLACE FUNCTION keiro_messages_write(
    p_ops text[], p_names text[], p_ids text[], p_generations integer[], p_steps text[],
    p_kinds text[], p_payloads jsonb[], p_owners text[], p_epochs bigint[],
    p_renew_ms bigint[], p_keys text[], p_lens bigint[], p_items_max bigint[],
    p_bytes_max bigint[])
RETURNS TABLE (n integer, outcome text, recorded jsonb, marker text, stream_items bigint,
               stream_bytes bigint)
-- Generic plans, index-driven, as the append batch in journal.sql.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET lock_timeout = '100ms'
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT u.i
        FROM unnest(p_names, p_ids) WITH ORDINALITY AS u (name, id, i)
        ORDER BY u.name COLLATE "C", u.id COLLATE "C", u.i
    LOOP
        n := r.i;
        stream_items := NULL;
        stream_bytes := NULL;
        PERFORM 1 FROM workflows w
        WHERE w.workflow_name = p_names[r.i] AND w.workflow_id = p_ids[r.i]
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Held elsewhere (or no such instance: alone, its own function says which).
            outcome := 'busy';
            recorded := NULL;
            marker := NULL;
        ELSIF p_ops[r.i] = 'event' THEN
            SELECT e.outcome, e.recorded, e.marker INTO outcome, recorded, marker
            FROM keiro_event_set(p_names[r.i], p_ids[r.i], p_generations[r.i], p_steps[r.i],
                                 p_kinds[r.i], p_payloads[r.i], p_owners[r.i], p_epochs[r.i],
                                 p_renew_ms[r.i], p_keys[r.i]) e;
        ELSIF p_ops[r.i] = 'stream' THEN
            SELECT s.outcome, s.recorded, s.marker, s.stream_items, s.stream_bytes
            INTO outcome, recorded, marker, stream_items, stream_bytes
            FROM keiro_stream_write(p_names[r.i], p_ids[r.i], p_generations[r.i], p_steps[r.i],
                                    p_kinds[r.i], p_payloads[r.i], p_owners[r.i],
                                    p_epochs[r.i], p_renew_ms[r.i], p_keys[r.i], p_lens[r.i],
                                    p_items_max[r.i], p_bytes_max[r.i]) s;
        ELSIF p_ops[r.i] = 'close' THEN
            SELECT c.outcome, c.recorded, c.marker INTO outcome, recorded, marker
            FROM keiro_stream_close(p_names[r.i], p_ids[r.i], p_generations[r.i], p_steps[r.i],
                                    p_kinds[r.i], p_payloads[r.i], p_owners[r.i],
                                    p_epochs[r.i], p_renew_ms[r.i], p_keys[r.i]) c;
        ELSE
            RAISE EXCEPTION 'keiro_messages_write: unknown operation %', p_ops[r.i];
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- event_get: the instance's status and event p_key, in one snapshot (the function is STABLE,
-- so it reads with its statement's); no row for an unknown instance.
-- Called by: keiro_postgres ops::message::event_get; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_event_get(p_name text, p_id text, p_key text)
RETURNS TABLE (status text, value jsonb, version bigint, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT w.status, e.value, e.version, e.updated_at
    FROM workflows w
    LEFT JOIN workflow_events e
      ON e.workflow_name = w.workflow_name AND e.workflow_id = w.workflow_id AND e.key = p_key
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
$$;

-- stream_read: up to p_limit items of stream p_key from offset p_from, in order, each row with
-- the instance's status and whether the stream is closed, in one snapshot: a reader that sees
-- the run terminal (or the stream closed) has seen every item before it. One row with a NULL
-- offset when there is no item; no row for an unknown instance. Served by the items'
-- primary key.
-- Called by: keiro_postgres ops::message::stream_read; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_stream_read(p_name text, p_id text, p_key text,
                                             p_from bigint, p_limit integer)
RETURNS TABLE (status text, closed boolean, stream_offset bigint, value jsonb)
LANGUAGE sql STABLE AS $$
    SELECT w.status, coalesce(h.closed, false), s.stream_offset, s.value
    FROM workflows w
    LEFT JOIN workflow_stream_heads h
      ON h.workflow_name = w.workflow_name AND h.workflow_id = w.workflow_id AND h.key = p_key
    LEFT JOIN LATERAL (
        SELECT x.stream_offset, x.value FROM workflow_streams x
        WHERE x.workflow_name = p_name AND x.workflow_id = p_id AND x.key = p_key
          AND x.stream_offset >= p_from
        ORDER BY x.stream_offset
        LIMIT p_limit
    ) s ON true
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    ORDER BY s.stream_offset
$$;

-- instance_messages: the events and the streams of an instance, by kind and key, at most
-- p_limit of each kind.
-- Called by: keiro_postgres ops::message::instance_messages; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_instance_messages(p_name text, p_id text, p_limit integer)
RETURNS TABLE (kind text, key text, value jsonb, version bigint, items bigint, bytes bigint,
               closed boolean, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    (SELECT 'event', e.key, e.value, e.version, NULL::bigint, NULL::bigint, NULL::boolean,
            e.updated_at
     FROM workflow_events e
     WHERE e.workflow_name = p_name AND e.workflow_id = p_id
     ORDER BY e.key LIMIT p_limit)
    UNION ALL
    (SELECT 'stream', h.key, NULL::jsonb, NULL::bigint, h.next_offset, h.bytes, h.closed,
            h.updated_at
     FROM workflow_stream_heads h
     WHERE h.workflow_name = p_name AND h.workflow_id = p_id
     ORDER BY h.key LIMIT p_limit)
$$;

-- stream_append_in: appends an item to a stream inside a transaction step's own transaction
-- (`ctx.transaction`), which holds the instance row from its first statement (its fence
-- checked by `keiro_instance_hold`) and journals the step itself at its end: the item commits
-- with the step's effects and its journal row, or not at all, and a step that is replayed
-- never runs again, so the item is never written twice. So it journals nothing of its own.
-- Checks and writes the stream as keiro_stream_write does. Outcomes: appended (with
-- stream_offset), stream_closed, stream_full (with the stream's length), not_found, terminal.
-- Called by: keiro_postgres stream_in::write_stream_in; tested in crates/postgres/tests only
-- (and tests/tests/engine/streams.rs: transaction steps are the Postgres store's alone).
CREATE OR REPLACE FUNCTION keiro_stream_append_in(p_name text, p_id text, p_key text,
                                                  p_payload jsonb, p_len bigint,
                                                  p_items_max bigint, p_bytes_max bigint,
                                                  OUT outcome text, OUT stream_offset bigint,
                                                  OUT stream_items bigint,
                                                  OUT stream_bytes bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_head   workflow_stream_heads%ROWTYPE;
BEGIN
    -- Held already by the step's transaction: this lock is granted at once.
    SELECT w.status INTO v_status FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        RETURN;
    END IF;
    SELECT * INTO v_head FROM workflow_stream_heads h
    WHERE h.workflow_name = p_name AND h.workflow_id = p_id AND h.key = p_key;
    stream_items := coalesce(v_head.next_offset, 0);
    stream_bytes := coalesce(v_head.bytes, 0);
    IF coalesce(v_head.closed, false) THEN
        outcome := 'stream_closed';
        RETURN;
    END IF;
    IF stream_items + 1 > p_items_max OR stream_bytes + p_len > p_bytes_max THEN
        outcome := 'stream_full';
        RETURN;
    END IF;
    INSERT INTO workflow_stream_heads AS h (workflow_name, workflow_id, key, next_offset, bytes)
    VALUES (p_name, p_id, p_key, 1, p_len)
    ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE
        SET next_offset = h.next_offset + 1, bytes = h.bytes + excluded.bytes,
            updated_at = now()
    RETURNING h.next_offset, h.bytes INTO stream_items, stream_bytes;
    INSERT INTO workflow_streams (workflow_name, workflow_id, key, stream_offset, value)
    VALUES (p_name, p_id, p_key, stream_items - 1, p_payload);
    stream_offset := stream_items - 1;
    PERFORM keiro_notify_message_if_watched(p_name, p_id);
    outcome := 'appended';
END;
$$;
