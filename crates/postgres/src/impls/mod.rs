//! The store traits for [`PgStore`](crate::PgStore), each method a thin route to one operation
//! (`ops`) or one group-commit lane (`lanes`). The traits whose operations are plain queries of
//! their own (inspection, retention, schedules) and the LISTEN-backed notifier live in their
//! own modules at the crate root.

mod journal;
mod lease;
mod remote;
