//! The rows behind the Tinker API (migration `0017_tinker.sql`): a client's session, the
//! sampling sessions it opens, and the futures its calls return. Every read and write is scoped
//! to the caller's org: another org's ids look like unknown ones.
pub mod clients;
pub mod training;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// Futures are kept this long after they are created (then deleted as sessions open).
pub const FUTURE_RETENTION_HOURS: i32 = 24;

/// Most characters of a session's display name.
pub const MAX_DISPLAY_NAME_CHARS: usize = 256;

/// What a client sends when it opens a session.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// The SDK's tags (a JSON array of strings).
    pub tags: Value,
    /// The user's metadata (a JSON object).
    pub user_metadata: Value,
    /// A name for people, 1 to [`MAX_DISPLAY_NAME_CHARS`] characters (not unique).
    pub display_name: Option<String>,
}

/// Opens a session for `org_id`; returns its id (`sess-…`). Futures older than
/// [`FUTURE_RETENTION_HOURS`] are deleted here, once per client, not on each call.
pub async fn create_session(
    pool: &PgPool,
    org_id: Uuid,
    user_id: Option<Uuid>,
    session: &NewSession,
) -> Result<String, sqlx::Error> {
    sqlx::query!(
        "DELETE FROM tinker_futures WHERE created_at < now() - make_interval(hours => $1)",
        FUTURE_RETENTION_HOURS
    )
    .execute(pool)
    .await?;
    let id = format!("sess-{}", Uuid::new_v4().simple());
    sqlx::query!(
        "INSERT INTO tinker_sessions (id, org_id, user_id, tags, user_metadata, display_name) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        id,
        org_id,
        user_id,
        session.tags,
        session.user_metadata,
        session.display_name
    )
    .execute(pool)
    .await?;
    Ok(id)
}

/// A session with what it opened: the SDK's `GetSessionResponse` and the dashboard's row.
#[derive(Debug, Clone)]
pub struct SessionRecord {
    /// `sess-…`.
    pub id: String,
    /// The name given at creation, if any.
    pub display_name: Option<String>,
    /// The user's metadata (a JSON object).
    pub user_metadata: Value,
    /// The SDK's tags (a JSON array).
    pub tags: Value,
    /// When it opened.
    pub created_at: DateTime<Utc>,
    /// Its latest heartbeat.
    pub last_heartbeat_at: DateTime<Utc>,
    /// When it finished, if it has.
    pub finished_at: Option<DateTime<Utc>>,
    /// Why it finished: the `reason.type` its client sent to `finish` (`success` by default).
    pub finish_reason: Option<String>,
    /// The training runs (`tinkjob-…`) of its training clients, oldest first.
    pub training_run_ids: Vec<String>,
    /// Its sampling sessions, oldest first.
    pub sampler_ids: Vec<String>,
}

/// The org's sessions, newest first: a page of `limit` from `offset`, and how many there are.
pub async fn list_sessions(
    pool: &PgPool,
    org_id: Uuid,
    limit: i64,
    offset: i64,
) -> Result<(Vec<SessionRecord>, i64), sqlx::Error> {
    let total = sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM tinker_sessions WHERE org_id = $1"#,
        org_id
    )
    .fetch_one(pool)
    .await?;
    Ok((read_sessions(pool, org_id, None, limit, offset).await?, total))
}

