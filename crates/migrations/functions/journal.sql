-- The journal: the one implementation of the append rules (docs/store-contract.md,
-- `journal_append`) that every writer goes through, the names it gives repeatable events, and
-- the cascade that deletes a journal with its instance.

-- The logical step a stored step name records (`keiro_journal::logical_step`): a revised
-- `remote:`/`child:` step `<step>#<n>` reads as `<step>`; every other name as itself.
-- Called by: SQL only (keiro_journal_repeatable_name, the requeue); tested by contract::journal.
CREATE OR REPLACE FUNCTION keiro_step_logical(p_stored text) RETURNS text
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
-- Called by: SQL only (keiro_journal_repeatable_name); tested by contract::journal.
CREATE OR REPLACE FUNCTION keiro_step_revision(p_stored text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE
        WHEN keiro_step_logical(p_stored) = p_stored THEN 0
        ELSE substring(p_stored FROM '#([0-9]+)$')::integer
    END;
$$;

-- The step name of the next occurrence of a repeatable event (`failed`, `resurrected`) in one
-- generation: the bare name first, then `<name>/2`, `<name>/3`, ... A failure can recur after
-- a resurrection and both must stay in history, yet every row keeps a unique step name.
-- Called by: SQL only (the append rules, crash accounting, resurrection); tested by contract::journal.
CREATE OR REPLACE FUNCTION keiro_journal_repeatable_name(p_name text, p_id text,
                                                         p_generation integer, p_kind text,
                                                         p_base text) RETURNS text
LANGUAGE sql AS $$
    SELECT CASE WHEN count(*) = 0 THEN p_base ELSE p_base || '/' || (count(*) + 1) END
    FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id AND j.generation = p_generation
      AND j.kind = p_kind;
$$;

-- journal_append: appends one event to (p_name, p_id, generation) and moves the instance row,
-- under the row's lock. Every writer of a journal (the store's appends, every wake source, the
-- transaction step) calls it, so there is one implementation of the append rules
-- (docs/store-contract.md, `journal_append`), checked in this order: the generation, the
-- recorded step (a retry adopts the first recorded value), the terminal status, the fence (a
-- stale holder may learn a recorded value, but it may not write), then the write. A closing
-- marker delivers the instance's result to a waiting parent (`keiro_child_deliver`); the
-- `cancelled` and `continued` markers also cancel the remote tasks of the generation they
-- close (`keiro_remote_tasks_cancel`), having locked them before the instance row (the lock
-- order, sql/functions/README.md), and the awakeables are settled by a trigger (awakeable.sql).
--
-- `p_step`, `p_kind`, `p_payload` are the event as `Event::encode` gives it; the row change is
-- derived from them. `p_owner`/`p_epoch` are the writer's fence (NULL: unfenced), `p_renew_ms`
-- extends a fenced writer's lease. `appended_generation` is the generation written to (set
-- only when appended). Outcomes: appended, already_present (recorded), conflict,
-- refused_terminal (marker), not_found, lease_lost.
--
-- The fast path, for the common append (a step on the current generation of a live row, by
-- its lease holder or unfenced), is taken only when none of the earlier checks can refuse, so
-- its outcome is the one the full sequence would give:
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
-- least half a TTL of lease left, and back-to-back steps do not rewrite the instance row (a
-- new row version, its WAL, the CHECK constraints) on every step. The row stays locked to the
-- end of the transaction either way, so cancellation, terminal transitions and claims still
-- serialize with the append. A wake (a step on a `suspended` row) and an unfenced step always
-- write. Every other case takes the full sequence (the body's "checks and writes of 0002", the
-- migration that first wrote them).
--
-- A renewal counts from `clock_timestamp()`, the moment of the append, not from `now()`, the
-- start of its transaction: the same instant for the store's own one-statement transactions,
-- but a transaction step's append ends the user's transaction, which may have run for longer
-- than the lease (its instance row held by `keiro_instance_hold` meanwhile, so nobody took the
-- lease over), and the lease it renews must still run a whole TTL after the commit.
-- Called by: keiro_postgres ops::journal::journal_append (also InTransaction, transaction_step); tested by contract::journal.
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
           OR v_row.lease_expires_at
              <= clock_timestamp() + p_renew_ms * interval '750 microseconds' THEN
            -- Only unindexed columns change on a running row, so the new version can be HOT;
            -- a wake changes `status` and is indexed as it must be.
            UPDATE workflows w SET
                status = 'running',
                lease_expires_at = CASE
                    WHEN p_owner IS NOT NULL AND p_renew_ms IS NOT NULL
                        THEN clock_timestamp() + p_renew_ms * interval '1 millisecond'
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
                    THEN clock_timestamp() + p_renew_ms * interval '1 millisecond'
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
            attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
            wake_after = NULL,
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
            attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
            wake_after = NULL,
            parked_on = NULL,
            -- The next generation runs on the version of the process that continued it.
            app_version = nullif(current_setting('keiro.app_version', true), ''),
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

