//! An instance's stored payloads (`PayloadStore`, plain SQL; the SQLite store's twin is
//! `payloads.rs` there): one query reads every payload column of every row the instance owns,
//! and a rewrite updates each place in one transaction, only while it still holds the value
//! read (jsonb equality). The rule is keiro-journal's `payloads` module, and so is the list of
//! places (`PAYLOAD_PLACES`) both statements are built from.

use std::sync::OnceLock;

use keiro_journal::store::{
    PayloadColumn, PayloadPlace, PayloadRewrite, PayloadStore, StoredPayload, PAYLOAD_PLACES,
};
use keiro_journal::{span::traced, store_span, InstanceKey, StoreError};
use serde_json::Value;

use crate::row::column;
use crate::PgStore;

type Result<T, E = StoreError> = std::result::Result<T, E>;

const READ: &str = "reading an instance's payloads";
const REWRITE: &str = "rewriting an instance's payloads";

/// Every payload of instance ($1, $2): the place's name, its keys as text and number, the
/// value; one `SELECT` per place of keiro-journal's `PAYLOAD_PLACES`, joined by `UNION ALL`.
/// Each part is served by its table's owner index (or primary key). Built once from that table
/// (names only, never a value), which is why it is not a `const`.
fn payloads_read_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let parts: Vec<String> = PAYLOAD_PLACES
            .iter()
            .map(|place| {
                let text = place.text_key.map_or("NULL::text".to_owned(), |key| {
                    format!("{}::text", key.column)
                });
                let number = place.number_key.unwrap_or("NULL::bigint");
                let present = if place.nullable {
                    format!(" AND {} IS NOT NULL", place.column)
                } else {
                    String::new()
                };
                format!(
                    "SELECT '{}' AS place, {text} AS k, {number} AS n, {} AS value FROM {} \
                     WHERE workflow_name = $1 AND workflow_id = $2{present}",
                    place.name, place.column, place.table
                )
            })
            .collect();
        parts.join(" UNION ALL ")
    })
}

/// The rewrite of one place: ($1, $2) the instance, $3 the old value, $4 the new one, then the
/// place's keys (its text key, then its number). Built once per place, like the read.
fn payload_rewrite_sql(place: &PayloadColumn) -> &'static str {
    static SQL: OnceLock<Vec<String>> = OnceLock::new();
    let all = SQL.get_or_init(|| {
        PAYLOAD_PLACES
            .iter()
            .map(|place| {
                let mut sql = format!(
                    "UPDATE {table} SET {column} = $4 WHERE workflow_name = $1 \
                     AND workflow_id = $2 AND {column} = $3",
                    table = place.table,
                    column = place.column
                );
                let mut next = 5;
                if let Some(key) = place.text_key {
                    let cast = if key.uuid { "::text::uuid" } else { "" };
                    sql.push_str(&format!(" AND {} = ${next}{cast}", key.column));
                    next += 1;
                }
                if let Some(key) = place.number_key {
                    sql.push_str(&format!(" AND {key} = ${next}"));
                }
                sql
            })
            .collect()
    });
    let index = PAYLOAD_PLACES
        .iter()
        .position(|listed| listed == place)
        .expect("a place's column is an entry of PAYLOAD_PLACES");
    &all[index]
}

#[async_trait::async_trait]
impl PayloadStore for PgStore {
    async fn payloads_read(&self, key: &InstanceKey) -> Result<Vec<StoredPayload>> {
        traced(store_span!("payloads_read", key = key), async {
            let rows = self
                .query(
                    READ,
                    payloads_read_sql(),
                    &[&key.name.as_str(), &key.id.as_str()],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    let kind: String = column(row, "place", READ)?;
                    Ok(StoredPayload {
                        place: PayloadPlace::from_row(
                            &kind,
                            column(row, "k", READ)?,
                            column(row, "n", READ)?,
                            READ,
                        )?,
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
                let sql = payload_rewrite_sql(rewrite.place.column());
                let (text, number) = rewrite.place.keys();
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