/// Session `id` of the org with its training runs and samplers; `None` when the org has none.
pub async fn session(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<SessionRecord>, sqlx::Error> {
    Ok(read_sessions(pool, org_id, Some(id), 1, 0).await?.pop())
}

/// The org's sessions (only `id`, when given), newest first, each with the runs and samplers it
/// opened, in one query: a page of `limit` from `offset`.
async fn read_sessions(
    pool: &PgPool,
    org_id: Uuid,
    id: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<SessionRecord>, sqlx::Error> {
    sqlx::query_as!(
        SessionRecord,
        r#"SELECT s.id, s.display_name, s.user_metadata, s.tags, s.created_at,
                  s.last_heartbeat_at, s.finished_at, s.finish_reason,
                  ARRAY(SELECT m.job_id FROM tinker_models m
                        WHERE m.session_id = s.id AND m.org_id = s.org_id
                        ORDER BY m.created_at, m.id) AS "training_run_ids!",
                  ARRAY(SELECT p.id FROM tinker_sampling_sessions p
                        WHERE p.session_id = s.id AND p.org_id = s.org_id
                        ORDER BY p.created_at, p.id) AS "sampler_ids!"
           FROM tinker_sessions s
           WHERE s.org_id = $1 AND ($2::text IS NULL OR s.id = $2)
           ORDER BY s.created_at DESC, s.id DESC LIMIT $3 OFFSET $4"#,
        org_id,
        id,
        limit,
        offset
    )
    .fetch_all(pool)
    .await
}

/// Records a heartbeat of session `id`; false when the org has no such open session.
pub async fn heartbeat(pool: &PgPool, org_id: Uuid, id: &str) -> Result<bool, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE tinker_sessions SET last_heartbeat_at = now() \
         WHERE id = $1 AND org_id = $2 AND finished_at IS NULL",
        id,
        org_id
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Why a session closed when its client stopped beating: [`expire_sessions`] closed it.
pub const HEARTBEAT_TIMEOUT_REASON: &str = "heartbeat_timeout";

/// Closes session `id` with `reason`; false when the org has no such session.
pub async fn finish_session(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let done = sqlx::query!(
        "UPDATE tinker_sessions SET finished_at = coalesce(finished_at, now()), \
         finish_reason = coalesce(finish_reason, $3) WHERE id = $1 AND org_id = $2",
        id,
        org_id,
        reason
    )
    .execute(&mut *tx)
    .await?;
    end_parked_clients(&mut tx, org_id, id).await?;
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// Closes every open session whose client has sent no heartbeat for `timeout` (its process
/// died, its machine went away), as a `finish` with reason [`HEARTBEAT_TIMEOUT_REASON`] would:
/// its parked training clients end, and the workers holding its live ones release them. A
/// heartbeat that lands first keeps the session open. Returns the ids it closed.
pub async fn expire_sessions(
    pool: &PgPool,
    timeout: std::time::Duration,
) -> Result<Vec<String>, sqlx::Error> {
    let secs = timeout.as_secs_f64();
    let stale = sqlx::query!(
        "SELECT id, org_id FROM tinker_sessions \
         WHERE finished_at IS NULL AND last_heartbeat_at < now() - make_interval(secs => $1)",
        secs
    )
    .fetch_all(pool)
    .await?;
    let mut closed = Vec::new();
    for session in stale {
        let mut tx = pool.begin().await?;
        // Checked again under the row's lock: a heartbeat since the read keeps it open.
        let done = sqlx::query!(
            "UPDATE tinker_sessions SET finished_at = now(), finish_reason = $2 \
             WHERE id = $1 AND finished_at IS NULL \
               AND last_heartbeat_at < now() - make_interval(secs => $3)",
            session.id,
            HEARTBEAT_TIMEOUT_REASON,
            secs
        )
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 1 {
            end_parked_clients(&mut tx, session.org_id, &session.id).await?;
            closed.push(session.id);
        }
        tx.commit().await?;
    }
    if !closed.is_empty() {
        tracing::info!(sessions = ?closed, "tinker sessions without a heartbeat closed");
    }
    Ok(closed)
}

/// Ends the parked training clients of session `id` (closed in `tx`): nothing will call them
/// again. (A client being parked now either sees the session finished or is parked before this
/// reads it: see `clients::park`.)
async fn end_parked_clients(
    tx: &mut sqlx::PgConnection,
    org_id: Uuid,
    id: &str,
) -> Result<(), sqlx::Error> {
    let ended = sqlx::query!(
        "UPDATE jobs SET state = 'succeeded', finished_at = now(), control = 'none', \
                         result = '{\"released\": \"session_finished\"}'::jsonb \
         WHERE state = 'paused' AND org_id = $2 \
           AND id IN (SELECT job_id FROM tinker_models WHERE session_id = $1 AND org_id = $2)",
        id,
        org_id
    )
    .execute(&mut *tx)
    .await?;
    if ended.rows_affected() > 0 {
        tracing::info!(
            session_id = id,
            clients = ended.rows_affected(),
            "parked tinker clients ended"
        );
    }
    Ok(())
}

/// What a sampling session samples.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingModel {
    /// The Verity model.
    pub model: String,
    /// The published `tinker://` path of another org it samples through (`None`: a model of
    /// the session's own org).
    pub model_path: Option<String>,
}

/// Opens the sampling session `seq` of session `session_id` on `model` (the same call again
/// answers the same id); `None` when the org has no such open session.
pub async fn create_sampling_session(
    pool: &PgPool,
    org_id: Uuid,
    session_id: &str,
    seq: i64,
    model: &SamplingModel,
) -> Result<Option<String>, sqlx::Error> {
    let id = format!("{session_id}:sample:{seq}");
    let row = sqlx::query!(
        "INSERT INTO tinker_sampling_sessions (id, session_id, org_id, model, model_path) \
         SELECT $1, s.id, s.org_id, $4, $5 FROM tinker_sessions s \
         WHERE s.id = $2 AND s.org_id = $3 AND s.finished_at IS NULL \
         ON CONFLICT (id) DO UPDATE SET model = tinker_sampling_sessions.model \
         RETURNING id",
        id,
        session_id,
        org_id,
        model.model,
        model.model_path
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| r.id))
}

/// What sampling session `id` samples; `None` when the org has no such session.
pub async fn sampling_model(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<SamplingModel>, sqlx::Error> {
    sqlx::query_as!(
        SamplingModel,
        "SELECT model, model_path FROM tinker_sampling_sessions WHERE id = $1 AND org_id = $2",
        id,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// A call's future as stored.
#[derive(Debug, Clone)]
pub struct FutureRecord {
    /// The call (`sample`, …).
    pub kind: String,
    /// When the call was made.
    pub created_at: DateTime<Utc>,
    /// Set once the call ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// The result's media type, once it succeeded.
    pub content_type: Option<String>,
    /// The result, once it succeeded.
    pub result: Option<Vec<u8>>,
    /// `{"error", "category"}`, once it failed.
    pub error: Option<Value>,
}

/// A new pending future of `kind` for `org_id` (`req-…`).
pub async fn create_future(pool: &PgPool, org_id: Uuid, kind: &str) -> Result<String, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    create_future_in(&mut conn, org_id, kind).await
}

/// [`create_future`] on a given connection (e.g. inside a transaction).
pub(crate) async fn create_future_in(
    conn: &mut sqlx::PgConnection,
    org_id: Uuid,
    kind: &str,
) -> Result<String, sqlx::Error> {
    let id = format!("req-{}", Uuid::new_v4().simple());
    sqlx::query!(
        "INSERT INTO tinker_futures (id, org_id, kind) VALUES ($1, $2, $3)",
        id,
        org_id,
        kind
    )
    .execute(conn)
    .await?;
    Ok(id)
}

/// Whether `org_id` has session `id` open.
pub async fn session_is_open(pool: &PgPool, org_id: Uuid, id: &str) -> Result<bool, sqlx::Error> {
    let open = sqlx::query_scalar!(
        "SELECT count(*) FROM tinker_sessions WHERE id = $1 AND org_id = $2 AND finished_at IS NULL",
        id,
        org_id
    )
    .fetch_one(pool)
    .await?;
    Ok(open.unwrap_or(0) > 0)
}

/// Futures of `org_id` still pending (created within [`FUTURE_RETENTION_HOURS`]).
pub async fn pending_futures(pool: &PgPool, org_id: Uuid) -> Result<i64, sqlx::Error> {
    let count = sqlx::query_scalar!(
        "SELECT count(*) FROM tinker_futures WHERE org_id = $1 AND finished_at IS NULL \
         AND created_at > now() - make_interval(hours => $2)",
        org_id,
        FUTURE_RETENTION_HOURS
    )
    .fetch_one(pool)
    .await?;
    Ok(count.unwrap_or(0))
}

/// Stores the result of future `id`.
pub async fn complete_future(
    pool: &PgPool,
    id: &str,
    content_type: &str,
    result: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE tinker_futures SET finished_at = now(), content_type = $2, result = $3 \
         WHERE id = $1 AND finished_at IS NULL",
        id,
        content_type,
        result
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Stores the failure of future `id` (`{"error", "category"}`).
pub async fn fail_future(pool: &PgPool, id: &str, error: &Value) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE tinker_futures SET finished_at = now(), error = $2 \
         WHERE id = $1 AND finished_at IS NULL",
        id,
        error
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Future `id` of `org_id`; `None` when the org has no such future.
pub async fn future(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<FutureRecord>, sqlx::Error> {
    sqlx::query_as!(
        FutureRecord,
        "SELECT kind, created_at, finished_at, content_type, result, error \
         FROM tinker_futures WHERE id = $1 AND org_id = $2",
        id,
        org_id
    )
    .fetch_optional(pool)
    .await
}
