//! Rendering errors and panics for logs, crash records and operator output: one way, so a
//! failure reads the same in the journal, the worker's log and the CLI.

use std::any::Any;
use std::error::Error;

/// `error` and its whole source chain on one line, `outer: cause: root cause`.
///
/// ```
/// let io = std::io::Error::other("disk full");
/// assert_eq!(keiro_journal::error_chain(&io), "disk full");
/// ```
pub fn error_chain(error: &dyn Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The text a panic was raised with, or a placeholder for a payload that is not a string.
///
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("step exploded")).unwrap_err();
/// assert_eq!(keiro_journal::panic_message(payload.as_ref()), "step exploded");
/// ```
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_is_joined_outermost_first() {
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");
    }

    #[test]
    fn a_formatted_panic_keeps_its_text() {
        let payload = std::panic::catch_unwind(|| panic!("n = {}", 3)).unwrap_err();
        assert_eq!(panic_message(payload.as_ref()), "n = 3");
        let other = std::panic::catch_unwind(|| std::panic::panic_any(7u8)).unwrap_err();
        assert_eq!(panic_message(other.as_ref()), "non-string panic payload");
    }
}
