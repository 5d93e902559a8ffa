//! The provided codec: AES-256-GCM with a key ring, so keys rotate.
//!
//! Each payload is sealed with the current key under a fresh random 96-bit nonce from the
//! operating system, and its envelope names the key's id:
//! `{"$keiro_enc": 1, "alg": "A256GCM", "kid": "k2", "nonce": "<base64>", "ct": "<base64>"}`.
//! The key id is the associated data, so an envelope whose id was edited does not open. Older
//! keys stay in the ring to open what they sealed; `keiro reencrypt` moves runs to the current
//! key, after which an old key can be dropped.

use std::collections::HashMap;
use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{AeadCore, Aes256Gcm, Key, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{sealed_key_id, Codec, CodecError};
use keiro_journal::codec::SEALED_TAG;

/// The environment variable [`AesGcmCodec::from_env`] reads: `kid:base64key,...`, the first
/// key the current one (what the CLI, the dashboard and the example read).
pub const ENCRYPTION_KEYS_ENV: &str = "KEIRO_ENCRYPTION_KEYS";

/// The envelope's algorithm name.
const ALG: &str = "A256GCM";

/// The longest key id: it is stored beside every payload.
const KEY_ID_LEN_MAX: usize = 64;

/// A key ring that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// A key id is empty, too long, or holds a character other than letters, digits, `-`, `_`
    /// and `.`.
    #[error("key id {key_id:?} is invalid: use 1 to 64 letters, digits, '-', '_' or '.'")]
    KeyId {
        /// The id.
        key_id: String,
    },
    /// A key is not 32 bytes of standard base64.
    #[error("key {key_id:?} is invalid: {reason}")]
    Key {
        /// Its id.
        key_id: String,
        /// Why.
        reason: String,
    },
    /// Two keys have the same id.
    #[error("key id {key_id:?} is given twice")]
    Duplicate {
        /// The id.
        key_id: String,
    },
    /// The key list is empty or an entry is not `kid:base64`.
    #[error("a key list is `kid:base64key,...` (the first is the current key): {reason}")]
    List {
        /// Why.
        reason: String,
    },
}

/// AES-256-GCM payload encryption with rotating keys (RustCrypto's `aes-gcm`).
///
/// ```
/// use keiro::codec::{AesGcmCodec, Codec};
/// let codec = AesGcmCodec::new("k2", [7; 32])?.with_old_key("k1", [1; 32])?;
/// let sealed = codec.seal(&serde_json::json!({"card": "4242"}))?;
/// assert_eq!(keiro::codec::sealed_key_id(&sealed), Some("k2"));
/// assert!(!sealed.to_string().contains("4242"));
/// assert_eq!(codec.open(&sealed)?, serde_json::json!({"card": "4242"}));
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
pub struct AesGcmCodec {
    current: String,
    keys: HashMap<String, Aes256Gcm>,
}

impl fmt::Debug for AesGcmCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("AesGcmCodec")
            .field("current", &self.current)
            .field("key_ids", &ids)
            .finish_non_exhaustive()
    }
}

fn check_key_id(key_id: &str) -> Result<(), KeyError> {
    let ok = !key_id.is_empty()
        && key_id.len() <= KEY_ID_LEN_MAX
        && key_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(KeyError::KeyId {
            key_id: key_id.to_owned(),
        })
    }
}

impl AesGcmCodec {
    /// A codec whose current key, `key`, has the id `key_id`: every payload is sealed with it.
    ///
    /// # Errors
    ///
    /// [`KeyError::KeyId`] for an invalid id.
    pub fn new(key_id: impl Into<String>, key: [u8; 32]) -> Result<Self, KeyError> {
        let key_id = key_id.into();
        check_key_id(&key_id)?;
        let mut keys = HashMap::new();
        keys.insert(
            key_id.clone(),
            Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key)),
        );
        Ok(Self {
            current: key_id,
            keys,
        })
    }

    /// Adds an older key: payloads sealed with it still open, new ones use the current key.
    ///
    /// # Errors
    ///
    /// [`KeyError::KeyId`] for an invalid id, [`KeyError::Duplicate`] for one already in the
    /// ring.
    pub fn with_old_key(
        mut self,
        key_id: impl Into<String>,
        key: [u8; 32],
    ) -> Result<Self, KeyError> {
        let key_id = key_id.into();
        check_key_id(&key_id)?;
        if self.keys.contains_key(&key_id) {
            return Err(KeyError::Duplicate { key_id });
        }
        self.keys
            .insert(key_id, Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&key)));
        Ok(self)
    }

    /// Parses a key list `kid:base64key,kid:base64key,...` (standard base64 of 32 bytes); the
    /// first key is the current one.
    ///
    /// ```
    /// let key = keiro::codec::AesGcmCodec::generate_key_text();
    /// let codec = keiro::codec::AesGcmCodec::from_keys(&format!("k2:{key},k1:{key}"))?;
    /// assert_eq!(codec.current_key_id(), "k2");
    /// # Ok::<_, keiro::codec::KeyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`KeyError`] naming the bad entry.
    pub fn from_keys(list: &str) -> Result<Self, KeyError> {
        let mut codec: Option<Self> = None;
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key_id, text) = entry.split_once(':').ok_or_else(|| KeyError::List {
                reason: "an entry has no ':' between its id and its key".into(),
            })?;
            let key = decode_key(key_id, text.trim())?;
            codec = Some(match codec {
                None => Self::new(key_id.trim(), key)?,
                Some(codec) => codec.with_old_key(key_id.trim(), key)?,
            });
        }
        codec.ok_or_else(|| KeyError::List {
            reason: "no key given".into(),
        })
    }

    /// The codec of [`ENCRYPTION_KEYS_ENV`], or `None` when it is unset or empty.
    ///
    /// # Errors
    ///
    /// As [`from_keys`](Self::from_keys).
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        match std::env::var(ENCRYPTION_KEYS_ENV) {
            Ok(list) if !list.trim().is_empty() => Self::from_keys(&list).map(Some),
            _ => Ok(None),
        }
    }

    /// A fresh random key from the operating system, as standard base64 (for a key list).
    pub fn generate_key_text() -> String {
        STANDARD.encode(Aes256Gcm::generate_key(OsRng))
    }

    /// The id of the key new payloads are sealed with.
    pub fn current_key_id(&self) -> &str {
        &self.current
    }
}

