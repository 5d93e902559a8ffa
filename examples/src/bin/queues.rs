//! A partner API that allows at most 4 calls at once across the fleet and 10 calls per second
//! per customer. Every call is a step of an `enrich` workflow started on the queue
//! `partner-api`; three workers serve the queue, and the limits hold across all of them
//! because each admission is decided in the transaction that leases the run. One customer
//! floods the queue; weighted fairness keeps the others from waiting behind it.
//!
//! Runs on PostgreSQL when `DATABASE_URL` is set (schema `keiro_queues_example`), else on a
//! temporary SQLite file. Prints what ran at once and per customer per second, and checks it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keiro::queue::{Fairness, QueueSpec, Rate, StartOptions};
use keiro::{Ctx, Keiro, WorkflowError};

/// At most this many calls at once, fleet-wide.
const AT_ONCE: i32 = 4;
/// At most this many calls per second per customer.
const PER_SECOND: i32 = 10;

/// What the partner saw: calls in flight now and at most, and each customer's call times.
#[derive(Default)]
struct Partner {
    in_flight: usize,
    most_in_flight: usize,
    calls: BTreeMap<String, Vec<Instant>>,
}

/// The partner API: 30 ms a call.
async fn call_partner(partner: &Mutex<Partner>, customer: &str) -> usize {
    {
        let mut p = partner.lock().expect("not poisoned");
        p.in_flight += 1;
        p.most_in_flight = p.most_in_flight.max(p.in_flight);
        p.calls
            .entry(customer.to_owned())
            .or_default()
            .push(Instant::now());
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut p = partner.lock().expect("not poisoned");
    p.in_flight -= 1;
    customer.len()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keiro = match std::env::var("DATABASE_URL") {
        Ok(url) => {
            let mut config = keiro::postgres::Config::new(url);
            config.schema = "keiro_queues_example".into();
            Keiro::connect(config).await?
        }
        Err(_) => Keiro::temporary()?,
    };
    let queue = QueueSpec::new("partner-api")?
        .concurrency(AT_ONCE)
        .key_rate(Rate::new(PER_SECOND, Duration::from_secs(1))?)
        .fairness(Fairness::Weighted);
    keiro.declare_queue(&queue).await?; // safe on every start: it records the limits

    // One flooding customer, two small ones; each run is keyed by its customer.
    let mut ids = Vec::new();
    for (customer, runs) in [("acme", 24), ("globex", 6), ("initech", 6)] {
        for n in 0..runs {
            let id = format!("{customer}-{n:02}");
            let options = StartOptions::on_queue("partner-api").key(customer);
            keiro.start_with("enrich", &id, &customer, &options).await?;
            ids.push(id);
        }
    }

    let partner = Arc::new(Mutex::new(Partner::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut fleet = tokio::task::JoinSet::new();
    for w in 0..3 {
        let partner = partner.clone();
        let worker = keiro
            .worker()
            .register("enrich", move |ctx: Ctx, customer: String| {
                let partner = partner.clone();
                async move {
                    let answer = ctx
                        .step("call-partner", || async {
                            Ok::<_, WorkflowError>(call_partner(&partner, &customer).await)
                        })
                        .await?;
                    Ok::<_, WorkflowError>(answer)
                }
            })
            .queue("partner-api")
            .concurrency(8)
            .owner(format!("worker-{w}"))
            .build()?;
        let mut stopped = stopped.clone();
        fleet.spawn(async move {
            worker
                .run_until(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await
        });
    }
    let began = Instant::now();
    for id in &ids {
        keiro
            .result::<usize>(("enrich", id.as_str()), Duration::from_secs(60))
            .await?;
    }
    let _ = stop.send(true);
    while fleet.join_next().await.is_some() {}

    let p = partner.lock().expect("not poisoned");
    println!(
        "{} calls in {:.1} s; at most {} at once (limit {AT_ONCE})",
        ids.len(),
        began.elapsed().as_secs_f64(),
        p.most_in_flight
    );
    assert!(p.most_in_flight <= usize::try_from(AT_ONCE)?);
    for (customer, calls) in &p.calls {
        // The most calls that began within any one second: admission is what the limit
        // counts, and a call begins just after its run's admission, so allow one for that lag.
        let busiest = calls
            .iter()
            .map(|start| {
                calls
                    .iter()
                    .filter(|t| **t >= *start && t.duration_since(*start) < Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0);
        let finished = calls
            .iter()
            .max()
            .map_or(0.0, |last| last.duration_since(began).as_secs_f64());
        println!(
            "{customer}: {} calls, at most {busiest} in one second (limit {PER_SECOND}), \
             last one {finished:.1} s in",
            calls.len()
        );
        assert!(busiest <= usize::try_from(PER_SECOND)? + 1);
    }
    Ok(())
}
