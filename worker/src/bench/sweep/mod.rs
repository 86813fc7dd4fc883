//! `verity bench learn --seeds N --set key=v1,v2,…`: a grid of learning runs, one after
//! another, each written to its own file in the sweep's folder as it goes. A run is finished
//! when its file ends with the summary; a sweep started again over the same folder keeps the
//! finished runs and runs the others (an interrupted run starts over), and the table and plots
//! are rewritten after every run, so a partial grid reports what it has.
//!
//! The folder holds `sweep.json` (what every run shares: the model, the files' hashes and the
//! base recipe — runs are reused only by a sweep with the same), `runs/<setting>__seed=<n>.jsonl`
//! (the run's step and evaluation lines, then its summary), `table.md`, `table.json` and two
//! SVG plots of held-out pass@1 against generated tokens and against wall time.

pub mod grid;
pub mod plot;
pub mod report;

use grid::{run_file_stem, settings, Axis, Setting};
use report::{RunRecord, SettingRow};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};
use thiserror::Error;
use verity_core::spec::Hyperparameters;

/// A sweep that cannot start or cannot record its runs.
#[derive(Debug, Error)]
pub enum SweepError {
    /// A grid axis or one of its settings is not a valid recipe.
    #[error("--set {arg}: {message}")]
    Setting {
        /// The axis argument or the setting's label.
        arg: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing the sweep's folder failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The folder holds runs of a sweep with other inputs.
    #[error(
        "{path} holds the runs of a sweep with another {what}; use another --out, or remove it"
    )]
    OtherSweep {
        /// The sweep's `sweep.json`.
        path: PathBuf,
        /// The input that differs.
        what: &'static str,
    },
    /// A run's file cannot be read back.
    #[error("{path} line {line}: {message}")]
    Corrupt {
        /// The run's file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SweepError {
    let path = path.to_path_buf();
    move |source| SweepError::Io { action, path, source }
}

/// What every run of a sweep shares; a finished run is reused only by a sweep with the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepInputs {
    /// The model (HF folder or GGUF file) as given.
    pub model: String,
    /// SHA-256 of the training rows.
    pub train_sha256: String,
    /// SHA-256 of the held-out rows.
    pub validation_sha256: String,
    /// SHA-256 of the grader spec.
    pub grader_sha256: String,
    /// SHA-256 of the tool environment, when the runs have one (absent in sweeps without).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_sha256: Option<String>,
    /// The recipe the settings' values override.
    pub recipe: Map<String, Value>,
}

impl SweepInputs {
    /// The inputs of a sweep over `model` with these rows, grader, tool environment and base
    /// recipe.
    pub fn new(
        model: &Path,
        train: &str,
        validation: &str,
        grader: &str,
        environment: Option<&str>,
        recipe: Map<String, Value>,
    ) -> SweepInputs {
        let sha = |text: &str| format!("{:x}", Sha256::digest(text.as_bytes()));
        SweepInputs {
            model: model.display().to_string(),
            train_sha256: sha(train),
            validation_sha256: sha(validation),
            grader_sha256: sha(grader),
            environment_sha256: environment.map(sha),
            recipe,
        }
    }

    /// The first input that differs from `other`'s, if any.
    fn differs_from(&self, other: &SweepInputs) -> Option<&'static str> {
        [
            (self.model != other.model, "model"),
            (self.train_sha256 != other.train_sha256, "training file"),
            (self.validation_sha256 != other.validation_sha256, "validation file"),
            (self.grader_sha256 != other.grader_sha256, "grader"),
            (self.environment_sha256 != other.environment_sha256, "tool environment"),
            (self.recipe != other.recipe, "base recipe"),
        ]
        .into_iter()
        .find_map(|(differs, what)| differs.then_some(what))
    }
}

/// One run of the grid.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The grid point.
    pub setting: Setting,
    /// The run's seed (the recipe's `seed`).
    pub seed: u64,
    /// The recipe with the setting's values and the seed.
    pub hyperparameters: Hyperparameters,
}

/// A grid of learning runs recorded in a folder.
#[derive(Debug)]
pub struct Sweep {
    dir: PathBuf,
    inputs: SweepInputs,
    settings: Vec<Setting>,
    seeds: Vec<u64>,
}

/// The sweep's manifest file.
const MANIFEST: &str = "sweep.json";

