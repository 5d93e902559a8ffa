-- keiro 0014: a completed run settles what it left behind.
--
-- 0010 and 0012 settle the remote tasks and the awakeables of a generation that a cancel or a
-- continue-as-new closes. A run can also complete while some of its own are still live: the
-- losing branch of a race (`ctx.select`) whose remote task was dispatched in an earlier drive,
-- or an awakeable it allocated and handed out but never awaited. A completed run is final (only
-- a failed one can be requeued or resurrected), so nothing will ever read them: the task would
-- still be claimed and run by a worker, and the awakeable would stay pending forever (counted
-- by `keiro.workflow.awakeables.pending`). The `completed` marker now settles both, in the
-- transaction that writes it: tasks `cancelled` (claimed ones learn it at their next
-- heartbeat; their reports are refused), awakeables `cancelled`; nothing is journaled.
--
-- A trigger on the marker's row, as 0012's: every completion writes that row, and step rows
-- pay only the WHEN clause. The marker's transaction holds the owner's row lock, and reports
-- and settlements lock the task or awakeable before the owner, so the trigger takes them
-- `SKIP LOCKED`: one locked at that moment is being settled by that very call, which then
-- finds its owner completed.

-- The leftovers of runs already completed.
UPDATE awakeables a SET status = 'cancelled', settled_at = now()
FROM workflows w
WHERE w.workflow_name = a.workflow_name AND w.workflow_id = a.workflow_id
  AND w.status = 'completed' AND a.status = 'pending';

UPDATE remote_tasks t SET
    status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
    settled_at = now(), updated_at = now()
FROM workflows w
WHERE w.workflow_name = t.workflow_name AND w.workflow_id = t.workflow_id
  AND w.status = 'completed' AND t.status IN ('pending', 'running');

CREATE FUNCTION keiro_completion_settles_leftovers() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Served by awakeables_owner_idx.
    UPDATE awakeables a SET status = 'cancelled', settled_at = now()
    WHERE a.id IN (
        SELECT p.id FROM awakeables p
        WHERE p.workflow_name = NEW.workflow_name AND p.workflow_id = NEW.workflow_id
          AND p.generation = NEW.generation AND p.status = 'pending'
        FOR UPDATE SKIP LOCKED);
    -- Served by remote_tasks_owner_idx.
    UPDATE remote_tasks t SET
        status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
        settled_at = now(), updated_at = now()
    WHERE t.step_id IN (
        SELECT r.step_id FROM remote_tasks r
        WHERE r.workflow_name = NEW.workflow_name AND r.workflow_id = NEW.workflow_id
          AND r.generation = NEW.generation AND r.status IN ('pending', 'running')
        FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END;
$$;

CREATE TRIGGER journal_completion_settles_leftovers AFTER INSERT ON journal
    FOR EACH ROW WHEN (NEW.kind = 'completed')
    EXECUTE FUNCTION keiro_completion_settles_leftovers();

DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION keiro_completion_settles_leftovers() '
                              'SET search_path = %I, pg_temp',
                              pg_catalog.current_schema());
END;
$$;
