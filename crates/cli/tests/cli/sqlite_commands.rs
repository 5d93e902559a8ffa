//! The operator commands on a SQLite file (`--database-url sqlite:PATH`): migrate creates it,
//! list, show, stats, gc, schedule list and cancel read and change it through the same facade
//! calls as on PostgreSQL, and the PostgreSQL-only commands say so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keiro::{Ctx, Keiro, WorkflowError};

/// A fresh directory under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "keiro-cli-{test}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("the temporary directory is writable");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `keiro` on the SQLite file at `file` with `args`, with no database in the environment.
fn keiro(file: &Path, args: &[&str]) -> std::io::Result<(Output, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .arg("--database-url")
        .arg(format!("sqlite:{}", file.display()))
        .args(args)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output, text))
}

async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
    ctx.step("compose", || async move {
        Ok::<_, std::io::Error>(format!("hello {name}"))
    })
    .await
}

#[tokio::test]
async fn operator_commands_work_on_a_sqlite_file() -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("ops");
    let file = scratch.0.join("ops.db");

    // An operator command does not create a file a typo named.
    let (missing, text) = keiro(&file, &["list"])?;
    assert_eq!(missing.status.code(), Some(2), "{text}");
    assert!(
        text.contains("no SQLite file at") && text.contains("keiro migrate"),
        "{text}"
    );
    assert!(!file.exists());

    let (migrated, text) = keiro(&file, &["migrate"])?;
    assert!(migrated.status.success(), "{text}");
    assert!(text.contains("created: schema version"), "{text}");
    let (again, text) = keiro(&file, &["migrate"])?;
    assert!(
        again.status.success() && text.contains("migrated: schema version"),
        "{text}"
    );

    // One completed instance and one still running, written through the facade.
    let handle = Keiro::connect(format!("sqlite:{}", file.display()).as_str()).await?;
    let worker = handle.worker().register("greet", greet).build()?;
    let line: String = worker.run_named("greet", "greet-1", &"ada").await?;
    assert_eq!(line, "hello ada");
    handle.start("greet", "greet-2", &"bob").await?;
    drop((worker, handle));

    let (list, text) = keiro(&file, &["list"])?;
    assert!(list.status.success(), "{text}");
    assert!(
        text.contains("greet-1") && text.contains("greet-2"),
        "{text}"
    );
    let (list, text) = keiro(&file, &["list", "--status", "completed"])?;
    assert!(
        list.status.success() && text.contains("greet-1") && !text.contains("greet-2"),
        "{text}"
    );

    let (show, text) = keiro(&file, &["show", "greet", "greet-1"])?;
    assert!(show.status.success(), "{text}");
    assert!(
        text.contains("compose") && text.contains("hello ada"),
        "{text}"
    );
    let (absent, text) = keiro(&file, &["show", "greet", "nobody"])?;
    assert_eq!(absent.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("in sqlite file {}", file.display())),
        "{text}"
    );

    let (stats, text) = keiro(&file, &["stats", "--json"])?;
    assert!(stats.status.success(), "{text}");
    assert!(text.contains("greet"), "{text}");

    let (gc, text) = keiro(&file, &["gc", "--older-than", "30d", "--dry-run"])?;
    assert!(gc.status.success(), "{text}");

    let (schedules, text) = keiro(&file, &["schedule", "list"])?;
    assert!(schedules.status.success(), "{text}");
    assert!(text.contains("no schedules in sqlite file"), "{text}");

    let (cancel, text) = keiro(&file, &["cancel", "greet", "greet-2"])?;
    assert!(cancel.status.success(), "{text}");
    let (list, text) = keiro(&file, &["list", "--status", "cancelled"])?;
    assert!(list.status.success() && text.contains("greet-2"), "{text}");
    Ok(())
}

#[test]
fn postgres_only_commands_say_so_on_a_sqlite_file() -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("pgonly");
    let file = scratch.0.join("pg-only.db");
    // `bench --mode throughput` and `direct` run on SQLite; the other modes measure the
    // PostgreSQL store alone.
    let (bench, text) = keiro(&file, &["bench", "--mode", "idle"])?;
    assert_eq!(bench.status.code(), Some(2), "{text}");
    assert!(
        text.contains("keiro bench works on PostgreSQL only"),
        "{text}"
    );
    assert!(!file.exists(), "a refused command creates no file");
    Ok(())
}

