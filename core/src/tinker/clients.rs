//! Tinker training clients on the queue (migration `0018_tinker_training.sql`): a client is a
//! queue row of kind `tinker` that a training worker claims and holds, and its calls wait in
//! `tinker_calls` until the worker runs them in the client's order. Every read and write the API
//! makes is scoped to the caller's org; every write the worker makes is fenced by its attempt.

use super::create_future_in;
use crate::queue::{NewJob, Queue, QueueError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

/// `jobs.kind` of Tinker training clients.
pub const TINKER: &str = "tinker";

/// The queue row's id prefix.
const JOB_PREFIX: &str = "tinkjob";

/// The kind of the call that fills a refused call's place in its client's order (its future
/// fails at once; the SDK already had its 400).
pub const REFUSED: &str = "refused";

/// The future kinds of the calls a training client runs in order.
pub const ORDERED_CALLS: [&str; 8] = [
    "forward_backward",
    "forward",
    "optim_step",
    "save_weights_for_sampler",
    "save_weights",
    "save_weights_external",
    "load_weights",
    REFUSED,
];

/// What a training client's queue row holds (`spec.tinker`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientSpec {
    /// `<session>:train:<n>`.
    pub model_id: String,
    /// The Tinker session that made it.
    pub session_id: String,
    /// The model it trains.
    pub base_model: String,
    /// LoRA rank; `None` trains every weight (a Verity extension).
    pub lora_rank: Option<u32>,
    /// LoRA adapter seed.
    #[serde(default)]
    pub seed: u64,
    /// The `create_model` future, completed once the model is resident.
    pub create_future: String,
    /// Saved weights to start from (`create_training_client_from_state`).
    #[serde(default)]
    pub restore: Option<Restore>,
}

/// Saved weights a client loads: the checkpoint of the run that saved them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restore {
    /// The run (`tinkjob-…`) whose checkpoint holds them.
    pub job_id: String,
    /// Its step.
    pub step: i32,
    /// Whether the optimizer's state is loaded too.
    pub optimizer: bool,
}

impl ClientSpec {
    /// The client spec of a queue row's `spec`, if it is a Tinker client.
    pub fn of_job(spec: &Value) -> Option<Result<ClientSpec, serde_json::Error>> {
        let client = spec.get(TINKER)?;
        Some(serde_json::from_value(client.clone()))
    }
}

/// A new training client: its id and the future of its creation.
#[derive(Debug, Clone, PartialEq)]
pub struct CreatedClient {
    /// `<session>:train:<n>`.
    pub model_id: String,
    /// The `create_model` future.
    pub future_id: String,
}

/// Why a client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum CreateClientError {
    /// The org has no such open session.
    #[error("no open session {0}")]
    NoSession(String),
    /// The queue refused the row (e.g. the org's queue is full).
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Settings of a new training client.
#[derive(Debug, Clone)]
pub struct NewClient<'a> {
    /// The session asking.
    pub session_id: &'a str,
    /// Its per-session model counter (`model_seq_id`).
    pub seq: i64,
    /// The model to train (checked by the caller).
    pub base_model: &'a str,
    /// LoRA rank, or `None` for every weight.
    pub lora_rank: Option<u32>,
    /// LoRA adapter seed.
    pub seed: u64,
    /// The user asking.
    pub user_id: Option<Uuid>,
    /// Saved weights to start from.
    pub restore: Option<Restore>,
}

