//! Connection settings of the Postgres store.

use std::fmt;
use std::time::Duration;

pub use keiro_journal::{batch::BATCHES_IN_FLIGHT_DEFAULT, batch::BATCH_LEN_MAX_DEFAULT};

use crate::conninfo::ConnInfo;
use crate::tls::TlsConnector;
use crate::{Error, Result};

/// The database [`Config::url`] points at unless told otherwise: a local server with the
/// `postgres` superuser, as in the contributing guide.
pub const URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// The schema keiro's tables live in unless told otherwise.
pub const SCHEMA_DEFAULT: &str = "keiro";

/// The longest schema name accepted, in bytes: the wake channel `<schema>.wake` must fit in
/// Postgres' 63-byte identifier limit, which `NOTIFY` and `LISTEN` enforce on channel names.
pub const SCHEMA_LEN_MAX: usize = 63 - WAKE_CHANNEL_SUFFIX.len();

/// Appended to the schema name to form the wake channel.
pub(crate) const WAKE_CHANNEL_SUFFIX: &str = ".wake";

/// How many connections the pool opens at most unless told otherwise.
pub const POOL_SIZE_DEFAULT: usize = 16;

/// The smallest pool that can run the store: one connection.
pub const POOL_SIZE_MIN: usize = 1;

/// How long opening one connection may take unless told otherwise.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// How long an operation waits for a free pooled connection unless told otherwise.
pub const ACQUIRE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The `application_name` keiro's connections report unless the URL sets one.
pub const APPLICATION_NAME_DEFAULT: &str = "keiro";

/// How often the wake listener checks its connection unless told otherwise.
pub const LISTEN_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);

/// How long the wake listener waits for a check's answer unless told otherwise.
pub const LISTEN_CHECK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// The isolation level every transaction on keiro's own connections runs at, pinned as the
/// session's `default_transaction_isolation` whatever the database, the role or the URL makes
/// the default. keiro's functions take a lock (a signal token's, an instance row's) and then
/// read what committed before they got it, which only a statement snapshot taken after the
/// lock sees; a REPEATABLE READ or SERIALIZABLE snapshot is taken before it, when the statement
/// starts, so a send would buffer a signal past a waiter that registered while it waited.
pub const TRANSACTION_ISOLATION: &str = "read committed";

