//! Orgs, users and API keys: the rows behind authentication and tenancy.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::fmt;
use std::str::FromStr;
use uuid::Uuid;

/// What a user may do inside their org.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Manages the org (and shared base models).
    Admin,
    /// Uses the org's resources.
    Member,
}

impl Role {
    /// The name stored in `users.role`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name other than `admin` or `member`.
#[derive(Debug, thiserror::Error)]
#[error("unknown role {0:?} (expected admin or member)")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Role, UnknownRole> {
        match s {
            "admin" => Ok(Role::Admin),
            "member" => Ok(Role::Member),
            other => Err(UnknownRole(other.to_string())),
        }
    }
}

/// A user row.
#[derive(Debug, Clone)]
pub struct User {
    /// User id.
    pub id: Uuid,
    /// Owning org.
    pub org_id: Uuid,
    /// Login e-mail (unique).
    pub email: String,
    /// Argon2 PHC string, when the user may log in with a password.
    pub password_hash: Option<String>,
    /// `admin` or `member`.
    pub role: String,
}

/// An API key row, joined with its user's role.
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    /// Key id.
    pub id: Uuid,
    /// Owning org.
    pub org_id: Uuid,
    /// Owning user.
    pub user_id: Uuid,
    /// Argon2 PHC string of the whole key.
    pub key_hash: String,
    /// The key's role: the one chosen at creation, never above the user's.
    pub role: String,
    /// Set once the key is revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// When the key stops working, if it expires.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Failures of tenancy writes.
#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    /// A user with this e-mail already exists.
    #[error("a user with e-mail {0} already exists")]
    EmailTaken(String),
    /// No user with this e-mail.
    #[error("no user with e-mail {0}")]
    NoSuchUser(String),
    /// A database error.
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
}

/// The id of the org called `name`, created if missing.
pub async fn ensure_org(pool: &PgPool, name: &str) -> Result<Uuid, TenancyError> {
    let id = sqlx::query_scalar!(
        r#"INSERT INTO orgs (id, name) VALUES ($1, $2)
           ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
           RETURNING id"#,
        Uuid::new_v4(),
        name
    )
    .fetch_one(pool)
    .await?;
    Ok(id)
}

/// Creates a user; fails with [`TenancyError::EmailTaken`] when the e-mail is in use.
pub async fn create_user(
    pool: &PgPool,
    org_id: Uuid,
    email: &str,
    role: Role,
    password_hash: Option<&str>,
) -> Result<User, TenancyError> {
    let id = Uuid::new_v4();
    let inserted = sqlx::query!(
        r#"INSERT INTO users (id, org_id, email, password_hash, role) VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (email) DO NOTHING"#,
        id,
        org_id,
        email,
        password_hash,
        role.as_str()
    )
    .execute(pool)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(TenancyError::EmailTaken(email.to_string()));
    }
    Ok(User {
        id,
        org_id,
        email: email.to_string(),
        password_hash: password_hash.map(str::to_string),
        role: role.as_str().to_string(),
    })
}

/// The user with this e-mail, if any.
pub async fn find_user_by_email(pool: &PgPool, email: &str) -> Result<Option<User>, TenancyError> {
    let user = sqlx::query_as!(
        User,
        "SELECT id, org_id, email, password_hash, role FROM users WHERE email = $1",
        email
    )
    .fetch_optional(pool)
    .await?;
    Ok(user)
}

/// What a new key may do and for how long.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyGrant {
    /// The key's role (`None`: the owner's); a key is never above its owner.
    pub role: Option<Role>,
    /// When the key stops working (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
}

/// Stores a new API key (already hashed) for `user` with `grant`; returns its id.
pub async fn insert_api_key(
    pool: &PgPool,
    user: &User,
    name: &str,
    prefix: &str,
    key_hash: &str,
    grant: KeyGrant,
) -> Result<Uuid, TenancyError> {
    let id = Uuid::new_v4();
    sqlx::query!(
        "INSERT INTO api_keys (id, org_id, user_id, name, prefix, key_hash, role, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        id,
        user.org_id,
        user.id,
        name,
        prefix,
        key_hash,
        grant.role.map(Role::as_str),
        grant.expires_at
    )
    .execute(pool)
    .await?;
    Ok(id)
}

/// The API key whose stored prefix is `prefix`, with its user's role.
pub async fn find_api_key(
    pool: &PgPool,
    prefix: &str,
) -> Result<Option<ApiKeyRecord>, TenancyError> {
    let key = sqlx::query_as!(
        ApiKeyRecord,
        r#"SELECT k.id, k.org_id, k.user_id, k.key_hash, k.revoked_at, k.expires_at,
                  CASE WHEN u.role = 'admin' AND COALESCE(k.role, 'admin') = 'admin'
                       THEN 'admin' ELSE 'member' END AS "role!"
           FROM api_keys k JOIN users u ON u.id = k.user_id
           WHERE k.prefix = $1"#,
        prefix
    )
    .fetch_optional(pool)
    .await?;
    Ok(key)
}

/// An API key as listed to its org (no secret, no hash).
#[derive(Debug, Clone)]
pub struct ApiKeyInfo {
    /// Key id.
    pub id: Uuid,
    /// Owning user.
    pub user_id: Uuid,
    /// Label given at creation.
    pub name: String,
    /// The first characters of the key.
    pub prefix: String,
    /// The key's role (its powers): the one chosen at creation, never above the owner's.
    pub role: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// When the key stops working, if it expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// Last time the key was verified against its hash.
    pub last_used_at: Option<DateTime<Utc>>,
    /// Set once revoked.
    pub revoked_at: Option<DateTime<Utc>>,
}