fn decode_key(key_id: &str, text: &str) -> Result<[u8; 32], KeyError> {
    let bad = |reason: String| KeyError::Key {
        key_id: key_id.to_owned(),
        reason,
    };
    let bytes = STANDARD
        .decode(text)
        .map_err(|e| bad(format!("not standard base64: {e}")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| bad(format!("{} bytes, an AES-256 key is 32", bytes.len())))
}

impl Codec for AesGcmCodec {
    fn sealing_key_id(&self) -> &str {
        &self.current
    }

    fn seal(&self, value: &Value) -> Result<Value, CodecError> {
        let fail = |reason: String| CodecError {
            key_id: self.current.clone(),
            reason,
        };
        let cipher = self
            .keys
            .get(&self.current)
            .expect("the current key is always in the ring");
        let plain = serde_json::to_vec(value).map_err(|e| fail(e.to_string()))?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let ct = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: &plain,
                    aad: self.current.as_bytes(),
                },
            )
            .map_err(|_| fail("AES-GCM refused to encrypt".into()))?;
        Ok(json!({
            SEALED_TAG: 1,
            "alg": ALG,
            "kid": self.current,
            "nonce": STANDARD.encode(nonce),
            "ct": STANDARD.encode(ct),
        }))
    }

    fn open(&self, sealed: &Value) -> Result<Value, CodecError> {
        let key_id = sealed_key_id(sealed).unwrap_or_default();
        let fail = |reason: &str| CodecError {
            key_id: key_id.to_owned(),
            reason: reason.to_owned(),
        };
        let cipher = self
            .keys
            .get(key_id)
            .ok_or_else(|| fail("no key with this id is configured"))?;
        if sealed.get("alg").and_then(Value::as_str) != Some(ALG) {
            return Err(fail("not an AES-256-GCM envelope"));
        }
        let field = |name: &str| {
            sealed
                .get(name)
                .and_then(Value::as_str)
                .and_then(|text| STANDARD.decode(text).ok())
                .ok_or_else(|| fail("the envelope is malformed"))
        };
        let nonce = field("nonce")?;
        if nonce.len() != 12 {
            return Err(fail("the envelope is malformed"));
        }
        let ct = field("ct")?;
        let plain = cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &ct,
                    aad: key_id.as_bytes(),
                },
            )
            .map_err(|_| {
                fail("the key does not open it (a wrong key under this id, or a tampered payload)")
            })?;
        serde_json::from_slice(&plain).map_err(|_| fail("the opened payload is not JSON"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_key_under_the_same_id_is_a_typed_error_naming_the_id() {
        let sealed = AesGcmCodec::new("k1", [1; 32])
            .unwrap()
            .seal(&json!("secret"))
            .unwrap();
        let error = AesGcmCodec::new("k1", [2; 32])
            .unwrap()
            .open(&sealed)
            .unwrap_err();
        assert_eq!(error.key_id, "k1");
        assert!(error.to_string().contains("wrong key"), "{error}");
        let error = AesGcmCodec::new("k9", [1; 32])
            .unwrap()
            .open(&sealed)
            .unwrap_err();
        assert_eq!(error.key_id, "k1");
        assert!(error.to_string().contains("no key"), "{error}");
    }

    #[test]
    fn an_edited_key_id_does_not_open() {
        let codec = AesGcmCodec::new("k1", [1; 32])
            .unwrap()
            .with_old_key("k2", [1; 32])
            .unwrap();
        let mut sealed = codec.seal(&json!(1)).unwrap();
        sealed["kid"] = json!("k2");
        assert!(codec.open(&sealed).is_err());
    }

    #[test]
    fn key_lists_are_checked() {
        assert!(AesGcmCodec::from_keys("").is_err());
        assert!(matches!(
            AesGcmCodec::from_keys("k1"),
            Err(KeyError::List { .. })
        ));
        assert!(matches!(
            AesGcmCodec::from_keys("k1:abc"),
            Err(KeyError::Key { .. })
        ));
        let key = AesGcmCodec::generate_key_text();
        assert!(matches!(
            AesGcmCodec::from_keys(&format!("k1:{key},k1:{key}")),
            Err(KeyError::Duplicate { .. })
        ));
        assert!(matches!(
            AesGcmCodec::from_keys(&format!("k 1:{key}")),
            Err(KeyError::KeyId { .. })
        ));
        let codec = AesGcmCodec::from_keys(&format!("new:{key}, old:{key}")).unwrap();
        assert_eq!(codec.current_key_id(), "new");
        assert!(!format!("{codec:?}").contains(&key));
    }
}
