-- keiro 0005: remote steps (the task table, its worker-facing transport and the operator's
-- recovery tools), and the success-only delivery of a fix-and-replay (`<id>~retry~<hex>`).
--
-- A remote step is a task row keyed by its stable step id (`<name>/<id>/<generation>/<step>`).
-- Arming writes it once (first arm wins) in its own transaction; workers claim it, heartbeat
-- and report. A report settles the task and journals its result into the owner through
-- `keiro_journal_append_to`, the one implementation of the append rules, so the result and
-- the owner's `suspended` -> `running` flip commit together. Retries with backoff happen in the
-- task row without touching the owner: only the final result is journaled, as `{"ok": value}`
-- or `{"error": {message, code, retryable, attempts}}`.
--
-- Outcomes are text codes, as in 0001 and 0002: no function raises on a refusal.
--
-- Lock order: 0002's. Task rows are wake-source rows, so a transaction that journals a task's
-- result locks the task row first and the owner's row after (through the append); the
-- requeue, which writes both, locks the tasks it may reset before any instance row, then the
-- instance tree deepest first, then the instance itself.
--
-- Notifications: a task that became claimable (dispatched, redispatched, requeued) sends the
-- payload `remote` on `<schema>.wake`. Instance payloads are `<name>/<id>` and always contain
-- a `/`, so `remote` cannot be one.
--
-- Commit durability. Postgres serializes the commits of notifying transactions (a lock taken
-- before commit and held until the commit record is flushed), so on a disk where a flush
-- takes a millisecond no more than about a thousand notifying transactions commit per
-- second, whatever the number of cores; measured: 250 remote steps/s, with most backends
-- waiting on that lock. The arm, the claim and the reports therefore commit with
-- `synchronous_commit = off`: their commit record is written but not waited for, so the lock
-- is held for microseconds. This loses no acknowledged state, because each of them is only
-- acted on through a later synchronous commit, and WAL is flushed in order: the park that
-- follows an arm, the run that consumes a report's journal row (its next append or its
-- completion), flush them first. After a crash that drops an unflushed one, the state is that
-- of before it, which keiro already recovers: a run re-arms its step (same step id), a claim
-- or report that vanished leaves the task claimable again (at least once, as always). Starts,
-- appends by runs and operator actions keep synchronous commits: their callers are told
-- "durable" directly.

