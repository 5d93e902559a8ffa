//! Ages on the command line: `90s`, `15m`, `1h`, `30d`, `2w` (one number, one unit).

use std::time::Duration;

use crate::common::{failure, Result};

/// Parses an age such as `30d`.
pub(crate) fn parse(text: &str) -> Result<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| failure(format!("age {text:?} needs a unit: s, m, h, d or w")))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| failure(format!("age {text:?} must start with a whole number")))?;
    let seconds = match unit {
        "ms" => return Ok(Duration::from_millis(number)),
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(failure(format!(
                "age {text:?}: unknown unit {unit:?} (ms, s, m, h, d or w)"
            )))
        }
    };
    number
        .checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| failure(format!("age {text:?} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_their_unit_and_bad_ones_are_refused() {
        assert_eq!(parse("90s").ok(), Some(Duration::from_secs(90)));
        assert_eq!(parse("1h").ok(), Some(Duration::from_secs(3600)));
        assert_eq!(parse("30d").ok(), Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse("250ms").ok(), Some(Duration::from_millis(250)));
        for bad in ["", "h", "30", "1.5h", "3y", "-1d", "99999999999999999999d"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
