-- Queues: declaration, start on a queue, debounce, admission (the claim that enforces the
-- queue's limits), and the triggers that give a slot back (and a dedup id, when a run ends).
--
-- A run holds a slot of its queue while `queue_admitted` is set, its row is not terminal and
-- its lease has not expired. Admission counts slots, and first admissions inside the rate
-- windows, under the queue row's lock (`FOR UPDATE`), so every admission of a limited queue
-- sees the slots every earlier one took and no limit is exceeded by any number of workers.
-- Completions, parks and crashes never take that lock: a slot freed meanwhile is seen by the
-- next admission, which only errs on the side of the limit.

-- What a queue counts is a column of its row (0027): `counts_nothing`, no limit of any kind and
-- first in first out. Such a queue keeps no admission state: while it is not paused its runs
-- start free (`queue_free`) and the ordinary claim takes them, and a run of it that waits is
-- leased as an ordinary claim leases a run, never marked admitted. A free run is started
-- under the queue's advisory lock, held shared: the key is the pair (the oid of this schema's
-- `keiro_queues`, `hashtext` of the queue's name), so schemas never share a lock; a change that
-- takes the queue out of the free state holds it exclusively (`keiro_queue_unfree`).

-- queue_counts_nothing: the column `counts_nothing` of `q`. Nothing in this build calls it; it is
-- kept for the builds before 0027, whose functions called it, during a rolling deploy.
-- Called by: SQL only (builds before 0027); tested by the rolling deploy test.
CREATE OR REPLACE FUNCTION keiro_queue_counts_nothing(q keiro_queues) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT q.counts_nothing
$$;

-- queue_unfree: turns the live free runs of queue `p_name` into waiting ones, under the queue's
-- exclusive advisory lock; a run leased now is marked as holding a slot when `p_mark_leased`
-- (the queue is about to count slots), so the new limits count it. Found through the list by
-- queue (every run of the queue, a rare operator's change).
-- Called by: SQL only (keiro_queue_declare, keiro_queue_set_paused); tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_unfree(p_name text, p_mark_leased boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock('keiro_queues'::regclass::oid::integer, hashtext(p_name));
    UPDATE workflows w SET
        queue_free = false,
        queue_admitted = p_mark_leased AND w.status = 'running'
                         AND coalesce(w.lease_expires_at >= now(), false),
        queue_admitted_at = CASE
            WHEN p_mark_leased AND w.status = 'running'
                 AND coalesce(w.lease_expires_at >= now(), false)
                THEN coalesce(w.queue_admitted_at, now())
            ELSE w.queue_admitted_at END,
        updated_at = now()
    WHERE w.queue = p_name AND w.queue_free AND w.status IN ('running', 'suspended');
END;
$$;

-- queue_declare: records a queue's limits, or replaces them; a paused queue stays paused, and
-- weighted fairness keeps its virtual time and the keys' passes and weights. A queue that
-- counted nothing and now counts something marks the runs it leased as holding slots, so the
-- new limits count them; the queue row's lock, which every admission holds, orders this
-- after any admission in flight.
-- Called by: keiro_postgres ops::queue::queue_declare; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_declare(p_name text, p_concurrency integer,
                                               p_worker_concurrency integer,
                                               p_key_concurrency integer,
                                               p_rate_limit integer, p_rate_period_ms bigint,
                                               p_key_rate_limit integer,
                                               p_key_rate_period_ms bigint,
                                               p_priority boolean, p_fairness text,
                                               p_dedup text, p_release_on_park boolean)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_old keiro_queues%ROWTYPE;
    v_new keiro_queues%ROWTYPE;
BEGIN
    SELECT * INTO v_old FROM keiro_queues q WHERE q.name = p_name FOR UPDATE;
    INSERT INTO keiro_queues AS q (name, concurrency, worker_concurrency, key_concurrency,
                                   rate_limit, rate_period_ms, key_rate_limit,
                                   key_rate_period_ms, priority, fairness, dedup,
                                   release_on_park)
    VALUES (p_name, p_concurrency, p_worker_concurrency, p_key_concurrency, p_rate_limit,
            p_rate_period_ms, p_key_rate_limit, p_key_rate_period_ms, p_priority, p_fairness,
            p_dedup, p_release_on_park)
    ON CONFLICT (name) DO UPDATE SET
        concurrency = EXCLUDED.concurrency,
        worker_concurrency = EXCLUDED.worker_concurrency,
        key_concurrency = EXCLUDED.key_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_period_ms = EXCLUDED.rate_period_ms,
        key_rate_limit = EXCLUDED.key_rate_limit,
        key_rate_period_ms = EXCLUDED.key_rate_period_ms,
        priority = EXCLUDED.priority,
        fairness = EXCLUDED.fairness,
        dedup = EXCLUDED.dedup,
        release_on_park = EXCLUDED.release_on_park,
        updated_at = now()
    WHERE (q.concurrency, q.worker_concurrency, q.key_concurrency, q.rate_limit,
           q.rate_period_ms, q.key_rate_limit, q.key_rate_period_ms, q.priority, q.fairness,
           q.dedup, q.release_on_park)
          IS DISTINCT FROM
          (EXCLUDED.concurrency, EXCLUDED.worker_concurrency, EXCLUDED.key_concurrency,
           EXCLUDED.rate_limit, EXCLUDED.rate_period_ms, EXCLUDED.key_rate_limit,
           EXCLUDED.key_rate_period_ms, EXCLUDED.priority, EXCLUDED.fairness, EXCLUDED.dedup,
           EXCLUDED.release_on_park);
    SELECT * INTO v_new FROM keiro_queues q WHERE q.name = p_name;
    IF v_old.name IS NOT NULL AND v_old.counts_nothing AND NOT v_new.counts_nothing THEN
        -- Free runs first (0027): they wait from now on, and those leased hold slots.
        PERFORM keiro_queue_unfree(p_name, true);
        UPDATE workflows w SET
            queue_admitted = true,
            queue_admitted_at = coalesce(w.queue_admitted_at, now()),
            updated_at = now()
        WHERE w.queue = p_name AND w.status = 'running' AND NOT w.queue_admitted
          AND w.lease_expires_at >= now();
    END IF;
END;
$$;

-- queue_set_paused: pauses or resumes admission (runs holding a slot go on). Returns whether
-- the queue exists.
-- Called by: keiro_postgres ops::queue::queue_set_paused; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_set_paused(p_name text, p_paused boolean)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_old keiro_queues%ROWTYPE;
BEGIN
    SELECT * INTO v_old FROM keiro_queues q WHERE q.name = p_name FOR UPDATE;
    UPDATE keiro_queues q SET paused = p_paused, updated_at = now() WHERE q.name = p_name;
    IF FOUND AND p_paused AND NOT v_old.paused AND v_old.counts_nothing THEN
        -- Its free runs wait from now on (0027); a resumed queue's waiting runs are admitted
        -- as a queue that counts nothing admits them.
        PERFORM keiro_queue_unfree(p_name, false);
    END IF;
    IF FOUND AND NOT p_paused THEN
        -- Resumed: workers serving the queue look now rather than at their next poll.
        PERFORM pg_notify(current_schema() || '.wake', 'queue/' || p_name);
    END IF;
    RETURN FOUND;
END;
$$;

-- queue_key_weight: sets a key's weight under weighted fairness. Returns whether the queue
-- exists.
-- Called by: keiro_postgres ops::queue::queue_key_weight; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_key_weight(p_queue text, p_key text, p_weight integer)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM keiro_queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO keiro_queue_keys AS k (queue, key, weight) VALUES (p_queue, p_key, p_weight)
    ON CONFLICT (queue, key) DO UPDATE SET weight = EXCLUDED.weight;
    RETURN true;
END;
$$;

-- queue_start: starts a run on a queue. Outcomes: `started` (created says whether the row is
-- new; an existing key keeps its row, as `keiro_instance_start`), `existing` (the dedup id is
-- held and the queue returns the holder: `instance` is the holder), `duplicate` (held, and the
-- queue refuses: `instance` is the holder), `unknown` (no such queue), `dedup_not_enabled`,
-- `priority_not_enabled`. Nothing is written unless the outcome is `started` with `created`. A
-- created run notifies its wake when `p_notify` (a batch notifies once for all its starts).
--
-- The insert's `ON CONFLICT DO NOTHING` has no target, so it yields to a row holding the key
-- or a live run holding the dedup id, whichever a concurrent start committed; the statement
-- after it takes a fresh snapshot and finds which.
-- Called by: keiro_postgres ops::queue::queue_start; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_start(p_name text, p_id text, p_input jsonb,
                                             p_parent_name text, p_parent_id text,
                                             p_priority integer, p_queue text, p_key text,
                                             p_dedup_id text, p_not_before timestamptz,
                                             p_notify boolean,
                                             OUT outcome text, OUT created boolean,
                                             OUT instance workflows)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    q      keiro_queues%ROWTYPE;
    v_free boolean := false;
BEGIN
    created := false;
    SELECT * INTO q FROM keiro_queues k WHERE k.name = p_queue;
    IF NOT FOUND THEN
        outcome := 'unknown';
        RETURN;
    END IF;
    -- A free run (0027) only under the queue's shared lock, read again after taking it, and
    -- only in a READ COMMITTED transaction, whose next statement sees what a change that held
    -- the lock committed; in any other, the run waits and is admitted.
    IF NOT q.paused AND q.counts_nothing
       AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pg_advisory_xact_lock_shared('keiro_queues'::regclass::oid::integer,
                                             hashtext(p_queue));
        SELECT * INTO q FROM keiro_queues k WHERE k.name = p_queue;
        v_free := NOT q.paused AND q.counts_nothing;
    END IF;
    IF p_dedup_id IS NOT NULL AND q.dedup IS NULL THEN
        outcome := 'dedup_not_enabled';
        RETURN;
    END IF;
    IF p_priority <> 0 AND NOT q.priority THEN
        outcome := 'priority_not_enabled';
        RETURN;
    END IF;
    -- Until one statement finds what the other's conflict was: the holder of the dedup id
    -- may end between the insert and the read, and the start is then tried again.
    LOOP
        INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                    priority, queue, queue_key, dedup_id, next_attempt_at,
                                    queue_free)
        VALUES (p_name, p_id, p_input, p_parent_name, p_parent_id, p_priority, p_queue, p_key,
                p_dedup_id, p_not_before, v_free)
        ON CONFLICT DO NOTHING
        RETURNING w.* INTO instance;
        IF FOUND THEN
            created := true;
            outcome := 'started';
            IF p_notify THEN
                PERFORM keiro_notify_wake(p_name, p_id);
            END IF;
            RETURN;
        END IF;
        SELECT w.* INTO instance FROM workflows w
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        IF FOUND THEN
            outcome := 'started';
            RETURN;
        END IF;
        SELECT w.* INTO instance FROM workflows w
        WHERE w.queue = p_queue AND w.dedup_id = p_dedup_id
          AND w.status IN ('running', 'suspended');
        IF FOUND THEN
            outcome := CASE q.dedup WHEN 'refuse' THEN 'duplicate' ELSE 'existing' END;
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- queues_start: the start lane's batch when it holds starts on a queue: what
-- `keiro_queue_start` (a start on a queue) or `keiro_instance_start` (a plain one) does for each
-- request, one row each (its position `n`, the outcome, created, the row), in one transaction.
-- A plain start's outcome is `started`.
--
-- As `keiro_instances_start` does, one INSERT creates every new key of the batch, in key order
-- (the lock order), each key by its first request: the requests whose queue takes them
-- (declared, and allowing their dedup id and priority) and the plain ones. Every other request
-- (refused by its queue, a key met twice or already there, a dedup id a live run holds) is
-- then answered one by one, in key order, by the single start, which writes nothing for it or
-- finds the row it met. One wake notification serves the batch.
--
-- The usual batch (a producer's starts on one declared queue with no dedup id, and priorities
-- only where the queue takes them) reads its queue's row once and inserts with
-- `keiro_instances_start`'s statement plus the queue's columns; only a batch with more in it
-- joins each request to `keiro_queues`. The join, its lock statement and the targetless
-- conflict a dedup id needs were a third of what a queue cost a start (BENCHMARKS.md, "Queues").
-- Called by: keiro_postgres ops::queue::queues_start; tested by contract::queue, postgres::queued_starts and postgres::free_queue_runs.
CREATE OR REPLACE FUNCTION keiro_queues_start(
    p_names text[], p_ids text[], p_inputs jsonb[], p_parent_names text[], p_parent_ids text[],
    p_priorities integer[], p_queues text[], p_keys text[], p_dedup_ids text[],
    p_not_befores timestamptz[])
RETURNS TABLE (n integer, outcome text, created boolean, instance workflows)
-- Index-driven generic plans, as keiro_instances_start's.
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    i          integer;
    v_created  integer[];
    v_start    record;
    v_notify   boolean := false;
    v_free     boolean := current_setting('transaction_isolation') = 'read committed';
    -- One queue's batch: its queue takes every request; whether they start free.
    v_one      boolean := false;
    v_one_free boolean;
BEGIN
    -- One queue and no dedup id (tests on the arrays, which run no statement and build no
    -- array; a NULL queue makes the first one NULL): read that queue, after its shared lock,
    -- as below.
    IF NOT (p_queues[1] <> ANY (p_queues)) AND num_nonnulls(VARIADIC p_dedup_ids) = 0 THEN
        IF v_free THEN
            PERFORM pg_advisory_xact_lock_shared('keiro_queues'::regclass::oid::integer,
                                                 hashtext(p_queues[1]));
        END IF;
        -- Unknown, or a priority it does not take: the general statement refuses it alone.
        SELECT v_free AND NOT q.paused AND q.counts_nothing INTO v_one_free
        FROM keiro_queues q
        WHERE q.name = p_queues[1]
          AND (q.priority OR NOT (0 <> ANY (p_priorities)));
        v_one := FOUND;
    END IF;
    IF v_one THEN
        WITH requests AS (
            SELECT DISTINCT ON (r.name COLLATE "C", r.id COLLATE "C") r.*
            FROM unnest(p_names, p_ids, p_inputs, p_parent_names, p_parent_ids, p_priorities,
                        p_keys, p_not_befores)
                 WITH ORDINALITY AS r (name, id, input, parent_name, parent_id, priority, key,
                                       not_before, n)
            ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
        ), inserted AS (
            INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name,
                                        parent_id, priority, queue, queue_key, next_attempt_at,
                                        queue_free)
            SELECT r.name, r.id, r.input, r.parent_name, r.parent_id, r.priority,
                   p_queues[1], r.key, r.not_before, v_one_free
            FROM requests r
            ORDER BY r.name COLLATE "C", r.id COLLATE "C"
            -- Without a dedup id a new row can meet no unique index but the key's.
            ON CONFLICT (workflow_name, workflow_id) DO NOTHING
            RETURNING w.workflow_name, w.workflow_id
        )
        SELECT coalesce(array_agg(r.n), '{}') INTO v_created
        FROM requests r
        JOIN inserted x ON x.workflow_name = r.name AND x.workflow_id = r.id;
    ELSE
        -- Runs of a queue that counts nothing start free (0027) under the queue's shared lock,
        -- taken before the insert's statement so that statement reads the queues as the last
        -- change left them (as `keiro_queue_start` explains); every queue of the batch is locked,
        -- which costs less than reading which of them count nothing first.
        IF v_free THEN
            PERFORM pg_advisory_xact_lock_shared('keiro_queues'::regclass::oid::integer,
                                                 hashtext(x.queue))
            FROM (SELECT DISTINCT r.queue FROM unnest(p_queues) AS r (queue)
                  WHERE r.queue IS NOT NULL) x;
        END IF;
        WITH requests AS (
            SELECT DISTINCT ON (r.name COLLATE "C", r.id COLLATE "C") r.*
            FROM unnest(p_names, p_ids, p_inputs, p_parent_names, p_parent_ids, p_priorities,
                        p_queues, p_keys, p_dedup_ids, p_not_befores)
                 WITH ORDINALITY AS r (name, id, input, parent_name, parent_id, priority, queue,
                                       key, dedup_id, not_before, n)
            ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
        ), taken AS (
            SELECT r.*, coalesce(v_free AND NOT q.paused AND q.counts_nothing, false) AS free
            FROM requests r
            LEFT JOIN keiro_queues q ON q.name = r.queue
            WHERE r.queue IS NULL
               OR (q.name IS NOT NULL AND (r.dedup_id IS NULL OR q.dedup IS NOT NULL)
                   AND (r.priority = 0 OR q.priority))
        ), inserted AS (
            INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                        priority, queue, queue_key, dedup_id, next_attempt_at,
                                        queue_free)
            SELECT t.name, t.id, t.input, t.parent_name, t.parent_id, t.priority, t.queue,
                   CASE WHEN t.queue IS NOT NULL THEN t.key END,
                   CASE WHEN t.queue IS NOT NULL THEN t.dedup_id END,
                   CASE WHEN t.queue IS NOT NULL THEN t.not_before END,
                   t.free
            FROM taken t
            ORDER BY t.name COLLATE "C", t.id COLLATE "C"
            ON CONFLICT DO NOTHING
            RETURNING w.workflow_name, w.workflow_id
        )
        SELECT coalesce(array_agg(t.n), '{}') INTO v_created
        FROM taken t
        JOIN inserted x ON x.workflow_name = t.name AND x.workflow_id = t.id;
    END IF;

    RETURN QUERY
    SELECT r.n::integer, 'started'::text, true,
           (SELECT w FROM workflows w WHERE w.workflow_name = r.name AND w.workflow_id = r.id)
    FROM unnest(p_names, p_ids) WITH ORDINALITY AS r (name, id, n)
    WHERE r.n = ANY (v_created);

    -- Unless every request created its run (the usual batch), the others one by one.
    IF cardinality(v_created) < cardinality(p_names) THEN
        FOR i IN
            SELECT r.n FROM unnest(p_names, p_ids) WITH ORDINALITY AS r (name, id, n)
            WHERE NOT r.n = ANY (v_created)
            ORDER BY r.name COLLATE "C", r.id COLLATE "C", r.n
        LOOP
            IF p_queues[i] IS NULL THEN
                RETURN QUERY
                SELECT i, 'started'::text, s.created, s.instance
                FROM keiro_instance_start(p_names[i], p_ids[i], p_inputs[i], p_parent_names[i],
                                          p_parent_ids[i], p_priorities[i]) s;
            ELSE
                SELECT s.* INTO v_start
                FROM keiro_queue_start(p_names[i], p_ids[i], p_inputs[i], p_parent_names[i],
                                       p_parent_ids[i], p_priorities[i], p_queues[i], p_keys[i],
                                       p_dedup_ids[i], p_not_befores[i], false) s;
                v_notify := v_notify OR v_start.created;
                n := i;
                outcome := v_start.outcome;
                created := v_start.created;
                instance := v_start.instance;
                RETURN NEXT;
            END IF;
        END LOOP;
    END IF;
    -- One wake for the batch's new runs (a listener only learns that some run became
    -- runnable), as `keiro_instances_start` sends one for its own.
    IF v_notify OR v_created <> '{}' THEN
        PERFORM keiro_notify_wake(p_names[1], p_ids[1]);
    END IF;
