//! Retention (issue 13, item 3), on both stores: expired terminal instances go with everything
//! they own; live instances, a terminal child its live parent still awaits, and the parent of
//! an unexpired child stay; batches are bounded; a worker with `retention` collects; on
//! Postgres no keiro table keeps a row of a deleted instance, and a second collector is
//! locked out.

use std::time::Duration;

use crate::{Backend, FastWorker, Harness, TestResult};
use keiro::{
    operate::GcRequest, remote::RemoteOptions, remote::TaskContext, remote::TaskError, Ctx, Error,
    Status, Worker, WorkflowError,
};
use time::OffsetDateTime;

pub fn worker(h: &Harness) -> Result<Worker, Error> {
    h.keiro
        .worker()
        .fast()
        .register("rich", |ctx: Ctx, (): ()| async move {
            ctx.step("a", || async { Ok::<_, std::io::Error>(1) })
                .await?;
            ctx.sleep("nap", Duration::from_millis(1)).await?;
            let spare = ctx.awakeable::<u32>("spare").await?;
            ctx.step("announce", || async move {
                Ok::<_, std::convert::Infallible>(spare.id())
            })
            .await?;
            ctx.remote::<_, String>("print", &"x", &RemoteOptions::default())
                .await
        })
        .register("order", |ctx: Ctx, (): ()| async move {
            ctx.await_step::<bool>("go").await
        })
        .register("boom", |_ctx: Ctx, (): ()| async move {
            Err::<(), _>(WorkflowError::app("boom"))
        })
        .register("batch", |ctx: Ctx, kid: String| async move {
            ctx.child::<_, bool>("order", &kid, &()).await
        })
        // Starts an `order` child and finishes without waiting for it.
        .register("detach", |ctx: Ctx, kid: String| async move {
            ctx.spawn_child("order", &kid, &()).await
        })
        // Awaits a `detach` child, which leaves an `order` grandchild behind.
        .register("tree", |ctx: Ctx, kid: String| async move {
            ctx.child::<_, ()>("detach", &format!("{kid}-mid"), &kid)
                .await
        })
        .build()
}

