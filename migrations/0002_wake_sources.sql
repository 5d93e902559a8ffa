-- keiro 0002: wake sources (durable timers, awakeables, signals, child workflows) and
-- cancellation with cascade.
--
-- Every resolution of a wake source journals the awaited step into its owner through
-- `keiro_journal_append_to`, the one implementation of the append rules: the generation
-- check, the recorded-step convergence, the terminal refusal, the fence, and the
-- `suspended` -> `running` flip with its notification. So a wake and its journal row commit
-- together, and a resume pass finds the owner runnable whether or not a listener heard it.
--
-- Outcomes are text codes, as in 0001: no function raises on a refusal, so none needs an
-- exception block (a subtransaction per call).
--
-- Lock order. Transactions that take several locks take them in this order, so they wait on
-- each other instead of deadlocking:
--   1. wake-source rows: timers (FOR UPDATE SKIP LOCKED), awakeables (FOR UPDATE);
--   2. signal tokens (transaction advisory locks), several in token order;
--   3. instance rows, descendants before ancestors (a child's terminal transaction locks the
--      child, then appends to its parent), several unrelated ones in key order.
-- Two rare interleavings remain outside this order: a spawn locks the parent (its append) and
-- then an existing instance it adopts as the child, and a cascade's tree order (deepest first)
-- can disagree with a timer batch's key order. A deadlock there needs both transactions on the
-- same instances at the same moment; Postgres detects it and aborts one, which the store
-- reports as a retryable error.

-- The parent link of a child: `parent_name`/`parent_id` (0001) name the parent, these two
-- name where the child's result envelope is journaled. Rows started without a link keep NULLs.
ALTER TABLE workflows
    ADD COLUMN parent_generation integer,
    ADD COLUMN parent_step       text COLLATE "C",
    ADD CONSTRAINT workflows_parent_link_check CHECK (
        (parent_generation IS NULL) = (parent_step IS NULL)
        AND (parent_step IS NULL OR parent_name IS NOT NULL)
    );

-- Serves the cascade of `instance_cancel` (`keiro_instance_cancel`, `keiro_instance_cancel_tree`):
-- the live children of one parent. Partial, so finished children cost nothing.
CREATE INDEX workflows_live_children_idx ON workflows (parent_name, parent_id)
    WHERE parent_name IS NOT NULL AND status IN ('running', 'suspended');

