//! `verity jobs create --dry-run --profile`: a difficulty profile of the job request
//! (`POST /v1/verity/difficulty_profiles`), followed until it ends and printed as text (the
//! pass-rate histogram, the predicted zero-advantage fraction, the estimate); with `--filter`,
//! the filtered training file is written and its id printed.

use super::jobs::is_final;
use super::{print_json, Client};
use serde_json::{json, Value};
use std::time::Duration;

/// What to profile and whether to filter.
#[derive(Debug, Clone, Default)]
pub struct ProfileOptions {
    /// Prompts profiled (the server's default when absent).
    pub prompts: Option<usize>,
    /// Completions per prompt (default: the job's group size).
    pub k: Option<usize>,
    /// Write the filtered file once the profile succeeded.
    pub filter: bool,
}

/// Profiles job request `job`, prints the report (JSON with `json`) and, with
/// `options.filter`, writes the filtered file; fails when the profile does not succeed.
pub async fn profile(
    client: &Client,
    job: &Value,
    options: &ProfileOptions,
    json: bool,
) -> anyhow::Result<()> {
    let mut body = json!({ "job": job });
    if let Some(prompts) = options.prompts {
        body["prompts"] = json!(prompts);
    }
    if let Some(k) = options.k {
        body["k"] = json!(k);
    }
    let created = client.post_json("/v1/verity/difficulty_profiles", &body).await?;
    let id = created["id"].as_str().unwrap_or_default().to_string();
    eprintln!("difficulty profile {id} queued");
    let mut last = String::new();
    let profile = loop {
        let profile = client.get_json(&format!("/v1/verity/difficulty_profiles/{id}")).await?;
        let status = profile["status"].as_str().unwrap_or_default();
        if is_final(status) {
            break profile;
        }
        let line = progress_line(&profile);
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    if json {
        print_json(&profile);
    }
    anyhow::ensure!(
        profile["status"] == "succeeded",
        "difficulty profile {id} {}: {}",
        profile["status"].as_str().unwrap_or_default(),
        profile["error"]["message"].as_str().unwrap_or_default()
    );
    if !json {
        print!("{}", report_text(&profile["report"]));
    }
    if options.filter {
        let url = format!("/v1/verity/difficulty_profiles/{id}/filtered_file");
        let filtered = client.post_json(&url, &json!({})).await?;
        if json {
            print_json(&filtered);
        } else {
            println!(
                "filtered file {} ({}): {} rows kept, {} dropped",
                filtered["file"]["id"].as_str().unwrap_or_default(),
                filtered["file"]["filename"].as_str().unwrap_or_default(),
                filtered["kept_rows"],
                filtered["dropped_rows"].as_array().map_or(0, Vec::len)
            );
        }
    }
    Ok(())
}

/// `status · phase · done / total prompts` of a running profile.
fn progress_line(profile: &Value) -> String {
    let p = &profile["progress"];
    let mut line = profile["status"].as_str().unwrap_or_default().to_string();
    if let Some(phase) = p["phase"].as_str() {
        line.push_str(&format!(" · {phase}"));
    }
    if let (Some(done), Some(total)) = (p["prompts_done"].as_u64(), p["prompts"].as_u64()) {
        line.push_str(&format!(" · {done} / {total} prompts"));
    }
    line
}

fn pct(value: &Value) -> String {
    value.as_f64().map_or_else(|| "?".into(), |x| format!("{:.1}%", 100.0 * x))
}

fn seconds(value: &Value) -> String {
    match value.as_f64() {
        Some(s) if s < 90.0 => format!("{s:.1} s"),
        Some(s) if s < 5400.0 => format!("{:.1} min", s / 60.0),
        Some(s) => format!("{:.1} h", s / 3600.0),
        None => "not measured".into(),
    }
}

/// A profile report as text: the histogram (one bar per passing count), the predicted
/// zero-advantage fraction, the rows always and never solved, and the estimate.
pub fn report_text(r: &Value) -> String {
    let mut out = format!(
        "{} of {} prompts profiled, k = {}; mean pass rate {}\n",
        r["prompts"],
        r["file_rows"],
        r["samples_per_prompt"],
        pct(&r["mean_pass_rate"])
    );
    let bins = r["histogram"].as_array().cloned().unwrap_or_default();
    let max = bins.iter().filter_map(|b| b["prompts"].as_u64()).max().unwrap_or(0).max(1);
    for bin in &bins {
        let n = bin["prompts"].as_u64().unwrap_or(0);
        let passing = bin["passing"].as_u64().unwrap_or(0);
        let bar = "#".repeat((40 * n).div_ceil(max) as usize);
        out.push_str(&format!(
            "  {passing:>3} / {} passing  {n:>5}  {bar}\n",
            r["samples_per_prompt"]
        ));
    }
    out.push_str(&format!(
        "predicted zero-advantage groups at group size {}: {}",
        r["group_size"],
        pct(&r["predicted_zero_advantage_fraction"])
    ));
    if !r["predicted_zero_advantage_fraction_after_filter"].is_null() {
        out.push_str(&format!(
            " ({} after filtering)",
            pct(&r["predicted_zero_advantage_fraction_after_filter"])
        ));
    }
    out.push_str(&format!(
        "\n{} always solved, {} never solved (--filter drops them)\n",
        r["always_solved"], r["never_solved"]
    ));
    let e = &r["estimate"];
    out.push_str(&format!(
        "estimate: {} steps × {} ≈ {} (sampling {}, grading {}, training {} per step); {:.0} \
         tokens generated, {:.0} trained\n",
        e["steps"],
        seconds(&e["seconds_per_step"]),
        seconds(&e["total_seconds"]),
        seconds(&e["sampling_seconds_per_step"]),
        seconds(&e["grading_seconds_per_step"]),
        seconds(&e["training_seconds_per_step"]),
        e["total_completion_tokens"].as_f64().unwrap_or(0.0),
        e["total_trained_tokens"].as_f64().unwrap_or(0.0),
    ));
    for caveat in e["caveats"].as_array().into_iter().flatten() {
        out.push_str(&format!("  caveat: {}\n", caveat.as_str().unwrap_or_default()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_shows_the_histogram_fraction_and_estimate() {
        let report = json!({"prompts": 4, "file_rows": 10, "samples_per_prompt": 2,
            "mean_pass_rate": 0.5, "group_size": 4, "always_solved": 1, "never_solved": 1,
            "histogram": [{"passing": 0, "prompts": 1}, {"passing": 1, "prompts": 2}, {"passing": 2, "prompts": 1}],
            "predicted_zero_advantage_fraction": 0.6, "predicted_zero_advantage_fraction_after_filter": 0.125,
            "estimate": {"steps": 5, "seconds_per_step": 2.0, "total_seconds": 10.0,
                "sampling_seconds_per_step": 1.0, "grading_seconds_per_step": 0.5,
                "training_seconds_per_step": null, "total_completion_tokens": 100.0,
                "total_trained_tokens": 300.0, "caveats": ["no training step was measured"]}});
        let text = report_text(&report);
        assert!(
            text.contains("  1 / 2 passing      2  ########################################"),
            "{text}"
        );
        assert!(text.contains("group size 4: 60.0% (12.5% after filtering)"), "{text}");
        assert!(text.contains("5 steps × 2.0 s ≈ 10.0 s"), "{text}");
        assert!(text.contains("training not measured"), "{text}");
        assert!(text.contains("caveat: no training step was measured"), "{text}");
    }
}
