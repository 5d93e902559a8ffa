//! Start inside the caller's transaction (issue 16 item 3): `Keiro::start_in(&tx, ..)` and its
//! siblings (deliver, signal, awakeable completion, cancel) commit with the caller's own rows or not
//! at all. Postgres only; the SQLite store refuses them with a typed error.
//!
//! The caller's connection is its own (not keiro's pool) with `search_path = app`, a schema
//! that does not even exist, so every statement keiro sends must name keiro's schema itself.
//! Its business table is a temporary one, which PostgreSQL finds through `pg_temp`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::postgres::tokio_postgres::{self, AsyncMessage, Client, NoTls};
use keiro::{
    operate::CancelOutcome, store::AppendOutcome, store::StoreError, worker::Registry,
    workflow::AwakeableOutcome, workflow::SignalSendOutcome, Ctx, Error, InstanceKey, Keiro,
    Status, WorkflowError,
};
use keiro_tests::{FastWorker, Harness, TestResult};
use tokio::sync::mpsc;
use uuid::Uuid;

type AnyError = Box<dyn std::error::Error + Send + Sync>;

/// A test's keiro schema, a facade on it, and the application's own connection.
struct App {
    h: Harness,
    keiro: Keiro,
    client: Client,
}

impl App {
    async fn new() -> Result<Self, AnyError> {
        let h = Harness::postgres().await;
        let db = h.db.as_ref().expect("a postgres harness");
        let keiro = Keiro::builder(db.store()).without_push().build();
        let client = connect(db.url()).await?;
        client
            .batch_execute(
                "SET search_path = app;
                 CREATE TEMP TABLE orders (id text PRIMARY KEY)",
            )
            .await?;
        Ok(Self { h, keiro, client })
    }

    fn schema(&self) -> String {
        format!("\"{}\"", self.h.db.as_ref().expect("postgres").schema())
    }

    async fn count(&self, sql: &str) -> Result<i64, AnyError> {
        let store = self.h.db.as_ref().expect("postgres").store();
        let client = store.pool().get().await?;
        Ok(client.query_one(sql, &[]).await?.get(0))
    }

    async fn journal_rows(&self, name: &str, id: &str) -> Result<i64, AnyError> {
        let s = self.schema();
        self.count(&format!(
            "SELECT count(*) FROM {s}.journal WHERE workflow_name = '{name}' AND workflow_id = '{id}'"
        ))
        .await
    }
}

/// A connection of the application's own, driven on its own task.
async fn connect(url: &str) -> Result<Client, AnyError> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Listens on the store's wake channel; returns once the `LISTEN` is in effect.
async fn wakes(app: &App) -> Result<mpsc::UnboundedReceiver<String>, AnyError> {
    let db = app.h.db.as_ref().expect("postgres");
    let store = db.store();
    let channel = store.wake_channel().to_owned();
    let (client, mut connection) = tokio_postgres::connect(db.url(), NoTls).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let drive = async {
            while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if tx.send(n.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        };
        let listen = async {
            let sql = format!("LISTEN \"{channel}\"");
            let _ = ready_tx.send(client.batch_execute(&sql).await);
            // Keep the client (and so the connection) alive while the drive runs.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = drive => {}
            () = listen => {}
        }
    });
    ready_rx.await??;
    Ok(rx)
}