-- Durable timers: a sleep's deadline, or a signal wait's timeout. One per (instance,
-- generation, step); the first arm wins and fired rows stay, so a late re-arm still finds it.
CREATE TABLE timers (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step          text COLLATE "C" NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('sleep', 'signal_timeout')),
    -- The token a signal timeout waits on; its firing takes that token's lock.
    token         text COLLATE "C",
    fire_at       timestamptz NOT NULL,
    status        text        NOT NULL DEFAULT 'scheduled'
        CHECK (status IN ('scheduled', 'firing', 'fired')),
    attempts      integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    fired_at      timestamptz,
    PRIMARY KEY (workflow_name, workflow_id, generation, step),
    CHECK ((kind = 'signal_timeout') = (token IS NOT NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `timers_fire_due` (the due batch, oldest first, and the next due time it returns)
-- and `timers_due_count`. Partial: fired timers, which accumulate, cost nothing.
CREATE INDEX timers_scheduled_idx ON timers (fire_at) WHERE status = 'scheduled';

-- Serves `timers_requeue_stuck`. Firing is one transaction, so rows enter this index only if
-- something outside keiro left them `firing`: it stays empty and costs nothing to keep.
CREATE INDEX timers_firing_idx ON timers (updated_at) WHERE status = 'firing';

-- Awakeables: ids handed to outside systems, settled once (completed or cancelled).
CREATE TABLE awakeables (
    id            uuid PRIMARY KEY,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    -- The owner's generation when the awakeable was created: its value goes there.
    generation    integer     NOT NULL,
    status        text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'completed', 'cancelled')),
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    settled_at    timestamptz,
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `awakeables_pending` (an index-only count). Partial: settled awakeables cost nothing.
CREATE INDEX awakeables_pending_idx ON awakeables (created_at) WHERE status = 'pending';

-- Serves the foreign key's cascade when retention deletes an instance row.
CREATE INDEX awakeables_owner_idx ON awakeables (workflow_name, workflow_id);

-- Signals sent while nobody waited, first in first out per token.
CREATE TABLE signal_buffer (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token      text COLLATE "C" NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Serves `signal_wait`: the oldest buffered signal of a token.
CREATE INDEX signal_buffer_token_idx ON signal_buffer (token, seq);

-- Registered signal waits, first come first served per token.
CREATE TABLE signal_waiters (
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    token         text COLLATE "C" NOT NULL,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step          text COLLATE "C" NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, generation, step),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `signal_send`: a token's waiters, oldest first.
CREATE INDEX signal_waiters_token_idx ON signal_waiters (token, seq);

-- Tells timer loops that a timer was armed, so the earliest due time may have moved closer.
-- Instance payloads are `<name>/<id>` and always contain a `/`, so `timer` cannot be one.
CREATE FUNCTION keiro_notify_timer() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify(current_schema() || '.wake', 'timer');
$$;

-- The per-token lock every signal operation takes first, so a wait and a send on one token are
-- totally ordered: without it both could find the other's table empty, and the wait would
-- register while the send buffers, losing the signal. An advisory lock is needed because
-- there may be no row to lock yet. It is transaction-scoped, so commit or rollback releases
-- it. The key carries the schema, so installations sharing a database do not contend; a hash
-- collision between two tokens only serializes them, it never merges them.
CREATE FUNCTION keiro_signal_lock(p_token text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(
        hashtextextended('keiro.signal:' || current_schema() || ':' || p_token, 0));
$$;

-- The result envelope of a terminal instance row, as its parent journals it.
CREATE FUNCTION keiro_child_envelope(p_child workflows) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT CASE p_child.status
        WHEN 'completed' THEN jsonb_build_object('ok', coalesce(p_child.output, 'null'::jsonb))
        WHEN 'failed' THEN jsonb_build_object('failed', coalesce(p_child.last_error, ''))
        WHEN 'cancelled' THEN jsonb_build_object('cancelled', true)
    END;
$$;

-- appends one event to (p_name, p_id, generation) under the instance row's lock: the rules of
-- 0001's `keiro_journal_append`, unchanged, plus the child delivery of a closing marker.
-- Every wake source calls it, so there is one implementation of the append rules.
--
-- `appended_generation` is the generation written to (set only when appended). Outcomes:
-- appended, already_present (recorded), conflict, refused_terminal (marker), not_found,
-- lease_lost.
CREATE FUNCTION keiro_journal_append_to(p_name text, p_id text, p_generation integer,
                                        p_step text, p_kind text, p_payload jsonb,
                                        p_owner text, p_epoch bigint, p_renew_ms bigint,
                                        OUT outcome text, OUT recorded jsonb, OUT marker text,
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
        PERFORM keiro_notify_wake(p_name, p_id);
    END IF;
    outcome := 'appended';
    appended_generation := v_generation;
END;
$$;

-- The child-delivery rule: `p_child` is a row its own transaction just made terminal (and
-- still holds locked). If it is linked to a parent, its result envelope is journaled into the
-- parent's spawning generation under the awaited step, waking the parent. A parent that
-- refuses (terminal, moved to another generation, gone) is ignored: nobody waits any more.
-- Locks the parent after the child: descendants before ancestors.
CREATE FUNCTION keiro_child_deliver(p_child workflows) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_child.parent_step IS NULL THEN
        RETURN;
    END IF;
    PERFORM keiro_journal_append_to(p_child.parent_name, p_child.parent_id,
                                    p_child.parent_generation, p_child.parent_step, 'child',
                                    keiro_child_envelope(p_child), NULL, NULL, NULL);
END;
$$;

-- journal_append now goes through the shared implementation (same signature and outcomes as
-- 0001, so statements prepared against it keep working).
CREATE OR REPLACE FUNCTION keiro_journal_append(p_name text, p_id text, p_generation integer,
                                                p_step text, p_kind text, p_payload jsonb,
                                                p_owner text, p_epoch bigint,
                                                p_renew_ms bigint,
                                                OUT outcome text, OUT recorded jsonb,
                                                OUT marker text)
LANGUAGE sql AS $$
    SELECT a.outcome, a.recorded, a.marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
$$;

-- instance_fail_diverged, as in 0001, plus the child delivery of the failure.
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

-- instance_record_crash, as in 0001, plus the child delivery of a failure at the ceiling.
CREATE OR REPLACE FUNCTION keiro_instance_record_crash(p_name text, p_id text, p_owner text,
                                                       p_epoch bigint, p_error text,
                                                       p_retry_delay_ms bigint,
                                                       p_max_attempts integer,
                                                       OUT outcome text,
                                                       OUT crash_attempts integer,
                                                       OUT retry_at timestamptz)
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
    IF v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_epoch <> p_epoch THEN
        outcome := 'lease_lost';
        RETURN;
    END IF;
    crash_attempts := v_row.attempts + 1;
    IF crash_attempts >= p_max_attempts THEN
        INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
        VALUES (p_name, p_id, v_row.generation,
                keiro_journal_repeatable_name(p_name, p_id, v_row.generation, 'failed',
                                              '__workflow_failed__'),
                'failed', to_jsonb(p_error));
        UPDATE workflows w SET
            attempts = crash_attempts,
            status = 'failed', last_error = p_error, completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id
        RETURNING w.* INTO v_row;
        PERFORM keiro_child_deliver(v_row);
        outcome := 'failed';
    ELSE
        retry_at := now() + p_retry_delay_ms * interval '1 millisecond';
        UPDATE workflows w SET
            attempts = crash_attempts,
            last_error = p_error,
            next_attempt_at = retry_at,
            lease_owner = NULL, lease_expires_at = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        outcome := 'retrying';
    END IF;
END;
$$;

-- timer_arm: inserts the timer unless one exists for the step (first arm wins; a re-arm never
-- moves fire_at, even after the timer fired) and returns the stored fire_at. Only a new timer
-- notifies, with the `timer` payload. Not fenced. Outcomes: armed, present, not_found.
CREATE FUNCTION keiro_timer_arm(p_name text, p_id text, p_generation integer, p_step text,
                                p_kind text, p_token text, p_fire_at timestamptz,
                                OUT outcome text, OUT stored_fire_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    INSERT INTO timers AS t (workflow_name, workflow_id, generation, step, kind, token, fire_at)
    VALUES (p_name, p_id, p_generation, p_step, p_kind, p_token, p_fire_at)
    ON CONFLICT (workflow_name, workflow_id, generation, step) DO NOTHING
    RETURNING t.fire_at INTO stored_fire_at;
    IF FOUND THEN
        PERFORM keiro_notify_timer();
        outcome := 'armed';
        RETURN;
    END IF;
    -- A separate statement takes a fresh snapshot, so it sees the timer that a concurrent arm
    -- committed after the INSERT above began (the conflict it hit).
    SELECT t.fire_at INTO stored_fire_at FROM timers t
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id
      AND t.generation = p_generation AND t.step = p_step;
    -- Not found only if the instance was deleted in between.
    outcome := CASE WHEN FOUND THEN 'present' ELSE 'not_found' END;
END;
$$;

-- timers_fire_due: fires up to `p_limit` timers due at `clock`, oldest first, in this one
-- transaction: each fire journals its step (external) and marks the timer fired. Returns the
-- fired timers as parallel arrays in fire order, and `next_due`, the earliest fire_at still
-- scheduled, so an idle timer loop knows how long it may sleep without another round trip.
CREATE FUNCTION keiro_timers_fire_due(p_now timestamptz, p_limit bigint,
                                      OUT clock timestamptz,
                                      OUT fired_name text[], OUT fired_id text[],
                                      OUT fired_step text[], OUT fired_fire_at timestamptz[],
                                      OUT fired_delivered boolean[],
                                      OUT next_due timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_batch     timers[];
    v_timer     timers%ROWTYPE;
    v_token     text;
    v_outcome   text;
    v_delivered boolean;
BEGIN
    clock := coalesce(p_now, now());

    -- SKIP LOCKED: a timer that a concurrent caller has picked is neither waited for nor
    -- fired again; that caller fires it and marks it fired in its own transaction. A timer it
    -- fired and committed meanwhile fails the re-checked `status = 'scheduled'` and is
    -- skipped too. So concurrent timer workers never fire the same timer.
    FOR v_timer IN
        SELECT * FROM timers t
        WHERE t.status = 'scheduled' AND t.fire_at <= clock
        ORDER BY t.fire_at, t.workflow_name, t.workflow_id, t.generation, t.step
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        v_batch := array_append(v_batch, v_timer);
    END LOOP;

    -- Every lock the batch needs is taken before the first append, in the order of the header
    -- (timer rows above, then tokens, then instances in key order), because a batch touches
    -- many tokens and instances while a signal send holds one token and locks instances.
    FOR v_token IN
        SELECT DISTINCT b.token FROM unnest(v_batch) b WHERE b.token IS NOT NULL ORDER BY 1
    LOOP
        PERFORM keiro_signal_lock(v_token);
    END LOOP;
    PERFORM 1 FROM workflows w
    WHERE (w.workflow_name, w.workflow_id) IN (
        SELECT b.workflow_name, b.workflow_id FROM unnest(v_batch) b)
    ORDER BY w.workflow_name, w.workflow_id
    FOR UPDATE OF w;

    FOREACH v_timer IN ARRAY coalesce(v_batch, '{}') LOOP
        v_delivered := false;
        IF v_timer.kind = 'sleep' THEN
            SELECT a.outcome INTO v_outcome
            FROM keiro_journal_append_to(v_timer.workflow_name, v_timer.workflow_id,
                                         v_timer.generation, v_timer.step, 'sleep',
                                         'null'::jsonb, NULL, NULL, NULL) a;
            IF v_outcome = 'appended' THEN
                v_delivered := true;
                -- The deadline is met: the row must not come due again on it.
                UPDATE workflows w SET wake_after = NULL
                WHERE w.workflow_name = v_timer.workflow_name
                  AND w.workflow_id = v_timer.workflow_id;
            END IF;
        ELSE
            -- A signal timeout, under its token's lock (taken above): the wait times out only
            -- if no signal took the waiter first.
            DELETE FROM signal_waiters sw
            WHERE sw.workflow_name = v_timer.workflow_name
              AND sw.workflow_id = v_timer.workflow_id
              AND sw.generation = v_timer.generation AND sw.step = v_timer.step;
            IF FOUND THEN
                SELECT a.outcome INTO v_outcome
                FROM keiro_journal_append_to(v_timer.workflow_name, v_timer.workflow_id,
                                             v_timer.generation, v_timer.step, 'signal',
                                             jsonb_build_object('timeout', true),
                                             NULL, NULL, NULL) a;
                v_delivered := v_outcome = 'appended';
            END IF;
        END IF;
        UPDATE timers t SET
            status = 'fired', attempts = t.attempts + 1, fired_at = clock, updated_at = now()
        WHERE t.workflow_name = v_timer.workflow_name AND t.workflow_id = v_timer.workflow_id
          AND t.generation = v_timer.generation AND t.step = v_timer.step;
        fired_name := array_append(fired_name, v_timer.workflow_name::text);
        fired_id := array_append(fired_id, v_timer.workflow_id::text);
        fired_step := array_append(fired_step, v_timer.step::text);
        fired_fire_at := array_append(fired_fire_at, v_timer.fire_at);
        fired_delivered := array_append(fired_delivered, v_delivered);
    END LOOP;

    SELECT min(t.fire_at) INTO next_due FROM timers t WHERE t.status = 'scheduled';
END;
$$;

-- awakeable_create: applies the allocation step's append and, only when it was appended,
-- registers the pending awakeable for the generation written to. A replayed allocation
-- (already_present) registers nothing. Outcomes: those of `keiro_journal_append_to`.
CREATE FUNCTION keiro_awakeable_create(p_name text, p_id text, p_generation integer,
                                       p_step text, p_kind text, p_payload jsonb,
                                       p_owner text, p_epoch bigint, p_renew_ms bigint,
                                       p_awakeable uuid,
                                       OUT outcome text, OUT recorded jsonb, OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
BEGIN
    SELECT a.outcome, a.recorded, a.marker, a.appended_generation
    INTO outcome, recorded, marker, v_generation
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        -- A reused id violates the primary key and rolls the append back with it.
        INSERT INTO awakeables (id, workflow_name, workflow_id, generation)
        VALUES (p_awakeable, p_name, p_id, v_generation);
    END IF;
END;
$$;

-- awakeable_complete / awakeable_cancel: settles a pending awakeable as `p_status` with
-- `p_payload` and journals `p_envelope` under `p_step` into its owner's generation (external).
-- The awakeable row is locked first, so two settlements are ordered and the second finds it
-- settled. Outcomes: delivered, owner_gone (settled, but the owner refused the step),
-- already_settled (settled_status), not_found.
CREATE FUNCTION keiro_awakeable_settle(p_awakeable uuid, p_status text, p_payload jsonb,
                                       p_step text, p_envelope jsonb,
                                       OUT outcome text, OUT settled_status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_awakeable awakeables%ROWTYPE;
    v_outcome   text;
BEGIN
    SELECT * INTO v_awakeable FROM awakeables a WHERE a.id = p_awakeable FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_awakeable.status <> 'pending' THEN
        outcome := 'already_settled';
        settled_status := v_awakeable.status;
        RETURN;
    END IF;
    UPDATE awakeables a SET status = p_status, payload = p_payload, settled_at = now()
    WHERE a.id = p_awakeable;
    SELECT a.outcome INTO v_outcome
    FROM keiro_journal_append_to(v_awakeable.workflow_name, v_awakeable.workflow_id,
                                 v_awakeable.generation, p_step, 'awakeable', p_envelope,
                                 NULL, NULL, NULL) a;
    -- The awakeable stays settled either way: its value has nowhere else to go.
    outcome := CASE WHEN v_outcome IN ('appended', 'already_present') THEN 'delivered'
                    ELSE 'owner_gone' END;
END;
$$;

-- signal_wait: under the token's lock, either finds the step already journaled, finds the
-- waiter already registered, consumes the oldest buffered signal (journaled at once, fenced by
-- the run's lease), or registers the waiter. Outcomes: delivered (delivered = the journaled
-- envelope), waiting, not_found, lease_lost.
CREATE FUNCTION keiro_signal_wait(p_name text, p_id text, p_generation integer, p_step text,
                                  p_token text, p_owner text, p_epoch bigint,
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

-- signal_send: under the token's lock, offers the signal to the token's waiters oldest first;
-- each waiter offered is removed, and the first whose owner takes the step (appended, waking
-- it) receives it. Waiters that cannot take it (terminal, another generation, already
-- answered, gone) are dropped. With no taker the signal is buffered. Outcomes: delivered
-- (to_name, to_id), buffered.
CREATE FUNCTION keiro_signal_send(p_token text, p_payload jsonb,
                                  OUT outcome text, OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_waiter   signal_waiters%ROWTYPE;
    v_envelope jsonb := jsonb_build_object('ok', p_payload);
    v_outcome  text;
BEGIN
    PERFORM keiro_signal_lock(p_token);
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
            RETURN;
        END IF;
    END LOOP;
    INSERT INTO signal_buffer (token, payload) VALUES (p_token, p_payload);
    outcome := 'buffered';
END;
$$;

-- child_spawn: applies the parent's spawn-step append and, only when it was appended,
-- creates the child `running` (generation 0, priority 0), linked to the parent's generation
-- and awaited step, and notifies it like a start. If an instance with the child's key exists,
-- it adopts the parent unless it already has one, and if it has already finished, its result
-- envelope is journaled into the spawner at once (whether or not it was adopted: the spawner
-- awaits it either way). Outcomes: those of `keiro_journal_append_to`.
CREATE FUNCTION keiro_child_spawn(p_name text, p_id text, p_generation integer, p_step text,
                                  p_kind text, p_payload jsonb, p_owner text, p_epoch bigint,
                                  p_renew_ms bigint, p_child_name text, p_child_id text,
                                  p_input jsonb, p_await_step text,
                                  OUT outcome text, OUT recorded jsonb, OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
    v_child      workflows%ROWTYPE;
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
    IF v_child.parent_name IS NULL THEN
        UPDATE workflows w SET
            parent_name = p_name, parent_id = p_id,
            parent_generation = v_generation, parent_step = p_await_step,
            updated_at = now()
        WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id;
    END IF;
    IF v_child.status IN ('completed', 'failed', 'cancelled') THEN
        PERFORM keiro_journal_append_to(p_name, p_id, v_generation, p_await_step, 'child',
                                        keiro_child_envelope(v_child), NULL, NULL, NULL);
    END IF;
END;
$$;

-- The cancellation of one instance and, when `p_cascade`, of its live descendants, depth
-- first with children in key order. Each cancelled child's own delivery to its (now
-- cancelled) parent is refused and ignored. Outcomes: those of `keiro_journal_append_to`
-- for the instance itself.
CREATE FUNCTION keiro_instance_cancel_tree(p_name text, p_id text, p_cascade boolean,
                                           OUT outcome text, OUT recorded jsonb,
                                           OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_child record;
BEGIN
    SELECT a.outcome, a.recorded, a.marker INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, NULL, '__workflow_cancelled__', 'cancelled',
                                 'null'::jsonb, NULL, NULL, NULL) a;
    IF outcome <> 'appended' OR NOT p_cascade THEN
        RETURN;
    END IF;
    FOR v_child IN
        SELECT w.workflow_name, w.workflow_id FROM workflows w
        WHERE w.parent_name = p_name AND w.parent_id = p_id
          AND w.status IN ('running', 'suspended')
        ORDER BY w.workflow_name, w.workflow_id
    LOOP
        PERFORM keiro_instance_cancel_tree(v_child.workflow_name, v_child.workflow_id, true);
    END LOOP;
END;
$$;

-- instance_cancel: appends the cancel marker to the instance's current generation (external)
-- and, when `p_cascade`, cancels every live descendant, all in this transaction.
CREATE FUNCTION keiro_instance_cancel(p_name text, p_id text, p_cascade boolean,
                                      OUT outcome text, OUT recorded jsonb, OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_locked record;
BEGIN
    IF p_cascade THEN
        -- Lock the live tree deepest first, before the root: a descendant finishing right now
        -- locks itself and then its parent, so taking the parent first here could deadlock
        -- with it. The path guards against a cycle of parent links (an adopted ancestor).
        FOR v_locked IN
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
            SELECT w.workflow_name FROM workflows w
            JOIN tree t ON t.workflow_name = w.workflow_name AND t.workflow_id = w.workflow_id
            ORDER BY t.depth DESC, w.workflow_name, w.workflow_id
            FOR UPDATE OF w
        LOOP
            NULL;
        END LOOP;
    END IF;
    SELECT c.outcome, c.recorded, c.marker INTO outcome, recorded, marker
    FROM keiro_instance_cancel_tree(p_name, p_id, p_cascade) c;
END;
$$;
