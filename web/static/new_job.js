// New-job page: loss presets come from /v1/verity/loss_presets, uploads go to /v1/files (the
// API's validation; line errors shown), previews come from /files/{id}/preview, "Run grader"
// calls /v1/fine_tuning/alpha/graders/run, and the form posts to /v1/fine_tuning/jobs. The
// method choice shows its fields only (no grader for supervised and DPO; each hyperparameter
// where the method has it, with that method's default). The session cookie authenticates every
// call.
(function () {
  var form = document.getElementById("job-form");
  if (!form) return;

  var templates = {
    math: { type: "math", name: "math", reference: "{{item.reference_answer}}" },
    code: { type: "code", name: "code", tests: "{{item.tests}}", scoring: "all_pass", timeout_ms: 5000 },
    format: { type: "format", name: "format", preset: "think_answer_tag" },
    constraints: { type: "constraints", name: "constraints", scoring: "fraction",
                   checks: [{ check: "word_count", max: 100 }], checks_from: "{{item.constraints}}" },
    multi: { type: "multi", graders: { answer: { type: "math", reference: "{{item.reference_answer}}" },
                                       format: { type: "format", preset: "think_answer" } },
             calculate_output: "0.9 * answer + 0.1 * format" },
    score_model: { type: "score_model", name: "judge", model: "smollm2-135m-instruct", range: [0, 10],
                   input: [{ role: "system", content: "Rate the answer from 0 to 10. Reply with the number only." },
                           { role: "user", content: "Question: {{item.question}}\nReference: {{item.reference_answer}}\nAnswer: {{sample.output_text}}" }],
                   sampling_params: { temperature: 0, max_completions_tokens: 16 } },
  };
  // Loss presets: the hyperparameters each loss's preset sets, as the API describes them.
  var presets = fetch("/v1/verity/loss_presets", { credentials: "same-origin" })
    .then(function (r) { if (!r.ok) throw new Error("loss presets: HTTP " + r.status); return r.json(); })
    .then(function (body) {
      var byId = {};
      body.data.forEach(function (p) { byId[p.id] = p.hyperparameters; });
      return byId;
    });
  presets.catch(function () {}); // a failure is shown when a preset is clicked
  var grader = document.getElementById("grader");
  if (!grader.value) grader.value = JSON.stringify(templates.math, null, 2);

  document.querySelectorAll("[data-template]").forEach(function (b) {
    b.addEventListener("click", function () { grader.value = JSON.stringify(templates[b.dataset.template], null, 2); });
  });
  document.querySelectorAll("[data-preset]").forEach(function (b) {
    b.addEventListener("click", function () {
      presets.then(function (all) {
        var p = all[b.dataset.preset];
        if (!p) return;
        Object.keys(p).forEach(function (k) { var el = document.querySelector('[data-hp="' + k + '"]'); if (el) el.value = String(p[k]); });
        document.querySelectorAll("[data-preset]").forEach(function (o) { o.setAttribute("aria-pressed", String(o === b)); });
      }).catch(function (e) {
        var err = document.getElementById("form-error");
        err.textContent = String(e.message || e);
        err.hidden = false;
      });
    });
  });

  function method() {
    var checked = document.querySelector('input[name="method"]:checked');
    return checked ? checked.value : "reinforcement";
  }
  function showMethod() {
    var m = method();
    document.getElementById("grader-section").hidden = m !== "reinforcement";
    document.querySelectorAll("[data-methods]").forEach(function (el) {
      el.hidden = el.dataset.methods.split(" ").indexOf(m) < 0;
    });
    document.querySelectorAll("[data-method-help]").forEach(function (el) { el.hidden = el.dataset.methodHelp !== m; });
    document.querySelectorAll("[data-hp][data-type=number]").forEach(function (el) {
      var d = el.getAttribute("data-default-" + m);
      if (d !== null) el.placeholder = d;
    });
  }
  document.querySelectorAll('input[name="method"]').forEach(function (r) { r.addEventListener("change", showMethod); });
  showMethod();

  function apiError(body, fallback) {
    var e = body && body.error;
    if (!e) return fallback;
    return (e.param ? e.param + ": " : "") + e.message;
  }
  function show(el, html) { el.innerHTML = html; }
  function text(s) { var d = document.createElement("div"); d.textContent = s; return d.innerHTML; }

  function preview(kind, id) {
    var box = document.getElementById(kind + "-preview");
    if (!id) { show(box, ""); return; }
    fetch("/files/" + encodeURIComponent(id) + "/preview", { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) { box.innerHTML = html; });
  }

  ["training", "validation"].forEach(function (kind) {
    var select = document.getElementById(kind + "-file");
    var upload = document.getElementById(kind + "-upload");
    select.addEventListener("change", function () { preview(kind, select.value); });
    upload.addEventListener("change", function () {
      var file = upload.files[0];
      if (!file) return;
      var box = document.getElementById(kind + "-preview");
      show(box, '<p class="muted">Uploading ' + text(file.name) + "…</p>");
      var data = new FormData();
      data.append("purpose", "fine-tune");
      data.append("file", file);
      fetch("/v1/files", { method: "POST", body: data, credentials: "same-origin" })
        .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
        .then(function (res) {
          if (!res.ok) { show(box, '<p class="error line-error" role="alert">' + text(apiError(res.body, "upload failed")) + "</p>"); return; }
          var f = res.body;
          if (f.status === "processed") {
            document.querySelectorAll("#training-file, #validation-file").forEach(function (s) {
              var o = document.createElement("option"); o.value = f.id; o.textContent = f.filename + " (" + f.id + ")"; s.appendChild(o);
            });
            select.value = f.id;
          }
          preview(kind, f.id);
        })
        .catch(function (e) { show(box, '<p class="error" role="alert">' + text(String(e)) + "</p>"); });
    });
  });

  document.getElementById("test-grader").addEventListener("click", function () {
    var out = document.getElementById("test-result");
    var spec, item;
    try { spec = JSON.parse(grader.value); } catch (e) { show(out, '<p class="error">Grader is not valid JSON: ' + text(e.message) + "</p>"); return; }
    try { item = JSON.parse(document.getElementById("test-item").value || "{}"); } catch (e) { show(out, '<p class="error">Dataset row is not valid JSON: ' + text(e.message) + "</p>"); return; }
    show(out, '<p class="muted">Running…</p>');
    fetch("/v1/fine_tuning/alpha/graders/run", {
      method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" },
      body: JSON.stringify({ grader: spec, model_sample: document.getElementById("test-completion").value, item: item }),
    })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (!res.ok) { show(out, '<p class="error" role="alert">' + text(apiError(res.body, "grader failed")) + "</p>"); return; }
        var b = res.body, subs = Object.keys(b.sub_rewards || {}).map(function (k) { return text(k) + " " + b.sub_rewards[k].toFixed(3); }).join(", ");
        var html = '<p class="reward" id="test-reward" data-reward="' + b.reward + '">reward <strong>' + b.reward.toFixed(3) + "</strong>" + (subs ? " · " + subs : "") + "</p>";
        if (b.metadata && b.metadata.reason) html += '<p class="muted">' + text(b.metadata.reason) + "</p>";
        if (b.metadata && b.metadata.errors) html += '<p class="error">' + text(JSON.stringify(b.metadata.errors)) + "</p>";
        show(out, html);
      });
  });

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var err = document.getElementById("form-error");
    err.hidden = true;
    var m = method(), spec;
    if (m === "reinforcement") {
      try { spec = JSON.parse(grader.value); } catch (e) { err.textContent = "Grader is not valid JSON: " + e.message; err.hidden = false; return; }
    }
    var hp = {};
    document.querySelectorAll("[data-hp]").forEach(function (el) {
      var v = el.value.trim();
      if (v === "" || el.closest("[hidden]")) return;
      if (el.dataset.type === "number") hp[el.dataset.hp] = v === "auto" ? "auto" : Number(v);
      else if (el.dataset.type === "bool") hp[el.dataset.hp] = v === "true";
      else hp[el.dataset.hp] = v;
    });
    var body = { model: document.getElementById("model").value, training_file: document.getElementById("training-file").value || null,
                 method: { type: m } };
    body.method[m] = m === "reinforcement" ? { grader: spec, hyperparameters: hp } : { hyperparameters: hp };
    var valid = document.getElementById("validation-file").value;
    if (valid) body.validation_file = valid;
    var suffix = document.getElementById("suffix").value.trim();
    if (suffix) body.suffix = suffix;
    fetch("/v1/fine_tuning/jobs", { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })
      .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); })
      .then(function (res) {
        if (res.ok) { window.location.href = "/jobs/" + encodeURIComponent(res.body.id); return; }
        err.textContent = apiError(res.body, "could not create the job");
        err.hidden = false;
        err.scrollIntoView({ block: "center" });
      });
  });
})();
