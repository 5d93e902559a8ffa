-- keiro 0020: queues, whose limits are enforced in the transaction that claims a run.
--
-- A queue is declared in code and recorded here (`keiro_queues`): its concurrency (fleet-wide,
-- per worker, per key), its rate limits (fleet-wide and per key, over a sliding window), whether
-- priority orders admission, how keys share admissions, its dedup policy, and whether a parked
-- run gives its slot back. A run started on a queue carries the queue, its key and its dedup id
-- on its row; it waits (`queue_admitted = false`) until a worker serving the queue admits it in
-- `keiro_queue_admit`, which leases it in the same statement.
--
-- A run holds a slot while `queue_admitted` is set, the row is not terminal, and its lease has
-- not expired: a crashed worker's slot comes back when its lease runs out, a terminal run's at
-- its last commit, with no counter to drift. Admission counts slots under the queue row's lock,
-- so two workers never both take the last slot. The rate window counts first admissions
-- (`queue_admitted_at`, set once).
--
-- A debounced run (`keiro_queue_debounce`) waits the same way, behind its start gate, until its
-- key's calls stop for the delay or its maximum wait is up.
--
-- The functions this version added or changed live in sql/functions/ (queue.sql, lease.sql).

CREATE TABLE keiro_queues (
    name               text COLLATE "C" PRIMARY KEY,
    concurrency        integer CHECK (concurrency >= 1),
    worker_concurrency integer CHECK (worker_concurrency >= 1),
    key_concurrency    integer CHECK (key_concurrency >= 1),
    rate_limit         integer CHECK (rate_limit >= 1),
    rate_period_ms     bigint  CHECK (rate_period_ms >= 1),
    key_rate_limit     integer CHECK (key_rate_limit >= 1),
    key_rate_period_ms bigint  CHECK (key_rate_period_ms >= 1),
    priority           boolean NOT NULL DEFAULT false,
    fairness           text    NOT NULL DEFAULT 'fifo' CHECK (fairness IN ('fifo', 'weighted')),
    dedup              text    CHECK (dedup IN ('refuse', 'existing')),
    release_on_park    boolean NOT NULL DEFAULT true,
    paused             boolean NOT NULL DEFAULT false,
    -- Weighted fairness: the virtual time of the last admission; a key that starts waiting
    -- joins at it rather than at the pass it left off with.
    vtime              double precision NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_limit IS NULL) = (rate_period_ms IS NULL)),
    CHECK ((key_rate_limit IS NULL) = (key_rate_period_ms IS NULL))
);

-- Weighted fairness per key: the key's weight (set by an operator; 1 when absent) and its pass
-- (the virtual time its next admission is due at; each admission adds 1 / weight).
CREATE TABLE keiro_queue_keys (
    queue  text COLLATE "C" NOT NULL REFERENCES keiro_queues ON DELETE CASCADE,
    key    text COLLATE "C" NOT NULL,
    weight integer NOT NULL DEFAULT 1 CHECK (weight >= 1),
    pass   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)
);

ALTER TABLE workflows
    ADD COLUMN queue             text COLLATE "C",
    ADD COLUMN queue_key         text COLLATE "C",
    ADD COLUMN dedup_id          text COLLATE "C",
    ADD COLUMN queue_admitted    boolean NOT NULL DEFAULT false,
    ADD COLUMN queue_admitted_at timestamptz,
    -- A debounced run's key: while the run was never claimed (`lease_epoch = 0`) every
    -- debounce call of its key moves its start and replaces its input.
    ADD COLUMN debounce_key      text COLLATE "C",
    ADD CONSTRAINT workflows_queue_fields
        CHECK (queue IS NOT NULL OR (queue_key IS NULL AND dedup_id IS NULL
                                     AND NOT queue_admitted));

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

-- Slots held: admitted runs not yet terminal (the lease test is on the heap row).
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

-- The operators' list by queue and key (`keiro list --queue`), newest or oldest first.
CREATE INDEX workflows_list_queue_idx
    ON workflows (queue, queue_key, created_at, workflow_name, workflow_id)
    WHERE queue IS NOT NULL;

-- One pending debounced run per workflow name and key: the run its key's calls push back.
CREATE UNIQUE INDEX workflows_debounce_idx ON workflows (workflow_name, debounce_key)
    WHERE debounce_key IS NOT NULL AND lease_epoch = 0 AND status = 'running';
