//! The list's filters on search attributes: an attribute equal to a value, or a number or a
//! time in a range. Text equality and boolean equality compare the kind too (the text `"true"`
//! is not the boolean `true`); a number compares with integers and floats alike.

use serde::{Deserialize, Serialize};

use super::FilterError;
use crate::model::attribute::{
    validate_attribute_name, AttrValue, Attributes, ATTRIBUTE_TEXT_LEN_MAX,
};

/// The most attribute filters one list request may hold.
pub const ATTR_FILTERS_MAX: usize = 8;

/// How an attribute filter compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrOp {
    /// Equal (any kind).
    Eq,
    /// Greater than (numbers and times).
    Gt,
    /// Greater than or equal (numbers and times).
    Ge,
    /// Less than (numbers and times).
    Lt,
    /// Less than or equal (numbers and times).
    Le,
}

impl AttrOp {
    /// The operator as written: `=`, `>`, `>=`, `<`, `<=`.
    pub fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Lt => "<",
            Self::Le => "<=",
        }
    }
}

/// Only instances whose attribute `name` compares with `value` by `op`.
///
/// ```
/// use keiro_journal::attribute::{AttrFilter, AttrOp, AttrValue};
/// let filter = AttrFilter::parse("amount>=1000")?;
/// assert_eq!(filter, AttrFilter { name: "amount".into(), op: AttrOp::Ge, value: AttrValue::Int(1000) });
/// assert_eq!(filter.to_string(), "amount>=1000");
/// # Ok::<(), keiro_journal::FilterError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttrFilter {
    /// The attribute's name.
    pub name: String,
    /// The comparison.
    pub op: AttrOp,
    /// The value compared with.
    pub value: AttrValue,
}

impl AttrFilter {
    /// `name = value`.
    pub fn eq(name: impl Into<String>, value: impl Into<AttrValue>) -> Self {
        Self {
            name: name.into(),
            op: AttrOp::Eq,
            value: value.into(),
        }
    }

    /// `name op value`.
    pub fn new(name: impl Into<String>, op: AttrOp, value: impl Into<AttrValue>) -> Self {
        Self {
            name: name.into(),
            op,
            value: value.into(),
        }
    }

