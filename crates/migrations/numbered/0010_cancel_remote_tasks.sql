-- keiro 0010: cancelling a run cancels its remote tasks; so does leaving a generation by
-- continue-as-new.
--
-- Until now a task outlived the run that awaited it: cancel and cancel-cascade never touched
-- `remote_tasks`, and claims, retries and heartbeats never looked at the owner, so a worker
-- would still charge the card of a cancelled order, and retry the charge when it failed; its
-- result was then refused by the cancelled owner. The same held for a task of a generation its
-- run had left by continuing as new (a remote step dispatched beside a step action, which the
-- body then gave up on).
--
-- * A task has a new final status, `cancelled`. The `cancelled` and `continued` markers, in the
--   transaction that appends them (`keiro_journal_append_to`, through which every cancel goes:
--   `keiro_instance_cancel` plain or cascading, for each instance it cancels, and an external
--   marker), cancel the pending and claimed tasks of the generation they close
--   (`keiro_remote_tasks_cancel`): the claim is dropped, `settled_at` set, the output and the
--   last error stay as they were. Settled tasks keep their result. A failed run's tasks are
--   left alone: a requeue may still use their results.
-- * A claim takes only `pending` tasks, and its sweep only `running` ones, so a cancelled task
--   is never claimed again; a re-arm leaves it as it is.
-- * A heartbeat (`keiro_remote_task_heartbeat`, one round trip as before) says whether the
--   claim was extended, lost, or cancelled; the remote worker tells the handler, which can stop.
-- * A report of a cancelled task, success or failure, from any claim, is refused with outcome
--   `cancelled`: nothing is journaled and a failure is not retried.
--
-- Why a status rather than settling the task with an error envelope: no run will ever read the
-- envelope (a cancelled run is never resumed, a generation left behind is never driven again),
-- and the status tells an operator, and `RemoteAdmin::remote_tasks`, what happened.
--
-- The race with an arm. An arm read the owner's row without a lock, so a cancellation could
-- commit between that read and the arm's commit, miss the task the arm was writing (not yet
-- committed), and leave it pending for a cancelled run. The arm now reads the row FOR KEY
-- SHARE, the weakest lock that conflicts with the FOR UPDATE every append takes on it (the
-- marker's included; an instance claim's UPDATE does not wait for it), so either the arm waits
-- and then sees the row cancelled (nothing written), or the cancellation waits for the arm's
-- commit and then cancels the task it wrote. The park that follows an arm locks the row anyway.
--
-- Lock order: 0005's, task rows before instance rows. A marker that cancels tasks locks the
-- live tasks of its generation before the instance row; the cascading cancel locks the live
-- tasks of the whole tree before the tree (deepest first, as in 0002). A task armed after
-- those locks were taken is locked after the instance row, which only a report of that very
-- task, made in the moment between its arm's commit and the cancellation's, could meet in a
-- deadlock; the server breaks it (see 0007), and a failed cancel is a retryable error.
--
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (journal.sql, instance.sql, remote.sql), in their current form; this file keeps its tables,
-- indexes and data changes.

-- Widened, then backfilled.
ALTER TABLE remote_tasks DROP CONSTRAINT remote_tasks_status_check;
ALTER TABLE remote_tasks ADD CONSTRAINT remote_tasks_status_check
    CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled'));

-- The tasks already orphaned: pending or claimed for a cancelled run, or for a generation its
-- run has left.
UPDATE remote_tasks t SET
    status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
    settled_at = now(), updated_at = now()
FROM workflows w
WHERE w.workflow_name = t.workflow_name AND w.workflow_id = t.workflow_id
  AND t.status IN ('pending', 'running')
  AND (w.status = 'cancelled' OR t.generation <> w.generation);
