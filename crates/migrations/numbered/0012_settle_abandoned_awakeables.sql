-- keiro 0012: cancelling a run cancels its pending awakeables; so does leaving a generation by
-- continue-as-new.
--
-- An awakeable stayed `pending` until someone completed or cancelled it by id. A cancelled run
-- is never resumed, and a generation its run left by continuing as new is never driven again,
-- so theirs were pending forever: counted by `keiro.workflow.awakeables.pending` (a count that
-- then only grew), kept in `awakeables_pending_idx`, and a late completion was accepted as
-- `owner_gone` rather than told the awakeable was gone. As 0010 does for remote tasks, the
-- `cancelled` and `continued` markers now settle them, in the transaction that writes the
-- marker: status `cancelled`, `settled_at` set, payload left NULL, nothing journaled (the
-- generation is closed). Completed and failed runs keep theirs: a failed run may be requeued
-- and still await them.
--
-- Why a trigger on the marker's journal row, not a change to `keiro_journal_append_to`: every
-- path that closes a generation writes that row (`keiro_instance_cancel` plain or cascading,
-- an external marker, a run continuing as new), and the trigger needs no copy of that function. The WHEN clause is evaluated without calling the function, so
-- the journal's hot path (step rows) pays nothing.
--
-- Lock order. `keiro_awakeable_settle` locks the awakeable, then its owner's row; the trigger
-- runs with the owner's row already locked, so it takes the pending awakeables `SKIP LOCKED`
-- instead of waiting for them: an awakeable locked at that moment is being settled by that
-- very call, which finds the owner closed and settles it anyway (`owner_gone`). A settlement
-- that fails and rolls back leaves its awakeable pending, as it would have been without this.
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (awakeable.sql), in their current form; this file keeps its tables, indexes and data changes.

-- The awakeables already abandoned: pending for a cancelled run, or for a generation its run
-- has left.
UPDATE awakeables a SET status = 'cancelled', settled_at = now()
FROM workflows w
WHERE w.workflow_name = a.workflow_name AND w.workflow_id = a.workflow_id
  AND a.status = 'pending'
  AND (w.status = 'cancelled' OR a.generation <> w.generation);
