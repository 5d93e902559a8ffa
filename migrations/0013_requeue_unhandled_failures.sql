-- keiro 0013: requeue resets only the failures the run did not handle.
--
-- A remote step's failure (or an awaited child's) that the body handled, running a fallback
-- step after it, stays as it is: resetting it would let the re-driven run take the success
-- path and never reach the recorded fallback, which replay reports as non-determinism. A
-- failure counts as handled when the body itself wrote a journal row after it (a step, a patch
-- decision, a race winner, a retry attempt, a child spawn, an awakeable allocation) and the
-- run's last failure reason does not name it; the failure the run failed on is named by its
-- reason (`remote step "<name>" failed ..`, `child workflow <name>/<id> failed ..`) and is
-- always reset. The memory store applies the same rule (crates/memory/src/remote.rs).

-- Whether the body itself wrote a journal row, as opposed to a wake source delivering it
-- (keiro_journal::replay::recorded_by_body, less the remote results that arrive from outside).
CREATE FUNCTION keiro_journal_written_by_body(p_step text, p_kind text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_kind IN ('step', 'patch', 'race', 'attempt')
        OR (p_kind = 'child' AND keiro_step_logical(p_step) NOT LIKE '%:result')
        OR (p_kind = 'awakeable' AND starts_with(p_step, 'awkid:'));
$$;

-- How a run's failure reason names the failed remote step or child stored as `p_step`.
CREATE FUNCTION keiro_failure_mention(p_step text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN starts_with(keiro_step_logical(p_step), 'remote:')
            THEN 'remote step "' || substr(keiro_step_logical(p_step), 8) || '" failed'
        ELSE 'child workflow '
             || substr(keiro_step_logical(p_step), 7,
                       length(keiro_step_logical(p_step)) - 6 - length(':result'))
             || ' failed'
    END;
$$;

CREATE OR REPLACE FUNCTION keiro_instance_requeue_one(p_name text, p_id text, INOUT visited text[],
                                           OUT reset_steps bigint, OUT child_names text[],
                                           OUT child_ids text[])
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row            workflows%ROWTYPE;
    v_record         record;
    v_logical        text;
    v_next           text;
    v_pair           text;
    v_child_name     text;
    v_child_id       text;
    v_child          workflows%ROWTYPE;
    v_output         jsonb;
    v_found          boolean;
    v_deliver_steps  text[] := '{}';
    v_deliver_values jsonb[] := '{}';
    v_notify_remote  boolean := false;
    v_i              integer;
    v_reason         text;
BEGIN
    reset_steps := 0;
    child_names := '{}';
    child_ids := '{}';
    SELECT * INTO v_row FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    visited := array_append(visited, p_name || '/' || p_id);
    -- The reason the run failed with last: it names the failure the body did not handle.
    SELECT j.payload #>> '{}' INTO v_reason FROM journal j
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = v_row.generation AND j.kind = 'failed'
    ORDER BY j.seq DESC
    LIMIT 1;
    v_reason := coalesce(v_reason, '');

    -- The loop's query is read once, before the first reset row is inserted.
    FOR v_record IN
        SELECT j.step_name, j.kind FROM journal j
        WHERE j.workflow_name = p_name AND j.workflow_id = p_id
          AND j.generation = v_row.generation
          AND ((j.kind = 'remote' AND j.payload ? 'error')
               OR (j.kind = 'child' AND j.payload ? 'failed'
                   AND keiro_step_logical(j.step_name) LIKE 'child:%:result'))
          AND NOT EXISTS (
              SELECT 1 FROM journal r
              WHERE r.workflow_name = p_name AND r.workflow_id = p_id
                AND r.generation = v_row.generation
                AND r.step_name = '__workflow_step_reset__:' || j.step_name)
          -- A failure the body went on past, recording steps of its own after it, was
          -- handled (a fallback ran), unless the run failed on it after all.
          AND NOT (
              EXISTS (
                  SELECT 1 FROM journal b
                  WHERE b.workflow_name = p_name AND b.workflow_id = p_id
                    AND b.generation = v_row.generation AND b.seq > j.seq
                    AND keiro_journal_written_by_body(b.step_name, b.kind))
              AND strpos(v_reason, keiro_failure_mention(j.step_name)) = 0)
        ORDER BY j.seq
    LOOP
        v_logical := keiro_step_logical(v_record.step_name);
        v_next := v_logical || '#' || (keiro_step_revision(v_record.step_name) + 1);
        -- The instance is failed, so the append rules would refuse the row; it is written
        -- directly, under the row lock every journal writer holds.
        INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
        VALUES (p_name, p_id, v_row.generation,
                '__workflow_step_reset__:' || v_record.step_name, 'reset',
                jsonb_build_object('step', v_logical, 'superseded', v_record.step_name));
        reset_steps := reset_steps + 1;

        IF v_record.kind = 'remote' THEN
            -- Served by remote_tasks_owner_idx.
            UPDATE remote_tasks t SET
                status = 'pending', attempts = 0, dispatches = 1, available_at = now(),
                deadline_at = now() + t.redispatch_after_ms * interval '1 millisecond',
                claim = NULL, claimed_by = NULL, claim_expires_at = NULL,
                last_error = NULL, output = NULL, settled_at = NULL,
                journal_step = v_next, updated_at = now()
            WHERE t.workflow_name = p_name AND t.workflow_id = p_id
              AND t.generation = v_row.generation AND t.journal_step = v_record.step_name;
            v_notify_remote := v_notify_remote OR FOUND;
            CONTINUE;
        END IF;

        -- `child:<name>/<id>:result`; names and ids contain neither `/` nor `:`.
        v_pair := substr(v_logical, length('child:') + 1,
                         length(v_logical) - length('child:') - length(':result'));
        v_child_name := split_part(v_pair, '/', 1);
        v_child_id := substr(v_pair, length(v_child_name) + 2);

        -- A success is already there: the child itself completed (after an operator requeued
        -- it), or a fix of it did. It is journaled once the row is running again.
        SELECT w.output INTO v_output FROM workflows w
        WHERE w.workflow_name = v_child_name AND w.workflow_id = v_child_id
          AND w.status = 'completed';
        v_found := FOUND;
        IF NOT v_found THEN
            -- The fixes `<id>~retry~<hex>` linked to this parent, by primary-key range.
            SELECT w.output INTO v_output FROM workflows w
            WHERE w.workflow_name = v_child_name
              AND w.workflow_id >= v_child_id || '~retry~'
              AND w.workflow_id < v_child_id || '~retry' || chr(127)
              AND starts_with(w.workflow_id, v_child_id || '~retry~')
              AND w.status = 'completed'
              AND w.parent_name = p_name AND w.parent_id = p_id
              AND w.parent_generation = v_row.generation
            ORDER BY w.completed_at, w.workflow_id
            LIMIT 1;
            v_found := FOUND;
        END IF;
        IF v_found THEN
            v_deliver_steps := array_append(v_deliver_steps, v_next);
            v_deliver_values := array_append(v_deliver_values, coalesce(v_output, 'null'::jsonb));
            CONTINUE;
        END IF;

        -- No success yet: the child and its fixes now deliver to the next revision.
        UPDATE workflows w SET parent_step = v_next, updated_at = now()
        WHERE w.parent_name = p_name AND w.parent_id = p_id
          AND w.parent_generation = v_row.generation AND w.parent_step = v_record.step_name;
        SELECT * INTO v_child FROM workflows w
        WHERE w.workflow_name = v_child_name AND w.workflow_id = v_child_id
        FOR UPDATE;
        IF FOUND AND v_child.status = 'failed'
           AND NOT ((v_child_name || '/' || v_child_id) = ANY (visited)) THEN
            child_names := array_append(child_names, v_child_name);
            child_ids := array_append(child_ids, v_child_id);
            visited := array_append(visited, v_child_name || '/' || v_child_id);
        END IF;
    END LOOP;

    -- As `keiro_instance_resurrect` (0001): the failure stays in history.
    INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload)
    VALUES (p_name, p_id, v_row.generation,
            keiro_journal_repeatable_name(p_name, p_id, v_row.generation, 'resurrected',
                                          '__workflow_resurrected__'),
            'resurrected', 'null'::jsonb);
    UPDATE workflows w SET
        status = 'running',
        attempts = 0, last_error = NULL, next_attempt_at = NULL, wake_after = NULL,
        lease_owner = NULL, lease_expires_at = NULL,
        completed_at = NULL,
        updated_at = now()
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id;
    PERFORM keiro_notify_wake(p_name, p_id);

    -- The buffered successes, through the append rules now that the row is running.
    FOR v_i IN 1 .. cardinality(v_deliver_steps) LOOP
        PERFORM keiro_journal_append_to(p_name, p_id, v_row.generation, v_deliver_steps[v_i],
                                        'child', jsonb_build_object('ok', v_deliver_values[v_i]),
                                        NULL, NULL, NULL);
    END LOOP;
    IF v_notify_remote THEN
        PERFORM keiro_notify_remote();
    END IF;
END;
$$;

-- Every function this file created or replaced runs with keiro's schema and pg_temp as its
-- search_path, as 0009 set for all of them.
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOREACH v_function IN ARRAY ARRAY[
        'keiro_journal_written_by_body(text, text)',
        'keiro_failure_mention(text)',
        'keiro_instance_requeue_one(text, text, text[])'
    ]::regprocedure[]
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = %I, pg_temp',
                                  v_function, pg_catalog.current_schema());
    END LOOP;
END;
$$;
