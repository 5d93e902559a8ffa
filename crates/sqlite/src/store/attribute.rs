//! [`SqliteStore`]'s search attributes (`JournalStore::attributes_set` and
//! `InspectStore::instance_attributes`), over the rules of the crate's `attribute` module. A
//! start's attributes are written by the start operations (`journal.rs`, `queue.rs`).

use keiro_journal::attribute::{Attributes, ATTRIBUTES_MAX};
use keiro_journal::store::{Append, AttributesOutcome, Result};
use keiro_journal::InstanceKey;

use crate::attribute::{self, AttributesCode};
use crate::storable;

use super::journal::{append_outcome, append_to, encoded_step};
use super::SqliteStore;

const ATTRIBUTES_SET: &str = "setting search attributes";
const ATTRIBUTES_READ: &str = "reading search attributes";

const INSTANCE_ATTRIBUTES: &str = "SELECT attr, value FROM workflow_attributes \
     WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY attr";

impl SqliteStore {
    /// Journals the attributes step `append` and sets `attributes` on the instance, in one
    /// transaction, unless the instance would carry too many names
    /// (`JournalStore::attributes_set`).
    ///
    /// # Errors
    ///
    /// As `journal_append`.
    pub async fn attributes_set(
        &self,
        append: &Append,
        attributes: &Attributes,
    ) -> Result<AttributesOutcome> {
        let encoded = encoded_step(append, ATTRIBUTES_SET)?;
        storable::append(ATTRIBUTES_SET, append)?;
        let (append, attributes) = (append.clone(), attributes.clone());
        self.inner
            .writer
            .write(ATTRIBUTES_SET, move |conn, now| {
                let code = attribute::attributes_set(
                    conn,
                    now,
                    append_to(&append, &encoded),
                    &attributes,
                    ATTRIBUTES_MAX,
                )?;
                match code {
                    AttributesCode::TooMany(count) => Ok(AttributesOutcome::TooMany {
                        count: u64::try_from(count).unwrap_or(0),
                    }),
                    AttributesCode::Append(code) => {
                        append_outcome(code, &append.key, append.fence.as_ref())
                            .map(AttributesOutcome::Append)
                    }
                }
            })
            .await
    }

    /// The attributes of `key` by name (`InspectStore::instance_attributes`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_attributes(&self, key: &InstanceKey) -> Result<Attributes> {
        let key = key.clone();
        self.read(ATTRIBUTES_READ, move |conn, _| {
            let rows: Vec<(String, String)> = conn
                .prepare_cached(INSTANCE_ATTRIBUTES)
                .and_then(|mut s| {
                    s.query_map(
                        rusqlite::params![key.name.as_str(), key.id.as_str()],
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )?
                    .collect()
                })
                .map_err(|e| crate::error::store(ATTRIBUTES_READ, e))?;
            let mut attributes = Attributes::new();
            for (name, value) in rows {
                attributes.insert(name, attribute::stored_value(&value, ATTRIBUTES_READ)?);
            }
            Ok(attributes)
        })
        .await
    }
}