-- delivery_append: a delivery (`deliver`, `deliver_to`: an `await:<step>` record from outside
-- the run, unfenced) through the append rules above, bounded. The instance's generation holds
-- at most `p_unread_max` deliveries, and `p_unread_bytes_max` bytes of them, that no await has
-- read (the run reports what its awaits read before it parks: `deliveries_read` in
-- crates/postgres/src/ops/journal.rs), so names no await ever reads cannot grow a journal
-- without end. A new row past the bound is refused with nothing written (outcome `backlog`),
-- unless it answers a wait the run's last park waits on (`parked_on`; a delivery wakes a
-- parked run, so the row may be running again): the drive after that park reads it. A repeat, another generation and a closed
-- instance get the append rules' own answer and are never refused here. `p_bytes` is the
-- payload's encoded length as the caller measures it (the run measures what it reads the same
-- way). The counters describe `deliveries_generation`; on any other generation they count as
-- empty (migration 0019). Outcomes: those of keiro_journal_append_to, and backlog;
-- `unread`/`unread_bytes` are the generation's unread deliveries after the call.
-- Called by: keiro_postgres ops::journal::delivery_append (also InTransaction); tested by contract::journal.
CREATE OR REPLACE FUNCTION keiro_delivery_append(p_name text, p_id text, p_generation integer,
                                                 p_step text, p_payload jsonb, p_bytes bigint,
                                                 p_unread_max bigint, p_unread_bytes_max bigint,
                                                 OUT outcome text, OUT recorded jsonb,
                                                 OUT marker text, OUT unread bigint,
                                                 OUT unread_bytes bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row     workflows%ROWTYPE;
    v_counted boolean;
    v_fresh   boolean;
BEGIN
    -- The append below takes the same lock again; taking it first makes the count and the
    -- write one decision.
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    v_counted := v_row.deliveries_generation IS NOT DISTINCT FROM v_row.generation;
    unread := CASE WHEN v_counted
        THEN greatest(coalesce(v_row.deliveries, 0) - coalesce(v_row.deliveries_read, 0), 0)
        ELSE 0 END;
    unread_bytes := CASE WHEN v_counted
        THEN greatest(coalesce(v_row.deliveries_bytes, 0)
                      - coalesce(v_row.deliveries_read_bytes, 0), 0)
        ELSE 0 END;
    v_fresh := coalesce(p_generation, v_row.generation) = v_row.generation
        AND v_row.status IN ('running', 'suspended')
        AND NOT EXISTS (
            SELECT 1 FROM journal j
            WHERE j.workflow_name = p_name AND j.workflow_id = p_id
              AND j.generation = v_row.generation AND j.step_name = p_step);
    IF v_fresh
       AND (unread >= p_unread_max OR unread_bytes + p_bytes > p_unread_bytes_max)
       AND NOT (p_step = ANY (coalesce(v_row.parked_on, '{}')))
    THEN
        outcome := 'backlog';
        RETURN;
    END IF;
    SELECT a.outcome, a.recorded, a.marker INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, 'await', p_payload,
                                 NULL, NULL, NULL) a;
    IF v_fresh AND outcome = 'appended' THEN
        UPDATE workflows w SET
            deliveries_generation = v_row.generation,
            deliveries = CASE WHEN v_counted THEN coalesce(w.deliveries, 0) + 1 ELSE 1 END,
            deliveries_bytes = CASE WHEN v_counted
                THEN coalesce(w.deliveries_bytes, 0) + p_bytes ELSE p_bytes END,
            deliveries_read = CASE WHEN v_counted THEN w.deliveries_read END,
            deliveries_read_bytes = CASE WHEN v_counted THEN w.deliveries_read_bytes END
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        unread := unread + 1;
        unread_bytes := unread_bytes + p_bytes;
    END IF;
