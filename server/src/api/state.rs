//! The server's configuration and the state every handler shares.

use super::auth::ratelimit::RateLimiter;
use super::auth::tokens::{TokenService, TokenSettings};
use super::auth::KeyCache;
use super::limits::LimitArgs;
use super::telemetry::HttpMetrics;
use axum::extract::FromRef;
use clap::Args;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;
use verity_core::config::{DatabaseConfig, QueueConfig, StorageConfig};
use verity_core::queue::{Queue, QueueSettings, WorkerLiveness};
use verity_core::storage::{ObjectStore, UrlSigner};
use verity_verifiers::GradingBudget;
use verity_worker::judge::{parse_endpoints, JudgeProvider, JudgeSettings};

/// Flags and environment of `verity serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "VERITY_BIND", default_value = "127.0.0.1:8080")]
    pub bind: String,
    /// Database.
    #[command(flatten)]
    pub db: DatabaseConfig,
    /// Object storage.
    #[command(flatten)]
    pub storage: StorageConfig,
    /// Queue timings.
    #[command(flatten)]
    pub queue: QueueConfig,
    /// API settings.
    #[command(flatten)]
    pub api: ApiConfig,
}

/// Settings of the API itself.
#[derive(Debug, Clone, Args)]
pub struct ApiConfig {
    /// Secret that signs access tokens (HS256; at least 32 bytes).
    #[arg(long = "jwt-secret", env = "VERITY_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: String,
    /// `iss` of access tokens.
    #[arg(long = "jwt-issuer", env = "VERITY_JWT_ISSUER", default_value = "verity")]
    pub jwt_issuer: String,
    /// `aud` of access tokens.
    #[arg(long = "jwt-audience", env = "VERITY_JWT_AUDIENCE", default_value = "verity-api")]
    pub jwt_audience: String,
    /// Lifetime of access tokens (seconds).
    #[arg(long = "token-ttl-seconds", env = "VERITY_TOKEN_TTL_SECONDS", default_value_t = 900)]
    pub token_ttl_seconds: u64,
    /// Longest a dashboard session lasts from sign-in, however active (hours; activity renews
    /// it for `VERITY_TOKEN_TTL_SECONDS` at a time up to this).
    #[arg(long = "session-max-hours", env = "VERITY_SESSION_MAX_HOURS", default_value_t = 12)]
    pub session_max_hours: u64,
    /// Largest accepted upload (MiB).
    #[arg(long = "max-upload-mib", env = "VERITY_MAX_UPLOAD_MIB", default_value_t = 512)]
    pub max_upload_mib: u64,
    /// Requests per second allowed per API key or user (0: unlimited).
    #[arg(long = "rate-limit-rps", env = "VERITY_RATE_LIMIT_RPS", default_value_t = 50.0)]
    pub rate_limit_rps: f64,
    /// Burst size of the per-key rate limit.
    #[arg(long = "rate-limit-burst", env = "VERITY_RATE_LIMIT_BURST", default_value_t = 100.0)]
    pub rate_limit_burst: f64,
    /// Addresses or networks of reverse proxies whose `X-Forwarded-For` names the client
    /// (comma-separated, e.g. `10.0.0.0/8,127.0.0.1`; empty: the TCP peer is the client).
    #[arg(long = "trusted-proxies", env = "VERITY_TRUSTED_PROXIES", default_value = "")]
    pub trusted_proxies: String,
    /// Failed sign-ins and key checks allowed per client address in 15 minutes (0: no limit).
    #[arg(
        long = "auth-failures-per-address",
        env = "VERITY_AUTH_FAILURES_PER_ADDRESS",
        default_value_t = 20
    )]
    pub auth_failures_per_address: usize,
    /// Credential checks that cost a hash allowed per client address and minute (0: no limit).
    #[arg(
        long = "auth-checks-per-minute",
        env = "VERITY_AUTH_CHECKS_PER_MINUTE",
        default_value_t = 60.0
    )]
    pub auth_checks_per_minute: f64,
    /// Password and key hashes computed at once (0: one per CPU core; ~19 MiB each).
    #[arg(long = "hash-concurrency", env = "VERITY_HASH_CONCURRENCY", default_value_t = 0)]
    pub hash_concurrency: usize,
    /// Grader runs (`graders/run`) graded at once (0: one per CPU core).
    #[arg(long = "grader-concurrency", env = "VERITY_GRADER_CONCURRENCY", default_value_t = 0)]
    pub grader_concurrency: usize,
    /// How long a grader run waits for a free slot before a 503 with Retry-After (milliseconds).
    #[arg(long = "grader-wait-ms", env = "VERITY_GRADER_WAIT_MS", default_value_t = 2000)]
    pub grader_wait_ms: u64,
    /// How long a Tinker session may go without a heartbeat (the SDK sends one every 10 s)
    /// before the server closes it and releases its training clients (seconds; 0: never).
    #[arg(
        long = "tinker-session-timeout-secs",
        env = "VERITY_TINKER_SESSION_TIMEOUT_SECS",
        default_value_t = 600
    )]
    pub tinker_session_timeout_secs: u64,
    /// Where the API server caches files it fetches: embedding models of graders, GGUF exports.
    #[arg(long = "judge-cache-dir", env = "VERITY_CACHE_DIR", default_value = "./.verity/cache")]
    pub judge_cache_dir: std::path::PathBuf,
    /// Judges of model graders.
    #[command(flatten)]
    pub judges: JudgeArgs,
    /// Bounds on what one request may read, return or run, and `/metrics` access.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Where jobs with a `wandb` integration are exported.
    #[command(flatten)]
    pub wandb: crate::integrations::WandbArgs,
}

