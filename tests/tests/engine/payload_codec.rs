//! Payload encryption end to end (`KeiroBuilder::codec`): a run that carries a marker string in
//! every kind of payload completes, and plain SQL over every table finds the marker nowhere;
//! runs complete across a key rotation; a store read with the wrong key is a typed error naming
//! the key id; a remote worker without the key refuses the task, naming the key id, and one
//! with it completes it. Both stores.

use std::sync::Arc;
use std::time::Duration;

use keiro::codec::{AesGcmCodec, Codec};
use keiro::remote::{RemoteOptions, RemoteWorker, RemoteWorkerOptions, TaskContext, TaskError};
use keiro::workflow::UpdateCall;
use keiro::{Ctx, Keiro, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, Backend, FastWorker, Harness, TestResult};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

on_both_stores!(
    a_marker_in_every_kind_of_payload_never_reaches_a_table,
    runs_complete_across_a_key_rotation,
    a_wrong_key_is_a_typed_error_naming_the_key_id,
    a_remote_worker_without_the_key_refuses_the_task_and_one_with_it_runs_it,
    writes_in_the_callers_transaction_are_sealed_too,
    reencryption_moves_every_payload_of_a_run_to_the_current_key,
    search_attributes_work_under_the_codec_and_stay_readable,
);

/// The string every payload carries.
const MARKER: &str = "ZEBRA-MARKER-7f3a";

const TIMEOUT: Duration = Duration::from_secs(30);

fn codec(kid: &str, key: u8) -> Arc<dyn Codec> {
    Arc::new(AesGcmCodec::new(kid, [key; 32]).expect("a valid key id"))
}

/// A handle over the harness's store (its schema or file) that seals with `codec`.
fn sealed(h: &Harness, codec: Arc<dyn Codec>) -> Keiro {
    match (&h.db, &h.sqlite) {
        (Some(db), _) => Keiro::builder(db.store())
            .codec(codec)
            .without_push()
            .build(),
        (None, Some(store)) => Keiro::builder(store.clone())
            .codec(codec)
            .without_push()
            .build(),
        (None, None) => unreachable!("a harness has a schema or a file"),
    }
}

/// Every table's every row as text: PostgreSQL's row-to-text cast, SQLite's column values.
async fn every_row(h: &Harness) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut rows = Vec::new();
    match h.backend {
        Backend::Postgres => {
            let db = h.db.as_ref().expect("a schema");
            let (client, connection) =
                tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            let tables = client
                .query(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
                    &[&db.schema()],
                )
                .await?;
            assert!(tables.len() > 10, "the schema's tables are listed");
            for table in tables {
                let table: String = table.get(0);
                let sql = format!("SELECT t::text FROM \"{}\".\"{table}\" t", db.schema());
                for row in client.query(sql.as_str(), &[]).await? {
                    rows.push(format!("{table}: {}", row.get::<_, String>(0)));
                }
            }
        }
        Backend::Sqlite => {
            let dir = h.sqlite_dir.as_ref().expect("a file");
            let conn = rusqlite::Connection::open(dir.file())?;
            let mut list = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
            let tables: Vec<String> = list
                .query_map([], |row| row.get(0))?
                .collect::<Result<_, _>>()?;
            assert!(tables.len() > 10, "the file's tables are listed");
            for table in tables {
                let mut select = conn.prepare(&format!("SELECT * FROM \"{table}\""))?;
                let columns = select.column_count();
                let mut found = select.query([])?;
                while let Some(row) = found.next()? {
                    let mut text = format!("{table}:");
                    for i in 0..columns {
                        match row.get_ref(i)? {
                            rusqlite::types::ValueRef::Text(t)
                            | rusqlite::types::ValueRef::Blob(t) => {
                                text.push(' ');
                                text.push_str(&String::from_utf8_lossy(t));
                            }
                            other => text.push_str(&format!(" {other:?}")),
                        }
                    }
                    rows.push(text);
                }
            }
        }
    }
    Ok(rows)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Round {
    round: u32,
    text: String,
}

fn marked(what: &str) -> String {
    format!("{MARKER}-{what}")
}

