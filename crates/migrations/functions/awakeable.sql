-- Awakeables: ids handed to outside systems, settled once (completed or cancelled), and the
-- trigger that cancels those of a generation a cancel or a continue-as-new closes.

-- awakeable_create: applies the allocation step's append and, only when it was appended,
-- registers the pending awakeable for the generation written to. A replayed allocation
-- (already_present) registers nothing. Outcomes: those of `keiro_journal_append_to`.
-- Called by: keiro_postgres ops::awakeable::awakeable_create; tested by contract::awakeable.
CREATE OR REPLACE FUNCTION keiro_awakeable_create(p_name text, p_id text, p_generation integer,
                                                  p_step text, p_kind text, p_payload jsonb,
                                                  p_owner text, p_epoch bigint, p_renew_ms bigint,
                                                  p_awakeable uuid,
                                                  OUT outcome text, OUT recorded jsonb,
                                                  OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_generation integer;
BEGIN
    SELECT a.outcome, a.recorded, a.marker, a.appended_generation
    INTO outcome, recorded, marker, v_generation
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        -- A reused id violates the primary key and rolls the append back with it.
        INSERT INTO awakeables (id, workflow_name, workflow_id, generation)
        VALUES (p_awakeable, p_name, p_id, v_generation);
    END IF;
END;
$$;

-- awakeable_complete / awakeable_cancel: settles a pending awakeable as `p_status` with
-- `p_payload` and journals `p_envelope` under `p_step` into its owner's generation (external).
-- The awakeable row is locked first, so two settlements are ordered and the second finds it
-- settled. Outcomes: delivered, owner_gone (settled, but the owner refused the step),
-- already_settled (settled_status), not_found.
-- Called by: keiro_postgres ops::awakeable::awakeable_settle (also InTransaction); tested by contract::awakeable.
CREATE OR REPLACE FUNCTION keiro_awakeable_settle(p_awakeable uuid, p_status text, p_payload jsonb,
                                                  p_step text, p_envelope jsonb,
                                                  OUT outcome text, OUT settled_status text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_awakeable awakeables%ROWTYPE;
    v_outcome   text;
BEGIN
    SELECT * INTO v_awakeable FROM awakeables a WHERE a.id = p_awakeable FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    IF v_awakeable.status <> 'pending' THEN
        outcome := 'already_settled';
        settled_status := v_awakeable.status;
        RETURN;
    END IF;
    UPDATE awakeables a SET status = p_status, payload = p_payload, settled_at = now()
    WHERE a.id = p_awakeable;
    SELECT a.outcome INTO v_outcome
    FROM keiro_journal_append_to(v_awakeable.workflow_name, v_awakeable.workflow_id,
                                 v_awakeable.generation, p_step, 'awakeable', p_envelope,
                                 NULL, NULL, NULL) a;
    -- The awakeable stays settled either way: its value has nowhere else to go.
    outcome := CASE WHEN v_outcome IN ('appended', 'already_present') THEN 'delivered'
                    ELSE 'owner_gone' END;
END;
$$;

-- The `cancelled` and `continued` markers cancel the pending awakeables of the generation they
-- close, in the transaction that writes the marker: status `cancelled`, `settled_at` set,
-- payload left NULL, nothing journaled. A trigger on the marker's journal row, so every path
-- that closes a generation is covered; its WHEN clause costs step rows nothing. It runs with
-- the owner's row locked, so it takes the awakeables `SKIP LOCKED`: one locked at that moment
-- is being settled by `keiro_awakeable_settle`, which finds the owner closed and settles it
-- anyway (`owner_gone`). Why, and the lock order in full:
-- migrations/0012_settle_abandoned_awakeables.sql.
-- Called by: trigger on the journal (a closing marker); tested by contract::awakeable.
CREATE OR REPLACE FUNCTION keiro_awakeables_settle_closed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Served by awakeables_owner_idx: the instance's awakeables, of every generation.
    UPDATE awakeables a SET status = 'cancelled', settled_at = now()
    WHERE a.id IN (
        SELECT p.id FROM awakeables p
        WHERE p.workflow_name = NEW.workflow_name AND p.workflow_id = NEW.workflow_id
          AND p.generation = NEW.generation AND p.status = 'pending'
        FOR UPDATE SKIP LOCKED);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER journal_marker_settles_awakeables AFTER INSERT ON journal
    FOR EACH ROW WHEN (NEW.kind IN ('cancelled', 'continued'))
    EXECUTE FUNCTION keiro_awakeables_settle_closed();
