//! A role that only runs workflows needs no CREATE privilege: USAGE on keiro's schema, DML on
//! its tables and EXECUTE on its functions are enough to connect (migrating or not), to
//! migrate an up-to-date schema as a no-op and to drive workflows; a pending migration or
//! function file it may not apply is a typed error naming the privilege and the file.

use std::convert::Infallible;
use std::time::Duration;

use keiro::postgres::{Config, Error as PgError, PgStore};
use keiro::{Ctx, Keiro, Status, WorkflowError};
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

/// A login role with a running role's grants on a test's schema, dropped with its grants when
/// this is dropped.
struct Runner {
    name: String,
    admin: tokio_postgres::Config,
}

impl Runner {
    /// Creates `<schema>_runner` (roles are shared by the whole server, so the name comes from
    /// the test's own schema) in one transaction with its grants.
    async fn create(db: &TestDb) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let name = format!("{}_runner", db.schema());
        let schema = db.schema();
        // Both names are generated identifiers; role and schema names take no bind parameters.
        db.store()
            .pool()
            .get()
            .await?
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN; \
                 GRANT USAGE ON SCHEMA \"{schema}\" TO \"{name}\"; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" \
                     TO \"{name}\"; \
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA \"{schema}\" TO \"{name}\"; \
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA \"{schema}\" TO \"{name}\";"
            ))
            .await?;
        Ok(Self {
            name,
            admin: db.store().connection_config().clone(),
        })
    }

    /// The test schema's configuration, logging in as this role (trust authentication, as in
    /// the contributing guide).
    fn config(&self, db: &TestDb) -> Config {
        let url = db.url();
        let url = if url.contains("://") {
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}user={}", self.name)
        } else {
            format!("{url} user={}", self.name)
        };
        Config { url, ..db.config() }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!(
            "DROP OWNED BY \"{name}\"; DROP ROLE \"{name}\"",
            name = self.name
        );
        // The test's runtime cannot be blocked on from inside it; a thread with its own can.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, driver) = admin
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let driver = tokio::spawn(driver);
                let result = client.batch_execute(&sql).await.map_err(|e| e.to_string());
                drop(client);
                let _ = tokio::time::timeout(Duration::from_secs(1), driver).await;
                result
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: role {} was not dropped: {dropped:?}", self.name);
        }
    }
}

async fn approval(ctx: Ctx, order: String) -> Result<String, WorkflowError> {
    let charged: String = ctx
        .step("charge", || async {
            Ok::<_, Infallible>(format!("charged {order}"))
        })
        .await?;
    let approved: bool = ctx.await_step("approval").await?;
    Ok(format!("{charged}, approved: {approved}"))
}

#[tokio::test]
async fn a_role_without_create_migrates_as_a_no_op_and_runs_workflows() -> TestResult {
    let db = TestDb::new().await; // migrated by the superuser
    let runner = Runner::create(&db).await?;

    let store = PgStore::connect(runner.config(&db)).await?;
    assert_eq!(store.migrate().await?, Vec::<i32>::new());
    // Connecting through the facade migrates by default, which is a no-op here too.
    drop(Keiro::connect(runner.config(&db)).await?);

    let keiro = Keiro::connect(runner.config(&db).migrate(false)).await?;
    let worker = keiro
        .worker()
        .register("approval", approval)
        .poll_interval(Duration::from_millis(20))
        .build()?;
    keiro.start("approval", "order-1", "order-1").await?;
    worker.drain().await?;
    let parked = keiro
        .instance(("approval", "order-1"))
        .await?
        .ok_or("missing")?;
    assert_eq!(parked.status, Status::Suspended);
    keiro
        .deliver(("approval", "order-1"), "approval", &true)
        .await?;
    worker.drain().await?;
    let done = keiro
        .instance(("approval", "order-1"))
        .await?
        .ok_or("missing")?;
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert_eq!(
        done.output,
        Some(serde_json::json!("charged order-1, approved: true"))
    );
    Ok(())
}

