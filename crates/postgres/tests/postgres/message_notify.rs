//! Events and streams of a watched instance notify `msg:<name>/<id>` at commit (message.sql),
//! which another store's listener routes to the readers of that instance only. An instance is
//! watched once a reader elsewhere marked it (migration 0023), which also makes its close
//! notify `done:`; an unwatched run's writes send no NOTIFY.

use std::time::Duration;

use crate::common::{key, start, Listener, TestResult};
use keiro_journal::store::{StreamOutcome, StreamWrite};
use keiro_journal::{Append, AppendOutcome, Event, JournalStore, StepKind};
use keiro_postgres::PgStore;
use keiro_resume::{Notifier, WakeReason};
use keiro_tests::pg::TestDb;
use serde_json::json;

const QUIET: Duration = Duration::from_millis(150);

fn write(id: &str, step: &str, kind: StepKind, value: serde_json::Value) -> Append {
    Append::external(
        key("order", id),
        Event::StepRecorded {
            step: step.into(),
            kind,
            result: value,
        },
    )
}

#[tokio::test]
async fn writes_notify_only_instances_a_reader_elsewhere_watches() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for id in ["o-1", "o-2"] {
        store
            .instance_start(&start(&key("order", id), json!(null)))
            .await?;
    }
    let mut listener = Listener::on(&store).await?;
    let channel = store.wake_channel().to_owned();

    // Nobody elsewhere reads o-2: its writes send no NOTIFY, nor does its close.
    let bounds = StreamWrite {
        key: "log".into(),
        items_max: 10,
        bytes_max: 1 << 20,
    };
    let item = write("o-2", "stream:log#1", StepKind::Stream, json!(1));
    assert_eq!(
        store.stream_write(&item, &bounds).await?,
        StreamOutcome::Append(AppendOutcome::Appended)
    );
    let close = Append::external(
        key("order", "o-2"),
        Event::WorkflowCompleted { output: json!(1) },
    );
    store.journal_append(&close).await?;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "an unwatched run writes silently"
    );

    // Another process's store reads o-1: not woken in its own process for a second, the
    // reader marks it watched and reads again.
    let other = PgStore::connect(db.config()).await?;
    let mut reader = other.subscribe_messages(&key("order", "o-1"));
    while reader.wait(QUIET).await != WakeReason::Timeout {}
    // Unwoken for `WATCH_AFTER` (1 s), it marks the instance and answers at once.
    assert_eq!(
        reader.wait(Duration::from_secs(30)).await,
        WakeReason::Notified
    );
    let set = write("o-1", "event:stage#1", StepKind::Event, json!("paid"));
    assert_eq!(
        store.event_set(&set, "stage").await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "msg:order/o-1".to_owned())]
    );
    assert_eq!(
        reader.wait(Duration::from_secs(30)).await,
        WakeReason::Notified
    );
    // A refused write notifies nothing; the close of a watched run notifies `done:`.
    let late = write("o-2", "stream:log#2", StepKind::Stream, json!(2));
    assert!(matches!(
        store.stream_write(&late, &bounds).await?,
        StreamOutcome::Append(AppendOutcome::RefusedTerminal(_))
    ));
    assert!(listener.drain(QUIET).await.is_empty());
    let close = Append::external(
        key("order", "o-1"),
        Event::WorkflowCompleted { output: json!(1) },
    );
    store.journal_append(&close).await?;
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "done:order/o-1".to_owned())]
    );
    assert_eq!(
        reader.wait(Duration::from_secs(30)).await,
        WakeReason::Notified
    );
    Ok(())
}

/// An update's answer (update.sql) notifies a watched instance's readers as an event's write
/// does: a caller waiting in another process is woken by the answer, not by its fallback poll.
#[tokio::test]
async fn an_update_answer_notifies_a_watched_instance() -> TestResult {
    use keiro_journal::update::{UpdateAnswer, UpdateAnswerOutcome, UpdateSend};

    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "o-3");
    store.instance_start(&start(&k, json!(null))).await?;
    let send = UpdateSend {
        key: k.clone(),
        name: "approve".into(),
        id: "u-1".into(),
        request: json!(1),
        start: None,
    };
    store.update_send(&send).await?;
    let mut listener = Listener::on(&store).await?;
    let channel = store.wake_channel().to_owned();

    let other = PgStore::connect(db.config()).await?;
    let mut caller = other.subscribe_messages(&k);
    while caller.wait(QUIET).await != WakeReason::Timeout {}
    assert_eq!(
        caller.wait(Duration::from_secs(30)).await,
        WakeReason::Notified,
        "the caller marks the instance watched"
    );
    let answer = write(
        "o-3",
        "update:approve#u-1",
        StepKind::Update,
        json!({"ok": 2}),
    );
    let outcome = store
        .update_answer(
            &answer,
            &UpdateAnswer {
                name: "approve".into(),
                id: "u-1".into(),
                rejected: false,
            },
        )
        .await?;
    assert_eq!(
        outcome,
        UpdateAnswerOutcome::Append(AppendOutcome::Appended)
    );
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel, "msg:order/o-3".to_owned())]
    );
    assert_eq!(
        caller.wait(Duration::from_secs(30)).await,
        WakeReason::Notified
    );
    Ok(())
}

/// A caller waiting for an event's value elsewhere (`Keiro::get_event`) marks the instance
/// watched after 50 ms without a wake from its own process, not after the second a stream's
/// reader gives its run: its first wait of 150 ms ends with the mark, where a stream reader's
/// times out; the run's next write then notifies it.
#[tokio::test]
async fn an_event_waiter_elsewhere_marks_its_instance_within_its_first_wait() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for id in ["o-1", "o-2"] {
        store
            .instance_start(&start(&key("order", id), json!(null)))
            .await?;
    }
    let mut listener = Listener::on(&store).await?;
    let channel = store.wake_channel().to_owned();
    let other = PgStore::connect(db.config()).await?;

    // A stream's reader first, to have the other store's listener connected (its first wake
    // is the connection's) before the event waiter subscribes.
    let mut stream_reader = other.subscribe_messages(&key("order", "o-2"));
    while stream_reader.wait(QUIET).await != WakeReason::Timeout {}

    let mut waiter = other.subscribe_event(&key("order", "o-1"));
    assert_eq!(waiter.wait(QUIET).await, WakeReason::Notified);
    let watched: bool = crate::common::sql(&store)
        .await?
        .query_one(
            "SELECT watched FROM workflows WHERE workflow_name = 'order' AND workflow_id = 'o-1'",
            &[],
        )
        .await?
        .get(0);
    assert!(watched, "the waiter's first wait marked its instance");
    let set = write("o-1", "event:stage#1", StepKind::Event, json!("paid"));
    assert_eq!(
        store.event_set(&set, "stage").await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "msg:order/o-1".to_owned())]
    );
    assert_eq!(
        waiter.wait(Duration::from_secs(30)).await,
        WakeReason::Notified
    );
    Ok(())
}