/// Routing, timeouts and retries of the judges of model graders (`score_model`, `label_model`),
/// shared by `verity serve` (for `graders/run`) and `verity worker`.
#[derive(Debug, Clone, Args)]
pub struct JudgeArgs {
    /// Judge names served by OpenAI-compatible endpoints: `name=url[|KEY_ENV],…` (`url` up to
    /// `/v1`; `KEY_ENV` names the environment variable holding the endpoint's API key).
    #[arg(long = "judge-endpoints", env = "VERITY_JUDGE_ENDPOINTS", default_value = "")]
    pub endpoints: String,
    /// Time limit of one request to a judge endpoint (seconds).
    #[arg(
        long = "judge-timeout-seconds",
        env = "VERITY_JUDGE_TIMEOUT_SECONDS",
        default_value_t = 60
    )]
    pub timeout_seconds: u64,
    /// Retries of a failed judge request (connection error, timeout, 429, 5xx), with backoff.
    #[arg(long = "judge-retries", env = "VERITY_JUDGE_RETRIES", default_value_t = 3)]
    pub retries: u32,
    /// Judge models kept loaded in one process (least recently used dropped first).
    #[arg(long = "judge-models-loaded", env = "VERITY_JUDGE_MODELS_LOADED", default_value_t = 2)]
    pub models_loaded: usize,
}

impl JudgeArgs {
    /// The typed settings; a malformed `VERITY_JUDGE_ENDPOINTS` is a configuration error.
    pub fn settings(&self) -> Result<JudgeSettings, ConfigError> {
        Ok(JudgeSettings {
            endpoints: parse_endpoints(&self.endpoints).map_err(|e| ConfigError(e.to_string()))?,
            timeout: Duration::from_secs(self.timeout_seconds.max(1)),
            retries: self.retries,
            models_loaded: self.models_loaded.max(1),
        })
    }
}

/// Limits applied by handlers.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    /// Largest upload in bytes.
    pub max_upload_bytes: u64,
    /// Largest multipart text field in bytes.
    pub max_form_field_bytes: usize,
    /// Most bytes of one file row returned.
    pub max_row_bytes: usize,
    /// Longest sandboxed run of an API grading, in milliseconds.
    pub grader_run_max_ms: u64,
    /// Tinker calls one org may have pending at once (0: no limit).
    pub tinker_org_pending: i64,
}