END;
$$;

-- queue_debounce: one run per burst of calls with the same key. While the key's pending run
-- was never claimed (`lease_epoch = 0`, status running), a call replaces its input and moves its
-- start gate (`next_attempt_at`) to `now + delay`, but never past its first call + `max_wait`;
-- otherwise a call starts a new run `p_id` gated at `now + delay` (first call at `now`, kept in
-- created_at) and notifies its wake. Returns the pending run (`created` when this call made it).
-- Concurrent calls of one key converge on one run through `workflows_debounce_idx`: the loser
-- of the insert finds the winner's row with the next statement's fresh snapshot.
-- Called by: keiro_postgres ops::queue::queue_debounce; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_debounce(p_name text, p_key text, p_id text, p_input jsonb,
                                                p_delay_ms bigint, p_max_wait_ms bigint,
                                                p_now timestamptz,
                                                OUT created boolean, OUT instance workflows)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
BEGIN
    LOOP
        UPDATE workflows w SET
            input = p_input,
            next_attempt_at = least(v_now + p_delay_ms * interval '1 millisecond',
                                    w.created_at + p_max_wait_ms * interval '1 millisecond'),
            updated_at = now()
        WHERE w.workflow_name = p_name AND w.debounce_key = p_key
          AND w.lease_epoch = 0 AND w.status = 'running'
        RETURNING w.* INTO instance;
        IF FOUND THEN
            created := false;
            RETURN;
        END IF;
        INSERT INTO workflows AS w (workflow_name, workflow_id, input, debounce_key,
                                    next_attempt_at, created_at, updated_at)
        VALUES (p_name, p_id, p_input, p_key,
                v_now + least(p_delay_ms, p_max_wait_ms) * interval '1 millisecond', v_now,
                now())
        ON CONFLICT DO NOTHING
        RETURNING w.* INTO instance;
        IF FOUND THEN
            created := true;
            PERFORM keiro_notify_wake(p_name, p_id);
            RETURN;
        END IF;
        -- The id itself was taken (by a start of the same id): that run is the answer.
        SELECT w.* INTO instance FROM workflows w
        WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
        IF FOUND THEN
            created := false;
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- queue_held: the slots of queue `p_queue` held at `p_now`, by runs and remote tasks alike:
-- admitted runs that are not terminal (admission takes an expired lease's slot back before it
-- asks) and claimed tasks whose claim has not expired. Only `p_owner`'s when given (a run's
-- lease owner, a task's claimer); only key `p_key`'s when `p_by_key` (a NULL key: the runs and
-- tasks with none). The one count behind every concurrency limit, so a queue that runs and
-- remote steps share keeps one limit.
-- Called by: SQL only (keiro_queue_admit, keiro_remote_tasks_claim_queued); tested by contract::queue and contract::remote.
CREATE OR REPLACE FUNCTION keiro_queue_held(p_queue text, p_now timestamptz, p_owner text,
                                            p_by_key boolean, p_key text)
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Served by workflows_queue_slots_idx and remote_tasks_queue_slots_idx.
    IF p_by_key THEN
        RETURN (SELECT count(*) FROM workflows w
                WHERE w.queue = p_queue AND w.queue_admitted
                  AND w.status IN ('running', 'suspended')
                  AND w.queue_key IS NOT DISTINCT FROM p_key)
             + (SELECT count(*) FROM remote_tasks t
                WHERE t.queue = p_queue AND t.status = 'running'
                  AND t.queue_key IS NOT DISTINCT FROM p_key AND t.claim_expires_at > p_now);
    END IF;
    RETURN (SELECT count(*) FROM workflows w
            WHERE w.queue = p_queue AND w.queue_admitted
              AND w.status IN ('running', 'suspended')
              AND (p_owner IS NULL OR w.lease_owner = p_owner))
         + (SELECT count(*) FROM remote_tasks t
            WHERE t.queue = p_queue AND t.status = 'running' AND t.claim_expires_at > p_now
              AND (p_owner IS NULL OR t.claimed_by = p_owner));
