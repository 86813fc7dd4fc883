//! Queue behaviour against a real Postgres (a fresh database per test).

use serde_json::json;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity_core::queue::{
    run_worker, DeviceKind, EventLevel, FailOutcome, Heartbeat, JobHandler, JobOutcome, JobWaker,
    Lease, NewJob, Queue, QueueError, QueueSettings, RunnerOptions, SampleIndexRow, SharedKind,
    Wake, WorkerInfo,
};
use verity_core::{ControlSignal, JobState};

async fn org(pool: &PgPool) -> uuid::Uuid {
    let id = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO orgs (id, name) VALUES ($1, $2)")
        .bind(id)
        .bind(format!("org-{id}"))
        .execute(pool)
        .await
        .unwrap();
    id
}

fn settings(retry_base_ms: u64) -> QueueSettings {
    QueueSettings {
        lease: Duration::from_secs(30),
        retry_base: Duration::from_millis(retry_base_ms),
        retry_max: Duration::from_secs(60),
        ..QueueSettings::DEFAULT
    }
}

fn cpu_worker() -> WorkerInfo {
    WorkerInfo::new(DeviceKind::Cpu, 16_000)
}

async fn event_kinds(pool: &PgPool, job: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT kind || ':' || message FROM job_events WHERE job_id = $1 ORDER BY id",
    )
    .bind(job)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn eight_workers_claim_each_of_200_jobs_exactly_once(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let mut ids = HashSet::new();
    for i in 0..200 {
        let mut job = NewJob::new(org, "m", json!({ "i": i }));
        job.priority = (i % 5) as i16;
        ids.insert(queue.enqueue(&job).await.unwrap());
    }
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let worker = cpu_worker();
                queue.register_worker(&worker).await.unwrap();
                let mut claimed = Vec::new();
                while let Some(lease) = queue.claim(&worker).await.unwrap() {
                    assert_eq!(lease.job().attempt, 1);
                    claimed.push(lease.job().id.clone());
                    lease.complete(&json!({}), None).await.unwrap();
                }
                claimed
            })
        })
        .collect();
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await.unwrap());
    }
    assert_eq!(all.len(), 200, "every job claimed exactly once");
    assert_eq!(all.iter().cloned().collect::<HashSet<_>>(), ids);
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state = 'succeeded' AND attempt = 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(succeeded, 200);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn claims_follow_priority_and_worker_capabilities(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let mut gpu_job = NewJob::new(org, "m", json!({}));
    gpu_job.required_device = "cuda".into();
    gpu_job.priority = 50;
    let gpu_job = queue.enqueue(&gpu_job).await.unwrap();
    let mut big_job = NewJob::new(org, "m", json!({}));
    big_job.required_memory_mb = 64_000;
    big_job.priority = 40;
    queue.enqueue(&big_job).await.unwrap();
    let low = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let mut high = NewJob::new(org, "m", json!({}));
    high.priority = 10;
    let high = queue.enqueue(&high).await.unwrap();

    let cpu = cpu_worker();
    assert_eq!(queue.claim(&cpu).await.unwrap().unwrap().job().id, high);
    assert_eq!(queue.claim(&cpu).await.unwrap().unwrap().job().id, low);
    assert!(
        queue.claim(&cpu).await.unwrap().is_none(),
        "cpu worker must not take the cuda or 64 GB job"
    );
    let gpu = WorkerInfo::new(DeviceKind::Cuda, 80_000);
    assert_eq!(queue.claim(&gpu).await.unwrap().unwrap().job().id, gpu_job);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_stale_attempt_can_write_nothing(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let job = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let (old_worker, new_worker) = (cpu_worker(), cpu_worker());
    queue.register_worker(&old_worker).await.unwrap();
    let old = queue.claim(&old_worker).await.unwrap().unwrap();
    old.metric(0, &json!({"loss": 1.0})).await.unwrap();

    // The old worker stalls: its lease runs out and the job is rescued and reclaimed.
    sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(&job)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(queue.rescue_expired().await.unwrap(), vec![job.clone()]);
    assert!(
        matches!(old.heartbeat(None).await, Err(QueueError::LeaseLost { .. })),
        "no heartbeat while queued"
    );
    let new = queue.claim(&new_worker).await.unwrap().unwrap();
    assert_eq!(new.job().attempt, 2);

    let lost =
        |r: Result<(), QueueError>| matches!(r, Err(QueueError::LeaseLost { attempt: 1, .. }));
    assert!(lost(old.heartbeat(None).await.map(|_| ())));
    assert!(lost(old.event(EventLevel::Info, "step", "stale", None).await));
    assert!(lost(old.metric(1, &json!({"loss": 9.0})).await));
    assert!(
        lost(old.metric(0, &json!({"loss": 9.0})).await),
        "cannot overwrite its own old row either"
    );
    assert!(lost(old.checkpoint(1, "jobs/x/step-1", 1, None).await.map(|_| ())));
    let row = SampleIndexRow {
        idx: 0,
        prompt_idx: 0,
        score: Some(1.0),
        advantage: None,
        finish_reason: None,
        storage_key: "k".into(),
        line_no: 0,
    };
    assert!(lost(old.samples(1, std::slice::from_ref(&row)).await));
    assert!(lost(old.complete(&json!({}), None).await.map(|_| ())));
    assert!(lost(old.fail("stale", true).await.map(|_| ())));
    assert!(lost(old.ack_cancel().await));
    assert!(lost(old.ack_pause().await));

    // The database itself refuses the stale attempt, whatever client writes.
    let raw = sqlx::query(
        "INSERT INTO job_metrics (job_id, step, attempt, data) VALUES ($1, 5, 1, '{}')",
    )
    .bind(&job)
    .execute(&pool)
    .await;
    assert!(raw.unwrap_err().to_string().contains("no longer holds"));

    // The new attempt writes normally and its rows replace the old attempt's.
    new.metric(0, &json!({"loss": 0.5})).await.unwrap();
    new.samples(0, &[row]).await.unwrap();
    new.checkpoint(0, "jobs/x/step-0", 10, None).await.unwrap();
    new.complete(&json!({"ok": true}), None).await.unwrap();
    let (attempt, data): (i32, serde_json::Value) =
        sqlx::query_as("SELECT attempt, data FROM job_metrics WHERE job_id = $1 AND step = 0")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((attempt, data), (2, json!({"loss": 0.5})));
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Succeeded);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn state_rules_are_enforced_by_the_database(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let job = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    // Running without a lease violates a CHECK constraint.
    let no_lease =
        sqlx::query("UPDATE jobs SET state = 'running', attempt = attempt + 1 WHERE id = $1")
            .bind(&job)
            .execute(&pool)
            .await;
    assert!(no_lease.unwrap_err().to_string().contains("running_has_lease"));
    queue.cancel(&job).await.unwrap();
    // A terminal job cannot move again.
    let revive = sqlx::query("UPDATE jobs SET state = 'queued', finished_at = NULL WHERE id = $1")
        .bind(&job)
        .execute(&pool)
        .await;
    assert!(revive
        .unwrap_err()
        .to_string()
        .contains("invalid job state transition cancelled -> queued"));
    assert!(matches!(queue.cancel(&job).await, Err(QueueError::InvalidState { .. })));
    assert!(matches!(queue.resume(&job).await, Err(QueueError::InvalidState { .. })));
    assert!(matches!(queue.cancel("ftjob-missing").await, Err(QueueError::NotFound(_))));
    assert_eq!(
        event_kinds(&pool, &job).await,
        vec!["created:job created in state queued", "state:queued -> cancelled"]
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn cancel_queued_at_once_and_running_through_the_worker(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let queued = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let outcome = queue.cancel(&queued).await.unwrap();
    assert_eq!((outcome.state, outcome.pending), (JobState::Cancelled, false));

    let running = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let worker = cpu_worker();
    let lease = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.heartbeat(None).await.unwrap(), ControlSignal::Continue);
    let outcome = queue.cancel(&running).await.unwrap();
    assert_eq!((outcome.state, outcome.pending), (JobState::Running, true));
    assert_eq!(lease.heartbeat(None).await.unwrap(), ControlSignal::Cancel);
    lease.ack_cancel().await.unwrap();
    assert_eq!(queue.state(&running).await.unwrap(), JobState::Cancelled);
    let events = event_kinds(&pool, &running).await;
    assert!(events.contains(&"cancel:cancel requested".to_string()), "{events:?}");
    assert_eq!(events.last().unwrap(), "state:running -> cancelled");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn pause_and_resume(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let worker = cpu_worker();
    let job = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    assert_eq!(queue.pause(&job).await.unwrap().state, JobState::Paused);
    assert!(queue.claim(&worker).await.unwrap().is_none(), "paused jobs are not claimable");
    assert_eq!(queue.resume(&job).await.unwrap().state, JobState::Queued);

    let lease = queue.claim(&worker).await.unwrap().unwrap();
    assert!(queue.pause(&job).await.unwrap().pending);
    assert_eq!(lease.heartbeat(None).await.unwrap(), ControlSignal::Pause);
    // Resume before the worker acts withdraws the request.
    assert_eq!(queue.resume(&job).await.unwrap().state, JobState::Running);
    assert_eq!(lease.heartbeat(None).await.unwrap(), ControlSignal::Continue);
    queue.pause(&job).await.unwrap();
    assert_eq!(lease.heartbeat(None).await.unwrap(), ControlSignal::Pause);
    lease.ack_pause().await.unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Paused);
    queue.resume(&job).await.unwrap();
    let next = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!((next.job().attempt, next.job().failures), (2, 0), "pausing costs no retry");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn retries_back_off_exponentially_then_fail(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(400));
    let org = org(&pool).await;
    let worker = cpu_worker();
    let job = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let lease = loop {
            if let Some(lease) = queue.claim(&worker).await.unwrap() {
                break lease;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(lease.job().attempt, attempt);
        let before = chrono::Utc::now();
        match lease.fail("boom", true).await.unwrap() {
            FailOutcome::Retrying { at } => {
                delays.push((at - before).num_milliseconds());
                assert!(
                    queue.claim(&worker).await.unwrap().is_none(),
                    "not claimable during backoff"
                );
            }
            FailOutcome::Failed => assert_eq!(attempt, 3, "fails only when attempts are spent"),
            FailOutcome::Cancelled => panic!("not cancelled"),
        }
    }
    assert_eq!(delays.len(), 2);
    assert!((350..2000).contains(&delays[0]), "first delay ~400 ms: {delays:?}");
    assert!((750..4000).contains(&delays[1]), "second delay ~800 ms: {delays:?}");
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Failed);
    let (failures, error): (i32, serde_json::Value) =
        sqlx::query_as("SELECT failures, error FROM jobs WHERE id = $1")
            .bind(&job)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failures, 3);
    assert_eq!(error["message"], "boom");

    // A non-retryable error fails at once.
    let fatal = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let lease = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(lease.fail("bad config", false).await.unwrap(), FailOutcome::Failed);
    assert_eq!(queue.state(&fatal).await.unwrap(), JobState::Failed);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn expired_leases_are_rescued_until_attempts_run_out(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let mut job = NewJob::new(org, "m", json!({}));
    job.max_attempts = 2;
    let job = queue.enqueue(&job).await.unwrap();
    let expire = || {
        sqlx::query("UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
            .bind(&job)
    };
    let worker = cpu_worker();
    queue.claim(&worker).await.unwrap().unwrap();
    assert!(queue.rescue_expired().await.unwrap().is_empty(), "a live lease is left alone");
    expire().execute(&pool).await.unwrap();
    assert_eq!(queue.rescue_expired().await.unwrap().len(), 1);
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Queued);
    queue.claim(&worker).await.unwrap().unwrap();
    expire().execute(&pool).await.unwrap();
    queue.rescue_expired().await.unwrap();
    assert_eq!(queue.state(&job).await.unwrap(), JobState::Failed);
    let events = event_kinds(&pool, &job).await;
    assert_eq!(
        events.iter().filter(|e| e.starts_with("state:running -> ")).count(),
        2,
        "{events:?}"
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn notify_wakes_an_idle_worker_within_a_second(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let waker = JobWaker::start(&pool).await.unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let wake = waker.wait(Duration::from_secs(30)).await;
        (wake, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    let (wake, waited) = waiting.await.unwrap();
    assert_eq!(wake, Wake::Notified);
    assert!(waited < Duration::from_secs(1) + Duration::from_millis(200), "woke after {waited:?}");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn polling_still_finds_jobs_when_the_listener_is_dead(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let org = org(&pool).await;
    let waker = JobWaker::start(&pool).await.unwrap();
    // Kill the listener for good: terminate its server connection, then stop its task so it
    // cannot reconnect.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "the listener's connection was found and terminated");
    tokio::time::sleep(Duration::from_millis(100)).await;
    waker.stop_listener();
    // A lost connection wakes waiters once (notifications may have been missed): take that.
    waker.wait(Duration::from_millis(50)).await;
    let job = queue.enqueue(&NewJob::new(org, "m", json!({}))).await.unwrap();
    assert_eq!(
        waker.wait(Duration::from_millis(300)).await,
        Wake::Poll,
        "no notification can arrive"
    );
    let lease = queue.claim(&cpu_worker()).await.unwrap().expect("the poll finds the job");
    assert_eq!(lease.job().id, job);
}

/// Claims the next job and completes it at once; returns the job's org.
async fn claim_and_complete(queue: &Queue, worker: &WorkerInfo) -> Option<uuid::Uuid> {
    let lease = queue.claim(worker).await.unwrap()?;
    let org = lease.job().org_id;
    lease.complete(&json!({}), None).await.unwrap();
    Some(org)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn one_orgs_backlog_does_not_starve_another(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let (a, b) = (org(&pool).await, org(&pool).await);
    for i in 0..50 {
        queue.enqueue(&NewJob::new(a, "m", json!({ "i": i }))).await.unwrap();
    }
    let worker = cpu_worker();
    // A is being served: two of its jobs done, one running.
    assert_eq!(claim_and_complete(&queue, &worker).await, Some(a));
    assert_eq!(claim_and_complete(&queue, &worker).await, Some(a));
    let running = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(running.job().org_id, a);
    // B enqueues one job after A's 50 (47 still queued): the next claim is B's.
    let mut late = NewJob::new(b, "m", json!({}));
    late.priority = -10;
    let late = queue.enqueue(&late).await.unwrap();
    let next = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(next.job().id, late, "B's single job starts within the next claim");
    // With nothing running, the orgs alternate: A (served less recently), then B's next job.
    running.complete(&json!({}), None).await.unwrap();
    next.complete(&json!({}), None).await.unwrap();
    let again = queue.enqueue(&NewJob::new(b, "m", json!({}))).await.unwrap();
    assert_eq!(claim_and_complete(&queue, &worker).await, Some(a));
    let next = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(next.job().id, again, "B's second job comes before A's 45 others");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn orgs_with_queued_work_are_served_round_robin(pool: PgPool) {
    let queue = Queue::new(pool.clone(), settings(0));
    let orgs = [org(&pool).await, org(&pool).await, org(&pool).await];
    // Each org enqueues in one burst, the first org first.
    for org in orgs {
        for i in 0..3 {
            let mut job = NewJob::new(org, "m", json!({ "i": i }));
            job.priority = i as i16;
            queue.enqueue(&job).await.unwrap();
        }
    }
    let worker = cpu_worker();
    let mut served = Vec::new();
    while let Some(org) = claim_and_complete(&queue, &worker).await {
        served.push(org);
    }
    let expected: Vec<_> = (0..3).flat_map(|_| orgs).collect();
    assert_eq!(served, expected);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_org_at_its_running_limit_waits_while_others_run(pool: PgPool) {
    let queue = Queue::new(pool.clone(), QueueSettings { org_max_running: 1, ..settings(0) });
    let (a, b) = (org(&pool).await, org(&pool).await);
    let a1 = queue.enqueue(&NewJob::new(a, "m", json!({}))).await.unwrap();
    let a2 = queue.enqueue(&NewJob::new(a, "m", json!({}))).await.unwrap();
    let b1 = queue.enqueue(&NewJob::new(b, "m", json!({}))).await.unwrap();
    let worker = cpu_worker();
    let first = queue.claim(&worker).await.unwrap().unwrap();
    assert_eq!(first.job().id, a1);
    assert_eq!(queue.claim(&worker).await.unwrap().unwrap().job().id, b1);
    assert!(queue.claim(&worker).await.unwrap().is_none(), "A has one running, its limit");
    assert_eq!(queue.state(&a2).await.unwrap(), JobState::Queued);
    first.complete(&json!({}), None).await.unwrap();
    assert_eq!(queue.claim(&worker).await.unwrap().unwrap().job().id, a2);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_org_at_its_queued_limit_is_refused_and_others_are_not(pool: PgPool) {
    let queue = Queue::new(pool.clone(), QueueSettings { org_max_queued: 3, ..settings(0) });
    let (a, b) = (org(&pool).await, org(&pool).await);
    for _ in 0..3 {
        queue.enqueue(&NewJob::new(a, "m", json!({}))).await.unwrap();
    }
    let refused = queue.enqueue(&NewJob::new(a, "m", json!({}))).await.unwrap_err();
    assert!(matches!(refused, QueueError::OrgQueueFull { limit: 3 }), "{refused:?}");
    assert!(refused.to_string().contains("VERITY_ORG_MAX_QUEUED"), "{refused}");
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE org_id = $1")
        .bind(a)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(queued, 3, "the refused job left nothing behind");
    queue.enqueue(&NewJob::new(b, "m", json!({}))).await.unwrap();
    // Once one of A's jobs starts, A may queue another.
    let worker = cpu_worker();
    while let Some(lease) = queue.claim(&worker).await.unwrap() {
        if lease.job().org_id == a {
            break;
        }
    }
    queue.enqueue(&NewJob::new(a, "m", json!({}))).await.unwrap();
}

/// A handler that holds every Tinker client until `release` is set, and records how many jobs
/// ran beside each one as it started.
struct HoldClients {
    release: tokio::sync::watch::Receiver<bool>,
    running: std::sync::atomic::AtomicUsize,
    started: std::sync::Mutex<Vec<(String, usize)>>,
}

#[async_trait::async_trait]
impl JobHandler for HoldClients {
    async fn run(&self, lease: &Lease, _heartbeat: &Heartbeat) -> JobOutcome {
        use std::sync::atomic::Ordering;
        let beside = self.running.fetch_add(1, Ordering::SeqCst);
        let kind = lease.job().kind.clone();
        self.started.lock().unwrap().push((kind.clone(), beside));
        if kind == "tinker" {
            let mut release = self.release.clone();
            let _ = release.wait_for(|r| *r).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        JobOutcome::Succeeded { result: json!({}), fine_tuned_model: None }
    }
}

/// Tinker clients mostly wait for calls, so one worker holds several (of several orgs) side by
/// side; a fine-tuning job still runs alone, after them.
#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_worker_holds_several_tinker_clients_but_runs_a_job_alone(pool: PgPool) {
    let quick = QueueSettings { poll_interval: Duration::from_millis(50), ..settings(0) };
    let queue = Queue::new(pool.clone(), quick);
    let (a, b) = (org(&pool).await, org(&pool).await);
    for org in [a, b, a] {
        let mut client = NewJob::new(org, "m", json!({}));
        client.id = format!("tinkjob-{}", uuid::Uuid::new_v4().simple());
        queue.enqueue_tinker(&client).await.unwrap();
    }
    let (release, held) = tokio::sync::watch::channel(false);
    let handler = Arc::new(HoldClients {
        release: held,
        running: Default::default(),
        started: Default::default(),
    });
    let shared = SharedKind { kind: "tinker".into(), max: 2 };
    let options = RunnerOptions { max_jobs: Some(4), shared: Some(shared), ..Default::default() };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = tokio::spawn(run_worker(
        queue.clone(),
        cpu_worker(),
        handler.clone(),
        options,
        shutdown.clone(),
    ));
    let running = || async {
        let states: Vec<(String, String)> =
            sqlx::query_as("SELECT kind, state FROM jobs WHERE state = 'running' ORDER BY kind")
                .fetch_all(&pool)
                .await
                .unwrap();
        states
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while running().await.len() < 2 {
        assert!(Instant::now() < deadline, "the worker never held two clients");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A job queued now waits: the worker holds clients, and its limit is two of them.
    let job = queue.enqueue(&NewJob::new(b, "m", json!({}))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = running().await;
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(now.iter().all(|(kind, _)| kind == "tinker"), "{now:?}");
    release.send(true).unwrap();
    assert_eq!(worker.await.unwrap(), 4);
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE id = $1")
        .bind(&job)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, "succeeded");
    let started = handler.started.lock().unwrap().clone();
    // The first client started alone, the second beside it; of the orgs' fair share, org b's
    // client came second, not org a's other one.
    assert_eq!(started[0], ("tinker".to_string(), 0), "{started:?}");
    assert_eq!(started[1], ("tinker".to_string(), 1), "{started:?}");
    let job_start = started.iter().find(|(kind, _)| kind == "fine_tuning").unwrap();
    assert_eq!(job_start.1, 0, "the fine-tuning job ran beside a client: {started:?}");
    let orgs: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT org_id FROM jobs WHERE kind = 'tinker' ORDER BY claimed_at LIMIT 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_ne!(orgs[0], orgs[1], "one org's two clients went before the other's one");
}