    /// Reads `<name><op><value>` with op one of `=`, `>=`, `<=`, `>`, `<`; the value as
    /// [`AttrValue::parse`] reads it (quote it to force text: `zip="02139"`).
    ///
    /// # Errors
    ///
    /// [`FilterError::InvalidValue`] for text with no operator, and what
    /// [`validate`](Self::validate) refuses.
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        let Some(at) = text.find(['=', '<', '>']) else {
            return Err(invalid(text, "expected <name>=<value>, >, >=, < or <="));
        };
        let (name, rest) = text.split_at(at);
        let (op, value) = if let Some(value) = rest.strip_prefix(">=") {
            (AttrOp::Ge, value)
        } else if let Some(value) = rest.strip_prefix("<=") {
            (AttrOp::Le, value)
        } else if let Some(value) = rest.strip_prefix('>') {
            (AttrOp::Gt, value)
        } else if let Some(value) = rest.strip_prefix('<') {
            (AttrOp::Lt, value)
        } else {
            (AttrOp::Eq, &rest[1..])
        };
        let filter = Self::new(name, op, AttrValue::parse(value));
        filter.validate()?;
        Ok(filter)
    }

    /// `filters` in groups a store compares in one lookup each: the filters on the same
    /// attribute and the same kind of value (text and booleans, numbers, or times), in the
    /// order their first member comes. So `amount>1000` and `amount<=2000` are one range of one
    /// index, not two lookups the planner must intersect.
    ///
    /// ```
    /// use keiro_journal::attribute::AttrFilter;
    /// let filters = [
    ///     AttrFilter::parse("amount>1000")?,
    ///     AttrFilter::parse("customer=acme")?,
    ///     AttrFilter::parse("amount<=2000")?,
    /// ];
    /// let groups = AttrFilter::groups(&filters);
    /// assert_eq!(groups.len(), 2);
    /// assert_eq!(groups[0].len(), 2);
    /// # Ok::<(), keiro_journal::FilterError>(())
    /// ```
    pub fn groups(filters: &[AttrFilter]) -> Vec<Vec<&AttrFilter>> {
        let mut groups: Vec<Vec<&AttrFilter>> = Vec::new();
        for filter in filters {
            let class = filter.class();
            match groups
                .iter_mut()
                .find(|g| g[0].name == filter.name && g[0].class() == class)
            {
                Some(group) => group.push(filter),
                None => groups.push(vec![filter]),
            }
        }
        groups
    }

    /// Which typed column the value compares with: 0 text, 1 number, 2 time.
    fn class(&self) -> u8 {
        match self.value {
            AttrValue::Text(_) | AttrValue::Bool(_) => 0,
            AttrValue::Int(_) | AttrValue::Float(_) => 1,
            AttrValue::Time(_) => 2,
        }
    }

    /// Whether `attributes` pass this filter: the attribute is there and compares with the
    /// value (text and booleans by kind and equality; numbers, integers and floats alike, as
    /// 64-bit floats; times as instants). What the stores' list does, as plain data.
    ///
    /// ```
    /// use keiro_journal::attribute::{AttrFilter, Attributes};
    /// let attrs = Attributes::new().with("amount", 1200);
    /// assert!(AttrFilter::parse("amount>=1000")?.matches(&attrs));
    /// assert!(!AttrFilter::parse("amount<1000")?.matches(&attrs));
    /// # Ok::<(), keiro_journal::FilterError>(())
    /// ```
    pub fn matches(&self, attributes: &Attributes) -> bool {
        use std::cmp::Ordering;
        let Some(value) = attributes.get(&self.name) else {
            return false;
        };
        let ordering = if let Some(text) = self.value.text_key() {
            (value.kind() == self.value.kind() && value.text_key() == Some(text))
                .then_some(Ordering::Equal)
        } else if let Some(wanted) = self.value.number_key() {
            value.number_key().and_then(|n| n.partial_cmp(&wanted))
        } else if let Some(wanted) = self.value.time_key() {
            value.time_key().map(|at| at.cmp(&wanted))
        } else {
            None
        };
        let Some(ordering) = ordering else {
            return false;
        };
        match self.op {
            AttrOp::Eq => ordering == Ordering::Equal,
            AttrOp::Gt => ordering == Ordering::Greater,
            AttrOp::Ge => ordering != Ordering::Less,
            AttrOp::Lt => ordering == Ordering::Less,
            AttrOp::Le => ordering != Ordering::Greater,
        }
    }

    /// Checks the name, the value's bounds, and that a range compares a number or a time.
    ///
    /// # Errors
    ///
    /// [`FilterError::InvalidValue`] naming the filter `attr`.
    pub fn validate(&self) -> Result<(), FilterError> {
        validate_attribute_name(&self.name).map_err(|e| invalid(&self.to_string(), e))?;
        match &self.value {
            AttrValue::Text(text) if text.len() > ATTRIBUTE_TEXT_LEN_MAX => {
                return Err(invalid(&self.to_string(), "text longer than 256 bytes"))
            }
            AttrValue::Float(x) if !x.is_finite() => {
                return Err(invalid(&self.to_string(), "not a finite number"))
            }
            AttrValue::Text(_) | AttrValue::Bool(_) if self.op != AttrOp::Eq => {
                return Err(invalid(
                    &self.to_string(),
                    "a range compares numbers or times only",
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

impl std::fmt::Display for AttrFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.value {
            // Quoted where reading it back would give another kind.
            AttrValue::Text(text) if !matches!(AttrValue::parse(text), AttrValue::Text(_)) => {
                write!(f, "{}{}\"{text}\"", self.name, self.op.symbol())
            }
            value => write!(f, "{}{}{value}", self.name, self.op.symbol()),
        }
    }
}

fn invalid(value: &str, reason: impl std::fmt::Display) -> FilterError {
    FilterError::InvalidValue {
        field: "attr",
        value: value.to_owned(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_with_every_operator_and_refuse_what_they_cannot_compare() {
        let cases = [
            ("customer=acme", AttrOp::Eq, AttrValue::Text("acme".into())),
            ("amount>1000", AttrOp::Gt, AttrValue::Int(1000)),
            ("amount>=1000", AttrOp::Ge, AttrValue::Int(1000)),
            ("amount<2.5", AttrOp::Lt, AttrValue::Float(2.5)),
            ("amount<=7", AttrOp::Le, AttrValue::Int(7)),
            ("zip=\"02139\"", AttrOp::Eq, AttrValue::Text("02139".into())),
            ("note=a=b", AttrOp::Eq, AttrValue::Text("a=b".into())),
        ];
        for (text, op, value) in cases {
            let filter = AttrFilter::parse(text).expect(text);
            assert_eq!((filter.op, &filter.value), (op, &value), "{text}");
            assert_eq!(AttrFilter::parse(&filter.to_string()), Ok(filter));
        }
        for bad in ["customer", "=acme", "1x=2", "customer>acme", "vip<true"] {
            assert!(
                matches!(
                    AttrFilter::parse(bad),
                    Err(FilterError::InvalidValue { field: "attr", .. })
                ),
                "{bad:?} was accepted"
            );
        }
    }
}
