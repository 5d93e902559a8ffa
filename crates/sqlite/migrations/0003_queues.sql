-- keiro-sqlite 0003: queues, the twin of PostgreSQL's migration 0020 (with queue.sql and the
-- lease.sql of that version), in SQLite's terms as 0001 states them (INTEGER 0/1 for boolean,
-- INTEGER microseconds for timestamptz, REAL for double precision).
--
-- A queue is declared in code and recorded here (`keiro_queues`): its concurrency (fleet-wide,
-- per worker, per key), its rate limits (fleet-wide and per key, over a sliding window), whether
-- priority orders admission, how keys share admissions, its dedup policy, and whether a parked
-- run gives its slot back. A run started on a queue carries the queue, its key and its dedup id
-- on its row; it waits (`queue_admitted = 0`) until a worker serving the queue admits it
-- (`queue_admit`, in the store's queue module), which leases it in the same transaction.
--
-- A run holds a slot while `queue_admitted` is set, the row is not terminal, and its lease has
-- not expired. The rate window counts first admissions (`queue_admitted_at`, set once). As in
-- 0001, no constant list of more than two values is written in a CHECK, a partial index's WHERE
-- or a trigger's WHEN.

CREATE TABLE keiro_queues (
    name               TEXT    PRIMARY KEY,
    concurrency        INTEGER CHECK (concurrency >= 1),
    worker_concurrency INTEGER CHECK (worker_concurrency >= 1),
    key_concurrency    INTEGER CHECK (key_concurrency >= 1),
    rate_limit         INTEGER CHECK (rate_limit >= 1),
    rate_period_ms     INTEGER CHECK (rate_period_ms >= 1),
    key_rate_limit     INTEGER CHECK (key_rate_limit >= 1),
    key_rate_period_ms INTEGER CHECK (key_rate_period_ms >= 1),
    priority           INTEGER NOT NULL DEFAULT 0,
    fairness           TEXT    NOT NULL DEFAULT 'fifo'
        CHECK (fairness = 'fifo' OR fairness = 'weighted'),
    dedup              TEXT    CHECK (dedup = 'refuse' OR dedup = 'existing'),
    release_on_park    INTEGER NOT NULL DEFAULT 1,
    paused             INTEGER NOT NULL DEFAULT 0,
    -- Weighted fairness: the virtual time of the last admission; a key that starts waiting
    -- joins at it rather than at the pass it left off with.
    vtime              REAL    NOT NULL DEFAULT 0,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    CHECK ((rate_limit IS NULL) = (rate_period_ms IS NULL)),
    CHECK ((key_rate_limit IS NULL) = (key_rate_period_ms IS NULL))
);

-- Weighted fairness per key: the key's weight (set by an operator; 1 when absent) and its pass
-- (the virtual time its next admission is due at; each admission adds 1 / weight). A run with
-- no key counts under the key '' here. A rowid table: the cascade of a queue's delete into a
-- WITHOUT ROWID one would collect the keys in a temporary b-tree first.
CREATE TABLE keiro_queue_keys (
    queue  TEXT    NOT NULL REFERENCES keiro_queues ON DELETE CASCADE,
    key    TEXT    NOT NULL,
    weight INTEGER NOT NULL DEFAULT 1 CHECK (weight >= 1),
    pass   REAL    NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)
);

-- PostgreSQL's table constraint `workflows_queue_fields` cannot be added to an existing table
-- here; a column's CHECK may name other columns, so it sits on `queue_admitted`, added after the
-- columns it names (and checked against the existing rows as it is added).
ALTER TABLE workflows ADD COLUMN queue TEXT;
ALTER TABLE workflows ADD COLUMN queue_key TEXT;
ALTER TABLE workflows ADD COLUMN dedup_id TEXT;
ALTER TABLE workflows ADD COLUMN queue_admitted INTEGER NOT NULL DEFAULT 0
    CONSTRAINT workflows_queue_fields
        CHECK (queue IS NOT NULL OR (queue_key IS NULL AND dedup_id IS NULL
                                     AND NOT queue_admitted));
ALTER TABLE workflows ADD COLUMN queue_admitted_at INTEGER;
-- A debounced run's key (queue.sql's `keiro_queue_debounce`).
ALTER TABLE workflows ADD COLUMN debounce_key TEXT;

