//! What a store can keep: PostgreSQL refuses a NUL character inside jsonb strings and text
//! columns, so every store checks user values with [`check_value`] (the memory store refuses
//! exactly what PostgreSQL refuses) and keiro's own texts (crash messages, failure reasons)
//! go through [`storable_text`] before they are written.

use std::borrow::Cow;

use serde_json::Value;

/// What a NUL character is replaced with in text keiro writes itself.
const NUL_REPLACEMENT: char = '\u{FFFD}';

/// `text` with every character a store refuses replaced, so an error message that quotes a
/// poisoned value can still be recorded.
///
/// ```
/// use keiro_journal::store::storable_text;
/// assert_eq!(storable_text("a\u{0}b"), "a\u{FFFD}b");
/// assert_eq!(storable_text("fine"), "fine");
/// ```
pub fn storable_text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', &NUL_REPLACEMENT.to_string()))
    } else {
        Cow::Borrowed(text)
    }
}

/// Checks that a JSON value can be stored: no string (and no object key) holds a NUL
/// character. Returns why not, naming where, for a [`ValueRefused`](crate::StoreError::ValueRefused).
///
/// ```
/// use keiro_journal::store::check_value;
/// assert!(check_value(&serde_json::json!({"a": ["ok"]})).is_ok());
/// assert!(check_value(&serde_json::json!({"a": ["b\u{0}"]})).is_err());
/// ```
///
/// # Errors
///
/// The reason, such as `a NUL character in a string at /a/0`.
pub fn check_value(value: &Value) -> Result<(), String> {
    let mut path = Vec::new();
    match find_nul(value, &mut path) {
        None => Ok(()),
        Some(()) => Err(format!(
            "a NUL character (\\u0000) in a string at /{}",
            path.join("/")
        )),
    }
}

fn find_nul(value: &Value, path: &mut Vec<String>) -> Option<()> {
    match value {
        Value::String(s) if s.contains('\0') => Some(()),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            path.push(i.to_string());
            let found = find_nul(item, path);
            if found.is_none() {
                path.pop();
            }
            found
        }),
        Value::Object(map) => map.iter().find_map(|(k, item)| {
            path.push(storable_text(k).into_owned());
            if k.contains('\0') {
                return Some(());
            }
            let found = find_nul(item, path);
            if found.is_none() {
                path.pop();
            }
            found
        }),
        _ => None,
    }
}
