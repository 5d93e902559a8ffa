//! What one instance waits on (issue 13): `Keiro::waits` reads its timers, awakeables and
//! pending signal waits on both stores, with the same states, due times, tokens and attempts,
//! newest first and bounded per kind; bad requests are typed errors.

use std::time::Duration;

use crate::{FastWorker, Harness, TestResult};
use keiro::{
    operate::AwakeableStatus, operate::FilterError, operate::TimerKind, operate::TimerState,
    operate::Waits, operate::WAITS_LIMIT_DEFAULT, Ctx, Error, Status, Worker,
};
use time::OffsetDateTime;

fn worker(h: &Harness) -> Result<Worker, Error> {
    h.keiro
        .worker()
        .fast()
        // Arms a sleep, a signal wait with a timeout and an awakeable at once.
        .register("waiter", |ctx: Ctx, token: String| async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            let (nap, poke, approved) = tokio::join!(
                ctx.sleep("nap", Duration::from_secs(3600)),
                ctx.wait_signal::<String>(&token, Some(Duration::from_secs(1800))),
                approval.value(),
            );
            nap?;
            Ok(format!("{} {}", poke?, approved?))
        })
        // One sleep per drive, so each timer is armed after the previous one fired.
        .register("napper", |ctx: Ctx, (): ()| async move {
            for name in ["a", "b", "c"] {
                ctx.sleep(name, Duration::from_secs(1)).await?;
            }
            Ok(())
        })
        // Three awakeables allocated in order, and three signal waits registered one drive
        // after another (a sleep apart), so their arrival order is fixed.
        .register("many", |ctx: Ctx, (): ()| async move {
            let mut ids = Vec::new();
            for name in ["x", "y", "z"] {
                ids.push(ctx.awakeable::<()>(name).await?.id());
            }
            let nap = Duration::from_secs(1);
            let (first, rest) = tokio::join!(ctx.wait_signal::<()>("many-1", None), async {
                ctx.sleep("s1", nap).await?;
                let (second, third) = tokio::join!(ctx.wait_signal::<()>("many-2", None), async {
                    ctx.sleep("s2", nap).await?;
                    ctx.wait_signal::<()>("many-3", None).await
                });
                second.and(third)
            });
            first.and(rest)?;
            Ok(ids)
        })
        .build()
}

/// A whole-second instant `hours` from now: Postgres keeps microseconds, so a pinned clock
/// with none below them reads back equal.
fn hours_from_now(hours: i64) -> OffsetDateTime {
    (OffsetDateTime::now_utc() + time::Duration::hours(hours))
        .replace_nanosecond(0)
        .expect("zero is a valid nanosecond")
}

async fn waits(h: &Harness, name: &str, id: &str) -> Result<Waits, Error> {
    h.keiro.waits((name, id), WAITS_LIMIT_DEFAULT).await
}

