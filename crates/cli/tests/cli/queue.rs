//! `keiro queue list|show|pause|resume` and `keiro list --queue`: what an operator sees of a
//! queue, and the pause that stops admission.

use std::process::{Command, Output};
use std::time::Duration;

use keiro::queue::{QueueSpec, Rate, StartOptions};
use keiro::Keiro;
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

fn keiro_cmd(db: &TestDb, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args(["--database-url", db.url(), "--schema", db.schema()])
        .args(args)
        .output()
}

fn stdout_of(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[tokio::test]
async fn queue_commands_show_limits_backlog_and_pause() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::builder(db.store()).without_push().build();
    let spec = QueueSpec::new("llm")?
        .concurrency(10)
        .key_rate(Rate::new(100, Duration::from_secs(60))?);
    keiro.declare_queue(&spec).await?;
    for (n, customer) in ["acme", "acme", "globex"].iter().enumerate() {
        let options = StartOptions::on_queue("llm").key(*customer);
        keiro
            .start_with("call", &format!("c-{n}"), &serde_json::json!(n), &options)
            .await?;
    }
    let later = StartOptions::on_queue("llm").delay(Duration::from_secs(3600));
    keiro
        .start_with("call", "later", &serde_json::json!(null), &later)
        .await?;
    keiro.start("other", "plain", &1).await?;

    let list = stdout_of(&keiro_cmd(&db, &["queue", "list"])?);
    assert!(
        list.contains("llm  concurrency 10, key rate 100/60s  waiting 4 (delayed 1)  running 0"),
        "{list}"
    );
    let show = stdout_of(&keiro_cmd(&db, &["queue", "show", "llm"])?);
    assert!(show.contains("key acme: 2 waiting, 0 running"), "{show}");
    assert!(show.contains("key globex: 1 waiting"), "{show}");
    assert!(show.contains("oldest waiting since 20"), "{show}");

    stdout_of(&keiro_cmd(&db, &["queue", "pause", "llm"])?);
    assert!(keiro.queue("llm").await?.expect("declared").paused);
    let paused = stdout_of(&keiro_cmd(&db, &["queue", "list"])?);
    assert!(paused.contains("llm [paused]"), "{paused}");
    stdout_of(&keiro_cmd(&db, &["queue", "resume", "llm"])?);
    assert!(!keiro.queue("llm").await?.expect("declared").paused);

    let unknown = keiro_cmd(&db, &["queue", "pause", "nope"])?;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nope"));
    let missing = keiro_cmd(&db, &["queue", "show", "nope"])?;
    assert!(!missing.status.success());

    let by_key = stdout_of(&keiro_cmd(
        &db,
        &["list", "--queue", "llm", "--queue-key", "acme"],
    )?);
    assert!(by_key.contains("c-0") && by_key.contains("c-1"), "{by_key}");
    assert!(
        !by_key.contains("c-2") && !by_key.contains("plain"),
        "{by_key}"
    );
    assert!(by_key.contains("[queue llm key acme]"), "{by_key}");
    let delayed = stdout_of(&keiro_cmd(&db, &["list", "--queue", "llm"])?);
    assert!(delayed.contains("delayed until"), "{delayed}");
    let key_alone = keiro_cmd(&db, &["list", "--queue-key", "acme"])?;
    assert!(!key_alone.status.success(), "a key needs its queue");
    Ok(())
}
