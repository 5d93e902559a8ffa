-- keiro 0001: the instance row, the journal, and one function per multi-statement store
-- operation.
--
-- Every name below is unqualified on purpose: the runner applies this file with the
-- connection's search_path set to the target schema, and the store's connections use the same
-- search_path, so two schemas in one database are two fully isolated keiro installations.
--
-- Each store operation that needs more than one statement is one plpgsql function, so it is
-- one round trip and one transaction whatever the client does. The functions report outcomes
-- as text codes instead of raising, because an exception block would open a subtransaction on
-- every call and a raised error would have to be parsed back into a typed outcome.
--
-- Wake notifications go to the channel `<schema>.wake` with the payload `<name>/<id>`
-- (neither part may contain `/`), sent inside the transaction that changed the row, so a
-- listener is told only about committed changes.

-- The instance row: the complete wake ledger of one workflow instance.
--
-- Identities use the "C" collation: they are keys, not prose, so they compare byte-wise in
-- every database (the memory store orders them the same way) and compare cheaply.
CREATE TABLE workflows (
    workflow_name    text COLLATE "C" NOT NULL,
    workflow_id      text COLLATE "C" NOT NULL,
    generation       integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'suspended', 'completed', 'failed', 'cancelled')),
    input            jsonb       NOT NULL DEFAULT 'null',
    output           jsonb,
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    next_attempt_at  timestamptz,
    lease_owner      text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    wake_after       timestamptz,
    parent_name      text COLLATE "C",
    parent_id        text COLLATE "C",
    priority         integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (workflow_name, workflow_id),
    CHECK ((parent_name IS NULL) = (parent_id IS NULL))
);

-- Serves discovery (`instances_runnable`): `status = 'running' OR (status = 'suspended' AND
-- wake_after <= now)`. Partial, so terminal instances, which accumulate until retention GC,
-- cost nothing to discovery; a parked instance without a due wake_after is skipped inside the
-- index. The GC index on terminal rows comes with the GC query that needs it.
CREATE INDEX workflows_active_idx ON workflows (status, wake_after)
    WHERE status IN ('running', 'suspended');

