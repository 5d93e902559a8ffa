-- Updates (migration 0024): a caller's request into a running run, which the run answers once.
--
-- A send writes the update's row and offers it on the instance's token for that update name
-- (`p_token`, keiro_journal's `update_token`) through the signal functions, in one
-- transaction: a run waiting in `ctx.next_update` receives it journaled and is woken
-- (`keiro_signal_offer`), otherwise it is buffered for the run's next take. So the take is a
-- signal wait, first in first out per name, withdrawn or given back as a race decides. The
-- answer is the run's own fenced journal step, applied by `keiro_journal_append_to`, and only
-- when it was appended the row's answer, in the same transaction; a watched instance
-- (migration 0023) notifies `msg:<name>/<id>` then, which wakes its callers. A run that ends
-- settles its unanswered updates in the transaction that ends it (the trigger below).

-- update_send: under the token's lock (signal.sql's order: tokens before instance rows),
-- starts the instance when p_input is given and it does not exist (`keiro_instance_start`),
-- locks the instance row, so a terminal transition either committed before (the send sees it)
-- or waits for the send (and its trigger settles the new row); then answers the update already
-- under p_update_id (`exists`, with its state and answer, or `conflict` when its name or
-- request differ), refuses an unknown (`not_found`) or terminal (`terminal`, with the status)
-- instance, or writes the update `requested` (marking the instance `has_updates`, the terminal
-- trigger's condition) and sends it on the token
-- (`keiro_signal_send`: to the waiting run, else buffered for p_ttl_ms). Outcomes: sent,
-- exists, conflict, not_found, terminal; `started` says whether this call started the
-- instance.
-- Called by: keiro_postgres ops::update::update_send; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_update_send(p_name text, p_id text, p_update_id text,
                                             p_update_name text, p_request jsonb,
                                             p_token text, p_ttl_ms bigint, p_input jsonb,
                                             p_priority integer,
                                             OUT outcome text, OUT state text,
                                             OUT reply jsonb, OUT status text,
                                             OUT started boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row workflow_updates%ROWTYPE;
BEGIN
    PERFORM keiro_signal_lock(p_token);
    started := false;
    IF p_input IS NOT NULL THEN
        SELECT s.created INTO started
        FROM keiro_instance_start(p_name, p_id, p_input, NULL, NULL, p_priority) s;
    END IF;
    SELECT w.status INTO status FROM workflows w
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
    FOR UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_found';
        RETURN;
    END IF;
    SELECT * INTO v_row FROM workflow_updates u
    WHERE u.workflow_name = p_name AND u.workflow_id = p_id AND u.update_id = p_update_id;
    IF FOUND THEN
        IF v_row.update_name <> p_update_name OR v_row.request <> p_request THEN
            outcome := 'conflict';
        ELSE
            outcome := 'exists';
            state := v_row.state;
            reply := v_row.reply;
        END IF;
        RETURN;
    END IF;
    IF status IN ('completed', 'failed', 'cancelled') THEN
        outcome := 'terminal';
        RETURN;
    END IF;
    INSERT INTO workflow_updates (workflow_name, workflow_id, update_id, update_name, request)
    VALUES (p_name, p_id, p_update_id, p_update_name, p_request);
    UPDATE workflows w SET has_updates = true
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id AND NOT w.has_updates;
    PERFORM keiro_signal_send(p_token,
                              jsonb_build_object('id', p_update_id, 'name', p_update_name,
                                                 'request', p_request),
                              p_ttl_ms);
    outcome := 'sent';
    state := 'requested';
END;
$$;

-- update_answer: journals the run's answer to update p_update_id (the step and its value as
-- `keiro_journal_append_to` takes them: {"ok": reply} or {"rejected": message}) and, only when
-- it was appended, settles the update `replied` (or `rejected` when p_rejected) with that value.
-- A step not journaled yet is first checked against the update, read before the append:
-- none of that name under that id answers update_unknown, one no longer `requested`
-- update_answered; nothing is written then. The update row is changed after the append locked
-- the instance row (the lock order of a terminal transition, whose trigger settles the rows),
-- and a terminal instance refuses the append, so a settled row is never answered. Outcomes:
-- those of `keiro_journal_append_to`, update_unknown, update_answered.
-- Called by: keiro_postgres ops::update::update_answer; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_update_answer(p_name text, p_id text, p_generation integer,
                                               p_step text, p_kind text, p_payload jsonb,
                                               p_owner text, p_epoch bigint, p_renew_ms bigint,
                                               p_update_id text, p_update_name text,
                                               p_rejected boolean,
                                               OUT outcome text, OUT recorded jsonb,
                                               OUT marker text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_row workflow_updates%ROWTYPE;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM journal j
                   WHERE j.workflow_name = p_name AND j.workflow_id = p_id
                     AND j.generation = p_generation AND j.step_name = p_step) THEN
        SELECT * INTO v_row FROM workflow_updates u
        WHERE u.workflow_name = p_name AND u.workflow_id = p_id AND u.update_id = p_update_id;
        IF NOT FOUND OR v_row.update_name <> p_update_name THEN
            outcome := 'update_unknown';
            RETURN;
        END IF;
        IF v_row.state <> 'requested' THEN
            outcome := 'update_answered';
            RETURN;
        END IF;
    END IF;
    SELECT a.outcome, a.recorded, a.marker
    INTO outcome, recorded, marker
    FROM keiro_journal_append_to(p_name, p_id, p_generation, p_step, p_kind, p_payload,
                                 p_owner, p_epoch, p_renew_ms) a;
    IF outcome = 'appended' THEN
        UPDATE workflow_updates u
        SET state = CASE WHEN p_rejected THEN 'rejected' ELSE 'replied' END,
            reply = p_payload, settled_at = now()
        WHERE u.workflow_name = p_name AND u.workflow_id = p_id
          AND u.update_id = p_update_id AND u.state = 'requested';
        PERFORM keiro_notify_message_if_watched(p_name, p_id);
    END IF;
END;
$$;

-- update_get: the instance's status and update p_update_id (its name, state and answer), in
-- one snapshot (STABLE: its statement's); no row for an unknown instance, NULL update columns
-- for an unknown update.
-- Called by: keiro_postgres ops::update::update_get; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_update_get(p_name text, p_id text, p_update_id text)
RETURNS TABLE (status text, update_name text, state text, reply jsonb)
LANGUAGE sql STABLE AS $$
    SELECT w.status, u.update_name, u.state, u.reply
    FROM workflows w
    LEFT JOIN workflow_updates u
      ON u.workflow_name = w.workflow_name AND u.workflow_id = w.workflow_id
     AND u.update_id = p_update_id
    WHERE w.workflow_name = p_name AND w.workflow_id = p_id
$$;

-- updates_settle_closed: a run's terminal transition settles its updates still `requested`
-- as `unanswered` ({"status": <status>}), in the transaction that ends it (served by
-- workflow_updates_requested_idx), and wakes their callers when the instance is watched. The
-- updates still buffered on the instance's tokens (sent, never taken) are deleted first: no run
-- will take them, and they would otherwise wait out their TTL (keiro_journal's
-- `update_token`: U+001F, then `update/<name>/<id>/<update name>`; served by
-- signal_buffer_token_idx). The instance row is this transaction's already; a wait that holds
-- the token's lock waits for it and finds the run terminal.
-- Called by: trigger workflows_settle_updates; tested by contract::message.
CREATE OR REPLACE FUNCTION keiro_updates_settle_closed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM signal_buffer b
    WHERE b.token IN (
        SELECT DISTINCT chr(31) || 'update/' || NEW.workflow_name || '/' || NEW.workflow_id
               || '/' || u.update_name
        FROM workflow_updates u
        WHERE u.workflow_name = NEW.workflow_name AND u.workflow_id = NEW.workflow_id
          AND u.state = 'requested');
    UPDATE workflow_updates u
    SET state = 'unanswered', reply = jsonb_build_object('status', NEW.status),
        settled_at = now()
    WHERE u.workflow_name = NEW.workflow_name AND u.workflow_id = NEW.workflow_id
      AND u.state = 'requested';
    IF FOUND AND NEW.watched THEN
        PERFORM keiro_notify_message(NEW.workflow_name, NEW.workflow_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER workflows_settle_updates AFTER UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.has_updates
          AND NEW.status IN ('completed', 'failed', 'cancelled')
          AND OLD.status NOT IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION keiro_updates_settle_closed();
