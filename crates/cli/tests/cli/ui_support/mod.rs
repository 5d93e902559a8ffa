//! What the dashboard's tests share: a seeded schema and a `keiro ui` process serving it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{worker::Registry, Ctx, Status, WorkflowError};
use keiro_tests::{Harness, TestResult};

/// The operator token the tests start the dashboard with.
pub(crate) const TOKEN: &str = "s3cret-operator-token";

/// A stored XSS payload: markup, an event handler and a script, in a workflow's output.
pub(crate) const XSS: &str =
    "<script>window.keiroPwned=1</script><img src=x onerror=\"window.keiroPwned=2\">";

/// A signal token that is markup: the instance page shows it in its signal waits and timers.
pub(crate) const XSS_TOKEN: &str = "<script>window.keiroPwned=3</script>";

/// The first item `streamer` writes: markup, which the page shows as text.
pub(crate) const STREAM_MARKUP: &str = "one <img src=x onerror=\"window.keiroPwned=4\">";

/// The workflows the seed runs: `greet` completes with [`XSS`] in its output; `charge` fails
/// for good while `broken` is set and completes once it is cleared (so a requeue succeeds);
/// `waiter` parks on a sleep, a signal wait (with a timeout) on its input token and an
/// awakeable at once; `family` runs one `greet` child to completion; `streamer` sets its
/// `phase` event, runs a step that fails its first attempt, writes [`STREAM_MARKUP`] to its `progress` stream and waits for the value
/// delivered to its `go` step, which it writes next before closing the stream.
pub(crate) fn registry(broken: Arc<AtomicBool>) -> Registry {
    let mut registry = Registry::new();
    registry
        .register("greet", |_ctx: Ctx, who: String| async move {
            Ok::<_, WorkflowError>(format!("{XSS} hello {who}"))
        })
        .expect("registering greet");
    registry
        .register("charge", move |ctx: Ctx, amount: i64| {
            let broken = broken.clone();
            async move {
                let receipt: String = ctx
                    .step("authorize", || async move {
                        Ok::<_, std::convert::Infallible>(format!("auth-{amount}"))
                    })
                    .await?;
                if broken.load(Ordering::SeqCst) {
                    return Err(WorkflowError::app("card declined: <b>gateway</b> down"));
                }
                Ok(format!("{receipt} captured"))
            }
        })
        .expect("registering charge");
    registry
        .register("waiter", |ctx: Ctx, token: String| async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            let (nap, poke, approved) = tokio::join!(
                ctx.sleep("nap", Duration::from_secs(3600)),
                ctx.wait_signal::<String>(&token, Some(Duration::from_secs(1800))),
                approval.value(),
            );
            nap?;
            Ok::<_, WorkflowError>(format!("{} {}", poke?, approved?))
        })
        .expect("registering waiter");
    registry
        .register("streamer", |ctx: Ctx, (): ()| async move {
            ctx.set_event("phase", &"started").await?;
            // Fails its first attempt: the timeline ticks it on the step's lane.
            let retry = keiro::StepOptions::new(3).initial_interval(Duration::from_millis(100));
            let mut tries = 0;
            ctx.step_with("fetch", &retry, || {
                tries += 1;
                let attempt = tries;
                async move {
                    if attempt == 1 {
                        Err("upstream timed out".to_owned())
                    } else {
                        Ok(attempt)
                    }
                }
            })
            .await?;
            ctx.write_stream("progress", &STREAM_MARKUP).await?;
            let more: String = ctx.await_step("go").await?;
            ctx.write_stream("progress", &more).await?;
            ctx.close_stream("progress").await?;
            ctx.set_event("phase", &"done").await?;
            Ok::<_, WorkflowError>(2)
        })
        .expect("registering streamer");
    registry
        .register("family", |ctx: Ctx, (): ()| async move {
            ctx.child::<_, String>("greet", "kid-1", &"kid").await
        })
        .expect("registering family");
    registry
}

/// Drives resume passes until `name/id` has `status` (10 s at most).
pub(crate) async fn drive_until(
    h: &Harness,
    registry: &Registry,
    name: &str,
    id: &str,
    status: Status,
) -> TestResult {
    let options = h.fast_options();
    keiro_tests::until_status(&h.keiro, name, id, status, || async {
        keiro::worker::resume_once(&h.store, registry, &options).await?;
        Ok(())
    })
    .await
}

/// Seeds `greet/xss-1` (completed, XSS in its output) and `charge/c-1` (failed) plus a few
/// running `greet` instances, on the harness's fresh schema.
pub(crate) async fn seed(h: &Harness, registry: &Registry) -> TestResult {
    h.keiro.start("greet", "xss-1", &"<i>operator</i>").await?;
    h.keiro.start("charge", "c-1", &42).await?;
    drive_until(h, registry, "greet", "xss-1", Status::Completed).await?;
    drive_until(h, registry, "charge", "c-1", Status::Failed).await?;
    for n in 0..3 {
        h.keiro.start("greet", &format!("later-{n}"), &"x").await?;
    }
    Ok(())
}