/// How long [`PgStore::migrate`](crate::PgStore::migrate) waits for the schema's migration
/// lock, held by another runner, unless told otherwise. A migration takes seconds; a runner
/// holding the lock for a minute is stuck, or its connection is.
pub const MIGRATE_LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// Settings of a [`PgStore`](crate::PgStore).
///
/// ```
/// use keiro_postgres::Config;
///
/// let config = Config {
///     schema: "billing_keiro".into(),
///     pool_size: 4,
///     ..Config::new("postgres://app:secret@db.internal/app")
/// };
/// config.validate()?;
/// assert!(!format!("{config:?}").contains("secret"));
/// # Ok::<(), keiro_postgres::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Where the database is: a `postgres://` URL or a `key=value` connection string, as
    /// `tokio_postgres::Config` parses them, plus libpq's TLS settings the driver lacks:
    /// `sslmode` (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`;
    /// see [`SslMode`](crate::SslMode)) and `sslrootcert` (a PEM file of trusted roots, or
    /// `system`, which implies `verify-full` and refuses a weaker mode, as libpq). Without a password in it, `PGPASSWORD` gives one, as with libpq. Never
    /// printed: `Debug` and `Display` show [`url_redacted`](Config::url_redacted). Defaults to
    /// [`URL_DEFAULT`].
    pub url: String,
    /// The schema keiro's tables and functions live in. Every connection gets it as its
    /// `search_path`, so two schemas in one database are two isolated installations. A plain
    /// lowercase identifier (`[a-z_][a-z0-9_]*`) of at most [`SCHEMA_LEN_MAX`] bytes, and not a
    /// shared one (`public`, `information_schema`, `pg_*`) unless [`allow_shared_schema`] is
    /// set. Defaults to [`SCHEMA_DEFAULT`].
    ///
    /// [`allow_shared_schema`]: #structfield.allow_shared_schema
    pub schema: String,
    /// The most connections the pool holds; they are opened on demand. At least
    /// [`POOL_SIZE_MIN`]. Defaults to [`POOL_SIZE_DEFAULT`].
    pub pool_size: usize,
    /// How long opening a connection may take before the operation fails as unavailable.
    /// Non-zero. Defaults to [`CONNECT_TIMEOUT_DEFAULT`].
    pub connect_timeout: Duration,
    /// How long an operation waits for a free pooled connection before failing as
    /// unavailable. Non-zero. Defaults to [`ACQUIRE_TIMEOUT_DEFAULT`].
    pub acquire_timeout: Duration,
    /// The `application_name` reported to the server (visible in `pg_stat_activity`), used
    /// when the URL does not set one. Defaults to [`APPLICATION_NAME_DEFAULT`].
    pub application_name: String,
    /// Whether `keiro::Keiro::connect` applies pending migrations when it connects.
    /// Turn it off for a role that runs workflows but may not change the schema (it needs no
    /// CREATE privilege then); [`PgStore::connect`](crate::PgStore::connect) never migrates
    /// either way. Defaults to `true`.
    pub migrate: bool,
    /// Whether [`schema`](#structfield.schema) may be a schema usually shared with other roles or
    /// reserved by PostgreSQL: `public`, `information_schema` or a `pg_` name. keiro's functions
    /// trust every object in their own schema, so a role that can create objects there could
    /// have them call its code instead of a built-in. Defaults to `false`.
    pub allow_shared_schema: bool,
    /// How often the wake listener makes a round trip (`SELECT 1`) on its `LISTEN` connection.
    /// A connection a NAT or a load balancer dropped without telling either end looks idle,
    /// not broken; a check it cannot answer within
    /// [`listen_check_timeout`](#structfield.listen_check_timeout) replaces it, and the loops
    /// poll at once (`WakeReason::Reconnected`) instead of waiting for their fallback. TCP
    /// keepalives on that connection catch a peer that is gone; the check also catches a path
    /// that went silent. Non-zero. Defaults to [`LISTEN_CHECK_INTERVAL_DEFAULT`].
    pub listen_check_interval: Duration,
    /// How long a check of the `LISTEN` connection may go unanswered before the connection is
    /// replaced. Non-zero. Defaults to [`LISTEN_CHECK_TIMEOUT_DEFAULT`].
    pub listen_check_timeout: Duration,
    /// How long [`PgStore::migrate`](crate::PgStore::migrate) waits for the schema's migration
    /// lock while another runner holds it, before it fails with
    /// [`Error::MigrationLocked`]. Non-zero. Defaults to
    /// [`MIGRATE_LOCK_TIMEOUT_DEFAULT`].
    pub migrate_lock_timeout: Duration,
    /// Group commit: whether concurrent journal appends, starts and parks of this store share
    /// a statement and a transaction. A call that finds the store idle is sent at once, alone,
    /// so batching adds no wait; calls that arrive while earlier batches are in flight leave
    /// together in the next one, and each still gets the outcome a transaction of its own
    /// would have given (a batch that fails as a whole, for one refused value say, is sent
    /// again call by call). Every batch commits synchronously, so nothing is answered before it
    /// is durable. Turn it off to measure against one transaction per call. Defaults to `true`.
    pub batching: bool,
    /// With [`batching`](#structfield.batching), how many batches of one operation may be in
    /// flight at once, each on its own pooled connection: fewer makes larger batches under
    /// load, more lets the database work on several at once. Direct starts
    /// (`instance_start_claimed`) share the journal appends' batches in flight, since their
    /// callers go on to append, and have one more of their own for when half a batch of them
    /// waits. At least 1. Defaults to [`BATCHES_IN_FLIGHT_DEFAULT`].
    pub batch_in_flight: usize,
    /// With [`batching`](#structfield.batching), the most calls one batch carries. At least 1.
    /// Defaults to [`BATCH_LEN_MAX_DEFAULT`].
    pub batch_len_max: usize,
    /// The application version this store records on the runs it starts, and on the runs it
    /// continues as new (`keiro_lease::versions`): pinned on every connection as the session
    /// setting `keiro.app_version`, which the `workflows.app_version` column takes as its
    /// default. At most 64 bytes of ASCII letters, digits and `. _ + -`; empty is
    /// unversioned. Defaults to empty (the facade's `keiro::Keiro::connect` sets it from
    /// `KEIRO_APP_VERSION`).
    pub app_version: String,
}

