//! A rolling deploy: the runs a build starts stay on that build. Two builds, `v1` and `v2`,
//! share one database (here a SQLite file in a temporary directory). A run started by v1 is
//! driven only by v1's worker, even while v2's is idle; once v1's workers are gone, an operator
//! hands v1's live runs to v2 (`keiro versions move v1 v2`, here `Keiro::versions_move`) and
//! v2 finishes them. In production each build gets its version from `KEIRO_APP_VERSION`.

use keiro::store::sqlite::{Config, SqliteStore};
use keiro::{Ctx, Keiro, Status, WorkflowError};

/// The same workflow in both builds; each says which build ran its step.
fn order(
    build: &'static str,
) -> impl Fn(
    Ctx,
    u32,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<String, WorkflowError>> + Send>,
> + Clone
       + Send
       + Sync
       + 'static {
    move |ctx: Ctx, n: u32| {
        Box::pin(async move {
            ctx.step("ship", || async move {
                Ok::<_, std::io::Error>(format!("order {n} shipped by {build}"))
            })
            .await
        })
    }
}

/// A handle of build `version` on the database at `path`.
fn build(path: &std::path::Path, version: &str) -> Result<Keiro, Box<dyn std::error::Error>> {
    let config = Config {
        app_version: version.to_owned(),
        ..Config::default()
    };
    Ok(Keiro::builder(SqliteStore::open(path, config)?).build())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("keiro-deploy-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("keiro.db");
    let (v1, v2) = (build(&path, "v1")?, build(&path, "v2")?);
    let old = v1.worker().register("order", order("v1")).build()?;
    let new = v2.worker().register("order", order("v2")).build()?;

    v1.start("order", "o-1", &1).await?;
    v2.start("order", "o-2", &2).await?;
    new.drain().await?; // v2 runs its own order and leaves v1's alone
    let o1 = v1.instance(("order", "o-1")).await?.expect("started");
    assert_eq!(o1.status, Status::Running);
    println!("o-1 (started by {:?}) waits for v1", o1.app_version);

    v1.start("order", "o-3", &3).await?;
    old.drain().await?; // v1 finishes what it started
    let moved = v2.versions_move("v1", "v2").await?;
    println!("v1's workers finished their runs; {moved} live run(s) left to hand over");

    v1.start("order", "o-4", &4).await?; // a straggler from a v1 process
    println!(
        "moved {} run(s) of v1 to v2",
        v2.versions_move("v1", "v2").await?
    );
    new.drain().await?;
    for id in ["o-1", "o-2", "o-3", "o-4"] {
        let output: String = v2
            .result(("order", id), std::time::Duration::from_secs(5))
            .await?;
        println!("{id}: {output}");
    }
    drop((old, new, v1, v2));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
