-- Durable timers: a sleep's deadline, or a signal wait's timeout (the `timers` table).

-- timer_arm: inserts the timer unless one exists for the step (first arm wins; a re-arm never
-- moves fire_at, even after the timer fired) and returns the stored fire_at. Only a new timer
-- notifies, with the `timer` payload. Not fenced. Outcomes: armed, present, not_found.
-- Called by: keiro_postgres ops::timer::timer_arm; tested by contract::timer.
CREATE OR REPLACE FUNCTION keiro_timer_arm(p_name text, p_id text, p_generation integer,
                                           p_step text, p_kind text, p_token text,
                                           p_fire_at timestamptz,
                                           OUT outcome text, OUT stored_fire_at timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    PERFORM 1 FROM workflows w WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    INSERT INTO timers AS t (workflow_name, workflow_id, generation, step, kind, token, fire_at)
    VALUES (p_name, p_id, p_generation, p_step, p_kind, p_token, p_fire_at)
    ON CONFLICT (workflow_name, workflow_id, generation, step) DO NOTHING
    RETURNING t.fire_at INTO stored_fire_at;
    IF FOUND THEN
        PERFORM keiro_notify_timer();
        outcome := 'armed';
        RETURN;
    END IF;
    -- A separate statement takes a fresh snapshot, so it sees the timer that a concurrent arm
    -- committed after the INSERT above began (the conflict it hit).
    SELECT t.fire_at INTO stored_fire_at FROM timers t
    WHERE t.workflow_name = p_name AND t.workflow_id = p_id
      AND t.generation = p_generation AND t.step = p_step;
    -- Not found only if the instance was deleted in between.
    outcome := CASE WHEN FOUND THEN 'present' ELSE 'not_found' END;
END;
$$;

-- timers_fire_due: fires up to `p_limit` timers due at `clock`, oldest first, in this one
-- transaction: each fire journals its step (external) and marks the timer fired. Returns the
-- fired timers as parallel arrays in fire order, and `next_due`, the earliest fire_at still
-- scheduled, so an idle timer loop knows how long it may sleep without another round trip.
-- Called by: keiro_postgres ops::timer::timers_fire_due; tested by contract::timer.
CREATE OR REPLACE FUNCTION keiro_timers_fire_due(p_now timestamptz, p_limit bigint,
                                                 OUT clock timestamptz, OUT fired_name text[],
                                                 OUT fired_id text[], OUT fired_step text[],
                                                 OUT fired_fire_at timestamptz[],
                                                 OUT fired_delivered boolean[],
                                                 OUT next_due timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_batch     timers[];
    v_timer     timers%ROWTYPE;
    v_token     text;
    v_outcome   text;
    v_delivered boolean;
BEGIN
    clock := coalesce(p_now, now());

    -- SKIP LOCKED: a timer that a concurrent caller has picked is neither waited for nor
    -- fired again; that caller fires it and marks it fired in its own transaction. A timer it
    -- fired and committed meanwhile fails the re-checked `status = 'scheduled'` and is
    -- skipped too. So concurrent timer workers never fire the same timer.
    FOR v_timer IN
        SELECT * FROM timers t
        WHERE t.status = 'scheduled' AND t.fire_at <= clock
        ORDER BY t.fire_at, t.workflow_name, t.workflow_id, t.generation, t.step
        LIMIT greatest(p_limit, 0)
        FOR UPDATE SKIP LOCKED
    LOOP
        v_batch := array_append(v_batch, v_timer);
    END LOOP;

    -- Nothing due: the statements below would only lock nothing, at ten times the cost of the
    -- two that answer (a polling timer loop calls this every 50 ms).
    IF v_batch IS NULL THEN
        SELECT min(t.fire_at) INTO next_due FROM timers t WHERE t.status = 'scheduled';
        RETURN;
    END IF;

    -- Every lock the batch needs is taken before the first append, in the order of the header
    -- (timer rows above, then tokens, then instances in key order), because a batch touches
    -- many tokens and instances while a signal send holds one token and locks instances.
    FOR v_token IN
        SELECT DISTINCT b.token FROM unnest(v_batch) b WHERE b.token IS NOT NULL ORDER BY 1
    LOOP
        PERFORM keiro_signal_lock(v_token);
    END LOOP;
    PERFORM 1 FROM workflows w
    WHERE (w.workflow_name, w.workflow_id) IN (
        SELECT b.workflow_name, b.workflow_id FROM unnest(v_batch) b)
    ORDER BY w.workflow_name, w.workflow_id
    FOR UPDATE OF w;

    FOREACH v_timer IN ARRAY coalesce(v_batch, '{}') LOOP
        v_delivered := false;
        IF v_timer.kind = 'sleep' THEN
            SELECT a.outcome INTO v_outcome
            FROM keiro_journal_append_to(v_timer.workflow_name, v_timer.workflow_id,
                                         v_timer.generation, v_timer.step, 'sleep',
                                         'null'::jsonb, NULL, NULL, NULL) a;
            IF v_outcome = 'appended' THEN
                v_delivered := true;
                -- The deadline is met: the row must not come due again on it.
                UPDATE workflows w SET wake_after = NULL
                WHERE w.workflow_name = v_timer.workflow_name
                  AND w.workflow_id = v_timer.workflow_id;
            END IF;
        ELSE
            -- A signal timeout, under its token's lock (taken above): the wait times out only
            -- if no signal took the waiter first.
            DELETE FROM signal_waiters sw
            WHERE sw.workflow_name = v_timer.workflow_name
              AND sw.workflow_id = v_timer.workflow_id
              AND sw.generation = v_timer.generation AND sw.step = v_timer.step;
            IF FOUND THEN
                SELECT a.outcome INTO v_outcome
                FROM keiro_journal_append_to(v_timer.workflow_name, v_timer.workflow_id,
                                             v_timer.generation, v_timer.step, 'signal',
                                             jsonb_build_object('timeout', true),
                                             NULL, NULL, NULL) a;
                v_delivered := v_outcome = 'appended';
            END IF;
        END IF;
        UPDATE timers t SET
            status = 'fired', attempts = t.attempts + 1, fired_at = clock, updated_at = now()
        WHERE t.workflow_name = v_timer.workflow_name AND t.workflow_id = v_timer.workflow_id
          AND t.generation = v_timer.generation AND t.step = v_timer.step;
        fired_name := array_append(fired_name, v_timer.workflow_name::text);
        fired_id := array_append(fired_id, v_timer.workflow_id::text);
        fired_step := array_append(fired_step, v_timer.step::text);
        fired_fire_at := array_append(fired_fire_at, v_timer.fire_at);
        fired_delivered := array_append(fired_delivered, v_delivered);
    END LOOP;

    SELECT min(t.fire_at) INTO next_due FROM timers t WHERE t.status = 'scheduled';
END;
$$;
