-- keiro-sqlite 0002: the notification table, SQLite's stand-in for PostgreSQL's `<schema>.wake`
-- channel (crates/migrations/functions/notify.sql), so that stores in other processes on the
-- same file hear of a change (the store's `notify` module polls it).
--
-- A row is written in the transaction of the change it announces, so a rolled-back change
-- announces nothing and a reader sees a row only once the change is committed. Kinds, as the
-- Postgres payloads: `wake` (`<name>/<id>`: the instance may be runnable), `timer` (a timer was
-- armed), `remote` (a remote task became claimable), `closed` (`done:<name>/<id>`: the instance
-- reached a terminal status). `seq` is AUTOINCREMENT: never reused, and a rolled-back insert
-- gives its number back, so committed rows are numbered without gaps and a reader that finds a
-- gap knows rows were pruned before it read them.
CREATE TABLE keiro_notifications (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind          TEXT    NOT NULL
        CHECK (kind = 'wake' OR kind = 'timer' OR kind = 'remote' OR kind = 'closed'),
    workflow_name TEXT,
    workflow_id   TEXT,
    CHECK ((kind IN ('wake', 'closed'))
           = (workflow_name IS NOT NULL AND workflow_id IS NOT NULL))
);

-- notify.sql's `workflows_notify_terminal`: every terminal transition, however it happens
-- (completion, each kind of failure, cancellation plain or cascading), announces `closed`.
-- Unlike PostgreSQL's, not only for rows marked `awaited`: there a NOTIFY takes a lock held
-- across the commit's WAL flush, so only awaited rows pay it; here a row in a transaction that
-- commits anyway costs one insert, where marking the row awaited would cost a commit.
CREATE TRIGGER workflows_notify_closed AFTER UPDATE OF status ON workflows
    WHEN NEW.status NOT IN ('running', 'suspended')
     AND OLD.status IN ('running', 'suspended')
BEGIN
    INSERT INTO keiro_notifications (kind, workflow_name, workflow_id)
    VALUES ('closed', NEW.workflow_name, NEW.workflow_id);
END;

-- The table stays bounded: every 256th row deletes those more than 4096 rows older, in the
-- inserting transaction. A reader that falls further behind than that finds a gap and tells
-- its subscribers to poll, as a LISTEN reconnection does.
CREATE TRIGGER keiro_notifications_prune AFTER INSERT ON keiro_notifications
    WHEN NEW.seq % 256 = 0
BEGIN
    DELETE FROM keiro_notifications WHERE seq <= NEW.seq - 4096;
END;