END;
$$;

-- queue_admitted_since: the first admissions of runs and first claims of remote tasks of
-- queue `p_queue` after `p_since` (of key `p_key` only, when `p_by_key`): the one count behind
-- every rate limit.
-- Called by: SQL only (keiro_queue_admit, keiro_remote_tasks_claim_queued); tested by contract::queue and contract::remote.
CREATE OR REPLACE FUNCTION keiro_queue_admitted_since(p_queue text, p_since timestamptz,
                                                      p_by_key boolean, p_key text)
RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- Served by the `*_queue_key_admitted_idx` and `*_queue_admitted_idx` indexes.
    IF p_by_key THEN
        RETURN (SELECT count(*) FROM workflows w
                WHERE w.queue = p_queue AND w.queue_key IS NOT DISTINCT FROM p_key
                  AND w.queue_admitted_at > p_since)
             + (SELECT count(*) FROM remote_tasks t
                WHERE t.queue = p_queue AND t.queue_key IS NOT DISTINCT FROM p_key
                  AND t.queue_admitted_at > p_since);
    END IF;
    RETURN (SELECT count(*) FROM workflows w
            WHERE w.queue = p_queue AND w.queue_admitted_at > p_since)
         + (SELECT count(*) FROM remote_tasks t
            WHERE t.queue = p_queue AND t.queue_admitted_at > p_since);
