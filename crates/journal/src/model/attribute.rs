//! Search attributes: typed name-value pairs a run carries so operators can find it
//! (`customer = "acme"`, `amount = 1200`, `region = "eu"`).
//!
//! A run gets them at its start (the start request's `attributes`) and from its body
//! (`Ctx::set_attributes`), each set a journaled step (`attrs:#<n>`, the `n`-th set of the
//! generation) written in the same transaction as the attribute rows, so a replayed set writes
//! nothing and a later set of a name replaces its value (the latest wins). The list filters on
//! them by equality and, for numbers and times, by range (the list's `AttrFilter`).
//!
//! A value is one of five kinds, serialized with its kind as a tag so the JSON shape is stable
//! (`{"type": "int", "value": 1200}`). Integers and floats are both numbers to a filter
//! (compared as 64-bit floats, exact up to 2^53). Attributes are plain, unencrypted data meant
//! for searching: keep secrets out of them.
//!
//! They are bounded ([`ATTRIBUTES_MAX`] names per run, [`ATTRIBUTE_NAME_LEN_MAX`] bytes a name,
//! [`ATTRIBUTE_TEXT_LEN_MAX`] bytes a text value), and a value past a bound is refused with a
//! typed [`AttrError`] before anything is written.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// The most attribute names one run may carry (its start's and its body's together).
pub const ATTRIBUTES_MAX: usize = 32;
/// The longest attribute name, in bytes.
pub const ATTRIBUTE_NAME_LEN_MAX: usize = 64;
/// The longest text value, in bytes.
pub const ATTRIBUTE_TEXT_LEN_MAX: usize = 256;
/// The journal step-name prefix of a body's set of attributes: `attrs:#<n>`, the `n`-th set
/// of the generation. User step names may not start with it.
pub const ATTRIBUTES_STEP_PREFIX: &str = "attrs:";

/// One attribute's value.
///
/// ```
/// use keiro_journal::attribute::AttrValue;
/// let value = AttrValue::from(1200);
/// assert_eq!(serde_json::to_string(&value)?, r#"{"type":"int","value":1200}"#);
/// assert_eq!(value.to_string(), "1200");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum AttrValue {
    /// Text, at most [`ATTRIBUTE_TEXT_LEN_MAX`] bytes.
    Text(String),
    /// A whole number.
    Int(i64),
    /// A finite floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// An instant (RFC 3339 in JSON; stored to the microsecond).
    Time(#[serde(with = "time::serde::rfc3339")] OffsetDateTime),
}

impl AttrValue {
    /// The kind's name, as stored: `text`, `int`, `float`, `bool` or `time`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text(_) => "text",
            Self::Int(_) => "int",
            Self::Float(_) => "float",
            Self::Bool(_) => "bool",
            Self::Time(_) => "time",
        }
    }

    /// The text an equality on text or booleans compares: the text, or `true` / `false`.
    pub fn text_key(&self) -> Option<String> {
        match self {
            Self::Text(text) => Some(text.clone()),
            Self::Bool(flag) => Some(flag.to_string()),
            _ => None,
        }
    }

    /// The number a filter on numbers compares (an integer as a 64-bit float).
    #[allow(clippy::cast_precision_loss)] // documented: numbers compare as f64, exact to 2^53
    pub fn number_key(&self) -> Option<f64> {
        match self {
            Self::Int(n) => Some(*n as f64),
            Self::Float(x) => Some(*x),
            _ => None,
        }
    }

    /// The instant a filter on times compares.
    pub fn time_key(&self) -> Option<OffsetDateTime> {
        match self {
            Self::Time(at) => Some(*at),
            _ => None,
        }
    }

    /// Reads a value as a command line or a URL query writes it: `"quoted"` is text, `true` /
    /// `false` a boolean, then an integer, a finite float, an RFC 3339 instant, and anything
    /// else text.
    ///
    /// ```
    /// use keiro_journal::attribute::AttrValue;
    /// assert_eq!(AttrValue::parse("acme"), AttrValue::Text("acme".into()));
    /// assert_eq!(AttrValue::parse("1200"), AttrValue::Int(1200));
    /// assert_eq!(AttrValue::parse("\"02139\""), AttrValue::Text("02139".into()));
    /// ```
    pub fn parse(text: &str) -> Self {
        if let Some(quoted) = text
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
        {
            return Self::Text(quoted.to_owned());
        }
        match text {
            "true" => return Self::Bool(true),
            "false" => return Self::Bool(false),
            _ => {}
        }
        if let Ok(n) = text.parse::<i64>() {
            return Self::Int(n);
        }
        if let Ok(x) = text.parse::<f64>() {
            if x.is_finite() {
                return Self::Float(x);
            }
        }
        if let Ok(at) = OffsetDateTime::parse(text, &Rfc3339) {
            return Self::Time(at);
        }
        Self::Text(text.to_owned())
    }
}

