-- keiro 0016: an instance someone awaits the result of notifies when it reaches a terminal
-- status (completed, failed, cancelled), so the caller (`Keiro::result`) wakes at once instead
-- of at its next poll.
--
-- Only awaited instances notify. A notifying commit takes the NOTIFY queue's lock before its
-- commit record is flushed and holds it until the flush ends (0005's header), so notifying
-- every completion serialized the completions on the WAL flush: measured, `keiro bench -n
-- 6000` fell from 230-315 to 110-160 workflows/s in interleaved pairs. A waiter therefore marks
-- the row first (`awaited`, set by the Postgres store when its first wait starts), and the
-- trigger's WHEN clause, evaluated inline on each status update, lets only marked rows
-- notify: a run nobody awaits pays one boolean test.
--
-- One trigger on the instance row, not a line in each function that closes a run: completion,
-- failure (a body's, a crash at the ceiling, a divergence) and cancellation (one instance or a
-- cascade) all end in an UPDATE of `workflows.status`, so the trigger sees every terminal
-- transition, including those of functions later migrations replace.
--
-- The mark and a close serialize on the row lock: a mark that commits first makes the close
-- notify; a close that commits first is what the mark's UPDATE then finds (it re-checks the
-- status after waiting for the lock), and the waiter reads the row instead of waiting. The
-- mark stays set: a run an operator revives notifies again when it closes, at the cost of one
-- NOTIFY.
--
-- The payload is `done:<name>/<id>` on the usual `<schema>.wake` channel, so one LISTEN
-- connection per store serves the resume loops and every result waiter. Names and ids cannot
-- contain `:`, so no instance payload (`<name>/<id>`) starts like it; the listener routes it to
-- the waiters of that instance only, and resume loops are not woken by it. It is sent at
-- commit, like every NOTIFY, so a waiter that wakes reads the terminal row.

-- A constant default: no table rewrite.
ALTER TABLE workflows ADD COLUMN awaited boolean NOT NULL DEFAULT false;

CREATE FUNCTION keiro_notify_terminal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake',
                      'done:' || NEW.workflow_name || '/' || NEW.workflow_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER workflows_notify_terminal AFTER UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.awaited
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION keiro_notify_terminal();

DO $$
BEGIN
    EXECUTE pg_catalog.format('ALTER FUNCTION keiro_notify_terminal() '
                              'SET search_path = %I, pg_temp',
                              pg_catalog.current_schema());
END;
$$;
