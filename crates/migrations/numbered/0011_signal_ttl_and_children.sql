-- keiro 0011: signal tokens and a buffered signal's lifetime; one parent per running child;
-- requeue and cascading cancel without recursion.
--
-- * Signals. A send is refused (by the stores, before they call in here) for a token no wait
--   could take: empty, over 200 bytes, or with a control character. Buffered signals have no
--   owner, so nothing else would ever delete them: each now has an `expires_at` (the send's
--   TTL, 7 days unless it says otherwise), is never delivered after it, and is deleted by the
--   next send or wait on its token or by the sweep every send makes.
-- * Children. `keiro_child_spawn` no longer leaves a spawner waiting forever on a running child
--   linked to another parent: it refuses the spawn, journaled, so the body sees
--   `ChildTaken`. A running child linked to an earlier generation of the spawner itself (the
--   parent continued as new) moves its link to the spawning generation.
-- * Deep trees. `keiro_instance_requeue_one` and `keiro_instance_cancel_tree` called
--   themselves once per level of children, so a chain a few hundred deep overran
--   `max_stack_depth`; both walks now use a worklist.
--
-- The functions (and triggers) this version added or changed live in sql/functions/
-- (instance.sql, signal.sql, child.sql), in their current form; this file keeps its tables,
-- indexes and data changes.

-- Added, backfilled, then constrained. A signal buffered before this migration gets the
-- default TTL from now, not from when it was sent, so an upgrade expires nothing at once.
ALTER TABLE signal_buffer ADD COLUMN expires_at timestamptz;
UPDATE signal_buffer SET expires_at = now() + interval '7 days';
ALTER TABLE signal_buffer ALTER COLUMN expires_at SET NOT NULL;

-- Tokens that no wait can take (waits always refused them): their signals could only pile up.
DELETE FROM signal_buffer
WHERE token = '' OR octet_length(token) > 200 OR token ~ '[\u0001-\u001f\u007f-\u009f]';

-- Serves the sweep of `keiro_signal_send`: the first expired signals of any token.
CREATE INDEX signal_buffer_expires_idx ON signal_buffer (expires_at);
