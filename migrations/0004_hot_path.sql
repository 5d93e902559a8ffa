-- keiro 0004: a cheaper hot path (step appends, claims), same outcomes.
--
-- Measured with `keiro bench` on a 2-core machine where Postgres shares the cores with the
-- worker: the database's CPU per workflow decides throughput, so every statement a hot
-- function runs counts. What changes, and why:
--
-- * `keiro_journal_append_to` gets a fast path for the common append (a step on the current
--   generation of a live row, by its lease holder or unfenced): the recorded-step check is the
--   INSERT's own `ON CONFLICT` probe of the unique index instead of a SELECT before it, and a
--   running row is not rewritten while its lease is fresh (see the function). Every other case
--   takes the 0002 path, unchanged.
-- * The journal no longer has a foreign key to `workflows`: its check cost an index probe and
--   an after-trigger on every journal row, although every writer of the journal already holds
--   the instance row's lock and has just read it. A statement trigger keeps the cascade: a
--   journal still never outlives its instance.
-- * `keiro_instance_claim` and `keiro_instances_claim_batch` aggregate a claimed journal in one
--   pass instead of sorting it once per returned array; the store orders the entries by `seq`
--   itself. The batch claim becomes plpgsql, so its statement is planned once per connection:
--   a LANGUAGE sql function whose body has a data-modifying CTE is never inlined, so it was
--   parsed and planned again on every call.
-- * The store calls `keiro_journal_append_to` directly. `keiro_journal_append`, a LANGUAGE sql
--   wrapper returning a record, cannot be inlined either, and parsing and planning it on every
--   call cost about as much as the append itself; it stays for statements prepared against it.

-- journal_append's rules (docs/store-contract.md), under the instance row's lock, in the order
-- 0002 checks them. The fast path below is taken only when none of the earlier checks can
-- refuse (same generation, live row, fence matching), so its outcome is the one the full
-- sequence would give:
--   * generation check: passes (the generation is the row's);
--   * recorded step: the INSERT finds it as an `ON CONFLICT` (every writer of this instance's
--     journal holds the row lock, so no concurrent insert can race it, and the conflicting row
--     is committed, hence visible to the next statement) -> already_present / conflict;
--   * terminal, fence: pass by the entry condition;
--   * write: the journal row, then the row change.
-- The row change of a step on a `running` row only renews the lease and touches updated_at.
-- The renewal exists to keep the lease alive, so a fenced step skips it while the lease still
-- has more than three quarters of `p_renew_ms` left (it was granted or renewed less than a
-- quarter of that TTL ago). A run trusts a confirmation for a quarter of its TTL before it
-- confirms explicitly (`RunOptions::confirm_after`), so a fresh action still starts with at
-- least half a TTL of lease left, and back-to-back steps no longer rewrite the instance row
-- (a new row version, its WAL, the CHECK constraints) on every step. The row stays locked to
-- the end of the transaction either way, so cancellation, terminal transitions and claims
-- still serialize with the append. A wake (a step on a `suspended` row) and an unfenced step
-- always write, as before.
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

-- The journal's foreign key goes; its cascade stays, as a statement trigger on the instance
-- rows (a retention GC that deletes many instances deletes their journals in one statement).
-- Nothing inserts a journal row without holding its instance row's lock: every writer goes
-- through the functions of these migrations, which lock and read the row first.
ALTER TABLE journal DROP CONSTRAINT journal_workflow_name_workflow_id_fkey;

CREATE FUNCTION keiro_journal_delete_with_instances() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Served by the journal's unique index (its (name, id) prefix).
    DELETE FROM journal j USING deleted d
    WHERE j.workflow_name = d.workflow_name AND j.workflow_id = d.workflow_id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER workflows_delete_journal AFTER DELETE ON workflows
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION keiro_journal_delete_with_instances();

-- instance_claim, as in 0001, with the journal aggregated in one pass: all five arrays come
-- from the same rows in the same order, so they stay parallel, and the store sorts the
-- entries by `seq` (one ORDER BY per array meant five sorts per claim).
CREATE OR REPLACE FUNCTION keiro_instance_claim(p_name text, p_id text, p_owner text,
                                                p_ttl_ms bigint, p_now timestamptz,
                                                OUT granted boolean, OUT clock timestamptz,
                                                OUT instance workflows,
                                                OUT journal_seq bigint[],
                                                OUT journal_step text[],
                                                OUT journal_kind text[],
                                                OUT journal_payload jsonb[],
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
        SELECT array_agg(j.seq), array_agg(j.step_name), array_agg(j.kind),
               array_agg(j.payload), array_agg(j.recorded_at)
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

-- instances_claim_batch, as in 0003 (same picks, same order, same claim), in plpgsql so the
-- statement's plan is cached, with each journal aggregated in one pass (see above).
CREATE OR REPLACE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text,
                                                       p_ttl_ms bigint, p_limit integer,
                                                       p_now timestamptz)
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH picked AS (
        SELECT w.workflow_name, w.workflow_id
        FROM workflows w
        -- Both discovery arms stated positively, as in INSTANCES_RUNNABLE, so the partial
        -- index workflows_active_idx serves them.
        WHERE (w.status = 'running'
               OR (w.status = 'suspended' AND w.wake_after IS NOT NULL
                   AND w.wake_after <= coalesce(p_now, now())))
          AND w.workflow_name = ANY (p_names)
          AND (w.lease_expires_at IS NULL OR w.lease_expires_at < coalesce(p_now, now()))
          AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= coalesce(p_now, now()))
        ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE workflows w SET
            lease_owner = p_owner,
            lease_epoch = w.lease_epoch + 1,
            lease_expires_at = coalesce(p_now, now()) + p_ttl_ms * interval '1 millisecond',
            updated_at = now()
        FROM picked p
        WHERE w.workflow_name = p.workflow_name AND w.workflow_id = p.workflow_id
        RETURNING w.*
    )
    SELECT ROW(c.*)::workflows,
           j.seqs, j.steps, j.kinds, j.payloads, j.recorded
    FROM claimed c
    LEFT JOIN LATERAL (
        SELECT array_agg(jr.seq) AS seqs, array_agg(jr.step_name) AS steps,
               array_agg(jr.kind) AS kinds, array_agg(jr.payload) AS payloads,
               array_agg(jr.recorded_at) AS recorded
        FROM journal jr
        WHERE jr.workflow_name = c.workflow_name AND jr.workflow_id = c.workflow_id
          AND jr.generation = c.generation
    ) j ON true
    ORDER BY c.priority DESC, c.created_at, c.workflow_name, c.workflow_id;
END;
$$;
