-- keiro 0018: a schedule that cannot start backs off instead of staying due.
--
-- When a due schedule cannot start (its tick's id is refused, its cadence no longer compiles,
-- the store refuses the fire), the scheduler records the reason (`last_error`, from 0017),
-- counts the failure and sets `retry_at`; the due query leaves the row out until then, so
-- schedules that cannot start never fill a pass's batch ahead of the ones that can. A fire,
-- an update and a resume clear both. Columns only: the operations are plain SQL
-- (crates/postgres/src/schedule.rs), and a build that does not know them ignores them.

ALTER TABLE schedules
    ADD COLUMN failures integer NOT NULL DEFAULT 0 CHECK (failures >= 0),
    ADD COLUMN retry_at timestamptz;