/// Queues training client `seq` of `session_id` for `org_id`; the same request again answers the
/// same client and future.
pub async fn create_client(
    queue: &Queue,
    org_id: Uuid,
    client: &NewClient<'_>,
) -> Result<CreatedClient, CreateClientError> {
    let pool = queue.pool();
    let model_id = format!("{}:train:{}", client.session_id, client.seq);
    if let Some(future_id) = sqlx::query_scalar!(
        "SELECT j.spec #>> '{tinker,create_future}' AS \"future!\" FROM tinker_models m \
         JOIN jobs j ON j.id = m.job_id WHERE m.id = $1 AND m.org_id = $2",
        model_id,
        org_id
    )
    .fetch_optional(pool)
    .await?
    {
        return Ok(CreatedClient { model_id, future_id });
    }
    let open = super::session_is_open(pool, org_id, client.session_id).await?;
    if !open {
        return Err(CreateClientError::NoSession(client.session_id.to_string()));
    }
    let future_id = super::create_future(pool, org_id, "create_model").await?;
    let spec = ClientSpec {
        model_id: model_id.clone(),
        session_id: client.session_id.to_string(),
        base_model: client.base_model.to_string(),
        lora_rank: client.lora_rank,
        seed: client.seed,
        create_future: future_id.clone(),
        restore: client.restore.clone(),
    };
    let mut job = NewJob::new(org_id, client.base_model, json!({ TINKER: spec }));
    job.id = crate::ids::new_id(JOB_PREFIX);
    job.created_by = client.user_id;
    job.suffix = Some(TINKER.to_string());
    // A lost worker's client comes back only where its newest checkpoint holds its state
    // (`resumable`); every other failure ends it (its worker does not retry).
    job.max_attempts = 3;
    let job_id = queue.enqueue_tinker(&job).await?;
    sqlx::query!(
        "INSERT INTO tinker_models (id, session_id, org_id, job_id, base_model, lora_rank) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        model_id,
        client.session_id,
        org_id,
        job_id,
        client.base_model,
        client.lora_rank.map(|r| r as i32)
    )
    .execute(pool)
    .await?;
    Ok(CreatedClient { model_id, future_id })
}

/// A training client as the API describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRecord {
    /// `<session>:train:<n>`.
    pub id: String,
    /// Its queue row (the training run's id).
    pub job_id: String,
    /// The model it trains.
    pub base_model: String,
    /// LoRA rank (`None`: every weight).
    pub lora_rank: Option<i32>,
    /// The queue row's state.
    pub state: String,
}