END;
$$;

-- Group commit: the Postgres store sends the appends that arrive while its earlier batches
-- are in flight as one call of journal_append_batch (natural batching: a lone append still
-- calls keiro_journal_append_to, so an idle store waits for nothing), in a transaction that
-- commits synchronously as any append: nobody is answered before the batch is durable. One
-- round trip, one commit and one WAL flush then serve many runs' steps.
--
-- Request i of a batch is element i of every array; one outcome row per request names it
-- (`n`, 1-based). A batch that fails as a whole (a value PostgreSQL refuses aborts the
-- statement) is sent again request by request by the store, so the refused request is refused
-- and the others land, as they would have alone.
--
-- A batch never waits long for a lock: one batch of a lane runs at a time, so a batch stuck
-- behind someone's open transaction (a `deliver_in` inside a caller's long transaction) would
-- hold up every run of the process. It takes its instance rows first, all at once, with SKIP
-- LOCKED: a request whose row another transaction holds is answered `busy` and the store sends
-- it alone, outside the lane, where it waits as a single append would. What it locks beyond
-- those rows (a completion or failure journals into the parent, whose row may be held) is
-- bounded by `lock_timeout`: a batch that waits longer fails as a whole and is sent again
-- request by request. So is one in a deadlock, which the timeout breaks before the server's
-- detector. Requests run in the order of their instance's key (the lock order, README.md);
-- the store never batches the `cancelled` and `continued` markers, which lock remote tasks
-- before the instance row.
--
-- journal_append_batch: every request as `keiro_journal_append_to` would answer it, one
-- outcome row each. The common request, a step on a live instance by its lease holder (or
-- unfenced), takes the fast path of `keiro_journal_append_to` for the whole batch at once; so does the completion of
-- such an instance (its marker row, the row `completed`, its parent told). The conditions are
-- those of `keiro_journal_append_to`, checked on the rows this batch holds locked. Every other
-- request (the other markers, other generations, stale fences, terminal rows) is a call of
-- `keiro_journal_append_to`, after the fast ones, in key order.
--
-- The store sends the requests sorted by key (byte order, as `COLLATE "C"` compares), each
-- instance once: the statement then locks the rows in key order as it reads them, with no sort
-- and no window over the requests to find repeated keys, whose plan nodes cost far more than
-- the loop that checks the order (docs/benchmarks-history.md, "Moved from the code"). A batch
-- sent otherwise, out of order or with an instance twice (an older build's store during a
-- rolling deploy), is not refused: each of its requests is a call of
-- `keiro_journal_append_to`, in key order, so each sees the ones before it.
--
-- A closing pair: a step directly followed by the completion of the same instance, with the
-- same generation and fence (a run's last step and its completion, sent as one request by the
-- store's `journal_append_closing`). The order check lets such a pair through, each instance
-- still once otherwise. Both rows of the pair lock the same instance row, so they class alike:
-- both fast (the step journaled, the completion closing the row, which the step then leaves
-- alone), both busy, or both slow. A slow pair's completion is tried only once its step
-- recorded its own value (`appended`, or `already_present` with an equal one), else answered
-- `skipped`: the run behind it has already gone on with that value, so its output must not
-- close a journal that holds another. A fast pair's step that was recorded already raises the
-- unique index like any fast step, and the store then sends the pair alone.
--
-- A common batch is two statements, whatever its length (each statement's set-up, its
-- executor and the arrays it unnests, costs about as much as a few rows):
--   1. lock the instance rows in key order, class each request, and journal the fast ones:
--      one statement, whose INSERT reads the classes from the same locked rows;
--   2. the answers.
-- A third, the UPDATE of the rows that close, wake or renew their lease, runs only when a
-- request does one of those (a batch of steps on running rows changes no instance row).
--
-- The journal INSERT has no ON CONFLICT: a fast request's row is locked by this batch, and
-- every writer of an instance's journal holds its row, so its step can only be recorded
-- already if it was recorded before (a writer that raced this one and lost the lease, or an
-- append sent again after its commit was lost). The unique index then raises, the batch fails
-- as a whole, and the store sends each request alone, where that one is answered
-- `already_present` (or `conflict`) as always, and the common batch pays no speculative
-- insertion (a pre-check and a second WAL record per row); figures in
-- docs/benchmarks-history.md, "Moved from the code".
-- Called by: keiro_postgres ops::journal::journal_append_batch; tested by contract::journal.
CREATE OR REPLACE FUNCTION keiro_journal_append_batch(
    p_names text[], p_ids text[], p_generations integer[], p_steps text[], p_kinds text[],
    p_payloads jsonb[], p_owners text[], p_epochs bigint[], p_renew_ms bigint[])
RETURNS TABLE (n integer, outcome text, recorded jsonb, marker text)
-- Generic plans, index-driven (as the park batch in remote.sql): a plan cached while the table
-- was small would scan it whole for as long as the connection lives.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET lock_timeout = '100ms'
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i             integer;
    -- Indexed by request: the generation of its instance, and its class:
    --   0 busy: its row is held by another transaction (the store sends it alone);
    --   1 slow: a call of `keiro_journal_append_to` after the fast ones;
    --   2 a step, its row left as it is;
    --   3 a step that renews its lease (due within the quarter of the TTL that has run);
    --   4 a step that wakes its suspended row;
    --   5 a completion; 6 a completion of a child, whose parent is then told.
    -- Classes 2 to 6 are journaled by statement 1; 3 to 6 change their row.
    v_generations integer[];
    v_class       integer[];
    v_slow        integer[];
    v_row         workflows%ROWTYPE;
    -- Indexed by request: whether it is the completion of a closing pair (see above).
    v_closes      boolean[] := '{}';
    v_pairs       boolean := false;
    v_prev        integer;
    v_recorded_ok boolean;
    v_outcome     text;
    v_recorded    jsonb;
    v_marker      text;
BEGIN
    -- 0. Sorted by key, each instance once (or as a closing pair)? Otherwise every request
    -- goes alone, in key order.
    FOR k IN 2 .. coalesce(array_length(p_names, 1), 0) LOOP
        IF (p_names[k] COLLATE "C", p_ids[k] COLLATE "C") <= (p_names[k - 1], p_ids[k - 1]) THEN
            IF (p_names[k], p_ids[k]) = (p_names[k - 1], p_ids[k - 1])
               AND p_kinds[k] = 'completed'
               AND p_kinds[k - 1] NOT IN ('completed', 'failed', 'cancelled', 'continued')
               AND NOT coalesce(v_closes[k - 1], false)
               AND p_generations[k] IS NOT DISTINCT FROM p_generations[k - 1]
               AND p_owners[k] IS NOT DISTINCT FROM p_owners[k - 1]
               AND p_epochs[k] IS NOT DISTINCT FROM p_epochs[k - 1]
            THEN
                v_closes[k] := true;
                v_pairs := true;
            ELSIF v_slow IS NULL THEN
                SELECT array_agg(u.n ORDER BY u.name COLLATE "C", u.id COLLATE "C", u.n)
                INTO v_slow
                FROM unnest(p_names, p_ids) WITH ORDINALITY AS u (name, id, n);
            END IF;
        END IF;
    END LOOP;

    IF v_slow IS NULL THEN
        -- 1. Each request's row locked in the requests' order, which is the key order (a nested
        -- loop over the unnested arrays keeps it). A row another transaction holds reads as
        -- missing (SKIP LOCKED): its request is `busy`, and the store sends it alone, where it
        -- waits as a single append would. `fast` is the entry condition of
        -- `keiro_journal_append_to`'s fast path (a step), or of its plain close of a live row (a
        -- completion). The INSERT runs once the rows are locked: it reads the classes from `c`,
        -- which locks as it is read. A closing pair's step changes no row: its completion
        -- closes it.
        WITH c AS (
            SELECT r.n, r.name, r.id, w.generation,
                   CASE
                       WHEN w.status IS NULL THEN 0
                       WHEN NOT f.fast THEN 1
                       WHEN r.kind = 'completed' THEN
                           CASE WHEN w.parent_step IS NULL THEN 5 ELSE 6 END
                       WHEN v_pairs AND coalesce(v_closes[r.n + 1], false) THEN 2
                       WHEN w.status = 'suspended' THEN 4
                       WHEN r.owner IS NULL OR r.renew_ms IS NULL OR w.lease_expires_at IS NULL
                            OR w.lease_expires_at
                               <= now() + r.renew_ms * interval '750 microseconds'
                           THEN 3
                       ELSE 2
                   END AS class
            FROM unnest(p_names, p_ids, p_generations, p_kinds, p_owners, p_epochs, p_renew_ms)
                 WITH ORDINALITY AS r (name, id, generation, kind, owner, epoch, renew_ms, n)
            LEFT JOIN LATERAL (
                SELECT y.generation, y.status, y.lease_owner, y.lease_epoch, y.lease_expires_at,
                       y.parent_step
                FROM workflows y WHERE y.workflow_name = r.name AND y.workflow_id = r.id
                FOR UPDATE SKIP LOCKED) w ON true
            CROSS JOIN LATERAL (
                SELECT coalesce(r.kind NOT IN ('failed', 'cancelled', 'continued')
                                AND coalesce(r.generation, w.generation) = w.generation
                                AND w.status IN ('running', 'suspended')
                                AND (r.owner IS NULL
                                     OR (w.lease_owner = r.owner AND w.lease_epoch = r.epoch)),
                                false) AS fast) f
        ), journaled AS (
            INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
            SELECT c.name, c.id, c.generation, p_steps[c.n], p_kinds[c.n], p_payloads[c.n]
            FROM c WHERE c.class >= 2 -- in `c`'s order, the requests': a pair's step first
        )
        SELECT array_agg(c.generation ORDER BY c.n), array_agg(c.class ORDER BY c.n),
               coalesce(array_agg(c.n ORDER BY c.n) FILTER (WHERE c.class = 1), '{}')
        INTO v_generations, v_class, v_slow
        FROM c;
        -- A closing pair's two rows lock one instance row, so they class alike, but for a row
        -- another transaction let go between the two: its step busy, its completion journaled.
        -- The batch is then undone whole, and the store sends each request alone.
        IF v_pairs THEN
            FOR k IN 2 .. array_length(v_class, 1) LOOP
                IF v_closes[k] AND least(v_class[k - 1], 2) <> least(v_class[k], 2) THEN
                    RAISE EXCEPTION 'closing pair of %/% split: classes % and %',
                        p_names[k], p_ids[k], v_class[k - 1], v_class[k];
                END IF;
            END LOOP;
        END IF;

        -- The rows that change: a completion closes its row (as `keiro_journal_append_to`), a
        -- journaled step wakes its row or renews a lease that is due (as 0004: only unindexed
        -- columns change on a running row, so that version can be HOT). Then each completed
        -- child tells its parent, in key order (the parent's row is locked after the child's).
        IF v_class && '{3,4,5,6}'::integer[] THEN
            UPDATE workflows w SET
                status = CASE WHEN r.kind = 'completed' THEN 'completed' ELSE 'running' END,
                output = CASE WHEN r.kind = 'completed' THEN r.payload ELSE w.output END,
                completed_at = CASE WHEN r.kind = 'completed' THEN now() ELSE w.completed_at END,
                lease_owner = CASE WHEN r.kind = 'completed' THEN NULL ELSE w.lease_owner END,
                lease_expires_at = CASE
                    WHEN r.kind = 'completed' THEN NULL
                    WHEN r.owner IS NOT NULL AND r.renew_ms IS NOT NULL
                        THEN now() + r.renew_ms * interval '1 millisecond'
                    ELSE w.lease_expires_at
                END,
                attempts = CASE WHEN r.kind = 'completed' THEN 0 ELSE w.attempts END,
                open_refusals = CASE WHEN r.kind = 'completed' THEN 0 ELSE w.open_refusals END,
                last_error = CASE WHEN r.kind = 'completed' THEN NULL ELSE w.last_error END,
                next_attempt_at = CASE WHEN r.kind = 'completed' THEN NULL
                                       ELSE w.next_attempt_at END,
                wake_after = CASE WHEN r.kind = 'completed' THEN NULL ELSE w.wake_after END,
                updated_at = now()
            FROM unnest(p_names, p_ids, p_kinds, p_payloads, p_owners, p_renew_ms)
                 WITH ORDINALITY AS r (name, id, kind, payload, owner, renew_ms, n)
            WHERE v_class[r.n] >= 3
              AND w.workflow_name = r.name AND w.workflow_id = r.id;
            IF v_class && '{6}'::integer[] THEN
                FOR v_row IN
                    SELECT w.* FROM unnest(p_names, p_ids) WITH ORDINALITY AS r (name, id, n)
                    CROSS JOIN LATERAL (
                        SELECT y.* FROM workflows y
                        WHERE y.workflow_name = r.name AND y.workflow_id = r.id OFFSET 0) w
                    WHERE v_class[r.n] = 6
                    ORDER BY r.name COLLATE "C", r.id COLLATE "C"
                LOOP
                    PERFORM keiro_child_deliver(v_row);
                END LOOP;
            END IF;
            -- One notification for the rows the batch woke: a listener only learns that some
            -- instance became runnable (the key in the payload is not used to pick it).
            i := array_position(v_class, 4);
            IF i IS NOT NULL THEN
                PERFORM keiro_notify_wake(p_names[i], p_ids[i]);
            END IF;
        END IF;

        -- 2. The answers: journaled, busy; then every other request, alone, in key order.
        RETURN QUERY
        SELECT c.n::integer, CASE WHEN c.class = 0 THEN 'busy' ELSE 'appended' END, NULL::jsonb,
               NULL::text
        FROM unnest(v_class) WITH ORDINALITY AS c (class, n)
        WHERE c.class <> 1;
    END IF;
    FOREACH i IN ARRAY v_slow LOOP
        IF v_pairs AND coalesce(v_closes[i], false) AND v_prev = i - 1
           AND NOT v_recorded_ok
        THEN
            RETURN QUERY SELECT i, 'skipped'::text, NULL::jsonb, NULL::text;
        ELSE
            SELECT a.outcome, a.recorded, a.marker INTO v_outcome, v_recorded, v_marker
            FROM keiro_journal_append_to(p_names[i], p_ids[i], p_generations[i], p_steps[i],
                                         p_kinds[i], p_payloads[i], p_owners[i], p_epochs[i],
                                         p_renew_ms[i]) a;
            RETURN QUERY SELECT i, v_outcome, v_recorded, v_marker;
            v_recorded_ok := v_outcome = 'appended'
                OR (v_outcome = 'already_present' AND v_recorded = p_payloads[i]);
        END IF;
        v_prev := i;
    END LOOP;