/// Drives until `rich`/`r-1` completes, firing due timers and running a remote worker that
/// prints.
async fn settle(h: &Harness, worker: &Worker) -> TestResult {
    let remote = h
        .keiro
        .remote_worker()?
        .handle("print", |input: String, _task: TaskContext| async move {
            Ok::<_, TaskError>(format!("printed {input}"))
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        remote
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status(h, "rich", "r-1").await? != Some(Status::Completed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "r-1 never completed"
        );
        worker.drain().await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        worker.fire_due_timers().await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.drain().await?;
    let _ = stop.send(());
    running.await?;
    Ok(())
}

/// A request as if `hours` had passed, for instances terminal over an hour.
pub fn later(hours: i64) -> GcRequest {
    GcRequest {
        now: Some(OffsetDateTime::now_utc() + time::Duration::hours(hours)),
        ..GcRequest::new(Duration::from_secs(3600))
    }
}

pub async fn status(h: &Harness, name: &str, id: &str) -> Result<Option<Status>, Error> {
    Ok(h.keiro.instance((name, id)).await?.map(|row| row.status))
}

pub async fn gc_deletes_expired_terminal_instances_and_keeps_the_rest(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    h.keiro.start("rich", "r-1", &()).await?;
    h.keiro.start("order", "o-1", &()).await?; // stays live
    h.keiro.start("order", "o-2", &()).await?; // cancelled
    h.keiro.start("boom", "f-1", &()).await?; // failed
    h.keiro.start("batch", "p-1", &"kid-1").await?; // awaits a child that finishes
    settle(&h, &worker).await?;
    h.keiro.cancel(("order", "o-2")).await?;
    assert_eq!(
        status(&h, "rich", "r-1").await?,
        Some(Status::Completed),
        "{:?} {:?} {:?}",
        h.keiro.instance(("rich", "r-1")).await?,
        h.keiro.journal(("rich", "r-1")).await?,
        h.keiro.remote_tasks(("rich", "r-1")).await?
    );
    assert!(!h.keiro.journal(("rich", "r-1")).await?.is_empty());
    assert_eq!(h.keiro.remote_tasks(("rich", "r-1")).await?.len(), 1);
    // The child finishes; its parent is woken but not driven yet: it still has to read the
    // child's result.
    h.keiro.deliver(("order", "kid-1"), "go", &true).await?;
    worker.resume_once().await?; // drives the kid only if the parent is not due first
    while status(&h, "order", "kid-1").await? != Some(Status::Completed) {
        worker.resume_once().await?;
    }
    let parent = status(&h, "batch", "p-1").await?;
    if parent == Some(Status::Completed) {
        return Err("the parent completed in the same pass; the scenario needs it live".into());
    }

    // Nothing has been terminal for an hour yet.
    assert_eq!(h.keiro.gc_batch(&later(0)).await?.instances, 0);
    // Two hours on: the terminal roots go; the live ones and the awaited kid stay.
    assert_eq!(h.keiro.gc_eligible(&later(2)).await?, 3);
    let deleted = h.keiro.gc_batch(&later(2)).await?;
    assert_eq!(deleted.instances, 3, "{deleted:?}");
    assert!(deleted.journal >= 6, "{deleted:?}");
    assert_eq!(deleted.remote_tasks, 1, "{deleted:?}");
    assert_eq!(deleted.timers, 1, "{deleted:?}");
    assert_eq!(deleted.awakeables, 1, "{deleted:?}");
    for (name, id) in [("rich", "r-1"), ("order", "o-2"), ("boom", "f-1")] {
        assert_eq!(status(&h, name, id).await?, None, "{name}/{id}");
        assert!(h.keiro.journal((name, id)).await?.is_empty(), "{name}/{id}");
        assert!(
            h.keiro.remote_tasks((name, id)).await?.is_empty(),
            "{name}/{id}"
        );
    }
    assert_eq!(status(&h, "order", "o-1").await?, Some(Status::Suspended));
    assert_eq!(status(&h, "order", "kid-1").await?, Some(Status::Completed));
    assert!(matches!(
        status(&h, "batch", "p-1").await?,
        Some(Status::Running | Status::Suspended)
    ));
    assert_eq!(h.keiro.gc_batch(&later(2)).await?.instances, 0);
    if h.backend == Backend::Postgres {
        assert_no_orphans(&h).await?;
    }

    // The parent reads its child's result, then both expire together.
    worker.drain().await?;
    let row = h.keiro.instance(("batch", "p-1")).await?.expect("parent");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    assert_eq!(row.output, Some(serde_json::json!(true)));
    let deleted = h.keiro.gc(&later(2), Duration::ZERO).await?;
    assert_eq!(deleted.instances, 2, "{deleted:?}");
    assert_eq!(status(&h, "order", "kid-1").await?, None);
    assert_eq!(status(&h, "batch", "p-1").await?, None);
    assert_eq!(status(&h, "order", "o-1").await?, Some(Status::Suspended));
    let counts = h.keiro.counts().await?;
    assert_eq!(counts.instances.iter().map(|c| c.count).sum::<u64>(), 1);
    if h.backend == Backend::Postgres {
        assert_no_orphans(&h).await?;
    }
    Ok(())
}

/// None of `keys` that is still there names a parent that is gone.
async fn assert_no_dangling_parent(h: &Harness, keys: &[(&str, &str)]) -> TestResult {
    for (name, id) in keys {
        let Some(row) = h.keiro.instance((*name, *id)).await? else {
            continue;
        };
        if let Some(parent) = &row.parent {
            assert!(
                h.keiro
                    .instance((parent.name.as_str(), parent.id.as_str()))
                    .await?
                    .is_some(),
                "{name}/{id} names {parent}, which retention deleted"
            );
        }
    }
    Ok(())
}

/// A parent that did not wait for its child finished first, so it is the older of the two in
/// retention's order; a batch of one still never takes it while the child is there.
pub async fn a_parent_that_finished_first_goes_after_its_child(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    h.keiro.start("detach", "d-1", &"kid-2").await?;
    worker.drain().await?;
    assert_eq!(status(&h, "detach", "d-1").await?, Some(Status::Completed));
    assert_eq!(status(&h, "order", "kid-2").await?, Some(Status::Suspended));
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.keiro.deliver(("order", "kid-2"), "go", &true).await?;
    worker.drain().await?;
    assert_eq!(status(&h, "order", "kid-2").await?, Some(Status::Completed));

    let one = GcRequest {
        batch: 1,
        ..later(2)
    };
    assert_eq!(h.keiro.gc_eligible(&one).await?, 2);
    let keys = [("detach", "d-1"), ("order", "kid-2")];
    let mut deleted = 0;
    for _ in 0..4 {
        deleted += h.keiro.gc_batch(&one).await?.instances;
        assert_no_dangling_parent(&h, &keys).await?;
        if h.backend == Backend::Postgres {
            assert_no_orphans(&h).await?;
        }
    }
    assert_eq!(deleted, 2);
    for (name, id) in keys {
        assert_eq!(status(&h, name, id).await?, None, "{name}/{id}");
    }
    Ok(())
}

/// Parent and child are both expired, but the grandchild the child left behind still runs:
/// neither goes (the child would otherwise be left naming a deleted parent). Once the
/// grandchild expires too, one collection takes all three.
pub async fn a_parent_stays_while_a_grandchild_lives(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    h.keiro.start("tree", "t-1", &"kid-3").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while status(&h, "tree", "t-1").await? != Some(Status::Completed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "t-1 never completed"
        );
        worker.drain().await?;
    }
    assert_eq!(
        status(&h, "detach", "kid-3-mid").await?,
        Some(Status::Completed)
    );
    assert_eq!(status(&h, "order", "kid-3").await?, Some(Status::Suspended));
    let keys = [("tree", "t-1"), ("detach", "kid-3-mid"), ("order", "kid-3")];

    assert_eq!(h.keiro.gc_eligible(&later(2)).await?, 0);
    let deleted = h.keiro.gc(&later(2), Duration::ZERO).await?;
    assert_eq!(deleted.instances, 0, "{deleted:?}");
    assert_no_dangling_parent(&h, &keys).await?;
    if h.backend == Backend::Postgres {
        assert_no_orphans(&h).await?;
    }

    h.keiro.deliver(("order", "kid-3"), "go", &true).await?;
    worker.drain().await?;
    assert_eq!(status(&h, "order", "kid-3").await?, Some(Status::Completed));
    assert_eq!(h.keiro.gc_eligible(&later(2)).await?, 3);
    let deleted = h.keiro.gc(&later(2), Duration::ZERO).await?;
    assert_eq!(deleted.instances, 3, "{deleted:?}");
    for (name, id) in keys {
        assert_eq!(status(&h, name, id).await?, None, "{name}/{id}");
    }
    if h.backend == Backend::Postgres {
        assert_no_orphans(&h).await?;
    }
    Ok(())
}

/// No row of any keiro table names an instance that no longer exists: every table with
/// instance columns (found from the catalog, so a table added later is checked too), and the
/// parent links of the instance rows.
async fn assert_no_orphans(h: &Harness) -> TestResult {
    let db = h.db.as_ref().expect("postgres");
    let client = db.store().pool().get().await?;
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND column_name = 'workflow_id' \
               AND table_name <> 'workflows' \
             GROUP BY table_name ORDER BY table_name",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(tables.len() >= 5, "{tables:?}");
    for table in &tables {
        // The table name comes from the catalog, not from input.
        let orphans: i64 = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM \"{table}\" x WHERE NOT EXISTS (SELECT 1 FROM workflows w \
                     WHERE w.workflow_name = x.workflow_name AND w.workflow_id = x.workflow_id)"
                ),
                &[],
            )
            .await?
            .get(0);
        assert_eq!(orphans, 0, "orphan rows in {table}");
    }
    let dangling: i64 = client
        .query_one(
            "SELECT count(*) FROM workflows c WHERE c.parent_name IS NOT NULL AND NOT EXISTS \
             (SELECT 1 FROM workflows p WHERE p.workflow_name = c.parent_name \
              AND p.workflow_id = c.parent_id)",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(dangling, 0, "children naming a deleted parent");
    Ok(())
}