impl Sweep {
    /// Opens (or starts) the sweep in `dir`: every setting's recipe is checked before any run,
    /// and a folder holding the runs of a sweep with other inputs is refused.
    pub fn open(
        dir: &Path,
        inputs: SweepInputs,
        axes: &[Axis],
        seeds: Vec<u64>,
    ) -> Result<Sweep, SweepError> {
        let settings = settings(axes);
        for setting in &settings {
            setting.hyperparameters(&inputs.recipe, 0)?;
        }
        let runs = dir.join("runs");
        std::fs::create_dir_all(&runs).map_err(io_error("creating", &runs))?;
        let manifest = dir.join(MANIFEST);
        match std::fs::read(&manifest) {
            Ok(bytes) => {
                let recorded: SweepInputs =
                    serde_json::from_slice(&bytes).map_err(|e| SweepError::Corrupt {
                        path: manifest.clone(),
                        line: e.line(),
                        message: e.to_string(),
                    })?;
                if let Some(what) = inputs.differs_from(&recorded) {
                    return Err(SweepError::OtherSweep { path: manifest, what });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let text = serde_json::to_string_pretty(&inputs).unwrap_or_default();
                write_atomically(&manifest, text.as_bytes())?;
            }
            Err(e) => return Err(io_error("reading", &manifest)(e)),
        }
        Ok(Sweep { dir: dir.to_path_buf(), inputs, settings, seeds })
    }

    fn run_path(&self, setting: &Setting, seed: u64) -> PathBuf {
        self.dir.join("runs").join(format!("{}.jsonl", run_file_stem(setting, seed)))
    }

    /// The grid's runs, seed by seed, setting by setting: a grid cut short compares every
    /// setting on the seeds it reached.
    fn grid(&self) -> impl Iterator<Item = (&Setting, u64)> + '_ {
        self.seeds.iter().flat_map(|&seed| self.settings.iter().map(move |setting| (setting, seed)))
    }

    /// The runs not finished yet, in grid order.
    pub fn pending(&self) -> Result<Vec<RunSpec>, SweepError> {
        let mut pending = Vec::new();
        for (setting, seed) in self.grid() {
            if report::read_run(&self.run_path(setting, seed))?.is_none() {
                let hyperparameters = setting.hyperparameters(&self.inputs.recipe, seed)?;
                pending.push(RunSpec { setting: setting.clone(), seed, hyperparameters });
            }
        }
        Ok(pending)
    }

    /// Runs every pending run with `runner` (which hands each step's and evaluation's line to
    /// the callback and returns the summary), recording each as it goes and rewriting the
    /// report after each. A run that fails is logged, its error kept beside its lines, and the
    /// sweep goes on; a later sweep tries it again. `progress` hears one line per run.
    pub fn run<E: Display>(
        &self,
        mut runner: impl FnMut(&RunSpec, &mut dyn FnMut(&Value)) -> Result<Value, E>,
        mut progress: impl FnMut(&str),
    ) -> Result<Vec<SettingRow>, SweepError> {
        let pending = self.pending()?;
        let total = self.settings.len() * self.seeds.len();
        progress(&format!(
            "{} runs in the grid, {} finished before, {} to run",
            total,
            total - pending.len(),
            pending.len()
        ));
        let mut rows = None;
        for (index, spec) in pending.iter().enumerate() {
            let path = self.run_path(&spec.setting, spec.seed);
            let label = format!("{} seed={}", spec.setting.label(), spec.seed);
            progress(&format!("run {}/{}: {label}", index + 1, pending.len()));
            match self.record(&path, spec, &mut runner)? {
                Ok(()) => {}
                Err(message) => {
                    tracing::warn!(run = %label, error = %message, "learning run failed; the sweep goes on");
                    progress(&format!("run {label} failed: {message}"));
                }
            }
            rows = Some(self.report()?);
        }
        match rows {
            Some(rows) => Ok(rows),
            None => self.report(),
        }
    }

    /// Runs one run into `path` (through a `.partial` file renamed when the summary is in);
    /// the run's own failure is the inner error, kept in `path.error`.
    fn record<E: Display>(
        &self,
        path: &Path,
        spec: &RunSpec,
        runner: &mut impl FnMut(&RunSpec, &mut dyn FnMut(&Value)) -> Result<Value, E>,
    ) -> Result<Result<(), String>, SweepError> {
        let partial = path.with_extension("jsonl.partial");
        let failed = path.with_extension("jsonl.error");
        let mut file = std::fs::File::create(&partial).map_err(io_error("creating", &partial))?;
        let mut write_error = None;
        let mut write = |line: &Value| {
            if write_error.is_none() {
                if let Err(e) = writeln!(file, "{line}") {
                    write_error = Some(e);
                }
            }
        };
        let header =
            serde_json::json!({"kind": "run", "setting": spec.setting.values, "seed": spec.seed});
        write(&header);
        let outcome = runner(spec, &mut write);
        if let Ok(summary) = &outcome {
            write(summary);
        }
        if let Some(e) = write_error {
            return Err(io_error("writing", &partial)(e));
        }
        match outcome {
            Ok(_) => {
                file.sync_all().map_err(io_error("syncing", &partial))?;
                std::fs::rename(&partial, path).map_err(io_error("renaming", &partial))?;
                let _ = std::fs::remove_file(&failed);
                Ok(Ok(()))
            }
            Err(e) => {
                let message = e.to_string();
                write_atomically(&failed, message.as_bytes())?;
                Ok(Err(message))
            }
        }
    }

