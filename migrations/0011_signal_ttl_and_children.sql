-- keiro 0011: signal tokens and a buffered signal's lifetime; one parent per running child;
-- requeue and cascading cancel without recursion.
--
-- * Signals. A send is refused (by the stores, before they call in here) for a token no wait
--   could take: empty, over 200 bytes, or with a control character. Buffered signals have no
--   owner, so nothing else would ever delete them: each now has an `expires_at` (the send's
--   TTL, 7 days unless it says otherwise), is never delivered after it, and is deleted by the
--   next send or wait on its token or by the sweep every send makes.
-- * Children. `keiro_child_spawn` no longer leaves a spawner waiting forever on a running child
--   linked to another parent: it refuses the spawn, journaled, so the body sees
--   `ChildTaken`. A running child linked to an earlier generation of the spawner itself (the
--   parent continued as new) moves its link to the spawning generation.
-- * Deep trees. `keiro_instance_requeue_one` and `keiro_instance_cancel_tree` called
--   themselves once per level of children, so a chain a few hundred deep overran
--   `max_stack_depth`; both walks now use a worklist.
--
-- Every function replaced here gets 0009's `search_path` again, which `CREATE OR REPLACE`
-- drops (last statement of this file).

-- Added, backfilled, then constrained. A signal buffered before this migration gets the
-- default TTL from now, not from when it was sent, so an upgrade expires nothing at once.
ALTER TABLE signal_buffer ADD COLUMN expires_at timestamptz;
UPDATE signal_buffer SET expires_at = now() + interval '7 days';
ALTER TABLE signal_buffer ALTER COLUMN expires_at SET NOT NULL;

-- Tokens that no wait can take (waits always refused them): their signals could only pile up.
DELETE FROM signal_buffer
WHERE token = '' OR octet_length(token) > 200 OR token ~ '[\u0001-\u001f\u007f-\u009f]';

-- Serves the sweep of `keiro_signal_send`: the first expired signals of any token.
CREATE INDEX signal_buffer_expires_idx ON signal_buffer (expires_at);

-- signal_wait, as in 0002, except that the token's expired signals are deleted first and so
-- never delivered. The oldest live signal is read without a row lock: a concurrent sweep may
-- delete it only once it has expired by the sweeper's clock, and then this wait delivers a
-- signal that was live when it looked, once (the token lock orders every deliverer).
CREATE OR REPLACE FUNCTION keiro_signal_wait(p_name text, p_id text, p_generation integer,
                                             p_step text, p_token text, p_owner text,
                                             p_epoch bigint,
                                             OUT outcome text, OUT delivered jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seq      bigint;
    v_payload  jsonb;
    v_envelope jsonb;
    v_outcome  text;
    v_recorded jsonb;
BEGIN
    PERFORM keiro_signal_lock(p_token);
    PERFORM 1 FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT j.payload INTO v_recorded FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = p_generation AND j.step_name = p_step;
    IF FOUND THEN
        outcome := 'delivered';
        delivered := v_recorded;
        RETURN;
    END IF;
    PERFORM 1 FROM signal_waiters sw
    WHERE sw.workflow_name = p_name AND sw.workflow_id = p_id
      AND sw.generation = p_generation AND sw.step = p_step;
    IF FOUND THEN
        outcome := 'waiting';
        RETURN;
    END IF;

    DELETE FROM signal_buffer b WHERE b.token = p_token AND b.expires_at <= now();
    SELECT b.seq, b.payload INTO v_seq, v_payload FROM signal_buffer b
    WHERE b.token = p_token
    ORDER BY b.seq
    LIMIT 1;
    IF FOUND THEN
        v_envelope := jsonb_build_object('ok', v_payload);
        SELECT a.outcome, a.recorded INTO v_outcome, v_recorded
        FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, 'signal', v_envelope,
                                     p_owner, p_epoch, NULL) a;
        IF v_outcome = 'appended' THEN
            DELETE FROM signal_buffer b WHERE b.seq = v_seq;
            outcome := 'delivered';
            delivered := v_envelope;
        ELSIF v_outcome = 'already_present' THEN
            -- Unreachable under the token lock (the step was checked above); if it were, the
            -- recorded value is the answer and the signal stays buffered.
            outcome := 'delivered';
            delivered := v_recorded;
        ELSIF v_outcome IN ('lease_lost', 'not_found') THEN
            outcome := v_outcome;
        ELSE
            -- Terminal, or another generation: the signal stays for a waiter that can take it.
            outcome := 'waiting';
        END IF;
        RETURN;
    END IF;

    INSERT INTO signal_waiters (token, workflow_name, workflow_id, generation, step)
    VALUES (p_token, p_name, p_id, p_generation, p_step);
    outcome := 'waiting';