END;
$$;

-- queue_admit: admits and claims up to `p_limit` waiting runs of the queues `p_queues` whose
-- workflow name is in `p_names`, for `p_owner` until `now + ttl`, each with its current
-- generation's journal (as `keiro_instances_claim_batch` returns them). Queues are served in
-- name order, paused ones skipped. For each queue:
--
-- 1. A limited queue (any limit, or weighted fairness) is locked `FOR UPDATE`: admissions of
--    one queue are serialized, and each counts what the previous ones committed. A queue that
--    counts nothing is locked `FOR SHARE`, which only a declaration waits for.
-- 2. Slots whose lease expired go back: the row waits again, and its epoch moves on, so the
--    worker that lost it is fenced as after any takeover.
-- 3. The room: the batch's remaining limit, less the slots held (fleet-wide, and this owner's),
--    less the first admissions inside the rate window; slots and first admissions of runs and
--    of the queue's remote tasks alike (`keiro_queue_held`, `keiro_queue_admitted_since`).
-- 4. The waiting runs: running, not admitted, lease free, gate (`next_attempt_at`, which also
--    holds a delayed start) open. With no per-key limit and no fairness, the oldest (highest
--    priority first when the queue orders by priority) up to the room. Otherwise per key: each
--    key with waiting runs (found by a skip scan of the per-key index) gets up to its own room
--    (key concurrency and key rate), and the picks are ordered by priority, then, under
--    weighted fairness, by each pick's virtual finish time (the key's pass, or the queue's
--    virtual time if later, plus n / weight for its n-th pick; the virtual time is the start
--    of the last pick), then by age.
-- 5. The picks are leased and, on a queue that counts something, marked admitted (the first
--    admission's time kept for the rate windows); under fairness the keys' passes and the
--    queue's virtual time move on. On a queue that counts nothing the lease is all: the run
--    stays unmarked, so it waits again (for admission, not for an ordinary claim) once its
--    lease is gone.
--
-- Runs are locked `FOR UPDATE SKIP LOCKED`: a row another claimer holds is left for the next
-- pass. The journals are read after the claims, as in `keiro_instances_claim_batch` (why is
-- explained there).
-- Only runs of the versions in `p_versions` are admitted (NULL: any; '' stands for the
-- unversioned runs; 0025); the others wait on.
-- Called by: keiro_postgres ops::queue::queue_admit; tested by contract::queue and contract::versions.
CREATE OR REPLACE FUNCTION keiro_queue_admit(p_queues text[], p_names text[], p_owner text,
                                             p_ttl_ms bigint, p_limit integer,
                                             p_now timestamptz, p_versions text[])
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := coalesce(p_now, now());
    v_left    integer := greatest(p_limit, 0);
    v_claimed workflows[] := '{}';
    v_batch   workflows[];
    v_name    text;
    q         keiro_queues%ROWTYPE;
    v_room    integer;
    v_held    integer;
    v_keyed   boolean;
    v_keys    text[];
    v_rooms   integer[];
    v_passes  double precision[];
    v_weights integer[];
    v_start   double precision;
    v_light   boolean;
BEGIN
    FOR v_name IN SELECT k.name FROM keiro_queues k
                  WHERE k.name = ANY (p_queues) AND NOT k.paused ORDER BY k.name LOOP
        EXIT WHEN v_left <= 0;
        SELECT * INTO q FROM keiro_queues k WHERE k.name = v_name;
        v_light := q.counts_nothing;
        -- A queue that counts nothing starts its runs free, and the ordinary claim takes them
        -- (0027): only a run that returned from an end, or was started in a transaction of
        -- another isolation level or while the queue was paused, waits here. One probe of the
        -- waiting index says whether any does.
        CONTINUE WHEN v_light AND NOT EXISTS (
            SELECT 1 FROM workflows w
            WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
              AND NOT w.queue_free);
        IF v_light THEN
            -- Shared: light admissions run side by side, and a declaration that gives the
            -- queue limits waits for them (and they for it).
            SELECT * INTO q FROM keiro_queues k WHERE k.name = v_name FOR SHARE;
            CONTINUE WHEN q.paused OR NOT q.counts_nothing;
        ELSE
            SELECT * INTO q FROM keiro_queues k WHERE k.name = v_name FOR UPDATE;
            CONTINUE WHEN q.paused;
        END IF;

        UPDATE workflows w SET
            queue_admitted = false,
            lease_owner = NULL, lease_expires_at = NULL, lease_epoch = w.lease_epoch + 1,
            updated_at = now()
        WHERE w.queue = v_name AND w.queue_admitted AND w.status IN ('running', 'suspended')
          AND w.lease_expires_at < v_now;

        v_room := v_left;
        IF q.concurrency IS NOT NULL THEN
            v_held := keiro_queue_held(v_name, v_now, NULL, false, NULL);
            v_room := least(v_room, q.concurrency - v_held);
        END IF;
        IF q.worker_concurrency IS NOT NULL THEN
            v_held := keiro_queue_held(v_name, v_now, p_owner, false, NULL);
            v_room := least(v_room, q.worker_concurrency - v_held);
        END IF;
        IF q.rate_limit IS NOT NULL THEN
            v_held := keiro_queue_admitted_since(
                v_name, v_now - q.rate_period_ms * interval '1 millisecond', false, NULL);
            v_room := least(v_room, q.rate_limit - v_held);
        END IF;
        CONTINUE WHEN v_room <= 0;

        v_keyed := q.key_concurrency IS NOT NULL OR q.key_rate_limit IS NOT NULL
                   OR q.fairness = 'weighted';
        IF NOT v_keyed THEN
            WITH picked AS (
                SELECT w.workflow_name, w.workflow_id
                FROM workflows w
                WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                  AND NOT w.queue_free
                  AND w.workflow_name = ANY (p_names)
                  AND (p_versions IS NULL OR coalesce(w.app_version, '') = ANY (p_versions))
                  AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
                  AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
                ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
                LIMIT v_room
                FOR UPDATE SKIP LOCKED
            ), claimed AS (
                UPDATE workflows w SET
                    lease_owner = p_owner,
                    lease_epoch = w.lease_epoch + 1,
                    lease_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                    -- A queue that counts nothing marks nothing: the lease is the whole
                    -- change, a HOT update.
                    queue_admitted = NOT v_light OR w.queue_admitted,
                    queue_admitted_at = CASE WHEN v_light THEN w.queue_admitted_at
                                             ELSE coalesce(w.queue_admitted_at, v_now) END,
                    updated_at = now()
                FROM picked p
                WHERE w.workflow_name = p.workflow_name AND w.workflow_id = p.workflow_id
                RETURNING w.*
            )
            SELECT coalesce(array_agg(ROW(c.*)::workflows
                                      ORDER BY c.priority DESC, c.created_at, c.workflow_name,
                                               c.workflow_id), '{}')
            INTO v_batch
            FROM claimed c;
        ELSE
            -- Every key with runs waiting (a NULL key is one key of its own), by a skip scan.
            WITH RECURSIVE keys (key) AS (
                (SELECT w.queue_key FROM workflows w
                 WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                   AND NOT w.queue_free
                   AND w.queue_key IS NOT NULL
                 ORDER BY w.queue_key LIMIT 1)
                UNION ALL
                SELECT (SELECT w.queue_key FROM workflows w
                        WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                          AND NOT w.queue_free
                          AND w.queue_key > k.key
                        ORDER BY w.queue_key LIMIT 1)
                FROM keys k WHERE k.key IS NOT NULL
            ), waiting AS (
                SELECT k.key FROM keys k WHERE k.key IS NOT NULL
                UNION ALL
                SELECT NULL WHERE EXISTS (
                    SELECT 1 FROM workflows w
                    WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                      AND NOT w.queue_free
                      AND w.queue_key IS NULL)
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

            WITH candidates AS (
                SELECT c.*, k.pass, k.weight, k.key
                FROM unnest(v_keys, v_rooms, v_passes, v_weights) AS k (key, room, pass, weight)
                CROSS JOIN LATERAL (
                    SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
                    FROM workflows w
                    WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                      AND NOT w.queue_free
                      AND k.key IS NOT NULL AND w.queue_key = k.key
                      AND w.workflow_name = ANY (p_names)
                      AND (p_versions IS NULL OR coalesce(w.app_version, '') = ANY (p_versions))
                      AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
                      AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
                    ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
                    LIMIT k.room
                    FOR UPDATE OF w SKIP LOCKED
                ) c
                UNION ALL
                SELECT c.*, k.pass, k.weight, k.key
                FROM unnest(v_keys, v_rooms, v_passes, v_weights) AS k (key, room, pass, weight)
                CROSS JOIN LATERAL (
                    SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
                    FROM workflows w
                    WHERE w.queue = v_name AND w.status = 'running' AND NOT w.queue_admitted
                      AND NOT w.queue_free
                      AND k.key IS NULL AND w.queue_key IS NULL
                      AND w.workflow_name = ANY (p_names)
                      AND (p_versions IS NULL OR coalesce(w.app_version, '') = ANY (p_versions))
                      AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
                      AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
                    ORDER BY w.priority DESC, w.created_at, w.workflow_name, w.workflow_id
                    LIMIT k.room
                    FOR UPDATE OF w SKIP LOCKED
                ) c
            ), ranked AS (
                SELECT c.*,
                       c.pass + (row_number() OVER (
                           PARTITION BY c.key
                           ORDER BY c.priority DESC, c.created_at, c.workflow_name,
                                    c.workflow_id))::double precision / c.weight AS finish
                FROM candidates c
            ), picked AS (
                SELECT r.workflow_name, r.workflow_id, r.key, r.finish, r.weight
                FROM ranked r
                ORDER BY r.priority DESC,
                         CASE WHEN q.fairness = 'weighted' THEN r.finish ELSE 0 END,
                         r.created_at, r.workflow_name, r.workflow_id
                LIMIT v_room
            ), passes AS (
                INSERT INTO keiro_queue_keys AS qk (queue, key, pass)
                SELECT v_name, coalesce(p.key, ''), max(p.finish)
                FROM picked p
                WHERE q.fairness = 'weighted'
                GROUP BY p.key
                ON CONFLICT (queue, key) DO UPDATE SET pass = EXCLUDED.pass
            ), claimed AS (
                UPDATE workflows w SET
                    lease_owner = p_owner,
                    lease_epoch = w.lease_epoch + 1,
                    lease_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
                    queue_admitted = true,
                    queue_admitted_at = coalesce(w.queue_admitted_at, v_now),
                    updated_at = now()
                FROM picked p
                WHERE w.workflow_name = p.workflow_name AND w.workflow_id = p.workflow_id
                RETURNING w.*
            )
            SELECT coalesce(array_agg(ROW(c.*)::workflows
                                      ORDER BY c.priority DESC, c.created_at, c.workflow_name,
                                               c.workflow_id), '{}'),
                   max(p.finish - 1.0::double precision / p.weight)
            INTO v_batch, v_start
            FROM claimed c
            JOIN picked p ON p.workflow_name = c.workflow_name AND p.workflow_id = c.workflow_id;

            IF q.fairness = 'weighted' AND v_start > q.vtime THEN
                -- The queue's virtual time: the start of the last pick (start-time fair
                -- queuing), so a key that starts waiting later joins level with the keys just
                -- served, not ahead of them with a run of admissions of its own.
                UPDATE keiro_queues k SET vtime = v_start WHERE k.name = v_name;
            END IF;
        END IF;

        v_claimed := v_claimed || v_batch;
        v_left := v_left - cardinality(v_batch);
    END LOOP;

    RETURN QUERY SELECT * FROM keiro_claims_with_journals(v_claimed);
END;
$$;

-- queue_admit without versions: any version's runs (the signature the builds before versions
-- call).
-- Called by: SQL only (builds before versions); tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_admit(p_queues text[], p_names text[], p_owner text,
                                             p_ttl_ms bigint, p_limit integer,
                                             p_now timestamptz)
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
    SELECT * FROM keiro_queue_admit(p_queues, p_names, p_owner, p_ttl_ms, p_limit, p_now,
                                    NULL::text[]);