impl Default for Config {
    fn default() -> Self {
        Self::new(URL_DEFAULT)
    }
}

/// The defaults, connecting to the URL or key/value connection string.
impl From<&str> for Config {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

/// The defaults, connecting to the URL or key/value connection string.
impl From<String> for Config {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

/// The defaults, connecting to the URL or key/value connection string.
impl From<&String> for Config {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

impl Config {
    /// The defaults, connecting to `url`.
    ///
    /// ```
    /// let config = keiro_postgres::Config::new("postgres://postgres@127.0.0.1/postgres");
    /// assert_eq!(config.schema, keiro_postgres::SCHEMA_DEFAULT);
    /// ```
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: SCHEMA_DEFAULT.to_owned(),
            pool_size: POOL_SIZE_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            acquire_timeout: ACQUIRE_TIMEOUT_DEFAULT,
            application_name: APPLICATION_NAME_DEFAULT.to_owned(),
            migrate: true,
            allow_shared_schema: false,
            listen_check_interval: LISTEN_CHECK_INTERVAL_DEFAULT,
            listen_check_timeout: LISTEN_CHECK_TIMEOUT_DEFAULT,
            migrate_lock_timeout: MIGRATE_LOCK_TIMEOUT_DEFAULT,
            batching: true,
            batch_in_flight: BATCHES_IN_FLIGHT_DEFAULT,
            batch_len_max: BATCH_LEN_MAX_DEFAULT,
            app_version: String::new(),
        }
    }

    /// Sets the [`batching`](#structfield.batching) field: whether concurrent appends, starts
    /// and parks share transactions (group commit).
    ///
    /// ```
    /// let config = keiro_postgres::Config::default().batching(false);
    /// assert!(!config.batching);
    /// ```
    #[must_use]
    pub fn batching(mut self, batching: bool) -> Self {
        self.batching = batching;
        self
    }

    /// Sets the [`migrate`](#structfield.migrate) field: whether `keiro::Keiro::connect`
    /// applies pending migrations.
    ///
    /// ```
    /// let config = keiro_postgres::Config::new("postgres://app_runner@db/app").migrate(false);
    /// assert!(!config.migrate);
    /// ```
    #[must_use]
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Sets the [`allow_shared_schema`](#structfield.allow_shared_schema) field: whether keiro
    /// may live in `public`, `information_schema` or a `pg_` schema.
    ///
    /// ```
    /// use keiro_postgres::Config;
    ///
    /// let public = Config { schema: "public".into(), ..Config::default() };
    /// assert!(public.clone().validate().is_err());
    /// assert!(public.allow_shared_schema(true).validate().is_ok());
    /// ```
    #[must_use]
    pub fn allow_shared_schema(mut self, allow: bool) -> Self {
        self.allow_shared_schema = allow;
        self
    }

    /// Checks every field against its bounds.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the first field out of bounds.
    ///
    /// ```
    /// let bad = keiro_postgres::Config { schema: "Keiro; DROP".into(), ..Default::default() };
    /// assert!(bad.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<()> {
        self.validate_fields()?;
        self.tls_connector().map(drop)
    }

    /// [`validate`](Self::validate) but for the URL, which the caller reads next anyway.
    pub(crate) fn validate_fields(&self) -> Result<()> {
        validate_schema(&self.schema)?;
        keiro_lease::versions::validate_version(&self.app_version)
            .map_err(|e| invalid("app_version", e.reason.into()))?;
        if !self.allow_shared_schema && is_shared_schema(&self.schema) {
            return Err(invalid(
                "schema",
                format!(
                    "{:?} is shared with other roles or reserved by PostgreSQL; keiro's functions \
                     trust every object in their schema, so give keiro a schema of its own or \
                     set allow_shared_schema",
                    self.schema
                ),
            ));
        }
        if self.pool_size < POOL_SIZE_MIN {
            return Err(invalid(
                "pool_size",
                format!("must be at least {POOL_SIZE_MIN}"),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "connect_timeout",
                "must be greater than zero".into(),
            ));
        }
        if self.acquire_timeout.is_zero() {
            return Err(invalid(
                "acquire_timeout",
                "must be greater than zero".into(),
            ));
        }
        if self.listen_check_interval.is_zero() {
            return Err(invalid(
                "listen_check_interval",
                "must be greater than zero".into(),
            ));
        }
        if self.listen_check_timeout.is_zero() {
            return Err(invalid(
                "listen_check_timeout",
                "must be greater than zero".into(),
            ));
        }
        if self.migrate_lock_timeout.is_zero() {
            return Err(invalid(
                "migrate_lock_timeout",
                "must be greater than zero".into(),
            ));
        }
        if self.batch_in_flight < 1 {
            return Err(invalid("batch_in_flight", "must be at least 1".into()));
        }
        if self.batch_len_max < 1 {
            return Err(invalid("batch_len_max", "must be at least 1".into()));
        }
        Ok(())
    }

