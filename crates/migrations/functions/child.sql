-- Child workflows: the spawn, and the delivery of a finished child's result into the
-- generation of its parent that awaits it.

-- The result envelope of a terminal instance row, as its parent journals it.
-- Called by: SQL only (keiro_child_deliver); tested by contract::child.
CREATE OR REPLACE FUNCTION keiro_child_envelope(p_child workflows) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT CASE p_child.status
        WHEN 'completed' THEN jsonb_build_object('ok', coalesce(p_child.output, 'null'::jsonb))
        WHEN 'failed' THEN jsonb_build_object('failed', coalesce(p_child.last_error, ''))
        WHEN 'cancelled' THEN jsonb_build_object('cancelled', true)
    END;
$$;

-- The child-delivery rule: `p_child` is a row its own transaction just made terminal (and
-- still holds locked). If it is linked to a parent, its result envelope is journaled into the
-- parent's spawning generation under the awaited step, waking the parent. A parent that
-- refuses (terminal, moved to another generation, gone) is ignored: nobody waits any more.
-- Locks the parent after the child: descendants before ancestors. A fix (an instance whose id
-- contains `~retry~`) delivers to its parent only when it completes: its failure or
-- cancellation is not the origin's result; the origin's own failure is what the parent
-- already has.
-- Called by: SQL only (every terminal transaction of a child); tested by contract::child.
CREATE OR REPLACE FUNCTION keiro_child_deliver(p_child workflows) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_child.parent_step IS NULL THEN
        RETURN;
    END IF;
    IF p_child.status <> 'completed' AND strpos(p_child.workflow_id, '~retry~') > 0 THEN
        RETURN;
    END IF;
    PERFORM keiro_journal_append_to(p_child.parent_name, p_child.parent_id,
                                    p_child.parent_generation, p_child.parent_step, 'child',
                                    keiro_child_envelope(p_child), NULL, NULL, NULL);
END;
$$;

-- child_spawn: applies the parent's spawn-step append and, only when it was appended,
-- creates the child `running` (generation 0, priority 0), linked to the parent's generation
-- and awaited step, and notifies it like a start. When an instance with the child's key
-- exists (locked after the parent, the one order the lock order leaves to deadlock detection):
-- * finished: its result envelope is journaled into the spawner at once (and it adopts the
--   spawner if it has no parent);
-- * running with no parent, or linked to the spawner itself (an earlier generation, which
--   continued as new and can never take the result): the link moves to this spawn;
-- * running for another parent: the spawn is refused. The spawn row, written above in this
--   transaction, gets `"taken": {"name", "id"}` (that parent), `{"taken": ...}` is journaled
--   under the awaited step too, so an await of the child ends, and the outcome is
--   already_present with the stored value, which the context reads as `ChildTaken`.
-- Outcomes: those of `keiro_journal_append_to`.
-- Called by: keiro_postgres ops::child::child_spawn; tested by contract::child.
CREATE OR REPLACE FUNCTION keiro_child_spawn(p_name text, p_id text, p_generation integer,
                                             p_step text, p_kind text, p_payload jsonb,
                                             p_owner text, p_epoch bigint, p_renew_ms bigint,
                                             p_child_name text, p_child_id text,
                                             p_input jsonb, p_await_step text,
                                             OUT outcome text, OUT recorded jsonb,
                                             OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
    v_child      workflows%ROWTYPE;
    v_taken      jsonb;
BEGIN
    SELECT a.outcome, a.recorded, a.marker, a.appended_generation
    INTO outcome, recorded, marker, v_generation
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome <> 'appended' THEN
        RETURN;
    END IF;

    LOOP
        INSERT INTO workflows AS w (workflow_name, workflow_id, input, parent_name, parent_id,
                                    parent_generation, parent_step, priority)
        VALUES (p_child_name, p_child_id, p_input, p_name, p_id, v_generation, p_await_step, 0)
        ON CONFLICT (workflow_name, workflow_id) DO NOTHING;
        IF FOUND THEN
            PERFORM keiro_notify_wake(p_child_name, p_child_id);
            RETURN;
        END IF;

        -- A fresh snapshot sees the row a concurrent start committed (the conflict above).
        SELECT * INTO v_child FROM workflows w
        WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id
        FOR UPDATE;
        EXIT WHEN FOUND;
        -- Deleted between the two (retention, which had locked a finished instance with this
        -- key): the key is free again, and the child is created after all. Returning here
        -- would leave a journaled spawn with no child, and a parent waiting forever.
    END LOOP;

    IF v_child.status IN ('completed', 'failed', 'cancelled') THEN
        IF v_child.parent_name IS NULL THEN
            UPDATE workflows w SET
                parent_name = p_name, parent_id = p_id,
                parent_generation = v_generation, parent_step = p_await_step,
                updated_at = now()
            WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id;
        END IF;
        PERFORM keiro_journal_append_to(p_name, p_id, v_generation, p_await_step, 'child',
                                        keiro_child_envelope(v_child), NULL, NULL, NULL);
        RETURN;
    END IF;

    IF v_child.parent_name IS NULL
       OR (v_child.parent_name = p_name AND v_child.parent_id = p_id) THEN
        UPDATE workflows w SET
            parent_name = p_name, parent_id = p_id,
            parent_generation = v_generation, parent_step = p_await_step,
            updated_at = now()
        WHERE w.workflow_name = p_child_name AND w.workflow_id = p_child_id;
        RETURN;
    END IF;

    -- Rewriting the spawn row is no history rewrite: nobody has seen it before this commits.
    v_taken := jsonb_build_object('name', v_child.parent_name, 'id', v_child.parent_id);
    recorded := CASE WHEN jsonb_typeof(p_payload) = 'object'
                     THEN p_payload || jsonb_build_object('taken', v_taken)
                     ELSE p_payload END;
    UPDATE journal j SET payload = recorded
    WHERE j.workflow_name = p_name AND j.workflow_id = p_id
      AND j.generation = v_generation AND j.step_name = p_step;
    PERFORM keiro_journal_append_to(p_name, p_id, v_generation, p_await_step, 'child',
                                    jsonb_build_object('taken', v_taken), NULL, NULL, NULL);
    outcome := 'already_present';
END;
$$;
