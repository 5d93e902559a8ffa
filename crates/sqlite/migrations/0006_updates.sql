-- keiro-sqlite 0006: updates, the twin of PostgreSQL's migration 0024 (with the update.sql of
-- that version), in SQLite's terms as 0001 states them (instants are microseconds since the
-- epoch, JSON is text).
--
-- One row per (instance, update id): the caller's request under an update name, where it
-- stands, and the answer (the answer's journaled value, or {"status": ..} for an update the
-- run ended without answering). The store's `update` module writes them; delivery to the run
-- rides on the signal tables. Every row goes with its instance: the foreign key cascades when
-- retention deletes the instance row (a rowid table, as 0005 says why).

CREATE TABLE workflow_updates (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    update_id     TEXT    NOT NULL,
    update_name   TEXT    NOT NULL,
    request       TEXT    NOT NULL,
    state         TEXT    NOT NULL DEFAULT 'requested'
        CHECK (state IN ('requested', 'replied', 'rejected', 'unanswered')),
    reply         TEXT,
    requested_at  INTEGER NOT NULL,
    settled_at    INTEGER,
    PRIMARY KEY (workflow_name, workflow_id, update_id),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE,
    CHECK ((state = 'requested') = (reply IS NULL))
);

CREATE INDEX workflow_updates_requested_idx ON workflow_updates (workflow_name, workflow_id)
    WHERE state = 'requested';

-- update.sql's `workflows_settle_updates`: a run's terminal transition settles its updates
-- still `requested` as `unanswered`, in the transaction that ends it (its callers are woken by
-- the `closed` notification of 0002's trigger).
CREATE TRIGGER workflows_settle_updates AFTER UPDATE OF status ON workflows
    WHEN NEW.status IN ('completed', 'failed', 'cancelled')
     AND OLD.status NOT IN ('completed', 'failed', 'cancelled')
BEGIN
    UPDATE workflow_updates
    SET state = 'unanswered', reply = json_object('status', NEW.status),
        settled_at = NEW.updated_at
    WHERE workflow_name = NEW.workflow_name AND workflow_id = NEW.workflow_id
      AND state = 'requested';
END;
