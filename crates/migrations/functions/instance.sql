-- Instances: start, confirm, a transaction step's hold, park, the divergence failure,
-- cancellation (plain and cascading), the settling of a completed run's leftovers, and the
-- operator's requeue and fix-and-replay.
-- Claims, crash accounting and resurrection are in lease.sql.

-- instance_start: creates the row `running`, or returns the existing one untouched.
-- Called by: keiro_postgres ops::instance::instance_start (also InTransaction, schedule); tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_start(p_name text, p_id text, p_input jsonb,
                                                p_parent_name text, p_parent_id text,
                                                p_priority integer,
                                                OUT created boolean, OUT instance workflows)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id, priority)
    VALUES (p_name, p_id, p_input, p_parent_name, p_parent_id, p_priority)
    ON CONFLICT (workflow_name, workflow_id) DO NOTHING
    RETURNING w.* INTO instance;
    created := FOUND;
    IF created THEN
        PERFORM keiro_notify_wake(p_name, p_id);
    ELSE
        -- A separate statement takes a fresh snapshot, so it sees a row that a concurrent
        -- start committed after this statement's INSERT began (the conflict it hit).
        SELECT w.* INTO instance FROM workflows w
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    END IF;
END;
$$;

-- instances_start: what `keiro_instance_start` does for each request, one row each
-- (`created`, and the instance row as it then is), in one transaction: the start lane's batches
-- (concurrent `start` calls, natural batching as for appends in journal.sql) and
-- `Keiro::start_many`. One INSERT creates every new key of the batch, in key order (the lock
-- order); a key that appears twice is created by its first request and found by the others; a
-- key another transaction is inserting makes the INSERT wait for it, as a single start does,
-- at most `lock_timeout` (then the store starts the batch's requests one by one). The rows are
-- then read by a statement of their own, whose fresh snapshot sees a row that a concurrent
-- start committed after the INSERT began (the conflict it hit).
--
-- One wake notification serves the batch: a listener only learns that some instance became
-- runnable (the payload's key is not used to pick it), and each notification is a queue entry
-- written at commit.
-- Called by: keiro_postgres ops::instance::instances_start; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instances_start(
    p_names text[], p_ids text[], p_inputs jsonb[], p_parent_names text[], p_parent_ids text[],
    p_priorities integer[])
RETURNS TABLE (n integer, created boolean, instance workflows)
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET lock_timeout = '100ms'
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_created integer[];
BEGIN
    WITH requests AS (
        SELECT DISTINCT ON (r.name COLLATE "C", r.id COLLATE "C") r.*
        FROM unnest(p_names, p_ids, p_inputs, p_parent_names, p_parent_ids, p_priorities)
             WITH ORDINALITY AS r (name, id, input, parent_name, parent_id, priority, n)
        ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
    ), inserted AS (
        INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                    priority)
        SELECT r.name, r.id, r.input, r.parent_name, r.parent_id, r.priority
        FROM requests r
        ORDER BY r.name COLLATE "C", r.id COLLATE "C"
        ON CONFLICT (workflow_name, workflow_id) DO NOTHING
        RETURNING w.workflow_name, w.workflow_id
    )
    SELECT coalesce(array_agg(r.n), '{}') INTO v_created
    FROM requests r
    JOIN inserted x ON x.workflow_name = r.name AND x.workflow_id = r.id;

    IF v_created <> '{}' THEN
        PERFORM keiro_notify_wake(p_names[v_created[1]], p_ids[v_created[1]]);
    END IF;

    RETURN QUERY
    SELECT r.n::integer, r.n = ANY (v_created),
           (SELECT w FROM workflows w WHERE w.workflow_name = r.name AND w.workflow_id = r.id)
    FROM unnest(p_names, p_ids) WITH ORDINALITY AS r (name, id, n);
END;
$$;

-- instance_confirm: renews a fenced run's lease and reports the status. A terminal row
-- answers without a lease check, so a run learns it is over even after the terminal write
-- cleared its lease. Outcomes: confirmed, terminal, not_found, lease_lost.
-- Called by: keiro_postgres ops::instance::instance_confirm; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_confirm(p_name text, p_id text, p_owner text,
                                                  p_epoch bigint, p_ttl_ms bigint,
                                                  OUT outcome text, OUT row_status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row workflows%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    row_status := v_row.status;
    IF v_row.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        RETURN;
    END IF;
    IF v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    UPDATE workflows w SET
        lease_expires_at = now() + p_ttl_ms * interval '1 millisecond',
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    outcome := 'confirmed';
END;
$$;

-- instance_hold: the first statement of a transaction step (crates/postgres/src/
-- transaction_step.rs), before the user's statements: locks the instance row for the rest of
-- the caller's transaction and checks the run's fence, writing nothing. Every writer of the row
-- (the lease heartbeat, a claim, a cancel, a delivery) then waits for that transaction instead
-- of changing the row under it, so no write of keiro's makes a REPEATABLE READ or SERIALIZABLE
-- transaction fail at its append ("could not serialize access due to concurrent update"), and
-- no other worker can take the lease over before the step commits or rolls back: the lock is
-- the lease for as long as it is held. As the transaction's first query it also takes the
-- transaction's snapshot, which therefore sees the row as it locks it. Unfenced (p_owner
-- NULL) it checks the status only. No memory-store twin: transaction steps need PostgreSQL.
-- Outcomes: held, terminal (row_status), not_found, lease_lost.
-- Called by: keiro_postgres transaction_step::hold; tested in crates/postgres/tests only.
CREATE OR REPLACE FUNCTION keiro_instance_hold(p_name text, p_id text, p_owner text,
                                               p_epoch bigint,
                                               OUT outcome text, OUT row_status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row workflows%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    row_status := v_row.status;
    IF v_row.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        RETURN;
    END IF;
    IF p_owner IS NOT NULL
       AND (v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch) THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    outcome := 'held';
END;
$$;

-- instance_park: parks a run waiting on `p_awaited`, releasing its lease and forgetting its
-- crash history (it made progress). The awaited steps are checked under the row lock that
-- every append takes first, so a wake that landed before the park keeps the row `running`
-- instead of being masked by `suspended`. A park on the current generation records the
-- deliveries it waits on (`parked_on`, for keiro_delivery_append). Outcomes: suspended, woken,
-- terminal, not_found, lease_lost.
-- Called by: keiro_postgres ops::instance::instance_park; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_park(p_name text, p_id text, p_generation integer,
                                               p_owner text, p_epoch bigint, p_awaited text[],
                                               p_wake_after timestamptz,
                                               OUT outcome text, OUT row_status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row       workflows%ROWTYPE;
    -- The deliveries this park waits on, which the bound on unread ones always lets in
    -- (keiro_delivery_append); NULL when it waits on none. Recorded by a woken park too: a
    -- run woken before every park by deliveries it does not read still gets its own.
    v_parked_on text[] := nullif(ARRAY(SELECT a FROM unnest(p_awaited) a
                                       WHERE starts_with(a, 'await:')), '{}');
BEGIN
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_row.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        row_status := v_row.status;
        RETURN;
    END IF;
    IF p_owner IS NOT NULL
       AND (v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch) THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    IF p_generation <> v_row.generation OR EXISTS (
        SELECT 1 FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = p_generation AND j.step_name = ANY (p_awaited)
    ) THEN
        UPDATE workflows w SET
            status = 'running',
            lease_owner = NULL, lease_expires_at = NULL,
            attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
            parked_on = CASE WHEN p_generation = w.generation THEN v_parked_on
                             ELSE w.parked_on END,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        PERFORM keiro_notify_wake(p_name, p_id);
        outcome := 'woken';
    ELSE
        UPDATE workflows w SET
            status = 'suspended', wake_after = p_wake_after,
            lease_owner = NULL, lease_expires_at = NULL,
            attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
            parked_on = v_parked_on,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        outcome := 'suspended';
    END IF;
END;
$$;

-- instance_fail_diverged: fails a run whose code no longer matches its journal, without a
-- journal row, so the very same journal can resume once fixed code is deployed and an
-- operator resurrects it. The failure is delivered to a waiting parent like any other.
-- Outcomes: failed, terminal, not_found, lease_lost.
-- Called by: keiro_postgres ops::instance::instance_fail_diverged; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_fail_diverged(p_name text, p_id text, p_owner text,
                                                        p_epoch bigint, p_reason text,
                                                        OUT outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row workflows%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_row.status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        RETURN;
    END IF;
    IF p_owner IS NOT NULL
       AND (v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch) THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    UPDATE workflows w SET
        status = 'failed', last_error = p_reason, completed_at = now(),
        lease_owner = NULL, lease_expires_at = NULL,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    RETURNING w.* INTO v_row;
    PERFORM keiro_child_deliver(v_row);
    outcome := 'failed';
END;
$$;

-- instance_settle_leftovers: cancels the live remote tasks and pending awakeables of a
-- completed run's generation (the losing branch of a race, an awakeable never awaited), which
-- nothing would ever read. The run calls it after its completion commits, only when its
-- journal holds a decided race or an awakeable allocation; its own transaction locks the
-- tasks and awakeables and never the owner's row, so it keeps the lock order of reports and
-- settlements. Returns how many it settled. Why not a trigger on every completion:
-- migrations/0014_settle_leftovers_of_completed_runs.sql.
-- Called by: keiro_postgres ops::instance::instance_settle_leftovers; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_settle_leftovers(p_name text, p_id text,
                                                           p_generation integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_tasks      bigint;
    v_awakeables bigint;
BEGIN
    PERFORM 1 FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id AND w.status = 'completed';
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Served by remote_tasks_owner_idx.
    UPDATE remote_tasks t SET
        status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        settled_at = now(), updated_at = now()
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id AND t.generation = p_generation
      AND t.status IN ('pending', 'running');
    GET DIAGNOSTICS v_tasks = ROW_COUNT;
    -- Served by awakeables_owner_idx.
    UPDATE awakeables a SET status = 'cancelled', settled_at = now()
    WHERE a.workflow_name = p_name AND a.workflow_id = p_id AND a.generation = p_generation
      AND a.status = 'pending';
    GET DIAGNOSTICS v_awakeables = ROW_COUNT;
    RETURN v_tasks + v_awakeables;
END;
$$;

-- The cancellation of one instance and, when `p_cascade`, of its live descendants, depth
-- first with children in key order, from a worklist (one nested call per level overran
-- `max_stack_depth` on a chain a few hundred deep). Each cancel marker goes through
-- `keiro_journal_append_to`, which cancels the instance's remote tasks; each cancelled child's
-- own delivery to its (now cancelled) parent is refused and ignored. `keiro_instance_cancel`
-- locks the tree and its tasks before it calls this. A cancelled instance is terminal, so a
-- cycle of parent links ends where it comes back: that cancel is refused. Outcomes: those of
-- `keiro_journal_append_to` for the instance itself.
-- Called by: SQL only (keiro_instance_cancel); tested by contract::instance.
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

-- instance_cancel: appends the cancel marker to the instance's current generation (external)
-- and, when `p_cascade`, cancels every live descendant, all in this transaction. The live
-- remote tasks of the tree are locked first, then the tree deepest first (the lock order,
-- sql/functions/README.md); the cancellations themselves cancel the tasks.
-- Called by: keiro_postgres ops::instance::instance_cancel (also InTransaction); tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_cancel(p_name text, p_id text, p_cascade boolean,
                                                 OUT outcome text, OUT recorded jsonb,
                                                 OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_names text[];
    v_ids   text[];
BEGIN
    IF p_cascade THEN
        -- The live tree (0002's walk: the path guards against a cycle of parent links),
        -- deepest first.
        WITH RECURSIVE tree (workflow_name, workflow_id, depth, path) AS (
            SELECT w.workflow_name, w.workflow_id, 1,
                   ARRAY[(p_name || '/' || p_id) COLLATE "C",
                         w.workflow_name || '/' || w.workflow_id]
            FROM workflows w
            WHERE w.parent_name = p_name AND w.parent_id = p_id
              AND w.status IN ('running', 'suspended')
            UNION ALL
            SELECT w.workflow_name, w.workflow_id, t.depth + 1,
                   t.path || (w.workflow_name || '/' || w.workflow_id)
            FROM tree t
            JOIN workflows w
              ON w.parent_name = t.workflow_name AND w.parent_id = t.workflow_id
            WHERE w.status IN ('running', 'suspended')
              AND (w.workflow_name || '/' || w.workflow_id) <> ALL (t.path)
        )
        SELECT array_agg(t.workflow_name ORDER BY t.depth DESC, t.workflow_name, t.workflow_id),
               array_agg(t.workflow_id ORDER BY t.depth DESC, t.workflow_name, t.workflow_id)
        INTO v_names, v_ids
        FROM tree t;
        -- Wake-source rows first (0005's lock order): the live tasks of the tree's current
        -- generations and of the root's, which the cancellations below cancel (served by
        -- remote_tasks_owner_idx).
        PERFORM 1 FROM remote_tasks t
        JOIN workflows w
          ON t.workflow_name = w.workflow_name AND t.workflow_id = w.workflow_id
         AND t.generation = w.generation
        JOIN unnest(coalesce(v_names, '{}') || p_name, coalesce(v_ids, '{}') || p_id)
             AS n(workflow_name, workflow_id)
          ON w.workflow_name = n.workflow_name AND w.workflow_id = n.workflow_id
        WHERE t.status IN ('pending', 'running')
        ORDER BY t.step_id
        FOR UPDATE OF t;
        -- Then the tree deepest first, before the root: a descendant finishing right now locks
        -- itself and then its parent, so taking the parent first here could deadlock with it.
        PERFORM 1 FROM workflows w
        JOIN unnest(v_names, v_ids) WITH ORDINALITY AS n(workflow_name, workflow_id, ord)
          ON w.workflow_name = n.workflow_name AND w.workflow_id = n.workflow_id
        ORDER BY n.ord
        FOR UPDATE OF w;
    END IF;
    SELECT c.outcome, c.recorded, c.marker INTO outcome, recorded, marker
    FROM keiro_instance_cancel_tree(p_name, p_id, p_cascade) c;
END;
$$;

-- Whether the body itself wrote a journal row, as opposed to a wake source delivering it
-- (keiro_journal::replay::recorded_by_body, less the remote results that arrive from outside).
-- Called by: SQL only (keiro_instance_requeue_one); tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_journal_written_by_body(p_step text, p_kind text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_kind IN ('step', 'patch', 'race', 'attempt')
        OR (p_kind = 'child' AND keiro_step_logical(p_step) NOT LIKE '%:result')
        OR (p_kind = 'awakeable' AND starts_with(p_step, 'awkid:'));
$$;

-- How a run's failure reason names the failed remote step or child stored as `p_step`.
-- Called by: SQL only (keiro_instance_requeue_one); tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_failure_mention(p_step text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN starts_with(keiro_step_logical(p_step), 'remote:')
            THEN 'remote step "' || substr(keiro_step_logical(p_step), 8) || '" failed'
        ELSE 'child workflow '
             || substr(keiro_step_logical(p_step), 7,
                       length(keiro_step_logical(p_step)) - 6 - length(':result'))
             || ' failed'
    END;
$$;

-- The requeue of one failed instance that the caller has locked. It supersedes each current
-- failed remote result and awaited child failure of its current generation that the run did
-- not handle with a `reset` row, resets their tasks, relinks the children, appends
-- `resurrected` and flips the row to `running`. `child_names`/`child_ids` are its failed
-- children that `keiro_instance_requeue` requeues next, in the order its records name them;
-- they and the instance itself are added to `visited`, the cycle guard of the whole requeue.
--
-- A record is current when no `reset` row supersedes it; a `reset` row is stored under
-- `__workflow_step_reset__:<superseded stored name>`, so that is one unique-index probe. A
-- failure counts as handled when the body itself wrote a journal row after it and the run's
-- last failure reason does not name it (the rule, and why:
-- migrations/0013_requeue_unhandled_failures.sql; the memory store applies the same rule).
-- Called by: SQL only (keiro_instance_requeue); tested by contract::instance.
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
    v_reason         text;
BEGIN
    reset_steps := 0;
    child_names := '{}';
    child_ids := '{}';
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    visited := array_append(visited, p_name || '/' || p_id);
    -- The reason the run failed with last: it names the failure the body did not handle.
    SELECT j.payload #>> '{}' INTO v_reason FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = v_row.generation AND j.kind = 'failed'
    ORDER BY j.seq DESC
    LIMIT 1;
    v_reason := coalesce(v_reason, '');

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
          -- A failure the body went on past, recording steps of its own after it, was
          -- handled (a fallback ran), unless the run failed on it after all.
          AND NOT (
              EXISTS (
                  SELECT 1 FROM journal b
                  WHERE b.workflow_name = p_name AND b.workflow_id = p_id
                    AND b.generation = v_row.generation AND b.seq > j.seq
                    AND keiro_journal_written_by_body(b.step_name, b.kind))
              AND strpos(v_reason, keiro_failure_mention(j.step_name)) = 0)
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
        attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
        wake_after = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        completed_at = NULL,
        -- Back from its end, a run of a queue waits for admission (0027).
        queue_free = false,
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

-- instance_requeue: the operator's retry of a failed instance and of its failed children
-- (see `keiro_instance_requeue_one`, called for each from a worklist), in one transaction.
-- Before the instance row, it locks the failed tasks it may reset and the live or failed
-- instances linked to its generation (recursively through failed ones), deepest first: a child
-- finishing now locks itself and then its parent, and a worker reporting locks the task and
-- then its owner. Outcomes: requeued (reset_steps, child_names, child_ids: the children
-- requeued, each before its own), not_failed (row_status), not_found.
-- Called by: keiro_postgres ops::instance::instance_requeue; tested by contract::instance.
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

-- instance_retry_with_input: fix-and-replay. Creates `p_retry` `running` with `p_input`, the
-- origin's priority and the origin's parent link, so its success also lands where a parent
-- awaits the origin (and `keiro_child_deliver` delivers only that success). The origin row is
-- read FOR SHARE: a requeue relinking the origin (a write) is ordered with this, so the link
-- copied is the current one, and a requeue after this finds the new row. Outcomes: started,
-- exists, origin_not_found.
-- Called by: keiro_postgres ops::instance::instance_retry_with_input; tested by contract::instance.
CREATE OR REPLACE FUNCTION keiro_instance_retry_with_input(p_origin_name text, p_origin_id text,
                                                           p_retry_name text, p_retry_id text,
                                                           p_input jsonb,
                                                           OUT outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_origin workflows%ROWTYPE;
BEGIN
    SELECT * INTO v_origin FROM workflows w
    WHERE w.workflow_name = p_origin_name AND w.workflow_id = p_origin_id
    FOR SHARE;
    IF NOT FOUND THEN
        outcome := 'origin_not_found';
        RETURN;
    END IF;
    INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                parent_generation, parent_step, priority)
    VALUES (p_retry_name, p_retry_id, p_input, v_origin.parent_name, v_origin.parent_id,
            v_origin.parent_generation, v_origin.parent_step, v_origin.priority)
    ON CONFLICT (workflow_name, workflow_id) DO NOTHING;
    IF FOUND THEN
        PERFORM keiro_notify_wake(p_retry_name, p_retry_id);
        outcome := 'started';
    ELSE
        outcome := 'exists';
    END IF;
END;
$$;
