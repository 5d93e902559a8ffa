-- keiro 0008: an expired claim counts as a failed attempt; at the task's attempt limit the step
-- fails with code `remote_step_crashed`.
--
-- Until now a claim that expired only returned its task to `pending`, so a handler that kills
-- its process (an out-of-memory kill, an abort, a segfault in native code) was claimed, run and
-- lost again forever: nothing ever reported a failure to count. A claim expires only when its
-- holder stopped heartbeating without reporting, which is what a dead process looks like from
-- here, so its expiry is now the failed attempt nobody reported.
--
-- The limit is the task's `max_attempts` (`retries + 1`), the budget a retryable failure uses:
-- reported failures and expired claims draw from the same count, so a step runs at most
-- `retries + 1` times however its attempts end. With the default of no retries, the first
-- expired claim fails the step; a handler that may outlive its claim (a long pause without
-- heartbeats) should be given retries. The step's final error is
-- `{message, code: "remote_step_crashed", retryable: true, attempts}` (retryable: an operator's
-- requeue may run it again), journaled into the owner exactly as a loss is (`keiro_remote_deliver`,
-- which flips a parked owner and notifies it, in the claimer's transaction). A task with
-- attempts left is claimable again at once, as before: the claim's time to live already held it
-- back.
--
-- Where an expired claim is found, and counted:
-- * the sweep at the start of every `keiro_remote_tasks_claim`, for the claimer's groups;
-- * `keiro_remote_arm`, when a re-arm finds the redispatch deadline passed and the task still
--   claimed by an expired claim (no claimer swept it in between): the redispatch drops that
--   claim, so it counts the attempt first, and at the limit fails the step instead.
-- The operator's `keiro_remote_redispatch_pending` drops claims without counting them: it is a
-- decision to run the step again, not evidence of a crash.
--
-- Lock order: 0005's. The sweep locks the expired task rows (SKIP LOCKED), then journals the
-- failed ones into their owners in owner key order, the order a batched report uses.

-- Counts the expired claims of the given tasks, which the caller has locked, as failed
-- attempts: each becomes `pending` again with attempts left, or `failed` at its limit with its
-- error envelope journaled into its owner (in owner key order). A task whose claim is no longer
-- expired (a heartbeat got in first) or that holds none is left alone. One row per task
-- counted: outcome `pending`, or the delivery's `delivered` (recorded = the journaled
-- envelope) or `owner_gone`.
CREATE FUNCTION keiro_remote_claims_expire(p_step_ids text[])
RETURNS TABLE (step_id text, outcome text, recorded jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task remote_tasks%ROWTYPE;
BEGIN
    FOR v_task IN
        WITH counted AS (
            UPDATE remote_tasks t SET
                status = CASE WHEN t.attempts + 1 >= t.max_attempts THEN 'failed'
                              ELSE 'pending' END,
                attempts = t.attempts + 1,
                last_error = jsonb_build_object(
                    'message', format('the claim of %s expired without a report (attempt %s of %s)',
                                      t.claimed_by, t.attempts + 1, t.max_attempts),
                    'code', 'remote_step_crashed',
                    'retryable', true),
                settled_at = CASE WHEN t.attempts + 1 >= t.max_attempts THEN now() END,
                claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = now()
            WHERE t.step_id = ANY (p_step_ids)
              AND t.status = 'running' AND t.claim_expires_at <= now()
            RETURNING t.*
        )
        SELECT * FROM counted c ORDER BY c.workflow_name, c.workflow_id, c.step_id
    LOOP
        step_id := v_task.step_id;
        IF v_task.status = 'failed' THEN
            SELECT d.outcome, d.recorded INTO outcome, recorded
            FROM keiro_remote_deliver(v_task, keiro_remote_error_envelope(v_task)) d;
        ELSE
            outcome := 'pending';
            recorded := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- tasks_claim: 0005's, with the expired claims counted (see the header) instead of only
-- returned to `pending`. Keeps 0005's and 0007's plan settings: a `CREATE OR REPLACE` replaces
-- them with whatever it states.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_claim(p_groups text[], p_worker text,
                                                    p_limit integer, p_ttl_ms bigint)
RETURNS SETOF remote_tasks
-- Index-driven generic plans: see 0005 (sequential scans cached while the table was small)
-- and 0007 (custom plans made again on every call for statements over arrays).
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_expired text[];
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Served by remote_tasks_running_idx; empty in the steady state.
    SELECT array_agg(e.step_id) INTO v_expired
    FROM (
        SELECT x.step_id FROM remote_tasks x
        WHERE x.status = 'running' AND x.claim_expires_at <= now() AND x.grp = ANY (p_groups)
        FOR UPDATE SKIP LOCKED
    ) e;
    IF v_expired IS NOT NULL THEN
        PERFORM 1 FROM keiro_remote_claims_expire(v_expired);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- As in 0005: per group, the first `p_limit` claimable rows in claim order, locked as
        -- the ordered scan of remote_tasks_pending_idx meets them, then the first `p_limit` of
        -- them all.
        SELECT c.step_id, c.priority, c.available_at, c.created_at
        FROM (SELECT DISTINCT u.grp FROM unnest(p_groups) AS u(grp)) wanted
        CROSS JOIN LATERAL (
            SELECT t.step_id, t.priority, t.available_at, t.created_at
            FROM remote_tasks t
            WHERE t.grp = wanted.grp AND t.status = 'pending' AND t.available_at <= now()
            ORDER BY t.priority DESC, t.available_at, t.created_at
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        ) c
        ORDER BY c.priority DESC, c.available_at, c.created_at
        LIMIT greatest(p_limit, 0)
    ), claimed AS (
        UPDATE remote_tasks t SET
            status = 'running', claim = gen_random_uuid(), claimed_by = p_worker,
            claim_expires_at = now() + p_ttl_ms * interval '1 millisecond',
            updated_at = now()
        FROM picked p
        WHERE t.step_id = p.step_id
        RETURNING t.*
    )
    SELECT * FROM claimed c ORDER BY c.priority DESC, c.available_at, c.created_at;
END;
$$;

-- remote_arm: 0005's, except that a passed deadline first counts an expired claim the task
-- still holds (see the header): at the task's limit the step fails as crashed (outcome
-- settled, or waiting when the owner moved on), otherwise the task is redispatched or lost as
-- before.
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
    SELECT * INTO v_row FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
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
