//! A completed run settles what it left behind (issue 17, item 8's "terminal runs"): the remote
//! task of a race's losing branch is cancelled, never run, and an awakeable it never awaited
//! stops counting as pending (`JournalStore::instance_settle_leftovers`). Both stores, driven
//! by the test kit.

use std::time::Duration;

use keiro::testing::TestEnvBuilder;
use keiro::{remote::RemoteOptions, remote::TaskStatus, workflow::AwakeableOutcome, Ctx, Status};
use keiro_tests::{on_both_envs, TestResult};

on_both_envs!(a_completed_run_cancels_its_leftover_task_and_awakeable);

async fn a_completed_run_cancels_its_leftover_task_and_awakeable(
    env: TestEnvBuilder,
) -> TestResult {
    let env = env
        .register("quick", |ctx: Ctx, (): ()| async move {
            let spare = ctx.awakeable::<u32>("spare").await?;
            ctx.step("announce", || async move {
                Ok::<_, std::convert::Infallible>(spare.id())
            })
            .await?;
            // The remote step loses to the approval; its task was dispatched while both waited.
            let options = RemoteOptions::default();
            ctx.select(
                "slow-or-approval",
                vec![
                    Box::pin(async { ctx.remote::<_, String>("slow", &"x", &options).await }),
                    Box::pin(async { ctx.await_step::<String>("approval").await }),
                ],
            )
            .await
        })
        .build()?;
    let keiro = env.keiro();
    env.start("quick", "q-1", &()).await?;
    env.run_until_idle().await?;
    let tasks = keiro.remote_tasks(("quick", "q-1")).await?;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    env.deliver(("quick", "q-1"), "approval", &"yes").await?;
    env.run_until_idle().await?;
    let row = env.instance(("quick", "q-1")).await?;
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);

    let tasks = keiro.remote_tasks(("quick", "q-1")).await?;
    assert_eq!(tasks[0].status, TaskStatus::Cancelled, "{tasks:?}");
    assert_eq!(keiro.store().awakeables_pending().await?, 0);
    let spare: uuid::Uuid = env
        .journal(("quick", "q-1"))
        .await?
        .into_iter()
        .find_map(|e| match e.event {
            keiro::store::Event::StepRecorded { step, result, .. } if step == "announce" => {
                serde_json::from_value(result).ok()
            }
            _ => None,
        })
        .expect("announced");
    let late = keiro.complete_awakeable(spare, &1u32).await?;
    assert!(!matches!(late, AwakeableOutcome::Delivered), "{late:?}");

    // A remote worker never runs the cancelled task.
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = ran.clone();
    let remote = keiro
        .remote_worker()?
        .handle(
            "slow",
            move |_: String, _task: keiro::remote::TaskContext| {
                let seen = seen.clone();
                async move {
                    seen.store(true, std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, keiro::remote::TaskError>("done".to_owned())
                }
            },
        )
        .build();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        remote
            .run_until(async {
                let _ = stop_rx.await;
            })
            .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop_tx.send(());
    let _ = running.await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the handler ran"
    );
    Ok(())
}
