//! A real worker process is SIGKILLed mid-job; after its lease expires another worker process
//! claims the job, resumes it and finishes it, and every step is recorded exactly once. Then the
//! same twenty times over, at random points of twenty jobs.

use sqlx::PgPool;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use verity_core::queue::{NewJob, Queue, QueueSettings};
use verity_core::JobState;

fn spawn_worker(database_url: &str) -> Child {
    spawn_worker_with_lease(database_url, 2000)
}

fn spawn_worker_with_lease(database_url: &str, lease_ms: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_verity-test-worker"))
        .env("DATABASE_URL", database_url)
        .env("TEST_LEASE_MS", lease_ms.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start the test worker")
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn sigkilled_worker_is_replaced_and_the_job_finishes(pool: PgPool) {
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let org = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO orgs (id, name) VALUES ($1, 'crash')")
        .bind(org)
        .execute(&pool)
        .await
        .unwrap();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let job = queue
        .enqueue(&NewJob::new(org, "m", serde_json::json!({ "steps": 12, "step_ms": 150 })))
        .await
        .unwrap();
    let metric_rows = || {
        let pool = pool.clone();
        let job = job.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM job_metrics WHERE job_id = $1")
                .bind(&job)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    let mut first = spawn_worker(&url);
    wait_until("the first worker's progress", Duration::from_secs(60), || async {
        metric_rows().await >= 3
    })
    .await;
    first.kill().expect("SIGKILL the worker"); // Child::kill sends SIGKILL on Unix.
    first.wait().unwrap();
    let at_kill = metric_rows().await;
    assert!(at_kill < 12, "killed mid-job");
    assert_eq!(
        queue.state(&job).await.unwrap(),
        JobState::Running,
        "the dead worker still holds the lease"
    );

    let mut second = spawn_worker(&url);
    wait_until("the job to finish", Duration::from_secs(120), || async {
        queue.state(&job).await.unwrap() == JobState::Succeeded
    })
    .await;
    assert!(second.wait().unwrap().success());

    let rows = steps_and_attempts(&pool, &job).await;
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..12).collect::<Vec<_>>(),
        "each step exactly once"
    );
    assert!(
        rows.iter().any(|r| r.1 == 1) && rows.iter().any(|r| r.1 == 2),
        "both attempts contributed: {rows:?}"
    );
    let (attempt, failures): (i32, i32) =
        sqlx::query_as("SELECT attempt, failures FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempt, failures), (2, 1));
    let kinds: Vec<String> =
        sqlx::query_scalar("SELECT kind FROM job_events WHERE job_id = $1 ORDER BY id")
            .bind(&job)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(kinds.contains(&"resumed".to_string()), "{kinds:?}");
    let lease_error: serde_json::Value = sqlx::query_scalar(
        "SELECT data FROM job_events WHERE job_id = $1 AND message = 'running -> queued'",
    )
    .bind(&job)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(lease_error["error"]["code"], "lease_expired");
}

/// Kills per run of [`twenty_sigkills_at_random_points_all_resume`].
const KILLS: usize = 20;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn twenty_sigkills_at_random_points_all_resume(pool: PgPool) {
    use rand::Rng;
    const STEPS: i64 = 10;
    const STEP_MS: u64 = 60;
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let org = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO orgs (id, name) VALUES ($1, 'crash-resume')")
        .bind(org)
        .execute(&pool)
        .await
        .unwrap();
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let started = Instant::now();
    let mut rng = rand::rng();
    for kill in 0..KILLS {
        let spec = serde_json::json!({ "steps": STEPS, "step_ms": STEP_MS });
        let job = queue.enqueue(&NewJob::new(org, "m", spec)).await.unwrap();
        let steps = || {
            let (pool, job) = (pool.clone(), job.clone());
            async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM job_metrics WHERE job_id = $1")
                    .bind(&job)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            }
        };
        // A random point: after 1..=STEPS-3 recorded steps, plus a random part of a step (so
        // some kills land inside a step, some around a write).
        let after = rng.random_range(1..=STEPS - 3);
        let extra = Duration::from_millis(rng.random_range(0..STEP_MS));
        let mut victim = spawn_worker_with_lease(&url, 1000);
        let waiting = Instant::now();
        while steps().await < after {
            assert!(waiting.elapsed() < Duration::from_secs(60), "kill {kill}: no progress");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(extra).await;
        victim.kill().expect("SIGKILL the worker");
        victim.wait().unwrap();
        let at_kill = steps().await;
        assert!(at_kill < STEPS, "kill {kill}: killed mid-job ({at_kill} steps)");

        let mut rescuer = spawn_worker_with_lease(&url, 1000);
        wait_until("the resumed job to finish", Duration::from_secs(60), || async {
            queue.state(&job).await.unwrap() == JobState::Succeeded
        })
        .await;
        assert!(rescuer.wait().unwrap().success());
        let rows = steps_and_attempts(&pool, &job).await;
        assert_eq!(
            rows.iter().map(|r| r.0 as i64).collect::<Vec<_>>(),
            (0..STEPS).collect::<Vec<_>>(),
            "kill {kill} (after {after} steps + {extra:?}): contiguous unique steps"
        );
        assert!(rows.iter().any(|r| r.1 == 2), "kill {kill}: the second attempt resumed it");
    }
    eprintln!(
        "{KILLS} kills at random points, all resumed and succeeded in {:.1?}",
        started.elapsed()
    );
}

/// The (step, attempt) of each metrics row a job recorded, by step.
async fn steps_and_attempts(pool: &sqlx::PgPool, job: &str) -> Vec<(i32, i32)> {
    sqlx::query_as("SELECT step, attempt FROM job_metrics WHERE job_id = $1 ORDER BY step")
        .bind(job)
        .fetch_all(pool)
        .await
        .unwrap()
}
