-- keiro 0028: a claim handed back because the worker could not open the run's payload (it
-- lacks the key) is counted apart from crashes (keiro_instance_refuse_open in lease.sql).
--
-- `open_refusals` counts those hand-backs since the run last progressed. It gates the next
-- claim on a backoff of its own and resets wherever `attempts` does (a park, a completion, a
-- continue-as-new, a release after progress, a resurrection), so a run that workers without
-- its key refused many times keeps its whole crash budget for the worker that holds the key.
ALTER TABLE workflows ADD COLUMN open_refusals integer NOT NULL DEFAULT 0;

-- The builds before this one counted refusals in `attempts`. A live run whose last error is a
-- refusal has those counts in its attempts: they move to the new column, so the first crash
-- under a worker with the key does not fail it.
UPDATE workflows SET open_refusals = attempts, attempts = 0
WHERE status IN ('running', 'suspended')
  AND last_error LIKE 'payload cannot be opened by this worker: %';