/// Slots for grader runs of the API, so that a flood of expensive gradings cannot take every
/// core from the other requests.
#[derive(Debug, Clone)]
pub struct GraderSlots {
    /// The process's grading budget; `verity up` gives the same one to its embedded worker, so
    /// API and training gradings together never exceed it.
    pub budget: GradingBudget,
    /// One permit per grading allowed at once (the budget's semaphore).
    pub permits: Arc<tokio::sync::Semaphore>,
    /// How long a request waits for a permit.
    pub wait: Duration,
    /// Gradings one org may run at once.
    pub org_limit: usize,
    /// Each org's share of the slots (one semaphore of `org_limit` permits per org that graded).
    orgs: Arc<std::sync::Mutex<HashMap<Uuid, Arc<tokio::sync::Semaphore>>>>,
}

/// One grading slot: one of the process's and one of the org's, both given back on drop.
#[derive(Debug)]
pub struct GraderSlot {
    _org: tokio::sync::OwnedSemaphorePermit,
    _all: tokio::sync::OwnedSemaphorePermit,
}

/// Why no grading slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotsBusy {
    /// The org already runs as many gradings as it may.
    Org,
    /// Every slot of the process stayed taken.
    All,
}

impl GraderSlots {
    /// `concurrency` slots (0: one per CPU core), waited for at most `wait`.
    pub fn new(concurrency: usize, wait: Duration) -> GraderSlots {
        GraderSlots::on_budget(GradingBudget::new(concurrency), wait)
    }

    /// Slots drawn from a shared budget, waited for at most `wait`.
    pub fn on_budget(budget: GradingBudget, wait: Duration) -> GraderSlots {
        let org_limit = budget.size().div_ceil(2).max(1);
        GraderSlots { permits: budget.semaphore(), budget, wait, org_limit, orgs: Arc::default() }
    }

    /// These slots with at most `org_limit` gradings per org (0: half the slots, rounded up).
    pub fn with_org_limit(mut self, org_limit: usize) -> GraderSlots {
        if org_limit > 0 {
            self.org_limit = org_limit;
        }
        self
    }

    /// A slot for org `org_id`: first one of the org's (so that one org cannot queue for every
    /// slot), then one of the process's, each waited for at most `wait` in all.
    pub async fn acquire(&self, org_id: Uuid) -> Result<GraderSlot, SlotsBusy> {
        let org = {
            let mut orgs = self.orgs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let limit = self.org_limit;
            orgs.entry(org_id)
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(limit)))
                .clone()
        };
        let deadline = tokio::time::Instant::now() + self.wait;
        let org = tokio::time::timeout_at(deadline, org.acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(SlotsBusy::Org)?;
        let all = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(SlotsBusy::All)?;
        Ok(GraderSlot { _org: org, _all: all })
    }
}

/// Everything handlers share; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Postgres.
    pub pool: PgPool,
    /// The job queue.
    pub queue: Queue,
    /// Object storage.
    pub store: Arc<dyn ObjectStore>,
    /// JWT minting and checking.
    pub tokens: Arc<TokenService>,
    /// Recently verified API keys.
    pub key_cache: Arc<KeyCache>,
    /// Per-key rate limit.
    pub limiter: Arc<RateLimiter>,
    /// Failed and pending sign-ins per (account, address) and per address.
    pub auth_throttle: Arc<super::auth::throttle::AuthThrottle>,
    /// Slots of concurrent password and key hashes.
    pub hasher: super::auth::hashing::Hasher,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Arc<super::auth::client::TrustedProxies>,
    /// Session cookies carry `Secure` (the public URL, `VERITY_PUBLIC_URL`, is https).
    pub secure_cookies: bool,
    /// How long dashboard sessions last idle and at most.
    pub sessions: super::auth::session::SessionPolicy,
    /// Verifies signed object URLs of the local store (`None`: signed URLs disabled).
    pub signer: Option<UrlSigner>,
    /// Request counters and latencies.
    pub http_metrics: Arc<HttpMetrics>,
    /// Rendered metrics of recently read jobs, current while the change listener runs.
    pub metrics_cache: Arc<super::jobs::metrics_doc::MetricsCache>,
    /// Job rows read recently, current while the change listener runs.
    pub job_cache: Arc<super::jobs::cache::JobCache>,
    /// Request size limits.
    pub limits: RequestLimits,
    /// Bearer token `/metrics` requires (`None`: open).
    pub metrics_token: Option<Arc<str>>,
    /// Liveness of the worker embedded in this process (`verity up`), reported by `/readyz`;
    /// `None` when the process runs no worker (`verity serve`).
    pub worker: Option<WorkerLiveness>,
    /// Concurrency limit of `graders/run`.
    pub grader_slots: GraderSlots,
    /// Judges of model graders (`graders/run` loads judge models in-process, on the CPU).
    pub judges: Arc<JudgeProvider>,
    /// Registered embedding models of `cosine` graders (`graders/run` loads them in-process).
    pub embeddings: Arc<verity_worker::embedding_models::EmbeddingModels>,
    /// GGUF exports of checkpoints (one at a time, models fetched into the cache folder).
    pub exports: Arc<super::jobs::gguf::GgufExports>,
    /// Wakes this server's `retrieve_future` polls when a call it ran ends.
    pub tinker_wakeups: Arc<super::tinker::Wakeups>,
    /// HTTP client forwarding inference requests to inference workers.
    pub inference_http: reqwest::Client,
    /// The W&B server jobs with a `wandb` integration are exported to (`None`: no API key, so
    /// such jobs are refused).
    pub wandb: Option<crate::integrations::WandbClient>,
    /// Tasks that live as long as the state (the change listeners): stopped when its last
    /// clone drops, so a process that stops serving stops them before its database goes.
    pub background: Arc<BackgroundTasks>,
}

