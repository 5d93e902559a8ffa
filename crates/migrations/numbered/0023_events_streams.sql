-- keiro 0023: events and streams, what a running workflow publishes to its callers
-- (functions in message.sql).
--
-- An event is the latest value under a key of an instance; a stream is an append-only
-- sequence of items under a key, numbered from 0 without gaps. Only the run writes them, each
-- write a fenced journal step appended in the same transaction as the row here, so a reader
-- never scans the journal and a replayed write finds its step and writes nothing. Every row
-- goes with its instance (retention deletes the instance row; the foreign keys cascade).

CREATE TABLE workflow_events (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    value         jsonb       NOT NULL,
    -- How many times the event was set: 1 for the first value.
    version       bigint      NOT NULL DEFAULT 1,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, key),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- One row per stream: its next offset (= its length), its bytes for the budget, and whether
-- the run closed it. Appends lock it (after the instance row, which the append locks first),
-- so offsets are dense and the budget exact.
CREATE TABLE workflow_stream_heads (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    next_offset   bigint      NOT NULL DEFAULT 0,
    bytes         bigint      NOT NULL DEFAULT 0,
    closed        boolean     NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, key),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- The items. The primary key serves a reader's page (`stream_offset >= $from ORDER BY
-- stream_offset LIMIT n`). Like the heads they reference the instance itself: a cascade of
-- one level, so deleting an instance deletes its rows here by key, as every child table's.
CREATE TABLE workflow_streams (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    stream_offset bigint      NOT NULL CHECK (stream_offset >= 0),
    value         jsonb       NOT NULL,
    written_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, key, stream_offset),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Whether a reader in some process follows the instance's events or streams (set by the
-- Postgres store's `subscribe_messages` when its reader was not woken in its own process for
-- a second). Only watched instances notify `msg:<name>/<id>` when they write: a NOTIFY
-- takes a lock held across the commit's flush, which would serialize every run's appends.
-- Not indexed, so the mark and the writes stay HOT updates.
ALTER TABLE workflows ADD COLUMN watched boolean NOT NULL DEFAULT false;