/// Seeds `waiter/w-1` (suspended on its timers, an awakeable and a signal wait on
/// [`XSS_TOKEN`]) and `family/f-1` (completed, with its completed child `greet/kid-1`).
pub(crate) async fn seed_waits(h: &Harness, registry: &Registry) -> TestResult {
    h.keiro.start("waiter", "w-1", &XSS_TOKEN).await?;
    h.keiro.start("family", "f-1", &()).await?;
    drive_until(h, registry, "waiter", "w-1", Status::Suspended).await?;
    drive_until(h, registry, "family", "f-1", Status::Completed).await?;
    Ok(())
}

/// Seeds `streamer/s-1`, suspended on its `go` step with one item in its open stream.
pub(crate) async fn seed_stream(h: &Harness, registry: &Registry) -> TestResult {
    h.keiro.start("streamer", "s-1", &()).await?;
    drive_until(h, registry, "streamer", "s-1", Status::Suspended).await
}

/// The queue [`seed_queue`] declares: 2 runs at once, 1 per key, 100 starts a minute; a
/// parked run keeps its slot.
pub(crate) const QUEUE: &str = "llm";

/// A key that is markup: the queue page and the list show it as text, and link to it encoded.
pub(crate) const MARKUP_KEY: &str = "<i>globex</i>";

/// Declares [`QUEUE`] and starts five `call` runs on it: `q-0` and `q-1` under key `acme`,
/// `q-2` and `q-3` under [`MARKUP_KEY`], and `q-4` with no key, delayed by an hour. A worker
/// serving the queue admits one run per key (the per-key limit), which parks on an hour's
/// sleep holding its slot: the queue is at its concurrency (2 running), with 3 waiting, 1 of
/// them delayed, and both keys at their per-key limit.
pub(crate) async fn seed_queue(h: &Harness) -> TestResult {
    use keiro::queue::{QueueSpec, Rate, StartOptions};
    let spec = QueueSpec::new(QUEUE)?
        .concurrency(2)
        .key_concurrency(1)
        .rate(Rate::new(100, Duration::from_secs(60))?)
        .release_on_park(false);
    h.keiro.declare_queue(&spec).await?;
    let keys = [
        Some("acme"),
        Some("acme"),
        Some(MARKUP_KEY),
        Some(MARKUP_KEY),
    ];
    for (n, key) in keys.into_iter().enumerate() {
        let mut options = StartOptions::on_queue(QUEUE);
        if let Some(key) = key {
            options = options.key(key);
        }
        h.keiro
            .start_with("call", &format!("q-{n}"), &n, &options)
            .await?;
    }
    let later = StartOptions::on_queue(QUEUE).delay(Duration::from_secs(3600));
    h.keiro.start_with("call", "q-4", &4, &later).await?;

    let mut registry = Registry::new();
    registry
        .register("call", |ctx: Ctx, n: usize| async move {
            ctx.sleep("hold", Duration::from_secs(3600)).await?;
            Ok::<_, WorkflowError>(n)
        })
        .expect("registering call");
    let options = keiro::worker::ResumeOptions {
        queues: vec![QUEUE.to_owned()],
        owner: Some("ui-test-worker".to_owned()),
        ..h.fast_options()
    };
    for id in ["q-0", "q-2"] {
        keiro_tests::until_status(&h.keiro, "call", id, Status::Suspended, || async {
            keiro::worker::resume_once(&h.store, &registry, &options).await?;
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// A `keiro ui` process on the harness's schema; killed when dropped.
pub(crate) struct Ui {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

/// `keiro ui` on the harness's schema with `token` if any and `args` after `ui`.
pub(crate) fn ui_command(h: &Harness, token: Option<&str>, args: &[&str]) -> Command {
    let db = h.db.as_ref().expect("a Postgres harness");
    let mut command = Command::new(env!("CARGO_BIN_EXE_keiro"));
    command
        .env("DATABASE_URL", db.url())
        .env("KEIRO_SCHEMA", db.schema())
        .env_remove("KEIRO_UI_TOKEN")
        .arg("ui")
        .args(args)
        .stdout(Stdio::piped());
    if let Some(token) = token {
        command.env("KEIRO_UI_TOKEN", token);
    }
    command
}

impl Ui {
    /// Starts `keiro ui` on a free loopback port, with `token` if any, and waits for its
    /// address line.
    pub(crate) fn start(h: &Harness, token: Option<&str>) -> Self {
        Self::start_with(h, token, &["--listen", "127.0.0.1:0"])
    }

    /// Starts `keiro ui` with `args` (which pick the address, `--listen`), and waits for its
    /// address line.
    pub(crate) fn start_with(h: &Harness, token: Option<&str>, args: &[&str]) -> Self {
        let mut command = ui_command(h, token, args);
        command.stderr(Stdio::inherit());
        let mut child = command.spawn().expect("starting keiro ui");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("reading the address line");
        let base = line
            .trim()
            .strip_prefix("keiro ui listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self { child, base }
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the charge workflow should still fail.
pub(crate) fn broken() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(true))
}
