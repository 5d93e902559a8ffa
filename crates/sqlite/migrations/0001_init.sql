-- keiro-sqlite 0001: every table of the PostgreSQL schema as of its migration 0019 (with the
-- function files of revision 11), in SQLite's terms.
--
-- How the types map, once for every table:
-- * text keys keep PostgreSQL's "C" collation: SQLite's default BINARY compares bytes, the same;
-- * jsonb is TEXT holding the JSON keiro wrote (the store parses and compares it in Rust);
-- * timestamptz is INTEGER microseconds since the Unix epoch, UTC: PostgreSQL's precision, and
--   integers compare and add exactly (the store's clock is passed in, never SQLite's);
-- * boolean is INTEGER 0/1, uuid is TEXT in its hyphenated form, text[] is a JSON array (TEXT);
-- * bigint GENERATED ALWAYS AS IDENTITY is INTEGER PRIMARY KEY AUTOINCREMENT: never reused,
--   so `seq` keeps giving the global order of appends even after deletes.
-- CHECK constraints are PostgreSQL's, so a row one store refuses the other refuses too. The
-- indexes are PostgreSQL's (partial ones too: SQLite has partial indexes); each names what it
-- serves there.
-- A constant list of more than two values (`status IN ('a', 'b', 'c')`) is never written in a
-- CHECK, a partial index's WHERE or a trigger's WHEN: SQLite evaluates such a list through a
-- temporary b-tree built afresh each time, and these run on every write of the row. They are
-- spelled as `=` ... `OR`, or as the complement of two values (`status NOT IN ('running',
-- 'suspended')` is terminal), and a query a partial index serves repeats the index's spelling.

CREATE TABLE workflows (
    workflow_name         TEXT    NOT NULL,
    workflow_id           TEXT    NOT NULL,
    generation            INTEGER NOT NULL DEFAULT 0,
    status                TEXT    NOT NULL DEFAULT 'running'
        CHECK (status = 'running' OR status = 'suspended' OR status = 'completed'
               OR status = 'failed' OR status = 'cancelled'),
    input                 TEXT    NOT NULL DEFAULT 'null',
    output                TEXT,
    attempts              INTEGER NOT NULL DEFAULT 0,
    last_error            TEXT,
    next_attempt_at       INTEGER,
    lease_owner           TEXT,
    lease_epoch           INTEGER NOT NULL DEFAULT 0,
    lease_expires_at      INTEGER,
    wake_after            INTEGER,
    parent_name           TEXT,
    parent_id             TEXT,
    priority              INTEGER NOT NULL DEFAULT 0,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    completed_at          INTEGER,
    parent_generation     INTEGER,
    parent_step           TEXT,
    awaited               INTEGER NOT NULL DEFAULT 0,
    deliveries_generation INTEGER,
    deliveries            INTEGER,
    deliveries_bytes      INTEGER,
    deliveries_read       INTEGER,
    deliveries_read_bytes INTEGER,
    parked_on             TEXT,
    PRIMARY KEY (workflow_name, workflow_id),
    CHECK ((parent_name IS NULL) = (parent_id IS NULL)),
    CHECK ((parent_generation IS NULL) = (parent_step IS NULL)
           AND (parent_step IS NULL OR parent_name IS NOT NULL))
) WITHOUT ROWID;

CREATE INDEX workflows_active_idx ON workflows (status, wake_after)
    WHERE status IN ('running', 'suspended');
