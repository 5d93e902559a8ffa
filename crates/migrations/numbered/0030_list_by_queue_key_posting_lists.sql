-- keiro 0030: the list by queue and key keys on (queue, queue_key, created_at) alone.
--
-- The index serves `keiro list --queue Q --key K` (a list by queue without a key walks
-- `workflows_list_created_idx`, as it did) and the sweep of a queue's free runs
-- (`keiro_queue_unfree`). It ended with the keyset's `workflow_name, workflow_id`, which made
-- every run an entry of its own. Without them, the runs one start batch put on a key share a
-- created_at (the batch's transaction time) and so one key, and PostgreSQL's btree
-- deduplication keeps them as one posting list; a run's completion, whose new row version
-- repeats its key, joins that list instead of adding an entry. A page still ends at the exact
-- keyset: the walk seeks to the cursor's created_at and the few runs of that instant are
-- filtered and sorted by name and id (an incremental sort over the index's order).
--
-- Measured with `SQL_COST_QUEUE=1 scripts/sql-cost workflow 16` (the whole life of sixteen
-- three-step runs on a queue that counts nothing): 18,621,172 instructions a call before,
-- 18,321,512 after; without a queue 17,228,161. A run on such a queue went from 8.1 % to
-- 6.3 % more server work than a run on none.
DROP INDEX workflows_list_queue_idx;
CREATE INDEX workflows_list_queue_idx ON workflows (queue, queue_key, created_at)
    WHERE queue IS NOT NULL;