-- The remote tasks: one per step id, kept after settling (a late re-arm must find it).
CREATE TABLE remote_tasks (
    step_id             text COLLATE "C" PRIMARY KEY,
    workflow_name       text COLLATE "C" NOT NULL,
    workflow_id         text COLLATE "C" NOT NULL,
    -- The owner's generation when the step was armed: its result goes there and nowhere else.
    generation          integer     NOT NULL,
    -- The remote step's user name, which names the handler.
    step                text COLLATE "C" NOT NULL,
    -- Where the result is journaled: `remote:<step>`, then `remote:<step>#<n>` after n
    -- requeues (the journal never rewrites a row, so each reset result gets a new name).
    journal_step        text COLLATE "C" NOT NULL,
    -- The worker group: `<step>` or `<step>@<partition>`.
    grp                 text COLLATE "C" NOT NULL,
    input               jsonb       NOT NULL,
    priority            integer     NOT NULL DEFAULT 0,
    traceparent         text,
    status              text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    -- Failed attempts so far.
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL CHECK (max_attempts >= 1),
    backoff_initial_ms  bigint      NOT NULL,
    backoff_max_ms      bigint      NOT NULL,
    backoff_jitter      boolean     NOT NULL,
    -- 1 at the first dispatch, + 1 per redispatch.
    dispatches          integer     NOT NULL DEFAULT 1,
    -- NULL: redispatch is off, and so is `deadline_at`.
    redispatch_after_ms bigint,
    redispatch_max      integer     NOT NULL CHECK (redispatch_max >= 1),
    -- available_at + redispatch_after: a re-arm after it redispatches (or loses) the task.
    deadline_at         timestamptz,
    available_at        timestamptz NOT NULL DEFAULT now(),
    claim               uuid,
    claimed_by          text,
    claim_expires_at    timestamptz,
    output              jsonb,
    -- The last failure, as {message, code, retryable}.
    last_error          jsonb,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    settled_at          timestamptz,
    CHECK ((status = 'running') = (claim IS NOT NULL)),
    CHECK ((claim IS NULL) = (claim_expires_at IS NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `tasks_claim` (`keiro_remote_tasks_claim`): per group, the available pending tasks
-- in claim order (priority first, then oldest), so a claim reads exactly the rows it takes.
-- Partial: claimed and settled tasks cost nothing to it.
CREATE INDEX remote_tasks_pending_idx ON remote_tasks (grp, priority DESC, available_at, created_at)
    WHERE status = 'pending';

-- Serves the expired-claim sweep at the start of every `tasks_claim`: empty of expired rows in
-- the steady state, so the sweep is one index probe. Partial: only claimed tasks.
CREATE INDEX remote_tasks_running_idx ON remote_tasks (claim_expires_at)
    WHERE status = 'running';

-- Serves the tasks of one owner: the foreign key's cascade when retention deletes an instance,
-- `remote_tasks`, and one generation's tasks for `remote_redispatch_pending` and the requeue.
-- (`journal_step` is left out: an owner's generation holds few tasks, and every task version
-- writes this index, since a status change is never a HOT update.)
CREATE INDEX remote_tasks_owner_idx ON remote_tasks (workflow_name, workflow_id, generation);

-- Serves the requeue: the instances linked to a parent's generation (the tree it locks first)
-- and to one awaited step of it (the children and fixes it relinks to the step's next
-- revision). Partial: instances without a parent cost nothing to it; the link columns never
-- change on the hot path, so step appends stay HOT updates.
CREATE INDEX workflows_parent_link_idx ON workflows (parent_name, parent_id, parent_generation,
                                                     parent_step)
    WHERE parent_step IS NOT NULL;

-- Tells remote workers that a task became claimable.
CREATE FUNCTION keiro_notify_remote() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify(current_schema() || '.wake', 'remote');
$$;

-- The logical step a stored step name records (`keiro_journal::logical_step`): a revised
-- `remote:`/`child:` step `<step>#<n>` reads as `<step>`; every other name as itself.
CREATE FUNCTION keiro_step_logical(p_stored text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN (starts_with(p_stored, 'remote:') OR starts_with(p_stored, 'child:'))
             AND p_stored ~ '#[0-9]+$'
            THEN regexp_replace(p_stored, '#[0-9]+$', '')
        ELSE p_stored
    END;
$$;

-- The revision a stored step name holds (`keiro_journal::step_revision`): n for `<step>#<n>`,
-- 0 for the step's own name.
CREATE FUNCTION keiro_step_revision(p_stored text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN keiro_step_logical(p_stored) = p_stored THEN 0
        ELSE substring(p_stored FROM '#([0-9]+)$')::integer
    END;
$$;

-- The envelope a failed task's result is journaled as: its last error with its attempts.
CREATE FUNCTION keiro_remote_error_envelope(p_task remote_tasks) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('error', coalesce(p_task.last_error, '{}'::jsonb)
                                       || jsonb_build_object('attempts', p_task.attempts));
$$;

-- Journals a settled task's result envelope into its owner's generation under the task's
-- journal step (external, through the append rules) and says what became of it: delivered
-- (appended, or the same step was already recorded) or owner_gone (terminal, another
-- generation, deleted). The caller holds the task row's lock; this takes the owner's.
CREATE FUNCTION keiro_remote_deliver(p_task remote_tasks, p_envelope jsonb,
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

-- remote_arm: writes the task of a remote step once, or learns its state: its result, its
-- redispatch (or loss) when its deadline passed, or that it still waits. The task row is
-- locked first; the owner's row is only read (its generation, status and lease), and locked
-- only by the append that journals a lost task. Outcomes: dispatched (deadline), waiting
-- (deadline), redispatched (deadline), settled (settled = the journaled envelope), lost
-- (settled), not_found, lease_lost.
CREATE FUNCTION keiro_remote_arm(p_step_id text, p_name text, p_id text, p_generation integer,
                                 p_step text, p_journal_step text, p_group text, p_input jsonb,
                                 p_priority integer, p_traceparent text, p_max_attempts integer,
                                 p_backoff_initial_ms bigint, p_backoff_max_ms bigint,
                                 p_backoff_jitter boolean, p_redispatch_after_ms bigint,
                                 p_redispatch_max integer, p_owner text, p_epoch bigint,
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
    -- See the header: acted on only through later synchronous commits.
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

-- tasks_claim: returns the groups' expired claims to `pending`, then claims up to `p_limit`
-- available pending tasks of the groups, highest priority first, then oldest, each with a new
-- claim id. Both statements skip rows another transaction holds (SKIP LOCKED) and re-check
-- their conditions on the rows they lock, so concurrent claimers never take the same task and
-- never wait for each other. Returns the claimed rows in claim order.
CREATE FUNCTION keiro_remote_tasks_claim(p_groups text[], p_worker text, p_limit integer,
                                         p_ttl_ms bigint)
RETURNS SETOF remote_tasks
-- Every statement here is meant to be index-driven. A fresh installation starts with an
-- empty table, and the plans a session caches while it is small are sequential scans that it
-- then keeps as the table grows (measured: 3,362 sequential scans reading 15 million rows in
-- one 6,000-step bench), so sequential scans are ruled out here.
SET enable_seqscan = off
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- See the header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Served by remote_tasks_running_idx.
    UPDATE remote_tasks t SET
        status = 'pending', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        updated_at = now()
    FROM (
        SELECT e.step_id FROM remote_tasks e
        WHERE e.status = 'running' AND e.claim_expires_at <= now() AND e.grp = ANY (p_groups)
        FOR UPDATE SKIP LOCKED
    ) expired
    WHERE t.step_id = expired.step_id;

    RETURN QUERY
    WITH picked AS (
        -- Per group, the first `p_limit` claimable rows in claim order, locked as the ordered
        -- scan of remote_tasks_pending_idx meets them (so rows a concurrent claimer holds are
        -- passed over, not counted), then the first `p_limit` of them all. With one group that
        -- is one ordered index scan that locks exactly what it claims; with several, the rows
        -- locked but not taken (at most (groups - 1) * p_limit, and never more than the
        -- backlog) stay claimable and are released at commit.
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

-- task_complete: settles the task `completed` with the handler's output, whoever reports it
-- (the first result wins), and journals `{"ok": output}` into the owner. Outcomes: delivered,
-- owner_gone, already_settled, not_found.
CREATE FUNCTION keiro_remote_task_complete(p_step_id text, p_output jsonb, OUT outcome text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_task remote_tasks%ROWTYPE;
BEGIN
    -- See the header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
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
-- pays one commit (and one turn at the notification lock, see the header) for many results.
-- The task rows are locked first, in step id order, then each result is journaled in the
-- order of its owner's key: two batches take their locks in the same order. Returns one
-- outcome per step id.
CREATE FUNCTION keiro_remote_tasks_complete(p_step_ids text[], p_outputs jsonb[])
RETURNS TABLE (step_id text, outcome text)
-- Every statement here is meant to be index-driven. A fresh installation starts with an
-- empty table, and the plans a session caches while it is small are sequential scans that it
-- then keeps as the table grows (measured: 3,362 sequential scans reading 15 million rows in
-- one 6,000-step bench), so sequential scans are ruled out here.
SET enable_seqscan = off
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_report record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM remote_tasks t WHERE t.step_id = ANY (p_step_ids)
    ORDER BY t.step_id FOR UPDATE;
    FOR v_report IN
        SELECT r.step_id, r.output
        FROM unnest(p_step_ids, p_outputs) AS r (step_id, output)
        LEFT JOIN remote_tasks t ON t.step_id = r.step_id
        ORDER BY t.workflow_name, t.workflow_id, r.step_id
    LOOP
        step_id := v_report.step_id;
        SELECT c.outcome INTO outcome
        FROM keiro_remote_task_complete(v_report.step_id, v_report.output) c;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- task_fail: counts a failed attempt of the current claim. With attempts left and a
-- retryable failure the task is pending again at `now + p_retry_delay_ms`; otherwise it is
-- failed and `{"error": {message, code, retryable, attempts}}` is journaled into the owner.
-- A report of an older claim is ignored. Outcomes: retrying (retry_at), delivered, owner_gone,
-- already_settled, stale, not_found.
CREATE FUNCTION keiro_remote_task_fail(p_step_id text, p_claim uuid, p_message text,
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
    -- See the header: acted on only through later synchronous commits.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT * INTO v_task FROM remote_tasks t WHERE t.step_id = p_step_id FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
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
CREATE FUNCTION keiro_remote_redispatch_pending(p_name text, p_id text,
                                                OUT outcome text, OUT redispatched bigint)
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

-- The requeue of one failed instance that the caller has locked, and of its failed children
-- (recursively): supersedes each current failed remote result and awaited child failure of
-- its current generation with a `reset` row, resets their tasks, relinks or requeues the
-- children, appends `resurrected` and flips the row to `running`. `visited` holds the
-- `<name>/<id>` of every instance requeued by this transaction (a cycle guard); it comes back
-- extended. `child_names`/`child_ids` are the children requeued, each before its own.
--
-- A record is current when no `reset` row supersedes it; a `reset` row is stored under
-- `__workflow_step_reset__:<superseded stored name>`, so that is one unique-index probe.
CREATE FUNCTION keiro_instance_requeue_one(p_name text, p_id text, INOUT visited text[],
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
    v_sub            record;
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
            SELECT * INTO v_sub FROM keiro_instance_requeue_one(v_child_name, v_child_id, visited);
            visited := v_sub.visited;
            reset_steps := reset_steps + v_sub.reset_steps;
            child_names := child_names || v_sub.child_names;
            child_ids := child_ids || v_sub.child_ids;
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

-- instance_requeue: the operator's retry of a failed instance (see
-- `keiro_instance_requeue_one`), in one transaction. Before the instance row, it locks the
-- failed tasks it may reset and the live or failed instances linked to its generation
-- (recursively through failed ones), deepest first: a child finishing now locks itself and
-- then its parent, and a worker reporting locks the task and then its owner. Outcomes:
-- requeued (reset_steps, child_names, child_ids), not_failed (row_status), not_found.
CREATE FUNCTION keiro_instance_requeue(p_name text, p_id text,
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

    SELECT * INTO v_result FROM keiro_instance_requeue_one(p_name, p_id, '{}');
    reset_steps := v_result.reset_steps;
    child_names := v_result.child_names;
    child_ids := v_result.child_ids;
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
CREATE FUNCTION keiro_instance_retry_with_input(p_origin_name text, p_origin_id text,
                                                p_retry_name text, p_retry_id text,
                                                p_input jsonb, OUT outcome text)
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

-- The child-delivery rule of 0002, plus: a fix (an instance whose id contains `~retry~`)
-- delivers to its parent only when it completes. Its failure or cancellation is not the
-- origin's result; the origin's own failure is what the parent already has.
CREATE OR REPLACE FUNCTION keiro_child_deliver(p_child workflows) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_child.parent_step IS NULL THEN
        RETURN;
    END IF;
    IF p_child.status <> 'completed' AND strpos(p_child.workflow_id, '~retry~') > 0 THEN
        RETURN;
    END IF;
    PERFORM keiro_journal_append_to(p_child.parent_name, p_child.parent_id,
                                    p_child.parent_generation, p_child.parent_step, 'child',
                                    keiro_child_envelope(p_child), NULL, NULL, NULL);
END;
$$;

-- instance_park_dispatch: the remote steps a run deferred, armed as by keiro_remote_arm (in
-- order), and the run's park, in one transaction, so a run that dispatches and suspends pays
-- one commit for both, and its dispatch is atomic with its suspension. The park wakes by the
-- earliest redispatch deadline an arm returned, if earlier than the run's own. Locks follow
-- the lock order: the arms lock task rows, the park then the instance row. An arm that finds
-- the instance missing or the fence stale ends the call with that outcome before the park
-- (every arm checks the same fence, so that is the first arm unless the lease moved meanwhile).
-- Outcomes: the park's (suspended, woken, terminal, not_found, lease_lost), with one arm
-- outcome, deadline and settled value per arm. Commits asynchronously, as the arm and the
-- park do on their own (see the header).
CREATE FUNCTION keiro_instance_park_dispatch(
    p_name text, p_id text, p_generation integer, p_owner text, p_epoch bigint,
    p_awaited text[], p_wake_after timestamptz,
    p_step_ids text[], p_steps text[], p_journal_steps text[], p_groups text[],
    p_inputs jsonb[], p_priorities integer[], p_traceparents text[], p_max_attempts integer[],
    p_backoff_initial_ms bigint[], p_backoff_max_ms bigint[], p_backoff_jitter boolean[],
    p_redispatch_after_ms bigint[], p_redispatch_max integer[],
    OUT outcome text, OUT row_status text, OUT arm_outcomes text[],
    OUT arm_deadlines timestamptz[], OUT arm_settled jsonb[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_arm  record;
    v_wake timestamptz := p_wake_after;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    arm_outcomes := '{}';
    arm_deadlines := '{}';
    arm_settled := '{}';
    FOR i IN 1 .. coalesce(array_length(p_step_ids, 1), 0) LOOP
        SELECT a.outcome, a.deadline, a.settled INTO v_arm
        FROM keiro_remote_arm(p_step_ids[i], p_name, p_id, p_generation, p_steps[i],
                              p_journal_steps[i], p_groups[i], p_inputs[i], p_priorities[i],
                              p_traceparents[i], p_max_attempts[i], p_backoff_initial_ms[i],
                              p_backoff_max_ms[i], p_backoff_jitter[i],
                              p_redispatch_after_ms[i], p_redispatch_max[i],
                              p_owner, p_epoch) a;
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
