//! `verity bench queue`: claims per second and claim latency with N concurrent workers.

use anyhow::Context;
use clap::Args;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::ConnectOptions;
use std::str::FromStr;
use std::time::{Duration, Instant};
use verity_core::queue::{DeviceKind, NewJob, Queue, QueueSettings, WorkerInfo};

/// Options of the queue benchmark.
#[derive(Debug, Args)]
pub struct QueueBenchArgs {
    /// Postgres server to create the scratch database on.
    #[arg(long = "database-url", env = "DATABASE_URL")]
    pub database_url: String,
    /// Concurrent worker counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub workers: Vec<usize>,
    /// Jobs claimed and completed per measurement.
    #[arg(long, default_value_t = 2000)]
    pub jobs: usize,
    /// Numbers of orgs the jobs are spread over, comma-separated (the claim serves orgs by fair
    /// share, so its cost may grow with the orgs that have queued work).
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    pub orgs: Vec<usize>,
}

/// Runs the benchmark and prints one JSON line per worker count.
pub async fn run(args: &QueueBenchArgs) -> anyhow::Result<()> {
    with_scratch_database(&args.database_url, |options| measure_all(args, options)).await
}

async fn measure_all(args: &QueueBenchArgs, options: PgConnectOptions) -> anyhow::Result<()> {
    let max_workers = args.workers.iter().copied().max().unwrap_or(1);
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(max_workers + 2).unwrap_or(64))
        .connect_with(options)
        .await?;
    verity_core::db::migrate(&pool).await?;
    let max_orgs = args.orgs.iter().copied().max().unwrap_or(1).max(1);
    let mut orgs = Vec::with_capacity(max_orgs);
    for n in 0..max_orgs {
        orgs.push(verity_core::tenancy::ensure_org(&pool, &format!("bench-{n}")).await?);
    }
    let queue = Queue::new(
        pool.clone(),
        QueueSettings {
            lease: Duration::from_secs(300),
            org_max_queued: 0,
            ..QueueSettings::default()
        },
    );
    for &org_count in &args.orgs {
        for &workers in &args.workers {
            measure(&queue, &orgs[..org_count.max(1)], workers, args.jobs).await?;
        }
    }
    pool.close().await;
    Ok(())
}

/// Enqueues `jobs` jobs spread round the `orgs`, drains them with `workers` concurrent workers
/// and prints one JSON line.
async fn measure(
    queue: &Queue,
    orgs: &[uuid::Uuid],
    workers: usize,
    jobs: usize,
) -> anyhow::Result<()> {
    for (i, org) in orgs.iter().cycle().take(jobs).enumerate() {
        let spec = serde_json::json!({ "i": i });
        queue.enqueue(&NewJob::new(*org, "bench-model", spec)).await?;
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move { drain(queue).await })
        })
        .collect();
    let mut latencies = Vec::with_capacity(jobs);
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0)
    };
    let line = serde_json::json!({
        "bench": "queue",
        "orgs": orgs.len(),
        "workers": workers,
        "jobs": latencies.len(),
        "claims_per_s": latencies.len() as f64 / elapsed,
        "claim_p50_ms": pct(0.50),
        "claim_p99_ms": pct(0.99),
        "seconds": elapsed,
    });
    println!("{line}");
    Ok(())
}

/// Claims and completes jobs until none is left; returns each claim's latency in ms.
async fn drain(queue: Queue) -> anyhow::Result<Vec<f64>> {
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1 << 20);
    queue.register_worker(&worker).await?;
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        let Some(lease) = queue.claim(&worker).await? else { break };
        latencies.push(started.elapsed().as_secs_f64() * 1e3);
        lease.complete(&serde_json::json!({}), None).await?;
    }
    Ok(latencies)
}

/// Runs `work` against a fresh scratch database on the Postgres server of `database_url`, and
/// drops that database afterwards whatever `work` returned.
pub async fn with_scratch_database<T, F, Fut>(database_url: &str, work: F) -> anyhow::Result<T>
where
    F: FnOnce(PgConnectOptions) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let admin_options = PgConnectOptions::from_str(database_url).context("parsing DATABASE_URL")?;
    let scratch = format!("verity_bench_{}", uuid::Uuid::new_v4().simple());
    let mut admin = admin_options.connect().await.context("connecting to Postgres")?;
    verity_core::db::create_database_if_missing(&mut admin, &scratch)
        .await
        .context("creating the scratch database")?;
    let result = work(admin_options.clone().database(&scratch)).await;
    verity_core::db::drop_database(&mut admin, &scratch)
        .await
        .context("dropping the scratch database")?;
    result
}
