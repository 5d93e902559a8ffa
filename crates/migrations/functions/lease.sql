-- Leases and crash accounting (keiro-lease's `LeaseStore`): the claim of one instance, the
-- batch claim of a worker, the crash count of a fenced run, the hand-back of a run its worker
-- could not open, and the operator's resurrection.

-- instance_claim: one conditional UPDATE takes the lease; a granted claim also returns the row
-- and the current generation's journal (as parallel arrays), so claiming and loading cost one
-- round trip. The journal is aggregated in one pass: all five arrays come from the same rows
-- in the same order, so they stay parallel, and the store sorts the entries by `seq` (one
-- ORDER BY per array would be five sorts per claim). A refused claim returns the row as it is,
-- for the caller to classify at `clock`, the instant the claim was judged at. Only a run of a
-- version in `p_versions` is claimed (NULL: any; '' stands for the unversioned runs; 0025).
-- Called by: keiro_postgres ops::lease::instance_claim; tested by contract::lease and contract::versions.
CREATE OR REPLACE FUNCTION keiro_instance_claim(p_name text, p_id text, p_owner text,
                                                p_ttl_ms bigint, p_now timestamptz,
                                                p_versions text[],
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
        -- A debounced run takes no more pushes once claimed (0021).
        debounce_key = NULL,
        lease_expires_at = clock + p_ttl_ms * interval '1 millisecond',
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
      AND w.status IN ('running', 'suspended')
      AND (w.lease_expires_at IS NULL OR w.lease_expires_at < clock)
      AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= clock)
      -- A run on a queue is claimed here only while it holds its slot (queue.sql).
      AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL))
      -- Only a run of a version the claimer serves (NULL: any; '' stands for an unversioned run).
      AND (p_versions IS NULL OR coalesce(w.app_version, '') = ANY (p_versions))
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

-- instance_claim without versions: any version's run, as before versions existed (the
-- signature the builds before them call).
-- Called by: SQL only (builds before versions); tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instance_claim(p_name text, p_id text, p_owner text,
                                                p_ttl_ms bigint, p_now timestamptz,
                                                OUT granted boolean, OUT clock timestamptz,
                                                OUT instance workflows,
                                                OUT journal_seq bigint[],
                                                OUT journal_step text[],
                                                OUT journal_kind text[],
                                                OUT journal_payload jsonb[],
                                                OUT journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
    SELECT * FROM keiro_instance_claim(p_name, p_id, p_owner, p_ttl_ms, p_now, NULL::text[]);
$$;

-- instance_start_claimed: direct execution (`Worker::run_workflow`) starts an instance already
-- leased to its caller, who drives the run at once. Through `keiro_instance_start` and then
-- `keiro_instance_claim` that costs two transactions, and the start's NOTIFY wakes every worker
-- for a run none of them may take; this does both in one statement and notifies nobody:
--
-- * a new row is inserted with the caller's lease already on it (epoch 1, as the first claim of
--   a fresh row would mint), so from its first committed moment the instance is leased and no
--   worker can claim it before its lease expires; a caller that dies leaves an instance the
--   resume worker recovers at expiry like any other;
-- * an existing row keeps its input (the start is idempotent by key, as `keiro_instance_start`)
--   and is claimed only when a worker could claim it now: running, or suspended with a due
--   `wake_after` (the discovery predicate, not `keiro_instance_claim`'s wider one: a direct
--   caller has no business re-driving a run parked on a wake that has not come), lease free or
--   expired, backoff gate open. The claim is `keiro_instance_claim`'s update, with the journal
--   aggregated the same way. Otherwise the row is returned as it is, for the caller to classify
--   the refusal at `clock` and await the instance.
--
-- No NOTIFY on create, unlike `keiro_instance_start`: nobody but the caller may advance the run
-- while its lease lives, and a notifying commit holds the NOTIFY queue's lock across its WAL
-- flush, which serializes concurrent starts.
-- Called by: keiro_postgres ops::lease::instance_start_claimed; tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instance_start_claimed(p_name text, p_id text, p_input jsonb,
                                                        p_parent_name text, p_parent_id text,
                                                        p_priority integer, p_owner text,
                                                        p_ttl_ms bigint, p_now timestamptz,
                                                        OUT created boolean,
                                                        OUT granted boolean,
                                                        OUT clock timestamptz,
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
    INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                priority, lease_owner, lease_epoch, lease_expires_at)
    VALUES (p_name, p_id, p_input, p_parent_name, p_parent_id, p_priority, p_owner, 1,
            clock + p_ttl_ms * interval '1 millisecond')
    ON CONFLICT (workflow_name, workflow_id) DO NOTHING
    RETURNING w.* INTO instance;
    created := FOUND;
    IF created THEN
        -- A fresh row has no journal.
        granted := true;
        RETURN;
    END IF;
    -- A separate statement takes a fresh snapshot, so it sees the row a concurrent start
    -- committed after this statement's INSERT began. Under concurrent claims the loser
    -- re-checks this WHERE against the winner's row version and finds the lease live.
    UPDATE workflows w SET
        lease_owner = p_owner,
        lease_epoch = w.lease_epoch + 1,
        -- A debounced run takes no more pushes once claimed (0021).
        debounce_key = NULL,
        lease_expires_at = clock + p_ttl_ms * interval '1 millisecond',
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
      AND (w.status = 'running'
           OR (w.status = 'suspended' AND w.wake_after IS NOT NULL AND w.wake_after <= clock))
      AND (w.lease_expires_at IS NULL OR w.lease_expires_at < clock)
      AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= clock)
      -- A run on a queue is claimed here only while it holds its slot (queue.sql).
      AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL))
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

