-- keiro 0025: runs stay on the code that started them (functions in lease.sql, queue.sql,
-- journal.sql and version.sql).
--
-- Every run records the application version of the process that started it: the session's
-- `keiro.app_version` setting, which the store pins on each of its connections as it pins the
-- search_path, so every insert (a start, a child spawn, a start on a queue, a schedule's
-- fire) records it with no function taking it as an argument. A continue-as-new records the
-- version of the process that continued the run. NULL is a run started before versions
-- existed, or by a process that set no version: "unversioned".
--
-- A worker claims only runs of the versions it serves; a worker that serves any version (an
-- unversioned worker, by default) claims every run, NULL ones included, as before this
-- migration. The column is added first and given its default apart: a default added with the
-- column would be evaluated once, now, and stamped on every existing run.
ALTER TABLE workflows ADD COLUMN app_version text COLLATE "C";
ALTER TABLE workflows ALTER COLUMN app_version
    SET DEFAULT nullif(current_setting('keiro.app_version', true), '');

-- No index on the version: a worker's claim walks the claim order as before and passes over a
-- run of a version it does not serve as it passes over a leased one (one heap visit), and
-- `keiro versions move` finds the live runs through workflows_active_idx. An index here would
-- be written on every park and wake of every run.

-- One row per running worker, written by its heartbeat: which version it runs, which it
-- serves (NULL: any), and its queues. A worker whose `last_seen` is older than the operators'
-- window is not live; a worker that stops deletes its row.
CREATE TABLE keiro_workers (
    worker_id   text COLLATE "C" PRIMARY KEY,
    app_version text COLLATE "C",
    serves      text[],
    queues      text[]      NOT NULL DEFAULT '{}',
    started_at  timestamptz NOT NULL DEFAULT now(),
    last_seen   timestamptz NOT NULL DEFAULT now()
);