    /// What the URL says, with `PGPASSWORD` for a missing password.
    pub(crate) fn conninfo(&self) -> Result<ConnInfo> {
        ConnInfo::parse(&self.url, |key| std::env::var(key).ok())
    }

    /// Every session setting keiro pins on its connections, as (name, value) pairs: the schema
    /// as `search_path`, [`TRANSACTION_ISOLATION`] as `default_transaction_isolation`, and a
    /// non-empty [`app_version`](#structfield.app_version) as `keiro.app_version`. The
    /// one list both the startup options ([`connection_config`](Self::connection_config)) and
    /// [`PgStore::restore_session`](crate::PgStore::restore_session) apply.
    ///
    /// ```
    /// let config = keiro_postgres::Config::default();
    /// assert_eq!(
    ///     config.session_settings(),
    ///     [("search_path", "keiro".to_owned()),
    ///      ("default_transaction_isolation", "read committed".to_owned())]
    /// );
    /// ```
    pub fn session_settings(&self) -> Vec<(&'static str, String)> {
        session_settings(&self.schema, &self.app_version)
    }

    /// The driver's settings: the URL plus keiro's session settings
    /// ([`session_settings`](Self::session_settings)) as startup options, so no statement ever
    /// has to set them, a recycled connection can never run in another schema, and a default
    /// isolation level the database or the role sets never reaches keiro's transactions.
    /// Connect with [`tls_connector`](Self::tls_connector), which knows how to verify the
    /// server.
    ///
    /// ```
    /// let config = keiro_postgres::Config::new("postgres://app@db/app?sslmode=verify-full");
    /// let driver = config.connection_config()?;
    /// assert_eq!(
    ///     driver.get_options(),
    ///     Some(r"-c search_path=keiro -c default_transaction_isolation=read\ committed")
    /// );
    /// # Ok::<(), keiro_postgres::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] on `url` when the URL cannot be read.
    pub fn connection_config(&self) -> Result<tokio_postgres::Config> {
        let mut config = self.conninfo()?.driver;
        let pinned = self
            .session_settings()
            .iter()
            .map(|(name, value)| format!("-c {name}={}", startup_option_value(value)))
            .collect::<Vec<_>>()
            .join(" ");
        // Appended after the URL's own options: a later `-c` wins, so keiro's settings win over
        // the same ones there.
        let options = match config.get_options() {
            Some(existing) if !existing.trim().is_empty() => format!("{existing} {pinned}"),
            _ => pinned,
        };
        config.options(options);
        if config.get_application_name().is_none() {
            config.application_name(&self.application_name);
        }
        config.connect_timeout(self.connect_timeout);
        Ok(config)
    }

    /// The TLS connector for the URL's `sslmode` and `sslrootcert`: what the store's pool and
    /// `LISTEN` connection use, for dedicated connections of your own. Reads `sslrootcert`, or
    /// the platform's trusted roots, when the mode verifies the server.
    ///
    /// ```
    /// use keiro_postgres::{Config, SslMode};
    ///
    /// let config = Config::new("postgres://app@db/app?sslmode=require");
    /// assert_eq!(config.tls_connector()?.mode(), SslMode::Require);
    /// # Ok::<(), keiro_postgres::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] on `url` when the URL cannot be read, `sslmode` is unknown, or the
    /// trusted roots cannot be read; [`Error::WeakSslMode`] for `sslrootcert=system` with a
    /// mode other than `verify-full`.
    pub fn tls_connector(&self) -> Result<TlsConnector> {
        self.conninfo()?
            .tls
            .connector()
            .map_err(|problem| invalid("url", problem))
    }