/// The wakes received within `wait`.
async fn drain(rx: &mut mpsc::UnboundedReceiver<String>, wait: Duration) -> Vec<String> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(payload)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        got.push(payload);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_start_exists_and_a_worker_runs_it() -> TestResult {
    let mut app = App::new().await?;
    let db = app.h.db.as_ref().expect("postgres");
    // Push only: a 30 s poll cannot finish this within the deadline, so the commit's NOTIFY
    // must wake the worker.
    let keiro = Keiro::builder(db.store()).build();
    let mut registry = Registry::new();
    registry.register("order", |_ctx: Ctx, sku: u32| async move { Ok(sku * 2) })?;
    let worker = keiro
        .worker()
        .registry(registry)
        .fast()
        .poll_interval(Duration::from_secs(30))
        .build()?;
    let running = keiro_tests::spawn_worker(worker);
    let mut wakes = wakes(&app).await?;

    let tx = app.client.transaction().await?;
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"o-1"])
        .await?;
    let started = app.keiro.start_in(&tx, "order", "o-1", &21u32).await?;
    assert!(started.created);
    assert_eq!(started.instance.status, Status::Running);
    // Not visible, and nobody woken, before the commit.
    assert!(keiro.instance(("order", "o-1")).await?.is_none());
    assert!(drain(&mut wakes, Duration::from_millis(200))
        .await
        .is_empty());
    tx.commit().await?;

    assert_eq!(
        drain(&mut wakes, Duration::from_millis(500)).await.first(),
        Some(&"order/o-1".to_owned()),
        "the commit notifies"
    );
    let output: u32 = keiro
        .result(("order", "o-1"), Duration::from_secs(10))
        .await?;
    assert_eq!(output, 42);
    running.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_start_leaves_nothing_and_the_id_starts_again() -> TestResult {
    let mut app = App::new().await?;
    let mut wakes = wakes(&app).await?;

    let tx = app.client.transaction().await?;
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"o-1"])
        .await?;
    assert!(app.keiro.start_in(&tx, "order", "o-1", &1).await?.created);
    tx.rollback().await?;

    assert!(app.keiro.instance(("order", "o-1")).await?.is_none());
    assert_eq!(app.journal_rows("order", "o-1").await?, 0);
    assert!(app.h.store.instances_runnable(None, None).await?.is_empty());
    // A start committed afterwards is the first (and only) wake the channel carries.
    app.keiro.start("order", "sentinel", &0).await?;
    assert_eq!(
        drain(&mut wakes, Duration::from_millis(500)).await,
        vec!["order/sentinel".to_owned()],
        "a rollback wakes nothing"
    );

    // The id is free again, with the input of the start that commits.
    let tx = app.client.transaction().await?;
    let again = app.keiro.start_in(&tx, "order", "o-1", &2).await?;
    tx.commit().await?;
    assert!(again.created);
    let instance = app
        .keiro
        .instance(("order", "o-1"))
        .await?
        .expect("committed");
    assert_eq!(instance.input, serde_json::json!(2));
    assert_eq!(
        app.client
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get::<_, i64>(0),
        0,
        "the business row went with the rollback"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_twice_in_one_transaction_is_idempotent() -> TestResult {
    let mut app = App::new().await?;
    let tx = app.client.transaction().await?;
    let first = app.keiro.start_in(&tx, "order", "o-1", &1).await?;
    let second = app.keiro.start_in(&tx, "order", "o-1", &2).await?;
    assert!(first.created);
    assert!(!second.created);
    assert_eq!(
        second.instance.input,
        serde_json::json!(1),
        "the first input stays"
    );
    tx.commit().await?;
    assert_eq!(
        app.count(&format!("SELECT count(*) FROM {}.workflows", app.schema()))
            .await?,
        1
    );
    // And against a committed instance, from a later transaction.
    let tx = app.client.transaction().await?;
    assert!(!app.keiro.start_in(&tx, "order", "o-1", &3).await?.created);
    tx.commit().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_delivery_leaves_nothing() -> TestResult {
    let mut app = App::new().await?;
    app.keiro.start("gate", "g-1", &()).await?;
    let before = app.journal_rows("gate", "g-1").await?;

    let tx = app.client.transaction().await?;
    assert_eq!(
        app.keiro
            .deliver_in(&tx, ("gate", "g-1"), "open", &5)
            .await?,
        AppendOutcome::Appended
    );
    tx.rollback().await?;
    assert_eq!(app.journal_rows("gate", "g-1").await?, before);

    // Committed, it is journaled once, and a redelivery in the same way is idempotent.
    let tx = app.client.transaction().await?;
    app.keiro
        .deliver_in(&tx, ("gate", "g-1"), "open", &5)
        .await?;
    assert_eq!(
        app.keiro
            .deliver_in(&tx, ("gate", "g-1"), "open", &6)
            .await?,
        AppendOutcome::AlreadyPresent(serde_json::json!(5))
    );
    tx.commit().await?;
    assert_eq!(app.journal_rows("gate", "g-1").await?, before + 1);

    // A delivery bound to a generation the instance is not on is refused as deliver_to is.
    let tx = app.client.transaction().await?;
    let refused = app
        .keiro
        .deliver_to_in(&tx, ("gate", "g-1"), 3, "later", &1)
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::DeliveryRefused {
                reason: keiro::workflow::DeliveryRefusal::StaleGeneration {
                    generation: 3,
                    current: 0
                },
                ..
            })
        ),
        "{refused:?}"
    );
    tx.rollback().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_in_a_transaction_is_bounded_as_the_pooled_one() -> TestResult {
    let mut app = App::new().await?;
    let keiro = app
        .keiro
        .clone()
        .with_delivery_backlog(keiro::workflow::DeliveryBacklog {
            deliveries: 1,
            ..keiro::workflow::DeliveryBacklog::default()
        });
    keiro.start("gate", "g-1", &()).await?;
    let tx = app.client.transaction().await?;
    keiro.deliver_in(&tx, ("gate", "g-1"), "first", &1).await?;
    let refused = keiro.deliver_in(&tx, ("gate", "g-1"), "second", &2).await;
    assert!(
        matches!(
            &refused,
            Err(Error::DeliveryRefused {
                reason: keiro::workflow::DeliveryRefusal::Backlog { unread, .. },
                ..
            }) if unread.count == 1
        ),
        "{refused:?}"
    );
    // Refused before anything was written: the caller's transaction goes on.
    tx.commit().await?;
    assert_eq!(app.journal_rows("gate", "g-1").await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_cancel_leaves_the_run_going_and_a_committed_one_cancels_it() -> TestResult {
    let mut app = App::new().await?;
    app.keiro.start("gate", "g-1", &()).await?;
    let before = app.journal_rows("gate", "g-1").await?;
    let status = |keiro: Keiro| async move {
        Ok::<_, Error>(keiro.instance(("gate", "g-1")).await?.expect("row").status)
    };

    let tx = app.client.transaction().await?;
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"g-1"])
        .await?;
    assert_eq!(
        app.keiro.cancel_in(&tx, ("gate", "g-1")).await?,
        CancelOutcome::Recorded
    );
    tx.rollback().await?;
    assert_eq!(app.journal_rows("gate", "g-1").await?, before);
    assert_eq!(status(app.keiro.clone()).await?, Status::Running);

    let tx = app.client.transaction().await?;
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"g-1"])
        .await?;
    assert_eq!(
        app.keiro.cancel_in(&tx, ("gate", "g-1")).await?,
        CancelOutcome::Recorded
    );
    // Within the transaction, a second cancel sees the first, as the pooled path would.
    assert_eq!(
        app.keiro.cancel_in(&tx, ("gate", "g-1")).await?,
        CancelOutcome::AlreadyTerminal(Status::Cancelled)
    );
    tx.commit().await?;
    assert_eq!(app.journal_rows("gate", "g-1").await?, before + 1);
    assert_eq!(status(app.keiro.clone()).await?, Status::Cancelled);
    assert_eq!(
        app.keiro.cancel(("gate", "g-1")).await?,
        CancelOutcome::AlreadyTerminal(Status::Cancelled)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cascade_cancel_commits_with_the_start_it_follows() -> TestResult {
    let mut app = App::new().await?;
    let tx = app.client.transaction().await?;
    app.keiro.start_in(&tx, "order", "o-1", &1).await?;
    assert_eq!(
        app.keiro.cancel_cascade_in(&tx, ("order", "o-1")).await?,
        CancelOutcome::Recorded
    );
    tx.rollback().await?;
    assert!(app.keiro.instance(("order", "o-1")).await?.is_none());

    let tx = app.client.transaction().await?;
    app.keiro.start_in(&tx, "order", "o-1", &1).await?;
    app.keiro.cancel_cascade_in(&tx, ("order", "o-1")).await?;
    tx.commit().await?;
    let row = app.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(row.status, Status::Cancelled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_bad_or_unknown_key_gets_the_errors_of_the_pooled_path() -> TestResult {
    let mut app = App::new().await?;
    let tx = app.client.transaction().await?;
    // Refused before anything is sent: the transaction is still good afterwards.
    let inside = app.keiro.cancel_in(&tx, ("gate", "a/b")).await;
    let pooled = app.keiro.cancel(("gate", "a/b")).await;
    assert!(matches!(inside, Err(Error::InvalidId(_))), "{inside:?}");
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"o-1"])
        .await?;
    let inside = app.keiro.cancel_in(&tx, ("gate", "nobody")).await;
    assert!(
        matches!(inside, Err(Error::Store(StoreError::NotFound { ref key })) if *key == InstanceKey::parse("gate", "nobody")?),
        "{inside:?}"
    );
    let sqlite = Keiro::temporary()?;
    let refused = sqlite.cancel_in(&tx, ("gate", "g-1")).await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_signal_leaves_nothing() -> TestResult {
    let mut app = App::new().await?;
    let buffered = format!("SELECT count(*) FROM {}.signal_buffer", app.schema());

    let tx = app.client.transaction().await?;
    assert_eq!(
        app.keiro.signal_in(&tx, "order-1/paid", &7).await?,
        SignalSendOutcome::Buffered
    );
    tx.rollback().await?;
    assert_eq!(app.count(&buffered).await?, 0);

    let tx = app.client.transaction().await?;
    app.keiro.signal_in(&tx, "order-1/paid", &7).await?;
    tx.commit().await?;
    assert_eq!(app.count(&buffered).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_awakeable_completion_leaves_nothing() -> TestResult {
    let mut app = App::new().await?;
    let ids = Arc::new(Mutex::new(Vec::<Uuid>::new()));
    let mut registry = Registry::new();
    let seen = ids.clone();
    registry.register("approver", move |ctx: Ctx, (): ()| {
        let seen = seen.clone();
        async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            seen.lock().expect("lock").push(approval.id());
            approval.value().await
        }
    })?;
    let options = app.h.fast_options();
    app.keiro.start("approver", "a-1", &()).await?;
    keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
    let id = ids.lock().expect("lock")[0];
    let before = app.journal_rows("approver", "a-1").await?;
    assert_eq!(app.h.store.awakeables_pending().await?, 1);

    let tx = app.client.transaction().await?;
    assert_eq!(
        app.keiro.complete_awakeable_in(&tx, id, "yes").await?,
        AwakeableOutcome::Delivered
    );
    tx.rollback().await?;
    assert_eq!(app.h.store.awakeables_pending().await?, 1);
    assert_eq!(app.journal_rows("approver", "a-1").await?, before);
    let tx = app.client.transaction().await?;
    app.keiro.cancel_awakeable_in(&tx, id).await?;
    tx.rollback().await?;
    assert_eq!(app.h.store.awakeables_pending().await?, 1);

    let tx = app.client.transaction().await?;
    app.keiro.complete_awakeable_in(&tx, id, "yes").await?;
    tx.commit().await?;
    assert_eq!(app.h.store.awakeables_pending().await?, 0);
    keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
    let instance = app.keiro.instance(("approver", "a-1")).await?.expect("row");
    assert_eq!(instance.status, Status::Completed);
    assert_eq!(instance.output, Some(serde_json::json!("yes")));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_and_payloads_get_the_errors_of_the_pooled_paths() -> TestResult {
    let mut app = App::new().await?;
    let keiro = app.keiro.clone().with_payload_len_max(64);
    let big = "x".repeat(100);
    let tx = app.client.transaction().await?;
    tx.execute("INSERT INTO orders VALUES ($1)", &[&"o-1"])
        .await?;

    let pooled = keiro.start("", "o-1", &1).await;
    let inside = keiro.start_in(&tx, "", "o-1", &1).await;
    assert!(matches!(pooled, Err(Error::InvalidId(_))), "{pooled:?}");
    assert!(matches!(inside, Err(Error::InvalidId(_))), "{inside:?}");
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));

    let pooled = keiro.start("order", "o-2", &big).await;
    let inside = keiro.start_in(&tx, "order", "o-2", &big).await;
    assert!(
        matches!(
            inside,
            Err(Error::Payload(WorkflowError::PayloadTooLarge { .. }))
        ),
        "{inside:?}"
    );
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));

    let inside = keiro.deliver_in(&tx, ("order", "o-1"), "", &1).await;
    let pooled = keiro.deliver(("order", "o-1"), "", &1).await;
    assert!(matches!(inside, Err(Error::InvalidId(_))), "{inside:?}");
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));
    let inside = keiro.deliver_in(&tx, ("order", "o-1"), "open", &big).await;
    let pooled = keiro.deliver(("order", "o-1"), "open", &big).await;
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));

    let inside = keiro.signal_in(&tx, "", &1).await;
    let pooled = keiro.signal("", &1).await;
    assert!(matches!(inside, Err(Error::InvalidId(_))), "{inside:?}");
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));
    let inside = keiro.signal_in(&tx, "t", &big).await;
    let pooled = keiro.signal("t", &big).await;
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));

    let id = Uuid::new_v4();
    let inside = keiro.complete_awakeable_in(&tx, id, &big).await;
    let pooled = keiro.complete_awakeable(id, &big).await;
    assert!(matches!(inside, Err(Error::Payload(_))), "{inside:?}");
    assert_eq!(format!("{pooled:?}"), format!("{inside:?}"));
    assert_eq!(
        keiro.complete_awakeable_in(&tx, id, "ok").await?,
        AwakeableOutcome::NotFound
    );

    // A NUL character is refused before the database sees it, as on the pooled path.
    let inside = keiro.start_in(&tx, "order", "o-3", "a\0b").await;
    assert!(matches!(inside, Err(Error::Payload(_))), "{inside:?}");

    // Nothing was sent for the refusals: the caller's transaction is still good.
    tx.commit().await?;
    assert_eq!(
        app.client
            .query_one("SELECT count(*) FROM orders", &[])
            .await?
            .get::<_, i64>(0),
        1
    );
    assert_eq!(
        app.count(&format!("SELECT count(*) FROM {}.workflows", app.schema()))
            .await?,
        0
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliver_to_an_unknown_instance_is_not_found() -> TestResult {
    let mut app = App::new().await?;
    let tx = app.client.transaction().await?;
    let inside = app
        .keiro
        .deliver_in(&tx, ("gate", "nobody"), "open", &1)
        .await;
    assert!(
        matches!(inside, Err(Error::Store(StoreError::NotFound { ref key })) if *key == InstanceKey::parse("gate", "nobody")?),
        "{inside:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sqlite_store_refuses_with_a_typed_error() -> TestResult {
    let app = App::new().await?;
    let sqlite = Keiro::temporary()?;
    let refused = sqlite.start_in(&app.client, "order", "o-1", &1).await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    Ok(())
}

/// The isolation levels above READ COMMITTED, with the name PostgreSQL gives each.
const SNAPSHOT_LEVELS: [(tokio_postgres::IsolationLevel, &str); 2] = [
    (
        tokio_postgres::IsolationLevel::RepeatableRead,
        "repeatable read",
    ),
    (tokio_postgres::IsolationLevel::Serializable, "serializable"),
];

/// A transaction of the app's at `level` whose snapshot is taken now (by its first statement),
/// so whatever commits from here on is invisible to it.
async fn snapshot_at(
    client: &mut Client,
    level: tokio_postgres::IsolationLevel,
) -> Result<tokio_postgres::Transaction<'_>, AnyError> {
    let tx = client
        .build_transaction()
        .isolation_level(level)
        .start()
        .await?;
    tx.query_one("SELECT count(*) FROM orders", &[]).await?;
    Ok(tx)
}

fn isolation_refused(result: &Result<impl std::fmt::Debug, Error>, wanted: &str) -> bool {
    matches!(result, Err(Error::Store(StoreError::IsolationRefused { level, .. })) if level == wanted)
}

/// The reviewer's case: a run parks on `wait_signal` after the caller's REPEATABLE READ (or
/// SERIALIZABLE) transaction took its snapshot; a send in that transaction cannot see the
/// waiter, and it answered `Buffered` and left the run suspended forever. It is refused with
/// the level named, before anything is written, and the transaction goes on; from READ
/// COMMITTED the same signal reaches the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_in_a_snapshot_transaction_is_refused_naming_the_level() -> TestResult {
    let mut app = App::new().await?;
    let mut registry = Registry::new();
    registry.register("waiter", |ctx: Ctx, token: String| async move {
        ctx.wait_signal::<u32>(&token, None).await
    })?;
    let options = app.h.fast_options();
    for (n, (level, name)) in SNAPSHOT_LEVELS.into_iter().enumerate() {
        let (id, token) = (format!("w-{n}"), format!("tok-{n}"));
        let tx = snapshot_at(&mut app.client, level).await?;
        app.keiro.start("waiter", &id, &token).await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        let row = app
            .keiro
            .instance(("waiter", id.as_str()))
            .await?
            .expect("row");
        assert_eq!(row.status, Status::Suspended, "parked on the wait");

        let sent = app.keiro.signal_in(&tx, &token, &7u32).await;
        assert!(isolation_refused(&sent, name), "{name}: {sent:?}");
        let message = keiro::workflow::error_chain(&sent.expect_err("refused"));
        assert!(message.contains(name), "{message}");
        // Nothing was sent, and the transaction is still good for the caller's own rows.
        tx.execute("INSERT INTO orders VALUES ($1)", &[&id]).await?;
        tx.commit().await?;
        let buffered = format!("SELECT count(*) FROM {}.signal_buffer", app.schema());
        assert_eq!(app.count(&buffered).await?, 0, "{name}");

        let tx = app.client.transaction().await?;
        assert_eq!(
            app.keiro.signal_in(&tx, &token, &7u32).await?,
            SignalSendOutcome::Delivered {
                to: InstanceKey::parse("waiter", &id)?
            }
        );
        tx.commit().await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        let row = app
            .keiro
            .instance(("waiter", id.as_str()))
            .await?
            .expect("row");
        assert_eq!(
            (row.status, row.output),
            (Status::Completed, Some(serde_json::json!(7))),
            "{name}"
        );
    }
    Ok(())
}

