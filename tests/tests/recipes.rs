//! Recipes end to end through the API, the real queue, a local store and a CPU worker on a tiny
//! random model: the R1 recipe's five stages (cold-start SFT → RL → rejection sampling → SFT of a
//! fresh base on the kept samples → evaluation of all four models) run one after another with
//! every reference filled in, the RL stage after its guard; bad stage bodies and references
//! refused at creation naming the stage and field, with nothing written; a stage that cannot
//! start stops the recipe naming the field; a guard that predicts no advantage pauses the recipe
//! before the stage and resuming runs it anyway; cancel and resume.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{get, post, upload, user};
use axum::http::StatusCode;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{
    contains_grader, cpu_training_handler, prepare_store, prompts_jsonl, MODEL,
};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::storage::ObjectStore;
use verity_server::api::recipes::advance::{advance_all, Advance};
use verity_server::api::state::AppState;

struct Setup {
    state: AppState,
    router: axum::Router,
    pool: PgPool,
    store: Arc<dyn ObjectStore>,
    queue: Queue,
    key: String,
    prompts: String,
    chats: String,
    root: tempfile::TempDir,
}

/// Four chats whose answers are the prompts file's.
fn chats_jsonl() -> String {
    ["t1", "t2", "t3", "t1"]
        .iter()
        .enumerate()
        .map(|(i, answer)| {
            let messages = json!([{"role": "user", "content": format!("t{} t{}", 5 + i, 20 + i)},
                                  {"role": "assistant", "content": answer}]);
            json!({ "messages": messages }).to_string() + "\n"
        })
        .collect()
}

async fn setup(pool: PgPool) -> Setup {
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state.clone());
    let key = user(&pool, "ada@example.com", "acme", "admin").await;
    let mut ids = Vec::new();
    for (name, content) in [("prompts.jsonl", prompts_jsonl()), ("chats.jsonl", chats_jsonl())] {
        let reply = upload(&router, &key, name, content.as_bytes()).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
        ids.push(reply.json()["id"].as_str().unwrap().to_string());
    }
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let chats = ids.pop().unwrap();
    let prompts = ids.pop().unwrap();
    Setup { state, router, pool, store, queue, key, prompts, chats, root }
}

impl Setup {
    /// Runs one queued row (a stage) on a CPU worker.
    async fn run_one(&self) {
        let handler = cpu_training_handler(self.store.clone(), &self.root.path().join("cache"));
        let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
        let info = WorkerInfo::new(DeviceKind::Cpu, 1024);
        let done = run_worker(
            self.queue.clone(),
            info,
            Arc::new(handler),
            options,
            CancellationToken::new(),
        )
        .await;
        assert_eq!(done, 1);
    }

    async fn recipe(&self, id: &str) -> Value {
        let reply = get(&self.router, &format!("/v1/verity/recipes/{id}"), &self.key).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
        reply.json()
    }

