-- Remote steps (the `remote_tasks` table): arming, the worker-facing claim, heartbeat and
-- reports, expired claims, cancellation, the operator's redispatch, and the park that goes
-- with a run's dispatches (one run, or a batch of runs).
--
-- A report settles the task and journals its result into the owner through
-- `keiro_journal_append_to`, so the result and the owner's `suspended` -> `running` flip commit
-- together. Retries with backoff happen in the task row without touching the owner: only the
-- final result is journaled, as `{"ok": value}` or `{"error": {message, code, retryable,
-- attempts}}`. A task that became claimable notifies with the payload `remote`.
--
-- Commit durability: the arm, the claim, the reports and the parks with dispatches commit
-- with `synchronous_commit = off`; why no acknowledged state is lost is in the header of
-- migrations/0005_remote_steps.sql (the bodies' "0005's header"). Plans: the hot functions
-- rule sequential scans out (plans cached while the tables were empty) and force generic
-- plans (statements over arrays would be planned again on every call).

-- The envelope a failed task's result is journaled as: its last error with its attempts.
-- Called by: SQL only (keiro_remote_deliver); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_error_envelope(p_task remote_tasks) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('error', coalesce(p_task.last_error, '{}'::jsonb)
                                       || jsonb_build_object('attempts', p_task.attempts));
$$;

-- Journals a settled task's result envelope into its owner's generation under the task's
-- journal step (external, through the append rules) and says what became of it: delivered
-- (appended, or the same step was already recorded) or owner_gone (terminal, another
-- generation, deleted). The caller holds the task row's lock; this takes the owner's.
-- Called by: SQL only (the reports, expired claims); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_deliver(p_task remote_tasks, p_envelope jsonb,
                                                OUT outcome text, OUT recorded jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_outcome text;
BEGIN
    SELECT a.outcome, a.recorded INTO v_outcome, recorded
    FROM keiro_journal_append_to(p_task.workflow_name, p_task.workflow_id, p_task.generation,
                                 p_task.journal_step, 'remote', p_envelope,
                                 NULL, NULL, NULL) a;
    IF v_outcome = 'appended' THEN
        outcome := 'delivered';
        recorded := p_envelope;
    ELSIF v_outcome = 'already_present' THEN
        outcome := 'delivered';
    ELSE
        outcome := 'owner_gone';
        recorded := NULL;
    END IF;
END;
$$;

-- remote_task_arm: writes the task of a remote step once, or learns its state: its result, its
-- redispatch (or loss) when its deadline passed, or that it still waits. A task on a queue
-- (`p_queue`, with its key `p_key`) records them; an undeclared queue writes nothing
-- (outcome unknown_queue), whatever the task's state. The task row is
-- locked first. The owner's row is read FOR KEY SHARE, the weakest lock that conflicts with
-- the FOR UPDATE every append takes on it (a cancel marker's included; a claim's UPDATE does
-- not wait for it), so either the arm waits and then sees the row cancelled (nothing
-- written), or the cancellation waits for the arm's commit and then cancels the task it
-- wrote; it is locked FOR UPDATE only by the append that journals a lost task. A passed
-- deadline first counts an expired claim the task still holds (as the claimers' sweep does,
-- `keiro_remote_claims_expire`): at the task's limit the step fails as crashed (outcome
-- settled, or waiting when the owner moved on), otherwise the task is redispatched or lost.
-- A cancelled task is left as it is. Outcomes: dispatched (deadline), waiting (deadline),
-- redispatched (deadline), settled (settled = the journaled envelope), lost (settled),
-- not_found, lease_lost, unknown_queue.
-- Called by: keiro_postgres ops::remote::remote_arm; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_task_arm(p_step_id text, p_name text, p_id text,
                                                 p_generation integer, p_step text,
                                                 p_journal_step text, p_group text,
                                                 p_input jsonb, p_priority integer,
                                                 p_traceparent text, p_max_attempts integer,
                                                 p_backoff_initial_ms bigint,
                                                 p_backoff_max_ms bigint,
                                                 p_backoff_jitter boolean,
                                                 p_redispatch_after_ms bigint,
                                                 p_redispatch_max integer, p_owner text,
                                                 p_epoch bigint, p_queue text, p_key text,
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
    -- Queues are never deleted, so one declared now stays declared.
    IF p_queue IS NOT NULL AND NOT EXISTS (SELECT 1 FROM keiro_queues q WHERE q.name = p_queue)
    THEN
        outcome := 'unknown_queue';
        RETURN;
    END IF;
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
                                       deadline_at, queue, queue_key)
        VALUES (p_step_id, p_name, p_id, p_generation, p_step, p_journal_step, p_group,
                p_input, p_priority, p_traceparent, greatest(p_max_attempts, 1),
                p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
                p_redispatch_after_ms, greatest(p_redispatch_max, 1),
                now() + p_redispatch_after_ms * interval '1 millisecond', p_queue, p_key)
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

-- remote_arm: `keiro_remote_task_arm` on no queue, as the previous build (revision 13) calls
-- it while a deploy rolls; to be dropped by a later migration.
-- Called by: the previous build's keiro_postgres ops::remote::remote_arm; tested by contract::remote.
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
BEGIN
    SELECT a.outcome, a.deadline, a.settled INTO outcome, deadline, settled
    FROM keiro_remote_task_arm(p_step_id, p_name, p_id, p_generation, p_step, p_journal_step,
                               p_group, p_input, p_priority, p_traceparent, p_max_attempts,
                               p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
                               p_redispatch_after_ms, p_redispatch_max, p_owner, p_epoch,
                               NULL, NULL) a;
END;
$$;

-- tasks_claim: counts the groups' expired claims as failed attempts
-- (`keiro_remote_claims_expire`), then claims up to `p_limit` available pending tasks of the
-- groups, each with a new claim id: first the tasks on a queue that the queues' limits admit
-- (`keiro_remote_tasks_claim_queued`), then, with what is left of the limit, the tasks on no
-- queue, highest priority first, then oldest. Every statement skips rows another transaction
-- holds (SKIP LOCKED) and re-checks its conditions on the rows it locks, so concurrent claimers
-- never take the same task and never wait for each other (but for a limited queue's row, which
-- serializes the claims and admissions of that queue). Returns the claimed rows: the queued
-- ones, then the others, each part in claim order.
-- Called by: keiro_postgres ops::remote::tasks_claim; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_claim(p_groups text[], p_worker text,
                                                    p_limit integer, p_ttl_ms bigint)
RETURNS SETOF remote_tasks
-- Index-driven generic plans: see the header of this file.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_expired text[];
    v_queued  integer;
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

    RETURN QUERY SELECT * FROM keiro_remote_tasks_claim_queued(p_groups, p_worker, p_limit,
                                                                p_ttl_ms);
    GET DIAGNOSTICS v_queued = ROW_COUNT;

    RETURN QUERY
    WITH picked AS (
        -- As in 0005: per group, the first `p_limit` claimable rows in claim order, locked as
        -- the ordered scan of remote_tasks_pending_idx (tasks on no queue, 0022) meets them,
        -- then the first `p_limit` of them all.
        SELECT c.step_id, c.priority, c.available_at, c.created_at
        FROM (SELECT DISTINCT u.grp FROM unnest(p_groups) AS u(grp)) wanted
        CROSS JOIN LATERAL (
            SELECT t.step_id, t.priority, t.available_at, t.created_at
            FROM remote_tasks t
            WHERE t.grp = wanted.grp AND t.status = 'pending' AND t.queue IS NULL
              AND t.available_at <= now()
            ORDER BY t.priority DESC, t.available_at, t.created_at
            LIMIT greatest(p_limit - v_queued, 0)
            FOR UPDATE SKIP LOCKED
        ) c
        ORDER BY c.priority DESC, c.available_at, c.created_at
        LIMIT greatest(p_limit - v_queued, 0)
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

-- tasks_claim_queued: `keiro_remote_tasks_claim`'s part for tasks on a queue: claims up to
-- `p_limit` available pending tasks of the groups `p_groups` for `p_worker` until now +
-- `p_ttl_ms`, admitted within their queues' limits as `keiro_queue_admit` admits runs, in the
-- transaction that claims them, so no limit is exceeded by any number of remote workers (nor
-- by them and the workflow workers of a queue that runs and steps share). Queues with tasks of
-- the groups waiting are served in name order, paused ones skipped. For each queue:
--
-- 1. A limited queue (any limit, or weighted fairness) is locked `FOR UPDATE`, as admission
--    locks it: the claims and admissions of one queue are serialized, and each counts what the
--    previous ones committed.
-- 2. The room: the remaining limit, less the slots held (`keiro_queue_held`: admitted runs and
--    claimed tasks, fleet-wide, and this worker's), less the first admissions and first claims
--    inside the rate window (`keiro_queue_admitted_since`).
-- 3. With no per-key limit and no fairness: per group, the first tasks in claim order
--    (priority, then available, then oldest) up to the room, then the first of them all.
--    Otherwise per key: each key with tasks waiting (a skip scan of the per-key index) gets up
--    to its own room (key concurrency and key rate), and the picks are ordered by priority,
--    then, under weighted fairness, by each pick's virtual finish time (the key's pass, shared
--    with the queue's runs, or the queue's virtual time if later, plus n / weight for its n-th
--    pick), then by claim order.
-- 4. The picks are claimed, the first claim's time kept for the rate windows; under fairness
--    the keys' passes and the queue's virtual time move on.
--
-- A task gives its slot back when it leaves `running` (completed, failed, retried, cancelled,
-- redispatched, its expired claim counted) or its claim expires.
-- Called by: SQL only (keiro_remote_tasks_claim); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_claim_queued(p_groups text[], p_worker text,
                                                           p_limit integer, p_ttl_ms bigint)
RETURNS SETOF remote_tasks
-- Index-driven generic plans: see the header of this file.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := now();
    v_left    integer := greatest(p_limit, 0);
    v_groups  text[] := ARRAY(SELECT DISTINCT u.grp FROM unnest(p_groups) AS u (grp));
    v_name    text;
    q         keiro_queues%ROWTYPE;
    v_room    integer;
    v_keys    text[];
    v_rooms   integer[];
    v_passes  double precision[];
    v_weights integer[];
    v_batch   remote_tasks[];
    v_start   double precision;
BEGIN
    -- Served by keiro_queues' primary key and remote_tasks_queue_waiting_idx: one probe per
    -- declared queue, and nothing when no queue is declared.
    FOR v_name IN SELECT k.name FROM keiro_queues k
                  WHERE NOT k.paused
                    AND EXISTS (SELECT 1 FROM remote_tasks t
                                WHERE t.queue = k.name AND t.grp = ANY (v_groups)
                                  AND t.status = 'pending' AND t.available_at <= v_now)
                  ORDER BY k.name LOOP
        EXIT WHEN v_left <= 0;
        SELECT * INTO q FROM keiro_queues k WHERE k.name = v_name;
        IF q.concurrency IS NOT NULL OR q.worker_concurrency IS NOT NULL
           OR q.key_concurrency IS NOT NULL OR q.rate_limit IS NOT NULL
           OR q.key_rate_limit IS NOT NULL OR q.fairness = 'weighted' THEN
            SELECT * INTO q FROM keiro_queues k WHERE k.name = v_name FOR UPDATE;
            CONTINUE WHEN q.paused;
        END IF;

        v_room := v_left;
        IF q.concurrency IS NOT NULL THEN
            v_room := least(v_room,
                            q.concurrency - keiro_queue_held(v_name, v_now, NULL, false, NULL));
        END IF;
        IF q.worker_concurrency IS NOT NULL THEN
            v_room := least(v_room, q.worker_concurrency
                                    - keiro_queue_held(v_name, v_now, p_worker, false, NULL));
        END IF;
        IF q.rate_limit IS NOT NULL THEN
            v_room := least(v_room, q.rate_limit - keiro_queue_admitted_since(
                v_name, v_now - q.rate_period_ms * interval '1 millisecond', false, NULL));
        END IF;
        CONTINUE WHEN v_room <= 0;

        IF q.key_concurrency IS NULL AND q.key_rate_limit IS NULL AND q.fairness <> 'weighted'
        THEN
            WITH picked AS (
                SELECT c.step_id
                FROM unnest(v_groups) AS g (grp)
                CROSS JOIN LATERAL (
                    SELECT t.step_id, t.priority, t.available_at, t.created_at
                    FROM remote_tasks t
                    WHERE t.queue = v_name AND t.grp = g.grp AND t.status = 'pending'
                      AND t.available_at <= v_now
                    ORDER BY t.priority DESC, t.available_at, t.created_at
                    LIMIT v_room
                    FOR UPDATE SKIP LOCKED
                ) c
                ORDER BY c.priority DESC, c.available_at, c.created_at, c.step_id
                LIMIT v_room
            ), claimed AS (
                UPDATE remote_tasks t SET
                    status = 'running', claim = gen_random_uuid(), claimed_by = p_worker,
                    claim_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                    queue_admitted_at = coalesce(t.queue_admitted_at, v_now),
                    updated_at = now()
                FROM picked p
                WHERE t.step_id = p.step_id
                RETURNING t.*
            )
            SELECT coalesce(array_agg(ROW(c.*)::remote_tasks
                                      ORDER BY c.priority DESC, c.available_at, c.created_at),
                            '{}')
            INTO v_batch
            FROM claimed c;
        ELSE
            -- Every key with tasks waiting (a NULL key is one key of its own), by a skip scan.
            WITH RECURSIVE keys (key) AS (
                (SELECT t.queue_key FROM remote_tasks t
                 WHERE t.queue = v_name AND t.status = 'pending' AND t.queue_key IS NOT NULL
                 ORDER BY t.queue_key LIMIT 1)
                UNION ALL
                SELECT (SELECT t.queue_key FROM remote_tasks t
                        WHERE t.queue = v_name AND t.status = 'pending' AND t.queue_key > k.key
                        ORDER BY t.queue_key LIMIT 1)
                FROM keys k WHERE k.key IS NOT NULL
            ), waiting AS (
                SELECT k.key FROM keys k WHERE k.key IS NOT NULL
                UNION ALL
                SELECT NULL WHERE EXISTS (
                    SELECT 1 FROM remote_tasks t
                    WHERE t.queue = v_name AND t.status = 'pending' AND t.queue_key IS NULL)
            ), rooms AS (
                SELECT k.key,
                       least(v_room,
                             CASE WHEN q.key_concurrency IS NULL THEN v_room ELSE
                                 q.key_concurrency
                                 - keiro_queue_held(v_name, v_now, NULL, true, k.key)
                             END,
                             CASE WHEN q.key_rate_limit IS NULL THEN v_room ELSE
                                 q.key_rate_limit - keiro_queue_admitted_since(
                                     v_name,
                                     v_now - q.key_rate_period_ms * interval '1 millisecond',
                                     true, k.key)
                             END) AS room,
                       greatest(coalesce(qk.pass, 0), q.vtime) AS pass,
                       coalesce(qk.weight, 1) AS weight
                FROM waiting k
                LEFT JOIN keiro_queue_keys qk
                  ON qk.queue = v_name AND qk.key = coalesce(k.key, '')
            )
            SELECT coalesce(array_agg(r.key), '{}'), coalesce(array_agg(r.room), '{}'),
                   coalesce(array_agg(r.pass), '{}'), coalesce(array_agg(r.weight), '{}')
            INTO v_keys, v_rooms, v_passes, v_weights
            FROM rooms r WHERE r.room > 0;

            -- Per key and group the first tasks up to the key's room, locked as the ordered
            -- scan of remote_tasks_queue_key_waiting_idx meets them (a key's two branches keep
            -- the key an index condition), then per key the first `room` of them.
            WITH candidates AS (
                SELECT c.*, k.key, k.room, k.pass, k.weight
                FROM unnest(v_keys, v_rooms, v_passes, v_weights) AS k (key, room, pass, weight)
                CROSS JOIN unnest(v_groups) AS g (grp)
                CROSS JOIN LATERAL (
                    SELECT t.step_id, t.priority, t.available_at, t.created_at
                    FROM remote_tasks t
                    WHERE t.queue = v_name AND k.key IS NOT NULL AND t.queue_key = k.key
                      AND t.grp = g.grp AND t.status = 'pending' AND t.available_at <= v_now
                    ORDER BY t.priority DESC, t.available_at, t.created_at
                    LIMIT k.room
                    FOR UPDATE OF t SKIP LOCKED
                ) c
                UNION ALL
                SELECT c.*, k.key, k.room, k.pass, k.weight
                FROM unnest(v_keys, v_rooms, v_passes, v_weights) AS k (key, room, pass, weight)
                CROSS JOIN unnest(v_groups) AS g (grp)
                CROSS JOIN LATERAL (
                    SELECT t.step_id, t.priority, t.available_at, t.created_at
                    FROM remote_tasks t
                    WHERE t.queue = v_name AND k.key IS NULL AND t.queue_key IS NULL
                      AND t.grp = g.grp AND t.status = 'pending' AND t.available_at <= v_now
                    ORDER BY t.priority DESC, t.available_at, t.created_at
                    LIMIT k.room
                    FOR UPDATE OF t SKIP LOCKED
                ) c
            ), ranked AS (
                SELECT c.*,
                       row_number() OVER (
                           PARTITION BY c.key
                           ORDER BY c.priority DESC, c.available_at, c.created_at, c.step_id)
                           AS n
                FROM candidates c
            ), picked AS (
                SELECT r.step_id, r.key, r.weight,
                       r.pass + r.n::double precision / r.weight AS finish
                FROM ranked r
                WHERE r.n <= r.room
                ORDER BY r.priority DESC,
                         CASE WHEN q.fairness = 'weighted'
                             THEN r.pass + r.n::double precision / r.weight ELSE 0 END,
                         r.available_at, r.created_at, r.step_id
                LIMIT v_room
            ), passes AS (
                INSERT INTO keiro_queue_keys AS qk (queue, key, pass)
                SELECT v_name, coalesce(p.key, ''), max(p.finish)
                FROM picked p
                WHERE q.fairness = 'weighted'
                GROUP BY p.key
                ON CONFLICT (queue, key) DO UPDATE SET pass = EXCLUDED.pass
            ), claimed AS (
                UPDATE remote_tasks t SET
                    status = 'running', claim = gen_random_uuid(), claimed_by = p_worker,
                    claim_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                    queue_admitted_at = coalesce(t.queue_admitted_at, v_now),
                    updated_at = now()
                FROM picked p
                WHERE t.step_id = p.step_id
                RETURNING t.*
            )
            SELECT coalesce(array_agg(ROW(c.*)::remote_tasks
                                      ORDER BY c.priority DESC, c.available_at, c.created_at),
                            '{}'),
                   max(p.finish - 1.0::double precision / p.weight)
            INTO v_batch, v_start
            FROM claimed c
            JOIN picked p ON p.step_id = c.step_id;

            IF q.fairness = 'weighted' AND v_start > q.vtime THEN
                -- As in admission: the queue's virtual time is the start of the last pick.
                UPDATE keiro_queues k SET vtime = v_start WHERE k.name = v_name;
            END IF;
        END IF;

        RETURN QUERY SELECT * FROM unnest(v_batch);
        v_left := v_left - cardinality(v_batch);
    END LOOP;
END;
$$;

-- Counts the expired claims of the given tasks, which the caller has locked, as failed
-- attempts: each becomes `pending` again with attempts left, or `failed` at its limit with its
-- error envelope journaled into its owner (in owner key order). A task whose claim is no longer
-- expired (a heartbeat got in first) or that holds none is left alone. One row per task
-- counted: outcome `pending`, or the delivery's `delivered` (recorded = the journaled
-- envelope) or `owner_gone`. An expired claim is what a dead handler process looks like, so
-- it draws from the same `max_attempts` as a reported failure; the final error has the code
-- `remote_step_crashed` (why: migrations/0008_remote_claim_attempts.sql).
-- Called by: SQL only (keiro_remote_tasks_claim); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_claims_expire(p_step_ids text[])
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

-- task_heartbeat: extends the claim `p_claim` of a running task to now + `p_ttl_ms`. Outcomes:
-- extended; cancelled (the task was cancelled, whatever the claim: the cancellation dropped
-- it); lost (another claim, no claim, settled, or no such task).
-- Called by: keiro_postgres ops::remote::task_heartbeat; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_task_heartbeat(p_step_id text, p_claim uuid,
                                                       p_ttl_ms bigint,
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

-- task_complete: settles the task `completed` with the handler's output, whoever reports it
-- (the first result wins), and journals `{"ok": output}` into the owner. A cancelled task
-- refuses the report (nothing journaled). Outcomes: delivered, owner_gone, already_settled,
-- cancelled, not_found.
-- Called by: keiro_postgres ops::remote::task_complete; tested by contract::remote.
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

-- tasks_complete: task_complete for a batch of reports, in one transaction, so a busy worker
-- pays one commit (and one turn at the notification lock) for many results. One UPDATE
-- settles the whole batch (only pending and claimed tasks: a cancelled task refuses its
-- report, nothing journaled), locking the task rows in step id order; then each result is
-- journaled through `keiro_remote_deliver` in the order of its owner's key, so two batches
-- take their locks in the same order. Returns one outcome per step id.
-- Called by: keiro_postgres ops::remote::tasks_complete; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_complete(p_step_ids text[], p_outputs jsonb[])
RETURNS TABLE (step_id text, outcome text)
-- Generic plans, index-driven: see the header of this file.
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

-- task_fail: counts a failed attempt of the current claim. With attempts left and a
-- retryable failure the task is pending again at `now + p_retry_delay_ms`; otherwise it is
-- failed and `{"error": {message, code, retryable, attempts}}` is journaled into the owner.
-- A report of an older claim is ignored; a cancelled task refuses the report, whatever its
-- claim (nothing journaled, no retry). Outcomes: retrying (retry_at), delivered, owner_gone,
-- already_settled, cancelled, stale, not_found.
-- Called by: keiro_postgres ops::remote::task_fail; tested by contract::remote.
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

-- remote_redispatch_pending: dispatches every pending or claimed task of the instance's
-- current generation again (claim dropped, available now, dispatches + 1), whatever its
-- deadline and redispatch_max (an operator's decision). Outcomes: redispatched (count),
-- not_found.
-- Called by: keiro_postgres ops::remote::remote_redispatch_pending; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_redispatch_pending(p_name text, p_id text,
                                                           OUT outcome text,
                                                           OUT redispatched bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
BEGIN
    SELECT w.generation INTO v_generation FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    -- Served by remote_tasks_owner_idx.
    UPDATE remote_tasks t SET
        status = 'pending', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        available_at = now(), dispatches = t.dispatches + 1,
        deadline_at = now() + t.redispatch_after_ms * interval '1 millisecond',
        updated_at = now()
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id AND t.generation = v_generation
      AND t.status IN ('pending', 'running');
    GET DIAGNOSTICS redispatched = ROW_COUNT;
    IF redispatched > 0 THEN
        PERFORM keiro_notify_remote();
    END IF;
    outcome := 'redispatched';
END;
$$;

-- Cancels the pending and claimed tasks of one generation of an instance, whose row the caller
-- has locked: the claim is dropped, `settled_at` set, the output and the last error stay as
-- they were. Settled tasks keep their result. The `cancelled` and `continued` markers call it
-- (`keiro_journal_append_to`): a worker would otherwise still run a task no run will read.
-- Returns how many.
-- Called by: SQL only (the cancelled and continued markers, cancel); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_remote_tasks_cancel(p_name text, p_id text, p_generation integer)
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

-- instance_park_arms: the remote steps a run deferred, armed as by keiro_remote_task_arm (in
-- order, each on its queue `p_queues[i]` with its key `p_queue_keys[i]`), and the run's park,
-- in one transaction, so a run that dispatches and suspends pays
-- one commit for both, and its dispatch is atomic with its suspension. The park wakes by the
-- earliest redispatch deadline an arm returned, if earlier than the run's own. Locks follow
-- the lock order: the existing tasks first, in step id order (as a batched park and a batched
-- report lock theirs), then the arms and the park the instance row. Each arm takes the
-- instance row (KEY SHARE) after its task, so without the tasks locked up front a second arm
-- would wait for its task while holding the instance, which a report holding that task and
-- waiting for the instance deadlocks with. An arm that finds the instance missing or the
-- fence stale ends the call with that outcome before the park (every arm checks the same
-- fence, so that is the first arm unless the lease moved meanwhile). An undeclared queue is
-- found before any arm: nothing is written, the outcome is unknown_queue, and `arm_outcomes`
-- says per arm `unknown_queue` or `not_armed`. Outcomes: the park's (suspended, woken,
-- terminal, not_found, lease_lost), or unknown_queue, with one arm outcome, deadline and
-- settled value per arm. Commits asynchronously, as the arm and the park do on their own (see
-- the header of migrations/0005_remote_steps.sql).
-- Called by: keiro_postgres ops::remote::instance_park_dispatch; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_instance_park_arms(
    p_name text, p_id text, p_generation integer, p_owner text, p_epoch bigint,
    p_awaited text[], p_wake_after timestamptz,
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[], p_queues text[],
    p_queue_keys text[],
    OUT outcome text, OUT row_status text, OUT arm_outcomes text[],
    OUT arm_deadlines timestamptz[], OUT arm_settled jsonb[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM remote_tasks t WHERE t.step_id = ANY (p_step_ids)
    ORDER BY t.step_id FOR UPDATE;
    SELECT d.outcome, d.row_status, d.arm_outcomes, d.arm_deadlines, d.arm_settled
    INTO outcome, row_status, arm_outcomes, arm_deadlines, arm_settled
    FROM keiro_instance_park_arms_locked(
        p_name, p_id, p_generation, p_owner, p_epoch, p_awaited, p_wake_after,
        p_step_ids, p_steps, p_journal_steps, p_groups, p_inputs, p_priorities, p_traceparents,
        p_max_attempts, p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
        p_redispatch_after_ms, p_redispatch_max, p_queues, p_queue_keys) d;
END;
$$;

-- instance_park_arms_locked: `keiro_instance_park_arms` once its caller holds the locks of
-- the existing tasks (the lone park above, or the batched park below).
-- Called by: SQL only (the two park_arms functions); tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_instance_park_arms_locked(
    p_name text, p_id text, p_generation integer, p_owner text, p_epoch bigint,
    p_awaited text[], p_wake_after timestamptz,
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[], p_queues text[],
    p_queue_keys text[],
    OUT outcome text, OUT row_status text, OUT arm_outcomes text[],
    OUT arm_deadlines timestamptz[], OUT arm_settled jsonb[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_arm  record;
    v_wake timestamptz := p_wake_after;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Every queue named must be declared before anything is armed: an arm refused midway
    -- would leave the arms before it written.
    SELECT coalesce(array_agg(CASE WHEN u.queue IS NULL
                                        OR EXISTS (SELECT 1 FROM keiro_queues q
                                                   WHERE q.name = u.queue)
                                   THEN 'not_armed' ELSE 'unknown_queue' END ORDER BY u.n),
                    '{}')
    INTO arm_outcomes
    FROM unnest(p_queues) WITH ORDINALITY AS u (queue, n);
    IF 'unknown_queue' = ANY (arm_outcomes) THEN
        outcome := 'unknown_queue';
        RETURN;
    END IF;
    arm_outcomes := '{}';
    arm_deadlines := '{}';
    arm_settled := '{}';
    FOR i IN 1 .. coalesce(array_length(p_step_ids, 1), 0) LOOP
        SELECT a.outcome, a.deadline, a.settled INTO v_arm
        FROM keiro_remote_task_arm(p_step_ids[i], p_name, p_id, p_generation, p_steps[i],
                                   p_journal_steps[i], p_groups[i], p_inputs[i],
                                   p_priorities[i], p_traceparents[i], p_max_attempts[i],
                                   p_backoff_initial_ms[i], p_backoff_max_ms[i],
                                   p_backoff_jitter[i], p_redispatch_after_ms[i],
                                   p_redispatch_max[i], p_owner, p_epoch, p_queues[i],
                                   p_queue_keys[i]) a;
        IF v_arm.outcome IN ('not_found', 'lease_lost') THEN
            outcome := v_arm.outcome;
            RETURN;
        END IF;
        arm_outcomes := array_append(arm_outcomes, v_arm.outcome);
        arm_deadlines := array_append(arm_deadlines, v_arm.deadline);
        arm_settled := array_append(arm_settled, v_arm.settled);
        -- LEAST ignores NULLs: a park without a wake time gets the deadline.
        v_wake := least(v_wake, v_arm.deadline);
    END LOOP;
    SELECT p.outcome, p.row_status INTO outcome, row_status
    FROM keiro_instance_park(p_name, p_id, p_generation, p_owner, p_epoch, p_awaited, v_wake) p;
END;
$$;

-- instances_park_arms: the parks of several runs in one transaction, each exactly as
-- `keiro_instance_park_arms` does it, one outcome row per park (`park` is its 1-based
-- position in the arrays). A busy worker parks a run on every remote step, and a transaction
-- per park (a round trip, a commit, the statement's set-up) costs about as much as the park's
-- own work (docs/benchmarks-history.md, "Moved from the code").
--
-- Park i awaits `p_awaited[p_awaited_from[i] : p_awaited_to[i]]` and arms the tasks
-- `p_step_ids[p_arms_from[i] : p_arms_to[i]]` (and the same slice of every arm array); an
-- empty slice has `to = from - 1`.
--
-- Lock order (sql/functions/README.md), across the whole batch. The existing tasks of every
-- park are locked first, in step id order (as a batched report locks its tasks), then the
-- parks run in the order of their owner's key (as a batched report journals), so a batch and
-- a report never wait for each other in opposite orders. A cascading cancel locks a tree
-- deepest first instead; one racing a batch that parks both a parent and its child can
-- deadlock with it, which the server detects (after `deadlock_timeout`) and breaks by failing
-- one side: a failed batch is retried park by park, a failed cancel is a retryable error.
-- Called by: keiro_postgres ops::remote::instances_park_dispatch; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_instances_park_arms(
    p_names text[], p_ids text[], p_generations integer[], p_owners text[], p_epochs bigint[],
    p_wake_after timestamptz[], p_awaited_from integer[], p_awaited_to integer[],
    p_awaited text[], p_arms_from integer[], p_arms_to integer[],
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[], p_queues text[],
    p_queue_keys text[])
RETURNS TABLE (park integer, outcome text, row_status text, arm_outcomes text[],
               arm_deadlines timestamptz[], arm_settled jsonb[])
-- Generic plans, index-driven: see the header of this file.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i  integer;
    a  integer;
    b  integer;
BEGIN
    -- See 0005's header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM remote_tasks t WHERE t.step_id = ANY (p_step_ids)
    ORDER BY t.step_id FOR UPDATE;
    FOR i IN
        SELECT p.n FROM unnest(p_names, p_ids) WITH ORDINALITY AS p (name, id, n)
        ORDER BY p.name COLLATE "C", p.id COLLATE "C", p.n
    LOOP
        a := p_arms_from[i];
        b := p_arms_to[i];
        park := i;
        SELECT d.outcome, d.row_status, d.arm_outcomes, d.arm_deadlines, d.arm_settled
        INTO outcome, row_status, arm_outcomes, arm_deadlines, arm_settled
        FROM keiro_instance_park_arms_locked(
            p_names[i], p_ids[i], p_generations[i], p_owners[i], p_epochs[i],
            p_awaited[p_awaited_from[i] : p_awaited_to[i]], p_wake_after[i],
            p_step_ids[a:b], p_steps[a:b], p_journal_steps[a:b], p_groups[a:b], p_inputs[a:b],
            p_priorities[a:b], p_traceparents[a:b], p_max_attempts[a:b],
            p_backoff_initial_ms[a:b], p_backoff_max_ms[a:b], p_backoff_jitter[a:b],
            p_redispatch_after_ms[a:b], p_redispatch_max[a:b], p_queues[a:b],
            p_queue_keys[a:b]) d;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- instance_park_dispatch, instance_park_dispatch_locked, instances_park_dispatch: the
-- `_arms` functions above on no queue, with the previous build's (revision 13) signatures, as
-- it calls them while a deploy rolls; to be dropped by a later migration.
-- Called by: the previous build's keiro_postgres ops::remote; tested by contract::remote.
CREATE OR REPLACE FUNCTION keiro_instance_park_dispatch(
    p_name text, p_id text, p_generation integer, p_owner text, p_epoch bigint,
    p_awaited text[], p_wake_after timestamptz,
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[],
    OUT outcome text, OUT row_status text, OUT arm_outcomes text[],
    OUT arm_deadlines timestamptz[], OUT arm_settled jsonb[])
LANGUAGE plpgsql AS $$
BEGIN
    SELECT d.outcome, d.row_status, d.arm_outcomes, d.arm_deadlines, d.arm_settled
    INTO outcome, row_status, arm_outcomes, arm_deadlines, arm_settled
    FROM keiro_instance_park_arms(
        p_name, p_id, p_generation, p_owner, p_epoch, p_awaited, p_wake_after,
        p_step_ids, p_steps, p_journal_steps, p_groups, p_inputs, p_priorities, p_traceparents,
        p_max_attempts, p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
        p_redispatch_after_ms, p_redispatch_max, NULL, NULL) d;
END;
$$;

CREATE OR REPLACE FUNCTION keiro_instance_park_dispatch_locked(
    p_name text, p_id text, p_generation integer, p_owner text, p_epoch bigint,
    p_awaited text[], p_wake_after timestamptz,
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[],
    OUT outcome text, OUT row_status text, OUT arm_outcomes text[],
    OUT arm_deadlines timestamptz[], OUT arm_settled jsonb[])
LANGUAGE plpgsql AS $$
BEGIN
    SELECT d.outcome, d.row_status, d.arm_outcomes, d.arm_deadlines, d.arm_settled
    INTO outcome, row_status, arm_outcomes, arm_deadlines, arm_settled
    FROM keiro_instance_park_arms_locked(
        p_name, p_id, p_generation, p_owner, p_epoch, p_awaited, p_wake_after,
        p_step_ids, p_steps, p_journal_steps, p_groups, p_inputs, p_priorities, p_traceparents,
        p_max_attempts, p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter,
        p_redispatch_after_ms, p_redispatch_max, NULL, NULL) d;
END;
$$;

CREATE OR REPLACE FUNCTION keiro_instances_park_dispatch(
    p_names text[], p_ids text[], p_generations integer[], p_owners text[], p_epochs bigint[],
    p_wake_after timestamptz[], p_awaited_from integer[], p_awaited_to integer[],
    p_awaited text[], p_arms_from integer[], p_arms_to integer[],
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[])
RETURNS TABLE (park integer, outcome text, row_status text, arm_outcomes text[],
               arm_deadlines timestamptz[], arm_settled jsonb[])
-- As the function it calls (see the header of this file).
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM keiro_instances_park_arms(
        p_names, p_ids, p_generations, p_owners, p_epochs, p_wake_after, p_awaited_from,
        p_awaited_to, p_awaited, p_arms_from, p_arms_to, p_step_ids, p_steps, p_journal_steps,
        p_groups, p_inputs, p_priorities, p_traceparents, p_max_attempts,
        p_backoff_initial_ms, p_backoff_max_ms, p_backoff_jitter, p_redispatch_after_ms,
        p_redispatch_max, NULL, NULL);
END;
$$;
