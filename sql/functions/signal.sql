-- Signals: the per-token lock, the wait and the send (buffered while nobody waits, for a
-- TTL).

-- The per-token lock every signal operation takes first, so a wait and a send on one token are
-- totally ordered: without it both could find the other's table empty, and the wait would
-- register while the send buffers, losing the signal. An advisory lock is needed because
-- there may be no row to lock yet. It is transaction-scoped, so commit or rollback releases
-- it. The key carries the schema, so installations sharing a database do not contend; a hash
-- collision between two tokens only serializes them, it never merges them.
CREATE OR REPLACE FUNCTION keiro_signal_lock(p_token text) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(
        hashtextextended('keiro.signal:' || current_schema() || ':' || p_token, 0));
$$;

-- signal_wait: under the token's lock, deletes the token's expired signals (they are never
-- delivered), then either finds the step already journaled, consumes the oldest live buffered
-- signal (journaled at once, fenced by the run's lease; the wait's own waiter row, if a
-- drive before registered it, goes with it), or registers the waiter (once). The buffer is
-- consulted even when the waiter is registered: a send normally hands a signal to a waiter
-- rather than buffer it, but one that could not see the waiter (a transaction whose snapshot
-- predated it) buffers it beside the waiter, and the re-driven wait must then take it. The
-- oldest live signal is read without a row lock: a concurrent sweep may delete it only once
-- it has expired by the sweeper's clock, and then this wait delivers a signal that was live
-- when it looked, once (the token lock orders every deliverer). Outcomes: delivered
-- (delivered = the journaled envelope), waiting, not_found, lease_lost.
CREATE OR REPLACE FUNCTION keiro_signal_wait(p_name text, p_id text, p_generation integer,
                                             p_step text, p_token text, p_owner text,
                                             p_epoch bigint,
                                             OUT outcome text, OUT delivered jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_seq      bigint;
    v_payload  jsonb;
    v_envelope jsonb;
    v_outcome  text;
    v_recorded jsonb;
    v_waiting  boolean;
BEGIN
    PERFORM keiro_signal_lock(p_token);
    PERFORM 1 FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT j.payload INTO v_recorded FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = p_generation AND j.step_name = p_step;
    IF FOUND THEN
        outcome := 'delivered';
        delivered := v_recorded;
        RETURN;
    END IF;
    PERFORM 1 FROM signal_waiters sw
    WHERE sw.workflow_name = p_name AND sw.workflow_id = p_id
      AND sw.generation = p_generation AND sw.step = p_step;
    v_waiting := FOUND;

    DELETE FROM signal_buffer b WHERE b.token = p_token AND b.expires_at <= now();
    SELECT b.seq, b.payload INTO v_seq, v_payload FROM signal_buffer b
    WHERE b.token = p_token
    ORDER BY b.seq
    LIMIT 1;
    IF FOUND THEN
        v_envelope := jsonb_build_object('ok', v_payload);
        SELECT a.outcome, a.recorded INTO v_outcome, v_recorded
        FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, 'signal', v_envelope,
                                     p_owner, p_epoch, NULL) a;
        IF v_outcome = 'appended' THEN
            DELETE FROM signal_buffer b WHERE b.seq = v_seq;
            IF v_waiting THEN
                DELETE FROM signal_waiters sw
                WHERE sw.workflow_name = p_name AND sw.workflow_id = p_id
                  AND sw.generation = p_generation AND sw.step = p_step;
            END IF;
            outcome := 'delivered';
            delivered := v_envelope;
        ELSIF v_outcome = 'already_present' THEN
            -- Unreachable under the token lock (the step was checked above); if it were, the
            -- recorded value is the answer and the signal stays buffered.
            outcome := 'delivered';
            delivered := v_recorded;
        ELSIF v_outcome IN ('lease_lost', 'not_found') THEN
            outcome := v_outcome;
        ELSE
            -- Terminal, or another generation: the signal stays for a waiter that can take it.
            outcome := 'waiting';
        END IF;
        RETURN;
    END IF;

    IF NOT v_waiting THEN
        INSERT INTO signal_waiters (token, workflow_name, workflow_id, generation, step)
        VALUES (p_token, p_name, p_id, p_generation, p_step);
    END IF;
    outcome := 'waiting';