CREATE INDEX workflows_running_claim_idx
    ON workflows (priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running';
CREATE INDEX workflows_live_children_idx ON workflows (parent_name, parent_id)
    WHERE parent_name IS NOT NULL AND status IN ('running', 'suspended');
CREATE INDEX workflows_parent_link_idx
    ON workflows (parent_name, parent_id, parent_generation, parent_step)
    WHERE parent_step IS NOT NULL;
CREATE INDEX workflows_terminal_idx ON workflows (completed_at)
    WHERE status NOT IN ('running', 'suspended');
CREATE INDEX workflows_list_created_idx ON workflows (created_at, workflow_name, workflow_id);
CREATE INDEX workflows_list_id_idx ON workflows (workflow_id);
CREATE INDEX workflows_list_name_idx ON workflows (workflow_name, created_at, workflow_id);
CREATE INDEX workflows_list_parent_idx
    ON workflows (parent_name, parent_id, created_at, workflow_name, workflow_id)
    WHERE parent_name IS NOT NULL;
CREATE INDEX workflows_list_status_idx
    ON workflows (status, created_at, workflow_name, workflow_id);

-- The append-only log. PostgreSQL dropped the journal's foreign key for its cost and keeps the
-- cascade as a trigger (journal.sql); the same trigger here keeps the two stores alike.
CREATE TABLE journal (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    step_name     TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    payload       TEXT    NOT NULL,
    recorded_at   INTEGER NOT NULL,
    CONSTRAINT journal_step_key UNIQUE (workflow_name, workflow_id, generation, step_name)
);

CREATE TRIGGER workflows_delete_journal AFTER DELETE ON workflows
BEGIN
    DELETE FROM journal
    WHERE workflow_name = OLD.workflow_name AND workflow_id = OLD.workflow_id;
END;

CREATE TABLE timers (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    step          TEXT    NOT NULL,
    kind          TEXT    NOT NULL CHECK (kind IN ('sleep', 'signal_timeout')),
    token         TEXT,
    fire_at       INTEGER NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'scheduled'
        CHECK (status = 'scheduled' OR status = 'firing' OR status = 'fired'),
    attempts      INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    fired_at      INTEGER,
    PRIMARY KEY (workflow_name, workflow_id, generation, step),
    CHECK ((kind = 'signal_timeout') = (token IS NOT NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
) WITHOUT ROWID;

CREATE INDEX timers_scheduled_idx ON timers (fire_at) WHERE status = 'scheduled';
CREATE INDEX timers_firing_idx ON timers (updated_at) WHERE status = 'firing';

CREATE TABLE awakeables (
    id            TEXT    PRIMARY KEY,
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    status        TEXT    NOT NULL DEFAULT 'pending'
        CHECK (status = 'pending' OR status = 'completed' OR status = 'cancelled'),
    payload       TEXT,
    created_at    INTEGER NOT NULL,
    settled_at    INTEGER,
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE INDEX awakeables_pending_idx ON awakeables (created_at) WHERE status = 'pending';
CREATE INDEX awakeables_owner_idx ON awakeables (workflow_name, workflow_id);

-- awakeable.sql's `journal_marker_settles_awakeables`: a `cancelled` or `continued` marker
-- cancels the pending awakeables of the generation it closes, in the marker's transaction.
-- (SQLite has no row locks to skip: the writer is alone in its transaction.)
CREATE TRIGGER journal_marker_settles_awakeables AFTER INSERT ON journal
    WHEN NEW.kind IN ('cancelled', 'continued')
BEGIN
    UPDATE awakeables SET status = 'cancelled', settled_at = NEW.recorded_at
    WHERE workflow_name = NEW.workflow_name AND workflow_id = NEW.workflow_id
      AND generation = NEW.generation AND status = 'pending';
END;

CREATE TABLE signal_buffer (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    token      TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

CREATE INDEX signal_buffer_token_idx ON signal_buffer (token, seq);
CREATE INDEX signal_buffer_expires_idx ON signal_buffer (expires_at);

-- `seq` is an identity column in PostgreSQL that is not the key; SQLite allows AUTOINCREMENT
-- on the INTEGER PRIMARY KEY only, so the key is kept as a UNIQUE constraint instead.
CREATE TABLE signal_waiters (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    token         TEXT    NOT NULL,
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    step          TEXT    NOT NULL,
    created_at    INTEGER NOT NULL,
    UNIQUE (workflow_name, workflow_id, generation, step),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE INDEX signal_waiters_token_idx ON signal_waiters (token, seq);

CREATE TABLE remote_tasks (
    step_id             TEXT    PRIMARY KEY,
    workflow_name       TEXT    NOT NULL,
    workflow_id         TEXT    NOT NULL,
    generation          INTEGER NOT NULL,
    step                TEXT    NOT NULL,
    journal_step        TEXT    NOT NULL,
    grp                 TEXT    NOT NULL,
    input               TEXT    NOT NULL,
    priority            INTEGER NOT NULL DEFAULT 0,
    traceparent         TEXT,
    status              TEXT    NOT NULL DEFAULT 'pending'
        CHECK (status = 'pending' OR status = 'running' OR status = 'completed'
               OR status = 'failed' OR status = 'cancelled'),
    attempts            INTEGER NOT NULL DEFAULT 0,
    max_attempts        INTEGER NOT NULL CHECK (max_attempts >= 1),
    backoff_initial_ms  INTEGER NOT NULL,
    backoff_max_ms      INTEGER NOT NULL,
    backoff_jitter      INTEGER NOT NULL,
    dispatches          INTEGER NOT NULL DEFAULT 1,
    redispatch_after_ms INTEGER,
    redispatch_max      INTEGER NOT NULL CHECK (redispatch_max >= 1),
    deadline_at         INTEGER,
    available_at        INTEGER NOT NULL,
    claim               TEXT,
    claimed_by          TEXT,
    claim_expires_at    INTEGER,
    output              TEXT,
    last_error          TEXT,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    settled_at          INTEGER,
    CHECK ((status = 'running') = (claim IS NOT NULL)),
    CHECK ((claim IS NULL) = (claim_expires_at IS NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE INDEX remote_tasks_pending_idx
    ON remote_tasks (grp, priority DESC, available_at, created_at) WHERE status = 'pending';
CREATE INDEX remote_tasks_running_idx ON remote_tasks (claim_expires_at)
    WHERE status = 'running';
CREATE INDEX remote_tasks_owner_idx ON remote_tasks (workflow_name, workflow_id, generation);
CREATE INDEX remote_tasks_failed_idx ON remote_tasks (workflow_name, workflow_id)
    WHERE status = 'failed';

CREATE TABLE schedules (
    name          TEXT    PRIMARY KEY,
    workflow_name TEXT    NOT NULL,
    cron          TEXT,
    interval_ms   INTEGER CHECK (interval_ms >= 1000),
    time_zone     TEXT    NOT NULL DEFAULT 'UTC',
    input         TEXT    NOT NULL DEFAULT 'null',
    overlap       TEXT    NOT NULL CHECK (overlap = 'skip' OR overlap = 'buffer_one'
                                         OR overlap = 'allow_all'),
    catch_up      TEXT    NOT NULL CHECK (catch_up = 'none' OR catch_up = 'last'
                                          OR catch_up = 'all'),
    catch_up_max  INTEGER NOT NULL DEFAULT 0 CHECK (catch_up_max >= 0),
    paused        INTEGER NOT NULL DEFAULT 0,
    next_tick     INTEGER,
    last_tick     INTEGER,
    buffered_tick INTEGER,
    last_instance TEXT,
    last_error    TEXT,
    revision      INTEGER NOT NULL DEFAULT 1,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    failures      INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    retry_at      INTEGER,
    CHECK ((cron IS NULL) <> (interval_ms IS NULL))
);

CREATE INDEX schedules_next_tick_idx ON schedules (next_tick) WHERE NOT paused;
CREATE INDEX schedules_buffered_idx ON schedules (name)
    WHERE NOT paused AND buffered_tick IS NOT NULL;

CREATE TABLE schedule_leader (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    owner      TEXT,
    epoch      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER
);