END;
$$;

-- journal_append_steps: the common batch of `keiro_journal_append_batch` in one statement, for
-- batches that hold steps only (no marker, no closing pair): each step on a running row by its
-- lease holder, whose lease is not due for renewal, is journaled, and the row is left as it is
-- (`appended`); a step whose row another transaction holds is `busy`; every other step (a
-- parked row to wake, a lease due, an unfenced step, another generation, a stale fence, a
-- terminal or missing row) is `slow`, and nothing of it is written. The store sends the busy
-- and the slow ones alone afterwards, as `keiro_journal_append_to` calls, which answer and
-- write each as it always does.
--
-- Why a second function: at 100 steps a run, nearly every batch is steps on running rows, and
-- `keiro_journal_append_batch` pays for what such a batch never uses (its order check, a
-- second statement for the answers, the branches after them): 14 % of a 16-step batch's
-- instructions (docs/benchmarks-history.md, "Issue 39, stop 58").
--
-- The order of the requests does not matter here: rows are locked with SKIP LOCKED, nothing
-- waits for a row, and no other row is written. An instance named twice is locked once and
-- both its steps journaled in request order (distinct steps of one run) or, for the same step,
-- the unique index raises and the store sends each request alone. The journal INSERT has no ON
-- CONFLICT, for the reason `keiro_journal_append_batch` gives.
-- Called by: keiro_postgres ops::journal::journal_append_steps; tested by contract::journal, postgres::append_steps and postgres::group_commit.
CREATE OR REPLACE FUNCTION keiro_journal_append_steps(
    p_names text[], p_ids text[], p_generations integer[], p_steps text[], p_kinds text[],
    p_payloads jsonb[], p_owners text[], p_epochs bigint[], p_renew_ms bigint[])