$$;

-- instances_claim_and_admit: a worker's claim in one transaction: up to `p_limit` runs as
-- `keiro_instances_claim_batch` claims them, free runs of `p_queues` among them (`admitted`
-- false), then, with the room left and when `p_queues` names any, waiting runs of those
-- queues as `keiro_queue_admit` admits them (`admitted` true). One round trip and one commit where the two calls took two of each.
-- Both halves serve only the versions in `p_versions` (NULL: any; 0025).
-- Called by: keiro_postgres ops::queue::claim_and_admit; tested by contract::queue and contract::versions.
CREATE OR REPLACE FUNCTION keiro_instances_claim_and_admit(p_names text[], p_queues text[],
                                                           p_owner text, p_ttl_ms bigint,
                                                           p_limit integer, p_now timestamptz,
                                                           p_versions text[])
RETURNS TABLE (admitted boolean, instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_claimed integer;
BEGIN
    RETURN QUERY
    SELECT false, c.* FROM keiro_instances_claim_batch(p_names, p_owner, p_ttl_ms, p_limit,
                                                       p_now, p_versions, p_queues) c;
    GET DIAGNOSTICS v_claimed = ROW_COUNT;
    IF v_claimed < p_limit AND cardinality(p_queues) > 0 THEN
        RETURN QUERY
        SELECT true, a.* FROM keiro_queue_admit(p_queues, p_names, p_owner, p_ttl_ms,
                                                p_limit - v_claimed, p_now, p_versions) a;
    END IF;
END;
$$;

-- instances_claim_and_admit without versions: any version's runs (the signature the builds
-- before versions call).
-- Called by: SQL only (builds before versions); tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_instances_claim_and_admit(p_names text[], p_queues text[],
                                                           p_owner text, p_ttl_ms bigint,
                                                           p_limit integer, p_now timestamptz)
