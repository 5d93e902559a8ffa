-- keiro-sqlite 0006: updates, the twin of PostgreSQL's migration 0024 (with the update.sql of
-- that version), in SQLite's terms as 0001 states them (instants are microseconds since the
-- epoch, JSON is text).
--
-- One row per (instance, update id): the caller's request under an update name, where it
-- stands, and the answer (the answer's journaled value, or {"status": ..} for an update the
-- run ended without answering). The store's `update` module writes them; delivery to the run
-- rides on the signal tables. Every row goes with its instance: the foreign key cascades when
-- retention deletes the instance row (a rowid table, as 0005 says why).

-- As PostgreSQL's 0024: set by an instance's first update, so the trigger below costs a run
-- that never got one nothing.
ALTER TABLE workflows ADD COLUMN has_updates INTEGER NOT NULL DEFAULT 0;

CREATE TABLE workflow_updates (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    update_id     TEXT    NOT NULL,
    update_name   TEXT    NOT NULL,
    request       TEXT    NOT NULL,
    -- Equalities, not IN: an IN list compiles to a temporary b-tree on every write.
    state         TEXT    NOT NULL DEFAULT 'requested'
        CHECK (state = 'requested' OR state = 'replied' OR state = 'rejected'
               OR state = 'unanswered'),
    reply         TEXT,
    requested_at  INTEGER NOT NULL,
    settled_at    INTEGER,
    PRIMARY KEY (workflow_name, workflow_id, update_id),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE,
    CHECK ((state = 'requested') = (reply IS NULL))
);

-- No partial index of the `requested` rows as PostgreSQL has: the settle below would then
-- collect the rows it changes into a temporary b-tree at every terminal transition (a column of
-- the index's condition changes); the primary key's prefix finds an instance's updates, which
-- are few.

-- update.sql's `workflows_settle_updates`: a run's terminal transition deletes the updates
-- still buffered on its tokens (no run will take them) and settles its updates still
-- `requested` as `unanswered`, in the transaction that ends it (its callers are woken by the
-- `closed` notification of 0002's trigger). The instance's tokens are found as a range of
-- signal_buffer_token_idx: every token that starts with `U+001F update/<name>/<id>/` sorts,
-- bytewise, from that prefix up to the same with `0` in place of the last `/` (the next
-- character; names and ids hold no `/`). The condition names the two live statuses, as 0002's
-- does. Both for one reason: a list of three statuses, or of the updates' tokens, would
-- compile to a temporary b-tree on every status write.
CREATE TRIGGER workflows_settle_updates AFTER UPDATE OF status ON workflows
    WHEN NEW.has_updates
     AND NEW.status NOT IN ('running', 'suspended')
     AND OLD.status IN ('running', 'suspended')
BEGIN
    DELETE FROM signal_buffer
    WHERE token >= char(31) || 'update/' || NEW.workflow_name || '/' || NEW.workflow_id || '/'
      AND token < char(31) || 'update/' || NEW.workflow_name || '/' || NEW.workflow_id || '0';
    UPDATE workflow_updates
    SET state = 'unanswered', reply = json_object('status', NEW.status),
        settled_at = NEW.updated_at
    WHERE workflow_name = NEW.workflow_name AND workflow_id = NEW.workflow_id
      AND state = 'requested';
END;
