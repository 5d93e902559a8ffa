//! An instance's stored payloads (`PayloadStore`, plain SQL; the SQLite store's twin is
//! `payloads.rs` there): one query reads every payload column of every row the instance owns,
//! and a rewrite updates each place in one transaction, only while it still holds the value
//! read (jsonb equality). The rule is keiro-journal's `payloads` module.

use keiro_journal::store::{PayloadPlace, PayloadRewrite, PayloadStore, StoredPayload};
use keiro_journal::{span::traced, store_span, InstanceKey, StoreError};
use serde_json::Value;

use crate::row::column;
use crate::PgStore;

type Result<T, E = StoreError> = std::result::Result<T, E>;

const READ: &str = "reading an instance's payloads";
const REWRITE: &str = "rewriting an instance's payloads";

/// Every payload of instance ($1, $2): the place's kind, its keys as text and number, the
/// value. Each part is served by its table's owner index (or primary key).
const PAYLOADS_READ: &str = "\
    SELECT 'input' AS place, NULL::text AS k, NULL::bigint AS n, input AS value FROM workflows \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'output', NULL, NULL, output FROM workflows \
     WHERE workflow_name = $1 AND workflow_id = $2 AND output IS NOT NULL \
    UNION ALL SELECT 'journal', NULL, seq, payload FROM journal \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'awakeable', id::text, NULL, payload FROM awakeables \
     WHERE workflow_name = $1 AND workflow_id = $2 AND payload IS NOT NULL \
    UNION ALL SELECT 'task_input', step_id, NULL, input FROM remote_tasks \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'task_output', step_id, NULL, output FROM remote_tasks \
     WHERE workflow_name = $1 AND workflow_id = $2 AND output IS NOT NULL \
    UNION ALL SELECT 'event', key, NULL, value FROM workflow_events \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'stream', key, stream_offset, value FROM workflow_streams \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'update_request', update_id, NULL, request FROM workflow_updates \
     WHERE workflow_name = $1 AND workflow_id = $2 \
    UNION ALL SELECT 'update_reply', update_id, NULL, reply FROM workflow_updates \
     WHERE workflow_name = $1 AND workflow_id = $2 AND reply IS NOT NULL";

// One statement per place: ($1, $2) the instance, $3 the old value, $4 the new one, then the
// place's keys (its text key, then its number).
const REWRITE_INPUT: &str = "UPDATE workflows SET input = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND input = $3";
const REWRITE_OUTPUT: &str = "UPDATE workflows SET output = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND output = $3";
const REWRITE_JOURNAL: &str = "UPDATE journal SET payload = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND payload = $3 AND seq = $5";
const REWRITE_AWAKEABLE: &str = "UPDATE awakeables SET payload = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND payload = $3 AND id = $5::text::uuid";
const REWRITE_TASK_INPUT: &str = "UPDATE remote_tasks SET input = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND input = $3 AND step_id = $5";
const REWRITE_TASK_OUTPUT: &str = "UPDATE remote_tasks SET output = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND output = $3 AND step_id = $5";
const REWRITE_EVENT: &str = "UPDATE workflow_events SET value = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND value = $3 AND key = $5";
const REWRITE_STREAM: &str = "UPDATE workflow_streams SET value = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND value = $3 AND key = $5 \
     AND stream_offset = $6";
const REWRITE_UPDATE_REQUEST: &str = "UPDATE workflow_updates SET request = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND request = $3 AND update_id = $5";
const REWRITE_UPDATE_REPLY: &str = "UPDATE workflow_updates SET reply = $4 \
     WHERE workflow_name = $1 AND workflow_id = $2 AND reply = $3 AND update_id = $5";