-- instances_start_claimed: what `keiro_instance_start_claimed` does for each request, one row
-- each (the request's position `n`, then its outcome columns), in one transaction: the direct
-- start lane's batches (concurrent `Worker::run_workflow` calls, natural batching as for
-- appends in journal.sql). One INSERT creates every new key of the batch with its caller's
-- lease, in key order (the lock order); the other requests (a key that exists, or the second
-- request for a key) are `keiro_instance_start_claimed` calls, in key order after it, so a
-- second caller of one key finds the first one's live lease, as it would alone. A key another
-- transaction is inserting makes the INSERT wait for it at most `lock_timeout` (then the store
-- sends the batch's requests one by one). No NOTIFY, as alone.
-- Called by: keiro_postgres ops::lease::instances_start_claimed; tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instances_start_claimed(
    p_names text[], p_ids text[], p_inputs jsonb[], p_parent_names text[], p_parent_ids text[],
    p_priorities integer[], p_owners text[], p_ttl_ms bigint[], p_nows timestamptz[])
RETURNS TABLE (n integer, created boolean, granted boolean, clock timestamptz,
               instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[], journal_recorded_at timestamptz[])
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET lock_timeout = '100ms'
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i         integer;
    v_created integer[];
BEGIN
    WITH requests AS (
        SELECT DISTINCT ON (r.name COLLATE "C", r.id COLLATE "C") r.*
        FROM unnest(p_names, p_ids, p_inputs, p_parent_names, p_parent_ids, p_priorities,
                    p_owners, p_ttl_ms, p_nows)
             WITH ORDINALITY AS r (name, id, input, parent_name, parent_id, priority, owner,
                                   ttl_ms, clock, n)
        ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
    ), inserted AS (
        INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                    priority, lease_owner, lease_epoch, lease_expires_at)
        SELECT r.name, r.id, r.input, r.parent_name, r.parent_id, r.priority, r.owner, 1,
               coalesce(r.clock, now()) + r.ttl_ms * interval '1 millisecond'
        FROM requests r
        ORDER BY r.name COLLATE "C", r.id COLLATE "C"
        ON CONFLICT (workflow_name, workflow_id) DO NOTHING
        RETURNING w.workflow_name, w.workflow_id
    )
    SELECT coalesce(array_agg(r.n), '{}') INTO v_created
    FROM requests r
    JOIN inserted x ON x.workflow_name = r.name AND x.workflow_id = r.id;

    -- A fresh row has no journal.
    RETURN QUERY
    SELECT k::integer, true, true, coalesce(p_nows[k], now()),
           (SELECT w FROM workflows w
            WHERE w.workflow_name = p_names[k] AND w.workflow_id = p_ids[k]),
           NULL::bigint[], NULL::text[], NULL::text[], NULL::jsonb[], NULL::timestamptz[]
    FROM unnest(v_created) AS k;

    FOR i IN
        SELECT r.n FROM unnest(p_names, p_ids) WITH ORDINALITY AS r (name, id, n)
        WHERE NOT r.n = ANY (v_created)
        ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
    LOOP
        RETURN QUERY
        SELECT i, c.created, c.granted, c.clock, c.instance, c.journal_seq, c.journal_step,
               c.journal_kind, c.journal_payload, c.journal_recorded_at
        FROM keiro_instance_start_claimed(p_names[i], p_ids[i], p_inputs[i], p_parent_names[i],
                                          p_parent_ids[i], p_priorities[i], p_owners[i],
                                          p_ttl_ms[i], p_nows[i]) c;
    END LOOP;