RETURNS TABLE (admitted boolean, instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
    SELECT * FROM keiro_instances_claim_and_admit(p_names, p_queues, p_owner, p_ttl_ms,
                                                  p_limit, p_now, NULL::text[]);
$$;

-- A run on a queue that changes status: parking, it gives its slot back when its queue says so
-- (it is admitted again once woken); ending, it gives its slot and its dedup id back, so a
-- resurrected or requeued run is admitted again like any waiting run and a live run may hold
-- the id meanwhile. A BEFORE trigger, so the status update itself carries the change. Its
-- WHEN clause leaves out every row with nothing to give back (no queue, or neither a slot nor a
-- dedup id: every run of a queue that counts nothing and has no dedup id), so their status
-- changes pay no trigger call, which cost a tenth of a completion (`SQL_COST_QUEUE=1
-- scripts/sql-cost complete 16`).
-- Called by: trigger workflows_queue_status; tested by contract::queue.
CREATE OR REPLACE FUNCTION keiro_queue_status() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        NEW.queue_admitted := false;
        NEW.dedup_id := NULL;
    ELSIF NEW.status = 'suspended' AND NEW.queue_admitted
          AND (SELECT q.release_on_park FROM keiro_queues q WHERE q.name = NEW.queue) THEN
        NEW.queue_admitted := false;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER workflows_queue_status BEFORE UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.queue IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status
          AND (NEW.queue_admitted OR NEW.dedup_id IS NOT NULL))
    EXECUTE FUNCTION keiro_queue_status();

