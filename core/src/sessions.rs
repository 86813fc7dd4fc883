//! Dashboard sessions: the rows behind the session cookie. The cookie holds a random id; only
//! its SHA-256 (`id_hash`) is stored, with the user, the API key the session was opened with
//! and the expiry (migration `0013_sessions.sql`), which activity moves later
//! ([`renew_session`]).

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// A live session with the current state of its user and key.
#[derive(Debug, Clone)]
pub struct SessionState {
    /// The signed-in user.
    pub user_id: Uuid,
    /// The user's org (now).
    pub org_id: Uuid,
    /// The API key the session was opened with (`None`: a password).
    pub key_id: Option<Uuid>,
    /// When the session was opened.
    pub created_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub expires_at: DateTime<Utc>,
    /// The role now: the user's, capped by the key's when opened with one.
    pub role: String,
    /// True once the session's key is revoked.
    pub key_revoked: bool,
    /// When the session's key expires, if it does.
    pub key_expires_at: Option<DateTime<Utc>>,
}

/// Stores a session of `user_id` (opened with `key_id`, if any) valid until `expires_at`, and
/// deletes sessions that expired more than a day ago.
pub async fn create_session(
    pool: &PgPool,
    id_hash: &[u8],
    user_id: Uuid,
    key_id: Option<Uuid>,
    expires_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query!("DELETE FROM sessions WHERE expires_at < now() - interval '1 day'")
        .execute(pool)
        .await?;
    sqlx::query!(
        "INSERT INTO sessions (id_hash, user_id, key_id, expires_at) VALUES ($1, $2, $3, $4)",
        id_hash,
        user_id,
        key_id,
        expires_at
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The session with this id hash, unless unknown, revoked or expired; its user's and key's
/// current state are read with it (a deleted user or key deletes the session).
pub async fn find_session(
    pool: &PgPool,
    id_hash: &[u8],
) -> Result<Option<SessionState>, sqlx::Error> {
    sqlx::query_as!(
        SessionState,
        r#"SELECT s.user_id, u.org_id, s.key_id, s.created_at, s.expires_at,
                  CASE WHEN u.role = 'admin'
                        AND (s.key_id IS NULL OR COALESCE(k.role, 'admin') = 'admin')
                       THEN 'admin' ELSE 'member' END AS "role!",
                  k.revoked_at IS NOT NULL AS "key_revoked!",
                  k.expires_at AS "key_expires_at?"
           FROM sessions s
           JOIN users u ON u.id = s.user_id
           LEFT JOIN api_keys k ON k.id = s.key_id
           WHERE s.id_hash = $1 AND s.revoked_at IS NULL AND s.expires_at > now()"#,
        id_hash
    )
    .fetch_optional(pool)
    .await
}

/// Moves the expiry of the live session with this id hash later, to `expires_at` (never
/// earlier); false when there is no live session to renew or it already lasts that long.
pub async fn renew_session(
    pool: &PgPool,
    id_hash: &[u8],
    expires_at: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let renewed = sqlx::query!(
        "UPDATE sessions SET expires_at = $2
         WHERE id_hash = $1 AND revoked_at IS NULL AND expires_at > now() AND expires_at < $2",
        id_hash,
        expires_at
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(renewed > 0)
}

/// Revokes the session with this id hash; false when there is no live one.
pub async fn revoke_session(pool: &PgPool, id_hash: &[u8]) -> Result<bool, sqlx::Error> {
    let revoked = sqlx::query!(
        "UPDATE sessions SET revoked_at = now() WHERE id_hash = $1 AND revoked_at IS NULL",
        id_hash
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(revoked > 0)
}
