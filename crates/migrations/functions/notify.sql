-- keiro's notifications, and the trigger that tells result waiters an instance finished.
--
-- Everything goes to the channel `<schema>.wake`, sent inside the transaction that caused it,
-- so a listener hears only of committed changes. Payloads: `<name>/<id>` (the instance may be
-- runnable; neither part may contain `/`), `timer`, `remote`, `done:<name>/<id>` (an
-- awaited instance finished) and `msg:<name>/<id>` (the instance set an event or wrote to a
-- stream). Only instance payloads contain a `/` without a `:` before it, so no two kinds can
-- be confused.

-- The three senders are plpgsql, not `LANGUAGE sql`: a SQL function that cannot be inlined
-- (these return void) is parsed and planned again by every statement that calls it, where
-- plpgsql keeps its plan for the session.

-- Sends the wake notification of one instance on this schema's channel.
-- Called by: SQL only (every wake), keiro_postgres ops::instance::instance_mark_awaited; tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_wake(p_name text, p_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake', p_name || '/' || p_id);
END;
$$;

-- Tells the readers of an instance's events and streams that it set one or wrote to one.
-- Listeners wake only the readers of that instance with it, never the worker loops.
-- Called by: SQL only (keiro_notify_message_if_watched, update.sql's settle trigger); tested
-- in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_message(p_name text, p_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake', 'msg:' || p_name || '/' || p_id);
END;
$$;

-- keiro_notify_message, only for an instance a reader elsewhere watches (migration 0023's
-- `watched`): the writes of events, streams and update answers call this, so an unwatched
-- run's writes send no NOTIFY (a NOTIFY serializes commits; its readers, all in the writing
-- process, are woken there).
-- Called by: SQL only (message.sql, update.sql); tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_message_if_watched(p_name text, p_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workflows w
               WHERE w.workflow_name = p_name AND w.workflow_id = p_id AND w.watched) THEN
        PERFORM keiro_notify_message(p_name, p_id);
    END IF;
END;
$$;

-- Tells timer loops that a timer was armed, so the earliest due time may have moved closer.
-- Called by: SQL only (keiro_timer_arm); tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_timer() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake', 'timer');
END;
$$;

-- Tells remote workers that a task became claimable.
-- Called by: SQL only (whatever makes a remote task claimable); tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_remote() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake', 'remote');
END;
$$;

-- An instance someone awaits the result of notifies `done:<name>/<id>` when it reaches a
-- terminal status, so the caller (`Keiro::result`) wakes at once instead of at its next poll.
-- Only rows marked `awaited` (by the Postgres store, when a first wait starts) notify: the
-- WHEN clause lets a run nobody awaits pay one boolean test, where notifying every completion
-- would serialize completions on the WAL flush. A trigger on the instance row, so every
-- terminal transition (completion, every kind of failure, cancellation plain or cascading) is
-- seen. The mark and a close serialize on the row lock (`instance_mark_awaited`).
-- Called by: trigger workflows_notify_terminal; tested in crates/postgres/tests only (LISTEN).
CREATE OR REPLACE FUNCTION keiro_notify_terminal() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(current_schema() || '.wake',
                      'done:' || NEW.workflow_name || '/' || NEW.workflow_id);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER workflows_notify_terminal AFTER UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.awaited
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION keiro_notify_terminal();