/// Touches every kind of payload, checks each came back as it was sent, then continues as new
/// with a marked input; the second generation returns its input's text as the output.
async fn vault(ctx: Ctx, input: Round) -> Result<String, WorkflowError> {
    if input.round == 1 {
        return Ok(format!("{}-output", input.text));
    }
    let mut seen: Vec<String> = vec![input.text];
    seen.push(
        ctx.step("s", || async { Ok::<_, std::io::Error>(marked("step")) })
            .await?,
    );
    ctx.set_event("e", &marked("event")).await?;
    ctx.write_stream("st", &marked("stream")).await?;
    seen.push(ctx.child("echo", "echo-1", &marked("child")).await?);
    seen.push(ctx.wait_signal("tok-1", None).await?);
    let awakeable = ctx.awakeable::<String>("a").await?;
    ctx.set_event("awk", &awakeable.id()).await?;
    seen.push(awakeable.value().await?);
    let update = ctx.next_update::<String>("u").await?;
    seen.push(update.request.clone());
    ctx.reply(&update, &marked("reply")).await?;
    seen.push(ctx.await_step("d").await?);
    seen.push(
        ctx.remote("rem", &marked("remote"), &RemoteOptions::default())
            .await?,
    );
    for value in &seen {
        if !value.contains(MARKER) {
            return Err(WorkflowError::app(format!(
                "{value:?} came back without the marker"
            )));
        }
    }
    Err(ctx.continue_as_new(&Round {
        round: 1,
        text: marked("continued"),
    }))
}

async fn echo(_ctx: Ctx, text: String) -> Result<String, WorkflowError> {
    Ok(format!("{text}-out"))
}

fn remote_options() -> RemoteWorkerOptions {
    RemoteWorkerOptions {
        poll_interval: Duration::from_millis(20),
        ..RemoteWorkerOptions::default()
    }
}

/// Runs `worker` until the returned sender is dropped or sent to.
fn run_remote(worker: RemoteWorker) -> tokio::sync::oneshot::Sender<()> {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });
    stop
}

/// Runs `vault` to its end through `keiro` (every kind of payload), with a schedule and a
/// debounced start beside it.
async fn run_vault(keiro: &Keiro) -> TestResult {
    let worker = spawn_worker(
        keiro
            .worker()
            .fast()
            .register("vault", vault)
            .register("echo", echo)
            .build()?,
    );
    let remote = run_remote(
        keiro
            .remote_worker()?
            .options(remote_options())
            .handle("rem", |text: String, _task: TaskContext| async move {
                Ok::<_, TaskError>(format!("{text}-out"))
            })
            .build(),
    );
    let key = ("vault", "v-1");
    keiro
        .start(
            "vault",
            "v-1",
            &Round {
                round: 0,
                text: marked("input"),
            },
        )
        .await?;
    keiro.signal("tok-1", &marked("signal")).await?;
    keiro.deliver(key, "d", &marked("delivery")).await?;
    let id: Uuid = keiro
        .get_event(key, "awk", TIMEOUT)
        .await?
        .expect("the awakeable's id is announced");
    keiro.complete_awakeable(id, &marked("awakeable")).await?;
    let request = marked("update");
    let call = || UpdateCall::new("u", &request).id("u-1").timeout(TIMEOUT);
    let reply: String = keiro.update_with(key, call()).await?;
    assert_eq!(reply, marked("reply"));
    // A retry under the same id is the same update (its request sealed under a new nonce).
    let again: String = keiro.update_with(key, call()).await?;
    assert_eq!(again, marked("reply"));
    let output: String = keiro.result(key, TIMEOUT).await?;
    assert_eq!(output, format!("{}-output", marked("continued")));
    // Reads through the handle open what it sealed.
    let event: Option<String> = keiro.get_event(key, "e", Duration::ZERO).await?;
    assert_eq!(event, Some(marked("event")));
    // Starts that wait: a schedule's input, a debounced start's.
    keiro
        .schedule("nightly", "echo")
        .every(Duration::from_secs(3600))
        .input(&marked("schedule"))
        .save()
        .await?;
    keiro
        .debounce(
            "echo",
            "burst",
            &marked("debounced"),
            &keiro::queue::Debounce::new(Duration::from_secs(3600)),
        )
        .await?;
    let _ = remote.send(());
    worker.stop().await?;
    Ok(())
}