/// Training client `id` of `org_id`.
pub async fn client(
    pool: &PgPool,
    org_id: Uuid,
    id: &str,
) -> Result<Option<ClientRecord>, sqlx::Error> {
    sqlx::query_as!(
        ClientRecord,
        "SELECT m.id, m.job_id, m.base_model, m.lora_rank, j.state FROM tinker_models m \
         JOIN jobs j ON j.id = m.job_id WHERE m.id = $1 AND m.org_id = $2",
        id,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// Why a call cannot be queued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueCallError {
    /// The org has no such training client.
    #[error("no training client {0}")]
    NoClient(String),
    /// The client has ended (its worker stopped); nothing more runs on it.
    #[error("training client {model_id} has ended ({state}); create a new one")]
    Ended {
        /// The client.
        model_id: String,
        /// Its queue row's state.
        state: String,
    },
    /// The database failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Queues call `seq_id` of training client `model_id` (`kind` one of [`ORDERED_CALLS`]) and
/// returns its future; the same `seq_id` again (a retried request) answers the first one's.
pub async fn enqueue_call(
    pool: &PgPool,
    org_id: Uuid,
    model_id: &str,
    seq_id: i32,
    kind: &str,
    body: &Value,
) -> Result<String, EnqueueCallError> {
    let Some(client) = client(pool, org_id, model_id).await? else {
        return Err(EnqueueCallError::NoClient(model_id.to_string()));
    };
    let mut tx = pool.begin().await?;
    // Held until the commit, so a worker parking the client sees this call or leaves the client
    // parked for this call to wake.
    let state =
        sqlx::query_scalar!("SELECT state FROM jobs WHERE id = $1 FOR UPDATE", client.job_id)
            .fetch_one(&mut *tx)
            .await?;
    if state.parse::<crate::JobState>().is_ok_and(|s| s.is_terminal()) {
        tx.rollback().await?;
        return Err(EnqueueCallError::Ended { model_id: model_id.to_string(), state });
    }
    let future_id = create_future_in(&mut tx, org_id, kind).await?;
    let queued = sqlx::query_scalar!(
        "INSERT INTO tinker_calls (model_id, seq_id, future_id, kind, body) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (model_id, seq_id) DO NOTHING RETURNING future_id",
        model_id,
        seq_id,
        future_id,
        kind,
        body
    )
    .fetch_optional(&mut *tx)
    .await?;
    match queued {
        Some(future_id) => {
            if state == "paused" {
                // A parked client: queued again, its next worker restores it and runs this call.
                sqlx::query!(
                    "UPDATE jobs SET state = 'queued', control = 'none', run_after = now() \
                     WHERE id = $1 AND state = 'paused'",
                    client.job_id
                )
                .execute(&mut *tx)
                .await?;
                tracing::info!(job_id = %client.job_id, model_id, "parked tinker client woken");
            }
            tx.commit().await?;
            Ok(future_id)
        }
        None => {
            tx.rollback().await?;
            let first = sqlx::query_scalar!(
                "SELECT future_id FROM tinker_calls WHERE model_id = $1 AND seq_id = $2",
                model_id,
                seq_id
            )
            .fetch_one(pool)
            .await?;
            Ok(first)
        }
    }
}

/// One queued call, as its worker reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedCall {
    /// Its place in the client's order.
    pub seq_id: i32,
    /// Its future.
    pub future_id: String,
    /// Which call (one of [`ORDERED_CALLS`]).
    pub kind: String,
    /// Its arguments.
    pub body: Value,
}

/// The call training client `model_id` runs next, once it has arrived.
pub async fn next_call(pool: &PgPool, model_id: &str) -> Result<Option<QueuedCall>, sqlx::Error> {
    sqlx::query_as!(
        QueuedCall,
        "SELECT c.seq_id, c.future_id, c.kind, c.body FROM tinker_calls c \
         JOIN tinker_models m ON m.id = c.model_id \
         WHERE c.model_id = $1 AND c.seq_id = m.next_seq",
        model_id
    )
    .fetch_optional(pool)
    .await
}

/// How a call ended: its result (media type, bytes) or its failure (`{"error", "category"}`).
pub type CallOutcome = Result<(String, Vec<u8>), Value>;

/// Records how call `call` of `model_id` ended (and that the worker ran it for `ran`) and moves
/// the client to its next call, in one transaction, as attempt `attempt` of the client's queue
/// row; `LeaseLost` (and nothing written) when that attempt no longer holds it.
pub async fn finish_call(
    queue: &Queue,
    model_id: &str,
    attempt: i32,
    call: &QueuedCall,
    outcome: &CallOutcome,
    ran: std::time::Duration,
) -> Result<(), QueueError> {
    let mut tx = queue.pool().begin().await?;
    let moved = sqlx::query_scalar!(
        "UPDATE tinker_models m SET next_seq = m.next_seq + 1 FROM jobs j \
         WHERE m.id = $1 AND m.next_seq = $2 AND j.id = m.job_id AND j.attempt = $3 \
           AND j.state = 'running' RETURNING j.id",
        model_id,
        call.seq_id,
        attempt
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(job_id) = moved else {
        tx.rollback().await?;
        return Err(QueueError::LeaseLost { job_id: model_id.to_string(), attempt });
    };
    let (content_type, result, error) = match outcome {
        Ok((content_type, bytes)) => (Some(content_type.as_str()), Some(bytes.as_slice()), None),
        Err(error) => (None, None, Some(error)),
    };
    sqlx::query!(
        "UPDATE tinker_futures SET finished_at = now(), content_type = $2, result = $3, error = $4 \
         WHERE id = $1 AND finished_at IS NULL",
        call.future_id,
        content_type,
        result,
        error
    )
    .execute(&mut *tx)
    .await?;
    let ran_ms = i32::try_from(ran.as_millis()).unwrap_or(i32::MAX);
    sqlx::query!(
        "UPDATE tinker_calls SET ran_ms = $3 WHERE model_id = $1 AND seq_id = $2",
        model_id,
        call.seq_id,
        ran_ms
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::debug!(job_id, model_id, seq_id = call.seq_id, kind = call.kind, "tinker call done");
    Ok(())
}

/// How [`park`] left a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parking {
    /// Parked: its row is `paused`, its lease given back.
    Parked,
    /// A call is waiting: the worker keeps it and runs the call.
    CallWaiting,
    /// Its session has finished: nothing will call it again, so it ends instead.
    SessionFinished,
    /// The checkpoint is gone (its last path was deleted): save the state again, then park.
    CheckpointGone,
}

/// Parks training client `model_id` held by `attempt`: records that checkpoint `checkpoint` of
/// its queue row holds its state and gives the row back as `paused`, in one transaction, unless
/// a call is waiting (and `force` is false). A call queued at the same time either is seen
/// here or finds the row parked and queues it again ([`enqueue_call`] locks the row too).
/// `LeaseLost` (and nothing written) when `attempt` no longer holds it.
pub async fn park(
    queue: &Queue,
    model_id: &str,
    attempt: i32,
    checkpoint: i32,
    force: bool,
) -> Result<Parking, QueueError> {
    let mut tx = queue.pool().begin().await?;
    let held = sqlx::query_scalar!(
        "SELECT j.id FROM jobs j JOIN tinker_models m ON m.job_id = j.id \
         WHERE m.id = $1 AND j.attempt = $2 AND j.state = 'running' FOR UPDATE OF j",
        model_id,
        attempt
    )
    .fetch_optional(&mut *tx)
    .await?;
    let Some(job_id) = held else {
        tx.rollback().await?;
        return Err(QueueError::LeaseLost { job_id: model_id.to_string(), attempt });
    };
    let waiting = sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM tinker_calls c JOIN tinker_models m ON m.id = c.model_id \
                        WHERE c.model_id = $1 AND c.seq_id >= m.next_seq) AS \"waiting!\"",
        model_id
    )
    .fetch_one(&mut *tx)
    .await?;
    if waiting && !force {
        tx.rollback().await?;
        return Ok(Parking::CallWaiting);
    }
    // After the lock: a session that finishes from here on ends this row once it is parked.
    let open = sqlx::query_scalar!(
        "SELECT s.finished_at IS NULL AS \"open!\" FROM tinker_sessions s \
         JOIN tinker_models m ON m.session_id = s.id WHERE m.id = $1",
        model_id
    )
    .fetch_one(&mut *tx)
    .await?;
    if !open {
        tx.rollback().await?;
        return Ok(Parking::SessionFinished);
    }
    if !checkpoint_held(&mut tx, model_id, checkpoint).await? {
        tx.rollback().await?;
        return Ok(Parking::CheckpointGone);
    }
    sqlx::query!(
        "UPDATE tinker_models SET parked_checkpoint = $2 WHERE id = $1",
        model_id,
        checkpoint
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "UPDATE jobs SET state = 'paused', worker_id = NULL, lease_expires_at = NULL, \
                         control = 'none' WHERE id = $1",
        job_id
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    tracing::info!(job_id, model_id, checkpoint, "tinker client parked");
    Ok(Parking::Parked)
}

/// The checkpoint parked client `model_id` resumes from; `None` when it is not parked.
pub async fn parked_checkpoint(pool: &PgPool, model_id: &str) -> Result<Option<i32>, sqlx::Error> {
    let parked =
        sqlx::query_scalar!("SELECT parked_checkpoint FROM tinker_models WHERE id = $1", model_id)
            .fetch_optional(pool)
            .await?;
    Ok(parked.flatten())
}

/// Clears client `model_id`'s parked checkpoint once its worker restored it: from here on its
/// state is the resident one, and a lost worker loses it (the client fails, not rewinds).
pub async fn unpark(pool: &PgPool, model_id: &str) -> Result<(), sqlx::Error> {
    sqlx::query!("UPDATE tinker_models SET parked_checkpoint = NULL WHERE id = $1", model_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// The calls that change a client's state (weights, Adam's moments, or gradients waiting for
/// `optim_step`) when they succeed.
pub const STATE_CALLS: [&str; 3] = ["forward_backward", "optim_step", "load_weights"];

/// What a client whose worker was lost can come back from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumable {
    /// Checkpoint `N` of its row holds its state: no call changed it since.
    From(i32),
    /// No call ever changed its state: it starts again as created.
    Fresh,
    /// Calls changed its state after its newest checkpoint: that state is gone.
    Lost,
}

/// Whether client `model_id` (queue row `job_id`) can come back after its worker was lost: its
/// newest checkpoint records the calls its state reflects (`metrics.next_seq`) and whether
/// gradients were waiting (`metrics.pending_backwards`); no state-changing call may have
/// succeeded since.
pub async fn resumable(
    pool: &PgPool,
    model_id: &str,
    job_id: &str,
) -> Result<Resumable, sqlx::Error> {
    let newest = sqlx::query!(
        "SELECT step, (metrics ->> 'next_seq')::int AS next_seq, \
                coalesce((metrics ->> 'pending_backwards')::int, 0) AS \"pending!\" \
         FROM checkpoints WHERE job_id = $1 ORDER BY step DESC LIMIT 1",
        job_id
    )
    .fetch_optional(pool)
    .await?;
    let (since, from) = match &newest {
        Some(c) => match c.next_seq {
            Some(seq) if c.pending == 0 => (seq, Resumable::From(c.step)),
            _ => return Ok(Resumable::Lost),
        },
        None => (1, Resumable::Fresh),
    };
    let changed = sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM tinker_calls c \
                        JOIN tinker_models m ON m.id = c.model_id \
                        JOIN tinker_futures f ON f.id = c.future_id \
                        WHERE c.model_id = $1 AND c.seq_id >= $2 AND c.seq_id < m.next_seq \
                          AND c.kind = ANY($3) AND f.error IS NULL) AS \"changed!\"",
        model_id,
        since,
        &STATE_CALLS.map(String::from)[..]
    )
    .fetch_one(pool)
    .await?;
    Ok(if changed { Resumable::Lost } else { from })
}