    /// Reads the grid's finished runs and writes `table.md`, `table.json` and the plots;
    /// returns the table's rows (settings without a finished run included, with no figures).
    pub fn report(&self) -> Result<Vec<SettingRow>, SweepError> {
        let mut rows = Vec::new();
        for setting in &self.settings {
            let mut runs: Vec<RunRecord> = Vec::new();
            let mut failed = 0;
            for &seed in &self.seeds {
                let path = self.run_path(setting, seed);
                match report::read_run(&path)? {
                    Some(run) => runs.push(run),
                    None if path.with_extension("jsonl.error").exists() => failed += 1,
                    None => {}
                }
            }
            rows.push(report::aggregate(setting, &runs, self.seeds.len(), failed));
        }
        rows.extend(self.peer_rows()?);
        let title = format!("held-out pass@1, {} seeds per setting", self.seeds.len());
        write_atomically(&self.dir.join("table.md"), report::markdown(&rows, &title).as_bytes())?;
        let json = serde_json::to_string_pretty(&rows).unwrap_or_default();
        write_atomically(&self.dir.join("table.json"), json.as_bytes())?;
        let curves = |x: fn(&report::CurvePoint) -> f64| -> Vec<plot::Series> {
            rows.iter()
                .filter(|row| !row.curve.is_empty())
                .map(|row| plot::Series {
                    label: row.setting.clone(),
                    points: row.curve.iter().map(|p| (x(p), p.pass_at_1.mean)).collect(),
                })
                .collect()
        };
        let tokens = plot::line_chart(
            &format!("pass@1 against generated tokens (mean of {} seeds)", self.seeds.len()),
            "completion tokens generated",
            "held-out pass@1",
            &curves(|p| p.generated_tokens),
        );
        write_atomically(&self.dir.join("pass_at_1_vs_tokens.svg"), tokens.as_bytes())?;
        let seconds = plot::line_chart(
            &format!("pass@1 against wall time (mean of {} seeds)", self.seeds.len()),
            "seconds",
            "held-out pass@1",
            &curves(|p| p.elapsed_s),
        );
        write_atomically(&self.dir.join("pass_at_1_vs_seconds.svg"), seconds.as_bytes())?;
        Ok(rows)
    }

    /// The rows of peers — another trainer on the same task and seeds, its checkpoints scored
    /// by `verity bench learn --eval-only` (`bench/peers/trl_learn.py`) — from
    /// `peers/<name>__seed=<n>.jsonl` files in the run format, one row per name (`peer=<name>`).
    fn peer_rows(&self) -> Result<Vec<SettingRow>, SweepError> {
        let dir = self.dir.join(PEERS);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("reading", &dir)(e)),
        };
        let mut by_name: std::collections::BTreeMap<String, Vec<RunRecord>> = Default::default();
        for entry in entries {
            let path = entry.map_err(io_error("reading", &dir))?.path();
            let name =
                path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".jsonl"));
            let Some((name, _seed)) = name.and_then(|n| n.rsplit_once("__seed=")) else { continue };
            if let Some(run) = report::read_run(&path)? {
                by_name.entry(name.to_string()).or_default().push(run);
            }
        }
        Ok(by_name
            .into_iter()
            .map(|(name, runs)| {
                let setting = Setting { values: vec![("peer".into(), Value::String(name))] };
                report::aggregate(&setting, &runs, self.seeds.len(), 0)
            })
            .collect())
    }
}

/// The folder of a sweep's peer runs.
pub const PEERS: &str = "peers";