/// A cancel reads the tree it cascades to, and the remote tasks and awakeables it closes,
/// after taking the instance's lock: from an older snapshot it would miss a child spawned
/// since. It is refused at REPEATABLE READ and SERIALIZABLE, as the send is, and works from
/// READ COMMITTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_a_snapshot_transaction_is_refused_naming_the_level() -> TestResult {
    let mut app = App::new().await?;
    app.keiro.start("gate", "g-1", &()).await?;
    for (level, name) in SNAPSHOT_LEVELS {
        let tx = snapshot_at(&mut app.client, level).await?;
        let plain = app.keiro.cancel_in(&tx, ("gate", "g-1")).await;
        assert!(isolation_refused(&plain, name), "{name}: {plain:?}");
        let cascade = app.keiro.cancel_cascade_in(&tx, ("gate", "g-1")).await;
        assert!(isolation_refused(&cascade, name), "{name}: {cascade:?}");
        tx.execute("INSERT INTO orders VALUES ($1)", &[&name])
            .await?;
        tx.commit().await?;
        let row = app.keiro.instance(("gate", "g-1")).await?.expect("row");
        assert_eq!(row.status, Status::Running, "{name}");
    }
    let tx = app.client.transaction().await?;
    assert_eq!(
        app.keiro.cancel_in(&tx, ("gate", "g-1")).await?,
        CancelOutcome::Recorded
    );
    tx.commit().await?;
    Ok(())
}

