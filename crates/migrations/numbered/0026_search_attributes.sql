-- keiro 0026: search attributes, the typed name-value pairs operators find runs by
-- (functions in attribute.sql).
--
-- One row per attribute of an instance: the tagged value as the API returns it (`value`), and
-- the same value in the one typed column a filter compares (text and booleans in
-- `text_value`, integers and floats in `num_value`, instants in `time_value`). A side table
-- rather than a jsonb column on `workflows`: a GIN index on jsonb serves equality but not
-- ranges, and a btree per kind serves both; the instance row also stays as narrow as the
-- claim and append paths need it (its updates stay HOT). Rows are written in the transaction
-- of the start that creates the instance, or of the body's journaled set, and go with their
-- instance (retention deletes the instance row; the foreign key cascades).

CREATE TABLE workflow_attributes (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    attr          text COLLATE "C" NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('text', 'int', 'float', 'bool', 'time')),
    value         jsonb       NOT NULL,
    text_value    text COLLATE "C",
    num_value     double precision,
    time_value    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, attr),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- The list's attribute filters (crates/postgres/src/inspect.rs, FILTER_ATTR_*): an equality
-- or a range on one kind's column of one attribute is one range of one of these, and the
-- instance key at their end answers the list's semi-join from the index alone. Partial: each
-- holds only the rows of its kinds.
CREATE INDEX workflow_attributes_text_idx
    ON workflow_attributes (attr, text_value, workflow_name, workflow_id)
    WHERE text_value IS NOT NULL;
CREATE INDEX workflow_attributes_num_idx
    ON workflow_attributes (attr, num_value, workflow_name, workflow_id)
    WHERE num_value IS NOT NULL;
CREATE INDEX workflow_attributes_time_idx
    ON workflow_attributes (attr, time_value, workflow_name, workflow_id)
    WHERE time_value IS NOT NULL;
