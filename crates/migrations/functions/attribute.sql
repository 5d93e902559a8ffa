-- Search attributes (migration 0026): typed name-value pairs a run carries so operators find
-- it. A start writes its attributes with the instance row it creates (a start that finds the
-- instance writes none); a body's set is a fenced journal step (`attrs:#<n>`) applied by
-- `keiro_journal_append_to`, and only when it was appended are the rows written, in the same
-- transaction, so a replayed set writes nothing and the latest set of a name wins.
--
-- Attributes arrive as the JSON of keiro's `Attributes`: an object of
-- `{"<name>": {"type": "<kind>", "value": <value>}}`, checked by the caller (names, bounds,
-- finite numbers). Each row keeps that tagged value and the same value in its kind's column.

-- attributes_put: sets each attribute of p_attrs on the instance, replacing an earlier value
-- of the name.
-- Called by: SQL only (keiro_instance_start_attributed, keiro_attributes_set); tested by
-- contract::attribute.
CREATE OR REPLACE FUNCTION keiro_attributes_put(p_name text, p_id text, p_attrs jsonb)
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO workflow_attributes AS a (workflow_name, workflow_id, attr, kind, value,
                                          text_value, num_value, time_value)
    SELECT p_name, p_id, e.key, e.value->>'type', e.value,
           CASE WHEN e.value->>'type' IN ('text', 'bool') THEN e.value->>'value' END,
           CASE WHEN e.value->>'type' IN ('int', 'float')
                THEN (e.value->>'value')::double precision END,
           CASE WHEN e.value->>'type' = 'time' THEN (e.value->>'value')::timestamptz END
    FROM jsonb_each(p_attrs) e
    ON CONFLICT (workflow_name, workflow_id, attr) DO UPDATE
        SET kind = excluded.kind, value = excluded.value, text_value = excluded.text_value,
            num_value = excluded.num_value, time_value = excluded.time_value,
            updated_at = now();
$$;

-- instance_start_attributed: a start with attributes, on a queue (`keiro_queue_start`) or not
-- (`keiro_instance_start`, outcome 'started'), and the attributes when it created the
-- instance, in one transaction. The start lane sends such a start alone (never in a batch).
-- Outcomes: those of `keiro_queue_start`.
-- Called by: keiro_postgres ops::attribute::instance_start_attributed; tested by
-- contract::attribute.
CREATE OR REPLACE FUNCTION keiro_instance_start_attributed(p_name text, p_id text,
                                                           p_input jsonb,
                                                           p_parent_name text,
                                                           p_parent_id text,
                                                           p_priority integer, p_queue text,
                                                           p_key text, p_dedup_id text,
                                                           p_not_before timestamptz,
                                                           p_attrs jsonb,
                                                           OUT outcome text,
                                                           OUT created boolean,
                                                           OUT instance workflows)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v record;
BEGIN
    IF p_queue IS NULL THEN
        SELECT s.created, s.instance INTO v
        FROM keiro_instance_start(p_name, p_id, p_input, p_parent_name, p_parent_id,
                                  p_priority) s;
        outcome := 'started';
    ELSE
        SELECT s.outcome, s.created, s.instance INTO v
        FROM keiro_queue_start(p_name, p_id, p_input, p_parent_name, p_parent_id, p_priority,
                               p_queue, p_key, p_dedup_id, p_not_before, true) s;
        outcome := v.outcome;
    END IF;
    created := coalesce(v.created, false);
    instance := v.instance;
    IF created THEN
        PERFORM keiro_attributes_put(p_name, p_id, p_attrs);
    END IF;
END;
$$;

-- attributes_set: journals a body's set of attributes (its payload the attributes) and sets
-- them on the instance. A step not journaled yet is first checked against the names the
-- instance carries: when it would carry more than p_max, the answer is too_many with that
-- count and nothing is written. (The count is read before the append locks the instance row,
-- so it is exact for one writer at a time; a run's concurrent branches may pass it by the
-- sets in flight.) A step already journaled goes to the append rules (already_present).
-- Outcomes: those of `keiro_journal_append_to`, too_many.
-- Called by: keiro_postgres ops::attribute::attributes_set; tested by contract::attribute.
CREATE OR REPLACE FUNCTION keiro_attributes_set(p_name text, p_id text, p_generation integer,
                                                p_step text, p_kind text, p_payload jsonb,
                                                p_owner text, p_epoch bigint,
                                                p_renew_ms bigint, p_max integer,
                                                OUT outcome text, OUT recorded jsonb,
                                                OUT marker text, OUT attributes_count bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF NOT EXISTS (SELECT 1 FROM journal j
                   WHERE j.workflow_name = p_name AND j.workflow_id = p_id
                     AND j.generation = p_generation AND j.step_name = p_step) THEN
        SELECT count(*) INTO attributes_count
        FROM (SELECT a.attr FROM workflow_attributes a
              WHERE a.workflow_name = p_name AND a.workflow_id = p_id
              UNION
              SELECT k COLLATE "C" FROM jsonb_object_keys(p_payload) k) names;
        IF attributes_count > p_max THEN
            outcome := 'too_many';
            RETURN;
        END IF;
    END IF;
    SELECT a.outcome, a.recorded, a.marker
    INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        PERFORM keiro_attributes_put(p_name, p_id, p_payload);
    END IF;
END;
$$;