/// Client `model_id`'s next call's place in its order: every call before it has run.
pub async fn next_seq(pool: &PgPool, model_id: &str) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!("SELECT next_seq FROM tinker_models WHERE id = $1", model_id)
        .fetch_one(pool)
        .await
}

/// The newest checkpoint of queue row `job_id`, if it has one.
pub async fn last_checkpoint(pool: &PgPool, job_id: &str) -> Result<Option<i32>, sqlx::Error> {
    sqlx::query_scalar!("SELECT max(step) FROM checkpoints WHERE job_id = $1", job_id)
        .fetch_one(pool)
        .await
}

/// Fails every call of `model_id` still waiting, with `error` (the client ended).
pub async fn fail_waiting_calls(
    pool: &PgPool,
    model_id: &str,
    error: &Value,
) -> Result<u64, sqlx::Error> {
    let done = sqlx::query!(
        "UPDATE tinker_futures f SET finished_at = now(), error = $2 FROM tinker_calls c \
         WHERE c.model_id = $1 AND c.future_id = f.id AND f.finished_at IS NULL",
        model_id,
        error
    )
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Fails future `future_id` of `org_id` if it is a training call (or a client's creation) whose
/// client has ended, so no poll waits on a call nothing will run; true when it did.
pub async fn fail_if_orphaned(
    pool: &PgPool,
    org_id: Uuid,
    future_id: &str,
) -> Result<bool, sqlx::Error> {
    let failed = sqlx::query!(
        "UPDATE tinker_futures f \
         SET finished_at = now(), \
             error = jsonb_build_object('error', 'the training client ended (' || j.state || \
                     coalesce(': ' || (j.error ->> 'message'), '') || '); create a new one', \
                     'category', 'server') \
         FROM tinker_models m JOIN jobs j ON j.id = m.job_id \
         WHERE f.id = $1 AND f.org_id = $2 AND f.finished_at IS NULL \
           AND j.state IN ('succeeded', 'failed', 'cancelled') \
           AND (EXISTS (SELECT 1 FROM tinker_calls c WHERE c.future_id = f.id AND c.model_id = m.id) \
                OR j.spec #>> '{tinker,create_future}' = f.id)",
        future_id,
        org_id
    )
    .execute(pool)
    .await?;
    Ok(failed.rows_affected() > 0)
}

/// Saved weights: where (`tinker://` path), what, and the Verity model they are.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedWeights<'a> {
    /// `tinker://<run>/<kind>_weights/<name>`.
    pub path: &'a str,
    /// `sampler` (for sampling), `training` (to resume from) or `external` (to download).
    pub kind: &'a str,
    /// The checkpoint of the client's queue row that holds them.
    pub step: i32,
    /// Its Verity model name.
    pub model: &'a str,
    /// Seconds until the path expires (`None`: kept until deleted).
    pub ttl_seconds: Option<i64>,
}

/// Shortest and longest time a saved path may be kept before it expires, in seconds: an hour and
/// ten years, as Tinker's service bounds them.
pub const TTL_SECONDS: std::ops::RangeInclusive<i64> = 3600..=10 * 365 * 24 * 3600;

/// Records weights training client `model_id` saved; false (nothing written) when checkpoint
/// `saved.step` of its queue row is gone (its last path was deleted): save the state again.
pub async fn record_checkpoint(
    pool: &PgPool,
    org_id: Uuid,
    model_id: &str,
    saved: &SavedWeights<'_>,
) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Held until the commit: a delete of the checkpoint's last path waits, then sees this one.
    if !checkpoint_held(&mut tx, model_id, saved.step).await? {
        tx.rollback().await?;
        return Ok(false);
    }
    sqlx::query!(
        "INSERT INTO tinker_checkpoints (path, org_id, model_id, kind, step, model, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7::int8)) \
         ON CONFLICT (path) DO UPDATE SET step = EXCLUDED.step, model = EXCLUDED.model, \
                                          created_at = now(), expires_at = EXCLUDED.expires_at",
        saved.path,
        org_id,
        model_id,
        saved.kind,
        saved.step,
        saved.model,
        saved.ttl_seconds
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Whether checkpoint `step` of client `model_id`'s queue row exists, locking it against a
/// delete until the transaction ends.
async fn checkpoint_held(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    model_id: &str,
    step: i32,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query_scalar!(
        "SELECT c.step FROM checkpoints c JOIN tinker_models m ON m.job_id = c.job_id \
         WHERE m.id = $1 AND c.step = $2 FOR SHARE OF c",
        model_id,
        step
    )
    .fetch_optional(&mut **tx)
    .await?;
    Ok(held.is_some())
}

/// Deletes the weights saved under `tinker://` path `path` in `org_id`: `None` when there are
/// none; else the store prefix of the checkpoint that held them when no other path (and no
/// parked client) holds it any more, its row deleted too: the caller deletes its files.
pub async fn delete_saved(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
) -> Result<Option<Option<String>>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let Some(saved) = sqlx::query!(
        "SELECT t.model_id, t.step, m.job_id FROM tinker_checkpoints t \
         JOIN tinker_models m ON m.id = t.model_id WHERE t.path = $1 AND t.org_id = $2",
        path,
        org_id
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        tx.rollback().await?;
        return Ok(None);
    };
    // Locked first: a save recording another path onto this checkpoint meanwhile is seen below.
    let prefix = sqlx::query_scalar!(
        "SELECT storage_prefix FROM checkpoints WHERE job_id = $1 AND step = $2 FOR UPDATE",
        saved.job_id,
        saved.step
    )
    .fetch_optional(&mut *tx)
    .await?;
    sqlx::query!("DELETE FROM tinker_checkpoints WHERE path = $1 AND org_id = $2", path, org_id)
        .execute(&mut *tx)
        .await?;
    let held = sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM tinker_checkpoints WHERE model_id = $1 AND step = $2) \
             OR EXISTS (SELECT 1 FROM tinker_models WHERE id = $1 AND parked_checkpoint = $2) \
         AS \"held!\"",
        saved.model_id,
        saved.step
    )
    .fetch_one(&mut *tx)
    .await?;
    let orphan = match prefix {
        Some(prefix) if !held => {
            sqlx::query!(
                "DELETE FROM checkpoints WHERE job_id = $1 AND step = $2",
                saved.job_id,
                saved.step
            )
            .execute(&mut *tx)
            .await?;
            Some(prefix)
        }
        _ => None,
    };
    tx.commit().await?;
    Ok(Some(orphan))
}

