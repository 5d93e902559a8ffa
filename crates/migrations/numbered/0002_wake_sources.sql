-- keiro 0002: wake sources (durable timers, awakeables, signals, child workflows) and
-- cancellation with cascade.
--
-- Every resolution of a wake source journals the awaited step into its owner through
-- `keiro_journal_append_to`, the one implementation of the append rules: the generation
-- check, the recorded-step convergence, the terminal refusal, the fence, and the
-- `suspended` -> `running` flip with its notification. So a wake and its journal row commit
-- together, and a resume pass finds the owner runnable whether or not a listener heard it.
--
-- Outcomes are text codes, as in 0001: no function raises on a refusal, so none needs an
-- exception block (a subtransaction per call).
--
-- Lock order. Transactions that take several locks take them in this order, so they wait on
-- each other instead of deadlocking:
--   1. wake-source rows: timers (FOR UPDATE SKIP LOCKED), awakeables (FOR UPDATE);
--   2. signal tokens (transaction advisory locks), several in token order;
--   3. instance rows, descendants before ancestors (a child's terminal transaction locks the
--      child, then appends to its parent), several unrelated ones in key order.
-- Two rare interleavings remain outside this order: a spawn locks the parent (its append) and
-- then an existing instance it adopts as the child, and a cascade's tree order (deepest first)
-- can disagree with a timer batch's key order. A deadlock there needs both transactions on the
-- same instances at the same moment; Postgres detects it and aborts one, which the store
-- reports as a retryable error.
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (journal.sql, instance.sql, lease.sql, timer.sql, signal.sql, awakeable.sql, child.sql), in
-- their current form; this file keeps its tables, indexes and data changes.

-- The parent link of a child: `parent_name`/`parent_id` (0001) name the parent, these two
-- name where the child's result envelope is journaled. Rows started without a link keep NULLs.
ALTER TABLE workflows
    ADD COLUMN parent_generation integer,
    ADD COLUMN parent_step       text COLLATE "C",
    ADD CONSTRAINT workflows_parent_link_check CHECK (
        (parent_generation IS NULL) = (parent_step IS NULL)
        AND (parent_step IS NULL OR parent_name IS NOT NULL)
    );

-- Serves the cascade of `instance_cancel` (`keiro_instance_cancel`, `keiro_instance_cancel_tree`):
-- the live children of one parent. Partial, so finished children cost nothing.
CREATE INDEX workflows_live_children_idx ON workflows (parent_name, parent_id)
    WHERE parent_name IS NOT NULL AND status IN ('running', 'suspended');

-- Durable timers: a sleep's deadline, or a signal wait's timeout. One per (instance,
-- generation, step); the first arm wins and fired rows stay, so a late re-arm still finds it.
CREATE TABLE timers (
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step          text COLLATE "C" NOT NULL,
    kind          text        NOT NULL CHECK (kind IN ('sleep', 'signal_timeout')),
    -- The token a signal timeout waits on; its firing takes that token's lock.
    token         text COLLATE "C",
    fire_at       timestamptz NOT NULL,
    status        text        NOT NULL DEFAULT 'scheduled'
        CHECK (status IN ('scheduled', 'firing', 'fired')),
    attempts      integer     NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    fired_at      timestamptz,
    PRIMARY KEY (workflow_name, workflow_id, generation, step),
    CHECK ((kind = 'signal_timeout') = (token IS NOT NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `timers_fire_due` (the due batch, oldest first, and the next due time it returns)
-- and `timers_due_count`. Partial: fired timers, which accumulate, cost nothing.
CREATE INDEX timers_scheduled_idx ON timers (fire_at) WHERE status = 'scheduled';

-- Serves `timers_requeue_stuck`. Firing is one transaction, so rows enter this index only if
-- something outside keiro left them `firing`: it stays empty and costs nothing to keep.
CREATE INDEX timers_firing_idx ON timers (updated_at) WHERE status = 'firing';

-- Awakeables: ids handed to outside systems, settled once (completed or cancelled).
CREATE TABLE awakeables (
    id            uuid PRIMARY KEY,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    -- The owner's generation when the awakeable was created: its value goes there.
    generation    integer     NOT NULL,
    status        text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'completed', 'cancelled')),
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    settled_at    timestamptz,
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `awakeables_pending` (an index-only count). Partial: settled awakeables cost nothing.
CREATE INDEX awakeables_pending_idx ON awakeables (created_at) WHERE status = 'pending';

-- Serves the foreign key's cascade when retention deletes an instance row.
CREATE INDEX awakeables_owner_idx ON awakeables (workflow_name, workflow_id);

-- Signals sent while nobody waited, first in first out per token.
CREATE TABLE signal_buffer (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token      text COLLATE "C" NOT NULL,
    payload    jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Serves `signal_wait`: the oldest buffered signal of a token.
CREATE INDEX signal_buffer_token_idx ON signal_buffer (token, seq);

-- Registered signal waits, first come first served per token.
CREATE TABLE signal_waiters (
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    token         text COLLATE "C" NOT NULL,
    workflow_name text COLLATE "C" NOT NULL,
    workflow_id   text COLLATE "C" NOT NULL,
    generation    integer     NOT NULL,
    step          text COLLATE "C" NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_name, workflow_id, generation, step),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `signal_send`: a token's waiters, oldest first.
CREATE INDEX signal_waiters_token_idx ON signal_waiters (token, seq);
