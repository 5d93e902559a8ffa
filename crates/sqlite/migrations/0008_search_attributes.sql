-- keiro-sqlite 0008: search attributes, the twin of PostgreSQL's migration 0026 (with the
-- attribute.sql of that version), in SQLite's terms as 0001 states them (instants are
-- microseconds since the epoch, JSON is text).
--
-- One row per attribute of an instance: the tagged value as the API returns it (`value`), and
-- the same value in the one typed column a filter compares (text and booleans in
-- `text_value`, integers and floats in `num_value`, instants in `time_value`), each served by
-- a partial index for equality and ranges. Rows go with their instance: the foreign key
-- cascades when retention deletes the instance row. A rowid table, as 0005's are, so the
-- cascade from the instance's delete builds no temporary b-tree.

CREATE TABLE workflow_attributes (
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    attr          TEXT    NOT NULL,
    -- ORs, not IN: a constant IN list of more than two values builds a temporary b-tree on
    -- every write (the `open` test `no_single_row_write_builds_a_temporary_btree`).
    kind          TEXT    NOT NULL CHECK (kind = 'text' OR kind = 'int' OR kind = 'float'
                                          OR kind = 'bool' OR kind = 'time'),
    value         TEXT    NOT NULL,
    text_value    TEXT,
    num_value     REAL,
    time_value    INTEGER,
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (workflow_name, workflow_id, attr),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

CREATE INDEX workflow_attributes_text_idx
    ON workflow_attributes (attr, text_value, workflow_name, workflow_id)
    WHERE text_value IS NOT NULL;
CREATE INDEX workflow_attributes_num_idx
    ON workflow_attributes (attr, num_value, workflow_name, workflow_id)
    WHERE num_value IS NOT NULL;
CREATE INDEX workflow_attributes_time_idx
    ON workflow_attributes (attr, time_value, workflow_name, workflow_id)
    WHERE time_value IS NOT NULL;
