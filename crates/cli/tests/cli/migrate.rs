//! `keiro migrate` prints what it applied: the migrations, then the function files, or why
//! they were left alone.

use std::process::Command;

use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

/// Runs `keiro migrate` on the test's schema; returns its standard output, which must succeed.
fn migrate(db: &TestDb) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args([
            "--database-url",
            db.url(),
            "--schema",
            db.schema(),
            "migrate",
        ])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    if !output.status.success() {
        return Err(format!(
            "keiro migrate failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(stdout)
}

/// The revision of this build's function files, as the schema records it.
async fn revision(db: &TestDb) -> Result<i32, Box<dyn std::error::Error + Send + Sync>> {
    Ok(db
        .store()
        .pool()
        .get()
        .await?
        .query_one("SELECT max(revision) FROM keiro_function_revisions", &[])
        .await?
        .get(0))
}

#[tokio::test]
async fn migrate_prints_the_function_files_it_applied_or_why_it_left_them() -> TestResult {
    let db = TestDb::new().await;
    let schema = db.schema();
    let ours = revision(&db).await?;
    let admin = db.store().pool().get().await?;

    // A fresh schema: every migration, then every file, in the order they are applied.
    admin
        .batch_execute(&format!(
            "DROP SCHEMA \"{schema}\" CASCADE; CREATE SCHEMA \"{schema}\""
        ))
        .await?;
    let out = migrate(&db)?;
    assert!(out.contains(&format!("schema {schema}: applied ")), "{out}");
    assert!(
        out.contains(&format!(
            "schema {schema}: applied 13 function file(s) (revision {ours}): notify, journal, \
             instance, lease, timer, signal, awakeable, child, remote, queue, message, update, \
             attribute\n"
        )),
        "{out}"
    );

    // Nothing pending.
    let out = migrate(&db)?;
    assert_eq!(
        out,
        format!(
            "schema {schema} is up to date: no migration applied\n\
             schema {schema}: function files (revision {ours}) in place: none applied\n"
        )
    );

    // One changed file.
    admin
        .batch_execute("UPDATE keiro_functions SET checksum = '\\x00' WHERE file = 'journal'")
        .await?;
    let out = migrate(&db)?;
    assert!(
        out.ends_with(&format!(
            "schema {schema}: applied 1 function file(s) (revision {ours}): journal\n"
        )),
        "{out}"
    );

    // A newer build's files are in place: skipped, and why.
    admin
        .execute(
            "INSERT INTO keiro_function_revisions (revision, checksum) VALUES ($1, '\\x00')",
            &[&(ours + 1)],
        )
        .await?;
    let out = migrate(&db)?;
    assert!(
        out.ends_with(&format!(
            "schema {schema}: function files skipped: the schema has revision {} of them, \
             newer than this build's {ours} (a newer build migrated it)\n",
            ours + 1
        )),
        "{out}"
    );
    Ok(())
}
