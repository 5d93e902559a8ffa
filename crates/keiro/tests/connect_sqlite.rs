//! `Keiro::connect("sqlite:PATH")`: the zero-server entry point opens or creates the file,
//! migrates it, and gives a handle that runs workflows; opening it again finds them there.

use std::path::PathBuf;

use keiro::store::Database;
use keiro::{Ctx, Keiro, WorkflowError};

/// A fresh directory under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "keiro-connect-{test}-{}-{}",
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

async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
    ctx.step("compose", || async move {
        Ok::<_, std::io::Error>(format!("hello {name}"))
    })
    .await
}

#[tokio::test]
async fn a_sqlite_url_creates_migrates_and_runs_on_the_file(
) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("runs");
    let file = scratch.0.join("app.db");
    let url = format!("sqlite:{}", file.display());
    let keiro = Keiro::connect(url.as_str()).await?;
    assert!(file.exists(), "connect creates the file");
    let worker = keiro.worker().register("greet", greet).build()?;
    let line: String = worker.run_named("greet", "greet-1", &"ada").await?;
    assert_eq!(line, "hello ada");
    drop((worker, keiro));

    // Opened again (already migrated): the instance and its output are on the file.
    let again = Keiro::connect(url).await?;
    let key = keiro::InstanceKey::parse("greet", "greet-1")?;
    let instance = again
        .instance(&key)
        .await?
        .expect("the instance is on the file");
    assert_eq!(instance.status, keiro::Status::Completed);
    assert_eq!(instance.output, Some(serde_json::json!("hello ada")));
    Ok(())
}

#[tokio::test]
async fn a_parsed_database_and_a_sqlx_style_url_connect_alike(
) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("parsed");
    let file = scratch.0.join("parsed.db");
    let database: Database = format!("sqlite://{}", file.display()).parse()?;
    Keiro::connect(database).await?;
    assert!(file.exists());
    Ok(())
}

#[tokio::test]
async fn a_directory_is_refused_as_a_sqlite_error() {
    let scratch = Scratch::new("dir");
    let refused = Keiro::connect(format!("sqlite:{}", scratch.0.display())).await;
    assert!(
        matches!(refused, Err(keiro::Error::Sqlite(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn unknown_schemes_and_memory_files_are_typed_errors() {
    let unknown = Keiro::connect("mysql://root@127.0.0.1/app").await;
    assert!(
        matches!(&unknown, Err(keiro::Error::UnknownScheme { scheme }) if scheme == "mysql"),
        "{unknown:?}"
    );
    let memory = Keiro::connect("sqlite::memory:").await;
    assert!(
        matches!(memory, Err(keiro::Error::Unsupported { .. })),
        "{memory:?}"
    );
}
