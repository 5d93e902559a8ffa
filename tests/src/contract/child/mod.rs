//! `sql/functions/child.sql`: spawning a child (created once, or an existing instance adopted)
//! and what its end delivers into the parent's spawning generation: the output, the failure,
//! the crash ceiling's last error, divergence, cancellation, and nothing on continue-as-new.

pub mod delivery;