/// A read row's place.
fn place(kind: &str, k: Option<String>, n: Option<i64>) -> Result<PayloadPlace> {
    let malformed = || StoreError::Malformed {
        operation: READ,
        detail: format!("payload place {kind:?} without its key"),
    };
    let text = || k.clone().ok_or_else(malformed);
    Ok(match kind {
        "input" => PayloadPlace::Input,
        "output" => PayloadPlace::Output,
        "journal" => PayloadPlace::Journal {
            seq: n.ok_or_else(malformed)?,
        },
        "awakeable" => PayloadPlace::Awakeable { id: text()? },
        "task_input" => PayloadPlace::TaskInput { step_id: text()? },
        "task_output" => PayloadPlace::TaskOutput { step_id: text()? },
        "event" => PayloadPlace::Event { key: text()? },
        "stream" => PayloadPlace::StreamItem {
            key: text()?,
            offset: n.ok_or_else(malformed)?,
        },
        "update_request" => PayloadPlace::UpdateRequest { id: text()? },
        "update_reply" => PayloadPlace::UpdateReply { id: text()? },
        other => {
            return Err(StoreError::Malformed {
                operation: READ,
                detail: format!("unknown payload place {other:?}"),
            })
        }
    })
}

/// A place's statement and its keys (text, number).
fn statement(place: &PayloadPlace) -> (&'static str, Option<&str>, Option<i64>) {
    match place {
        PayloadPlace::Input => (REWRITE_INPUT, None, None),
        PayloadPlace::Output => (REWRITE_OUTPUT, None, None),
        PayloadPlace::Journal { seq } => (REWRITE_JOURNAL, None, Some(*seq)),
        PayloadPlace::Awakeable { id } => (REWRITE_AWAKEABLE, Some(id), None),
        PayloadPlace::TaskInput { step_id } => (REWRITE_TASK_INPUT, Some(step_id), None),
        PayloadPlace::TaskOutput { step_id } => (REWRITE_TASK_OUTPUT, Some(step_id), None),
        PayloadPlace::Event { key } => (REWRITE_EVENT, Some(key), None),
        PayloadPlace::StreamItem { key, offset } => (REWRITE_STREAM, Some(key), Some(*offset)),
        PayloadPlace::UpdateRequest { id } => (REWRITE_UPDATE_REQUEST, Some(id), None),
        PayloadPlace::UpdateReply { id } => (REWRITE_UPDATE_REPLY, Some(id), None),
    }
}

#[async_trait::async_trait]
impl PayloadStore for PgStore {
    async fn payloads_read(&self, key: &InstanceKey) -> Result<Vec<StoredPayload>> {
        traced(store_span!("payloads_read", key = key), async {
            let rows = self
                .query(READ, PAYLOADS_READ, &[&key.name.as_str(), &key.id.as_str()])
                .await?;
            rows.iter()
                .map(|row| {
                    let kind: String = column(row, "place", READ)?;
                    Ok(StoredPayload {
                        place: place(&kind, column(row, "k", READ)?, column(row, "n", READ)?)?,
                        value: column::<Value>(row, "value", READ)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn payloads_rewrite(
        &self,
        key: &InstanceKey,
        rewrites: &[PayloadRewrite],
    ) -> Result<u64> {
        traced(store_span!("payloads_rewrite", key = key), async {
            let fail = |e: tokio_postgres::Error| self.failed(REWRITE, e);
            let mut client = self.client(REWRITE).await?;
            let tx = client.transaction().await.map_err(fail)?;
            let mut applied = 0;
            for rewrite in rewrites {
                let (sql, text, number) = statement(&rewrite.place);
                self.count_round_trips(1);
                let (name, id) = (key.name.as_str(), key.id.as_str());
                let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    vec![&name, &id, &rewrite.old, &rewrite.new];
                if let Some(text) = &text {
                    params.push(text);
                }
                if let Some(number) = &number {
                    params.push(number);
                }
                applied += tx.execute(sql, &params).await.map_err(fail)?;
            }
            self.count_round_trips(1);
            tx.commit().await.map_err(fail)?;
            Ok(applied)
        })
        .await
    }
}