pub async fn batches_are_bounded_and_gc_runs_them_until_done(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    for n in 0..25 {
        h.keiro.start("boom", &format!("f-{n}"), &()).await?;
    }
    worker.drain().await?;
    let request = GcRequest {
        batch: 10,
        ..later(2)
    };
    assert_eq!(h.keiro.gc_eligible(&request).await?, 25);
    assert_eq!(h.keiro.gc_batch(&request).await?.instances, 10);
    assert_eq!(h.keiro.gc_eligible(&request).await?, 15);
    let rest = h.keiro.gc(&request, Duration::from_millis(1)).await?;
    assert_eq!(rest.instances, 15, "{rest:?}");
    assert!(!rest.locked_out);
    assert_eq!(h.keiro.gc_eligible(&request).await?, 0);
    Ok(())
}

pub async fn a_worker_with_retention_collects(h: Harness) -> TestResult {
    let plain = worker(&h)?;
    for n in 0..3 {
        h.keiro.start("boom", &format!("f-{n}"), &()).await?;
    }
    h.keiro.start("order", "o-1", &()).await?;
    plain.drain().await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let collecting = h
        .keiro
        .worker()
        .fast()
        .retention(Some(Duration::from_millis(10)))
        .register("boom", |_ctx: Ctx, (): ()| async move {
            Err::<(), _>(WorkflowError::app("boom"))
        })
        .build()?;
    collecting
        .run_until(tokio::time::sleep(Duration::from_millis(500)))
        .await;
    for n in 0..3 {
        assert_eq!(status(&h, "boom", &format!("f-{n}")).await?, None);
    }
    assert_eq!(status(&h, "order", "o-1").await?, Some(Status::Suspended));
    Ok(())
}

