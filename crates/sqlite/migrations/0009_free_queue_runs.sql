-- keiro-sqlite 0009: a run of a queue that counts nothing is claimed as a run without a queue,
-- the twin of PostgreSQL's migration 0027 (with the queue.sql, lease.sql and instance.sql of
-- that version).
--
-- A run started on a queue with no limit of any kind, first in first out and not paused, is
-- `queue_free`: it sits in the ordinary claim's index rather than the two waiting indexes, and
-- a worker's claim takes it when the worker serves its queue. Declaring limits on the queue or
-- pausing it turns its live free runs into waiting ones; a run back from its end waits. The
-- writer holds the file's write lock for a whole transaction, so no start reads a queue that
-- a concurrent change is turning (PostgreSQL needs an advisory lock for that).
ALTER TABLE workflows ADD COLUMN queue_free INTEGER NOT NULL DEFAULT 0
    CONSTRAINT workflows_queue_free CHECK (queue IS NOT NULL OR NOT queue_free);

DROP INDEX workflows_running_claim_idx;
CREATE INDEX workflows_running_claim_idx
    ON workflows (priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND (queue IS NULL OR queue_admitted OR queue_free);

DROP INDEX workflows_queue_waiting_idx;
CREATE INDEX workflows_queue_waiting_idx
    ON workflows (queue, priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND queue IS NOT NULL AND NOT queue_admitted AND NOT queue_free;
DROP INDEX workflows_queue_key_waiting_idx;
CREATE INDEX workflows_queue_key_waiting_idx
    ON workflows (queue, queue_key, priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND queue IS NOT NULL AND NOT queue_admitted AND NOT queue_free;