#[tokio::test]
async fn a_pending_migration_the_role_may_not_apply_is_a_typed_error() -> TestResult {
    let db = TestDb::new().await;
    let runner = Runner::create(&db).await?;
    // As if this build were newer than the schema: its last migration is not applied yet.
    let (version, name): (i32, String) = {
        let row = db
            .store()
            .pool()
            .get()
            .await?
            .query_one(
                "DELETE FROM keiro_migrations \
                 WHERE version = (SELECT max(version) FROM keiro_migrations) \
                 RETURNING version, name",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };

    let store = PgStore::connect(runner.config(&db)).await?;
    let err = store.migrate().await.expect_err("CREATE is missing");
    let privilege = format!("CREATE on schema {}", db.schema());
    assert!(
        matches!(
            &err,
            PgError::MigrationPrivilege { schema, version: v, name: n, privilege: p }
                if schema == db.schema() && *v == version && *n == name && *p == privilege
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&privilege) && message.contains(&format!("migration {version} ({name})")),
        "{message}"
    );
    assert!(!err.is_retryable());

    // The facade refuses likewise when it migrates, and connects when told not to.
    let err = Keiro::connect(runner.config(&db))
        .await
        .expect_err("CREATE is missing");
    assert!(
        matches!(
            &err,
            keiro::Error::Postgres(PgError::MigrationPrivilege { version: v, .. }) if *v == version
        ),
        "{err:?}"
    );
    drop(Keiro::connect(runner.config(&db).migrate(false)).await?);

    // Nothing was recorded as applied.
    let recorded: i64 = db
        .store()
        .pool()
        .get()
        .await?
        .query_one(
            "SELECT count(*) FROM keiro_migrations WHERE version = $1",
            &[&version],
        )
        .await?
        .get(0);
    assert_eq!(recorded, 0);
    Ok(())
}

#[tokio::test]
async fn a_missing_schema_needs_create_on_the_database() -> TestResult {
    let db = TestDb::new().await;
    let runner = Runner::create(&db).await?;
    let missing = format!("{}_missing", db.schema());
    let store = PgStore::connect(Config {
        schema: missing.clone(),
        ..runner.config(&db)
    })
    .await?;
    let err = store.migrate().await.expect_err("CREATE is missing");
    assert!(
        matches!(
            &err,
            PgError::MigrationPrivilege { schema, version: 1, name: "init", privilege }
                if *schema == missing && privilege.starts_with("CREATE on database ")
        ),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_changed_function_file_the_role_may_not_apply_is_a_typed_error() -> TestResult {
    let db = TestDb::new().await;
    let runner = Runner::create(&db).await?;
    // As if this build's `journal.sql` differed from the one the schema was migrated with.
    let admin = db.store().pool().get().await?;
    admin
        .batch_execute("UPDATE keiro_functions SET checksum = '\\x00' WHERE file = 'journal'")
        .await?;

    let store = PgStore::connect(runner.config(&db)).await?;
    let err = store.migrate().await.expect_err("CREATE is missing");
    let privilege = format!("CREATE on schema {}", db.schema());
    assert!(
        matches!(
            &err,
            PgError::FunctionFilePrivilege { schema, file: "journal", privilege: p }
                if schema == db.schema() && *p == privilege
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("function file journal"), "{err}");
    assert!(!err.is_retryable());
    // Nothing was applied: the checksum is still the one set above.
    let sum: Vec<u8> = admin
        .query_one(
            "SELECT checksum FROM keiro_functions WHERE file = 'journal'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(sum, vec![0]);

    // A role that may not even read the bookkeeping (granted its tables before an upgrade
    // created it) migrates an up-to-date schema as a no-op, as it did before the files.
    admin
        .batch_execute(&format!(
            "REVOKE SELECT ON keiro_functions FROM \"{}\"",
            runner.name
        ))
        .await?;
    assert_eq!(store.migrate().await?, Vec::<i32>::new());
    Ok(())
}