END;
$$;

-- instances_claim_batch: discovers and claims up to `p_limit` runnable instances of the
-- workflow names the caller has registered, in one round trip: rows whose lease is free or
-- expired and whose backoff gate is open, leased to `p_owner` with a fresh epoch, in claim
-- order (priority, then age), each with its journal aggregated in one pass as in
-- `keiro_instance_claim`.
--
-- FOR UPDATE SKIP LOCKED: two workers claiming at once each take different rows instead of
-- queueing behind each other's row locks; a row another transaction holds is simply left for
-- the next pass. The WHERE clause is re-checked after the lock, so a row whose lease was taken
-- in between is skipped, never claimed twice.
--
-- The two discovery arms are claimed separately, each in claim order with its own LIMIT, so a
-- claim stops after `p_limit` rows instead of sorting the whole backlog: running rows through
-- workflows_running_claim_idx in that order (the scan stops after `p_limit` rows it could
-- lock; a leased row costs one heap visit and is passed over), due suspended rows through
-- workflows_active_idx (they are few: only those whose deadline passed). The union's first
-- `p_limit` in claim order are the batch: the same rows, in the same order, as one sort over
-- both arms would give. Rows of the other arm locked beyond the batch are not updated and
-- their locks go with the commit; a concurrent claimer only skips them meanwhile. plpgsql, so
-- the statement's plan is cached (a LANGUAGE sql function whose body has a data-modifying CTE
-- is never inlined, so it would be planned again on every call).
--
-- The journals are read by a second statement, after the claim. FOR UPDATE locks the newest
-- version of a row, re-checking the WHERE clause on it, when another transaction changed the
-- row after this statement's snapshot was taken: a claim that started before another worker
-- claimed a row, ran a step, parked and was woken can still take the row once it is claimable
-- again, and a journal read in the claim's own statement would be that old snapshot's, without
-- the step, which the run would then run again. The second statement's snapshot is taken after the locks:
-- every append to these rows committed before it, and none can commit before this transaction.
--
-- Only runs of the versions in `p_versions` are claimed (NULL: any; '' stands for the
-- unversioned runs; 0025): the claim order's walk passes over the others as over leased rows.
-- A run on a queue is claimed here while it holds its slot, or when it is free (its queue
-- counts nothing; 0027) and its queue is one of `p_queues`, the queues the claimer serves;
-- the walk passes over free runs of other queues as over leased rows.
-- Called by: SQL only (keiro_instances_claim_batch, keiro_instances_claim_and_admit); tested by contract::lease, contract::queue and contract::versions.
CREATE OR REPLACE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text,
                                                       p_ttl_ms bigint, p_limit integer,
                                                       p_now timestamptz, p_versions text[],
                                                       p_queues text[])
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_claimed workflows[];
BEGIN
    -- Two statements, so each keeps a cached plan of its own: the claim of any version is the
    -- statement as it was before versions, and a filter on a parameter that may be NULL would
    -- make the generic plan of both guess at its selectivity.
    IF p_versions IS NULL THEN
        WITH running AS (
            SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
            FROM workflows w
            WHERE w.status = 'running'
              AND w.workflow_name = ANY (p_names)
              AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
              AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
              AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL)
                   OR (w.queue_free AND w.queue = ANY (p_queues)))
            ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
            FROM workflows w
            WHERE w.status = 'suspended' AND w.wake_after IS NOT NULL AND w.wake_after <= v_now
              AND w.workflow_name = ANY (p_names)
              AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
              AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
              AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL)
                   OR (w.queue_free AND w.queue = ANY (p_queues)))
            ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT a.workflow_name, a.workflow_id
            FROM (SELECT * FROM running UNION ALL SELECT * FROM due) a
            ORDER BY a.priority DESC, a.created_at, a.workflow_name, a.workflow_id
            LIMIT greatest(p_limit, 0)
        ), claimed AS (
            UPDATE workflows w SET
                lease_owner = p_owner,
                lease_epoch = w.lease_epoch + 1,
                -- A debounced run takes no more pushes once claimed (0021).
                debounce_key = NULL,
                lease_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                updated_at = now()
            FROM picked p
            WHERE w.workflow_name = p.workflow_name AND w.workflow_id = p.workflow_id
            RETURNING w.*
        )
        SELECT array_agg(ROW(c.*)::workflows
                         ORDER BY c.priority DESC, c.created_at, c.workflow_name, c.workflow_id)
        INTO v_claimed
        FROM claimed c;
    ELSE
        WITH running AS (
            SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
            FROM workflows w
            WHERE w.status = 'running'
              AND w.workflow_name = ANY (p_names)
              AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
              AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
              AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL)
                   OR (w.queue_free AND w.queue = ANY (p_queues)))
              AND coalesce(w.app_version, '') = ANY (p_versions)
            ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
            FROM workflows w
            WHERE w.status = 'suspended' AND w.wake_after IS NOT NULL AND w.wake_after <= v_now
              AND w.workflow_name = ANY (p_names)
              AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
              AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
              AND (w.queue IS NULL OR (w.queue_admitted AND w.lease_expires_at IS NULL)
                   OR (w.queue_free AND w.queue = ANY (p_queues)))
              AND coalesce(w.app_version, '') = ANY (p_versions)
            ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
            LIMIT greatest(p_limit, 0)
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT a.workflow_name, a.workflow_id
            FROM (SELECT * FROM running UNION ALL SELECT * FROM due) a
            ORDER BY a.priority DESC, a.created_at, a.workflow_name, a.workflow_id
            LIMIT greatest(p_limit, 0)
        ), claimed AS (
            UPDATE workflows w SET
                lease_owner = p_owner,
                lease_epoch = w.lease_epoch + 1,
                -- A debounced run takes no more pushes once claimed (0021).
                debounce_key = NULL,
                lease_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                updated_at = now()
            FROM picked p
            WHERE w.workflow_name = p.workflow_name AND w.workflow_id = p.workflow_id
            RETURNING w.*
        )
        SELECT array_agg(ROW(c.*)::workflows
                         ORDER BY c.priority DESC, c.created_at, c.workflow_name, c.workflow_id)
        INTO v_claimed
        FROM claimed c;
    END IF;

    RETURN QUERY SELECT * FROM keiro_claims_with_journals(v_claimed);
