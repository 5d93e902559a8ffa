//! `keiro versions`, `keiro versions move` and the unserved-version warning of `keiro stats`,
//! on a PostgreSQL schema and on a SQLite file.

use std::path::PathBuf;
use std::process::{Command, Output};

use keiro::versions::{VersionStore, Versions, WorkerBeat};
use keiro::Keiro;
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

/// Runs `keiro` with `target` (`--database-url ...` and perhaps `--schema ...`) and `args`.
fn keiro_cmd(target: &[String], args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .env_remove("KEIRO_APP_VERSION")
        .args(target)
        .args(args)
        .output()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Two live runs of v1 and one of v2 (started by stores of those versions) and a live worker
/// of v2; then what the operator sees and does.
async fn check(target: &[String], v1: Keiro, v2: Keiro, versions: &dyn VersionStore) -> TestResult {
    v1.start("wf", "a", &1).await?;
    v1.start("wf", "b", &2).await?;
    v2.start("wf", "c", &3).await?;
    versions
        .worker_beat(&WorkerBeat {
            worker_id: "w-v2".into(),
            app_version: "v2".into(),
            serves: Versions::only(["v2"]),
            queues: Vec::new(),
        })
        .await?;

    let shown = keiro_cmd(target, &["versions"])?;
    let out = text(&shown);
    assert!(shown.status.success(), "{out}");
    let row = |v: &str| row_of(&out, v);
    let numbers = |line: String| -> Vec<String> {
        line.split_whitespace().skip(1).map(str::to_owned).collect()
    };
    assert_eq!(numbers(row("v1 ")), ["2", "0", "0", "0", "0", "0"], "{out}");
    assert_eq!(numbers(row("v2 ")), ["1", "0", "0", "0", "0", "1"], "{out}");
    assert!(
        out.contains("worker w-v2 (live) runs v2 serves v2"),
        "{out}"
    );
    assert!(
        out.contains("warning: 2 live run(s) of version v1 have no live worker serving it"),
        "{out}"
    );
    let stats = text(&keiro_cmd(target, &["stats"])?);
    assert!(stats.contains("version v1 have no live worker"), "{stats}");
    let json = keiro_cmd(target, &["stats", "--json"])?;
    let value: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(value["unserved"][0]["app_version"], "v1", "{value}");

    // --verify replays with the workflows of this binary: the keiro binary holds none of
    // these, so it refuses and moves nothing.
    let refused = keiro_cmd(target, &["versions", "move", "v1", "v2", "--verify"])?;
    let out = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{out}");
    assert!(out.contains("nothing moved: 2 run(s)"), "{out}");

    let moved = keiro_cmd(target, &["versions", "move", "v1", "v2"])?;
    let out = text(&moved);
    assert!(moved.status.success(), "{out}");
    assert!(out.contains("moved 2 live run(s) from v1 to v2"), "{out}");
    let out = text(&keiro_cmd(target, &["versions"])?);
    assert!(!out.contains("warning"), "{out}");
    assert_eq!(
        numbers(row_of(&out, "v2 ")),
        ["3", "0", "0", "0", "0", "1"],
        "{out}"
    );

    let bad = keiro_cmd(target, &["versions", "move", "v 1", "v2"])?;
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    Ok(())
}

fn row_of(out: &str, prefix: &str) -> String {
    out.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn versions_on_postgres() -> TestResult {
    let db = TestDb::new().await;
    let store = |version: &str| {
        let config = keiro::postgres::Config {
            app_version: version.to_owned(),
            ..db.config()
        };
        keiro::postgres::PgStore::connect(config)
    };
    let (s1, s2) = (store("v1").await?, store("v2").await?);
    let target = vec![
        "--database-url".to_owned(),
        db.url().to_owned(),
        "--schema".to_owned(),
        db.schema().to_owned(),
    ];
    let v1 = Keiro::builder(s1).without_push().build();
    let v2 = Keiro::builder(s2.clone()).without_push().build();
    check(&target, v1, v2, &s2).await
}

#[tokio::test]
async fn versions_on_a_sqlite_file() -> TestResult {
    let dir = std::env::temp_dir().join(format!(
        "keiro-cli-versions-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    let file: PathBuf = dir.join("versions.db");
    let store = |version: &str| {
        let config = keiro::store::sqlite::Config {
            app_version: version.to_owned(),
            ..keiro::store::sqlite::Config::default()
        };
        keiro::store::sqlite::SqliteStore::open(&file, config)
    };
    let (s1, s2) = (store("v1")?, store("v2")?);
    let target = vec![
        "--database-url".to_owned(),
        format!("sqlite:{}", file.display()),
    ];
    let v1 = Keiro::builder(s1).without_push().build();
    let v2 = Keiro::builder(s2.clone()).without_push().build();
    let result = check(&target, v1, v2, &s2).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
