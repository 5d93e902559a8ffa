//! Validated workflow identities.
//!
//! A workflow instance is the pair `(WorkflowName, WorkflowId)`. Both are validated once,
//! at the edge, so every layer below can put them in keys, channel payloads and log lines
//! without escaping.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest workflow name or id keiro accepts, in bytes.
pub const ID_LEN_MAX: usize = 200;

/// Why a workflow name, workflow id or step name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The value was empty.
    #[error("{what} is empty")]
    Empty {
        /// Which kind of identifier was checked.
        what: &'static str,
    },
    /// The value was longer than [`ID_LEN_MAX`] bytes.
    #[error("{what} is {len} bytes long, the limit is {ID_LEN_MAX}")]
    TooLong {
        /// Which kind of identifier was checked.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The value contained a character keiro reserves as a separator, or a control character.
    #[error("{what} {value:?} contains the forbidden character {ch:?}")]
    ForbiddenChar {
        /// Which kind of identifier was checked.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// The first forbidden character.
        ch: char,
    },
    /// The value started or ended with whitespace.
    #[error("{what} {value:?} starts or ends with whitespace")]
    SurroundingWhitespace {
        /// Which kind of identifier was checked.
        what: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A user step name used a prefix keiro reserves for its own wake sources.
    #[error("step name {value:?} uses the reserved prefix {prefix:?}")]
    ReservedStepName {
        /// The rejected step name.
        value: String,
        /// The reserved prefix it starts with.
        prefix: &'static str,
    },
}

/// Characters that keiro uses as separators in derived keys (`<name>/<id>/<gen>/<step>`,
/// `child:<id>:result`, `generation#n`), so identities may not contain them.
const SEPARATORS: [char; 3] = [':', '#', '/'];

/// Checks `value` as an identity (an instance's name or id, an update's name or id).
pub(crate) fn validate_identity(what: &'static str, value: &str) -> Result<(), IdError> {
    validate(what, value)
}

fn validate(what: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { what });
    }
    if value.len() > ID_LEN_MAX {
        return Err(IdError::TooLong {
            what,
            len: value.len(),
        });
    }
    if value.trim() != value {
        return Err(IdError::SurroundingWhitespace {
            what,
            value: value.to_owned(),
        });
    }
    if let Some(ch) = value
        .chars()
        .find(|c| SEPARATORS.contains(c) || c.is_control())
    {
        return Err(IdError::ForbiddenChar {
            what,
            value: value.to_owned(),
            ch,
        });
    }
    Ok(())
}

