-- keiro 0010: cancelling a run cancels its remote tasks; so does leaving a generation by
-- continue-as-new.
--
-- Until now a task outlived the run that awaited it: cancel and cancel-cascade never touched
-- `remote_tasks`, and claims, retries and heartbeats never looked at the owner, so a worker
-- would still charge the card of a cancelled order, and retry the charge when it failed; its
-- result was then refused by the cancelled owner. The same held for a task of a generation its
-- run had left by continuing as new (a remote step dispatched beside a step action, which the
-- body then gave up on).
--
-- * A task has a new final status, `cancelled`. The `cancelled` and `continued` markers, in the
--   transaction that appends them (`keiro_journal_append_to`, through which every cancel goes:
--   `keiro_instance_cancel` plain or cascading, for each instance it cancels, and an external
--   marker), cancel the pending and claimed tasks of the generation they close
--   (`keiro_remote_tasks_cancel`): the claim is dropped, `settled_at` set, the output and the
--   last error stay as they were. Settled tasks keep their result. A failed run's tasks are
--   left alone: a requeue may still use their results.
-- * A claim takes only `pending` tasks, and its sweep only `running` ones, so a cancelled task
--   is never claimed again; a re-arm leaves it as it is.
-- * A heartbeat (`keiro_remote_task_heartbeat`, one round trip as before) says whether the
--   claim was extended, lost, or cancelled; the remote worker tells the handler, which can stop.
-- * A report of a cancelled task, success or failure, from any claim, is refused with outcome
--   `cancelled`: nothing is journaled and a failure is not retried.
--
-- Why a status rather than settling the task with an error envelope: no run will ever read the
-- envelope (a cancelled run is never resumed, a generation left behind is never driven again),
-- and the status tells an operator, and `RemoteAdmin::remote_tasks`, what happened.
--
-- The race with an arm. An arm read the owner's row without a lock, so a cancellation could
-- commit between that read and the arm's commit, miss the task the arm was writing (not yet
-- committed), and leave it pending for a cancelled run. The arm now reads the row FOR KEY
-- SHARE, the weakest lock that conflicts with the FOR UPDATE every append takes on it (the
-- marker's included; an instance claim's UPDATE does not wait for it), so either the arm waits
-- and then sees the row cancelled (nothing written), or the cancellation waits for the arm's
-- commit and then cancels the task it wrote. The park that follows an arm locks the row anyway.
--
-- Lock order: 0005's, task rows before instance rows. A marker that cancels tasks locks the
-- live tasks of its generation before the instance row; the cascading cancel locks the live
-- tasks of the whole tree before the tree (deepest first, as in 0002). A task armed after
-- those locks were taken is locked after the instance row, which only a report of that very
-- task, made in the moment between its arm's commit and the cancellation's, could meet in a
-- deadlock; the server breaks it (see 0007), and a failed cancel is a retryable error.
--
-- Every function replaced or created here gets 0009's `search_path`, which `CREATE OR REPLACE`
-- drops (last statement of this file); the two remote functions of 0007 keep their plan
-- settings, stated again.

-- Widened, then backfilled.
ALTER TABLE remote_tasks DROP CONSTRAINT remote_tasks_status_check;
ALTER TABLE remote_tasks ADD CONSTRAINT remote_tasks_status_check
    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled'));

-- The tasks already orphaned: pending or claimed for a cancelled run, or for a generation its
-- run has left.
UPDATE remote_tasks t SET
    status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
    settled_at = now(), updated_at = now()
FROM workflows w
WHERE w.workflow_name = t.workflow_name AND w.workflow_id = t.workflow_id
  AND t.status IN ('pending', 'running')
  AND (w.status = 'cancelled' OR t.generation <> w.generation);

