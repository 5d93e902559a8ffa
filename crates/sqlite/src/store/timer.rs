//! [`SqliteStore`]'s timer operations (`JournalStore`'s timer methods).

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{store::FiredTimer, store::TimerArm, store::TimerDue, TimerFiring, TimerKind};
use time::OffsetDateTime;

use crate::row;
use crate::storable;
use crate::timer::{self, ArmCode};

use super::{not_found, span_ms, SqliteStore};

const ARM: &str = "arming a timer";
const FIRE_DUE: &str = "firing due timers";
const REQUEUE_STUCK: &str = "requeueing stuck timers";
const DUE_COUNT: &str = "counting due timers";

impl SqliteStore {
    /// Arms a timer, first arm wins; the effective `fire_at` (the first arm's), computed on the
    /// store's clock: `now + span` (cut to `TimerDue::AFTER_MAX`) or the instant itself
    /// (`JournalStore::timer_arm`).
    ///
    /// # Errors
    ///
    /// `NotFound`; `ValueRefused` for a step or token holding a NUL.
    pub async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        storable::text(ARM, "step name", &arm.step)?;
        if let TimerKind::SignalTimeout { token } = &arm.kind {
            storable::text(ARM, "signal token", token)?;
        }
        let arm = arm.clone();
        self.inner
            .writer
            .write(ARM, move |conn, now| {
                let fire_at = match arm.due {
                    TimerDue::At(at) => at,
                    TimerDue::After(_) => arm
                        .due
                        .span()
                        .map_or(now, |span| crate::clock::later(now, span)),
                };
                let token = match &arm.kind {
                    TimerKind::SignalTimeout { token } => Some(token.as_str()),
                    _ => None,
                };
                match timer::timer_arm(
                    conn,
                    now,
                    arm.key.name.as_str(),
                    arm.key.id.as_str(),
                    arm.generation,
                    &arm.step,
                    arm.kind.as_str(),
                    token,
                    fire_at,
                )? {
                    ArmCode::Armed(at) | ArmCode::Present(at) => row::instant(at, ARM),
                    ArmCode::NotFound => Err(not_found(&arm.key)),
                }
            })
            .await
    }

    /// Fires up to `limit` timers due at `now` (the store's clock when `None`), oldest first,
    /// each with its journal append and the owner's row change, in one transaction
    /// (`JournalStore::timers_fire_due`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored key keiro cannot read.
    pub async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        self.inner
            .writer
            .write(FIRE_DUE, move |conn, clock| {
                let (fired_at, fired, next_due) = timer::timers_fire_due(conn, clock, now, limit)?;
                let fired = fired
                    .into_iter()
                    .map(|(name, id, step, fire_at, delivered)| {
                        Ok(FiredTimer {
                            key: row::key(&name, &id, FIRE_DUE)?,
                            step,
                            fire_at: row::instant(fire_at, FIRE_DUE)?,
                            fired_at,
                            delivered,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(TimerFiring {
                    fired,
                    next_due: row::instant_opt(next_due, FIRE_DUE)?,
                    clock: fired_at,
                })
            })
            .await
    }

    /// Returns timers stuck in `firing` for longer than `older_than` to `scheduled`; how many
    /// (`JournalStore::timers_requeue_stuck`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        self.inner
            .writer
            .write(REQUEUE_STUCK, move |conn, now| {
                timer::timers_requeue_stuck(conn, now, span_ms(older_than))
            })
            .await
    }

    /// How many scheduled timers are due at `now` (`JournalStore::timers_due_count`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when a read connection cannot be opened.
    pub async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        self.read(DUE_COUNT, move |conn, clock| {
            timer::timers_due_count(conn, now.unwrap_or(clock))
        })
        .await
    }
}
