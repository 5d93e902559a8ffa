-- keiro-sqlite 0004: remote steps on a queue, the twin of PostgreSQL's migration 0022 (with the
-- remote.sql and queue.sql of that version), in SQLite's terms as 0001 states them.
--
-- A remote step armed with a queue (and a key) records them on its task, which waits
-- (`pending`) until a remote worker's claim admits it within the queue's limits, the limits the
-- runs started on that queue are admitted under. A task holds a slot while it is claimed and
-- its claim has not expired; the rate windows count first claims (`queue_admitted_at`, set
-- once). Run admission and task claims count slots and first admissions of both kinds through
-- the same functions (the store's `queue::held`).

ALTER TABLE remote_tasks ADD COLUMN queue TEXT;
ALTER TABLE remote_tasks ADD COLUMN queue_key TEXT CHECK (queue IS NOT NULL OR queue_key IS NULL);
ALTER TABLE remote_tasks ADD COLUMN queue_admitted_at INTEGER
    CHECK (queue IS NOT NULL OR queue_admitted_at IS NULL);

-- The claim of tasks on no queue, as before: a backlog held back by a limit costs it nothing.
DROP INDEX remote_tasks_pending_idx;
CREATE INDEX remote_tasks_pending_idx
    ON remote_tasks (grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NULL;

-- Tasks waiting for a queue's admission, in claim order, per queue and group, and per queue,
-- key and group (whose (queue, queue_key) prefix is also the walk of the waiting keys).
CREATE INDEX remote_tasks_queue_waiting_idx
    ON remote_tasks (queue, grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NOT NULL;
CREATE INDEX remote_tasks_queue_key_waiting_idx
    ON remote_tasks (queue, queue_key, grp, priority DESC, available_at, created_at)
    WHERE status = 'pending' AND queue IS NOT NULL;

-- Slots held: claimed tasks of a queue (the claim's expiry is tested on the table row).
CREATE INDEX remote_tasks_queue_slots_idx ON remote_tasks (queue, queue_key)
    WHERE status = 'running' AND queue IS NOT NULL;

-- Rate windows: first claims per queue and per key.
CREATE INDEX remote_tasks_queue_admitted_idx ON remote_tasks (queue, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;
CREATE INDEX remote_tasks_queue_key_admitted_idx
    ON remote_tasks (queue, queue_key, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;

-- queue.sql's `remote_tasks_queue_slot_freed`: a slot freed by a task of a queue (it left
-- `running`) wakes the remote workers and the workflow workers, as a run's freed slot does.
CREATE TRIGGER remote_tasks_queue_slot_freed AFTER UPDATE OF status ON remote_tasks
    WHEN NEW.queue IS NOT NULL AND OLD.status = 'running' AND NEW.status <> 'running'
BEGIN
    INSERT INTO keiro_notifications (kind, workflow_name, workflow_id)
    VALUES ('remote', NULL, NULL);
    INSERT INTO keiro_notifications (kind, workflow_name, workflow_id)
    VALUES ('wake', 'queue', NEW.queue);
END;

-- queue.sql's `keiro_queue_slot_freed`, its remote half: a run's freed slot also wakes the
-- remote workers when tasks of its queue wait.
CREATE TRIGGER workflows_queue_slot_freed_remote AFTER UPDATE OF status, queue_admitted
    ON workflows
    WHEN OLD.queue_admitted
     AND (NOT NEW.queue_admitted OR NEW.status NOT IN ('running', 'suspended'))
     AND OLD.status IN ('running', 'suspended')
     AND EXISTS (SELECT 1 FROM remote_tasks t
                 WHERE t.queue = NEW.queue AND t.status = 'pending' AND t.queue IS NOT NULL)
BEGIN
    INSERT INTO keiro_notifications (kind, workflow_name, workflow_id)
    VALUES ('remote', NULL, NULL);
END;