impl fmt::Display for AttrValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Text(text) => f.write_str(text),
            Self::Int(n) => write!(f, "{n}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Bool(flag) => write!(f, "{flag}"),
            Self::Time(at) => match at.format(&Rfc3339) {
                Ok(text) => f.write_str(&text),
                Err(_) => write!(f, "{at}"),
            },
        }
    }
}

impl From<&str> for AttrValue {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl From<String> for AttrValue {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

impl From<i64> for AttrValue {
    fn from(n: i64) -> Self {
        Self::Int(n)
    }
}

impl From<i32> for AttrValue {
    fn from(n: i32) -> Self {
        Self::Int(n.into())
    }
}

impl From<u32> for AttrValue {
    fn from(n: u32) -> Self {
        Self::Int(n.into())
    }
}

impl From<f64> for AttrValue {
    fn from(x: f64) -> Self {
        Self::Float(x)
    }
}

impl From<bool> for AttrValue {
    fn from(flag: bool) -> Self {
        Self::Bool(flag)
    }
}

impl From<OffsetDateTime> for AttrValue {
    fn from(at: OffsetDateTime) -> Self {
        Self::Time(at)
    }
}

/// An attribute refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttrError {
    /// More names than a run may carry.
    #[error("{count} attributes, more than the {max} a run may carry")]
    TooMany {
        /// The names the run would carry.
        count: usize,
        /// [`ATTRIBUTES_MAX`].
        max: usize,
    },
    /// A name that is empty, too long, or has a character outside `[A-Za-z0-9_.-]` (or does
    /// not start with a letter or `_`).
    #[error("attribute name {name:?} is invalid: {reason}")]
    InvalidName {
        /// The name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A text value longer than [`ATTRIBUTE_TEXT_LEN_MAX`] bytes.
    #[error("attribute {name:?}: text of {len} bytes, more than {max}")]
    TextTooLong {
        /// The attribute.
        name: String,
        /// Its length in bytes.
        len: usize,
        /// [`ATTRIBUTE_TEXT_LEN_MAX`].
        max: usize,
    },
    /// A text value with a control character (or NUL, which no store keeps).
    #[error("attribute {name:?}: text has a control character")]
    ControlCharacter {
        /// The attribute.
        name: String,
    },
    /// A float that is NaN or infinite.
    #[error("attribute {name:?}: {value} is not a finite number")]
    NotFinite {
        /// The attribute.
        name: String,
        /// The value, printed.
        value: String,
    },
}

/// Checks an attribute name: 1 to [`ATTRIBUTE_NAME_LEN_MAX`] bytes of `[A-Za-z0-9_.-]`,
/// starting with a letter or `_`.
///
/// # Errors
///
/// [`AttrError::InvalidName`].
///
/// ```
/// use keiro_journal::attribute::validate_attribute_name;
/// assert!(validate_attribute_name("customer").is_ok());
/// assert!(validate_attribute_name("a=b").is_err());
/// ```
pub fn validate_attribute_name(name: &str) -> Result<(), AttrError> {
    let invalid = |reason| {
        Err(AttrError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("empty");
    }
    if name.len() > ATTRIBUTE_NAME_LEN_MAX {
        return invalid("longer than 64 bytes");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        return invalid("must start with a letter or `_`");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return invalid("only letters, digits, `_`, `-` and `.` are allowed");
    }
    Ok(())
}

/// A run's attributes by name: what a start or a set writes, and what a read returns. The
/// latest value of a name wins.
///
/// ```
/// use keiro_journal::attribute::{AttrValue, Attributes};
/// let attrs = Attributes::new().with("customer", "acme").with("amount", 1200);
/// assert_eq!(attrs.get("amount"), Some(&AttrValue::Int(1200)));
/// assert!(attrs.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Attributes(BTreeMap<String, AttrValue>);

impl Attributes {
    /// No attributes.
    pub fn new() -> Self {
        Self::default()
    }

    /// These attributes with `name` set to `value`.
    #[must_use]
    pub fn with(mut self, name: impl Into<String>, value: impl Into<AttrValue>) -> Self {
        self.insert(name, value);
        self
    }

    /// Sets `name` to `value`, replacing an earlier value.
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<AttrValue>) {
        self.0.insert(name.into(), value.into());
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&AttrValue> {
        self.0.get(name)
    }

    /// The attributes, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AttrValue)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value))
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks every name and value, and that there are at most [`ATTRIBUTES_MAX`].
    ///
    /// # Errors
    ///
    /// The first [`AttrError`] found.
    pub fn validate(&self) -> Result<(), AttrError> {
        if self.len() > ATTRIBUTES_MAX {
            return Err(AttrError::TooMany {
                count: self.len(),
                max: ATTRIBUTES_MAX,
            });
        }
        for (name, value) in self.iter() {
            validate_attribute_name(name)?;
            match value {
                AttrValue::Text(text) if text.len() > ATTRIBUTE_TEXT_LEN_MAX => {
                    return Err(AttrError::TextTooLong {
                        name: name.to_owned(),
                        len: text.len(),
                        max: ATTRIBUTE_TEXT_LEN_MAX,
                    })
                }
                AttrValue::Text(text) if text.chars().any(char::is_control) => {
                    return Err(AttrError::ControlCharacter {
                        name: name.to_owned(),
                    })
                }
                AttrValue::Float(x) if !x.is_finite() => {
                    return Err(AttrError::NotFinite {
                        name: name.to_owned(),
                        value: x.to_string(),
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl<K: Into<String>, V: Into<AttrValue>> FromIterator<(K, V)> for Attributes {
    fn from_iter<T: IntoIterator<Item = (K, V)>>(iter: T) -> Self {
        Self(
            iter.into_iter()
                .map(|(name, value)| (name.into(), value.into()))
                .collect(),
        )
    }
}

/// The step of a body's `n`-th set of attributes in a generation: `attrs:#<n>`.
pub(crate) fn attributes_step(n: u32) -> String {
    format!("{ATTRIBUTES_STEP_PREFIX}#{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_kind_in_json() {
        let attrs = Attributes::new()
            .with("customer", "acme")
            .with("amount", 1200)
            .with("ratio", 0.5)
            .with("vip", true)
            .with(
                "due",
                OffsetDateTime::from_unix_timestamp(1_900_000_000).expect("in range"),
            );
        let json = serde_json::to_value(&attrs).expect("serializes");
        assert_eq!(
            json["amount"],
            serde_json::json!({"type": "int", "value": 1200})
        );
        assert_eq!(
            json["due"],
            serde_json::json!({"type": "time", "value": "2030-03-17T17:46:40Z"})
        );
        let back: Attributes = serde_json::from_value(json).expect("parses");
        assert_eq!(back, attrs);
    }

    #[test]
    fn bounds_are_typed_refusals() {
        let too_many: Attributes = (0..=ATTRIBUTES_MAX).map(|i| (format!("a{i}"), 1)).collect();
        assert!(matches!(
            too_many.validate(),
            Err(AttrError::TooMany { count: 33, .. })
        ));
        for bad in ["", "1st", "a b", "a=b", "é", &"x".repeat(65)] {
            assert!(
                matches!(
                    Attributes::new().with(bad, 1).validate(),
                    Err(AttrError::InvalidName { .. })
                ),
                "{bad:?} was accepted"
            );
        }
        assert!(matches!(
            Attributes::new().with("t", "x".repeat(257)).validate(),
            Err(AttrError::TextTooLong { len: 257, .. })
        ));
        assert!(matches!(
            Attributes::new().with("t", "a\0b").validate(),
            Err(AttrError::ControlCharacter { .. })
        ));
        assert!(matches!(
            Attributes::new().with("x", f64::NAN).validate(),
            Err(AttrError::NotFinite { .. })
        ));
        assert!(Attributes::new()
            .with("x".repeat(64), "y".repeat(256))
            .validate()
            .is_ok());
    }

    #[test]
    fn text_parses_to_the_narrowest_kind() {
        assert_eq!(AttrValue::parse("true"), AttrValue::Bool(true));
        assert_eq!(AttrValue::parse("-7"), AttrValue::Int(-7));
        assert_eq!(AttrValue::parse("2.5"), AttrValue::Float(2.5));
        assert_eq!(AttrValue::parse("NaN"), AttrValue::Text("NaN".into()));
        assert!(matches!(
            AttrValue::parse("2030-01-01T00:00:00Z"),
            AttrValue::Time(_)
        ));
        assert_eq!(AttrValue::parse("\"true\""), AttrValue::Text("true".into()));
    }
}