END;
$$;

-- instances_claim_batch without queues: no free run of a queue (the signature a claimer that
-- serves no queue calls).
-- Called by: keiro_postgres ops::lease::instances_claim_batch; tested by contract::lease and contract::versions.
CREATE OR REPLACE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text,
                                                       p_ttl_ms bigint, p_limit integer,
                                                       p_now timestamptz, p_versions text[])
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
    SELECT * FROM keiro_instances_claim_batch(p_names, p_owner, p_ttl_ms, p_limit, p_now,
                                              p_versions, '{}'::text[]);
$$;

-- instances_claim_batch without versions: any version's runs (the signature the builds before
-- versions call).
-- Called by: SQL only (builds before versions); tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text,
                                                       p_ttl_ms bigint, p_limit integer,
                                                       p_now timestamptz)
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
    SELECT * FROM keiro_instances_claim_batch(p_names, p_owner, p_ttl_ms, p_limit, p_now,
                                              NULL::text[], '{}'::text[]);
$$;

-- claims_with_journals: each row of `p_claimed` (claims just made, in claim order) with its
-- current generation's journal as parallel arrays, aggregated in one pass (the store sorts the
-- entries by `seq`). A statement of its own, run after the claims took their locks: its
-- snapshot sees every append to those rows that committed before (why that matters:
-- `keiro_instances_claim_batch`).
-- Called by: SQL only (keiro_instances_claim_batch, keiro_queue_admit); tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_claims_with_journals(p_claimed workflows[])
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY
    SELECT p_claimed[i], j.seqs, j.steps, j.kinds, j.payloads, j.recorded
    FROM generate_subscripts(p_claimed, 1) AS i
    LEFT JOIN LATERAL (
        SELECT array_agg(jr.seq) AS seqs, array_agg(jr.step_name) AS steps,
               array_agg(jr.kind) AS kinds, array_agg(jr.payload) AS payloads,
               array_agg(jr.recorded_at) AS recorded
        FROM journal jr
        WHERE jr.workflow_name = (p_claimed[i]).workflow_name
          AND jr.workflow_id = (p_claimed[i]).workflow_id
          AND jr.generation = (p_claimed[i]).generation
    ) j ON true
    ORDER BY i;