/// The org's API keys, newest first; only `user_id`'s when given.
pub async fn list_api_keys(
    pool: &PgPool,
    org_id: Uuid,
    user_id: Option<Uuid>,
) -> Result<Vec<ApiKeyInfo>, TenancyError> {
    let keys = sqlx::query_as!(
        ApiKeyInfo,
        r#"SELECT k.id, k.user_id, k.name, k.prefix, k.created_at, k.last_used_at, k.revoked_at,
                  k.expires_at,
                  CASE WHEN u.role = 'admin' AND COALESCE(k.role, 'admin') = 'admin'
                       THEN 'admin' ELSE 'member' END AS "role!"
           FROM api_keys k JOIN users u ON u.id = k.user_id
           WHERE k.org_id = $1 AND ($2::uuid IS NULL OR k.user_id = $2)
           ORDER BY k.created_at DESC, k.id"#,
        org_id,
        user_id
    )
    .fetch_all(pool)
    .await?;
    Ok(keys)
}

/// Channel on which a revocation announces the key's id, and a change of a user's role or org
/// (or its deletion) announces `user:<id>` (migration `0013_sessions.sql`): every server evicts
/// what it cached about them.
pub const KEY_REVOKED_CHANNEL: &str = "verity_api_key_revoked";

/// Revokes the org's key `id` and announces it on [`KEY_REVOKED_CHANNEL`] (delivered when the
/// statement commits); false when the org has no such key. Revoking twice is a no-op.
pub async fn revoke_api_key(pool: &PgPool, org_id: Uuid, id: Uuid) -> Result<bool, TenancyError> {
    let found = sqlx::query!(
        r#"WITH revoked AS (
               UPDATE api_keys SET revoked_at = COALESCE(revoked_at, now())
               WHERE id = $1 AND org_id = $2 RETURNING id)
           SELECT id, pg_notify('verity_api_key_revoked', id::text) AS "notified"
           FROM revoked"#,
        id,
        org_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(found.is_some())
}

/// Whether an existing key may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyLiveness {
    /// Set once revoked.
    pub revoked: bool,
    /// When it expires, if it does.
    pub expires_at: Option<DateTime<Utc>>,
}

impl KeyLiveness {
    /// Neither revoked nor expired at `now`.
    pub fn usable_at(&self, now: DateTime<Utc>) -> bool {
        !self.revoked && self.expires_at.is_none_or(|at| at > now)
    }
}

/// Whether key `id` is revoked and when it expires; `None` when no such key.
pub async fn api_key_live(pool: &PgPool, id: Uuid) -> Result<Option<KeyLiveness>, TenancyError> {
    let row = sqlx::query!("SELECT revoked_at, expires_at FROM api_keys WHERE id = $1", id)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| KeyLiveness { revoked: r.revoked_at.is_some(), expires_at: r.expires_at }))
}

/// What a revocation listener learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRevocation {
    /// This key was revoked (by any server).
    Revoked(Uuid),
    /// This user's role or org changed, or the user was deleted (and their keys with them).
    UserChanged(Uuid),
    /// The listening connection was lost (or an announcement was unreadable): revocations may
    /// be missed until `Subscribed`.
    Lost,
    /// Subscribed (again): every revocation from now on is announced; earlier ones may not be.
    Subscribed,
}

/// Calls `on_event` for every key revoked from now on, from a background task that
/// re-subscribes by itself when its connection drops; `Subscribed` comes once before this
/// returns. Fails only if the first LISTEN fails.
pub async fn listen_for_key_revocations<F>(
    pool: &PgPool,
    on_event: F,
) -> Result<tokio::task::JoinHandle<()>, sqlx::Error>
where
    F: Fn(KeyRevocation) + Send + Sync + 'static,
{
    use crate::change_feed::JobChange;
    crate::change_feed::listen(pool, KEY_REVOKED_CHANNEL, move |change| {
        on_event(match change {
            JobChange::Changed(payload) => {
                match payload.strip_prefix("user:") {
                    Some(user) => Uuid::parse_str(user)
                        .map_or(KeyRevocation::Lost, KeyRevocation::UserChanged),
                    None => Uuid::parse_str(&payload)
                        .map_or(KeyRevocation::Lost, KeyRevocation::Revoked),
                }
            }
            JobChange::Lost => KeyRevocation::Lost,
            JobChange::Subscribed => KeyRevocation::Subscribed,
        })
    })
    .await
}

/// Records that key `id` was just used.
pub async fn touch_api_key(pool: &PgPool, id: Uuid) -> Result<(), TenancyError> {
    sqlx::query!("UPDATE api_keys SET last_used_at = now() WHERE id = $1", id)
        .execute(pool)
        .await?;
    Ok(())
}

/// The user with this id, if any.
pub async fn find_user_by_id(pool: &PgPool, id: Uuid) -> Result<Option<User>, TenancyError> {
    let user = sqlx::query_as!(
        User,
        "SELECT id, org_id, email, password_hash, role FROM users WHERE id = $1",
        id
    )
    .fetch_optional(pool)
    .await?;
    Ok(user)
}