pub async fn a_bounded_batch_takes_the_oldest_terminal_first(h: Harness) -> TestResult {
    // Started in one order, closed in the other: the batch goes by when they closed.
    let ids: Vec<String> = (0..5).map(|n| format!("f-{n}")).collect();
    for id in &ids {
        h.keiro.start("boom", id, &()).await?;
    }
    for id in ids.iter().rev() {
        h.keiro.cancel(("boom", id.as_str())).await?;
    }
    let request = GcRequest {
        batch: 2,
        ..later(2)
    };
    assert_eq!(h.keiro.gc_eligible(&request).await?, 5);
    assert_eq!(h.keiro.gc_batch(&request).await?.instances, 2);
    for (id, kept) in [("f-4", false), ("f-3", false), ("f-2", true)] {
        assert_eq!(status(&h, "boom", id).await?.is_some(), kept, "{id}");
    }
    assert_eq!(h.keiro.gc_eligible(&request).await?, 3);
    assert_eq!(h.keiro.gc_batch(&request).await?.instances, 2);
    assert_eq!(status(&h, "boom", "f-0").await?, Some(Status::Cancelled));
    assert_eq!(h.keiro.gc_batch(&request).await?.instances, 1);
    assert_eq!(h.keiro.gc_batch(&request).await?.instances, 0);
    Ok(())
}