END;
$$;

-- instance_record_crash: counts a crash of the fenced run and releases its lease; at the
-- ceiling it fails the run, journaling the failure in the same transaction, and delivers the
-- failure to a waiting parent. Outcomes: retrying (crash_attempts, retry_at), failed
-- (crash_attempts), terminal, not_found, lease_lost.
-- Called by: keiro_postgres ops::lease::instance_record_crash; tested by contract::lease.
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
            -- A crashed run on a queue gives its slot back; it is admitted again after its
            -- backoff, like any waiting run.
            queue_admitted = false,
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        outcome := 'retrying';
    END IF;
END;
$$;

-- instance_refuse_open: hands back the lease of a fenced run whose payload the claiming worker
-- could not open (it lacks the key), without counting a crash (0028): open_refusals + 1,
-- last_error, next_attempt_at = now + p_retry_delay_ms, the run's queue slot given back;
-- attempts stay as they are, so refusals never spend the run's crash budget. One conditional
-- UPDATE; only when it changes nothing is the row read, to say why. Outcomes: refused
-- (refusals, retry_at), terminal, not_found, lease_lost.
-- Called by: keiro_postgres ops::lease::instance_refuse_open; tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instance_refuse_open(p_name text, p_id text, p_owner text,
                                                      p_epoch bigint, p_error text,
                                                      p_retry_delay_ms bigint,
                                                      OUT outcome text,
                                                      OUT refusals integer,
                                                      OUT retry_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_status text;
BEGIN
    retry_at := now() + p_retry_delay_ms * interval '1 millisecond';
    UPDATE workflows w SET
        open_refusals = w.open_refusals + 1,
        last_error = p_error,
        next_attempt_at = retry_at,
        lease_owner = NULL, lease_expires_at = NULL,
        -- As after a crash, a run on a queue gives its slot back while it waits.
        queue_admitted = false,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
      AND w.status IN ('running', 'suspended')
      AND w.lease_owner = p_owner AND w.lease_epoch = p_epoch
    RETURNING w.open_refusals INTO refusals;
    IF FOUND THEN
        outcome := 'refused';
        RETURN;
    END IF;
    retry_at := NULL;
    SELECT w.status INTO v_status FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
    ELSIF v_status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
    ELSE
        outcome := 'lease_lost';
    END IF;
END;
$$;

-- instance_resurrect: the operator returns a failed instance to `running`. The failure stays
-- in history and a `resurrected` row is appended beside it. Outcomes: resurrected,
-- not_failed (row_status), not_found.
-- Called by: keiro_postgres ops::lease::instance_resurrect; tested by contract::lease.
CREATE OR REPLACE FUNCTION keiro_instance_resurrect(p_name text, p_id text,
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
        attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        completed_at = NULL,
        -- Back from its end, a run of a queue waits for admission (0027).
        queue_free = false,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    PERFORM keiro_notify_wake(p_name, p_id);
    outcome := 'resurrected';
END;
$$;