async fn a_marker_in_every_kind_of_payload_never_reaches_a_table(h: Harness) -> TestResult {
    let keiro = sealed(&h, codec("k1", 1));
    run_vault(&keiro).await?;
    let rows = every_row(&h).await?;
    assert!(
        rows.iter().any(|row| row.contains("vault")),
        "the dump holds the run's plain name"
    );
    let leaks: Vec<&String> = rows.iter().filter(|row| row.contains(MARKER)).collect();
    assert!(
        leaks.is_empty(),
        "the marker is stored in plain: {leaks:#?}"
    );
    Ok(())
}

async fn runs_complete_across_a_key_rotation(h: Harness) -> TestResult {
    // Started and half run under k1.
    let old = sealed(&h, codec("k1", 1));
    old.start("echo", "before", &marked("before")).await?;
    old.start(
        "vault",
        "rotating",
        &Round {
            round: 1,
            text: marked("rotating"),
        },
    )
    .await?;
    // Then the ring turns: k2 is current, k1 is kept to read the old payloads.
    let ring = AesGcmCodec::new("k2", [2; 32])?.with_old_key("k1", [1; 32])?;
    let keiro = sealed(&h, Arc::new(ring));
    keiro.start("echo", "after", &marked("after")).await?;
    let worker = keiro
        .worker()
        .fast()
        .register("vault", vault)
        .register("echo", echo)
        .build()?;
    worker.drain().await?;
    let before: String = keiro.result(("echo", "before"), TIMEOUT).await?;
    let after: String = keiro.result(("echo", "after"), TIMEOUT).await?;
    assert_eq!(before, format!("{}-out", marked("before")));
    assert_eq!(after, format!("{}-out", marked("after")));
    let rotated: String = keiro.result(("vault", "rotating"), TIMEOUT).await?;
    assert_eq!(rotated, format!("{}-output", marked("rotating")));
    // The outputs written after the rotation are sealed with k2.
    let raw = h.keiro.instance(("echo", "before")).await?.expect("row");
    let output = raw.output.expect("an output");
    assert_eq!(keiro::codec::sealed_key_id(&output), Some("k2"));
    let input = raw.input;
    assert_eq!(keiro::codec::sealed_key_id(&input), Some("k1"));
    Ok(())
}

async fn a_wrong_key_is_a_typed_error_naming_the_key_id(h: Harness) -> TestResult {
    let keiro = sealed(&h, codec("k1", 1));
    keiro.start("echo", "e-1", &marked("input")).await?;
    // The same id under another key: the read is refused, naming the id, never garbage.
    let wrong = sealed(&h, codec("k1", 9));
    let error = wrong
        .instance(("echo", "e-1"))
        .await
        .expect_err("a wrong key does not open the input");
    assert!(
        matches!(&error, keiro::Error::Store(e) if e.codec_key_id() == Some("k1")),
        "{error:?}"
    );
    assert!(chain(&error).contains("wrong key"), "{}", chain(&error));
    // An unknown key id likewise; and its worker never runs the body.
    let unknown = sealed(&h, codec("k7", 1));
    let error = unknown
        .instance(("echo", "e-1"))
        .await
        .expect_err("unknown key id");
    assert!(chain(&error).contains("\"k1\""), "{}", chain(&error));
    let worker = unknown.worker().fast().register("echo", echo).build()?;
    assert!(
        worker.drain().await.is_err() || {
            let row = h.keiro.instance(("echo", "e-1")).await?.expect("row");
            row.status != Status::Completed
        }
    );
    // Without a codec the row reads back sealed, and the handle with the key still runs it
    // (once the backoff the refused claim set has passed).
    let raw = h.keiro.instance(("echo", "e-1")).await?.expect("row");
    assert_eq!(keiro::codec::sealed_key_id(&raw.input), Some("k1"));
    let worker = spawn_worker(keiro.worker().fast().register("echo", echo).build()?);
    let out: String = keiro.result(("echo", "e-1"), TIMEOUT).await?;
    worker.stop().await?;
    assert_eq!(out, format!("{}-out", marked("input")));
    Ok(())
}

