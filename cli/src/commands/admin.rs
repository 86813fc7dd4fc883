//! `verity admin`: users and API keys.

use anyhow::Context;
use clap::{Args, Subcommand};
use verity_core::config::DatabaseConfig;
use verity_core::tenancy::{self, Role};
use verity_server::api::auth::keys;

/// Administration commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Creates a user (and its org when new).
    CreateUser(CreateUserArgs),
    /// Creates an API key for a user and prints it once.
    CreateKey(CreateKeyArgs),
}

/// Arguments of `verity admin create-user`.
#[derive(Debug, Args)]
pub struct CreateUserArgs {
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Login e-mail.
    #[arg(long)]
    pub email: String,
    /// Org name (created when missing).
    #[arg(long)]
    pub org: String,
    /// admin or member.
    #[arg(long, default_value = "member")]
    pub role: String,
    /// Password for `POST /v1/auth/token` (else only API keys work).
    #[arg(long, env = "VERITY_USER_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,
}

/// Arguments of `verity admin create-key`.
#[derive(Debug, Args)]
pub struct CreateKeyArgs {
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// The user's e-mail.
    #[arg(long)]
    pub email: String,
    /// A label for the key.
    #[arg(long, default_value = "")]
    pub name: String,
}

/// Runs an admin command.
pub async fn run(command: &AdminCommand) -> anyhow::Result<()> {
    match command {
        AdminCommand::CreateUser(args) => {
            let pool = verity_core::db::connect(&args.db.database_url, 2).await?;
            verity_core::db::migrate(&pool).await?;
            let user =
                create_user(&pool, &args.email, &args.org, &args.role, args.password.as_deref())
                    .await?;
            println!(
                "{}",
                serde_json::json!({"user_id": user.id, "org_id": user.org_id, "email": user.email, "role": user.role})
            );
            Ok(())
        }
        AdminCommand::CreateKey(args) => {
            let pool = verity_core::db::connect(&args.db.database_url, 2).await?;
            verity_core::db::migrate(&pool).await?;
            let key = create_key(&pool, &args.email, &args.name).await?;
            println!("{}", serde_json::json!({"api_key": key, "note": "shown once; store it now"}));
            Ok(())
        }
    }
}

/// Creates a user in org `org` (created when missing), hashing the password if any.
pub async fn create_user(
    pool: &sqlx::PgPool,
    email: &str,
    org: &str,
    role: &str,
    password: Option<&str>,
) -> anyhow::Result<tenancy::User> {
    let role: Role = role.parse()?;
    if !email.contains('@') || email.starts_with('@') {
        anyhow::bail!("invalid e-mail {email:?}");
    }
    if org.trim().is_empty() {
        anyhow::bail!("the org name must not be empty");
    }
    let hash = match password {
        Some(p) if p.len() < 8 => anyhow::bail!("passwords need at least 8 characters"),
        Some(p) => {
            Some(keys::hash_secret(p).map_err(|e| anyhow::anyhow!("hashing the password: {e}"))?)
        }
        None => None,
    };
    let org_id = tenancy::ensure_org(pool, org).await.context("creating the org")?;
    Ok(tenancy::create_user(pool, org_id, email, role, hash.as_deref()).await?)
}

/// Creates an API key for the user `email`; returns the key (shown once).
pub async fn create_key(pool: &sqlx::PgPool, email: &str, name: &str) -> anyhow::Result<String> {
    let user = tenancy::find_user_by_email(pool, email)
        .await?
        .ok_or_else(|| tenancy::TenancyError::NoSuchUser(email.to_string()))?;
    let key = keys::generate_key();
    let hash = keys::hash_secret(&key.key).map_err(|e| anyhow::anyhow!("hashing the key: {e}"))?;
    tenancy::insert_api_key(pool, &user, name, &key.lookup, &hash, Default::default()).await?;
    Ok(key.key)
}
