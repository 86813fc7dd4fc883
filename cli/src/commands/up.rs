//! `verity up`: everything in one process for a laptop — the API (the router `verity serve`
//! builds), one training worker (as `verity worker`), the inference role (as `verity
//! inference`, on a loopback port), a local object store, and a private
//! Postgres cluster in the data dir when `DATABASE_URL` is unset.

use super::postgres_cluster::PrivateCluster;
use crate::commands::client::ADMIN_KEY_FILE;
use crate::commands::worker::WorkerArgs;
use anyhow::Context;
use clap::{Args, Parser};
use std::future::IntoFuture;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use verity_core::queue::{Backoff, WorkerLiveness};
use verity_server::api::state::ServeConfig;

/// Options of `verity up` (and `verity demo`).
#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Where the database, objects, model cache and admin key live.
    #[arg(long = "data-dir", env = "VERITY_DATA_DIR", default_value = "./.verity")]
    pub data_dir: PathBuf,
    /// Port of the API and dashboard on 127.0.0.1 (0: any free port).
    #[arg(long, env = "VERITY_PORT", default_value_t = 8080)]
    pub port: u16,
    /// Use this Postgres instead of a private cluster in the data dir.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Device of the in-process worker and inference.
    #[command(flatten)]
    pub device: verity_core::config::DeviceArgs,
    /// Train the demo (SmolLM2-135M on the arithmetic set), follow it, and exit.
    #[arg(long)]
    pub demo: bool,
}

/// Parses a flattened options struct from explicit flags (environment and defaults apply as
/// for the real subcommand).
#[derive(Debug, Parser)]
struct Flags<T: Args> {
    #[command(flatten)]
    inner: T,
}

fn parse_flags<T: Args>(flags: &[&str]) -> anyhow::Result<T> {
    let args = std::iter::once("verity-up").chain(flags.iter().copied());
    Ok(Flags::<T>::try_parse_from(args).context("building the configuration")?.inner)
}

/// Prints, once, what this machine lacks (`verity doctor`'s problems) with the fix for each.
/// The demo model's absence matters only to the demo (which fetches it).
async fn report_problems(data: &std::path::Path, database_url: Option<&str>, demo: bool) {
    let (data, url) = (data.to_path_buf(), database_url.map(str::to_string));
    let Ok(checks) =
        tokio::task::spawn_blocking(move || super::doctor::checks(&data, url.as_deref())).await
    else {
        return;
    };
    let problems: Vec<_> = checks
        .into_iter()
        .filter(|c| c.status != super::doctor::Status::Ok && (demo || c.name != "demo_model"))
        .collect();
    if !problems.is_empty() {
        println!(
            "verity up: this machine lacks something (`verity doctor` shows the full report):"
        );
        print!("{}", super::doctor::render(&problems, false));
    }
}

/// Starts everything, prints how to reach it, and runs until ctrl-c / SIGTERM (or, with
/// `--demo`, until the demo job ends).
pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let data = args
        .data_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", args.data_dir.display()))?;
    report_problems(&data, args.database_url.as_deref(), args.demo).await;
    let mut cluster: Option<PrivateCluster> = None;
    let database_url = match &args.database_url {
        Some(url) if !url.is_empty() => url.clone(),
        _ => {
            let dir = data.join("pg");
            let started =
                tokio::task::spawn_blocking(move || PrivateCluster::start(&dir)).await??;
            let started = cluster.insert(started);
            started.ensure_database().await?;
            started.database_url()
        }
    };
    let mut worker_stopped = true;
    let outcome = serve_and_work(&args, &data, &database_url, &mut worker_stopped).await;
    if let Some(mut cluster) = cluster.take() {
        tokio::task::spawn_blocking(move || cluster.stop()).await?;
    }
    if !worker_stopped {
        // The worker is inside a training step (its lease expires and the next start resumes
        // the job); exit now instead of waiting for the step in a blocking thread.
        let code = match &outcome {
            Ok(()) => 0,
            Err(error) => {
                eprintln!("Error: {error:#}");
                1
            }
        };
        std::process::exit(code);
    }
    outcome
}

