-- keiro-sqlite 0010: a claim handed back because the worker could not open the run's payload
-- (it lacks the key) is counted apart from crashes, the twin of PostgreSQL's migration 0028
-- (with the lease.sql of that version).
--
-- `open_refusals` counts those hand-backs since the run last progressed. It gates the next
-- claim on a backoff of its own and resets wherever `attempts` does, so a run that workers
-- without its key refused many times keeps its whole crash budget.
ALTER TABLE workflows ADD COLUMN open_refusals INTEGER NOT NULL DEFAULT 0;

-- The builds before this one counted refusals in `attempts`: a live run whose last error is a
-- refusal has them moved to the new column.
UPDATE workflows SET open_refusals = attempts, attempts = 0
WHERE status IN ('running', 'suspended')
  AND last_error LIKE 'payload cannot be opened by this worker: %';
