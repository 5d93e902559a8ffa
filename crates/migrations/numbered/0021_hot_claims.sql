-- keiro 0021: a claim rewrites no index entry.
--
-- A claim changes only the lease (owner, epoch, expiry), which no index names, so PostgreSQL
-- can write it as a heap-only (HOT) update: no new entry in any of the table's indexes, and
-- the old version pruned in place. Two things stopped that:
--
-- - `workflows_debounce_idx` named `lease_epoch` in its predicate (`lease_epoch = 0`: a
--   debounced run takes pushes until it is first claimed), so every claim of every run changed
--   an indexed column. The first claim of a debounced run now clears its `debounce_key`
--   instead, and the index keys on the key alone; a run that already left its debounce window
--   loses its key here.
-- - A heap page filled to the brim has no room for the claimed version, and a HOT update must
--   stay on its page. Rows are inserted and claimed moments apart, so pages are left a fifth
--   empty (`fillfactor`), which holds a few new versions of each row between prunings. This
--   applies to pages written from now on.
--
-- A run on a queue that counts nothing (no limit of any kind, first in first out) is admitted
-- without being marked (queue.sql): its admission is such a claim too.
--
-- The functions this version changed live in sql/functions/ (lease.sql, queue.sql).

UPDATE workflows SET debounce_key = NULL
WHERE debounce_key IS NOT NULL AND lease_epoch > 0;

DROP INDEX workflows_debounce_idx;
CREATE UNIQUE INDEX workflows_debounce_idx ON workflows (workflow_name, debounce_key)
    WHERE debounce_key IS NOT NULL AND status = 'running';

ALTER TABLE workflows SET (fillfactor = 80);
