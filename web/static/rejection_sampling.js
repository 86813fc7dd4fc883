// Rejection sampling pages: the form posts to /v1/verity/rejection_sampling (the API's own
// validation; its error names the field) and opens the run; a run's page polls the run object
// until it ends, showing its progress, then reloads to show the summary; Cancel asks first.
(function () {
  var form = document.getElementById("rs-form");
  if (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var err = document.getElementById("rs-error");
      err.hidden = true;
      err.textContent = "";
      var grader;
      try { grader = JSON.parse(document.getElementById("rs-grader").value); } catch (e) {
        err.textContent = "grader: not valid JSON: " + e.message; err.hidden = false; return;
      }
      var body = { model: document.getElementById("rs-model").value.trim(),
                   file: document.getElementById("rs-file").value, grader: grader,
                   policy: document.getElementById("rs-policy").value };
      var numbers = { k: "rs-k", min_score: "rs-min-score", temperature: "rs-temperature", max_tokens: "rs-max-tokens", seed: "rs-seed" };
      for (var key in numbers) {
        var raw = document.getElementById(numbers[key]).value.trim();
        if (raw === "") continue;
        var n = Number(raw);
        if (!isFinite(n)) { err.textContent = key + ": not a number"; err.hidden = false; return; }
        body[key] = n;
      }
      var button = document.getElementById("rs-create");
      button.disabled = true;
      Verity.postJson("/v1/verity/rejection_sampling", body).then(function (res) {
        if (res.ok) { window.location.href = "/rejection-sampling/" + encodeURIComponent(res.body.id); return; }
        button.disabled = false;
        err.textContent = Verity.apiError(res.body, "could not start the run (HTTP " + res.status + ")");
        err.hidden = false;
        err.scrollIntoView({ block: "center" });
      }).catch(function (e) { button.disabled = false; err.textContent = String(e.message || e); err.hidden = false; });
    });
  }

  var run = document.getElementById("rs-run");
  if (!run || run.dataset.terminal === "true") return;
  var id = run.dataset.run;
  var progress = document.getElementById("rs-progress");
  var cancel = document.getElementById("rs-cancel");
  if (cancel) {
    cancel.addEventListener("click", function () {
      if (!window.confirm("Cancel " + id + "? Its samples so far are discarded.")) return;
      cancel.disabled = true;
      cancel.textContent = "Cancelling…";
      Verity.postJson("/v1/verity/rejection_sampling/" + encodeURIComponent(id) + "/cancel").then(function (res) {
        if (!res.ok) { cancel.disabled = false; cancel.textContent = "Cancel"; progress.textContent = Verity.apiError(res.body, "cancel failed"); }
      });
    });
  }
  Verity.follow("/v1/verity/rejection_sampling/" + encodeURIComponent(id), function (o) {
    var p = o.progress;
    if (p && p.prompts) progress.textContent = (p.prompts_done || 0) + " / " + p.prompts + " prompts sampled and graded";
    else if (o.status === "running") progress.textContent = "Loading the model…";
  });
  setTimeout(poll, 1000);
})();
