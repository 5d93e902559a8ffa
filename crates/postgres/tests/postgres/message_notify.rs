//! Events and streams notify `msg:<name>/<id>` at commit (message.sql), which another store's
//! listener routes to the readers of that instance only; a stream's first item marks its
//! instance awaited, so the run's close notifies `done:` and its readers end at once.

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
async fn writes_notify_their_instances_readers_in_another_process() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    // Another process's store on the same schema, with a reader of `order/o-1`.
    let other = PgStore::connect(db.config()).await?;
    let mut reader = other.subscribe_messages(&key("order", "o-1"));
    // Its listener's first connection wakes it once; drained before anything is written.
    while reader.wait(QUIET).await != WakeReason::Timeout {}
    let mut listener = Listener::on(&store).await?;
    for id in ["o-1", "o-2"] {
        store
            .instance_start(&start(&key("order", id), json!(null)))
            .await?;
    }
    listener.drain(QUIET).await;
    let channel = store.wake_channel().to_owned();

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

    // Another instance's write does not wake this reader.
    let item = write("o-2", "stream:log#1", StepKind::Stream, json!(1));
    let bounds = StreamWrite {
        key: "log".into(),
        items_max: 10,
        bytes_max: 1 << 20,
    };
    assert_eq!(
        store.stream_write(&item, &bounds).await?,
        StreamOutcome::Append(AppendOutcome::Appended)
    );
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "msg:order/o-2".to_owned())]
    );
    assert_eq!(reader.wait(QUIET).await, WakeReason::Timeout);

    // The stream's first item marked o-2 awaited: its close notifies `done:`, with no waiter.
    let close = Append::external(
        key("order", "o-2"),
        Event::WorkflowCompleted { output: json!(1) },
    );
    store.journal_append(&close).await?;
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "done:order/o-2".to_owned())]
    );
    // A refused write notifies nothing.
    let late = write("o-2", "stream:log#2", StepKind::Stream, json!(2));
    assert!(matches!(
        store.stream_write(&late, &bounds).await?,
        StreamOutcome::Append(AppendOutcome::RefusedTerminal(_))
    ));
    assert!(listener.drain(QUIET).await.is_empty());
    Ok(())
}
