-- 0003: claim a batch of runnable instances in one round trip.
--
-- A worker loop used to discover candidates (one query) and then claim each one (one round trip
-- per candidate). keiro_instances_claim_batch does both for up to p_limit instances: it picks
-- runnable rows whose lease is free or expired and whose backoff gate is open, for the workflow
-- names the caller has registered, and leases them to p_owner with a fresh epoch.
--
-- FOR UPDATE SKIP LOCKED: two workers claiming at once each take different rows instead of
-- queueing behind each other's row locks; a row another transaction holds is simply left for
-- the next pass. The WHERE clause is re-checked after the lock, so a row whose lease was taken
-- in between is skipped, never claimed twice.
CREATE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text, p_ttl_ms bigint,
                                            p_limit integer, p_now timestamptz)
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE sql AS $$
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
        SELECT array_agg(jr.seq ORDER BY jr.seq) AS seqs,
               array_agg(jr.step_name ORDER BY jr.seq) AS steps,
               array_agg(jr.kind ORDER BY jr.seq) AS kinds,
               array_agg(jr.payload ORDER BY jr.seq) AS payloads,
               array_agg(jr.recorded_at ORDER BY jr.seq) AS recorded
        FROM journal jr
        WHERE jr.workflow_name = c.workflow_name AND jr.workflow_id = c.workflow_id
          AND jr.generation = c.generation
    ) j ON true
    ORDER BY c.priority DESC, c.created_at, c.workflow_name, c.workflow_id;
$$;
