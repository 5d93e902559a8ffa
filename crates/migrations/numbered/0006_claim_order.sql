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
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (lease.sql), in their current form; this file keeps its tables, indexes and data changes.

-- Serves the running arm of `keiro_instances_claim_batch`, in claim order. Only unindexed
-- columns change while a row is running (lease, updated_at), so updates stay HOT.
CREATE INDEX workflows_running_claim_idx
    ON workflows (priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running';
