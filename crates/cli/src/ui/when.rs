//! Instants and spans as the pages show them: an instant reads relative to now ("3 min ago",
//! "in 2 h") inside a `<time>` whose `datetime` is RFC 3339 and whose title is the absolute
//! UTC time, so hovering shows it; the embedded script keeps the relative text current. A span
//! reads in its unit ("850ms", "2.4s", "3m 12s").

use maud::{html, Markup};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::ops::timestamp;

/// `at` relative to `now`: `just now` within 5 s, else seconds, minutes, hours or days, `ago`
/// for the past and `in` for the future.
pub(crate) fn relative(at: OffsetDateTime, now: OffsetDateTime) -> String {
    let delta = (now - at).whole_seconds();
    let secs = delta.unsigned_abs();
    if secs < 5 {
        return "just now".to_owned();
    }
    let amount = match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        3600..86_400 => format!("{} h", secs / 3600),
        _ => format!("{} d", secs / 86_400),
    };
    if delta > 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// An instant as a `<time>` reading relative to `now`, or `-` for none.
pub(crate) fn when(at: Option<OffsetDateTime>, now: OffsetDateTime) -> Markup {
    match at.and_then(|at| Some((at, at.format(&Rfc3339).ok()?))) {
        Some((at, machine)) => html! {
            time datetime=(machine) title=(timestamp(Some(at))) { (relative(at, now)) }
        },
        None => html! { "-" },
    }
}

/// The span from `start` to `end` in milliseconds, read in its unit.
pub(crate) fn took(start: OffsetDateTime, end: OffsetDateTime) -> String {
    let ms = i64::try_from((end - start).whole_milliseconds()).unwrap_or(i64::MAX);
    super::timeline::duration(ms.max(0))
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;
    use time::Duration;

    use super::*;

    #[test]
    fn instants_read_relative_to_now_with_the_absolute_time_on_hover() {
        let now = datetime!(2026-01-01 12:00:00 UTC);
        assert_eq!(relative(now - Duration::seconds(3), now), "just now");
        assert_eq!(relative(now - Duration::seconds(42), now), "42 s ago");
        assert_eq!(relative(now - Duration::minutes(3), now), "3 min ago");
        assert_eq!(relative(now - Duration::hours(5), now), "5 h ago");
        assert_eq!(relative(now - Duration::days(9), now), "9 d ago");
        assert_eq!(relative(now + Duration::minutes(30), now), "in 30 min");
        let markup = when(Some(now - Duration::minutes(3)), now).into_string();
        assert_eq!(
            markup,
            "<time datetime=\"2026-01-01T11:57:00Z\" title=\"2026-01-01 11:57:00.000000Z\">3 min ago</time>"
        );
        assert_eq!(when(None, now).into_string(), "-");
        assert_eq!(took(now, now + Duration::milliseconds(2400)), "2.4s");
    }
}