#[test]
fn an_unknown_scheme_is_refused_naming_the_schemes() -> Result<(), Box<dyn std::error::Error>> {
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .args(["--database-url", "mysql://root:secret@db/app", "list"])
        .output()?;
    let text = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(
        text.contains("sqlite:PATH") && !text.contains("secret"),
        "{text}"
    );
    Ok(())
}

/// Kills the dashboard process however the test ends.
struct Serving(std::process::Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_dashboard_serves_a_sqlite_file() -> Result<(), Box<dyn std::error::Error>> {
    use std::io::BufRead;
    let scratch = Scratch::new("ui");
    let file = scratch.0.join("ui.db");
    let handle = Keiro::connect(format!("sqlite:{}", file.display()).as_str()).await?;
    handle.start("greet", "greet-ui", &"eve").await?;
    drop(handle);

    let mut child = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_UI_TOKEN")
        .arg("--database-url")
        .arg(format!("sqlite:{}", file.display()))
        .args(["ui", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let _serving = Serving(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let address = line
        .trim()
        .strip_prefix("keiro ui listening on ")
        .ok_or_else(|| format!("unexpected first line {line:?}"))?
        .to_owned();
    let instances: serde_json::Value = reqwest::get(format!("{address}/api/v1/instances"))
        .await?
        .error_for_status()?
        .json()
        .await?;
    assert!(instances.to_string().contains("greet-ui"), "{instances}");
    Ok(())
}

/// Doubles the amounts it is asked to approve, rejecting those over 100, until one passes.
async fn approve(ctx: Ctx, (): ()) -> Result<u32, WorkflowError> {
    loop {
        let update = ctx.next_update::<u32>("approve").await?;
        if update.request > 100 {
            ctx.reject(&update, "over the limit").await?;
            continue;
        }
        ctx.reply(&update, &(update.request * 2)).await?;
        return Ok(update.request);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_is_sent_and_answered_through_the_cli() -> Result<(), Box<dyn std::error::Error>>
{
    let scratch = Scratch::new("update");
    let file = scratch.0.join("update.db");
    let (migrated, text) = keiro(&file, &["migrate"])?;
    assert!(migrated.status.success(), "{text}");
    let handle = Keiro::connect(format!("sqlite:{}", file.display()).as_str()).await?;
    handle.start("approve", "a-1", &()).await?;
    let worker = handle.worker().register("approve", approve).build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    let cli = |args: &'static [&'static str]| {
        let file = file.clone();
        tokio::task::spawn_blocking(move || keiro(&file, args))
    };

    let (rejected, text) = cli(&["update", "approve", "a-1", "approve", "500"]).await??;
    assert_eq!(rejected.status.code(), Some(1), "{text}");
    assert!(text.contains("over the limit"), "{text}");
    let args = &[
        "update",
        "approve",
        "a-1",
        "approve",
        "21",
        "--update-id",
        "u-1",
    ];
    let (answered, text) = cli(args).await??;
    assert!(answered.status.success(), "{text}");
    assert_eq!(String::from_utf8_lossy(&answered.stdout).trim(), "42");
    // The same id again, after the run ended: the same answer.
    let (again, text) = cli(args).await??;
    assert!(again.status.success(), "{text}");
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), "42");
    let (show, text) = cli(&["show", "approve", "a-1"]).await??;
    assert!(show.status.success(), "{text}");
    assert!(
        text.contains("updates 2") && text.contains("u-1") && text.contains("replied 42"),
        "{text}"
    );
    assert!(text.contains("rejected: over the limit"), "{text}");
    let (finished, text) = cli(&["update", "approve", "a-1", "approve", "1"]).await??;
    assert_eq!(finished.status.code(), Some(1), "{text}");
    let (bad, text) = cli(&["update", "approve", "a-1", "approve", "{not json"]).await??;
    assert_eq!(bad.status.code(), Some(2), "{text}");
    let _ = stop.send(());
    running.await?;
    Ok(())
}
