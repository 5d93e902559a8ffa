-- keiro 0022: remote steps on a queue, whose limits are enforced in the transaction that claims
-- a task.
--
-- A remote step armed with a queue (and a key) records them on its task. A task of a queue waits
-- (`pending`) until a remote worker's claim admits it within the queue's limits: the limits of
-- `keiro_queues`, the same ones the runs started on that queue are admitted under, so "calls to
-- the payment provider per merchant" are limited across every worker group (handler,
-- partition) and every remote worker process, and a queue shared by runs and steps keeps one
-- limit.
--
-- A task holds a slot while it is claimed (`running`) and its claim has not expired: it gives
-- the slot back when it completes, fails, is retried, cancelled or redispatched, or when its
-- claim runs out, with no counter to drift. The rate windows count first claims
-- (`queue_admitted_at`, set once, as a run's first admission). Run admission and task claims
-- count slots and first admissions of both kinds through the same functions (queue.sql's
-- `keiro_queue_held` and `keiro_queue_admitted_since`), under the queue row's lock.
--
-- A task with no queue is claimed as before, by `remote_tasks_pending_idx`, which from now on
-- holds only such tasks: a backlog held back by a limit costs the ordinary claim nothing.
--
-- The functions this version added or changed live in functions/ (remote.sql, queue.sql).

ALTER TABLE remote_tasks
    ADD COLUMN queue             text COLLATE "C",
    ADD COLUMN queue_key         text COLLATE "C",
    ADD COLUMN queue_admitted_at timestamptz,
    ADD CONSTRAINT remote_tasks_queue_fields
        CHECK (queue IS NOT NULL OR (queue_key IS NULL AND queue_admitted_at IS NULL));

-- Serves `keiro_remote_tasks_claim` for tasks on no queue, as before.
DROP INDEX remote_tasks_pending_idx;
CREATE INDEX remote_tasks_pending_idx ON remote_tasks (grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NULL;

-- Tasks waiting for a queue's admission, in claim order, per queue and group, and per queue,
-- key and group (whose (queue, queue_key) prefix is also the skip scan of the waiting keys).
CREATE INDEX remote_tasks_queue_waiting_idx
    ON remote_tasks (queue, grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NOT NULL;
CREATE INDEX remote_tasks_queue_key_waiting_idx
    ON remote_tasks (queue, queue_key, grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NOT NULL;

-- Slots held: claimed tasks of a queue (the claim's expiry is tested on the heap row).
CREATE INDEX remote_tasks_queue_slots_idx ON remote_tasks (queue, queue_key)
    WHERE status = 'running' AND queue IS NOT NULL;

-- Rate windows: first claims per queue and per key.
CREATE INDEX remote_tasks_queue_admitted_idx ON remote_tasks (queue, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;
CREATE INDEX remote_tasks_queue_key_admitted_idx
    ON remote_tasks (queue, queue_key, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;