/// Serves the API with an in-process worker; `worker_stopped` says whether the worker stopped in
/// time.
async fn serve_and_work(
    args: &UpArgs,
    data: &Path,
    database_url: &str,
    worker_stopped: &mut bool,
) -> anyhow::Result<()> {
    let listener =
        tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await.with_context(|| {
            format!("binding 127.0.0.1:{} (another server running? use --port)", args.port)
        })?;
    let address = listener.local_addr()?;
    let base = format!("http://{address}");
    let secret = local_secret(data, "server-secret")?;
    let objects = data.join("objects");
    let (objects, cache) =
        (objects.to_string_lossy().into_owned(), data.join("cache").to_string_lossy().into_owned());
    let config: ServeConfig = parse_flags(&[
        "--bind",
        &address.to_string(),
        "--database-url",
        database_url,
        "--storage",
        &objects,
        "--jwt-secret",
        &secret,
        "--signing-secret",
        &secret,
        "--public-url",
        &base,
        "--judge-cache-dir",
        &cache,
    ])?;
    let mut state = verity_server::app::build_state(&config).await?;
    let key = admin_key(&state.pool, data).await?;
    let liveness = WorkerLiveness::new();
    state.worker = Some(liveness.clone());

    // The embedded roles (training worker, inference) share the database, store, cache, device.
    let role_flags = [
        "--database-url",
        database_url,
        "--storage",
        &objects,
        "--cache-dir",
        &cache,
        "--device",
        &args.device.name,
    ];
    let worker_args: WorkerArgs = parse_flags(&role_flags)?;
    let shutdown = CancellationToken::new();
    let mut worker_config = super::worker::training_config(worker_args)?;
    // One grading budget for the process: training gradings and graders/run share the cores.
    worker_config.grader_budget = Some(state.grader_slots.budget.clone());
    let start_worker = {
        let (liveness, shutdown) = (liveness.clone(), shutdown.clone());
        move || {
            verity_worker::job::run_training_worker(
                worker_config.clone(),
                liveness.clone(),
                shutdown.clone(),
            )
        }
    };
    let mut worker = tokio::spawn(supervise_worker(
        start_worker,
        liveness,
        shutdown.clone(),
        RestartPolicy::DEFAULT,
    ));

    // The inference role, on a loopback port of its own, registered like `verity inference`.
    let inference_listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding the inference service")?;
    let inference_url = format!("http://{}", inference_listener.local_addr()?);
    let inference_args: verity_server::inference::InferenceArgs = parse_flags(&role_flags)?;
    // A device the inference role cannot use is the training worker's failure to report (it
    // dies, `/readyz` says why and `verity up` exits); inference then answers 503 until then.
    let inference = match verity_server::inference::engine_config(&inference_args) {
        Ok(config) => {
            let engine = std::sync::Arc::new(verity_worker::inference::Engine::new(
                state.store.clone(),
                config,
            ));
            Some(tokio::spawn(verity_server::inference::serve(
                state.pool.clone(),
                engine,
                inference_listener,
                inference_url,
                shutdown.clone(),
            )))
        }
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "the inference role cannot start");
            None
        }
    };

    println!("Verity is up: {base}");
    println!("  dashboard and API: {base}/  (OpenAPI: {base}/openapi.json)");
    match &key {
        AdminKey::New(key) => println!(
            "  admin API key (shown once; also saved to {}): {key}",
            data.join(ADMIN_KEY_FILE).display()
        ),
        AdminKey::Existing => {
            println!("  admin API key: in {}", data.join(ADMIN_KEY_FILE).display())
        }
    }
    println!("  data: {}   (stop with ctrl-c)", data.display());
    let _ = std::io::stdout().flush();

    let stop = shutdown.clone();
    let demo = args.demo.then(|| {
        let context = super::demo::DemoContext {
            base: base.clone(),
            key: key.value(data),
            store: state.store.clone(),
            pool: state.pool.clone(),
            data: data.to_path_buf(),
        };
        let stop = stop.clone();
        tokio::spawn(async move {
            let outcome = super::demo::run(&context).await;
            stop.cancel();
            outcome
        })
    });
    let server = axum::serve(listener, verity_server::app::service(verity_server::app::app(state)))
        .with_graceful_shutdown(async move {
            tokio::select! { _ = verity_server::app::shutdown_signal() => {}, _ = stop.cancelled() => {} }
        });
    let server = server.into_future();
    tokio::pin!(server);
    // Supervision: the worker task restarts the worker itself; if it gives up (or panics), the
    // whole process stops with its reason instead of serving without a worker.
    let first = tokio::select! {
        served = &mut server => Ok(served),
        joined = &mut worker => Err(joined),
    };
    let mut worker_died = None;
    let served = match first {
        Ok(served) => served.context("serving HTTP"),
        Err(joined) => {
            worker_died = match joined {
                Ok(Ok(_)) if shutdown.is_cancelled() => None,
                Ok(Ok(jobs)) => Some(format!("the worker stopped unexpectedly after {jobs} jobs")),
                Ok(Err(error)) => Some(format!("{error:#}")),
                Err(error) => Some(format!("the worker supervisor failed: {error}")),
            };
            *worker_stopped = true;
            if let Some(reason) = &worker_died {
                tracing::error!(%reason, "the embedded worker died; stopping");
            }
            shutdown.cancel();
            // Open streams (the dashboard's live updates) must not keep a process without a
            // worker alive: give them a moment, then stop regardless.
            match tokio::time::timeout(Duration::from_secs(10), server.as_mut()).await {
                Ok(served) => served.context("serving HTTP"),
                Err(_) => Ok(()),
            }
        }
    };
    shutdown.cancel();
    if !*worker_stopped {
        *worker_stopped = match tokio::time::timeout(Duration::from_secs(5), &mut worker).await {
            Ok(Ok(Ok(jobs))) => {
                tracing::info!(jobs, "worker stopped");
                true
            }
            Ok(Ok(Err(error))) => {
                tracing::error!(error = format!("{error:#}"), "the worker failed");
                true
            }
            Ok(Err(error)) => {
                tracing::error!(%error, "the worker task failed");
                true
            }
            Err(_) => false,
        };
    }
    if let Some(inference) = inference {
        if let Ok(Ok(Err(error))) = tokio::time::timeout(Duration::from_secs(5), inference).await {
            tracing::warn!(error = format!("{error:#}"), "the inference service failed");
        }
    }
    served?;
    if let Some(reason) = worker_died {
        anyhow::bail!("the embedded worker died: {reason}");
    }
    if let Some(demo) = demo {
        match tokio::time::timeout(Duration::from_millis(100), demo).await {
            Ok(joined) => joined??,
            Err(_) => anyhow::bail!("interrupted before the demo job finished"),
        }
    }
    Ok(())
}

