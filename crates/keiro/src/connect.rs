//! [`Keiro::connect`]: one entry point for every durable store, chosen by the URL's scheme
//! (`postgres://`, `postgresql://` or `sqlite:PATH`), so switching between a PostgreSQL server
//! and a SQLite file is one string. [`Database`] is that choice, parsed.

use std::convert::Infallible;
use std::path::PathBuf;

use crate::{Error, Keiro};

/// The schemes of a PostgreSQL URL (libpq's two spellings).
const POSTGRES_SCHEMES: [&str; 2] = ["postgres", "postgresql"];

/// The scheme of a SQLite URL.
const SQLITE_SCHEME: &str = "sqlite";

/// The in-memory SQLite name (sqlx's spelling), refused with its reason.
const SQLITE_MEMORY: &str = ":memory:";

/// A database [`Keiro::connect`] can open: a PostgreSQL server or a SQLite file. Parsed from a
/// URL by [`Database::parse`] (or `str::parse`), or built from a full PostgreSQL
/// [`Config`](keiro_postgres::Config).
///
/// URLs:
/// - `postgres://…` or `postgresql://…`: a PostgreSQL server, libpq's URL (schema `keiro`); a
///   libpq key/value string (`host=… dbname=…`) is one too.
/// - `sqlite:PATH`: the SQLite file at `PATH`, relative to the working directory or absolute;
///   `sqlite://PATH` and `sqlite:///ABSOLUTE` are accepted too, as sqlx spells them.
///
/// ```
/// # #[cfg(all(feature = "postgres", feature = "sqlite"))]
/// # fn main() -> Result<(), keiro::Error> {
/// use keiro::store::Database;
/// assert!(matches!(Database::parse("sqlite:app.db")?, Database::Sqlite(path) if path.ends_with("app.db")));
/// assert!(matches!(Database::parse("postgres://app@db/app")?, Database::Postgres(_)));
/// assert!(matches!(Database::parse("mysql://db/app"), Err(keiro::Error::UnknownScheme { .. })));
/// # Ok(()) }
/// # #[cfg(not(all(feature = "postgres", feature = "sqlite")))] fn main() {}
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Database {
    /// A PostgreSQL server (its `Debug` redacts the password).
    #[cfg(feature = "postgres")]
    Postgres(keiro_postgres::Config),
    /// A SQLite file, created if it does not exist.
    #[cfg(feature = "sqlite")]
    Sqlite(PathBuf),
}

impl Database {
    /// Reads `url`'s scheme and the rest as that store reads it (see [`Database`]).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), keiro::Error> {
    /// let database = keiro::store::Database::parse("sqlite:///var/lib/app/keiro.db")?;
    /// assert!(matches!(database, keiro::store::Database::Sqlite(path) if path.is_absolute()));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::UnknownScheme`] for a URL that names no store keiro has (or no scheme);
    /// [`Error::Unsupported`] for a store this build leaves out (its feature is off), for
    /// `sqlite::memory:` (the SQLite store's readers open the file by its path, so every
    /// connection must see one file) and for a SQLite URL without a path.
    pub fn parse(url: &str) -> Result<Self, Error> {
        if is_conninfo(url) {
            return postgres(url);
        }
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        if POSTGRES_SCHEMES
            .iter()
            .any(|s| scheme.eq_ignore_ascii_case(s))
        {
            return postgres(url);
        }
        if scheme.eq_ignore_ascii_case(SQLITE_SCHEME) {
            return sqlite(&url[scheme.len() + 1..]);
        }
        Err(Error::UnknownScheme {
            // Only the scheme: the rest may hold a password.
            scheme: scheme.to_owned(),
        })
    }
}

