-- keiro 0027: a run of a queue that counts nothing is claimed as a run without a queue
-- (functions in queue.sql, lease.sql and instance.sql).
--
-- A queue with no limit of any kind, first in first out and not paused admits every run it is
-- given, so admission has nothing to decide: its runs are started `queue_free`, which puts them
-- in the ordinary claim's index (`workflows_running_claim_idx`) rather than the two waiting
-- indexes, and a worker's ordinary claim takes them when the worker serves their queue. A start
-- on such a queue then writes what a start without a queue writes, plus its entry in the list
-- by queue, and its claim is the ordinary claim: no admission statement runs for it.
--
-- Whatever gives a queue something to count, or pauses it, turns its live free runs back into
-- waiting ones first (`keiro_queue_declare`, `keiro_queue_set_paused`), under an exclusive
-- advisory lock of the queue that every start on it takes shared, so no start that read the
-- queue as free commits a free run after the change. A run that returns from an end
-- (resurrected, requeued) or was started in a transaction of another isolation level waits as
-- before, and admission of a queue that counts nothing still leases such runs.
-- Whether a queue counts nothing, kept on its row, so that the statements that ask (each start
-- on a queue, each admission) read a column: a helper function would be called, not inlined
-- (every keiro function carries its search_path, 0009), and a call plans the function's body
-- again in every statement that makes it.
ALTER TABLE keiro_queues ADD COLUMN counts_nothing boolean NOT NULL GENERATED ALWAYS AS (
    concurrency IS NULL AND worker_concurrency IS NULL AND key_concurrency IS NULL
    AND rate_limit IS NULL AND key_rate_limit IS NULL AND fairness = 'fifo') STORED;
-- (queue.sql's `keiro_queue_counts_nothing` now reads it, for the builds before this one.)

ALTER TABLE workflows ADD COLUMN queue_free boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT workflows_queue_free CHECK (queue IS NOT NULL OR NOT queue_free);

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
