//! What every command shares: the global options, choosing and opening the store, scratch
//! schemas, errors, logs.
//!
//! The store is chosen in one place, [`Global::store`], by the URL's scheme: `postgres://` or
//! `postgresql://` is a PostgreSQL server, `sqlite:PATH` a SQLite file. Without a URL the
//! operator commands use the local PostgreSQL server ([`keiro::postgres::URL_DEFAULT`]); `keiro
//! demo` and `keiro chaos` use a SQLite file in a temporary directory instead
//! ([`Global::scratch_store`]), so they run on a machine with no database server at all.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Args;
use keiro::postgres::{Config, PgStore, TlsConnector};
use keiro::store::Database;
use keiro::Keiro;

/// The global options, accepted before or after the subcommand.
#[derive(Clone, Args)]
pub(crate) struct Global {
    /// The database to work in: `postgres://…` (a PostgreSQL server) or `sqlite:PATH` (a SQLite
    /// file). Defaults to postgres://postgres@127.0.0.1:5432/postgres; `keiro demo` and `keiro
    /// chaos` default to a SQLite file in a temporary directory.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// The schema keiro's tables live in (operator commands and `migrate`; PostgreSQL only).
    #[arg(
        long,
        env = "KEIRO_SCHEMA",
        default_value = keiro::postgres::SCHEMA_DEFAULT,
        global = true,
        hide_env_values = true
    )]
    pub(crate) schema: String,
}

/// The URL's password is never printed: `Debug` shows it as the store's config would.
impl fmt::Debug for Global {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let database = match self.store() {
            Ok(Store::Postgres) => Config::new(self.url()).url_redacted(),
            Ok(Store::Sqlite(path)) => format!("sqlite:{}", path.display()),
            Err(_) => "(unreadable)".to_owned(),
        };
        f.debug_struct("Global")
            .field("database_url", &database)
            .field("schema", &self.schema)
            .finish()
    }
}

/// The store a command works on, as [`Global::store`] chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Store {
    /// The PostgreSQL server of [`Global::url`] (its settings: [`Global::config`]).
    Postgres,
    /// The SQLite file at this path.
    Sqlite(PathBuf),
}

/// The TLS connector of `--database-url` (its `sslmode` and `sslrootcert`), for the dedicated
/// connections [`open_connection`] makes; set once by [`init_tls`] before any command runs, so
/// every connection of the process is encrypted and verified as the store's are.
static TLS: OnceLock<TlsConnector> = OnceLock::new();

/// Reads `--database-url`'s TLS settings (and `sslrootcert`, or the platform's roots) once; a
/// SQLite file has none.
pub(crate) fn init_tls(global: &Global) -> Result<()> {
    if global.store()? != Store::Postgres {
        return Ok(());
    }
    let config = global.config(&global.schema, 1)?;
    let tls = config.tls_connector().context(format!(
        "reading the TLS settings of {}",
        config.url_redacted()
    ))?;
    // A second call keeps the first connector, read from the same URL.
    let _ = TLS.set(tls);
    Ok(())
}

impl Global {
    /// The URL given, or the local PostgreSQL server's.
    pub(crate) fn url(&self) -> &str {
        self.database_url
            .as_deref()
            .unwrap_or(keiro::postgres::URL_DEFAULT)
    }

    /// The store the URL names, by its scheme.
    pub(crate) fn store(&self) -> Result<Store> {
        match Database::parse(self.url()).context("reading --database-url (DATABASE_URL)")? {
            Database::Postgres(_) => Ok(Store::Postgres),
            Database::Sqlite(path) => Ok(Store::Sqlite(path)),
            other => Err(failure(format!("keiro has no store for {other:?}"))),
        }
    }

    /// Where the operator commands work, for messages: the schema or the file.
    pub(crate) fn place(&self) -> String {
        match self.store() {
            Ok(Store::Sqlite(path)) => format!("sqlite file {}", path.display()),
            _ => format!("schema {}", self.schema),
        }
    }

    /// The PostgreSQL store configuration for `schema` with a pool of `pool_size`, with the
    /// application version of `KEIRO_APP_VERSION` as `Keiro::connect` reads it (the runs the
    /// demo, the bench and chaos start record it, and their workers serve it).
    ///
    /// # Errors
    ///
    /// When the URL names a SQLite file: what calls this works on PostgreSQL only; a
    /// `KEIRO_APP_VERSION` that is no valid version.
    pub(crate) fn config(&self, schema: &str, pool_size: usize) -> Result<Config> {
        if let Store::Sqlite(path) = self.store()? {
            return Err(failure(format!(
                "this works on PostgreSQL only, and --database-url names the SQLite file {}",
                path.display()
            )));
        }
        Ok(Config {
            schema: schema.to_owned(),
            pool_size,
            app_version: keiro::versions::app_version_from_env()?,
            ..Config::new(self.url())
        })
    }

