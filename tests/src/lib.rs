//! Helpers shared by Verity's end-to-end tests (the tests themselves live in `tests/tests/`).

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
