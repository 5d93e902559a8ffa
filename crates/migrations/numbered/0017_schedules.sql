-- keiro 0017: schedules, and the scheduler's leadership.
--
-- A schedule starts its workflow once per tick, with the id `<name>@<tick>`; the row's
-- next_tick moves past a tick in the same transaction as the tick's start, and every write
-- bumps `revision`, which a scheduler's write names (compare-and-set), so a plan made from a
-- stale read changes nothing. Exactly one of `cron` and `interval_ms` is set.
-- No function: every operation is plain parameterized SQL in one transaction
-- (crates/postgres/src/schedule.rs).

CREATE TABLE schedules (
    name           text PRIMARY KEY,
    workflow_name  text NOT NULL,
    cron           text,
    interval_ms    bigint CHECK (interval_ms >= 1000),
    time_zone      text NOT NULL DEFAULT 'UTC',
    input          jsonb NOT NULL DEFAULT 'null',
    overlap        text NOT NULL CHECK (overlap IN ('skip', 'buffer_one', 'allow_all')),
    catch_up       text NOT NULL CHECK (catch_up IN ('none', 'last', 'all')),
    catch_up_max   integer NOT NULL DEFAULT 0 CHECK (catch_up_max >= 0),
    paused         boolean NOT NULL DEFAULT false,
    next_tick      timestamptz,
    last_tick      timestamptz,
    buffered_tick  timestamptz,
    last_instance  text,
    last_error     text,
    revision       bigint NOT NULL DEFAULT 1,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (interval_ms IS NULL))
);

-- Serves the due query's first arm and the earliest next tick (SCHEDULES_DUE, SCHEDULES_NEXT).
CREATE INDEX schedules_next_tick_idx ON schedules (next_tick) WHERE NOT paused;
-- Serves the due query's second arm: schedules holding a buffered tick are few.
CREATE INDEX schedules_buffered_idx ON schedules (name)
    WHERE NOT paused AND buffered_tick IS NOT NULL;

-- One row: who leads the schedulers, until when, and the fencing epoch, bumped whenever the
-- holder changes so a former leader's write is refused.
CREATE TABLE schedule_leader (
    id          boolean PRIMARY KEY DEFAULT true CHECK (id),
    owner       text,
    epoch       bigint NOT NULL DEFAULT 0,
    expires_at  timestamptz
);
INSERT INTO schedule_leader (id) VALUES (true);