/// A training client as a training run (`RestClient.list_training_runs`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The client's queue row (`tinkjob-…`): the run's id.
    pub job_id: String,
    /// `<session>:train:<n>`.
    pub model_id: String,
    /// The model it trains.
    pub base_model: String,
    /// LoRA rank (`None`: every weight).
    pub lora_rank: Option<i32>,
    /// Who made it.
    pub owner: Option<String>,
    /// The queue row's state.
    pub state: String,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Its latest call, if any.
    pub last_call_at: Option<DateTime<Utc>>,
    /// Calls it has run.
    pub calls_run: i32,
}

/// The org's training runs, newest first: `limit` from `offset`, and how many there are.
pub async fn list_runs(
    pool: &PgPool,
    org_id: Uuid,
    limit: i64,
    offset: i64,
) -> Result<(Vec<RunRecord>, i64), sqlx::Error> {
    let runs = select_runs(pool, org_id, None, limit, offset).await?;
    let total = sqlx::query_scalar!("SELECT count(*) FROM tinker_models WHERE org_id = $1", org_id)
        .fetch_one(pool)
        .await?
        .unwrap_or(0);
    Ok((runs, total))
}

/// Training run `job_id` of the org.
pub async fn run(
    pool: &PgPool,
    org_id: Uuid,
    job_id: &str,
) -> Result<Option<RunRecord>, sqlx::Error> {
    Ok(select_runs(pool, org_id, Some(job_id), 1, 0).await?.pop())
}