macro_rules! identity {
    ($(#[$doc:meta])* $ty:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $ty(String);

        impl $ty {
            /// Validates `value` and wraps it.
            ///
            /// # Errors
            ///
            /// [`IdError`] when the value is empty, too long, has whitespace at either end,
            /// or contains `:`, `#`, `/` or a control character.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate($what, &value)?;
                Ok(Self(value))
            }

            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<&str> for $ty {
            type Error = IdError;
            fn try_from(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $ty {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        // Deserializing validates too, so a stored or received identity can never bypass the rules.
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::new(s).map_err(serde::de::Error::custom)
            }
        }
    };
}

identity!(
    /// The registered name of a workflow definition, such as `order`.
    ///
    /// ```
    /// use keiro_journal::WorkflowName;
    /// assert!(WorkflowName::new("order").is_ok());
    /// assert!(WorkflowName::new("or:der").is_err());
    /// ```
    WorkflowName,
    "workflow name"
);

identity!(
    /// The caller-chosen id of one workflow instance, such as `order-42` or a UUID.
    ///
    /// `-`, `~`, `.` and `_` are allowed, so UUIDs and `<id>~retry~<hex>` fit.
    ///
    /// ```
    /// use keiro_journal::WorkflowId;
    /// assert!(WorkflowId::new("order-42~retry~0a1b2c3d").is_ok());
    /// assert!(WorkflowId::new(" padded").is_err());
    /// ```
    WorkflowId,
    "workflow id"
);

/// Step-name prefixes keiro reserves for its own wake sources and markers.
pub const RESERVED_STEP_PREFIXES: [&str; 15] = [
    "await:",
    "attempt:",
    "race:",
    "sleep:",
    "awk:",
    "awkid:",
    "signal:",
    "child:",
    "remote:",
    "patch:",
    "event:",
    "stream:",
    "update:",
    "attrs:",
    "__workflow_",
];

/// Checks a user-supplied step name: the identity rules minus the separator ban (step names
/// may contain `:` and `/`), plus the reserved prefixes.
pub(crate) fn validate_user_step(name: &str) -> Result<(), IdError> {
    if name.is_empty() {
        return Err(IdError::Empty { what: "step name" });
    }
    if name.len() > ID_LEN_MAX {
        return Err(IdError::TooLong {
            what: "step name",
            len: name.len(),
        });
    }
    if let Some(ch) = name.chars().find(|c| c.is_control()) {
        return Err(IdError::ForbiddenChar {
            what: "step name",
            value: name.to_owned(),
            ch,
        });
    }
    if let Some(prefix) = RESERVED_STEP_PREFIXES
        .iter()
        .find(|p| name.starts_with(**p))
    {
        return Err(IdError::ReservedStepName {
            value: name.to_owned(),
            prefix,
        });
    }
    Ok(())
}

/// One workflow instance: its definition's name and its id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct InstanceKey {
    /// The workflow definition's name.
    pub name: WorkflowName,
    /// The instance id.
    pub id: WorkflowId,
}

impl InstanceKey {
    /// Pairs a name and an id.
    pub fn new(name: WorkflowName, id: WorkflowId) -> Self {
        Self { name, id }
    }

    /// Validates both parts from text.
    ///
    /// # Errors
    ///
    /// [`IdError`] when either part is invalid.
    ///
    /// ```
    /// use keiro_journal::InstanceKey;
    /// let key = InstanceKey::parse("order", "order-42")?;
    /// assert_eq!(key.to_string(), "order/order-42");
    /// # Ok::<(), keiro_journal::IdError>(())
    /// ```
    pub fn parse(name: &str, id: &str) -> Result<Self, IdError> {
        Ok(Self::new(WorkflowName::new(name)?, WorkflowId::new(id)?))
    }
}

/// Anything that names one instance: an [`InstanceKey`] (owned or borrowed), or a
/// `(name, id)` pair of strings, which is validated on conversion. The facade's calls take
/// `impl IntoInstanceKey`, so a key read from a row or a handle is passed as it is, and text
/// from a request still gets the same checks as [`InstanceKey::parse`].
///
/// ```
/// use keiro_journal::{InstanceKey, IntoInstanceKey};
/// let key = InstanceKey::parse("order", "order-42")?;
/// assert_eq!(("order", "order-42").into_instance_key()?, key);
/// assert_eq!((&key).into_instance_key()?, key);
/// assert!(("order", "a/b").into_instance_key().is_err());
/// # Ok::<(), keiro_journal::IdError>(())
/// ```
pub trait IntoInstanceKey {
    /// The key, validated.
    ///
    /// # Errors
    ///
    /// [`IdError`] when the name or the id is invalid.
    fn into_instance_key(self) -> Result<InstanceKey, IdError>;
}

impl IntoInstanceKey for InstanceKey {
    fn into_instance_key(self) -> Result<InstanceKey, IdError> {
        Ok(self)
    }
}

impl IntoInstanceKey for &InstanceKey {
    fn into_instance_key(self) -> Result<InstanceKey, IdError> {
        Ok(self.clone())
    }
}

/// `(name, id)` in any string form: `&str`, `String`, `&String`, or the validated
/// [`WorkflowName`] and [`WorkflowId`].
impl<N: AsRef<str>, I: AsRef<str>> IntoInstanceKey for (N, I) {
    fn into_instance_key(self) -> Result<InstanceKey, IdError> {
        InstanceKey::parse(self.0.as_ref(), self.1.as_ref())
    }
}

impl fmt::Display for InstanceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_separators_whitespace_controls_and_length() {
        for bad in ["", "a:b", "a#b", "a/b", " a", "a ", "a\nb", "a\u{0}b"] {
            assert!(WorkflowId::new(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(matches!(
            WorkflowName::new("x".repeat(ID_LEN_MAX + 1)),
            Err(IdError::TooLong { .. })
        ));
        assert!(WorkflowId::new("x".repeat(ID_LEN_MAX)).is_ok());
    }

    #[test]
    fn accepts_uuids_and_retry_ids() {
        assert!(WorkflowId::new(uuid::Uuid::new_v4().to_string()).is_ok());
        assert!(WorkflowId::new("a.b_c-d~retry~deadbeef").is_ok());
    }

    #[test]
    fn deserializing_validates() {
        let err = serde_json::from_str::<WorkflowId>("\"a:b\"").unwrap_err();
        assert!(err.to_string().contains("forbidden"));
        let ok: WorkflowId = serde_json::from_str("\"ok\"").unwrap();
        assert_eq!(ok.as_str(), "ok");
    }

    #[test]
    fn user_steps_may_not_use_reserved_prefixes() {
        assert!(validate_user_step("charge").is_ok());
        assert!(validate_user_step("charge:card/visa").is_ok());
        assert!(matches!(
            validate_user_step("sleep:x"),
            Err(IdError::ReservedStepName { .. })
        ));
        assert!(matches!(
            validate_user_step("__workflow_completed__"),
            Err(IdError::ReservedStepName { .. })
        ));
    }
}
