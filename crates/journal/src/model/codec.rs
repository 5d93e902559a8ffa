//! Payload codecs: what turns a payload into the sealed value a store keeps, and back.
//!
//! A store keeps payloads as JSON (jsonb on PostgreSQL). A codec seals a whole payload into a
//! JSON object of its own, the *sealed envelope*, `{"$keiro_enc": 1, "kid": "<key id>", ...}`:
//! valid JSON, so every store keeps it as it keeps any value, and carrying the id of the key
//! that sealed it, so keys rotate (new writes use the current key, an old payload is opened with
//! the key its envelope names). Ids, statuses, times and step names stay outside the payloads and
//! so stay readable without the key.
//!
//! A store's own SQL sometimes wraps a payload into a value of its own (a child's output becomes
//! `{"ok": <output>}` in its parent's journal, a remote task's output too). The envelope then
//! travels inside that value unchanged, which is why reading is [`open_all`]: every sealed
//! envelope anywhere inside a value is opened, and a value with none (written before a codec
//! was configured) reads back as it is.
//!
//! The facade applies a codec to every payload on the way into and out of a store (the
//! `keiro::codec` module); this module holds only the contract, so a crate below the facade (the
//! remote worker) can recognise a sealed value it cannot open.

use std::fmt;

use serde_json::Value;

/// The key of a sealed envelope's tag: an object holding it is a sealed payload.
pub const SEALED_TAG: &str = "$keiro_enc";

/// The key of a sealed envelope's key id.
pub const SEALED_KEY_ID: &str = "kid";

/// Seals payloads into sealed envelopes and opens them again.
///
/// `seal` must return an object holding [`SEALED_TAG`] and, under [`SEALED_KEY_ID`], the id of
/// the key it used; `open` is only ever called with such an object. The provided codec is
/// AES-256-GCM (`keiro::codec::AesGcmCodec`).
pub trait Codec: Send + Sync + fmt::Debug + 'static {
    /// The id of the key [`seal`](Self::seal) uses: an envelope naming another is re-sealed by
    /// a re-encryption.
    fn sealing_key_id(&self) -> &str;

    /// Seals `value`.
    ///
    /// # Errors
    ///
    /// [`CodecError`] when the value cannot be sealed.
    fn seal(&self, value: &Value) -> Result<Value, CodecError>;

    /// Opens a sealed envelope this codec (or one with the same keys) made.
    ///
    /// # Errors
    ///
    /// [`CodecError`] naming the envelope's key id: an unknown key id, or a key that does not
    /// open it (a wrong key under that id, or a tampered envelope). Never a guessed value.
    fn open(&self, sealed: &Value) -> Result<Value, CodecError>;
}

/// Why a codec could not seal or open a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payload sealed with key {key_id:?}: {reason}")]
pub struct CodecError {
    /// The key id of the envelope (or, sealing, the current key); empty when the envelope names
    /// none.
    pub key_id: String,
    /// What went wrong, for humans.
    pub reason: String,
}

/// The key id of `value` when it is a sealed envelope.
///
/// ```
/// use keiro_journal::codec::sealed_key_id;
/// let sealed = serde_json::json!({"$keiro_enc": 1, "kid": "k2", "ct": "..."});
/// assert_eq!(sealed_key_id(&sealed), Some("k2"));
/// assert_eq!(sealed_key_id(&serde_json::json!({"kid": "k2"})), None);
/// ```
pub fn sealed_key_id(value: &Value) -> Option<&str> {
    let map = value.as_object()?;
    map.get(SEALED_TAG)?;
    Some(map.get(SEALED_KEY_ID).and_then(Value::as_str).unwrap_or(""))
}

/// Whether `value` holds a sealed envelope anywhere inside it.
pub fn holds_sealed(value: &Value) -> bool {
    first_sealed_key_id(value).is_some()
}

/// The key id of the first sealed envelope inside `value` (itself included), if any: what a
/// reader without the key names when it refuses the value.
///
/// ```
/// use keiro_journal::codec::first_sealed_key_id;
/// let wrapped = serde_json::json!({"ok": {"$keiro_enc": 1, "kid": "k2"}});
/// assert_eq!(first_sealed_key_id(&wrapped), Some("k2"));
/// assert_eq!(first_sealed_key_id(&serde_json::json!([1, "two"])), None);
/// ```
pub fn first_sealed_key_id(value: &Value) -> Option<&str> {
    match value {
        Value::Object(map) => {
            sealed_key_id(value).or_else(|| map.values().find_map(first_sealed_key_id))
        }
        Value::Array(items) => items.iter().find_map(first_sealed_key_id),
        _ => None,
    }
}

