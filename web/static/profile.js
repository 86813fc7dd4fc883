// New-job page, "Difficulty profile": posts {job: the form's body, prompts, k} to
// /v1/verity/difficulty_profiles (the API's validation; its error names the field), follows the
// profile until it ends (its phase and progress shown), then shows the pass-rate histogram, the
// predicted zero-advantage fraction at the job's group size, the time and token estimate, and a
// button that posts …/filtered_file and makes the new file the job's training file.
(function () {
  var button = document.getElementById("run-profile");
  if (!button || !window.VerityNewJob) return;
  var out = document.getElementById("profile-result");
  function esc(s) { var d = document.createElement("div"); d.textContent = String(s); return d.innerHTML; }
  function pct(x) { return (100 * x).toFixed(1) + "%"; }
  function secs(s) {
    if (s < 90) return s.toFixed(1) + " s";
    if (s < 5400) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function count(x) { return Math.round(x).toLocaleString("en-US"); }
  function fail(message) { out.innerHTML = '<p class="error" id="profile-error" role="alert">' + esc(message) + "</p>"; }

  function histogramHtml(r) {
    var max = Math.max.apply(null, r.histogram.map(function (b) { return b.prompts; }).concat([1]));
    return '<ul class="histogram" id="profile-histogram">' + r.histogram.map(function (b) {
      return '<li><span class="bucket-label">' + b.passing + " / " + r.samples_per_prompt + '</span><span class="bar" style="width: ' +
        Math.round(100 * b.prompts / max) + '%"></span><span class="bucket-count" data-passing="' + b.passing + '">' + b.prompts + "</span></li>";
    }).join("") + "</ul>";
  }

  function estimateHtml(e, m) {
    var rows = [["Sampling", e.sampling_seconds_per_step], ["Grading", e.grading_seconds_per_step],
                ["Training", e.training_seconds_per_step]];
    var html = '<h3>Estimate</h3><p id="profile-estimate" data-total-seconds="' + e.total_seconds + '">' + e.steps +
      " steps × " + secs(e.seconds_per_step) + " ≈ <strong>" + secs(e.total_seconds) + "</strong>; " +
      count(e.total_completion_tokens) + " tokens generated, " + count(e.total_trained_tokens) + " trained.</p>";
    html += '<table class="probes"><thead><tr><th>Per step</th><th>Seconds</th></tr></thead><tbody>' + rows.map(function (r) {
      return "<tr><td>" + r[0] + "</td><td>" + (r[1] === null || r[1] === undefined ? "not measured" : r[1].toFixed(2)) + "</td></tr>";
    }).join("") + "</tbody></table>";
    if (m) html += '<p class="muted">Measured step: ' + m.seconds.toFixed(2) + " s (" + m.training_seconds.toFixed(2) + " s training on " + count(m.trained_tokens) + " tokens).</p>";
    html += '<ul class="muted">' + e.caveats.map(function (c) { return "<li>" + esc(c) + "</li>"; }).join("") + "</ul>";
    return html;
  }

  function reportHtml(p) {
    var r = p.report;
    var html = '<p id="profile-zero-advantage" data-fraction="' + r.predicted_zero_advantage_fraction + '">Predicted zero-advantage groups at group size ' +
      r.group_size + ": <strong>" + pct(r.predicted_zero_advantage_fraction) + "</strong>" +
      (r.predicted_zero_advantage_fraction_after_filter === null ? "" : " (" + pct(r.predicted_zero_advantage_fraction_after_filter) + " after filtering)") +
      '; measured at k = ' + r.samples_per_prompt + ": " + pct(r.measured_zero_advantage_fraction) + ".</p>";
    html += '<p class="muted">' + r.prompts + " of " + r.file_rows + " prompts profiled; mean pass rate " + pct(r.mean_pass_rate) +
      '; <span id="profile-always">' + r.always_solved + '</span> always solved, <span id="profile-never">' + r.never_solved + "</span> never solved.</p>";
    html += "<h3>Pass rate per prompt</h3>" + histogramHtml(r) + estimateHtml(r.estimate, r.measured_step);
    if (r.always_solved + r.never_solved > 0) {
      html += '<button type="button" id="profile-filter">Drop the ' + (r.always_solved + r.never_solved) +
        " always- or never-solved prompts and use the filtered file</button>";
    } else {
      html += '<p class="muted">Every profiled prompt is sometimes solved: nothing to filter.</p>';
    }
    return html + '<div id="profile-filtered" aria-live="polite"></div>';
  }

  function useFiltered(id) {
    var done = document.getElementById("profile-filtered");
    var filter = document.getElementById("profile-filter");
    filter.disabled = true;
    Verity.postJson("/v1/verity/difficulty_profiles/" + encodeURIComponent(id) + "/filtered_file", {}).then(function (res) {
      if (!res.ok) { filter.disabled = false; done.innerHTML = '<p class="error" role="alert">' + esc(Verity.apiError(res.body, "filtering failed")) + "</p>"; return; }
      var f = res.body.file, select = document.getElementById("training-file");
      if (!select.querySelector('option[value="' + f.id + '"]')) {
        var option = document.createElement("option");
        option.value = f.id;
        option.textContent = f.filename + " (" + f.id + ")";
        select.appendChild(option);
      }
      select.value = f.id;
      select.dispatchEvent(new Event("change", { bubbles: true }));
      done.innerHTML = '<p class="ok" id="profile-filtered-file" data-file="' + esc(f.id) + '">Training file is now ' + esc(f.filename) +
        ": " + res.body.kept_rows + " rows kept, " + res.body.dropped_rows.length + " dropped.</p>";
    }).catch(function (e) { filter.disabled = false; done.textContent = String(e); });
  }

  function follow(id) {
    fetch("/v1/verity/difficulty_profiles/" + encodeURIComponent(id), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (p) {
        if (!p) { setTimeout(function () { follow(id); }, 2000); return; }
        out.dataset.status = p.status;
        if (p.status === "queued" || p.status === "running") {
          var g = p.progress || {};
          out.innerHTML = '<p class="muted" id="profile-progress">' + esc(id) + ": " + esc(p.status) +
            (g.phase ? " · " + esc(g.phase) : "") + (g.prompts ? " · " + g.prompts_done + " / " + g.prompts + " prompts" : "") + "…</p>";
          setTimeout(function () { follow(id); }, 1000);
          return;
        }
        button.disabled = false;
        if (p.status !== "succeeded" || !p.report) { fail(id + " " + p.status + (p.error ? ": " + p.error.message : "")); return; }
        out.innerHTML = reportHtml(p);
        var filter = document.getElementById("profile-filter");
        if (filter) filter.addEventListener("click", function () { useFiltered(id); });
      })
      .catch(function () { setTimeout(function () { follow(id); }, 2000); });
  }

  button.addEventListener("click", function () {
    window.VerityNewJob.clearErrors();
    var job = window.VerityNewJob.jobBody();
    if (!job) { out.innerHTML = ""; return; }
    var body = { job: job };
    var numbers = { prompts: "profile-prompts", k: "profile-k" };
    for (var key in numbers) {
      var raw = document.getElementById(numbers[key]).value.trim();
      if (raw === "") continue;
      if (!isFinite(Number(raw))) { fail(key + ": must be a number"); return; }
      body[key] = Number(raw);
    }
    button.disabled = true;
    out.innerHTML = '<p class="muted">Queuing the profile…</p>';
    Verity.postJson("/v1/verity/difficulty_profiles", body).then(function (res) {
      if (!res.ok) { button.disabled = false; fail(Verity.apiError(res.body, "could not profile (HTTP " + res.status + ")")); return; }
      out.dataset.profile = res.body.id;
      follow(res.body.id);
    }).catch(function (e) { button.disabled = false; fail(String(e.message || e)); });
  });
})();