pub async fn waits_follow_timers_awakeables_and_signal_waits(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    let token = "poke-w-1";
    let before = OffsetDateTime::now_utc() - time::Duration::seconds(5);
    h.keiro.start("waiter", "w-1", &token).await?;
    worker.drain().await?;

    // Parked on three sources: two timers (the sleep and the signal wait's timeout), one
    // pending awakeable, one registered signal wait that times out with its timer.
    let parked = waits(&h, "waiter", "w-1").await?;
    assert!(!parked.truncated);
    let mut timers = parked.timers.clone();
    timers.sort_by(|a, b| a.step.cmp(&b.step));
    assert_eq!(timers.len(), 2, "{parked:?}");
    let (wait_timer, nap) = (&timers[0], &timers[1]);
    assert_eq!(nap.step, "sleep:nap");
    assert_eq!(nap.kind, TimerKind::Sleep);
    assert_eq!(wait_timer.step, format!("signal:{token}:1"));
    assert_eq!(
        wait_timer.kind,
        TimerKind::SignalTimeout {
            token: token.into()
        }
    );
    for timer in &timers {
        assert_eq!(timer.generation, 0);
        assert_eq!(timer.state, TimerState::Scheduled);
        assert_eq!(timer.attempts, 0);
        assert_eq!(timer.fired_at, None);
        assert!(timer.created_at >= before, "{timer:?}");
    }
    let armed = nap.created_at;
    assert!(
        nap.fire_at >= armed + time::Duration::minutes(59),
        "{nap:?}"
    );
    assert!(wait_timer.fire_at < nap.fire_at, "30 minutes before 1 hour");

    assert_eq!(parked.awakeables.len(), 1, "{parked:?}");
    let approval = &parked.awakeables[0];
    assert_eq!(approval.status, AwakeableStatus::Pending);
    assert_eq!(approval.generation, 0);
    assert_eq!(approval.settled_at, None);

    assert_eq!(parked.signal_waits.len(), 1, "{parked:?}");
    let wait = &parked.signal_waits[0];
    assert_eq!(wait.token, token);
    assert_eq!(wait.step, wait_timer.step);
    assert_eq!(wait.timeout_at, Some(wait_timer.fire_at));
    assert!(wait.since >= before);

    // The awakeable completed and the signal delivered: the awakeable is settled, the wait is
    // gone (its journal row is the record), the timers are still scheduled.
    h.keiro.complete_awakeable(approval.id, &"yes").await?;
    h.keiro.signal(token, &"hi").await?;
    let answered = waits(&h, "waiter", "w-1").await?;
    assert_eq!(answered.awakeables.len(), 1);
    assert_eq!(answered.awakeables[0].id, approval.id);
    assert_eq!(answered.awakeables[0].status, AwakeableStatus::Completed);
    let settled = answered.awakeables[0].settled_at.expect("settled");
    assert!(settled >= approval.created_at);
    assert!(answered.signal_waits.is_empty(), "{answered:?}");
    assert!(answered
        .timers
        .iter()
        .all(|timer| timer.state == TimerState::Scheduled));

    // Both timers fire at a pinned instant: fired, once, at that instant.
    let at = hours_from_now(2);
    let firing = h.store.timers_fire_due(Some(at), 100).await?;
    assert_eq!(firing.fired.len(), 2, "{firing:?}");
    let fired = waits(&h, "waiter", "w-1").await?;
    assert_eq!(fired.timers.len(), 2);
    for timer in &fired.timers {
        assert_eq!(timer.state, TimerState::Fired, "{timer:?}");
        assert_eq!(timer.fired_at, Some(at));
        assert_eq!(timer.attempts, 1);
    }
    worker.drain().await?;
    let row = h.keiro.instance(("waiter", "w-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{row:?}");
    assert_eq!(row.output, Some(serde_json::json!("hi yes")));
    // Completion keeps the history of what it waited on.
    assert_eq!(waits(&h, "waiter", "w-1").await?.timers, fired.timers);
    Ok(())
}

pub async fn a_cancelled_run_shows_its_awakeables_cancelled(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    h.keiro.start("waiter", "w-2", &"poke-w-2").await?;
    worker.drain().await?;
    let parked = waits(&h, "waiter", "w-2").await?;
    assert_eq!(parked.awakeables[0].status, AwakeableStatus::Pending);

    h.keiro.cancel(("waiter", "w-2")).await?;
    let cancelled = waits(&h, "waiter", "w-2").await?;
    assert_eq!(cancelled.awakeables.len(), 1);
    assert_eq!(cancelled.awakeables[0].id, parked.awakeables[0].id);
    assert_eq!(cancelled.awakeables[0].status, AwakeableStatus::Cancelled);
    assert!(cancelled.awakeables[0].settled_at.is_some());
    // The timers stay until they come due (their fire finds the run closed).
    assert_eq!(cancelled.timers, parked.timers);
    Ok(())
}

pub async fn waits_are_newest_first_and_bounded(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    h.keiro.start("napper", "n-1", &()).await?;
    h.keiro.start("many", "m-1", &()).await?;
    for hours in 1..=4 {
        worker.drain().await?;
        h.store
            .timers_fire_due(Some(hours_from_now(hours)), 100)
            .await?;
    }
    worker.drain().await?;
    let row = h.keiro.instance(("napper", "n-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{row:?}");

    let steps = |waits: &Waits| -> Vec<String> {
        waits
            .timers
            .iter()
            .map(|timer| timer.step.clone())
            .collect()
    };
    let all = h.keiro.waits(("napper", "n-1"), 3).await?;
    assert_eq!(steps(&all), ["sleep:c", "sleep:b", "sleep:a"]);
    assert!(!all.truncated);
    let two = h.keiro.waits(("napper", "n-1"), 2).await?;
    assert_eq!(steps(&two), ["sleep:c", "sleep:b"]);
    assert!(two.truncated);

    let many = h.keiro.waits(("many", "m-1"), 3).await?;
    assert!(!many.truncated);
    let tokens: Vec<&str> = many.signal_waits.iter().map(|w| w.token.as_str()).collect();
    assert_eq!(tokens, ["many-3", "many-2", "many-1"]);
    assert_eq!(many.awakeables.len(), 3);
    for pair in many.awakeables.windows(2) {
        assert!(pair[0].created_at >= pair[1].created_at, "{pair:?}");
    }
    // The allocation order is the journal's: x, y, z; newest first is z, y, x.
    let journal = h.keiro.journal(("many", "m-1")).await?;
    let allocated: Vec<String> = journal
        .iter()
        .map(|entry| entry.event.encode())
        .filter(|row| row.step_name.starts_with("awkid:"))
        .map(|row| row.payload.as_str().unwrap_or_default().to_owned())
        .collect();
    let listed: Vec<String> = many
        .awakeables
        .iter()
        .rev()
        .map(|a| a.id.to_string())
        .collect();
    assert_eq!(listed, allocated);

    let cut = h.keiro.waits(("many", "m-1"), 1).await?;
    assert!(cut.truncated);
    assert_eq!(cut.signal_waits.len(), 1);
    assert_eq!(cut.signal_waits[0].token, "many-3");
    assert_eq!(cut.awakeables, many.awakeables[..1]);
    assert_eq!(steps(&cut), ["sleep:s2"]);
    Ok(())
}

pub async fn bad_waits_requests_are_typed_errors(h: Harness) -> TestResult {
    assert!(matches!(
        h.keiro.waits(("waiter", "w-1"), 0).await,
        Err(Error::Filter(FilterError::Limit { limit: 0, .. }))
    ));
    assert!(matches!(
        h.keiro.waits(("waiter", "w-1"), 1001).await,
        Err(Error::Filter(FilterError::Limit { limit: 1001, .. }))
    ));
    assert!(matches!(
        h.keiro.waits(("wait:er", "w-1"), 10).await,
        Err(Error::InvalidId(_))
    ));
    assert_eq!(waits(&h, "waiter", "nobody").await?, Waits::default());
    Ok(())
}
