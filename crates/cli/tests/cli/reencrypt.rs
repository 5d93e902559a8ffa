//! Payload encryption from the command line, on a SQLite file: `keiro show` says "encrypted"
//! where it has no key and shows the payload where `KEIRO_ENCRYPTION_KEYS` gives it, and
//! `keiro reencrypt` seals a run's payloads again with the current key (refused without keys).
//! On both stores, `keiro show` counts the claims workers without the key handed back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use keiro::codec::AesGcmCodec;
use keiro::{Ctx, Keiro, WorkflowError};

/// `[fill; 32]` as standard base64, for a key list.
fn key_text(fill: u8) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode([fill; 32])
}

/// Runs `keiro` on `url` (and `schema`) with `args`, with `keys` as `KEIRO_ENCRYPTION_KEYS`:
/// whether it succeeded, and its output and errors together.
fn keiro_on(
    url: &str,
    schema: Option<&str>,
    keys: Option<&str>,
    args: &[&str],
) -> std::io::Result<(bool, String)> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keiro"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .env_remove("KEIRO_ENCRYPTION_KEYS")
        .args(["--database-url", url]);
    if let Some(schema) = schema {
        command.args(["--schema", schema]);
    }
    if let Some(keys) = keys {
        command.env("KEIRO_ENCRYPTION_KEYS", keys);
    }
    let output = command.args(args).output()?;
    Ok((
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    ))
}

/// Runs `keiro` on the SQLite file with `args`, with `keys` as `KEIRO_ENCRYPTION_KEYS`.
fn keiro_cli(file: &Path, keys: Option<&str>, args: &[&str]) -> std::io::Result<(bool, String)> {
    keiro_on(&format!("sqlite:{}", file.display()), None, keys, args)
}

/// A directory of its own for the test and a SQLite file in it, opened.
fn scratch_file(
    label: &str,
) -> Result<(PathBuf, PathBuf, keiro::store::sqlite::SqliteStore), Box<dyn std::error::Error>> {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "keiro-cli-{label}-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("codec.db");
    let store =
        keiro::store::sqlite::SqliteStore::open(&file, keiro::store::sqlite::Config::default())?;
    Ok((dir, file, store))
}

async fn shout(ctx: Ctx, text: String) -> Result<String, WorkflowError> {
    ctx.step("up", || async move {
        Ok::<_, std::io::Error>(text.to_uppercase())
    })
    .await
}

#[tokio::test]
async fn show_says_encrypted_without_the_key_and_reencrypt_moves_runs_to_the_current_key(
) -> Result<(), Box<dyn std::error::Error>> {
    let (dir, file, store) = scratch_file("reencrypt")?;
    let old = Keiro::builder(store.clone())
        .codec(Arc::new(AesGcmCodec::new("k1", [1; 32])?))
        .build();
    old.start("shout", "s-1", &"quiet secret").await?;
    old.worker()
        .register("shout", shout)
        .build()?
        .drain()
        .await?;

    let (ok, text) = keiro_cli(&file, None, &["show", "shout", "s-1"])?;
    assert!(ok, "{text}");
    assert!(
        text.contains("encrypted (key \"k1\")") && !text.contains("secret"),
        "{text}"
    );
    let k1 = format!("k1:{}", key_text(1));
    let (ok, text) = keiro_cli(&file, Some(&k1), &["show", "shout", "s-1"])?;
    assert!(
        ok && text.contains("quiet secret") && text.contains("QUIET SECRET"),
        "{text}"
    );

    let (ok, text) = keiro_cli(&file, None, &["reencrypt", "--name", "shout"])?;
    assert!(!ok && text.contains("KEIRO_ENCRYPTION_KEYS"), "{text}");
    let ring = format!("k2:{},{k1}", key_text(2));
    let (ok, text) = keiro_cli(&file, Some(&ring), &["reencrypt", "--name", "shout"])?;
    assert!(ok && text.contains("shout/s-1:"), "{text}");
    // Now k2 alone reads it.
    let k2 = format!("k2:{}", key_text(2));
    let (ok, text) = keiro_cli(&file, Some(&k2), &["show", "shout", "s-1"])?;
    assert!(ok && text.contains("QUIET SECRET"), "{text}");
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A run sealed with k2, drained by a worker holding k1 only: it claims the run and hands it
/// back, a refusal and not a crash. `show` (run by `cli`) then says so.
async fn refused_once_then_shown<S: keiro::store::Store + Clone>(
    store: S,
    cli: impl Fn(&[&str]) -> std::io::Result<(bool, String)>,
) -> Result<(), Box<dyn std::error::Error>> {
    Keiro::builder(store.clone())
        .codec(Arc::new(AesGcmCodec::new("k2", [2; 32])?))
        .build()
        .start("shout", "s-2", &"sealed with k2")
        .await?;
    let lacking = Keiro::builder(store)
        .codec(Arc::new(AesGcmCodec::new("k1", [1; 32])?))
        .build();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        lacking.worker().register("shout", shout).build()?.drain(),
    )
    .await??;

    let (ok, text) = cli(&["show", "shout", "s-2"])?;
    assert!(ok, "{text}");
    assert!(text.contains("attempts     0"), "{text}");
    assert!(text.contains("open_refusals 1"), "{text}");
    assert!(
        text.contains("\"k2\""),
        "the last error names the key: {text}"
    );
    Ok(())
}

#[tokio::test]
async fn show_counts_the_claims_a_worker_without_the_key_handed_back(
) -> Result<(), Box<dyn std::error::Error>> {
    let (dir, file, store) = scratch_file("refusals")?;
    refused_once_then_shown(store, |args| keiro_cli(&file, None, args)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[tokio::test]
async fn show_counts_the_claims_a_worker_without_the_key_handed_back_on_postgres(
) -> Result<(), Box<dyn std::error::Error>> {
    let db = keiro_tests::pg::TestDb::new().await;
    refused_once_then_shown(db.store(), |args| {
        keiro_on(db.url(), Some(db.schema()), None, args)
    })
    .await
}
