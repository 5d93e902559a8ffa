-- keiro 0014: a completed run's leftovers are settled when the run says it may have some.
--
-- 0010 and 0012 settle the remote tasks and awakeables of a generation that a cancel or a
-- continue-as-new closes. A run can also complete while some of its own are live: the losing
-- branch of a race (`ctx.select`) whose remote task was dispatched in an earlier drive, or an
-- awakeable it allocated and never awaited. A completed run is final, so nothing will read
-- them: the task would still be claimed and run, the awakeable stay pending forever.
--
-- Not a trigger on every completion (tried: about 10% of throughput), but a call the run makes
-- after its completion commits, only when its journal holds a decided race or an awakeable
-- allocation. Its own transaction locks the tasks and awakeables and never the owner's row,
-- so it keeps the lock order of reports and settlements (the task or awakeable first).

CREATE FUNCTION keiro_instance_settle_leftovers(p_name text, p_id text, p_generation integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_tasks      bigint;
    v_awakeables bigint;
BEGIN
    PERFORM 1 FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id AND w.status = 'completed';
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Served by remote_tasks_owner_idx.
    UPDATE remote_tasks t SET
        status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        settled_at = now(), updated_at = now()
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id AND t.generation = p_generation
      AND t.status IN ('pending', 'running');
    GET DIAGNOSTICS v_tasks = ROW_COUNT;
    -- Served by awakeables_owner_idx.
    UPDATE awakeables a SET status = 'cancelled', settled_at = now()
    WHERE a.workflow_name = p_name AND a.workflow_id = p_id AND a.generation = p_generation
      AND a.status = 'pending';
    GET DIAGNOSTICS v_awakeables = ROW_COUNT;
    RETURN v_tasks + v_awakeables;
END;
$$;

DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION keiro_instance_settle_leftovers(text, text, integer) '
                              'SET search_path = %I, pg_temp',
                              pg_catalog.current_schema());
END;
$$;