/// The org's runs (only `job_id` when given), newest first, `limit` from `offset`.
async fn select_runs(
    pool: &PgPool,
    org_id: Uuid,
    job_id: Option<&str>,
    limit: i64,
    offset: i64,
) -> Result<Vec<RunRecord>, sqlx::Error> {
    sqlx::query_as!(
        RunRecord,
        r#"SELECT m.job_id, m.id AS model_id, m.base_model, m.lora_rank, u.email AS "owner?",
                  j.state, m.created_at,
                  (SELECT max(c.created_at) FROM tinker_calls c WHERE c.model_id = m.id) AS last_call_at,
                  m.next_seq - 1 AS "calls_run!"
           FROM tinker_models m JOIN jobs j ON j.id = m.job_id
           LEFT JOIN users u ON u.id = j.created_by
           WHERE m.org_id = $1 AND ($2::text IS NULL OR m.job_id = $2)
           ORDER BY m.created_at DESC, m.id LIMIT $3 OFFSET $4"#,
        org_id,
        job_id,
        limit,
        offset
    )
    .fetch_all(pool)
    .await
}

/// Weights a run saved, as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedRecord {
    /// The run (`tinkjob-…`).
    pub job_id: String,
    /// `tinker://…` path.
    pub path: String,
    /// `sampler`, `training` or `external`.
    pub kind: String,
    /// Its Verity model name.
    pub model: String,
    /// When it was saved.
    pub created_at: DateTime<Utc>,
    /// When it expires (`None`: kept until deleted).
    pub expires_at: Option<DateTime<Utc>>,
    /// Its size in the store.
    pub bytes: Option<i64>,
    /// Whether every org may read it through its path ([`set_saved_public`]).
    pub public: bool,
}