/// Starts, deliveries and awakeable settlements work at REPEATABLE READ and SERIALIZABLE: each
/// locks the row it changes (the instance's, the awakeable's) before it reads it, and a row
/// that changed after the caller's snapshot is a serialization failure (retryable), never a
/// stale answer. Retried in a fresh transaction, the call then lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_deliveries_and_awakeables_work_in_snapshot_transactions() -> TestResult {
    let mut app = App::new().await?;
    let ids = Arc::new(Mutex::new(Vec::<Uuid>::new()));
    let mut registry = Registry::new();
    registry.register("gate", |ctx: Ctx, (): ()| async move {
        ctx.await_step::<u32>("open").await
    })?;
    let seen = ids.clone();
    registry.register("approver", move |ctx: Ctx, (): ()| {
        let seen = seen.clone();
        async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            seen.lock().expect("lock").push(approval.id());
            approval.value().await
        }
    })?;
    let options = app.h.fast_options();
    let done = |keiro: Keiro, name: &'static str, id: String| async move {
        let row = keiro.instance((name, id.as_str())).await?.expect("row");
        Ok::<_, Error>((row.status, row.output))
    };
    for (n, (level, name)) in SNAPSHOT_LEVELS.into_iter().enumerate() {
        // A start commits and runs.
        let id = format!("g-{n}");
        let tx = snapshot_at(&mut app.client, level).await?;
        assert!(app.keiro.start_in(&tx, "gate", &id, &()).await?.created);
        tx.commit().await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        assert_eq!(
            done(app.keiro.clone(), "gate", id.clone()).await?.0,
            Status::Suspended,
            "{name}"
        );
        // A start of an id another transaction started after the snapshot is a serialization
        // failure, not a second `created`.
        let other = format!("o-{n}");
        let tx = snapshot_at(&mut app.client, level).await?;
        app.keiro.start("gate", &other, &()).await?;
        let again = app.keiro.start_in(&tx, "gate", &other, &()).await;
        assert!(
            matches!(&again, Err(Error::Store(e)) if e.is_retryable()),
            "{name}: {again:?}"
        );
        tx.rollback().await?;
        let tx = snapshot_at(&mut app.client, level).await?;
        assert!(!app.keiro.start_in(&tx, "gate", &other, &()).await?.created);
        tx.rollback().await?;

        // A delivery to a run that parked after the snapshot is a serialization failure...
        let late = format!("late-{n}");
        app.keiro.start("gate", &late, &()).await?;
        let tx = snapshot_at(&mut app.client, level).await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        let stale = app
            .keiro
            .deliver_in(&tx, ("gate", late.as_str()), "open", &1u32)
            .await;
        assert!(
            matches!(&stale, Err(Error::Store(e)) if e.is_retryable()),
            "{name}: {stale:?}"
        );
        tx.rollback().await?;
        // ... and lands from a snapshot taken after the park, waking the run.
        for target in [&id, &late] {
            let tx = snapshot_at(&mut app.client, level).await?;
            assert_eq!(
                app.keiro
                    .deliver_in(&tx, ("gate", target.as_str()), "open", &1u32)
                    .await?,
                AppendOutcome::Appended,
                "{name}"
            );
            tx.commit().await?;
        }
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        for target in [&id, &late] {
            assert_eq!(
                done(app.keiro.clone(), "gate", target.clone()).await?,
                (Status::Completed, Some(serde_json::json!(1))),
                "{name}"
            );
        }

        // An awakeable settled from a snapshot that sees it pending.
        let approver = format!("a-{n}");
        app.keiro.start("approver", &approver, &()).await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        let id = *ids.lock().expect("lock").last().expect("an awakeable");
        let tx = snapshot_at(&mut app.client, level).await?;
        assert_eq!(
            app.keiro.complete_awakeable_in(&tx, id, "yes").await?,
            AwakeableOutcome::Delivered,
            "{name}"
        );
        tx.commit().await?;
        keiro::worker::resume_once(&app.h.store, &registry, &options).await?;
        assert_eq!(
            done(app.keiro.clone(), "approver", approver).await?,
            (Status::Completed, Some(serde_json::json!("yes"))),
            "{name}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_on_a_queue_in_a_transaction_waits_for_admission_once_committed() -> TestResult {
    use keiro::queue::{DedupPolicy, QueueRefusal, QueueSpec, StartOptions};
    let mut app = App::new().await?;
    app.keiro
        .declare_queue(&QueueSpec::new("q")?.dedup(DedupPolicy::Refuse))
        .await?;
    let options = StartOptions::on_queue("q")
        .key("acme")
        .dedup_id("invoice-7");

    let tx = app.client.transaction().await?;
    let started = app
        .keiro
        .start_in_with(&tx, "order", "o-1", &1, &options)
        .await?;
    assert!(started.created);
    assert_eq!(started.instance.queue.as_deref(), Some("q"));
    // The dedup id is held within the transaction already.
    let twice = app
        .keiro
        .start_in_with(&tx, "order", "o-2", &2, &options)
        .await
        .expect_err("a duplicate");
    assert_eq!(
        twice.queue_refusal(),
        Some(&QueueRefusal::Duplicate {
            holder: InstanceKey::parse("order", "o-1")?
        })
    );
    tx.rollback().await?;
    assert!(app.keiro.instance(("order", "o-1")).await?.is_none());

    let tx = app.client.transaction().await?;
    app.keiro
        .start_in_with(&tx, "order", "o-1", &1, &options)
        .await?;
    let unknown = app
        .keiro
        .start_in_with(&tx, "order", "o-3", &3, &StartOptions::on_queue("nope"))
        .await
        .expect_err("unknown queue");
    assert_eq!(unknown.queue_refusal(), Some(&QueueRefusal::Unknown));
    tx.commit().await?;
    let row = app
        .keiro
        .instance(("order", "o-1"))
        .await?
        .expect("committed");
    assert_eq!(row.queue_key.as_deref(), Some("acme"));
    // Not claimable the ordinary way: it waits for a worker serving the queue.
    assert!(app.h.store.instances_runnable(None, None).await?.is_empty());
    let info = app.keiro.queue("q").await?.expect("declared");
    assert_eq!(info.waiting, 1);
    Ok(())
}
