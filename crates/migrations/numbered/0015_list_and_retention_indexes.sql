-- keiro 0015: the indexes behind the operators' list (`instances_list`) and retention
-- (`instances_gc`).
--
-- The list orders by (created_at, workflow_name, workflow_id), newest first by default, and
-- pages by keyset on that triple: each index below ends with it after its equality columns, so
-- a page is one index walk that stops after `limit + 1` rows, whatever page it is.
--
-- None of these columns changes while a run advances (an append updates the lease columns and
-- updated_at), so step appends stay HOT updates. That is also why there is no index on
-- updated_at: every append would write it. A list filtered on updated_at walks one of these
-- indexes and filters rows.

-- The unfiltered list, and a created_at window.
CREATE INDEX workflows_list_created_idx ON workflows (created_at, workflow_name, workflow_id);

-- A status filter (with or without others). Status changes on park, wake and terminal
-- transitions, which already write workflows_active_idx.
CREATE INDEX workflows_list_status_idx
    ON workflows (status, created_at, workflow_name, workflow_id);

-- A workflow name filter. (The primary key leads with the name but orders by id.)
CREATE INDEX workflows_list_name_idx ON workflows (workflow_name, created_at, workflow_id);

-- The children of one parent, in list order; also retention's "has this instance any child"
-- probe. Partial: instances without a parent cost nothing to it.
CREATE INDEX workflows_list_parent_idx
    ON workflows (parent_name, parent_id, created_at, workflow_name, workflow_id)
    WHERE parent_name IS NOT NULL;

-- An id prefix, for any workflow (the columns are COLLATE "C", so `starts_with` and `^@`
-- become a range on this index).
CREATE INDEX workflows_list_id_idx ON workflows (workflow_id);

-- Retention's batch: terminal instances oldest first by when they went terminal. Partial:
-- live instances, the hot ones, never enter it.
CREATE INDEX workflows_terminal_idx ON workflows (completed_at)
    WHERE status IN ('completed', 'failed', 'cancelled');

-- The "has failed remote tasks" filter: the owners of tasks that failed for good. Partial:
-- only failed tasks, which are rare.
CREATE INDEX remote_tasks_failed_idx ON remote_tasks (workflow_name, workflow_id)
    WHERE status = 'failed';