/// The weights the org's runs saved (one run's with `job_id`), newest first.
pub async fn list_saved(
    pool: &PgPool,
    org_id: Uuid,
    job_id: Option<&str>,
) -> Result<Vec<SavedRecord>, sqlx::Error> {
    sqlx::query_as!(
        SavedRecord,
        r#"SELECT m.job_id, t.path, t.kind, t.model, t.created_at, t.expires_at, t.public,
                  c.bytes AS "bytes?"
           FROM tinker_checkpoints t JOIN tinker_models m ON m.id = t.model_id
           LEFT JOIN checkpoints c ON c.job_id = m.job_id AND c.step = t.step
           WHERE t.org_id = $1 AND ($2::text IS NULL OR m.job_id = $2)
           ORDER BY t.created_at DESC, t.path"#,
        org_id,
        job_id
    )
    .fetch_all(pool)
    .await
}

/// Sets when the weights saved under `path` in `org_id` expire: `ttl_seconds` from now, or never
/// (`None`). False when the org has no such path.
pub async fn set_saved_ttl(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
    ttl_seconds: Option<i64>,
) -> Result<bool, sqlx::Error> {
    let set = sqlx::query!(
        "UPDATE tinker_checkpoints SET expires_at = now() + make_interval(secs => $3::int8) \
         WHERE path = $1 AND org_id = $2",
        path,
        org_id,
        ttl_seconds
    )
    .execute(pool)
    .await?;
    Ok(set.rows_affected() > 0)
}

/// Up to `limit` saved paths whose time has passed, oldest expiry first: (org, path) pairs for
/// [`delete_saved`].
pub async fn expired_saved(pool: &PgPool, limit: i64) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "SELECT org_id, path FROM tinker_checkpoints WHERE expires_at <= now() \
         ORDER BY expires_at LIMIT $1",
        limit
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.org_id, r.path)).collect())
}

/// Where the files of the weights saved under `tinker://` path `path` are, for `org_id` (its own
/// path, or one another org published): the store prefix of the checkpoint that holds them, with the save's kind (`sampler`,
/// `training`, `external`).
pub async fn saved_files(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
) -> Result<Option<(String, String)>, sqlx::Error> {
    let row = sqlx::query!(
        "SELECT t.kind, c.storage_prefix FROM tinker_checkpoints t \
         JOIN tinker_models m ON m.id = t.model_id \
         JOIN checkpoints c ON c.job_id = m.job_id AND c.step = t.step \
         WHERE t.path = $1 AND (t.org_id = $2 OR t.public)",
        path,
        org_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| (r.kind, r.storage_prefix)))
}

/// Weights saved under a `tinker://` path, as a client loading them needs them.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedSource {
    /// The run that saved them.
    pub job_id: String,
    /// The checkpoint of that run that holds them.
    pub step: i32,
    /// `sampler`, `training` or `external`.
    pub kind: String,
    /// The model that run trains.
    pub base_model: String,
    /// Its LoRA rank (`None`: every weight).
    pub lora_rank: Option<i32>,
}

