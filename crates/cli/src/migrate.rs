//! `keiro migrate`: create the schema if needed and apply pending migrations, then the function
//! files of `crates/migrations/functions/` that are new or changed. On a SQLite file: create the
//! file if needed and apply its pending migrations (it has no function files: its rules are
//! compiled into keiro).

use keiro::postgres::FunctionFiles;

use crate::common::{connect_store, open_sqlite, Global, Outcome, Result, ResultExt, Store};

/// Migrates `--schema` (or the SQLite file) and prints what was applied: the migrations, then
/// the function files (or why they were left alone).
pub(crate) async fn run(global: &Global) -> Result<Outcome> {
    if let Store::Sqlite(path) = global.store()? {
        let existed = path.exists();
        open_sqlite(&path).await?;
        println!(
            "sqlite file {} {}: schema version {} (function files are PostgreSQL's; the SQLite \
             store's rules are compiled into keiro)",
            path.display(),
            if existed { "migrated" } else { "created" },
            keiro::store::sqlite::SCHEMA_VERSION
        );
        return Ok(Outcome::Success);
    }
    // One connection is all a migration uses.
    let store = connect_store(global.config(&global.schema, 1)?).await?;
    let report = store
        .migrate_report()
        .await
        .context(format!("migrating schema {}", global.schema))?;
    let applied = &report.migrations;
    if applied.is_empty() {
        println!(
            "schema {} is up to date: no migration applied",
            global.schema
        );
    } else {
        let versions: Vec<String> = applied.iter().map(|v| format!("{v:04}")).collect();
        println!(
            "schema {}: applied {} migration(s): {}",
            global.schema,
            applied.len(),
            versions.join(", ")
        );
    }
    println!("schema {}: {}", global.schema, functions(&report.functions));
    Ok(Outcome::Success)
}

/// The line that says what became of the function files.
fn functions(report: &FunctionFiles) -> String {
    match report {
        FunctionFiles::UpToDate { revision } => {
            format!("function files (revision {revision}) in place: none applied")
        }
        FunctionFiles::Applied { revision, files } => format!(
            "applied {} function file(s) (revision {revision}): {}",
            files.len(),
            files.join(", ")
        ),
        FunctionFiles::NewerRevision { ours, schema } => format!(
            "function files skipped: the schema has revision {schema} of them, newer than this \
             build's {ours} (a newer build migrated it)"
        ),
        FunctionFiles::NewerMigration { version } => format!(
            "function files skipped: the schema has migration {version:04}, which this build \
             does not know (a newer build migrated it)"
        ),
        FunctionFiles::Unreadable => "function files not checked: the role may not read their \
                                      bookkeeping (keiro_functions, keiro_function_revisions)"
            .to_owned(),
        FunctionFiles::Pending => {
            "function files not applied: migrations are still pending".to_owned()
        }
        other => format!("function files: {other:?}"),
    }
}