-- A slot freed by a run that ended or gave its slot back on park wakes the workers, so a run
-- waiting for that slot is admitted now rather than at the next poll. The payload looks like an
-- instance's, which every resume loop already hears; one transaction closing many runs of a
-- queue sends it once (PostgreSQL folds equal payloads). Only a queue whose slots are counted
-- (a concurrency limit of any kind) notifies: on any other queue a waiting run is admitted as
-- soon as a worker has room, which its start's notification already told the workers, and a
-- notifying commit holds the notify queue's lock across its flush.
-- Called by: trigger workflows_queue_slot_freed; tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_queue_slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM keiro_queues q
               WHERE q.name = NEW.queue
                 AND (q.concurrency IS NOT NULL OR q.worker_concurrency IS NOT NULL
                      OR q.key_concurrency IS NOT NULL)) THEN
        PERFORM pg_notify(current_schema() || '.wake', 'queue/' || NEW.queue);
        -- Remote steps of the queue may wait for the slot too (remote_tasks_queue_waiting_idx).
        IF EXISTS (SELECT 1 FROM remote_tasks t
                   WHERE t.queue = NEW.queue AND t.status = 'pending') THEN
            PERFORM keiro_notify_remote();
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER workflows_queue_slot_freed AFTER UPDATE OF status, queue_admitted
    ON workflows
    FOR EACH ROW
    WHEN (OLD.queue_admitted
          AND (NOT NEW.queue_admitted OR NEW.status IN ('completed', 'failed', 'cancelled'))
          AND OLD.status IN ('running', 'suspended'))
    EXECUTE FUNCTION keiro_queue_slot_freed();