/// Whether `url` is a libpq key/value string: it opens with `keyword =`.
fn is_conninfo(url: &str) -> bool {
    url.split_once('=').is_some_and(|(keyword, _)| {
        let keyword = keyword.trim();
        !keyword.is_empty()
            && keyword
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(feature = "postgres")]
fn postgres(url: &str) -> Result<Database, Error> {
    Ok(Database::Postgres(keiro_postgres::Config::new(url)))
}

#[cfg(not(feature = "postgres"))]
fn postgres(_url: &str) -> Result<Database, Error> {
    Err(Error::Unsupported {
        what: "postgres:// URLs: keiro was built without its `postgres` feature",
    })
}

/// The path of a `sqlite:` URL, `rest` being what follows the scheme's colon.
fn sqlite_path(rest: &str) -> Result<PathBuf, Error> {
    if rest == SQLITE_MEMORY {
        return Err(Error::Unsupported {
            what: "in-memory SQLite (`sqlite::memory:`): the store's readers open the file by its \
                   path; use a file in a temporary directory",
        });
    }
    // `sqlite://a.db` is relative, `sqlite:///srv/a.db` absolute (sqlx's reading).
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if path.is_empty() {
        return Err(Error::Unsupported {
            what: "a SQLite URL without a path: write `sqlite:PATH`",
        });
    }
    Ok(PathBuf::from(path))
}

#[cfg(feature = "sqlite")]
fn sqlite(rest: &str) -> Result<Database, Error> {
    sqlite_path(rest).map(Database::Sqlite)
}

#[cfg(not(feature = "sqlite"))]
fn sqlite(rest: &str) -> Result<Database, Error> {
    sqlite_path(rest)?;
    Err(Error::Unsupported {
        what: "sqlite: URLs: keiro was built without its `sqlite` feature",
    })
}

impl std::str::FromStr for Database {
    type Err = Error;

    fn from_str(url: &str) -> Result<Self, Error> {
        Self::parse(url)
    }
}

impl TryFrom<&str> for Database {
    type Error = Error;

    fn try_from(url: &str) -> Result<Self, Error> {
        Self::parse(url)
    }
}

impl TryFrom<String> for Database {
    type Error = Error;

    fn try_from(url: String) -> Result<Self, Error> {
        Self::parse(&url)
    }
}

impl TryFrom<&String> for Database {
    type Error = Error;

    fn try_from(url: &String) -> Result<Self, Error> {
        Self::parse(url)
    }
}

#[cfg(feature = "postgres")]
impl From<keiro_postgres::Config> for Database {
    fn from(config: keiro_postgres::Config) -> Self {
        Self::Postgres(config)
    }
}

/// A conversion into [`Database`] that cannot fail (a `Config`, a `Database`) fails with
/// this facade's error all the same, so [`Keiro::connect`] takes both kinds.
impl From<Infallible> for Error {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

impl Keiro {
    /// Opens the database `database` names and brings its schema up to date: a URL
    /// (`postgres://…`, `postgresql://…`, or `sqlite:PATH`, see [`Database`]), a parsed
    /// [`Database`], or a full PostgreSQL [`Config`](keiro_postgres::Config).
    ///
    /// - PostgreSQL: connects and, unless the configuration turns it off, applies pending
    ///   migrations (schema `keiro` for a URL). Applying a migration needs the CREATE
    ///   privilege; on an up-to-date schema nothing is applied and a role without it connects
    ///   all the same. A role that must never migrate (one that only runs workflows: USAGE on
    ///   the schema, SELECT, INSERT, UPDATE and DELETE on its tables, EXECUTE on its functions)
    ///   connects with `.migrate(false)`, after another role ran `keiro migrate`.
    /// - SQLite: opens the file, creating it if needed, and applies its pending migrations
    ///   (versioned as PostgreSQL's are; a file migrated by a newer keiro is refused), with the
    ///   store's default `keiro::store::sqlite::Config` (durable commits). For other settings
    ///   open a `SqliteStore` yourself and pass it to [`Keiro::builder`].
    ///
    /// Either way the store's application version (`keiro::versions`), which the runs it
    /// starts record and its workers serve, is `KEIRO_APP_VERSION` from the environment,
    /// unless a PostgreSQL [`Config`](keiro_postgres::Config) sets one; unset, it is
    /// unversioned. Payloads are sealed with the AES-256-GCM keys of `KEIRO_ENCRYPTION_KEYS`
    /// when it is set ([`KeiroBuilder::codec_from_env`](crate::KeiroBuilder::codec_from_env)).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), keiro::Error> {
    /// let keiro = keiro::Keiro::connect("sqlite:app.db").await?; // or "postgres://app@db/app"
    /// # #[cfg(feature = "postgres")] {
    /// use keiro::postgres::Config;
    /// let runner = keiro::Keiro::connect(Config::new("postgres://app_runner@db/app").migrate(false)).await?;
    /// # let _ = runner; }
    /// # let _ = keiro; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// What [`Database::parse`] refuses; [`Error::Postgres`] when the server cannot be reached
    /// or migrated (a pending migration the role may not apply is
    /// `keiro_postgres::Error::MigrationPrivilege`); `Error::Sqlite` when the file cannot be
    /// opened, is no SQLite database, or was migrated by a newer keiro.
    pub async fn connect<D>(database: D) -> Result<Self, Error>
    where
        D: TryInto<Database>,
        Error: From<D::Error>,
    {
        match database.try_into()? {
            #[cfg(feature = "postgres")]
            Database::Postgres(mut config) => {
                if config.app_version.is_empty() {
                    config.app_version = crate::versions::app_version_from_env()?;
                }
                let migrate = config.migrate;
                let store = keiro_postgres::PgStore::connect(config).await?;
                if migrate {
                    store.migrate().await?;
                }
                Ok(Self::builder(store).codec_from_env()?.build())
            }
            #[cfg(feature = "sqlite")]
            Database::Sqlite(path) => {
                let config = keiro_sqlite::Config {
                    app_version: crate::versions::app_version_from_env()?,
                    ..keiro_sqlite::Config::default()
                };
                // Opening migrates, on the caller's thread: file I/O that must not hold a
                // runtime worker.
                let opened = tokio::task::spawn_blocking(move || {
                    keiro_sqlite::SqliteStore::open(path, config)
                })
                .await;
                let store = match opened {
                    Ok(store) => store?,
                    // A panic while opening is a bug of the store: it stays a panic.
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => {
                        return Err(Error::Unsupported {
                            what: "opening a SQLite file while the runtime shuts down",
                        })
                    }
                };
                Ok(Self::builder(store).codec_from_env()?.build())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_paths_read_as_sqlx_reads_them() {
        assert_eq!(sqlite_path("app.db").unwrap(), PathBuf::from("app.db"));
        assert_eq!(sqlite_path("//app.db").unwrap(), PathBuf::from("app.db"));
        assert_eq!(
            sqlite_path("///srv/app.db").unwrap(),
            PathBuf::from("/srv/app.db")
        );
        assert_eq!(
            sqlite_path("/srv/app.db").unwrap(),
            PathBuf::from("/srv/app.db")
        );
    }

    #[test]
    fn sqlite_memory_and_empty_paths_are_refused_with_why() {
        for rest in [":memory:", "", "//"] {
            assert!(
                matches!(sqlite_path(rest), Err(Error::Unsupported { .. })),
                "{rest:?}"
            );
        }
    }

    #[test]
    fn unknown_schemes_name_only_the_scheme() {
        let Err(Error::UnknownScheme { scheme }) = Database::parse("mysql://u:secret@db/app")
        else {
            panic!("mysql is no keiro store");
        };
        assert_eq!(scheme, "mysql");
        assert!(!Error::UnknownScheme { scheme }
            .to_string()
            .contains("secret"));
        for url in ["app.db", "", "/srv/app.db", "file:app.db"] {
            assert!(
                matches!(Database::parse(url), Err(Error::UnknownScheme { .. })),
                "{url:?}"
            );
        }
    }

    #[test]
    fn key_value_strings_are_told_from_urls() {
        assert!(is_conninfo("host=127.0.0.1 port=5432"));
        assert!(is_conninfo(" dbname = app"));
        assert!(!is_conninfo("sqlite:a=b.db"));
        assert!(!is_conninfo("postgres://h/d?sslmode=require"));
        assert!(!is_conninfo("=app"));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn both_postgres_spellings_are_postgres() {
        for url in [
            "postgres://a@h/d",
            "postgresql://a@h/d",
            "POSTGRES://a@h/d",
            "host=127.0.0.1 user=app password=x:y",
        ] {
            assert!(
                matches!(Database::parse(url), Ok(Database::Postgres(_))),
                "{url}"
            );
        }
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_urls_are_sqlite_files() {
        assert!(matches!(
            Database::parse("sqlite:data/app.db"),
            Ok(Database::Sqlite(path)) if path == std::path::Path::new("data/app.db")
        ));
        assert!(matches!(
            "SQLite:app.db".parse::<Database>(),
            Ok(Database::Sqlite(_))
        ));
    }
}
