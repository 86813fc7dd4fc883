//! `verity migrate`.

use anyhow::Context;
use verity_core::config::DatabaseConfig;

/// Applies pending migrations.
pub async fn run(config: &DatabaseConfig) -> anyhow::Result<()> {
    let pool = verity_core::db::connect(&config.database_url, 2).await?;
    verity_core::db::migrate(&pool).await.context("migrating the database")?;
    let applied = verity_core::db::MIGRATOR.iter().count();
    println!("{{\"migrations\": {applied}, \"status\": \"up to date\"}}");
    Ok(())
}
