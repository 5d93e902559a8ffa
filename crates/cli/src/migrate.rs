//! `keiro migrate`: create the schema if needed and apply pending migrations.

use crate::common::{connect_store, Global, Outcome, Result, ResultExt};

/// Migrates `--schema` and prints what was applied.
pub(crate) async fn run(global: &Global) -> Result<Outcome> {
    // One connection is all a migration uses.
    let store = connect_store(global.config(&global.schema, 1)).await?;
    let applied = store
        .migrate()
        .await
        .context(format!("migrating schema {}", global.schema))?;
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
    Ok(Outcome::Success)
}