-- The ordinary claim never takes a run waiting for admission: its index leaves them out, so a
-- backlog held back by a limit costs the claim nothing.
DROP INDEX workflows_running_claim_idx;
CREATE INDEX workflows_running_claim_idx
    ON workflows (priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND (queue IS NULL OR queue_admitted);

-- Runs waiting for admission, in admission order, per queue and per key.
CREATE INDEX workflows_queue_waiting_idx
    ON workflows (queue, priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND queue IS NOT NULL AND NOT queue_admitted;
CREATE INDEX workflows_queue_key_waiting_idx
    ON workflows (queue, queue_key, priority DESC, created_at, workflow_name, workflow_id)
    WHERE status = 'running' AND queue IS NOT NULL AND NOT queue_admitted;

-- Slots held: admitted runs not yet terminal (the lease test is on the table row).
CREATE INDEX workflows_queue_slots_idx ON workflows (queue, queue_key)
    WHERE queue_admitted AND status IN ('running', 'suspended');

-- Rate windows: first admissions per queue and per key.
CREATE INDEX workflows_queue_admitted_idx ON workflows (queue, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;
CREATE INDEX workflows_queue_key_admitted_idx ON workflows (queue, queue_key, queue_admitted_at)
    WHERE queue_admitted_at IS NOT NULL;

-- One live run per dedup id and queue.
CREATE UNIQUE INDEX workflows_queue_dedup_idx ON workflows (queue, dedup_id)
    WHERE dedup_id IS NOT NULL AND status IN ('running', 'suspended');

-- queue.sql's `workflows_queue_slot_freed`: a slot freed by a run that ended or gave its slot
-- back (on park, on a crash, or when admission took back an expired one) wakes the workers, so
-- a run waiting for that slot is admitted now rather than at the next poll. PostgreSQL's
-- payload is `queue/<queue>`, which every listener reads as an instance's wake; here it is the
-- same `wake` row, named `queue`/`<queue>`. (queue.sql's other trigger, `workflows_queue_status`,
-- is a BEFORE trigger that changes the row being written, which SQLite's triggers cannot do: the
-- park's own update carries its park half, in the store's `instance_park`, and the trigger
-- `workflows_queue_ended` below its terminal half.)
CREATE TRIGGER workflows_queue_slot_freed AFTER UPDATE OF status, queue_admitted ON workflows
    WHEN OLD.queue_admitted
     AND (NOT NEW.queue_admitted OR NEW.status NOT IN ('running', 'suspended'))
     AND OLD.status IN ('running', 'suspended')
BEGIN
    INSERT INTO keiro_notifications (kind, workflow_name, workflow_id)
    VALUES ('wake', 'queue', NEW.queue);
END;

-- queue.sql's `workflows_queue_status`, terminal half: a run on a queue that ends gives its
-- slot and its dedup id back, so a resurrected or requeued run is admitted again like any
-- waiting run, and a live run may hold the id meanwhile. An AFTER trigger (SQLite's cannot
-- change the row being written): one more write of the ended row, only for runs on a queue.
-- Runs after `workflows_queue_slot_freed` has seen the slot go.
CREATE TRIGGER workflows_queue_ended AFTER UPDATE OF status ON workflows
    WHEN NEW.queue IS NOT NULL
     AND OLD.status IN ('running', 'suspended')
     AND NEW.status NOT IN ('running', 'suspended')
BEGIN
    UPDATE workflows SET queue_admitted = 0, dedup_id = NULL
    WHERE workflow_name = NEW.workflow_name AND workflow_id = NEW.workflow_id;
END;

-- The operators' list by queue and key (`keiro list --queue`).
CREATE INDEX workflows_list_queue_idx
    ON workflows (queue, queue_key, created_at, workflow_name, workflow_id)
    WHERE queue IS NOT NULL;

-- One pending debounced run per workflow name and key (queue.sql's `keiro_queue_debounce`).
CREATE UNIQUE INDEX workflows_debounce_idx ON workflows (workflow_name, debounce_key)
    WHERE debounce_key IS NOT NULL AND lease_epoch = 0 AND status = 'running';
