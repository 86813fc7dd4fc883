//! Object-store keys, built in one place: the store's layout (docs/architecture.md, "Object
//! storage"). Every writer and reader takes its key from here instead of spelling the path.

/// A dataset file uploaded (or written by a run) as JSON lines.
pub fn dataset_file(file_id: &str) -> String {
    format!("files/{file_id}.jsonl")
}

/// A job's results file (`step_metrics.csv`).
pub fn results_file(file_id: &str) -> String {
    format!("files/{file_id}.csv")
}

/// The folder of a job's checkpoint at `step`.
pub fn checkpoint(job_id: &str, step: impl std::fmt::Display) -> String {
    format!("jobs/{job_id}/checkpoints/step-{step}")
}

/// A job's training samples of `step`.
pub fn samples(job_id: &str, step: impl std::fmt::Display) -> String {
    format!("jobs/{job_id}/samples/step-{step}.jsonl")
}

/// A job's validation samples of `step`.
pub fn validation_samples(job_id: &str, step: impl std::fmt::Display) -> String {
    format!("jobs/{job_id}/samples/step-{step}-validation.jsonl")
}

/// A job's metrics, one JSON line per step.
pub fn metrics(job_id: &str) -> String {
    format!("jobs/{job_id}/metrics.jsonl")
}

/// The folder of a model imported under `name`.
pub fn model(name: &str) -> String {
    format!("models/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_what_the_store_has_always_held() {
        assert_eq!(dataset_file("file-1"), "files/file-1.jsonl");
        assert_eq!(results_file("file-1"), "files/file-1.csv");
        assert_eq!(checkpoint("ftjob-1", 3), "jobs/ftjob-1/checkpoints/step-3");
        assert_eq!(samples("ftjob-1", 3), "jobs/ftjob-1/samples/step-3.jsonl");
        assert_eq!(
            validation_samples("ftjob-1", 0),
            "jobs/ftjob-1/samples/step-0-validation.jsonl"
        );
        assert_eq!(metrics("ftjob-1"), "jobs/ftjob-1/metrics.jsonl");
        assert_eq!(model("minilm"), "models/minilm");
    }
}
