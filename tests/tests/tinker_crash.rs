//! A real training worker process holding a Tinker training client is SIGKILLed: while no call
//! changed the client's state since its newest save, a second worker process restores it from
//! that save and the SDK's calls go on; once a call has changed it, the client fails (its state
//! is gone) instead of silently going back to the save.

use verity_tests::api_support;
use verity_tests::training_support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;
use training_support::{prepare_store, spawn_worker};

/// The official SDK's side: two steps and a save; then (after `GO` exists) the same loss from
/// the restored client and one more step; then (after `GO2`) the next call must fail. Prints
/// `SAVED` and `STEPPED` when it waits.
const SCRIPT: &str = r#"
import os, time, tinker
from tinker import types
connection = dict(base_url=os.environ["VERITY_BASE"], api_key="tml-" + os.environ["KEY"])
sc = tinker.ServiceClient(**connection)
tc = sc.create_lora_training_client(base_model="tiny-llama", rank=4).result()
tokens = [5, 9, 12, 3, 7]
datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 4})
def step():
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
def loss_now():
    return tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
def wait_for(name):
    while not os.path.exists(os.environ[name]):
        time.sleep(0.05)
step()
step()
tc.save_state("s2").result()
before = loss_now()
print("SAVED", flush=True)
wait_for("GO")
after = loss_now()
assert abs(after - before) < 1e-5, (after, before)
step()
print("STEPPED", flush=True)
wait_for("GO2")
try:
    loss_now()
    raise SystemExit("the client went back to its last save without a word")
except tinker.RequestFailedError as e:
    assert "lost" in str(e), str(e)
sc.close("success").result()
print("SDK OK", flush=True)
"#;

/// Reads the script's output until `line`.
async fn wait_for_line(lines: &mut Lines<BufReader<ChildStdout>>, line: &str) {
    let read = async {
        while let Some(next) = lines.next_line().await.unwrap() {
            if next == line {
                return;
            }
        }
        panic!("the script ended before printing {line}");
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .unwrap_or_else(|_| panic!("no {line} from the script"));
}

/// SIGKILLs `worker` and starts another in its place, once the client's queue row is held.
async fn replace_worker(worker: &mut Child, pool: &sqlx::PgPool, url: &str, root: &Path) -> Child {
    let state: String = sqlx::query_scalar("SELECT state FROM jobs WHERE kind = 'tinker'")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(state, "running", "the client is held by the worker about to be killed");
    let next = spawn_worker(env!("CARGO_BIN_EXE_verity-training-worker"), url, root);
    worker.kill().expect("SIGKILL the worker");
    worker.wait().unwrap();
    next
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_lost_workers_client_comes_back_from_its_save_unless_a_call_changed_it(
    pool: sqlx::PgPool,
) {
    let Ok(python) = std::env::var("VERITY_TEST_TINKER_PYTHON") else {
        eprintln!(
            "SKIPPED: VERITY_TEST_TINKER_PYTHON is not set (source scripts/test-services.sh)"
        );
        return;
    };
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(verity_server::app::serve(listener, verity_server::app::app(state)));
    let key = api_support::user(&pool, "a@x.io", "org-a", "member").await;
    let mut worker = spawn_worker(env!("CARGO_BIN_EXE_verity-training-worker"), &url, root.path());

    let script = root.path().join("script.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let (go, go2) = (root.path().join("go"), root.path().join("go2"));
    let mut sdk = tokio::process::Command::new(&python)
        .arg(&script)
        .env("VERITY_BASE", &base)
        .env("KEY", &key)
        .env("GO", &go)
        .env("GO2", &go2)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(sdk.stdout.take().unwrap()).lines();

    // Killed right after a save: nothing is lost, another worker takes the client on.
    wait_for_line(&mut lines, "SAVED").await;
    let mut worker = replace_worker(&mut worker, &pool, &url, root.path()).await;
    std::fs::write(&go, "").unwrap();
    // Killed after a step past the save: the client fails rather than go back unseen.
    wait_for_line(&mut lines, "STEPPED").await;
    let mut last = replace_worker(&mut worker, &pool, &url, root.path()).await;
    std::fs::write(&go2, "").unwrap();
    wait_for_line(&mut lines, "SDK OK").await;
    let output = tokio::time::timeout(Duration::from_secs(60), sdk.wait_with_output())
        .await
        .expect("the script ends")
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let started = Instant::now();
    let (state, attempt, error): (String, i32, Option<serde_json::Value>) = loop {
        let row: (String, i32, Option<serde_json::Value>) =
            sqlx::query_as("SELECT state, attempt, error FROM jobs WHERE kind = 'tinker'")
                .fetch_one(&pool)
                .await
                .unwrap();
        if row.0 == "failed" || started.elapsed() > Duration::from_secs(30) {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((state.as_str(), attempt), ("failed", 3), "{error:?}");
    let message = error.unwrap()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("was lost"), "{message}");
    let _ = last.kill();
    let _ = last.wait();
}