    /// The connection settings as a `key=value` string with the password as `***`, for logs
    /// and messages. Written from the parsed settings, so no spelling of a password shows; a
    /// URL that cannot be read is not shown at all.
    ///
    /// ```
    /// let config = keiro_postgres::Config::new("postgres://app:hunter2@db/app");
    /// assert_eq!(config.url_redacted(), "host=db port=5432 user=app password=*** dbname=app sslmode=prefer");
    /// let config = keiro_postgres::Config::new(r"host=db password = 'hunter 2\'s'");
    /// assert_eq!(config.url_redacted(), "host=db password=*** sslmode=prefer");
    /// ```
    pub fn url_redacted(&self) -> String {
        match self.conninfo() {
            Ok(info) => info.redacted(),
            Err(_) => UNREADABLE.to_owned(),
        }
    }
}

/// What is shown of a URL that cannot be parsed: nothing of it, since without parsing it
/// there is no telling where a password is.
const UNREADABLE: &str = "<a connection string keiro cannot read>";

/// The redacted URL and the schema, as messages name a store: `host=db ... (schema keiro)`.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (schema {})", self.url_redacted(), self.schema)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.url_redacted())
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("application_name", &self.application_name)
            .field("migrate", &self.migrate)
            .field("allow_shared_schema", &self.allow_shared_schema)
            .field("listen_check_interval", &self.listen_check_interval)
            .field("listen_check_timeout", &self.listen_check_timeout)
            .field("batching", &self.batching)
            .field("batch_in_flight", &self.batch_in_flight)
            .field("batch_len_max", &self.batch_len_max)
            .field("app_version", &self.app_version)
            .finish()
    }
}

/// keiro's session settings for a store on `schema` (see [`Config::session_settings`]).
pub(crate) fn session_settings(schema: &str, app_version: &str) -> Vec<(&'static str, String)> {
    let mut settings = vec![
        ("search_path", schema.to_owned()),
        (
            "default_transaction_isolation",
            TRANSACTION_ISOLATION.to_owned(),
        ),
    ];
    if !app_version.is_empty() {
        settings.push(("keiro.app_version", app_version.to_owned()));
    }
    settings
}

