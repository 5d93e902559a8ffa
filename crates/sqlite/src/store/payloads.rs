//! [`SqliteStore`]'s `PayloadStore`: the read on a reader, the rewrite on the writer (one
//! transaction).

use keiro_journal::store::{PayloadRewrite, PayloadStore, Result, StoredPayload};
use keiro_journal::{span::traced, store_span, InstanceKey};

use crate::payloads;

use super::SqliteStore;

const READ: &str = "reading an instance's payloads";
const REWRITE: &str = "rewriting an instance's payloads";

#[async_trait::async_trait]
impl PayloadStore for SqliteStore {
    async fn payloads_read(&self, key: &InstanceKey) -> Result<Vec<StoredPayload>> {
        let (name, id) = (key.name.to_string(), key.id.to_string());
        traced(
            store_span!("payloads_read", key = key),
            self.read(READ, move |conn, _| {
                payloads::payloads_read(conn, &name, &id)
            }),
        )
        .await
    }

    async fn payloads_rewrite(
        &self,
        key: &InstanceKey,
        rewrites: &[PayloadRewrite],
    ) -> Result<u64> {
        let (name, id) = (key.name.to_string(), key.id.to_string());
        let rewrites = rewrites.to_vec();
        traced(
            store_span!("payloads_rewrite", key = key),
            self.inner.writer.write(REWRITE, move |conn, _| {
                payloads::payloads_rewrite(conn, &name, &id, &rewrites)
            }),
        )
        .await
    }
}