    async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    fn sft(&self, model: &str, file: &str) -> Value {
        json!({"model": model, "training_file": file, "method": {"type": "supervised",
               "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}}})
    }

    fn rl(&self, model: &str) -> Value {
        let hp = json!({"batch_size": 2, "group_size": 4, "max_steps": 1, "max_completion_tokens": 4,
                        "learning_rate": 0.05, "micro_batch_size": 8,
                        "lora": {"rank": 4, "alpha": 8.0, "dropout": 0.0}});
        json!({"model": model, "training_file": self.prompts, "method": {"type": "reinforcement",
               "reinforcement": {"grader": contains_grader(), "hyperparameters": hp}}})
    }

    /// The R1 recipe on the tiny model.
    fn r1(&self) -> Value {
        json!({"name": "r1 on tiny", "seed": 3,
               "guard": {"max_zero_advantage_fraction": 1.0, "prompts": 4}, "stages": [
            {"name": "sft", "type": "fine_tuning_job", "fine_tuning_job": self.sft(MODEL, &self.chats)},
            {"name": "rl", "type": "fine_tuning_job",
             "fine_tuning_job": self.rl("{{stages.sft.fine_tuned_model}}")},
            {"name": "rs", "type": "rejection_sampling", "rejection_sampling": {
                "model": "{{stages.rl.fine_tuned_model}}", "file": self.prompts,
                "grader": contains_grader(), "k": 6, "max_tokens": 4}},
            {"name": "distill", "type": "fine_tuning_job", "fresh_base": true,
             "fine_tuning_job": {"training_file": "{{stages.rs.file}}", "method": {"type": "supervised",
                 "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": 2}}}}},
            {"name": "eval", "type": "evaluation", "evaluation": {
                "models": [MODEL, "{{stages.sft.fine_tuned_model}}", "{{stages.rl.fine_tuned_model}}",
                           "{{stages.distill.fine_tuned_model}}"],
                "file": self.prompts, "grader": contains_grader(), "n": 2, "max_tokens": 4}}
        ]})
    }
}

/// A change to a recipe body that makes it wrong.
type Patch = Box<dyn Fn(&mut Value)>;

fn statuses(recipe: &Value) -> Vec<String> {
    recipe["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap().to_string())
        .collect()
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_r1_recipe_runs_its_five_stages_in_order(pool: PgPool) {
    let s = setup(pool).await;
    let created = post(&s.router, "/v1/verity/recipes", &s.key, s.r1()).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("recipe-"), "{created}");
    assert_eq!(created["object"], "verity.recipe");
    assert_eq!(created["status"], "running");
    assert_eq!(created["base_model"], MODEL);
    // The first stage is queued at once; the others wait.
    assert_eq!(statuses(&created), ["queued", "pending", "pending", "pending", "pending"]);
    assert!(created["stages"][0]["id"].as_str().unwrap().starts_with("ftjob-"));
    assert_eq!(created["stages"][1]["fine_tuning_job"]["model"], "{{stages.sft.fine_tuned_model}}");

    // Each pass after a stage (or the RL stage's guard) ran starts what comes next.
    let expected = [
        Advance::Guarding(1),
        Advance::Started(1),
        Advance::Started(2),
        Advance::Started(3),
        Advance::Started(4),
        Advance::Finished("succeeded"),
    ];
    for (i, next) in expected.into_iter().enumerate() {
        s.run_one().await;
        let passes = advance_all(&s.state).await.unwrap();
        assert_eq!(passes, vec![(id.clone(), next.clone())], "pass {i}");
        let recipe = s.recipe(&id).await;
        match next {
            Advance::Guarding(stage) => {
                assert_eq!(recipe["stages"][stage]["status"], "guarding", "{recipe}");
                assert!(recipe["stages"][stage]["guard"]["id"]
                    .as_str()
                    .unwrap()
                    .starts_with("dpjob-"));
            }
            Advance::Started(stage) => {
                assert_eq!(recipe["stages"][stage - 1]["status"], "succeeded", "{recipe}");
                assert_eq!(recipe["stages"][stage]["status"], "queued", "{recipe}");
            }
            _ => {}
        }
    }
    let rl_guard = &s.recipe(&id).await["stages"][1]["guard"];
    assert_eq!(rl_guard["passed"], true, "{rl_guard}");
    assert_eq!(rl_guard["status"], "succeeded");
    assert!(rl_guard["predicted_zero_advantage_fraction"].is_number(), "{rl_guard}");
    let recipe = s.recipe(&id).await;
    assert_eq!(recipe["status"], "succeeded", "{recipe}");
    assert!(recipe["finished_at"].is_i64());
    let stages = recipe["stages"].as_array().unwrap();
    let model_of =
        |i: usize| stages[i]["outputs"]["fine_tuned_model"].as_str().unwrap().to_string();
    let (sft, rl, distill) = (model_of(0), model_of(1), model_of(3));

    // Each stage ran on what the one it names made.
    let job = |id: &Value| {
        let path = format!("/v1/fine_tuning/jobs/{}", id.as_str().unwrap());
        let (router, key) = (s.router.clone(), s.key.clone());
        async move { get(&router, &path, &key).await.json() }
    };
    assert_eq!(job(&stages[0]["id"]).await["seed"], 3, "the recipe's seed");
    assert_eq!(job(&stages[1]["id"]).await["model"], sft);
    let rs_id = stages[2]["id"].as_str().unwrap();
    let rs = get(&s.router, &format!("/v1/verity/rejection_sampling/{rs_id}"), &s.key).await.json();
    assert_eq!(rs["model"]["name"], rl);
    let kept = rs["output_file"].as_str().expect("some completion passes").to_string();
    assert_eq!(stages[2]["outputs"]["file"], kept.as_str());
    assert_eq!(stages[2]["summary"]["kept"], rs["summary"]["kept"]);
    let distilled = job(&stages[3]["id"]).await;
    assert_eq!(distilled["model"], MODEL, "a fresh base");
    assert_eq!(distilled["training_file"], kept.as_str());
    // The evaluation compares all four models, its report on the recipe.
    let report = &stages[4]["summary"];
    let evaluated: Vec<&str> =
        report["models"].as_array().unwrap().iter().map(|m| m["model"].as_str().unwrap()).collect();
    assert_eq!(evaluated, [MODEL, sft.as_str(), rl.as_str(), distill.as_str()]);
    // A finished recipe is left alone.
    assert!(advance_all(&s.state).await.unwrap().is_empty());
    let listed = get(&s.router, "/v1/verity/recipes", &s.key).await.json();
    assert_eq!(listed["data"][0]["id"], id.as_str());
    assert_eq!(listed["data"][0]["status"], "succeeded");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn bad_recipes_are_refused_naming_stage_and_field_and_nothing_is_written(pool: PgPool) {
    let s = setup(pool).await;
    let other = user(&s.pool, "eve@example.com", "evil", "admin").await;
    let theirs = upload(&s.router, &other, "x.jsonl", prompts_jsonl().as_bytes()).await.json();
    let theirs = theirs["id"].as_str().unwrap().to_string();
    let cases: Vec<(Patch, &str, &str)> = vec![
        (
            Box::new(|r| {
                r["stages"][1]["fine_tuning_job"]["model"] =
                    json!("{{stages.eval.fine_tuned_model}}")
            }),
            "stages[1].fine_tuning_job.model",
            "no earlier stage",
        ),
        (
            Box::new(|r| {
                r["stages"][2]["rejection_sampling"]["model"] =
                    json!("{{stages.sft.fine_tuned_modle}}")
            }),
            "stages[2].rejection_sampling.model",
            "no output \"fine_tuned_modle\"",
        ),
        (
            Box::new(|r| {
                r["stages"][3]["fine_tuning_job"]["training_file"] =
                    json!("{{stages.rl.fine_tuned_model}}")
            }),
            "stages[3].fine_tuning_job.training_file",
            "is a model",
        ),
        (
            Box::new(|r| {
                r["stages"][1]["fine_tuning_job"]["training_file"] = json!("{{stages.rs.file}}")
            }),
            "stages[1].fine_tuning_job.training_file",
            "supervised chat file",
        ),
        (
            Box::new(|r| {
                r["stages"][3]["fine_tuning_job"]["validation_file"] = json!("{{stages.eval.file}}")
            }),
            "stages[3].fine_tuning_job.validation_file",
            "no earlier stage",
        ),
        (
            Box::new(|r| r["stages"][0]["fine_tuning_job"]["training_fle"] = json!("x")),
            "stages[0].fine_tuning_job.training_fle",
            "Unrecognized",
        ),
        (
            Box::new(|r| r["stages"][0]["fine_tuning_job"]["model"] = json!("no-such-model")),
            "stages[0].fine_tuning_job.model",
            "does not exist",
        ),
        (
            Box::new(move |r| r["stages"][2]["rejection_sampling"]["file"] = json!(theirs)),
            "stages[2].rejection_sampling.file",
            "no file",
        ),
        (
            Box::new(|r| {
                r["stages"][1]["fine_tuning_job"]["method"]["reinforcement"]["hyperparameters"]
                    ["group_size"] = json!(0)
            }),
            "stages[1].fine_tuning_job.method.reinforcement.hyperparameters.group_size",
            "",
        ),
        (
            Box::new(|r| r["stages"][4]["evaluation"]["grader"] = json!({"type": "nope"})),
            "stages[4].evaluation.grader",
            "",
        ),
        (
            Box::new(|r| {
                r["stages"][4]["evaluation"]["models"][3] = json!("{{stages.sft.fine_tuned_model}}")
            }),
            "stages[4].evaluation.models[3]",
            "listed twice",
        ),
        (Box::new(|r| r["stages"][4]["evaluation"]["k"] = json!(2)), "stages[4].evaluation", "k"),
        (
            Box::new(|r| r["stages"][3]["fine_tuning_job"]["model"] = json!(MODEL)),
            "stages[3].fine_tuning_job.model",
            "fresh_base",
        ),
        (Box::new(|r| r["stages"][3]["name"] = json!("rl")), "stages[3].name", "two stages"),
        (
            Box::new(|r| r["stages"][3]["type"] = json!("distillation")),
            "stages[3].type",
            "unknown stage type",
        ),
        (Box::new(|r| r["stages"] = json!([])), "stages", "1 to 16"),
        (Box::new(|r| r["guard"] = json!({"prompts": 0})), "guard.prompts", "1 to"),
    ];
    for (patch, param, says) in cases {
        let mut body = s.r1();
        patch(&mut body);
        let reply = post(&s.router, "/v1/verity/recipes", &s.key, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{param}: {:?}", reply.json());
        let error = &reply.json()["error"];
        let got = error["param"].as_str().unwrap_or_default();
        assert!(got.starts_with(param), "expected {param}: {error}");
        assert!(error["message"].as_str().unwrap().contains(says), "{param}: {error}");
    }
    let unknown =
        post(&s.router, "/v1/verity/recipes", &s.key, json!({"stages": [], "budgt": 1})).await;
    assert_eq!(unknown.status.as_u16() / 100, 4, "{:?}", unknown.json());
    assert_eq!(s.count("recipes").await, 0, "no recipe was written");
    assert_eq!(s.count("jobs").await, 0, "nothing was queued");
    // Another org's recipe is as missing as one that does not exist.
    let ours = post(&s.router, "/v1/verity/recipes", &s.key, s.r1()).await.json();
    let ours = ours["id"].as_str().unwrap();
    let peek = get(&s.router, &format!("/v1/verity/recipes/{ours}"), &other).await;
    assert_eq!(peek.status, StatusCode::NOT_FOUND);
    let cancel =
        post(&s.router, &format!("/v1/verity/recipes/{ours}/cancel"), &other, Value::Null).await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_stage_that_cannot_start_stops_the_recipe_naming_the_field(pool: PgPool) {
    let s = setup(pool).await;
    let never = json!({"type": "string_check", "name": "never", "input": "{{sample.output_text}}",
                       "reference": "no completion says this", "operation": "eq"});
    let body = json!({"stages": [
        {"name": "rs", "type": "rejection_sampling", "rejection_sampling": {
            "model": MODEL, "file": s.prompts, "grader": never, "k": 2, "max_tokens": 4}},
        {"name": "distill", "type": "fine_tuning_job", "fresh_base": true,
         "fine_tuning_job": {"training_file": "{{stages.rs.file}}"}}
    ]});
    let created = post(&s.router, "/v1/verity/recipes", &s.key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let id = created.json()["id"].as_str().unwrap().to_string();
    s.run_one().await;
    let passes = advance_all(&s.state).await.unwrap();
    assert_eq!(passes, vec![(id.clone(), Advance::Finished("failed"))]);
    let recipe = s.recipe(&id).await;
    assert_eq!(recipe["status"], "failed");
    assert_eq!(statuses(&recipe), ["succeeded", "pending"]);
    let error = &recipe["error"];
    assert_eq!(error["stage"], "distill");
    assert_eq!(error["param"], "stages[1].fine_tuning_job.training_file");
    assert!(error["message"].as_str().unwrap().contains("kept no samples"), "{error}");
    assert_eq!(s.count("jobs").await, 1, "the refused stage queued nothing");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_cancelled_recipe_resumes_where_it_stopped(pool: PgPool) {
    let s = setup(pool).await;
    let body = json!({"stages": [
        {"name": "sft", "type": "fine_tuning_job", "fine_tuning_job": s.sft(MODEL, &s.chats)},
        {"name": "eval", "type": "evaluation", "evaluation": {
            "models": [MODEL, "{{stages.sft.fine_tuned_model}}"], "file": s.prompts,
            "grader": contains_grader(), "n": 2, "max_tokens": 4}}
    ]});
    let created = post(&s.router, "/v1/verity/recipes", &s.key, body).await.json();
    let id = created["id"].as_str().unwrap().to_string();
    let first = created["stages"][0]["id"].as_str().unwrap().to_string();
    let cancelled =
        post(&s.router, &format!("/v1/verity/recipes/{id}/cancel"), &s.key, Value::Null).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.json());
    let cancelled = cancelled.json();
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["stages"][0]["status"], "cancelled", "its stage is cancelled too");
    let again =
        post(&s.router, &format!("/v1/verity/recipes/{id}/cancel"), &s.key, Value::Null).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert!(advance_all(&s.state).await.unwrap().is_empty(), "a cancelled recipe does not advance");

    let resumed =
        post(&s.router, &format!("/v1/verity/recipes/{id}/resume"), &s.key, Value::Null).await;
    assert_eq!(resumed.status, StatusCode::OK, "{:?}", resumed.json());
    let resumed = resumed.json();
    assert_eq!(resumed["status"], "running");
    assert_eq!(resumed["stages"][0]["status"], "queued");
    assert_ne!(resumed["stages"][0]["id"], first.as_str(), "a new attempt");
    assert_eq!(resumed["stages"][0]["earlier_ids"], json!([first]));
    s.run_one().await;
    advance_all(&s.state).await.unwrap();
    s.run_one().await;
    advance_all(&s.state).await.unwrap();
    let recipe = s.recipe(&id).await;
    assert_eq!(recipe["status"], "succeeded", "{recipe}");
    let twice =
        post(&s.router, &format!("/v1/verity/recipes/{id}/resume"), &s.key, Value::Null).await;
    assert_eq!(twice.status, StatusCode::BAD_REQUEST, "only a stopped recipe resumes");
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_guard_pauses_a_stage_that_cannot_learn_and_resuming_runs_it_anyway(pool: PgPool) {
    let s = setup(pool).await;
    let never = json!({"type": "string_check", "name": "never", "input": "{{sample.output_text}}",
                       "reference": "no completion says this", "operation": "eq"});
    let mut rl = s.rl(MODEL);
    rl["method"]["reinforcement"]["grader"] = never;
    let body = json!({"guard": {"prompts": 4}, "stages": [
        {"name": "rl", "type": "fine_tuning_job", "fine_tuning_job": rl}]});
    let created = post(&s.router, "/v1/verity/recipes", &s.key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["guard"]["max_zero_advantage_fraction"], 0.9, "the default limit");
    assert_eq!(statuses(&created), ["guarding"], "the guard runs first");
    s.run_one().await;
    assert_eq!(advance_all(&s.state).await.unwrap(), vec![(id.clone(), Advance::Paused(0))]);
    let paused = s.recipe(&id).await;
    assert_eq!(paused["status"], "paused", "{paused}");
    let error = &paused["error"];
    assert_eq!(error["stage"], "rl");
    assert_eq!(error["predicted_zero_advantage_fraction"], 1.0);
    let message = error["message"].as_str().unwrap();
    for fix in ["group_size", "temperature", "filtered_file", "warm start", "Resume"] {
        assert!(message.contains(fix), "the warning names {fix}: {message}");
    }
    assert_eq!(s.count("jobs WHERE kind = 'fine_tuning'").await, 0, "the stage did not start");
    assert!(advance_all(&s.state).await.unwrap().is_empty(), "a paused recipe waits");

    let resumed =
        post(&s.router, &format!("/v1/verity/recipes/{id}/resume"), &s.key, Value::Null).await;
    assert_eq!(resumed.status, StatusCode::OK, "{:?}", resumed.json());
    let resumed = resumed.json();
    assert_eq!(resumed["status"], "running");
    assert_eq!(statuses(&resumed), ["queued"], "resuming runs the stage anyway: {resumed}");
    assert_eq!(resumed["stages"][0]["guard"]["passed"], true);
    s.run_one().await;
    assert_eq!(
        advance_all(&s.state).await.unwrap(),
        vec![(id.clone(), Advance::Finished("succeeded"))]
    );
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_recipe_budget_caps_its_stages_and_stops_it_once_spent(pool: PgPool) {
    let s = setup(pool).await;
    let body = json!({"guard": false, "budget": {"max_tokens": 1}, "stages": [
        {"name": "rl", "type": "fine_tuning_job", "fine_tuning_job": s.rl(MODEL)},
        {"name": "eval", "type": "evaluation", "evaluation": {
            "models": [MODEL, "{{stages.rl.fine_tuned_model}}"], "file": s.prompts,
            "grader": contains_grader(), "n": 2, "max_tokens": 4}}]});
    let created = post(&s.router, "/v1/verity/recipes", &s.key, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let created = created.json();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["budget"], json!({"max_wall_seconds": null, "max_tokens": 1}));
    assert_eq!(statuses(&created), ["queued", "pending"], "no guard: {created}");
    // The stage's job is capped at what the recipe's budget leaves.
    let job = created["stages"][0]["id"].as_str().unwrap();
    let cap: Option<i64> = sqlx::query_scalar("SELECT max_tokens FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_one(&s.pool)
        .await
        .unwrap();
    assert_eq!(cap, Some(1));
    s.run_one().await;
    assert_eq!(
        advance_all(&s.state).await.unwrap(),
        vec![(id.clone(), Advance::Finished("failed"))]
    );
    let recipe = s.recipe(&id).await;
    assert!(recipe["usage"]["tokens"].as_i64().unwrap() >= 1, "{recipe}");
    assert_eq!(statuses(&recipe), ["succeeded", "pending"]);
    let error = &recipe["error"];
    assert_eq!(error["stage"], "eval");
    assert_eq!(error["param"], "budget");
    assert!(error["message"].as_str().unwrap().contains("budget is spent"), "{error}");
    let bad = json!({"budget": {"max_wall_seconds": -1}, "stages": [
        {"name": "rl", "type": "fine_tuning_job", "fine_tuning_job": s.rl(MODEL)}]});
    let refused = post(&s.router, "/v1/verity/recipes", &s.key, bad).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(refused.json()["error"]["param"], "budget.max_wall_seconds");
}