/// `value` as one word of the startup `options`, which the server splits at spaces unless a
/// backslash escapes them (`read\ committed`).
fn startup_option_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if c == ' ' || c == '\\' {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

fn invalid(field: &'static str, problem: String) -> Error {
    Error::Config { field, problem }
}

/// The schema is spliced into DDL and startup options as an identifier (neither accepts a
/// bind parameter), so only names that need no quoting or escaping anywhere are accepted.
fn validate_schema(schema: &str) -> Result<()> {
    let mut chars = schema.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !well_formed {
        return Err(invalid(
            "schema",
            format!("{schema:?} must match [a-z_][a-z0-9_]*"),
        ));
    }
    if schema.len() > SCHEMA_LEN_MAX {
        return Err(invalid(
            "schema",
            format!(
                "is {} bytes long, the limit is {SCHEMA_LEN_MAX}",
                schema.len()
            ),
        ));
    }
    Ok(())
}

/// Whether `schema` is one other roles usually may create objects in (`public`, where they
/// could before PostgreSQL 15 and still can in many databases) or one PostgreSQL reserves.
fn is_shared_schema(schema: &str) -> bool {
    schema == "public" || schema == "information_schema" || schema.starts_with("pg_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn schema_names_are_plain_identifiers_that_leave_room_for_the_channel() {
        for good in [
            "keiro",
            "_k",
            "keiro_test_0a1b",
            &"s".repeat(SCHEMA_LEN_MAX),
        ] {
            validate_schema(good).unwrap();
        }
        for bad in [
            "",
            "Keiro",
            "1keiro",
            "ke-iro",
            "ke iro",
            "k\"",
            "k;",
            &"s".repeat(SCHEMA_LEN_MAX + 1),
        ] {
            assert!(validate_schema(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(SCHEMA_LEN_MAX + WAKE_CHANNEL_SUFFIX.len(), 63);
    }

    #[test]
    fn shared_schemas_need_an_explicit_opt_in() {
        for shared in [
            "public",
            "information_schema",
            "pg_catalog",
            "pg_temp",
            "pg_keiro",
        ] {
            let config = Config {
                schema: shared.into(),
                ..Config::default()
            };
            assert!(
                matches!(
                    config.validate(),
                    Err(Error::Config {
                        field: "schema",
                        ..
                    })
                ),
                "{shared} should be refused"
            );
            config.allow_shared_schema(true).validate().unwrap();
        }
        for own in ["keiro", "publicity", "_pg_keiro", "keiro_pg_"] {
            Config {
                schema: own.into(),
                ..Config::default()
            }
            .validate()
            .unwrap();
        }
    }

    #[test]
    fn batching_is_the_default_and_its_bounds_name_their_field() {
        assert!(Config::default().batching);
        assert!(!Config::default().batching(false).batching);
        for (config, field) in [
            (
                Config {
                    batch_in_flight: 0,
                    ..Config::default()
                },
                "batch_in_flight",
            ),
            (
                Config {
                    batch_len_max: 0,
                    ..Config::default()
                },
                "batch_len_max",
            ),
        ] {
            assert!(
                matches!(config.validate(), Err(Error::Config { field: f, .. }) if f == field),
                "{field}"
            );
        }
    }

    #[test]
    fn migrating_on_connect_is_the_default_and_can_be_turned_off() {
        assert!(Config::default().migrate);
        assert!(!Config::default().migrate(false).migrate);
        assert!(!Config::default().allow_shared_schema);
    }

    #[test]
    fn bounds_name_their_field() {
        let config = Config {
            pool_size: 0,
            ..Config::default()
        };
        assert!(matches!(
            config.validate(),
            Err(Error::Config {
                field: "pool_size",
                ..
            })
        ));
        let config = Config {
            acquire_timeout: Duration::ZERO,
            ..Config::default()
        };
        assert!(matches!(
            config.validate(),
            Err(Error::Config {
                field: "acquire_timeout",
                ..
            })
        ));
        let config = Config::new("postgres://[::1");
        assert!(matches!(
            config.validate(),
            Err(Error::Config { field: "url", .. })
        ));
    }

    #[test]
    fn the_schema_becomes_the_search_path_after_the_urls_own_options() {
        let config = Config {
            schema: "tenant_a".into(),
            ..Config::new(
                "postgres://u@h/db?options=-c%20statement_timeout%3D5s&application_name=app",
            )
        };
        let pg = config.connection_config().unwrap();
        assert_eq!(
            pg.get_options(),
            Some(
                r"-c statement_timeout=5s -c search_path=tenant_a -c default_transaction_isolation=read\ committed"
            )
        );
        assert_eq!(pg.get_application_name(), Some("app"));
        let pg = Config::new("host=h user=u").connection_config().unwrap();
        assert_eq!(
            pg.get_options(),
            Some(r"-c search_path=keiro -c default_transaction_isolation=read\ committed")
        );
        assert_eq!(pg.get_application_name(), Some(APPLICATION_NAME_DEFAULT));
    }

    #[test]
    fn startup_options_escape_spaces_and_backslashes() {
        assert_eq!(startup_option_value("keiro"), "keiro");
        assert_eq!(startup_option_value("read committed"), "read\\ committed");
        assert_eq!(startup_option_value("a\\b"), "a\\\\b");
    }

    #[test]
    fn passwords_never_show() {
        for url in [
            "postgres://u:p%40zw@h:5432/db",
            "postgres://h/db?user=u&password=p%40zw&application_name=x",
            "host=h password=p@zw user=u",
            "host=h password='p@zw' user=u",
        ] {
            let config = Config::new(url);
            assert!(config.url_redacted().contains("password=***"), "{url}");
            assert!(!format!("{config:?} {config}").contains("zw"), "{url}");
        }
        assert_eq!(
            Config::new("postgres://u@h/db").url_redacted(),
            "host=h port=5432 user=u dbname=db sslmode=prefer"
        );
        assert_eq!(Config::new("host=h password='x").url_redacted(), UNREADABLE);
    }
}