-- A slot freed by a remote task of a queue (it left `running`: completed, failed, retried,
-- cancelled, redispatched, or its expired claim counted) wakes the remote workers when tasks of
-- the queue wait, and the workflow workers when runs of the queue wait, as a run's freed slot
-- does; only for a queue whose slots are counted. A claim that merely expires frees its slot
-- with no write: the next claim or admission counts it free, at the latest at the next poll.
-- Called by: trigger remote_tasks_queue_slot_freed; tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_remote_task_slot_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM keiro_queues q
               WHERE q.name = NEW.queue
                 AND (q.concurrency IS NOT NULL OR q.worker_concurrency IS NOT NULL
                      OR q.key_concurrency IS NOT NULL)) THEN
        IF EXISTS (SELECT 1 FROM remote_tasks t
                   WHERE t.queue = NEW.queue AND t.status = 'pending') THEN
            PERFORM keiro_notify_remote();
        END IF;
        IF EXISTS (SELECT 1 FROM workflows w
                   WHERE w.queue = NEW.queue AND w.status = 'running'
                     AND NOT w.queue_admitted AND NOT w.queue_free) THEN
            PERFORM pg_notify(current_schema() || '.wake', 'queue/' || NEW.queue);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER remote_tasks_queue_slot_freed AFTER UPDATE OF status ON remote_tasks
    FOR EACH ROW
    WHEN (NEW.queue IS NOT NULL AND OLD.status = 'running' AND NEW.status <> 'running')
    EXECUTE FUNCTION keiro_remote_task_slot_freed();