/// Background tasks owned by an [`AppState`], aborted when it is dropped.
#[derive(Debug, Default)]
pub struct BackgroundTasks(std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>);

impl BackgroundTasks {
    /// Keeps `task` until the state drops.
    pub fn hold(&self, task: tokio::task::JoinHandle<()>) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }
}

impl Drop for BackgroundTasks {
    fn drop(&mut self) {
        let tasks = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        tasks.drain(..).for_each(|task| task.abort());
    }
}

/// Largest `VERITY_SESSION_MAX_HOURS` (a year).
const MAX_SESSION_HOURS: u64 = 366 * 24;

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl AppState {
    /// Builds the state from its parts and the API configuration.
    pub fn new(
        pool: PgPool,
        store: Arc<dyn ObjectStore>,
        queue_settings: QueueSettings,
        storage: &StorageConfig,
        api: &ApiConfig,
    ) -> Result<AppState, ConfigError> {
        if api.jwt_secret.len() < 32 {
            return Err(ConfigError("VERITY_JWT_SECRET must be at least 32 bytes".into()));
        }
        if !api.rate_limit_rps.is_finite() || api.rate_limit_rps < 0.0 {
            return Err(ConfigError("VERITY_RATE_LIMIT_RPS must be a non-negative number".into()));
        }
        if !api.auth_checks_per_minute.is_finite() || api.auth_checks_per_minute < 0.0 {
            return Err(ConfigError(
                "VERITY_AUTH_CHECKS_PER_MINUTE must be a non-negative number".into(),
            ));
        }
        if !(1..=MAX_SESSION_HOURS).contains(&api.session_max_hours) {
            return Err(ConfigError(format!(
                "VERITY_SESSION_MAX_HOURS must be 1 to {MAX_SESSION_HOURS}"
            )));
        }
        let trusted_proxies = super::auth::client::TrustedProxies::parse(&api.trusted_proxies)
            .map_err(|e| ConfigError(e.to_string()))?;
        let tokens = TokenService::new(TokenSettings {
            secret: api.jwt_secret.as_bytes().to_vec(),
            issuer: api.jwt_issuer.clone(),
            audience: api.jwt_audience.clone(),
            ttl: Duration::from_secs(api.token_ttl_seconds.max(1)),
        });
        let judges = JudgeProvider::on_cpu(api.judges.settings()?, api.judge_cache_dir.clone());
        let signer = match (&storage.public_url, storage.signing_secret.is_empty()) {
            (Some(base), false) => Some(UrlSigner::new(base, storage.signing_secret.as_bytes())),
            _ => None,
        };
        Ok(AppState {
            queue: Queue::new(pool.clone(), queue_settings),
            pool,
            store,
            tokens: Arc::new(tokens),
            key_cache: Arc::new(KeyCache::default()),
            limiter: Arc::new(RateLimiter::new(api.rate_limit_rps, api.rate_limit_burst)),
            auth_throttle: Arc::new(super::auth::throttle::AuthThrottle::new(
                api.auth_failures_per_address,
                api.auth_checks_per_minute,
            )),
            hasher: super::auth::hashing::Hasher::new(api.hash_concurrency),
            trusted_proxies: Arc::new(trusted_proxies),
            secure_cookies: storage
                .public_url
                .as_deref()
                .is_some_and(|url| url.trim().to_ascii_lowercase().starts_with("https://")),
            sessions: super::auth::session::SessionPolicy {
                idle: Duration::from_secs(api.token_ttl_seconds.max(1)),
                max: Duration::from_secs(api.session_max_hours * 3600),
            },
            signer,
            http_metrics: Arc::new(HttpMetrics::default()),
            metrics_cache: Arc::default(),
            job_cache: Arc::new(super::jobs::cache::JobCache::new(
                super::jobs::cache::JOB_CACHE_CAPACITY,
            )),
            limits: RequestLimits {
                max_upload_bytes: api.max_upload_mib.saturating_mul(1024 * 1024),
                max_form_field_bytes: api.limits.max_form_field_bytes.max(64),
                max_row_bytes: api.limits.max_row_bytes.max(1024),
                grader_run_max_ms: api.limits.grader_run_max_ms.max(1),
                tinker_org_pending: api.limits.tinker_org_pending.max(0),
            },
            metrics_token: api
                .limits
                .metrics_token
                .clone()
                .filter(|t| !t.is_empty())
                .map(Arc::from),
            worker: None,
            grader_slots: GraderSlots::new(
                api.grader_concurrency,
                Duration::from_millis(api.grader_wait_ms),
            )
            .with_org_limit(api.limits.grader_org_concurrency),
            judges: Arc::new(judges),
            embeddings: Arc::new(verity_worker::embedding_models::EmbeddingModels::new(
                api.judge_cache_dir.clone(),
            )),
            exports: Arc::new(super::jobs::gguf::GgufExports::new(api.judge_cache_dir.clone())),
            tinker_wakeups: Arc::default(),
            inference_http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(3))
                .build()
                .map_err(|e| ConfigError(format!("inference HTTP client: {e}")))?,
            wandb: crate::integrations::WandbClient::new(&api.wandb).map_err(ConfigError)?,
            background: Arc::default(),
        })
    }
}

