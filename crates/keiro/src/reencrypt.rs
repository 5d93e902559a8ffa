//! `Keiro::reencrypt`: an instance's payloads sealed with an older key, sealed again with the
//! codec's current key, so the old key can be retired (`keiro reencrypt` runs it over a chosen
//! set of runs). Each instance is read as stored (never through the codec), every envelope
//! naming another key is opened and sealed again where it lies (a store's own wrapping, such as
//! a child's `{"ok": <output>}`, is kept), and the instance's changed payloads are rewritten in
//! one transaction, each only while it still holds what was read.

use keiro_journal::codec::reseal;
use keiro_journal::store::PayloadRewrite;
use keiro_journal::{IntoInstanceKey, StoreError};

use crate::{Error, Keiro};

/// What re-encryption rewrites, in the store's own words.
const REENCRYPT: &str = "re-encrypting an instance's payloads";

impl Keiro {
    /// Seals every payload of `key` that an older key sealed with the codec's current key, in
    /// one transaction; returns how many payloads were rewritten (0 when all were current or
    /// plain). Idempotent; a payload a run changed meanwhile is left for the next call.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use keiro::codec::AesGcmCodec;
    /// let store = keiro::store::sqlite::SqliteStore::temporary()?;
    /// let old = keiro::Keiro::builder(store.clone()).codec(Arc::new(AesGcmCodec::new("k1", [1; 32])?)).build();
    /// old.start("order", "o-1", &"secret").await?;
    /// let ring = AesGcmCodec::new("k2", [2; 32])?.with_old_key("k1", [1; 32])?;
    /// let keiro = keiro::Keiro::builder(store).codec(Arc::new(ring)).build();
    /// assert_eq!(keiro.reencrypt(("order", "o-1")).await?, 1);
    /// assert_eq!(keiro.reencrypt(("order", "o-1")).await?, 0);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] without a codec or on a store built with
    /// [`KeiroBuilder::lease_only`](crate::KeiroBuilder::lease_only); [`Error::Store`] with
    /// `StoreError::Codec` naming the key id of a payload the codec cannot open (nothing is
    /// rewritten), and the store's errors.
    pub async fn reencrypt(&self, key: impl IntoInstanceKey) -> Result<u64, Error> {
        let key = key.into_instance_key()?;
        let (Some(codec), Some(operate)) = (&self.codec, &self.operate) else {
            return Err(Error::Unsupported {
                what:
                    "re-encryption without a codec (KeiroBuilder::codec) or on a lease-only store",
            });
        };
        let mut rewrites = Vec::new();
        for stored in operate.payloads.payloads_read(&key).await? {
            let resealed =
                reseal(codec.as_ref(), &stored.value).map_err(|source| StoreError::Codec {
                    operation: REENCRYPT,
                    source,
                })?;
            if let Some(new) = resealed {
                rewrites.push(PayloadRewrite {
                    place: stored.place,
                    old: stored.value,
                    new,
                });
            }
        }
        if rewrites.is_empty() {
            return Ok(0);
        }
        Ok(operate.payloads.payloads_rewrite(&key, &rewrites).await?)
    }
}
