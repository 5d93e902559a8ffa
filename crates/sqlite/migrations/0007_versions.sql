-- keiro-sqlite 0007: runs stay on the code that started them (PostgreSQL 0025).
--
-- Every run records the application version of the store that started it (a continue-as-new,
-- of the store that continued it): the store's version, which each of its connections answers
-- as `keiro_app_version()` (an application-defined function, the counterpart of PostgreSQL's
-- `keiro.app_version` session setting), written by each insert of a run. NULL is unversioned:
-- a run started before versions existed, or by a store with no version.
ALTER TABLE workflows ADD COLUMN app_version TEXT;

-- One row per running worker, written by its heartbeat: which version it runs, which it
-- serves (NULL: any; else a JSON array), and its queues (a JSON array).
CREATE TABLE keiro_workers (
    worker_id   TEXT    NOT NULL PRIMARY KEY,
    app_version TEXT,
    serves      TEXT,
    queues      TEXT    NOT NULL DEFAULT '[]',
    started_at  INTEGER NOT NULL,
    last_seen   INTEGER NOT NULL
) WITHOUT ROWID;
