//! The per-test database of `sqlx::test`, as child processes reach it.

use sqlx::PgPool;

/// A URL for the database behind `pool` (the per-test database of `sqlx::test`), for child
/// processes: `DATABASE_URL` with its database name replaced.
pub async fn database_url_of(pool: &PgPool) -> anyhow::Result<String> {
    let base = std::env::var("DATABASE_URL")?;
    let name = verity_core::db::current_database(pool).await?;
    let (server, _) = base
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("DATABASE_URL has no database part"))?;
    Ok(format!("{server}/{name}"))
}
