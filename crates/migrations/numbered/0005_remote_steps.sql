-- keiro 0005: remote steps (the task table, its worker-facing transport and the operator's
-- recovery tools), and the success-only delivery of a fix-and-replay (`<id>~retry~<hex>`).
--
-- A remote step is a task row keyed by its stable step id (`<name>/<id>/<generation>/<step>`).
-- Arming writes it once (first arm wins) in its own transaction; workers claim it, heartbeat
-- and report. A report settles the task and journals its result into the owner through
-- `keiro_journal_append_to`, the one implementation of the append rules, so the result and
-- the owner's `suspended` -> `running` flip commit together. Retries with backoff happen in the
-- task row without touching the owner: only the final result is journaled, as `{"ok": value}`
-- or `{"error": {message, code, retryable, attempts}}`.
--
-- Outcomes are text codes, as in 0001 and 0002: no function raises on a refusal.
--
-- Lock order: 0002's. Task rows are wake-source rows, so a transaction that journals a task's
-- result locks the task row first and the owner's row after (through the append); the
-- requeue, which writes both, locks the tasks it may reset before any instance row, then the
-- instance tree deepest first, then the instance itself.
--
-- Notifications: a task that became claimable (dispatched, redispatched, requeued) sends the
-- payload `remote` on `<schema>.wake`. Instance payloads are `<name>/<id>` and always contain
-- a `/`, so `remote` cannot be one.
--
-- Commit durability. Postgres serializes the commits of notifying transactions (a lock taken
-- before commit and held until the commit record is flushed), so on a disk where a flush
-- takes a millisecond no more than about a thousand notifying transactions commit per
-- second, whatever the number of cores; measured: 250 remote steps/s, with most backends
-- waiting on that lock. The arm, the claim and the reports therefore commit with
-- `synchronous_commit = off`: their commit record is written but not waited for, so the lock
-- is held for microseconds. This loses no acknowledged state, because each of them is only
-- acted on through a later synchronous commit, and WAL is flushed in order: the park that
-- follows an arm, the run that consumes a report's journal row (its next append or its
-- completion), flush them first. After a crash that drops an unflushed one, the state is that
-- of before it, which keiro already recovers: a run re-arms its step (same step id), a claim
-- or report that vanished leaves the task claimable again (at least once, as always). Starts,
-- appends by runs and operator actions keep synchronous commits: their callers are told
-- "durable" directly.
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (notify.sql, journal.sql, instance.sql, child.sql, remote.sql), in their current form; this
-- file keeps its tables, indexes and data changes.

-- The remote tasks: one per step id, kept after settling (a late re-arm must find it).
CREATE TABLE remote_tasks (
    step_id             text COLLATE "C" PRIMARY KEY,
    workflow_name       text COLLATE "C" NOT NULL,
    workflow_id         text COLLATE "C" NOT NULL,
    -- The owner's generation when the step was armed: its result goes there and nowhere else.
    generation          integer     NOT NULL,
    -- The remote step's user name, which names the handler.
    step                text COLLATE "C" NOT NULL,
    -- Where the result is journaled: `remote:<step>`, then `remote:<step>#<n>` after n
    -- requeues (the journal never rewrites a row, so each reset result gets a new name).
    journal_step        text COLLATE "C" NOT NULL,
    -- The worker group: `<step>` or `<step>@<partition>`.
    grp                 text COLLATE "C" NOT NULL,
    input               jsonb       NOT NULL,
    priority            integer     NOT NULL DEFAULT 0,
    traceparent         text,
    status              text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'completed', 'failed')),
    -- Failed attempts so far.
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL CHECK (max_attempts >= 1),
    backoff_initial_ms  bigint      NOT NULL,
    backoff_max_ms      bigint      NOT NULL,
    backoff_jitter      boolean     NOT NULL,
    -- 1 at the first dispatch, + 1 per redispatch.
    dispatches          integer     NOT NULL DEFAULT 1,
    -- NULL: redispatch is off, and so is `deadline_at`.
    redispatch_after_ms bigint,
    redispatch_max      integer     NOT NULL CHECK (redispatch_max >= 1),
    -- available_at + redispatch_after: a re-arm after it redispatches (or loses) the task.
    deadline_at         timestamptz,
    available_at        timestamptz NOT NULL DEFAULT now(),
    claim               uuid,
    claimed_by          text,
    claim_expires_at    timestamptz,
    output              jsonb,
    -- The last failure, as {message, code, retryable}.
    last_error          jsonb,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    settled_at          timestamptz,
    CHECK ((status = 'running') = (claim IS NOT NULL)),
    CHECK ((claim IS NULL) = (claim_expires_at IS NULL)),
    FOREIGN KEY (workflow_name, workflow_id) REFERENCES workflows ON DELETE CASCADE
);

-- Serves `tasks_claim` (`keiro_remote_tasks_claim`): per group, the available pending tasks
-- in claim order (priority first, then oldest), so a claim reads exactly the rows it takes.
-- Partial: claimed and settled tasks cost nothing to it.
CREATE INDEX remote_tasks_pending_idx ON remote_tasks (grp, priority DESC, available_at, created_at)
    WHERE status = 'pending';

-- Serves the expired-claim sweep at the start of every `tasks_claim`: empty of expired rows in
-- the steady state, so the sweep is one index probe. Partial: only claimed tasks.
CREATE INDEX remote_tasks_running_idx ON remote_tasks (claim_expires_at)
    WHERE status = 'running';

-- Serves the tasks of one owner: the foreign key's cascade when retention deletes an instance,
-- `remote_tasks`, and one generation's tasks for `remote_redispatch_pending` and the requeue.
-- (`journal_step` is left out: an owner's generation holds few tasks, and every task version
-- writes this index, since a status change is never a HOT update.)
CREATE INDEX remote_tasks_owner_idx ON remote_tasks (workflow_name, workflow_id, generation);

-- Serves the requeue: the instances linked to a parent's generation (the tree it locks first)
-- and to one awaited step of it (the children and fixes it relinks to the step's next
-- revision). Partial: instances without a parent cost nothing to it; the link columns never
-- change on the hot path, so step appends stay HOT updates.
CREATE INDEX workflows_parent_link_idx ON workflows (parent_name, parent_id, parent_generation,
                                                     parent_step)
    WHERE parent_step IS NOT NULL;
