-- keiro 0001: the instance row and the journal (and, as shipped, one function per
-- multi-statement store operation).
--
-- Every name below is unqualified on purpose: the runner applies this file with the
-- connection's search_path set to the target schema, and the store's connections use the same
-- search_path, so two schemas in one database are two fully isolated keiro installations.
--
-- Each store operation that needs more than one statement is one plpgsql function, so it is
-- one round trip and one transaction whatever the client does. The functions report outcomes
-- as text codes instead of raising, because an exception block would open a subtransaction on
-- every call and a raised error would have to be parsed back into a typed outcome.
--
-- Wake notifications go to the channel `<schema>.wake` with the payload `<name>/<id>`
-- (neither part may contain `/`), sent inside the transaction that changed the row, so a
-- listener is told only about committed changes.
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (notify.sql, journal.sql, instance.sql, lease.sql), in their current form; this file keeps
-- its tables, indexes and data changes.

-- The instance row: the complete wake ledger of one workflow instance.
--
-- Identities use the "C" collation: they are keys, not prose, so they compare byte-wise in
-- every database (the memory store orders them the same way) and compare cheaply.
CREATE TABLE workflows (
    workflow_name    text COLLATE "C" NOT NULL,
    workflow_id      text COLLATE "C" NOT NULL,
    generation       integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'running'
        CHECK (status IN ('running', 'suspended', 'completed', 'failed', 'cancelled')),
    input            jsonb       NOT NULL DEFAULT 'null',
    output           jsonb,
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    next_attempt_at  timestamptz,
    lease_owner      text,
    lease_epoch      bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    wake_after       timestamptz,
    parent_name      text COLLATE "C",
    parent_id        text COLLATE "C",
    priority         integer     NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (workflow_name, workflow_id),
    CHECK ((parent_name IS NULL) = (parent_id IS NULL))
);

-- Serves discovery (`instances_runnable`): `status = 'running' OR (status = 'suspended' AND
-- wake_after <= now)`. Partial, so terminal instances, which accumulate until retention GC,
-- cost nothing to discovery; a parked instance without a due wake_after is skipped inside the
-- index. The GC index on terminal rows comes with the GC query that needs it.
CREATE INDEX workflows_active_idx ON workflows (status, wake_after)
    WHERE status IN ('running', 'suspended');

-- The append-only log. `seq` gives a global order; per instance it is also the commit order,
-- because every writer of an instance's journal first locks its instance row.
CREATE TABLE journal (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step_name     text COLLATE "C" NOT NULL,
    kind          text        NOT NULL,
    payload       jsonb       NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    -- Exactly one record per (instance, generation, step). The index also serves loading one
    -- generation and the whole history (prefix scans) and the existence checks of appends.
    CONSTRAINT journal_step_key UNIQUE (workflow_name, workflow_id, generation, step_name),
    -- A journal row never outlives its instance; retention GC deletes the instance row only.
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);