/// When and how often [`supervise_worker`] restarts a worker that died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Delay before the first restart; doubles (with jitter) up to `max_delay`.
    pub initial_delay: Duration,
    /// Largest delay between restarts.
    pub max_delay: Duration,
    /// Consecutive failures after which the supervisor gives up.
    pub max_failures: u32,
    /// A run that lasted this long resets the failure count.
    pub healthy_after: Duration,
}

impl RestartPolicy {
    /// 1 s doubling to 30 s; give up after 5 failures in a row; a minute up counts as healthy.
    pub const DEFAULT: RestartPolicy = RestartPolicy {
        initial_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(30),
        max_failures: 5,
        healthy_after: Duration::from_secs(60),
    };
}

/// Runs the worker `start` makes in its own task until `shutdown`, restarting it with backoff
/// whenever it ends with an error or panics: each death is logged with its reason and marks
/// `liveness` dead (so `/readyz` answers 503 with the reason) until the restart. Gives up with
/// an error after `policy.max_failures` consecutive failures. Returns the jobs run.
pub async fn supervise_worker<F, Fut>(
    mut start: F,
    liveness: WorkerLiveness,
    shutdown: CancellationToken,
    policy: RestartPolicy,
) -> anyhow::Result<usize>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>> + Send + 'static,
{
    let mut backoff = Backoff::new(policy.initial_delay, policy.max_delay);
    loop {
        let started = std::time::Instant::now();
        let reason = match tokio::spawn(start()).await {
            Ok(Ok(done)) => return Ok(done),
            Ok(Err(error)) => format!("{error:#}"),
            Err(error) if error.is_panic() => {
                let panic = error.into_panic();
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                format!("the worker panicked: {message}")
            }
            Err(error) => format!("the worker task was cancelled: {error}"),
        };
        if shutdown.is_cancelled() {
            tracing::warn!(%reason, "the worker ended during shutdown");
            return Ok(0);
        }
        if started.elapsed() >= policy.healthy_after {
            backoff.reset();
        }
        if backoff.failures() + 1 >= policy.max_failures {
            let failures = backoff.failures() + 1;
            liveness.dead(format!("gave up after {failures} failures in a row: {reason}"));
            anyhow::bail!("the worker failed {failures} times in a row; last: {reason}");
        }
        let delay = backoff.next_delay();
        tracing::error!(%reason, failures = backoff.failures(), restart_in_ms = delay.as_millis() as u64,
                        "the worker died; restarting it");
        liveness.dead(format!("restarting after failure {}: {reason}", backoff.failures()));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.cancelled() => return Ok(0),
        }
    }
}

/// The admin key: made on first start, or already in the data dir.
enum AdminKey {
    New(String),
    Existing,
}

impl AdminKey {
    fn value(&self, data: &Path) -> anyhow::Result<String> {
        match self {
            AdminKey::New(key) => Ok(key.clone()),
            AdminKey::Existing => crate::commands::client::read_admin_key(data),
        }
    }
}

/// Creates the admin user and an API key on first start (saved to `<data>/admin-key`, 0600).
async fn admin_key(pool: &sqlx::PgPool, data: &Path) -> anyhow::Result<AdminKey> {
    const EMAIL: &str = "admin@localhost";
    let path = data.join(ADMIN_KEY_FILE);
    if path.is_file() {
        return Ok(AdminKey::Existing);
    }
    if verity_core::tenancy::find_user_by_email(pool, EMAIL).await?.is_none() {
        super::admin::create_user(pool, EMAIL, "local", "admin", None).await?;
    }
    let key = super::admin::create_key(pool, EMAIL, "verity up").await?;
    write_private(&path, &key)?;
    Ok(AdminKey::New(key))
}

/// A random secret kept in `<data>/<name>` (0600), made on first use.
fn local_secret(data: &Path, name: &str) -> anyhow::Result<String> {
    let path = data.join(name);
    if let Ok(secret) = std::fs::read_to_string(&path) {
        if secret.trim().len() >= 32 {
            return Ok(secret.trim().to_string());
        }
    }
    let secret: String = (0..48).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    write_private(&path, &secret)?;
    Ok(secret)
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