impl AppState {
    /// Starts listening for job changes so that job rows and metrics can be cached, and returns
    /// the listening task; without it (or if the LISTEN fails: `None`) every read goes to the
    /// database.
    pub async fn start_job_change_listener(&self) -> Option<tokio::task::JoinHandle<()>> {
        let (jobs, metrics) = (self.job_cache.clone(), self.metrics_cache.clone());
        let on_change = move |change: verity_core::change_feed::JobChange| {
            jobs.apply(&change);
            metrics.documents.apply(&change);
        };
        match verity_core::change_feed::listen_for_job_changes(&self.pool, on_change).await {
            Ok(listener) => {
                tracing::debug!("caching job rows and metrics; listening for job changes");
                Some(listener)
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for job changes; job rows and metrics are not cached");
                None
            }
        }
    }
}

impl AppState {
    /// Starts listening for API key revocations (from any server) so that verified keys can be
    /// cached and a revoked key, and every token minted from it, is refused at once; without it
    /// (or if the LISTEN fails: `None`) each use of a key reads its row.
    pub async fn start_key_revocation_listener(&self) -> Option<tokio::task::JoinHandle<()>> {
        let cache = self.key_cache.clone();
        let on_event = move |event| cache.apply(event);
        match verity_core::tenancy::listen_for_key_revocations(&self.pool, on_event).await {
            Ok(listener) => Some(listener),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for key revocations; every key use reads its row");
                None
            }
        }
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(state: &AppState) -> PgPool {
        state.pool.clone()
    }
}

impl FromRef<AppState> for Queue {
    fn from_ref(state: &AppState) -> Queue {
        state.queue.clone()
    }
}

impl FromRef<AppState> for Arc<dyn ObjectStore> {
    fn from_ref(state: &AppState) -> Arc<dyn ObjectStore> {
        state.store.clone()
    }
}
