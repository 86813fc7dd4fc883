//! Postgres connection pool and migrations.

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;

/// The migrations in `migrations/`, embedded at compile time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Failures while connecting to or migrating the database.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The URL could not be parsed.
    #[error("invalid DATABASE_URL: {0}")]
    BadUrl(#[source] sqlx::Error),
    /// The server could not be reached.
    #[error("cannot connect to Postgres at {target}: {source}")]
    Connect {
        /// Host and database, without credentials.
        target: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

/// How long workers and commands wait for a pooled connection; the API uses a shorter one
/// (`--db-acquire-timeout-seconds`) so requests fail fast with 503 while Postgres is down.
pub const WORKER_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Opens a pool of at most `max_connections` to `database_url`, waiting up to
/// [`WORKER_ACQUIRE_TIMEOUT`] for a connection.
pub async fn connect(database_url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    connect_with_timeout(database_url, max_connections, WORKER_ACQUIRE_TIMEOUT).await
}

/// Opens a pool of at most `max_connections` to `database_url` whose acquires (connecting
/// included) give up with `sqlx::Error::PoolTimedOut` after `acquire_timeout`.
pub async fn connect_with_timeout(
    database_url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, DbError> {
    let options = PgConnectOptions::from_str(database_url).map_err(DbError::BadUrl)?;
    let target = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    );
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|source| DbError::Connect { target, source })
}

/// Applies pending migrations; concurrent callers are serialised by sqlx's advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// One round trip to the database (readiness probes).
pub async fn ping(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT 1 AS "one!""#).fetch_one(pool).await.map(|_| ())
}

/// The name of the database `pool` is connected to.
pub async fn current_database(pool: &PgPool) -> Result<String, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT current_database() AS "name!""#).fetch_one(pool).await
}

/// `name` as a quoted SQL identifier (DDL such as `CREATE DATABASE` takes no bind parameters).
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates database `name` on the server of `conn` unless it exists; true if it was created.
pub async fn create_database_if_missing(
    conn: &mut sqlx::PgConnection,
    name: &str,
) -> Result<bool, sqlx::Error> {
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#,
        name
    )
    .fetch_one(&mut *conn)
    .await?;
    if exists {
        return Ok(false);
    }
    sqlx::raw_sql(&format!("CREATE DATABASE {}", quote_identifier(name))).execute(conn).await?;
    Ok(true)
}

/// Drops database `name` if it exists, ending its sessions first.
pub async fn drop_database(conn: &mut sqlx::PgConnection, name: &str) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_identifier(name)))
        .execute(conn)
        .await
        .map(|_| ())
}