/// The weights saved under `tinker://` path `path`, for `org_id`: its own path, or one another
/// org published.
pub async fn saved_source(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
) -> Result<Option<SavedSource>, sqlx::Error> {
    sqlx::query_as!(
        SavedSource,
        "SELECT m.job_id, t.step, t.kind, m.base_model, m.lora_rank \
         FROM tinker_checkpoints t JOIN tinker_models m ON m.id = t.model_id \
         WHERE t.path = $1 AND (t.org_id = $2 OR t.public)",
        path,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// The Verity model saved under a `tinker://` path, and the org that owns it.
#[derive(Debug, Clone, PartialEq)]
pub struct PathModel {
    /// The checkpoint's model name (`ft:…:ckpt-step-N`), resolved in its owner's org.
    pub model: String,
    /// The org that saved it.
    pub org_id: Uuid,
}

/// The Verity model saved under `tinker://` path `path`, for `org_id`: its own path, or one
/// another org published.
pub async fn checkpoint_model(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
) -> Result<Option<PathModel>, sqlx::Error> {
    sqlx::query_as!(
        PathModel,
        "SELECT model, org_id FROM tinker_checkpoints WHERE path = $1 AND (org_id = $2 OR public)",
        path,
        org_id
    )
    .fetch_optional(pool)
    .await
}

/// Publishes the weights `org_id` saved under `path` (every org may then read them through the
/// path), or makes them private again; false when the org has no such path.
pub async fn set_saved_public(
    pool: &PgPool,
    org_id: Uuid,
    path: &str,
    public: bool,
) -> Result<bool, sqlx::Error> {
    let set = sqlx::query!(
        "UPDATE tinker_checkpoints SET public = $3 WHERE path = $1 AND org_id = $2",
        path,
        org_id,
        public
    )
    .execute(pool)
    .await?;
    Ok(set.rows_affected() > 0)
}

/// One call of a client's log, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// Its place in the client's order.
    pub seq_id: i32,
    /// Which call.
    pub kind: String,
    /// When it arrived.
    pub created_at: DateTime<Utc>,
    /// When it ended, once it has.
    pub finished_at: Option<DateTime<Utc>>,
    /// Milliseconds the worker spent running it (its own compute), once it has run.
    pub ran_ms: Option<i32>,
    /// Input tokens of a `forward_backward` / `forward`.
    pub tokens: Option<i64>,
    /// Its `loss:sum`, for a `forward_backward` / `forward` that succeeded.
    pub loss: Option<f64>,
    /// Its failure, if it failed.
    pub error: Option<String>,
}

impl CallRecord {
    /// Milliseconds from its arrival to its end, once it has ended (queueing, the protocol and
    /// [`CallRecord::ran_ms`] together).
    pub fn took_ms(&self) -> Option<i64> {
        self.finished_at.map(|end| (end - self.created_at).num_milliseconds())
    }
}

/// The latest `limit` calls of run `job_id` of the org after skipping `offset`, newest first (a
/// call is kept as long as its future: a day).
pub async fn list_calls(
    pool: &PgPool,
    org_id: Uuid,
    job_id: &str,
    limit: i64,
    offset: i64,
) -> Result<Vec<CallRecord>, sqlx::Error> {
    sqlx::query_as!(
        CallRecord,
        r#"SELECT c.seq_id, c.kind, c.created_at, f.finished_at, c.ran_ms,
                  (SELECT sum(jsonb_array_length(d -> 'tokens'))::int8
                   FROM jsonb_array_elements(CASE WHEN jsonb_typeof(c.body -> 'data') = 'array'
                                                  THEN c.body -> 'data' ELSE '[]'::jsonb END) d) AS tokens,
                  CASE WHEN c.kind IN ('forward_backward', 'forward')
                            AND f.content_type = 'application/json'
                       THEN (convert_from(f.result, 'UTF8')::jsonb #>> '{metrics,loss:sum}')::float8
                  END AS loss,
                  f.error ->> 'error' AS error
           FROM tinker_calls c
           JOIN tinker_futures f ON f.id = c.future_id
           JOIN tinker_models m ON m.id = c.model_id
           WHERE m.org_id = $1 AND m.job_id = $2
           ORDER BY c.seq_id DESC LIMIT $3 OFFSET $4"#,
        org_id,
        job_id,
        limit,
        offset
    )
    .fetch_all(pool)
    .await
}
