//! `crates/migrations/functions/timer.sql`: durable timers: arming, firing the due ones; with the plain
//! statements that heal stuck ones and count the backlog.
//!
//! # Design
//!
//! A timer is a row of `timers` keyed like the journal step it fires (instance, generation,
//! step). The first arm wins and the row stays after firing, so a re-drive that re-arms the
//! same sleep neither moves its deadline nor fires it twice. Firing is one transaction per
//! batch: the due rows are picked `FOR UPDATE SKIP LOCKED`, so concurrent timer workers split
//! the backlog instead of firing a timer twice, and each fire journals its step through the
//! shared append rules, which flip a parked owner to `running` and notify it. The database is
//! authoritative for due-ness: `now` is the caller's pin or the database clock, and a timer
//! armed with a span is due at the database's `now()` plus that span, so workers' clocks matter
//! for neither.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{
    store::FiredTimer, store::TimerArm, store::TimerDue, InstanceKey, TimerFiring, TimerKind,
};
use time::OffsetDateTime;

use crate::db::Db;
use crate::ops::{not_found, span_ms, unknown_outcome};
use crate::row::{column, count, malformed};

const ARM: &str = "arming a timer";
const FIRE_DUE: &str = "firing due timers";
const REQUEUE_STUCK: &str = "requeueing stuck timers";
const DUE_COUNT: &str = "counting due timers";

// The due time is computed here, in the arm's own statement, from the database's clock: an
// instant ($7) as given, or `now()` plus a span ($8, microseconds). The worker's clock never
// enters it, so a worker whose clock is skewed arms what the database will fire on time.
const TIMER_ARM: &str = "SELECT outcome, stored_fire_at FROM keiro_timer_arm($1, $2, $3, $4, $5, \
     $6, coalesce($7::timestamptz, now() + $8::bigint * interval '1 microsecond'))";

pub(crate) async fn timer_arm(db: &Db, arm: &TimerArm) -> Result<OffsetDateTime> {
    let token = match &arm.kind {
        TimerKind::SignalTimeout { token } => Some(token.as_str()),
        _ => None,
    };
    let (at, after_us) = match arm.due {
        TimerDue::At(at) => (Some(at), None),
        // `span()` is at most `AFTER_MAX`, 100 years: far inside both an i64 of microseconds
        // and the timestamp range.
        TimerDue::After(_) => (
            None,
            arm.due
                .span()
                .map(|span| i64::try_from(span.as_micros()).unwrap_or(i64::MAX)),
        ),
    };
    let row = db
        .query_one(
            ARM,
            TIMER_ARM,
            &[
                &arm.key.name.as_str(),
                &arm.key.id.as_str(),
                &arm.generation,
                &arm.step,
                &arm.kind.as_str(),
                &token,
                &at,
                &after_us,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", ARM)?;
    match outcome.as_str() {
        "armed" | "present" => column(&row, "stored_fire_at", ARM),
        "not_found" => Err(not_found(&arm.key)),
        other => Err(unknown_outcome(ARM, other)),
    }
}

const TIMERS_FIRE_DUE: &str = "SELECT clock, fired_name, fired_id, fired_step, fired_fire_at, \
     fired_delivered, next_due FROM keiro_timers_fire_due($1, $2)";

pub(crate) async fn timers_fire_due(
    db: &Db,
    now: Option<OffsetDateTime>,
    limit: i64,
) -> Result<TimerFiring> {
    let row = db
        .query_one(FIRE_DUE, TIMERS_FIRE_DUE, &[&now, &limit])
        .await?;
    let fired_at: OffsetDateTime = column(&row, "clock", FIRE_DUE)?;
    // `array_agg`-style arrays are NULL when nothing fired.
    let names: Option<Vec<String>> = column(&row, "fired_name", FIRE_DUE)?;
    let ids: Option<Vec<String>> = column(&row, "fired_id", FIRE_DUE)?;
    let steps: Option<Vec<String>> = column(&row, "fired_step", FIRE_DUE)?;
    let due: Option<Vec<OffsetDateTime>> = column(&row, "fired_fire_at", FIRE_DUE)?;
    let delivered: Option<Vec<bool>> = column(&row, "fired_delivered", FIRE_DUE)?;
    let (names, ids, steps, due, delivered) = (
        names.unwrap_or_default(),
        ids.unwrap_or_default(),
        steps.unwrap_or_default(),
        due.unwrap_or_default(),
        delivered.unwrap_or_default(),
    );
    let len = names.len();
    if [ids.len(), steps.len(), due.len(), delivered.len()] != [len; 4] {
        return Err(malformed(
            FIRE_DUE,
            "the fired timers' columns differ in length",
        ));
    }
    let fired = names
        .into_iter()
        .zip(ids)
        .zip(steps)
        .zip(due)
        .zip(delivered)
        .map(|((((name, id), step), fire_at), delivered)| {
            let key = InstanceKey::parse(&name, &id).map_err(|e| {
                malformed(FIRE_DUE, format_args!("instance key {name:?}/{id:?}: {e}"))
            })?;
            Ok(FiredTimer {
                key,
                step,
                fire_at,
                fired_at,
                delivered,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TimerFiring {
        fired,
        next_due: column(&row, "next_due", FIRE_DUE)?,
        clock: fired_at,
    })
}

// Served by `timers_firing_idx`, which holds only rows left `firing` by something outside keiro.
const TIMERS_REQUEUE_STUCK: &str = "UPDATE timers SET status = 'scheduled', updated_at = now() \
     WHERE status = 'firing' AND updated_at <= now() - $1::bigint * interval '1 millisecond'";

pub(crate) async fn timers_requeue_stuck(db: &Db, older_than: Duration) -> Result<u64> {
    db.execute(REQUEUE_STUCK, TIMERS_REQUEUE_STUCK, &[&span_ms(older_than)])
        .await
}

// Served by `timers_scheduled_idx`.
const TIMERS_DUE_COUNT: &str = "SELECT count(*) AS due FROM timers \
     WHERE status = 'scheduled' AND fire_at <= coalesce($1, now())";

pub(crate) async fn timers_due_count(db: &Db, now: Option<OffsetDateTime>) -> Result<u64> {
    let row = db.query_one(DUE_COUNT, TIMERS_DUE_COUNT, &[&now]).await?;
    count(&row, "due", DUE_COUNT)
}