END;
$$;

-- signal_send with a TTL: as in 0002, plus the expiry of a buffered signal (`p_ttl_ms` from
-- now), the deletion of the token's expired signals first, and a sweep of up to 16 expired
-- signals of any token last. The sweep comes last and skips locked rows, so it never waits
-- while holding what another transaction may need: a wait that holds an instance row and
-- deletes the signal it consumed cannot meet this send waiting on that instance row.
-- Outcomes: delivered (to_name, to_id), buffered.
CREATE FUNCTION keiro_signal_send(p_token text, p_payload jsonb, p_ttl_ms bigint,
                                  OUT outcome text, OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_waiter   signal_waiters%ROWTYPE;
    v_envelope jsonb := jsonb_build_object('ok', p_payload);
    v_outcome  text;
BEGIN
    PERFORM keiro_signal_lock(p_token);
    DELETE FROM signal_buffer b WHERE b.token = p_token AND b.expires_at <= now();
    -- Every writer of this token's waiters holds the token lock, so the list cannot change
    -- under the loop and needs no row locks.
    FOR v_waiter IN
        SELECT * FROM signal_waiters sw WHERE sw.token = p_token ORDER BY sw.seq
    LOOP
        DELETE FROM signal_waiters sw
        WHERE sw.workflow_name = v_waiter.workflow_name AND sw.workflow_id = v_waiter.workflow_id
          AND sw.generation = v_waiter.generation AND sw.step = v_waiter.step;
        SELECT a.outcome INTO v_outcome
        FROM keiro_journal_append_to(v_waiter.workflow_name, v_waiter.workflow_id,
                                     v_waiter.generation, v_waiter.step, 'signal', v_envelope,
                                     NULL, NULL, NULL) a;
        IF v_outcome = 'appended' THEN
            outcome := 'delivered';
            to_name := v_waiter.workflow_name;
            to_id := v_waiter.workflow_id;
            EXIT;
        END IF;
    END LOOP;
    IF outcome IS NULL THEN
        INSERT INTO signal_buffer (token, payload, expires_at)
        VALUES (p_token, p_payload, now() + p_ttl_ms * interval '1 millisecond');
        outcome := 'buffered';
    END IF;

    DELETE FROM signal_buffer b
    WHERE b.seq IN (
        SELECT e.seq FROM signal_buffer e
        WHERE e.expires_at <= now()
        ORDER BY e.expires_at
        LIMIT 16
        FOR UPDATE SKIP LOCKED);
END;
$$;

-- The two-argument send of 0002, for a build older than this migration still running on the
-- schema: the default TTL (7 days, `SIGNAL_TTL_DEFAULT`).
CREATE OR REPLACE FUNCTION keiro_signal_send(p_token text, p_payload jsonb,
                                             OUT outcome text, OUT to_name text,
                                             OUT to_id text)
LANGUAGE sql AS $$
    SELECT s.outcome, s.to_name, s.to_id
    FROM keiro_signal_send(p_token, p_payload, 7 * 24 * 3600 * 1000::bigint) s;
$$;

-- child_spawn: applies the parent's spawn-step append and, only when it was appended,
-- creates the child `running` (generation 0, priority 0), linked to the parent's generation
-- and awaited step, and notifies it like a start. When an instance with the child's key
-- exists (locked after the parent, the one order 0002 leaves to deadlock detection):
-- * finished: its result envelope is journaled into the spawner at once (and it adopts the
--   spawner if it has no parent);
-- * running with no parent, or linked to the spawner itself (an earlier generation, which
--   continued as new and can never take the result): the link moves to this spawn;
-- * running for another parent: the spawn is refused. The spawn row, written above in this
--   transaction, gets `"taken": {"name", "id"}` (that parent), `{"taken": ...}` is journaled
--   under the awaited step too, so an await of the child ends, and the outcome is
--   already_present with the stored value, which the context reads as `ChildTaken`.
-- Outcomes: those of `keiro_journal_append_to`.
CREATE OR REPLACE FUNCTION keiro_child_spawn(p_name text, p_id text, p_generation integer,
                                             p_step text, p_kind text, p_payload jsonb,
                                             p_owner text, p_epoch bigint, p_renew_ms bigint,
                                             p_child_name text, p_child_id text,
                                             p_input jsonb, p_await_step text,
                                             OUT outcome text, OUT recorded jsonb,
                                             OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
    v_child      workflows%ROWTYPE;
    v_taken      jsonb;
BEGIN
    SELECT a.outcome, a.recorded, a.marker, a.appended_generation
    INTO outcome, recorded, marker, v_generation
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome <> 'appended' THEN
        RETURN;
    END IF;

    INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                parent_generation, parent_step, priority)
    VALUES (p_child_name, p_child_id, p_input, p_name, p_id, v_generation, p_await_step, 0)
    ON CONFLICT (workflow_name, workflow_id) DO NOTHING;
    IF FOUND THEN
        PERFORM keiro_notify_wake(p_child_name, p_child_id);
        RETURN;
    END IF;

    -- A fresh snapshot sees the row a concurrent start committed (the conflict above).
    SELECT * INTO v_child FROM workflows w
    WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    IF v_child.status IN ('completed', 'failed', 'cancelled') THEN
        IF v_child.parent_name IS NULL THEN
            UPDATE workflows w SET
                parent_name = p_name, parent_id = p_id,
                parent_generation = v_generation, parent_step = p_await_step,
                updated_at = now()
            WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id;
        END IF;
        PERFORM keiro_journal_append_to(p_name, p_id, v_generation, p_await_step, 'child',
                                        keiro_child_envelope(v_child), NULL, NULL, NULL);
        RETURN;
    END IF;

    IF v_child.parent_name IS NULL
       OR (v_child.parent_name = p_name AND v_child.parent_id = p_id) THEN
        UPDATE workflows w SET
            parent_name = p_name, parent_id = p_id,
            parent_generation = v_generation, parent_step = p_await_step,
            updated_at = now()
        WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id;
        RETURN;
    END IF;

    -- Rewriting the spawn row is no history rewrite: nobody has seen it before this commits.
    v_taken := jsonb_build_object('name', v_child.parent_name, 'id', v_child.parent_id);
    recorded := CASE WHEN jsonb_typeof(p_payload) = 'object'
                     THEN p_payload || jsonb_build_object('taken', v_taken)
                     ELSE p_payload END;
    UPDATE journal j SET payload = recorded
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = v_generation AND j.step_name = p_step;
    PERFORM keiro_journal_append_to(p_name, p_id, v_generation, p_await_step, 'child',
                                    jsonb_build_object('taken', v_taken), NULL, NULL, NULL);
    outcome := 'already_present';
END;
$$;

-- The requeue of one failed instance that the caller has locked: as in 0005, except that it
-- no longer requeues its failed children itself. It supersedes each current failed remote
-- result and awaited child failure of its current generation with a `reset` row, resets their
-- tasks, relinks the children, appends `resurrected` and flips the row to `running`.
-- `child_names`/`child_ids` are its failed children that `keiro_instance_requeue` requeues
-- next, in the order its records name them; they and the instance itself are added to
-- `visited`, the cycle guard of the whole requeue.
CREATE OR REPLACE FUNCTION keiro_instance_requeue_one(p_name text, p_id text, INOUT visited text[],
                                           OUT reset_steps bigint, OUT child_names text[],
                                           OUT child_ids text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row            workflows%ROWTYPE;
    v_record         record;
    v_logical        text;
    v_next           text;
    v_pair           text;
    v_child_name     text;
    v_child_id       text;
    v_child          workflows%ROWTYPE;
    v_output         jsonb;
    v_found          boolean;
    v_deliver_steps  text[] := '{}';
    v_deliver_values jsonb[] := '{}';
    v_notify_remote  boolean := false;
    v_i              integer;
BEGIN
    reset_steps := 0;
    child_names := '{}';
    child_ids := '{}';
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    visited := array_append(visited, p_name || '/' || p_id);

    -- The loop's query is read once, before the first reset row is inserted.
    FOR v_record IN
        SELECT j.step_name, j.kind FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = v_row.generation
          AND ((j.kind = 'remote' AND j.payload ? 'error')
               OR (j.kind = 'child' AND j.payload ? 'failed'
                   AND keiro_step_logical(j.step_name) LIKE 'child:%:result'))
          AND NOT EXISTS (
              SELECT 1 FROM journal r
              WHERE r.workflow_name = p_name AND r.workflow_id = p_id
                AND r.generation = v_row.generation
                AND r.step_name = '__workflow_step_reset__:' || j.step_name)
        ORDER BY j.seq
    LOOP
        v_logical := keiro_step_logical(v_record.step_name);
        v_next := v_logical || '#' || (keiro_step_revision(v_record.step_name) + 1);
        -- The instance is failed, so the append rules would refuse the row; it is written
        -- directly, under the row lock every journal writer holds.
        INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
        VALUES (p_name, p_id, v_row.generation,
                '__workflow_step_reset__:' || v_record.step_name, 'reset',
                jsonb_build_object('step', v_logical, 'superseded', v_record.step_name));
        reset_steps := reset_steps + 1;

        IF v_record.kind = 'remote' THEN
            -- Served by remote_tasks_owner_idx.
            UPDATE remote_tasks t SET
                status = 'pending', attempts = 0, dispatches = 1, available_at = now(),
                deadline_at = now() + t.redispatch_after_ms * interval '1 millisecond',
                claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
                last_error = NULL, output = NULL, settled_at = NULL,
                journal_step = v_next, updated_at = now()
            WHERE t.workflow_name = p_name AND t.workflow_id = p_id
              AND t.generation = v_row.generation AND t.journal_step = v_record.step_name;
            v_notify_remote := v_notify_remote OR FOUND;
            CONTINUE;
        END IF;

        -- `child:<name>/<id>:result`; names and ids contain neither `/` nor `:`.
        v_pair := substr(v_logical, length('child:') + 1,
                         length(v_logical) - length('child:') - length(':result'));
        v_child_name := split_part(v_pair, '/', 1);
        v_child_id := substr(v_pair, length(v_child_name) + 2);

        -- A success is already there: the child itself completed (after an operator requeued
        -- it), or a fix of it did. It is journaled once the row is running again.
        SELECT w.output INTO v_output FROM workflows w
        WHERE w.workflow_name = v_child_name AND w.workflow_id = v_child_id
          AND w.status = 'completed';
        v_found := FOUND;
        IF NOT v_found THEN
            -- The fixes `<id>~retry~<hex>` linked to this parent, by primary-key range.
            SELECT w.output INTO v_output FROM workflows w
            WHERE w.workflow_name = v_child_name
              AND w.workflow_id >= v_child_id || '~retry~'
              AND w.workflow_id < v_child_id || '~retry' || chr(127)
              AND starts_with(w.workflow_id, v_child_id || '~retry~')
              AND w.status = 'completed'
              AND w.parent_name = p_name AND w.parent_id = p_id
              AND w.parent_generation = v_row.generation
            ORDER BY w.completed_at, w.workflow_id
            LIMIT 1;
            v_found := FOUND;
        END IF;
        IF v_found THEN
            v_deliver_steps := array_append(v_deliver_steps, v_next);
            v_deliver_values := array_append(v_deliver_values, coalesce(v_output, 'null'::jsonb));
            CONTINUE;
        END IF;

        -- No success yet: the child and its fixes now deliver to the next revision.
        UPDATE workflows w SET parent_step = v_next, updated_at = now()
        WHERE w.parent_name = p_name AND w.parent_id = p_id
          AND w.parent_generation = v_row.generation AND w.parent_step = v_record.step_name;
        SELECT * INTO v_child FROM workflows w
        WHERE w.workflow_name = v_child_name AND w.workflow_id = v_child_id
        FOR UPDATE;
        IF FOUND AND v_child.status = 'failed'
           AND NOT ((v_child_name || '/' || v_child_id) = ANY (visited)) THEN
            child_names := array_append(child_names, v_child_name);
            child_ids := array_append(child_ids, v_child_id);
            visited := array_append(visited, v_child_name || '/' || v_child_id);
        END IF;
    END LOOP;

    -- As `keiro_instance_resurrect` (0001): the failure stays in history.
    INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
    VALUES (p_name, p_id, v_row.generation,
            keiro_journal_repeatable_name(p_name, p_id, v_row.generation, 'resurrected',
                                          '__workflow_resurrected__'),
            'resurrected', 'null'::jsonb);
    UPDATE workflows w SET
        status = 'running',
        attempts = 0, last_error = NULL, next_attempt_at = NULL, wake_after = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        completed_at = NULL,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    PERFORM keiro_notify_wake(p_name, p_id);

    -- The buffered successes, through the append rules now that the row is running.
    FOR v_i IN 1 .. cardinality(v_deliver_steps) LOOP
        PERFORM keiro_journal_append_to(p_name, p_id, v_row.generation, v_deliver_steps[v_i],
                                        'child', jsonb_build_object('ok', v_deliver_values[v_i]),
                                        NULL, NULL, NULL);
    END LOOP;
    IF v_notify_remote THEN
        PERFORM keiro_notify_remote();
    END IF;
END;
$$;

-- instance_requeue: as in 0005 (the locks, then the requeue, in one transaction), with the
-- failed children requeued from a worklist instead of by recursion. Outcomes: requeued
-- (reset_steps, child_names, child_ids: the children requeued, each before its own),
-- not_failed (row_status), not_found.
CREATE OR REPLACE FUNCTION keiro_instance_requeue(p_name text, p_id text,
                                       OUT outcome text, OUT row_status text,
                                       OUT reset_steps bigint, OUT child_names text[],
                                       OUT child_ids text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
    v_names      text[];
    v_ids        text[];
    v_result     record;
    v_visited    text[];
    v_todo_names text[] := '{}';
    v_todo_ids   text[] := '{}';
    v_name       text;
    v_id         text;
    v_i          integer;
BEGIN
    SELECT w.status, w.generation INTO row_status, v_generation FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF row_status <> 'failed' THEN
        outcome := 'not_failed';
        RETURN;
    END IF;

    -- The linked tree, served by workflows_parent_link_idx; the path guards against a cycle of
    -- parent links (an adopted ancestor).
    WITH RECURSIVE tree (workflow_name, workflow_id, status, generation, depth, path) AS (
        SELECT w.workflow_name, w.workflow_id, w.status, w.generation, 1,
               ARRAY[(p_name || '/' || p_id) COLLATE "C", w.workflow_name || '/' || w.workflow_id]
        FROM workflows w
        WHERE w.parent_name = p_name AND w.parent_id = p_id
          AND w.parent_generation = v_generation AND w.parent_step IS NOT NULL
          AND w.status IN ('running', 'suspended', 'failed')
        UNION ALL
        SELECT w.workflow_name, w.workflow_id, w.status, w.generation, t.depth + 1,
               t.path || (w.workflow_name || '/' || w.workflow_id)
        FROM tree t
        JOIN workflows w
          ON w.parent_name = t.workflow_name AND w.parent_id = t.workflow_id
         AND w.parent_generation = t.generation AND w.parent_step IS NOT NULL
        WHERE t.status = 'failed'
          AND w.status IN ('running', 'suspended', 'failed')
          AND (w.workflow_name || '/' || w.workflow_id) <> ALL (t.path)
    )
    SELECT array_agg(t.workflow_name ORDER BY t.depth DESC, t.workflow_name, t.workflow_id),
           array_agg(t.workflow_id ORDER BY t.depth DESC, t.workflow_name, t.workflow_id)
    INTO v_names, v_ids
    FROM tree t;
    v_names := coalesce(v_names, '{}') || p_name;
    v_ids := coalesce(v_ids, '{}') || p_id;

    -- Wake-source rows first: the failed tasks of the tree (served by remote_tasks_owner_idx).
    PERFORM 1 FROM remote_tasks t
    JOIN unnest(v_names, v_ids) AS n(workflow_name, workflow_id)
      ON t.workflow_name = n.workflow_name AND t.workflow_id = n.workflow_id
    WHERE t.status = 'failed'
    ORDER BY t.step_id
    FOR UPDATE OF t;
    -- Then the instances, deepest first, the requeued instance last.
    PERFORM 1 FROM workflows w
    JOIN unnest(v_names, v_ids) WITH ORDINALITY AS n(workflow_name, workflow_id, ord)
      ON w.workflow_name = n.workflow_name AND w.workflow_id = n.workflow_id
    ORDER BY n.ord
    FOR UPDATE OF w;

    -- Re-read under the lock: a concurrent requeue may have won.
    SELECT w.status INTO row_status FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF row_status <> 'failed' THEN
        outcome := 'not_failed';
        RETURN;
    END IF;

    -- Depth first through a worklist (its top is the arrays' end), each instance's children
    -- pushed in reverse so they are taken in the order its records name them: the order the
    -- recursion of 0005 requeued them in, without a nested call per level.
    reset_steps := 0;
    child_names := '{}';
    child_ids := '{}';
    v_name := p_name;
    v_id := p_id;
    v_visited := '{}';
    LOOP
        SELECT * INTO v_result FROM keiro_instance_requeue_one(v_name, v_id, v_visited);
        v_visited := v_result.visited;
        reset_steps := reset_steps + v_result.reset_steps;
        FOR v_i IN REVERSE cardinality(v_result.child_names) .. 1 LOOP
            v_todo_names := array_append(v_todo_names, v_result.child_names[v_i]);
            v_todo_ids := array_append(v_todo_ids, v_result.child_ids[v_i]);
        END LOOP;
        EXIT WHEN cardinality(v_todo_names) = 0;
        v_name := v_todo_names[cardinality(v_todo_names)];
        v_id := v_todo_ids[cardinality(v_todo_ids)];
        v_todo_names := trim_array(v_todo_names, 1);
        v_todo_ids := trim_array(v_todo_ids, 1);
        child_names := array_append(child_names, v_name);
        child_ids := array_append(child_ids, v_id);
    END LOOP;
    row_status := 'running';
    outcome := 'requeued';
END;
$$;

-- The cancellation of one instance and, when `p_cascade`, of its live descendants: as in
-- 0002 (depth first, children in key order; each cancelled child's delivery to its cancelled
-- parent is refused and ignored; each cancel marker goes through 0010's append, which cancels
-- the instance's remote tasks), from a worklist instead of one nested call per level, which
-- overran `max_stack_depth` on a chain a few hundred deep. 0010's `keiro_instance_cancel`
-- still locks the tree and its tasks before it calls this. A cancelled instance is terminal,
-- so a cycle of parent links ends where it comes back: that cancel is refused.
CREATE OR REPLACE FUNCTION keiro_instance_cancel_tree(p_name text, p_id text,
                                                      p_cascade boolean,
                                                      OUT outcome text, OUT recorded jsonb,
                                                      OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_todo_names text[] := '{}';
    v_todo_ids   text[] := '{}';
    v_name       text := p_name;
    v_id         text := p_id;
    v_child      record;
    v_outcome    text;
BEGIN
    SELECT a.outcome, a.recorded, a.marker INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, NULL, '__workflow_cancelled__', 'cancelled',
                                 'null'::jsonb, NULL, NULL, NULL) a;
    IF outcome <> 'appended' OR NOT p_cascade THEN
        RETURN;
    END IF;
    LOOP
        -- `v_name`/`v_id` was just cancelled. Its live children go on the worklist last key
        -- first, so they come off it in key order.
        FOR v_child IN
            SELECT w.workflow_name, w.workflow_id FROM workflows w
            WHERE w.parent_name = v_name AND w.parent_id = v_id
              AND w.status IN ('running', 'suspended')
            ORDER BY w.workflow_name DESC, w.workflow_id DESC
        LOOP
            v_todo_names := array_append(v_todo_names, v_child.workflow_name::text);
            v_todo_ids := array_append(v_todo_ids, v_child.workflow_id::text);
        END LOOP;
        LOOP
            IF cardinality(v_todo_names) = 0 THEN
                RETURN;
            END IF;
            v_name := v_todo_names[cardinality(v_todo_names)];
            v_id := v_todo_ids[cardinality(v_todo_ids)];
            v_todo_names := trim_array(v_todo_names, 1);
            v_todo_ids := trim_array(v_todo_ids, 1);
            SELECT a.outcome INTO v_outcome
            FROM keiro_journal_append_to(v_name, v_id, NULL, '__workflow_cancelled__',
                                         'cancelled', 'null'::jsonb, NULL, NULL, NULL) a;
            EXIT WHEN v_outcome = 'appended';
        END LOOP;
    END LOOP;
END;
$$;

-- Every function this file created or replaced runs with keiro's schema and pg_temp as its
-- search_path, as 0009 set for all of them.
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOREACH v_function IN ARRAY ARRAY[
        'keiro_signal_wait(text, text, integer, text, text, text, bigint)',
        'keiro_signal_send(text, jsonb, bigint)',
        'keiro_signal_send(text, jsonb)',
        'keiro_child_spawn(text, text, integer, text, text, jsonb, text, bigint, bigint, text, text, jsonb, text)',
        'keiro_instance_requeue_one(text, text, text[])',
        'keiro_instance_requeue(text, text)',
        'keiro_instance_cancel_tree(text, text, boolean)'
    ]::regprocedure[]
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = %I, pg_temp',
                                  v_function, pg_catalog.current_schema());
    END LOOP;
END;
$$;
