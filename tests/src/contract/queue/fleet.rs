//! Real workers on a queue: a fleet serving one queue never runs more than its limits allow,
//! whatever the run lengths, and every run completes once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::queue::{QueueSpec, StartOptions};
use keiro::{Ctx, WorkflowError};
use serde::{Deserialize, Serialize};

use super::declare;
use crate::contract::support::TestResult;
use crate::{FastWorker, Harness};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: String,
    ms: u64,
}

/// What ran at once: now, and the most seen, in total and per key.
#[derive(Debug, Default)]
struct Running {
    now: usize,
    most: usize,
    per_key: BTreeMap<String, (usize, usize)>,
    ran: usize,
}

pub async fn a_fleet_of_workers_never_exceeds_the_queue_limits(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(3).key_concurrency(1)).await?;
    let running = Arc::new(Mutex::new(Running::default()));
    let body = {
        let running = running.clone();
        move |ctx: Ctx, job: Job| {
            let running = running.clone();
            async move {
                ctx.step("work", || {
                    let running = running.clone();
                    let job = job.clone();
                    async move {
                        {
                            let mut r = running.lock().expect("lock");
                            r.now += 1;
                            r.most = r.most.max(r.now);
                            r.ran += 1;
                            let key = r.per_key.entry(job.key.clone()).or_default();
                            key.0 += 1;
                            key.1 = key.1.max(key.0);
                        }
                        tokio::time::sleep(Duration::from_millis(job.ms)).await;
                        let mut r = running.lock().expect("lock");
                        r.now -= 1;
                        r.per_key.get_mut(&job.key).expect("entered").0 -= 1;
                        Ok::<_, WorkflowError>(())
                    }
                })
                .await
            }
        }
    };
    let runs: usize = 30;
    for n in 0..runs {
        let job = Job {
            key: format!("k{}", n % 5),
            ms: 5 + u64::try_from(n * 7 % 11)? * 3,
        };
        let options = StartOptions::on_queue("q").key(job.key.clone());
        h.keiro
            .start_with("job", &format!("j-{n:02}"), &job, &options)
            .await?;
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut fleet = tokio::task::JoinSet::new();
    for w in 0..3 {
        let worker = h
            .keiro
            .worker()
            .fast()
            .concurrency(4)
            .owner(format!("fleet-{w}"))
            .register("job", body.clone())
            .queue("q")
            .build()?;
        let mut stop = stop_rx.clone();
        fleet.spawn(async move {
            worker
                .run_until(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
    }
    // A watcher samples what the store says is running meanwhile.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let info = h.keiro.queue("q").await?.expect("declared");
        assert!(
            info.running <= 3,
            "the store shows {} holding slots",
            info.running
        );
        if info.running == 0 && info.waiting == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not done: {info:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_tx.send(true)?;
    while fleet.join_next().await.is_some() {}
    {
        let r = running.lock().expect("lock");
        assert_eq!(r.ran, runs, "every run's step ran once");
        assert!(r.most <= 3, "{} ran at once", r.most);
        assert!(r.most >= 2, "the fleet ran runs side by side ({})", r.most);
        for (key, (_, most)) in &r.per_key {
            assert_eq!(*most, 1, "key {key} ran {most} at once");
        }
    }
    for n in 0..runs {
        let row = h
            .keiro
            .instance(("job", format!("j-{n:02}").as_str()))
            .await?
            .expect("started");
        assert_eq!(row.status, keiro::Status::Completed);
    }
    Ok(())
}
