//! The queue gauges a worker serving queues samples: what each queue holds
//! (`keiro.queue.waiting`, `keiro.queue.running`), and whether it was held at a limit with runs
//! ready to go (`keiro.queue.throttled`). One `queues_list` per sampling interval, shared by the
//! workers of a process through [`Metrics::sample_due`](keiro_telemetry::Metrics::sample_due).

use std::future::Future;
use std::sync::Arc;

use keiro_journal::queue::QueueInfo;
use keiro_lease::QueueStore;
use keiro_telemetry::{Metrics, SampledGauge};

/// Whether `queue` is held back by one of its limits (or a pause) while runs that could be
/// admitted now wait: the throttled sample.
pub fn throttled(queue: &QueueInfo) -> bool {
    let ready = queue.waiting - queue.delayed;
    if ready <= 0 {
        return false;
    }
    let spec = &queue.spec;
    queue.paused
        || spec
            .concurrency
            .is_some_and(|n| queue.running >= i64::from(n))
        || spec
            .rate
            .is_some_and(|rate| queue.admitted_recently >= i64::from(rate.limit()))
}

/// Samples the gauges of `queues` every sampling interval of `metrics` until `shutdown`.
pub async fn run_queue_gauges(
    store: Arc<dyn QueueStore>,
    queues: Vec<String>,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(
        metrics
            .sampling_interval()
            .max(std::time::Duration::from_millis(100)),
    );
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        if !metrics.sample_due(SampledGauge::QueueDepth) {
            continue;
        }
        // A failed read skips this sample; the next interval tries again.
        let Ok(all) = store.queues_list(None, None).await else {
            continue;
        };
        for queue in all.iter().filter(|q| queues.contains(&q.spec.name)) {
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            metrics.queue_depth(&queue.spec.name, count(queue.waiting), count(queue.running));
            if throttled(queue) {
                metrics.queue_throttled(&queue.spec.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keiro_journal::queue::{QueueSpec, Rate};

    fn info(spec: QueueSpec, waiting: i64, delayed: i64, running: i64) -> QueueInfo {
        QueueInfo {
            spec,
            paused: false,
            waiting,
            delayed,
            running,
            admitted_recently: 0,
            oldest_waiting: None,
            top_keys: Vec::new(),
        }
    }

    #[test]
    fn a_queue_is_throttled_only_when_runs_ready_wait_at_a_limit() {
        let limited = QueueSpec::new("q").expect("valid").concurrency(2);
        assert!(throttled(&info(limited.clone(), 5, 0, 2)));
        assert!(
            !throttled(&info(limited.clone(), 5, 0, 1)),
            "a slot is free"
        );
        assert!(
            !throttled(&info(limited.clone(), 3, 3, 2)),
            "only delayed runs wait"
        );
        assert!(!throttled(&info(limited, 0, 0, 2)), "nothing waits");
        let open = QueueSpec::new("q").expect("valid");
        assert!(!throttled(&info(open.clone(), 5, 0, 50)));
        let mut paused = info(open, 1, 0, 0);
        paused.paused = true;
        assert!(throttled(&paused));
        let rated = QueueSpec::new("q")
            .expect("valid")
            .rate(Rate::new(10, std::time::Duration::from_secs(1)).expect("valid"));
        let mut at_rate = info(rated, 4, 0, 0);
        at_rate.admitted_recently = 10;
        assert!(throttled(&at_rate));
    }
}
