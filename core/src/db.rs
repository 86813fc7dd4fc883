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

/// Opens a pool of at most `max_connections` to `database_url`.
pub async fn connect(database_url: &str, max_connections: u32) -> Result<PgPool, DbError> {
    let options = PgConnectOptions::from_str(database_url).map_err(DbError::BadUrl)?;
    let target = format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("")
    );
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .map_err(|source| DbError::Connect { target, source })
}

/// Applies pending migrations; concurrent callers are serialised by sqlx's advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}