END;
$$;

-- signal_send: under the token's lock, deletes the token's expired signals, then offers the
-- signal to the token's waiters oldest first; each waiter offered is removed, and the first
-- whose owner takes the step (appended, waking it) receives it. Waiters that cannot take it
-- (terminal, another generation, already answered, gone) are dropped. With no taker the
-- signal is buffered until `p_ttl_ms` from now. Last, a sweep deletes up to 16 expired signals
-- of any token (buffered signals have no owner, so nothing else would). The sweep comes last
-- and skips locked rows, so it never waits while holding what another transaction may need: a
-- wait that holds an instance row and deletes the signal it consumed cannot meet this send
-- waiting on that instance row. Outcomes: delivered (to_name, to_id), buffered.
CREATE OR REPLACE FUNCTION keiro_signal_send(p_token text, p_payload jsonb, p_ttl_ms bigint,
                                             OUT outcome text, OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_waiter   signal_waiters%ROWTYPE;
    v_envelope jsonb := jsonb_build_object('ok', p_payload);
    v_outcome  text;
BEGIN
    PERFORM keiro_signal_lock(p_token);
    DELETE FROM signal_buffer b WHERE b.token = p_token AND b.expires_at <= now();
    -- Waits are added and taken only under the token lock, so no waiter appears under the
    -- loop. One can disappear: a withdraw (a `select` race's losing wait,
    -- crates/postgres/src/signal.rs) deletes its row without the token lock. So each waiter
    -- is taken by deleting its row, and one already gone is skipped: the body no longer makes
    -- that wait, and the signal goes to the next waiter or the buffer. A withdraw that comes
    -- after the DELETE waits for this transaction and finds the row gone (delivered).
    FOR v_waiter IN
        SELECT * FROM signal_waiters sw WHERE sw.token = p_token ORDER BY sw.seq
    LOOP
        DELETE FROM signal_waiters sw
        WHERE sw.workflow_name = v_waiter.workflow_name AND sw.workflow_id = v_waiter.workflow_id
          AND sw.generation = v_waiter.generation AND sw.step = v_waiter.step;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;
        SELECT a.outcome INTO v_outcome
        FROM keiro_journal_append_to(v_waiter.workflow_name, v_waiter.workflow_id,
                                     v_waiter.generation, v_waiter.step, 'signal', v_envelope,
                                     NULL, NULL, NULL) a;
        IF v_outcome = 'appended' THEN
            outcome := 'delivered';
            to_name := v_waiter.workflow_name;
            to_id := v_waiter.workflow_id;
            EXIT;
        END IF;
    END LOOP;
    IF outcome IS NULL THEN
        INSERT INTO signal_buffer (token, payload, expires_at)
        VALUES (p_token, p_payload, now() + p_ttl_ms * interval '1 millisecond');
        outcome := 'buffered';
    END IF;

    DELETE FROM signal_buffer b
    WHERE b.seq IN (
        SELECT e.seq FROM signal_buffer e
        WHERE e.expires_at <= now()
        ORDER BY e.expires_at
        LIMIT 16
        FOR UPDATE SKIP LOCKED);
END;
$$;

-- The first, two-argument form of signal_send, kept for statements prepared against it by
-- older builds: the default TTL (7 days, `SIGNAL_TTL_DEFAULT`).
CREATE OR REPLACE FUNCTION keiro_signal_send(p_token text, p_payload jsonb,
                                             OUT outcome text, OUT to_name text,
                                             OUT to_id text)
LANGUAGE sql AS $$
    SELECT s.outcome, s.to_name, s.to_id
    FROM keiro_signal_send(p_token, p_payload, 7 * 24 * 3600 * 1000::bigint) s;
$$;