    /// The store of `keiro demo` and `keiro chaos` (`command`): the URL's when one was given,
    /// else a SQLite file in a new temporary directory, with the line that announces it and
    /// the one that runs the same command on PostgreSQL ([`Scratch::announcement`], the
    /// command's first line). The directory is the caller's to remove.
    pub(crate) fn scratch_store(&self, command: &str) -> Result<Scratch> {
        if self.database_url.is_some() {
            return Ok(Scratch {
                store: self.store()?,
                temporary: None,
                announcement: None,
            });
        }
        let dir = std::env::temp_dir().join(format!(
            "keiro-{command}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir).context(format!("creating {}", dir.display()))?;
        let path = dir.join(format!("keiro-{command}.db"));
        let announcement = format!(
            "{command}: on SQLite, the file {} in a temporary directory removed at the end (no \
             DATABASE_URL or --database-url); on PostgreSQL: keiro {command} --database-url {}",
            path.display(),
            keiro::postgres::URL_DEFAULT
        );
        Ok(Scratch {
            store: Store::Sqlite(path),
            temporary: Some(dir),
            announcement: Some(announcement),
        })
    }

    /// These options with `store` as the database: what a child process is given.
    pub(crate) fn with_store(&self, store: &Store) -> Self {
        let database_url = match store {
            Store::Postgres => self.database_url.clone(),
            Store::Sqlite(path) => Some(sqlite_url(path)),
        };
        Self {
            database_url,
            schema: self.schema.clone(),
        }
    }
}

/// The `sqlite:` URL of `path`.
pub(crate) fn sqlite_url(path: &Path) -> String {
    format!("sqlite:{}", path.display())
}

/// The store of a scratch run (`keiro demo`, `keiro chaos`), and the temporary directory it
/// made for it, if any.
#[derive(Debug)]
pub(crate) struct Scratch {
    /// The store chosen.
    pub(crate) store: Store,
    /// The temporary directory holding the SQLite file, when no URL was given.
    pub(crate) temporary: Option<PathBuf>,
    /// The line saying the run is on a temporary SQLite file, and how to run it on
    /// PostgreSQL instead; `None` when a URL was given.
    pub(crate) announcement: Option<String>,
}

impl Scratch {
    /// Removes the temporary directory (with the file), if one was made.
    pub(crate) fn remove(&self) {
        if let Some(dir) = &self.temporary {
            if let Err(error) = std::fs::remove_dir_all(dir) {
                tracing::warn!(error = %error, dir = %dir.display(), "removing the scratch directory");
            }
        }
    }
}

/// Makes way for a fresh scratch file at `path` for `keiro {command}`: removes the one an
/// earlier run of it left there (with its WAL and shared-memory files), told by the table
/// `marker` it creates, and refuses any other file, which may be data.
pub(crate) fn replace_scratch_file(path: &Path, marker: &str, command: &str) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let ours =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|conn| {
                conn.query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [marker],
                    |row| row.get::<_, i64>(0),
                )
            })
            .is_ok_and(|tables| tables == 1);
    if !ours {
        return Err(failure(format!(
            "refusing to replace {}: it is not a file an earlier keiro {command} made; name a new \
             file, or leave out --database-url for a temporary one",
            path.display()
        )));
    }
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = PathBuf::from(name);
        if file.exists() {
            std::fs::remove_file(&file).context(format!("removing {}", file.display()))?;
        }
    }
    Ok(())
}

/// The facade on the operator's store with a PostgreSQL pool of `pool_size`: the schema of
/// `--schema`, not migrated (that is `keiro migrate`'s job), or the SQLite file, which must
/// exist (opening a file migrates it; `keiro migrate` creates one).
pub(crate) async fn keiro(global: &Global, pool_size: usize) -> Result<Keiro> {
    match global.store()? {
        Store::Postgres => Ok(Keiro::builder(
            connect_store(global.config(&global.schema, pool_size)?).await?,
        )
        .codec_from_env()
        .context("reading KEIRO_ENCRYPTION_KEYS")?
        .build()),
        Store::Sqlite(path) => {
            if !path.exists() {
                return Err(failure(format!(
                    "no SQLite file at {}: `keiro migrate --database-url {}` creates one",
                    path.display(),
                    sqlite_url(&path)
                )));
            }
            open_sqlite(&path).await
        }
    }
}

