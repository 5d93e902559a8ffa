-- keiro-sqlite 0005: events and streams, the twin of PostgreSQL's migration 0023 (with the
-- message.sql of that version), in SQLite's terms as 0001 states them (instants are
-- microseconds since the epoch, JSON is text).
--
-- An event is the latest value under a key of an instance; a stream is an append-only
-- sequence of items under a key, numbered from 0 without gaps, with one head row holding its
-- length, its bytes and whether the run closed it. Only the run writes them, each write a
-- fenced journal step in the same transaction (the store's `message` module). Every row goes
-- with its instance: the foreign keys cascade when retention deletes the instance row. Rowid
-- tables, not WITHOUT ROWID: a cascading delete from a WITHOUT ROWID table collects the keys
-- into a temporary b-tree first, which the instance's delete should not pay (the `open` test
-- `no_single_row_write_builds_a_temporary_btree`).

CREATE TABLE workflow_events (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    value         TEXT    NOT NULL,
    version       INTEGER NOT NULL DEFAULT 1,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (workflow_name, workflow_id, key),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE TABLE workflow_stream_heads (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    next_offset   INTEGER NOT NULL DEFAULT 0,
    bytes         INTEGER NOT NULL DEFAULT 0,
    closed        INTEGER NOT NULL DEFAULT 0,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (workflow_name, workflow_id, key),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE TABLE workflow_streams (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    stream_offset INTEGER NOT NULL CHECK (stream_offset >= 0),
    value         TEXT    NOT NULL,
    written_at    INTEGER NOT NULL,
    PRIMARY KEY (workflow_name, workflow_id, key, stream_offset),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);