/// An error with its sources, as a log shows it.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// One remote step on `rem`, retried, returning its result.
async fn relay(ctx: Ctx, text: String) -> Result<String, WorkflowError> {
    let fast = keiro::Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
        .without_jitter();
    let options = RemoteOptions::default().retries(100, fast);
    ctx.remote("rem", &text, &options).await
}

async fn a_remote_worker_without_the_key_refuses_the_task_and_one_with_it_runs_it(
    h: Harness,
) -> TestResult {
    let keiro = sealed(&h, codec("k1", 1));
    keiro.start("relay", "r-1", &marked("task")).await?;
    let worker = keiro.worker().fast().register("relay", relay).build()?;
    worker.drain().await?;
    // A remote worker on the bare store: the task's input is sealed, and the attempt fails
    // naming the key id, retryable.
    let keyless = run_remote(
        RemoteWorker::builder(h.transport.clone())
            .options(remote_options())
            .handle("rem", |text: String, _task: TaskContext| async move {
                Ok::<_, TaskError>(text)
            })
            .build(),
    );
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let refused = loop {
        let tasks = h.keiro.remote_tasks(("relay", "r-1")).await?;
        if let Some(error) = tasks.first().and_then(|t| t.last_error.clone()) {
            break error;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keyless attempt is recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = keyless.send(());
    let text = refused.to_string();
    assert!(
        text.contains("payload_encrypted") && text.contains("k1"),
        "{text}"
    );
    // A remote worker built from the handle has the key and runs it.
    let with_key = run_remote(
        keiro
            .remote_worker()?
            .options(remote_options())
            .handle("rem", |text: String, _task: TaskContext| async move {
                Ok::<_, TaskError>(format!("{text}-done"))
            })
            .build(),
    );
    let spawned = spawn_worker(keiro.worker().fast().register("relay", relay).build()?);
    let out: String = keiro.result(("relay", "r-1"), TIMEOUT).await?;
    assert_eq!(out, format!("{}-done", marked("task")));
    let _ = with_key.send(());
    spawned.stop().await?;
    Ok(())
}

/// A transaction step that appends a stream item in its transaction, then awaits a delivery
/// and a signal; returns them all.
async fn ledger(ctx: Ctx, input: String) -> Result<String, WorkflowError> {
    use keiro::postgres::{write_stream_in, TransactionStep};
    let c = ctx.clone();
    let tx_value: String = ctx
        .transaction("book", move |tx| {
            let ctx = c.clone();
            Box::pin(async move {
                write_stream_in(&ctx, tx, "booked", &marked("stream-in"))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(marked("transaction"))
            })
        })
        .await?;
    let delivered: String = ctx.await_step("d").await?;
    let signalled: String = ctx.wait_signal("tok-in", None).await?;
    let awakeable = ctx.awakeable::<String>("a").await?;
    ctx.set_event("awk", &awakeable.id()).await?;
    let settled = awakeable.value().await?;
    Ok([input, tx_value, delivered, signalled, settled].join("|"))
}

async fn writes_in_the_callers_transaction_are_sealed_too(h: Harness) -> TestResult {
    if h.backend != Backend::Postgres {
        return Ok(()); // transaction steps and `*_in` calls are the Postgres store's own
    }
    let keiro = sealed(&h, codec("k1", 1));
    let db = h.db.as_ref().expect("a schema");
    let (mut client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let key = ("ledger", "l-1");
    let tx = client.transaction().await?;
    keiro
        .start_in(&tx, "ledger", "l-1", &marked("start-in"))
        .await?;
    tx.commit().await?;
    let worker = spawn_worker(keiro.worker().fast().register("ledger", ledger).build()?);
    let tx = client.transaction().await?;
    keiro
        .deliver_in(&tx, key, "d", &marked("deliver-in"))
        .await?;
    keiro.signal_in(&tx, "tok-in", &marked("signal-in")).await?;
    tx.commit().await?;
    let id: Uuid = keiro
        .get_event(key, "awk", TIMEOUT)
        .await?
        .expect("the awakeable's id is announced");
    let tx = client.transaction().await?;
    keiro
        .complete_awakeable_in(&tx, id, &marked("awakeable-in"))
        .await?;
    tx.commit().await?;
    let output: String = keiro.result(key, TIMEOUT).await?;
    worker.stop().await?;
    for part in [
        "start-in",
        "transaction",
        "deliver-in",
        "signal-in",
        "awakeable-in",
    ] {
        assert!(output.contains(&marked(part)), "{part} read back: {output}");
    }
    let items: Vec<(u64, String)> = {
        use futures_util::StreamExt;
        keiro
            .read_stream::<String>(key, "booked", 0)?
            .map(|item| item.expect("an item"))
            .collect()
            .await
    };
    assert_eq!(items, [(0, marked("stream-in"))]);
    let rows = every_row(&h).await?;
    let leaks: Vec<&String> = rows.iter().filter(|row| row.contains(MARKER)).collect();
    assert!(
        leaks.is_empty(),
        "the marker is stored in plain: {leaks:#?}"
    );
    Ok(())
}

async fn reencryption_moves_every_payload_of_a_run_to_the_current_key(h: Harness) -> TestResult {
    run_vault(&sealed(&h, codec("k1", 1))).await?;
    let ring = AesGcmCodec::new("k2", [2; 32])?.with_old_key("k1", [1; 32])?;
    let keiro = sealed(&h, Arc::new(ring));
    let mut rewritten = 0;
    for key in [("vault", "v-1"), ("echo", "echo-1")] {
        rewritten += keiro.reencrypt(key).await?;
    }
    assert!(rewritten > 10, "{rewritten} payloads rewritten");
    assert_eq!(keiro.reencrypt(("vault", "v-1")).await?, 0, "idempotent");
    // With k1 gone, the runs still read: every payload is k2's now.
    let only_new = sealed(&h, codec("k2", 2));
    let output: String = only_new.result(("vault", "v-1"), TIMEOUT).await?;
    assert_eq!(output, format!("{}-output", marked("continued")));
    assert!(only_new.journal(("vault", "v-1")).await?.len() > 10);
    only_new.journal(("echo", "echo-1")).await?;
    let old_key_rows: Vec<String> = every_row(&h)
        .await?
        .into_iter()
        .filter(|row| {
            row.contains("\"k1\"") && (row.starts_with("journal") || row.starts_with("workflow"))
        })
        .filter(|row| row.contains("v-1") || row.contains("echo-1"))
        .collect();
    assert!(
        old_key_rows.is_empty(),
        "rows still sealed with k1: {old_key_rows:#?}"
    );
    Ok(())
}

/// Sets a search attribute from its body, then returns its (sealed) input.
async fn tagged(ctx: Ctx, text: String) -> Result<String, WorkflowError> {
    ctx.set_attributes(&keiro::workflow::Attributes::new().with("stage", "tagged"))
        .await?;
    Ok(text)
}

/// Search attributes are not sealed (operators filter on them): under the codec a start's and
/// a body's attributes are written, listed and read back, and the run's payloads stay sealed.
async fn search_attributes_work_under_the_codec_and_stay_readable(h: Harness) -> TestResult {
    let keiro = sealed(&h, codec("k1", 1));
    let worker = keiro.worker().fast().register("tagged", tagged).build()?;
    let options = keiro::queue::StartOptions::default().attribute("customer", "acme");
    keiro
        .start_with("tagged", "t-1", &marked("tagged"), &options)
        .await?;
    worker.drain().await?;
    let output: String = keiro.result(("tagged", "t-1"), TIMEOUT).await?;
    assert_eq!(output, marked("tagged"));
    let request = keiro::operate::ListRequest::from_pairs([
        ("attr", "customer=acme"),
        ("attr", "stage=tagged"),
    ])?;
    let page = keiro.list(&request).await?;
    assert_eq!(page.instances.len(), 1);
    let attrs = keiro.attributes(("tagged", "t-1")).await?;
    assert_eq!(
        attrs.get("stage"),
        Some(&keiro::workflow::AttrValue::from("tagged"))
    );
    assert!(
        every_row(&h).await?.iter().all(|row| !row.contains(MARKER)),
        "the run's payloads stay sealed"
    );
    Ok(())
}