/// `value` with every sealed envelope inside it opened by `codec`; a value with none comes
/// back as it is.
///
/// # Errors
///
/// The first envelope `codec` cannot open.
pub fn open_all(codec: &dyn Codec, value: Value) -> Result<Value, CodecError> {
    match value {
        Value::Object(map) if map.contains_key(SEALED_TAG) => codec.open(&Value::Object(map)),
        Value::Object(map) => {
            if !map.values().any(holds_sealed) {
                return Ok(Value::Object(map));
            }
            map.into_iter()
                .map(|(k, v)| Ok((k, open_all(codec, v)?)))
                .collect::<Result<_, _>>()
                .map(Value::Object)
        }
        Value::Array(items) => {
            if !items.iter().any(holds_sealed) {
                return Ok(Value::Array(items));
            }
            items
                .into_iter()
                .map(|v| open_all(codec, v))
                .collect::<Result<_, _>>()
                .map(Value::Array)
        }
        other => Ok(other),
    }
}

/// `value` with every envelope sealed with a key other than the codec's current one opened and
/// sealed again with the current key, everything around them unchanged; `None` when it holds
/// no such envelope.
///
/// # Errors
///
/// The first envelope `codec` cannot open.
pub fn reseal(codec: &dyn Codec, value: &Value) -> Result<Option<Value>, CodecError> {
    let current = codec.sealing_key_id();
    match value {
        Value::Object(_) if sealed_key_id(value).is_some() => {
            if sealed_key_id(value) == Some(current) {
                return Ok(None);
            }
            codec.seal(&codec.open(value)?).map(Some)
        }
        Value::Object(map) => {
            let mut changed = false;
            let mut out = serde_json::Map::new();
            for (k, v) in map {
                let v = match reseal(codec, v)? {
                    Some(new) => {
                        changed = true;
                        new
                    }
                    None => v.clone(),
                };
                out.insert(k.clone(), v);
            }
            Ok(changed.then_some(Value::Object(out)))
        }
        Value::Array(items) => {
            let mut changed = false;
            let mut out = Vec::with_capacity(items.len());
            for v in items {
                match reseal(codec, v)? {
                    Some(new) => {
                        changed = true;
                        out.push(new);
                    }
                    None => out.push(v.clone()),
                }
            }
            Ok(changed.then_some(Value::Array(out)))
        }
        _ => Ok(None),
    }
}

/// [`open_all`] that leaves an envelope `codec` cannot open in place, for an operator's read: a
/// display then says "encrypted" where it finds one ([`sealed_key_id`]).
pub fn open_readable(codec: &dyn Codec, value: Value) -> Value {
    match value {
        Value::Object(map) if map.contains_key(SEALED_TAG) => {
            let sealed = Value::Object(map);
            codec.open(&sealed).unwrap_or(sealed)
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (k, open_readable(codec, v)))
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| open_readable(codec, v)).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Seals by wrapping, opens by unwrapping; refuses key ids other than "k1".
    #[derive(Debug)]
    struct Wrap;

    impl Codec for Wrap {
        fn sealing_key_id(&self) -> &str {
            "k1"
        }
        fn seal(&self, value: &Value) -> Result<Value, CodecError> {
            Ok(json!({SEALED_TAG: 1, "kid": "k1", "v": value}))
        }
        fn open(&self, sealed: &Value) -> Result<Value, CodecError> {
            match sealed_key_id(sealed) {
                Some("k1") => Ok(sealed["v"].clone()),
                other => Err(CodecError {
                    key_id: other.unwrap_or_default().to_owned(),
                    reason: "unknown key id".into(),
                }),
            }
        }
    }

    #[test]
    fn envelopes_nested_in_a_stores_own_values_are_opened() {
        let sealed = Wrap.seal(&json!({"secret": 1})).unwrap();
        let wrapped = json!({"ok": sealed, "list": [Wrap.seal(&json!(2)).unwrap()], "n": 3});
        assert_eq!(
            open_all(&Wrap, wrapped).unwrap(),
            json!({"ok": {"secret": 1}, "list": [2], "n": 3})
        );
        assert_eq!(
            open_all(&Wrap, json!({"plain": [1]})).unwrap(),
            json!({"plain": [1]})
        );
    }

    #[test]
    fn an_unknown_key_is_an_error_for_runs_and_left_sealed_for_operators() {
        let foreign = json!({SEALED_TAG: 1, "kid": "old", "v": 1});
        let error = open_all(&Wrap, json!({"ok": foreign.clone()})).unwrap_err();
        assert_eq!(error.key_id, "old");
        assert_eq!(
            open_readable(&Wrap, json!([foreign.clone()])),
            json!([foreign])
        );
    }
}