RETURNS TABLE (n integer, outcome text)
-- As keiro_journal_append_batch's.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET lock_timeout = '100ms'
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        -- The class of each request: 0 busy, 1 slow, 2 journaled.
        SELECT r.n, r.name, r.id, w.generation,
               CASE
                   WHEN w.status IS NULL THEN 0
                   WHEN r.kind IN ('completed', 'failed', 'cancelled', 'continued')
                        OR coalesce(r.generation, w.generation) <> w.generation
                        OR w.status <> 'running'
                        OR r.owner IS NULL OR r.renew_ms IS NULL
                        OR w.lease_owner IS DISTINCT FROM r.owner
                        OR w.lease_epoch IS DISTINCT FROM r.epoch
                        OR w.lease_expires_at IS NULL
                        OR w.lease_expires_at <= now() + r.renew_ms * interval '750 microseconds'
                       THEN 1
                   ELSE 2
               END AS class
        FROM unnest(p_names, p_ids, p_generations, p_kinds, p_owners, p_epochs, p_renew_ms)
             WITH ORDINALITY AS r (name, id, generation, kind, owner, epoch, renew_ms, n)
        LEFT JOIN LATERAL (
            SELECT y.generation, y.status, y.lease_owner, y.lease_epoch, y.lease_expires_at
            FROM workflows y WHERE y.workflow_name = r.name AND y.workflow_id = r.id
            FOR UPDATE SKIP LOCKED) w ON true
    ), journaled AS (
        INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
        SELECT c.name, c.id, c.generation, p_steps[c.n], p_kinds[c.n], p_payloads[c.n]
        FROM c WHERE c.class = 2 -- in `c`'s order, the requests'
    )
    SELECT c.n::integer, CASE c.class WHEN 0 THEN 'busy' WHEN 1 THEN 'slow' ELSE 'appended' END
    FROM c;
END;
$$;

-- The first form of journal_append, kept for statements prepared against it by older builds
-- (same signature and outcomes). The store calls `keiro_journal_append_to` directly: this
-- LANGUAGE sql wrapper returning a record cannot be inlined, so it is parsed and planned again
-- on every call.
-- Called by: no current build (kept for statements older builds prepared); tested by contract::journal.
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

-- The journal has no foreign key to `workflows`: its check would cost an index probe and an
-- after-trigger on every journal row, although every writer of the journal already holds the
-- instance row's lock and has just read it. This statement trigger keeps the cascade (a
-- retention GC that deletes many instances deletes their journals in one statement), so a
-- journal still never outlives its instance.
-- Called by: trigger workflows_delete_journal; tested by contract::retention.
CREATE OR REPLACE FUNCTION keiro_journal_delete_with_instances() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Served by the journal's unique index (its (name, id) prefix).
    DELETE FROM journal j USING deleted d
    WHERE j.workflow_name = d.workflow_name AND j.workflow_id = d.workflow_id;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER workflows_delete_journal AFTER DELETE ON workflows
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION keiro_journal_delete_with_instances();
