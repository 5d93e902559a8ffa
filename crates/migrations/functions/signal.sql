-- Signals: the per-token lock, the wait and the send (buffered while nobody waits, for a
-- TTL), and the return of the signals a race's losing waits took.

-- The per-token lock every signal operation takes first, so a wait and a send on one token are
-- totally ordered: without it both could find the other's table empty, and the wait would
-- register while the send buffers, losing the signal. An advisory lock is needed because
-- there may be no row to lock yet. It is transaction-scoped, so commit or rollback releases
-- it. The key carries the schema, so installations sharing a database do not contend; a hash
-- collision between two tokens only serializes them, it never merges them.
-- Called by: SQL only (keiro_signal_wait, keiro_signal_send, keiro_signal_return); tested by contract::signal.
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
-- Called by: keiro_postgres ops::signal::signal_wait; tested by contract::signal.
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

-- signal_offer: the delivery half of a send, for a caller that holds the token's lock: offers
-- `p_payload` to the token's waiters oldest first; each waiter offered is removed, and the
-- first whose owner takes the step (appended, waking it) receives it (to_name, to_id; both
-- NULL when none did). Waiters that cannot take it (terminal, another generation, already
-- answered, gone) are dropped.
-- Called by: SQL only (keiro_signal_send, keiro_signal_return); tested by contract::signal.
CREATE OR REPLACE FUNCTION keiro_signal_offer(p_token text, p_payload jsonb,
                                              OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_waiter   signal_waiters%ROWTYPE;
    v_envelope jsonb := jsonb_build_object('ok', p_payload);
    v_outcome  text;
BEGIN
    -- Waits are added and taken only under the token lock, so no waiter appears under the
    -- loop. One can disappear: a withdraw (a `select` race's losing wait,
    -- crates/postgres/src/ops/signal.rs) deletes its row without the token lock. So each waiter
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
            to_name := v_waiter.workflow_name;
            to_id := v_waiter.workflow_id;
            RETURN;
        END IF;
    END LOOP;
END;
$$;

-- signal_send: under the token's lock, deletes the token's expired signals, then offers the
-- signal to the token's waiters (`keiro_signal_offer`). With no taker the signal is buffered
-- until `p_ttl_ms` from now. Last, a sweep deletes up to 16 expired signals
-- of any token (buffered signals have no owner, so nothing else would). The sweep comes last
-- and skips locked rows, so it never waits while holding what another transaction may need: a
-- wait that holds an instance row and deletes the signal it consumed cannot meet this send
-- waiting on that instance row. Outcomes: delivered (to_name, to_id), buffered.
-- Called by: keiro_postgres ops::signal::signal_send (also InTransaction); tested by contract::signal.
CREATE OR REPLACE FUNCTION keiro_signal_send(p_token text, p_payload jsonb, p_ttl_ms bigint,
                                             OUT outcome text, OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM keiro_signal_lock(p_token);
    DELETE FROM signal_buffer b WHERE b.token = p_token AND b.expires_at <= now();
    SELECT o.to_name, o.to_id INTO to_name, to_id FROM keiro_signal_offer(p_token, p_payload) o;
    IF to_name IS NOT NULL THEN
        outcome := 'delivered';
    ELSE
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
-- Called by: no current build (kept for older builds); tested by contract::signal.
CREATE OR REPLACE FUNCTION keiro_signal_send(p_token text, p_payload jsonb,
                                             OUT outcome text, OUT to_name text,
                                             OUT to_id text)
LANGUAGE sql AS $$
    SELECT s.outcome, s.to_name, s.to_id
    FROM keiro_signal_send(p_token, p_payload, 7 * 24 * 3600 * 1000::bigint) s;
$$;

-- signal_return: a `select` race's decision and the signals its losing waits took, in one
-- transaction: the decision (p_step .. p_renew_ms, as `keiro_journal_append_to` takes them) is
-- appended, and only when it was, each signal (p_tokens[i], p_payloads[i], in that order) goes
-- back to its token: offered to the token's waiters (`keiro_signal_offer`), else buffered ahead
-- of every signal buffered for the token, for `p_ttl_ms` from now. Had the decision landed
-- alone, a signal a losing wait took would be lost (the body never reads a loser's journaled
-- value); had the signals gone back alone, a re-decided race would give them back twice. A
-- signal goes to the head because it was sent before any the buffer holds: a wait takes the
-- oldest, and a send buffers only while nobody waits. The head is made by taking the token's
-- buffered signals out and buffering them again after the returned ones (a token rarely holds
-- more than a few), so the identity `seq` keeps giving the order and no other token's rows
-- are touched. Lock order (sql/functions/README.md): the tokens' locks first, in token order,
-- then the instance row (the append), then the waiters' rows. Outcomes: those of
-- `keiro_journal_append_to`.
-- Called by: keiro_postgres ops::signal::signal_return; tested by contract::signal.
CREATE OR REPLACE FUNCTION keiro_signal_return(p_name text, p_id text, p_generation integer,
                                               p_step text, p_kind text, p_payload jsonb,
                                               p_owner text, p_epoch bigint, p_renew_ms bigint,
                                               p_tokens text[], p_payloads jsonb[],
                                               p_ttl_ms bigint,
                                               OUT outcome text, OUT recorded jsonb,
                                               OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_token        text;
    v_i            integer;
    v_taker        text;
    v_untaken      jsonb[];
    v_payload      jsonb;
    v_old_payloads jsonb[];
    v_old_created  timestamptz[];
    v_old_expires  timestamptz[];
BEGIN
    FOR v_token IN
        SELECT DISTINCT t.token FROM unnest(p_tokens) AS t(token) ORDER BY 1
    LOOP
        PERFORM keiro_signal_lock(v_token);
    END LOOP;
    SELECT a.outcome, a.recorded, a.marker INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome <> 'appended' THEN
        RETURN;
    END IF;
    FOR v_token IN
        SELECT t.token FROM unnest(p_tokens) WITH ORDINALITY AS t(token, n)
        GROUP BY t.token ORDER BY min(t.n)
    LOOP
        DELETE FROM signal_buffer b WHERE b.token = v_token AND b.expires_at <= now();
        v_untaken := '{}';
        FOR v_i IN 1 .. cardinality(p_tokens) LOOP
            CONTINUE WHEN p_tokens[v_i] <> v_token;
            SELECT o.to_name INTO v_taker FROM keiro_signal_offer(v_token, p_payloads[v_i]) o;
            IF v_taker IS NULL THEN
                v_untaken := array_append(v_untaken, p_payloads[v_i]);
            END IF;
        END LOOP;
        CONTINUE WHEN cardinality(v_untaken) = 0;
        -- The token's buffered signals come out (exactly those: a concurrent sweep holding one
        -- makes the DELETE wait, and then it is gone) and go back in behind the returned ones,
        -- one row at a time so each gets the next `seq` in the order wanted.
        WITH moved AS (
            DELETE FROM signal_buffer b WHERE b.token = v_token
            RETURNING b.seq, b.payload, b.created_at, b.expires_at)
        SELECT array_agg(m.payload ORDER BY m.seq), array_agg(m.created_at ORDER BY m.seq),
               array_agg(m.expires_at ORDER BY m.seq)
        INTO v_old_payloads, v_old_created, v_old_expires
        FROM moved m;
        FOREACH v_payload IN ARRAY v_untaken LOOP
            INSERT INTO signal_buffer (token, payload, expires_at)
            VALUES (v_token, v_payload, now() + p_ttl_ms * interval '1 millisecond');
        END LOOP;
        FOR v_i IN 1 .. coalesce(cardinality(v_old_payloads), 0) LOOP
            INSERT INTO signal_buffer (token, payload, created_at, expires_at)
            VALUES (v_token, v_old_payloads[v_i], v_old_created[v_i], v_old_expires[v_i]);
        END LOOP;
    END LOOP;
END;
$$;

-- signal_with_start: starts instance p_name/p_id with p_input when it does not exist
-- (`keiro_instance_start`, `started` when this call did) and sends the signal
-- (`keiro_signal_send`), in one transaction: a caller never sees the run started without its
-- signal, nor the signal buffered for a run that was never started. The token's lock is taken
-- first (the order of every signal operation: tokens before instance rows). Outcomes: those of
-- `keiro_signal_send`.
-- Called by: keiro_postgres ops::signal::signal_with_start; tested by contract::signal.
CREATE OR REPLACE FUNCTION keiro_signal_with_start(p_name text, p_id text, p_input jsonb,
                                                   p_priority integer, p_token text,
                                                   p_payload jsonb, p_ttl_ms bigint,
                                                   OUT started boolean, OUT outcome text,
                                                   OUT to_name text, OUT to_id text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM keiro_signal_lock(p_token);
    SELECT s.created INTO started
    FROM keiro_instance_start(p_name, p_id, p_input, NULL, NULL, p_priority) s;
    SELECT s.outcome, s.to_name, s.to_id INTO outcome, to_name, to_id
    FROM keiro_signal_send(p_token, p_payload, p_ttl_ms) s;
END;
$$;