/// Writes `bytes` to `path` through a temporary file renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), SweepError> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".tmp");
    let temp = PathBuf::from(temp);
    std::fs::write(&temp, bytes).map_err(io_error("writing", &temp))?;
    std::fs::rename(&temp, path).map_err(io_error("renaming", &temp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn inputs(recipe: Value) -> SweepInputs {
        SweepInputs::new(Path::new("m"), "t", "v", "g", None, recipe.as_object().unwrap().clone())
    }

    /// A run that "learns" its seed's share: pass@1 0.1 before, 0.1 + seed/10 after.
    fn fake_run(spec: &RunSpec, report: &mut dyn FnMut(&Value)) -> Result<Value, String> {
        let after = 0.1 + spec.seed as f64 / 10.0;
        for (step, pass1) in [(0, 0.1), (2, after)] {
            report(&json!({"kind": "eval", "step": step, "pass_at_k": {"pass@1": pass1},
                "generated_tokens": step * 100, "elapsed_s": step as f64}));
        }
        Ok(json!({"kind": "summary", "wall_s": 2.0}))
    }

    #[test]
    fn a_sweep_records_each_run_keeps_finished_ones_and_retries_failed_ones() {
        let dir = tempfile::tempdir().unwrap();
        let axes = [Axis::parse("loss=grpo,dapo").unwrap()];
        let open = || Sweep::open(dir.path(), inputs(json!({"max_steps": 2})), &axes, vec![1, 2]);
        let sweep = open().unwrap();
        // The first attempt: dapo's seed 2 fails.
        let mut ran = Vec::new();
        let rows = sweep
            .run(
                |spec, report| {
                    ran.push(format!("{} {}", spec.setting.label(), spec.seed));
                    if spec.setting.label() == "loss=dapo" && spec.seed == 2 {
                        report(&json!({"kind": "step", "step": 1}));
                        return Err("out of memory".to_string());
                    }
                    fake_run(spec, report)
                },
                |_| {},
            )
            .unwrap();
        assert_eq!(ran, ["loss=grpo 1", "loss=dapo 1", "loss=grpo 2", "loss=dapo 2"]);
        assert_eq!((rows[1].seeds_finished, rows[1].seeds_failed), (1, 1));
        assert!((rows[0].gain.unwrap().mean - 0.15).abs() < 1e-9, "{:?}", rows[0]);
        let error = dir.path().join("runs/loss=dapo__seed=2.jsonl.error");
        assert_eq!(std::fs::read_to_string(&error).unwrap(), "out of memory");
        for file in
            ["table.md", "table.json", "pass_at_1_vs_tokens.svg", "pass_at_1_vs_seconds.svg"]
        {
            assert!(dir.path().join(file).is_file(), "{file}");
        }
        // A crash in the middle of a run leaves a partial file: the run starts over.
        let finished = dir.path().join("runs/loss=grpo__seed=1.jsonl");
        let partial = dir.path().join("runs/loss=grpo__seed=1.jsonl.partial");
        std::fs::rename(&finished, &partial).unwrap();
        // Started again: only the unfinished and the failed run run.
        let mut ran = Vec::new();
        let rows = open()
            .unwrap()
            .run(
                |spec, report| {
                    ran.push(format!("{} {}", spec.setting.label(), spec.seed));
                    fake_run(spec, report)
                },
                |_| {},
            )
            .unwrap();
        assert_eq!(ran, ["loss=grpo 1", "loss=dapo 2"]);
        assert!(rows.iter().all(|row| row.seeds_finished == 2 && row.seeds_failed == 0));
        assert!(!error.exists() && !partial.exists() && finished.is_file());
        let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
        assert!(table.contains("| loss=dapo | 2/2 |"), "{table}");

        // A peer's runs in peers/ join the table as their own row.
        std::fs::create_dir(dir.path().join(PEERS)).unwrap();
        let mut lines = Vec::new();
        let spec = &specs_of(&open().unwrap())[0];
        let summary = fake_run(spec, &mut |line| lines.push(line.to_string())).unwrap();
        lines.push(summary.to_string());
        let lines = lines.join("\n") + "\n";
        std::fs::write(dir.path().join("peers/trl-defaults__seed=1.jsonl"), lines).unwrap();
        let rows = open().unwrap().report().unwrap();
        let peer = rows.iter().find(|row| row.setting == "peer=trl-defaults").expect("peer row");
        assert_eq!(peer.seeds_finished, 1);
        let table = std::fs::read_to_string(dir.path().join("table.md")).unwrap();
        assert!(table.contains("| peer=trl-defaults | 1/2 |"), "{table}");
    }

    /// Every run of the grid (finished or not) as a spec.
    fn specs_of(sweep: &Sweep) -> Vec<RunSpec> {
        sweep
            .grid()
            .map(|(setting, seed)| RunSpec {
                setting: setting.clone(),
                seed,
                hyperparameters: setting.hyperparameters(&sweep.inputs.recipe, seed).unwrap(),
            })
            .collect()
    }

    #[test]
    fn a_folder_of_another_sweep_and_an_invalid_setting_are_refused_before_any_run() {
        let dir = tempfile::tempdir().unwrap();
        Sweep::open(dir.path(), inputs(json!({"max_steps": 2})), &[], vec![1]).unwrap();
        let other = Sweep::open(dir.path(), inputs(json!({"max_steps": 3})), &[], vec![1]);
        assert!(other.unwrap_err().to_string().contains("another base recipe"));
        let bad = [Axis::parse("group_size=4,0").unwrap()];
        let refused = Sweep::open(dir.path(), inputs(json!({"max_steps": 2})), &bad, vec![1]);
        assert!(refused.unwrap_err().to_string().contains("group_size=0"));
    }
}