-- The append-only log. `seq` gives a global order; per instance it is also the commit order,
-- because every writer of an instance's journal first locks its instance row.
CREATE TABLE journal (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step_name     text COLLATE "C" NOT NULL,
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    -- Exactly one record per (instance, generation, step). The index also serves loading one
    -- generation and the whole history (prefix scans) and the existence checks of appends.
    CONSTRAINT journal_step_key UNIQUE (workflow_name, workflow_id, generation, step_name),
    -- A journal row never outlives its instance; retention GC deletes the instance row only.
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Sends the wake notification of one instance on this schema's channel.
CREATE FUNCTION keiro_notify_wake(p_name text, p_id text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify(current_schema() || '.wake', p_name || '/' || p_id);
$$;

-- The step name of the next occurrence of a repeatable event (`failed`, `resurrected`) in one
-- generation: the bare name first, then `<name>/2`, `<name>/3`, ... A failure can recur after
-- a resurrection and both must stay in history, yet every row keeps a unique step name.
CREATE FUNCTION keiro_journal_repeatable_name(p_name text, p_id text, p_generation integer,
                                              p_kind text, p_base text) RETURNS text
LANGUAGE sql AS $$
    SELECT CASE WHEN count(*) = 0 THEN p_base ELSE p_base || '/' || (count(*) + 1) END
    FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id AND j.generation = p_generation
      AND j.kind = p_kind;
$$;

-- instance_start: creates the row `running`, or returns the existing one untouched.
CREATE FUNCTION keiro_instance_start(p_name text, p_id text, p_input jsonb, p_parent_name text,
                                     p_parent_id text, p_priority integer,
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

-- journal_append: appends one event and moves the instance row, under the row's lock.
--
-- `p_step`, `p_kind`, `p_payload` are the event as `Event::encode` gives it; the row change is
-- derived from them. `p_owner`/`p_epoch` are the writer's fence (NULL: unfenced), `p_renew_ms`
-- extends a fenced writer's lease. Outcomes: appended, already_present (recorded), conflict,
-- refused_terminal (marker), not_found, lease_lost.
CREATE FUNCTION keiro_journal_append(p_name text, p_id text, p_generation integer, p_step text,
                                     p_kind text, p_payload jsonb, p_owner text, p_epoch bigint,
                                     p_renew_ms bigint,
                                     OUT outcome text, OUT recorded jsonb, OUT marker text)
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

    -- A terminal row never moves again through an append. The marker that closed it is named
    -- like its status; a repeat of that marker converges on the recorded value, read from the
    -- row because a divergence failure has no journal row.
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
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    ELSIF p_kind = 'failed' THEN
        UPDATE workflows w SET
            status = 'failed', last_error = p_payload #>> '{}', completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    ELSIF p_kind = 'cancelled' THEN
        UPDATE workflows w SET
            status = 'cancelled', completed_at = now(),
            lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    ELSE -- continued: the next generation starts runnable, with its own input.
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
END;
$$;

-- instance_confirm: renews a fenced run's lease and reports the status. A terminal row
-- answers without a lease check, so a run learns it is over even after the terminal write
-- cleared its lease. Outcomes: confirmed, terminal, not_found, lease_lost.
CREATE FUNCTION keiro_instance_confirm(p_name text, p_id text, p_owner text, p_epoch bigint,
                                       p_ttl_ms bigint,
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

-- instance_park: parks a run waiting on `p_awaited`, releasing its lease and forgetting its
-- crash history (it made progress). The awaited steps are checked under the row lock that
-- every append takes first, so a wake that landed before the park keeps the row `running`
-- instead of being masked by `suspended`. Outcomes: suspended, woken, terminal, not_found,
-- lease_lost.
CREATE FUNCTION keiro_instance_park(p_name text, p_id text, p_generation integer, p_owner text,
                                    p_epoch bigint, p_awaited text[], p_wake_after timestamptz,
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
            attempts = 0, last_error = NULL, next_attempt_at = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        PERFORM keiro_notify_wake(p_name, p_id);
        outcome := 'woken';
    ELSE
        UPDATE workflows w SET
            status = 'suspended', wake_after = p_wake_after,
            lease_owner = NULL, lease_expires_at = NULL,
            attempts = 0, last_error = NULL, next_attempt_at = NULL,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        outcome := 'suspended';
    END IF;
END;
$$;

-- instance_fail_diverged: fails a run whose code no longer matches its journal, without a
-- journal row, so the very same journal can resume once fixed code is deployed and an
-- operator resurrects it. Outcomes: failed, terminal, not_found, lease_lost.
CREATE FUNCTION keiro_instance_fail_diverged(p_name text, p_id text, p_owner text,
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
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    outcome := 'failed';
END;
$$;

-- instance_claim: one conditional UPDATE takes the lease; a granted claim also returns the row
-- and the current generation's journal (as parallel arrays, in seq order), so claiming and
-- loading cost one round trip. A refused claim returns the row as it is, for the caller to
-- classify at `clock`, the instant the claim was judged at.
CREATE FUNCTION keiro_instance_claim(p_name text, p_id text, p_owner text, p_ttl_ms bigint,
                                     p_now timestamptz,
                                     OUT granted boolean, OUT clock timestamptz,
                                     OUT instance workflows,
                                     OUT journal_seq bigint[], OUT journal_step text[],
                                     OUT journal_kind text[], OUT journal_payload jsonb[],
                                     OUT journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- The database clock decides expiry unless the caller pins it.
    clock := coalesce(p_now, now());
    -- Under concurrent claims the loser re-checks this WHERE against the winner's row version
    -- and finds the lease live, so exactly one claim per expiry wins.
    UPDATE workflows w SET
        lease_owner = p_owner,
        lease_epoch = w.lease_epoch + 1,
        lease_expires_at = clock + p_ttl_ms * interval '1 millisecond',
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
      AND w.status IN ('running', 'suspended')
      AND (w.lease_expires_at IS NULL OR w.lease_expires_at < clock)
      AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= clock)
    RETURNING w.* INTO instance;
    granted := FOUND;
    IF granted THEN
        SELECT array_agg(j.seq ORDER BY j.seq), array_agg(j.step_name ORDER BY j.seq),
               array_agg(j.kind ORDER BY j.seq), array_agg(j.payload ORDER BY j.seq),
               array_agg(j.recorded_at ORDER BY j.seq)
        INTO journal_seq, journal_step, journal_kind, journal_payload, journal_recorded_at
        FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = instance.generation;
    ELSE
        SELECT w.* INTO instance FROM workflows w
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    END IF;
END;
$$;

-- instance_record_crash: counts a crash of the fenced run and releases its lease; at the
-- ceiling it fails the run, journaling the failure in the same transaction. Outcomes:
-- retrying (crash_attempts, retry_at), failed (crash_attempts), terminal, not_found,
-- lease_lost.
CREATE FUNCTION keiro_instance_record_crash(p_name text, p_id text, p_owner text,
                                            p_epoch bigint, p_error text,
                                            p_retry_delay_ms bigint, p_max_attempts integer,
                                            OUT outcome text, OUT crash_attempts integer,
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
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
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

-- instance_resurrect: the operator returns a failed instance to `running`. The failure stays
-- in history and a `resurrected` row is appended beside it. Outcomes: resurrected,
-- not_failed (row_status), not_found.
CREATE FUNCTION keiro_instance_resurrect(p_name text, p_id text,
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
    IF v_row.status <> 'failed' THEN
        outcome := 'not_failed';
        row_status := v_row.status;
        RETURN;
    END IF;
    INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
    VALUES (p_name, p_id, v_row.generation,
            keiro_journal_repeatable_name(p_name, p_id, v_row.generation, 'resurrected',
                                          '__workflow_resurrected__'),
            'resurrected', 'null'::jsonb);
    UPDATE workflows w SET
        status = 'running',
        attempts = 0, last_error = NULL, next_attempt_at = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        completed_at = NULL,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    PERFORM keiro_notify_wake(p_name, p_id);
    outcome := 'resurrected';
END;
$$;