-- Cancels the pending and claimed tasks of one generation of an instance, whose row the caller
-- has locked (see the header). Returns how many.
CREATE FUNCTION keiro_remote_tasks_cancel(p_name text, p_id text, p_generation integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_cancelled bigint;
BEGIN
    -- Served by remote_tasks_owner_idx.
    UPDATE remote_tasks t SET
        status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        settled_at = now(), updated_at = now()
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id AND t.generation = p_generation
      AND t.status IN ('pending', 'running');
    GET DIAGNOSTICS v_cancelled = ROW_COUNT;
    RETURN v_cancelled;
END;
$$;

-- journal_append's rules, as in 0004, except that the `cancelled` and `continued` markers
-- cancel the remote tasks of the generation they close, in the same transaction, having locked
-- them before the instance row (see the header). Every other path is 0004's, unchanged.
CREATE OR REPLACE FUNCTION keiro_journal_append_to(p_name text, p_id text, p_generation integer,
                                                   p_step text, p_kind text, p_payload jsonb,
                                                   p_owner text, p_epoch bigint,
                                                   p_renew_ms bigint,
                                                   OUT outcome text, OUT recorded jsonb,
                                                   OUT marker text,
                                                   OUT appended_generation integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row        workflows%ROWTYPE;
    v_generation integer;
    v_is_marker  boolean := p_kind IN ('completed', 'failed', 'cancelled', 'continued');
    v_kind       text;
    v_payload    jsonb;
    v_step       text := p_step;
BEGIN
    IF p_kind IN ('cancelled', 'continued') THEN
        -- Lock order (0005): the live tasks these markers cancel, before the instance row. The
        -- generation is read without a lock; a task armed after this read is locked by the
        -- cancellation itself, once the arm that wrote it committed (see the header).
        PERFORM 1 FROM remote_tasks t
        WHERE t.workflow_name = p_name AND t.workflow_id = p_id
          AND t.generation = coalesce(p_generation,
                                      (SELECT w.generation FROM workflows w
                                       WHERE w.workflow_name = p_name AND w.workflow_id = p_id))
          AND t.status IN ('pending', 'running')
        ORDER BY t.step_id
        FOR UPDATE;
    END IF;

    -- The row lock serializes every writer of this instance, so the checks below and the
    -- write after them see one consistent state.
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    v_generation := coalesce(p_generation, v_row.generation);

    -- The fast path: a step on the current generation of a live row, by its lease holder or
    -- unfenced.
    IF NOT v_is_marker AND v_generation = v_row.generation
       AND v_row.status IN ('running', 'suspended')
       AND (p_owner IS NULL OR (v_row.lease_owner = p_owner AND v_row.lease_epoch = p_epoch))
    THEN
        INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
        VALUES (p_name, p_id, v_generation, p_step, p_kind, p_payload)
        ON CONFLICT (workflow_name, workflow_id, generation, step_name) DO NOTHING;
        IF NOT FOUND THEN
            -- Recorded before: every writer adopts the first recorded value.
            SELECT j.kind, j.payload INTO v_kind, v_payload FROM journal j
            WHERE j.workflow_name = p_name AND j.workflow_id = p_id
              AND j.generation = v_generation AND j.step_name = p_step;
            IF v_kind = p_kind THEN
                outcome := 'already_present';
                recorded := v_payload;
            ELSE
                outcome := 'conflict';
            END IF;
            RETURN;
        END IF;
        IF v_row.status = 'suspended'
           OR p_owner IS NULL OR p_renew_ms IS NULL
           OR v_row.lease_expires_at IS NULL
           OR v_row.lease_expires_at <= now() + p_renew_ms * interval '750 microseconds' THEN
            -- Only unindexed columns change on a running row, so the new version can be HOT;
            -- a wake changes `status` and is indexed as it must be.
            UPDATE workflows w SET
                status = 'running',
                lease_expires_at = CASE
                    WHEN p_owner IS NOT NULL AND p_renew_ms IS NOT NULL
                        THEN now() + p_renew_ms * interval '1 millisecond'
                    ELSE w.lease_expires_at
                END,
                updated_at = now()
            WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
            -- A step landing on a parked instance is a wake.
            IF v_row.status = 'suspended' THEN
                PERFORM keiro_notify_wake(p_name, p_id);
            END IF;
        END IF;
        outcome := 'appended';
        appended_generation := v_generation;
        RETURN;
    END IF;

    -- Everything else: the checks and writes of 0002, in its order.

    -- A writer on another generation only learns what is recorded there.
    IF v_generation <> v_row.generation THEN
        SELECT j.payload INTO v_payload FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = v_generation AND j.step_name = p_step;
        IF FOUND THEN
            outcome := 'already_present';
            recorded := v_payload;
        ELSE
            outcome := 'conflict';
        END IF;
        RETURN;
    END IF;

    -- A recorded step is checked before the terminal status, so retrying it stays idempotent
    -- after the instance closed; every writer adopts the first recorded value.
    IF NOT v_is_marker THEN
        SELECT j.kind, j.payload INTO v_kind, v_payload FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = v_generation AND j.step_name = p_step;
        IF FOUND THEN
            IF v_kind = p_kind THEN
                outcome := 'already_present';
                recorded := v_payload;
            ELSE
                outcome := 'conflict';
            END IF;
            RETURN;
        END IF;
    END IF;

    -- A terminal row never moves again through an append. A repeat of the marker that closed
    -- it converges on the recorded value, read from the row because a divergence failure has
    -- no journal row.
    IF v_row.status IN ('completed', 'failed', 'cancelled') THEN
        IF v_is_marker AND p_kind = v_row.status THEN
            outcome := 'already_present';
            recorded := CASE v_row.status
                WHEN 'completed' THEN coalesce(v_row.output, 'null'::jsonb)
                WHEN 'failed' THEN coalesce(to_jsonb(v_row.last_error), 'null'::jsonb)
                ELSE 'null'::jsonb
            END;
        ELSE
            outcome := 'refused_terminal';
            marker := v_row.status;
        END IF;
        RETURN;
    END IF;

    -- The fence comes after the idempotency checks: a stale holder may learn a recorded value,
    -- but it may not write.
    IF p_owner IS NOT NULL
       AND (v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch) THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;

    IF p_kind = 'failed' THEN
        v_step := keiro_journal_repeatable_name(p_name, p_id, v_generation, p_kind, p_step);
    END IF;
    INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
    VALUES (p_name, p_id, v_generation, v_step, p_kind, p_payload);

    IF NOT v_is_marker THEN
        -- Not reached by a well-formed call (a step that passes the checks above takes the
        -- fast path); kept so this path alone still implements every rule.
        UPDATE workflows w SET
            status = 'running',
            lease_expires_at = CASE
                WHEN p_owner IS NOT NULL AND p_renew_ms IS NOT NULL
                    THEN now() + p_renew_ms * interval '1 millisecond'
                ELSE w.lease_expires_at
            END,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        IF v_row.status = 'suspended' THEN
            PERFORM keiro_notify_wake(p_name, p_id);
        END IF;
    ELSIF p_kind = 'completed' THEN
        UPDATE workflows w SET
            status = 'completed', output = p_payload, completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL,
            attempts = 0, last_error = NULL, next_attempt_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id
        RETURNING w.* INTO v_row;
        PERFORM keiro_child_deliver(v_row);
    ELSIF p_kind = 'failed' THEN
        UPDATE workflows w SET
            status = 'failed', last_error = p_payload #>> '{}', completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id
        RETURNING w.* INTO v_row;
        PERFORM keiro_child_deliver(v_row);
    ELSIF p_kind = 'cancelled' THEN
        UPDATE workflows w SET
            status = 'cancelled', completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id
        RETURNING w.* INTO v_row;
        -- Nothing will ever await them: a cancelled row is never resumed.
        PERFORM keiro_remote_tasks_cancel(p_name, p_id, v_generation);
        PERFORM keiro_child_deliver(v_row);
    ELSE -- continued: the next generation starts runnable, with its own input. The run goes
         -- on, so a parent hears nothing.
        UPDATE workflows w SET
            generation = (p_payload ->> 'next_generation')::integer,
            input = coalesce(p_payload -> 'input', 'null'::jsonb),
            status = 'running', output = NULL,
            lease_owner = NULL, lease_expires_at = NULL,
            attempts = 0, last_error = NULL, next_attempt_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        -- The generation left behind is never driven again, so nothing awaits its tasks.
        PERFORM keiro_remote_tasks_cancel(p_name, p_id, v_generation);
        PERFORM keiro_notify_wake(p_name, p_id);
    END IF;
    outcome := 'appended';
    appended_generation := v_generation;
END;
$$;

-- task_heartbeat: extends the claim `p_claim` of a running task to now + `p_ttl_ms`. Outcomes:
-- extended; cancelled (the task was cancelled, whatever the claim: the cancellation dropped
-- it); lost (another claim, no claim, settled, or no such task).
CREATE FUNCTION keiro_remote_task_heartbeat(p_step_id text, p_claim uuid, p_ttl_ms bigint,
                                            OUT outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    -- One row by primary key; `claim_expires_at` is in remote_tasks_running_idx, so this is
    -- not a HOT update, which a heartbeat every few seconds per running task can afford.
    UPDATE remote_tasks t SET
        claim_expires_at = now() + p_ttl_ms * interval '1 millisecond', updated_at = now()
    WHERE t.step_id = p_step_id AND t.status = 'running' AND t.claim = p_claim;
    IF FOUND THEN
        outcome := 'extended';
        RETURN;
    END IF;
    -- A statement of its own, so a cancellation the UPDATE waited for is seen.
    SELECT t.status INTO v_status FROM remote_tasks t WHERE t.step_id = p_step_id;
    outcome := CASE WHEN v_status = 'cancelled' THEN 'cancelled' ELSE 'lost' END;
END;
$$;

-- instance_cancel: 0002's, with the live remote tasks of the tree locked before the tree, in
-- the lock order (see the header). The cancellations themselves cancel the tasks.
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

-- task_complete: 0005's, except that a cancelled task refuses the report (outcome
-- `cancelled`, nothing journaled).
CREATE OR REPLACE FUNCTION keiro_remote_task_complete(p_step_id text, p_output jsonb,
                                                      OUT outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task remote_tasks%ROWTYPE;
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_task.status = 'cancelled' THEN
        outcome := 'cancelled';
        RETURN;
    END IF;
    IF v_task.status IN ('completed', 'failed') THEN
        outcome := 'already_settled';
        RETURN;
    END IF;
    UPDATE remote_tasks t SET
        status = 'completed', output = p_output, settled_at = now(),
        claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
    WHERE t.step_id = p_step_id
    RETURNING t.* INTO v_task;
    SELECT d.outcome INTO outcome
    FROM keiro_remote_deliver(v_task, jsonb_build_object('ok', p_output)) d;
END;
$$;

-- tasks_complete: 0007's, except that a report of a cancelled task is refused (outcome
-- `cancelled`, nothing journaled): the batch's UPDATE settles only pending and claimed tasks.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_complete(p_step_ids text[], p_outputs jsonb[])
RETURNS TABLE (step_id text, outcome text)
-- Generic plans, index-driven: see 0005 and 0007. A `CREATE OR REPLACE` replaces the settings
-- with whatever it states, so they are stated again.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task     remote_tasks%ROWTYPE;
    v_settled  text[] := '{}';
    v_outcomes text[] := '{}';
    v_report   record;
    v_at       integer;
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Task rows first, in step id order: two batches take their locks in the same order.
    PERFORM 1 FROM remote_tasks t WHERE t.step_id = ANY (p_step_ids)
    ORDER BY t.step_id FOR UPDATE;
    -- Every unsettled task of the batch settles with its first report's output (the first
    -- result wins), then each result is journaled in the order of its owner's key.
    FOR v_task IN
        WITH first_report AS (
            SELECT DISTINCT ON (r.step_id) r.step_id, r.output
            FROM unnest(p_step_ids, p_outputs) WITH ORDINALITY AS r (step_id, output, n)
            ORDER BY r.step_id, r.n
        ), settled AS (
            UPDATE remote_tasks t SET
                status = 'completed', output = f.output, settled_at = now(),
                claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
            FROM first_report f
            WHERE t.step_id = f.step_id AND t.status IN ('pending', 'running')
            RETURNING t.*
        )
        SELECT * FROM settled s ORDER BY s.workflow_name, s.workflow_id, s.step_id
    LOOP
        v_settled := array_append(v_settled, v_task.step_id);
        v_outcomes := array_append(v_outcomes,
            (SELECT d.outcome
             FROM keiro_remote_deliver(v_task, jsonb_build_object('ok', v_task.output)) d));
    END LOOP;
    -- One outcome per report, in the caller's order; a repeated step id's later reports find
    -- it settled.
    FOR v_report IN
        SELECT r.step_id, r.n FROM unnest(p_step_ids) WITH ORDINALITY AS r (step_id, n)
        ORDER BY r.n
    LOOP
        step_id := v_report.step_id;
        v_at := array_position(v_settled, v_report.step_id);
        IF v_at IS NOT NULL THEN
            outcome := v_outcomes[v_at];
            v_settled[v_at] := NULL;
        ELSE
            SELECT CASE WHEN t.status = 'cancelled' THEN 'cancelled' ELSE 'already_settled' END
            INTO outcome
            FROM remote_tasks t WHERE t.step_id = v_report.step_id;
            IF NOT FOUND THEN
                outcome := 'not_found';
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- task_fail: 0005's, except that a cancelled task refuses the report, whatever its claim
-- (outcome `cancelled`, nothing journaled, no retry).
CREATE OR REPLACE FUNCTION keiro_remote_task_fail(p_step_id text, p_claim uuid, p_message text,
                                                  p_code text, p_retryable boolean,
                                                  p_retry_delay_ms bigint,
                                                  OUT outcome text, OUT retry_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task  remote_tasks%ROWTYPE;
    v_error jsonb := jsonb_build_object('message', p_message, 'code', p_code,
                                        'retryable', p_retryable);
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    -- Before the claim check: the cancellation dropped every claim.
    IF v_task.status = 'cancelled' THEN
        outcome := 'cancelled';
        RETURN;
    END IF;
    IF v_task.status IN ('completed', 'failed') THEN
        outcome := 'already_settled';
        RETURN;
    END IF;
    IF v_task.status <> 'running' OR v_task.claim IS DISTINCT FROM p_claim THEN
        outcome := 'stale';
        RETURN;
    END IF;
    IF p_retryable AND v_task.attempts + 1 < v_task.max_attempts THEN
        UPDATE remote_tasks t SET
            status = 'pending', attempts = t.attempts + 1, last_error = v_error,
            claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
            available_at = now() + p_retry_delay_ms * interval '1 millisecond',
            deadline_at = now() + p_retry_delay_ms * interval '1 millisecond'
                          + t.redispatch_after_ms * interval '1 millisecond',
            updated_at = now()
        WHERE t.step_id = p_step_id
        RETURNING t.available_at INTO retry_at;
        outcome := 'retrying';
        RETURN;
    END IF;
    UPDATE remote_tasks t SET
        status = 'failed', attempts = t.attempts + 1, last_error = v_error, settled_at = now(),
        claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
    WHERE t.step_id = p_step_id
    RETURNING t.* INTO v_task;
    SELECT d.outcome INTO outcome
    FROM keiro_remote_deliver(
        v_task,
        keiro_remote_error_envelope(v_task)) d;
END;
$$;

-- remote_arm: 0008's, except that the owner's row is read FOR KEY SHARE (see the header) and a
-- cancelled task is left as it is.
CREATE OR REPLACE FUNCTION keiro_remote_arm(p_step_id text, p_name text, p_id text,
                                            p_generation integer, p_step text,
                                            p_journal_step text, p_group text, p_input jsonb,
                                            p_priority integer, p_traceparent text,
                                            p_max_attempts integer,
                                            p_backoff_initial_ms bigint, p_backoff_max_ms bigint,
                                            p_backoff_jitter boolean,
                                            p_redispatch_after_ms bigint,
                                            p_redispatch_max integer, p_owner text,
                                            p_epoch bigint,
                                            OUT outcome text, OUT deadline timestamptz,
                                            OUT settled jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task     remote_tasks%ROWTYPE;
    v_exists   boolean;
    v_row      workflows%ROWTYPE;
    v_error    jsonb;
    v_outcome  text;
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
    v_exists := FOUND;
    -- Locked, not only read: a cancellation or a continue-as-new that commits meanwhile would
    -- not see the task this arm is about to write, and leave it pending (see the header).
    SELECT * INTO v_row FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR KEY SHARE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF p_owner IS NOT NULL
       AND (v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch) THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    -- The park that follows sees the terminal row, or the run's generation is gone.
    IF v_row.status IN ('completed', 'failed', 'cancelled') OR p_generation <> v_row.generation
    THEN
        outcome := 'waiting';
        RETURN;
    END IF;

    IF NOT v_exists THEN
        INSERT INTO remote_tasks AS t (step_id, workflow_name, workflow_id, generation, step,
                                       journal_step, grp, input, priority, traceparent,
                                       max_attempts, backoff_initial_ms, backoff_max_ms,
                                       backoff_jitter, redispatch_after_ms, redispatch_max,
                                       deadline_at)
        VALUES (p_step_id, p_name, p_id, p_generation, p_step, p_journal_step, p_group,
                p_input, p_priority, p_traceparent, greatest(p_max_attempts, 1),
                p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
                p_redispatch_after_ms, greatest(p_redispatch_max, 1),
                now() + p_redispatch_after_ms * interval '1 millisecond')
        ON CONFLICT (step_id) DO NOTHING
        RETURNING t.deadline_at INTO deadline;
        IF FOUND THEN
            PERFORM keiro_notify_remote();
            outcome := 'dispatched';
            RETURN;
        END IF;
        -- A concurrent arm inserted it (the conflict waited for its commit); a separate
        -- statement takes a fresh snapshot that sees it. The first arm wins.
        SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
        IF NOT FOUND THEN
            -- Only if the owner was deleted in between.
            outcome := 'waiting';
            RETURN;
        END IF;
    END IF;

    IF v_task.status = 'cancelled' THEN
        -- Only a cancelled owner or a generation left behind cancels a task, and both were
        -- answered above; no result will ever come, and it is never dispatched again.
        outcome := 'waiting';
        RETURN;
    END IF;

    IF v_task.status IN ('completed', 'failed') THEN
        -- Served by the journal's unique index.
        SELECT j.payload INTO settled FROM journal j
        WHERE j.workflow_name = v_task.workflow_name AND j.workflow_id = v_task.workflow_id
          AND j.generation = v_task.generation AND j.step_name = v_task.journal_step;
        IF FOUND THEN
            outcome := 'settled';
            RETURN;
        END IF;
        -- Settled while its owner was failed (a sibling step failed the run; an operator has
        -- requeued it since): the result waited in the task and is journaled now.
        SELECT d.outcome, d.recorded INTO v_outcome, settled
        FROM keiro_remote_deliver(
            v_task,
            CASE WHEN v_task.status = 'completed'
                THEN jsonb_build_object('ok', coalesce(v_task.output, 'null'::jsonb))
                ELSE keiro_remote_error_envelope(v_task)
            END) d;
        outcome := CASE WHEN v_outcome = 'delivered' THEN 'settled' ELSE 'waiting' END;
        RETURN;
    END IF;

    IF v_task.deadline_at IS NOT NULL AND v_task.deadline_at <= now() THEN
        IF v_task.status = 'running' AND v_task.claim_expires_at <= now() THEN
            -- The redispatch below would drop this claim unseen by any sweep.
            SELECT x.outcome, x.recorded INTO v_outcome, settled
            FROM keiro_remote_claims_expire(ARRAY[p_step_id]) x;
            IF v_outcome = 'delivered' THEN
                outcome := 'settled';
                RETURN;
            ELSIF v_outcome = 'owner_gone' THEN
                -- It closed or moved on since it was read; the park sees that.
                outcome := 'waiting';
                RETURN;
            END IF;
        END IF;
        IF v_task.dispatches < v_task.redispatch_max THEN
            UPDATE remote_tasks t SET
                status = 'pending', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
                available_at = now(), dispatches = t.dispatches + 1,
                deadline_at = now() + t.redispatch_after_ms * interval '1 millisecond',
                updated_at = now()
            WHERE t.step_id = p_step_id
            RETURNING t.deadline_at INTO deadline;
            PERFORM keiro_notify_remote();
            outcome := 'redispatched';
            RETURN;
        END IF;
        v_error := jsonb_build_object(
            'message', format('no result after %s dispatch(es)', v_task.dispatches),
            'code', 'remote_step_lost',
            'retryable', true);
        UPDATE remote_tasks t SET
            status = 'failed', settled_at = now(),
            claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
            last_error = v_error, updated_at = now()
        WHERE t.step_id = p_step_id
        RETURNING t.* INTO v_task;
        SELECT d.outcome, d.recorded INTO v_outcome, settled
        FROM keiro_remote_deliver(
            v_task,
            keiro_remote_error_envelope(v_task)) d;
        -- owner_gone: it closed or moved on since it was read; the park sees that.
        outcome := CASE WHEN v_outcome = 'delivered' THEN 'lost' ELSE 'waiting' END;
        RETURN;
    END IF;

    outcome := 'waiting';
    deadline := v_task.deadline_at;
END;
$$;

-- Every function this file created or replaced runs with keiro's schema and pg_temp as its
-- search_path, as 0009 set for all of them.
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOREACH v_function IN ARRAY ARRAY[
        'keiro_remote_tasks_cancel(text, text, integer)',
        'keiro_journal_append_to(text, text, integer, text, text, jsonb, text, bigint, bigint)',
        'keiro_remote_task_heartbeat(text, uuid, bigint)',
        'keiro_instance_cancel(text, text, boolean)',
        'keiro_remote_task_complete(text, jsonb)',
        'keiro_remote_tasks_complete(text[], jsonb[])',
        'keiro_remote_task_fail(text, uuid, text, text, boolean, bigint)',
        'keiro_remote_arm(text, text, text, integer, text, text, text, jsonb, integer, text, integer, bigint, bigint, boolean, bigint, integer, text, bigint)'
    ]::regprocedure[]
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = %I, pg_temp',
                                  v_function, pg_catalog.current_schema());
    END LOOP;
END;
$$;
