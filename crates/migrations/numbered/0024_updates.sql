-- keiro 0024: updates, a caller's request into a running run that the run answers once
-- (functions in update.sql).
--
-- One row per (instance, update id): the caller's request under an update name, where it
-- stands, and the answer. A second send under the same id finds the row (the same answer);
-- the run's answer is a journal step appended in the same transaction as the row's change, and
-- the run's terminal transition settles every row still `requested` as `unanswered` in its own
-- transaction (the trigger in update.sql). Delivery to the run rides on the signal tables (one
-- token per instance and update name), so nothing here is a wake source. Every row goes with
-- its instance (retention deletes the instance row; the foreign key cascades).

CREATE TABLE workflow_updates (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    update_id     text COLLATE "C" NOT NULL,
    update_name   text COLLATE "C" NOT NULL,
    request       jsonb       NOT NULL,
    state         text        NOT NULL DEFAULT 'requested'
        CHECK (state IN ('requested', 'replied', 'rejected', 'unanswered')),
    -- The answer's journaled value ({"ok": reply} or {"rejected": message}), or
    -- {"status": <terminal status>} for `unanswered`; NULL while `requested`.
    reply         jsonb,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    settled_at    timestamptz,
    PRIMARY KEY (workflow_name, workflow_id, update_id),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE,
    CHECK ((state = 'requested') = (reply IS NULL))
);

-- The terminal transition's settle (`keiro_updates_settle_closed`) reads an instance's
-- unanswered updates only: this keeps that probe to the rows it changes.
CREATE INDEX workflow_updates_requested_idx ON workflow_updates (workflow_name, workflow_id)
    WHERE state = 'requested';

-- Whether the instance was ever sent an update: set by the first send (which holds the row's
-- lock), read by the terminal trigger's condition, so a run that never got one does not call
-- the settle at all (it cost a completion about 56,000 instructions: `scripts/sql-cost
-- complete`). Not indexed, so the change is a HOT update.
ALTER TABLE workflows ADD COLUMN has_updates boolean NOT NULL DEFAULT false;