/// Opens (creating and migrating if needed) the SQLite file at `path`.
pub(crate) async fn open_sqlite(path: &Path) -> Result<Keiro> {
    Keiro::connect(Database::Sqlite(path.to_owned()))
        .await
        .context(format!("opening the SQLite file {}", path.display()))
}

/// Refuses a PostgreSQL-only command (`what`) on a SQLite file, saying why.
pub(crate) fn postgres_only(global: &Global, what: &str, why: &str) -> Result<()> {
    match global.store()? {
        Store::Postgres => Ok(()),
        Store::Sqlite(path) => Err(failure(format!(
            "{what} works on PostgreSQL only ({why}); --database-url names the SQLite file {}",
            path.display()
        ))),
    }
}

/// How a command that ran to its end went; errors that stopped it are an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Everything asked for was done (or every check passed).
    Success,
    /// The command ran, but a check failed or the operation was refused.
    Failed,
}

/// The CLI's error: any failure, with the operation that failed in its message and the cause as
/// its source. A binary has no API to keep typed, so a boxed error is enough; `main` prints the
/// whole chain.
pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// `Result` with the CLI's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// An error that names what was being done, keeping the cause as its source.
#[derive(Debug)]
struct Context {
    what: String,
    source: Error,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Adds the failed operation to an error, as `.context("connecting to ...")`.
pub(crate) trait ResultExt<T> {
    /// Wraps the error with `what` (lowercase, no trailing period).
    fn context(self, what: impl Into<String>) -> Result<T>;
}

impl<T, E: Into<Error>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|source| {
            Box::new(Context {
                what: what.into(),
                source: source.into(),
            }) as Error
        })
    }
}

/// A plain error message, for failures that have no underlying cause.
pub(crate) fn failure(message: impl Into<String>) -> Error {
    message.into().into()
}

pub(crate) use keiro::workflow::error_chain;

/// Logs to stderr, filtered by `RUST_LOG` (default `warn`), so stdout carries only the
/// command's own output (the bench's JSON line, the demo worker's report).
pub(crate) fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// Connects the store to `config`'s schema without migrating.
pub(crate) async fn connect_store(config: Config) -> Result<PgStore> {
    // The Display of a config is its redacted URL and its schema, never the password.
    let target = config.to_string();
    PgStore::connect(config)
        .await
        .context(format!("connecting to {target}"))
}

/// Opens a dedicated connection (outside the store's pool and its round-trip count) and drives
/// it on a background task, with `--database-url`'s TLS settings.
pub(crate) async fn open_connection(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client> {
    let tls = TLS
        .get()
        .expect("main reads the TLS settings before any command runs")
        .clone();
    let (client, connection) = config
        .connect(tls)
        .await
        .context("opening a database connection")?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(error = %error, "a dedicated database connection closed with an error");
        }
    });
    Ok(client)
}

/// Drops `schema` with everything in it and creates it empty, so a scratch run (demo, bench)
/// starts clean whatever an earlier run left.
///
/// Refuses the operator's schema (`--schema`), so a stray `KEIRO_SCHEMA` can never point a
/// scratch run at real data.
pub(crate) async fn recreate_scratch_schema(global: &Global, schema: &str) -> Result<()> {
    if schema == global.schema {
        return Err(failure(format!(
            "refusing to drop schema {schema}: it is the operator schema (--schema / KEIRO_SCHEMA); \
             pick another scratch schema"
        )));
    }
    // The schema is spliced into DDL (identifiers take no bind parameters), so it must first pass
    // the store's identifier check: a plain lowercase name that needs no quoting.
    let config = global.config(schema, 1)?;
    config
        .validate()
        .context("checking the scratch schema name")?;
    let connection = config
        .connection_config()
        .context("reading --database-url")?;
    let admin = open_connection(&connection)
        .await
        .context(format!("connecting to {config}"))?;
    admin
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .await
        .context(format!("recreating schema {schema}"))?;
    Ok(())
}

/// Reads `VmRSS` and `VmHWM` (the peak) of this process from `/proc/self/status`, in MiB.
/// `None` where the file does not exist (not Linux).
pub(crate) fn resident_memory_mb() -> Option<(f64, f64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Milliseconds as a float, for reports.
pub(crate) fn ms(duration: std::time::Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Rounds to `places` decimals, so the JSON report stays readable.
pub(crate) fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

const TIMESTAMP: &[time::format_description::FormatItem<'static>] =
    time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]Z");

/// An instant as operators read it: UTC, to the second.
pub(crate) fn timestamp(at: time::OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(TIMESTAMP)
        .unwrap_or_else(|_| at.to_string())
}
