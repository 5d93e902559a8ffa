-- keiro 0006: batch claims that stop after `p_limit` rows instead of sorting every runnable row.
--
-- 0004's batch claim read every runnable row of the registered names (running, or suspended
-- and due), fetched each from the heap to test its lease and backoff, and sorted them all to
-- return the first `p_limit`: O(backlog) per claim. Measured with 4,000 runnable rows: 22 ms a
-- claim, and the worker claims every few milliseconds, so a backlog (a burst of starts, or of
-- remote results waking their runs) made each claim slower exactly when claims mattered most.
--
-- Now the two discovery arms are claimed separately, each in claim order with its own LIMIT:
-- running rows through a partial index in that order (the scan stops after `p_limit` rows it
-- could lock; a leased row costs one heap visit and is passed over), due suspended rows through
-- workflows_active_idx as before (they are few: only those whose deadline passed). The union's
-- first `p_limit` in claim order are the batch: the same rows, in the same order, as one sort
-- over both arms would give. Rows of the other arm locked beyond the batch are not updated and
-- their locks go with the commit; a concurrent claimer only skips them meanwhile.

-- Serves the running arm of `keiro_instances_claim_batch`, in claim order. Only unindexed
-- columns change while a row is running (lease, updated_at), so updates stay HOT.
CREATE INDEX workflows_running_claim_idx
    ON workflows (priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running';

CREATE OR REPLACE FUNCTION keiro_instances_claim_batch(p_names text[], p_owner text,
                                                       p_ttl_ms bigint, p_limit integer,
                                                       p_now timestamptz)
RETURNS TABLE (instance workflows, journal_seq bigint[], journal_step text[],
               journal_kind text[], journal_payload jsonb[],
               journal_recorded_at timestamptz[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, now());
BEGIN
    RETURN QUERY
    WITH running AS (
        SELECT w.workflow_name, w.workflow_id, w.priority, w.created_at
        FROM workflows w
        WHERE w.status = 'running'
          AND w.workflow_name = ANY (p_names)
          AND (w.lease_expires_at IS NULL OR w.lease_expires_at < v_now)
          AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= v_now)
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
            lease_expires_at = v_now + p_ttl_ms * interval '1 millisecond',
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
