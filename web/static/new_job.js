// New-job page: loss presets come from /v1/verity/loss_presets, uploads go to /v1/files (the
// API's validation; line errors shown), previews come from /files/{id}/preview, "Run grader"
// calls /v1/fine_tuning/alpha/graders/run on a row (the first row of the chosen training file
// until edited), "Pre-flight" posts the form's body to /v1/verity/preflight and shows its report
// (row problems by line and field, grader runs, probe scores), and the form posts to
// /v1/fine_tuning/jobs. The
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

  var apiError = Verity.apiError;
  function show(el, html) { el.innerHTML = html; }
  function text(s) { var d = document.createElement("div"); d.textContent = s; return d.innerHTML; }

  function preview(kind, id) {
    var box = document.getElementById(kind + "-preview");
    if (!id) { show(box, ""); return; }
    fetch("/files/" + encodeURIComponent(id) + "/preview", { credentials: "same-origin" })
      .then(function (r) { return r.text(); })
      .then(function (html) { box.innerHTML = html; });
  }

  // The Test-grader row: the first row of the training file, read from its content (only the
  // first line), unless the user has edited the row since.
  var testItem = document.getElementById("test-item");
  var autoItem = testItem.value;
  function firstRow(id) {
    if (!id || testItem.value !== autoItem) return;
    fetch("/v1/files/" + encodeURIComponent(id) + "/content", { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
        var reader = r.body.getReader(), decoder = new TextDecoder(), buffered = "";
        function next() {
          return reader.read().then(function (chunk) {
            if (!chunk.done) buffered += decoder.decode(chunk.value, { stream: true });
            var lines = buffered.split("\n"), complete = chunk.done ? lines : lines.slice(0, -1);
            var row = complete.find(function (l) { return l.trim() !== ""; });
            if (row !== undefined || chunk.done) { reader.cancel().catch(function () {}); return row; }
            return next();
          });
        }
        return next();
      })
      .then(function (row) {
        if (row === undefined || testItem.value !== autoItem) return;
        try { row = JSON.stringify(JSON.parse(row), null, 2); } catch (e) { return; }
        testItem.value = row;
        autoItem = row;
        testItem.dataset.fromFile = id;
        document.getElementById("test-item-source").textContent = "(line 1 of " + id + ")";
      })
      .catch(function () {});
  }
  var chosen = document.getElementById("training-file").value;
  if (chosen) firstRow(chosen);

  ["training", "validation"].forEach(function (kind) {
    var select = document.getElementById(kind + "-file");
    var upload = document.getElementById(kind + "-upload");
    select.addEventListener("change", function () {
      preview(kind, select.value);
      if (kind === "training") firstRow(select.value);
    });
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
          if (kind === "training" && f.status === "processed") firstRow(f.id);
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
        // OpenAI's metadata, with Verity's reason and error kind under metadata.verity
        var v = (b.metadata && b.metadata.verity) || {};
        if (v.reason) html += '<p class="muted">' + text(v.reason) + "</p>";
        if (v.error) html += '<p class="error">' + text(JSON.stringify(v.error)) + "</p>";
        show(out, html);
      });
  });

  // Every error shown by the last submit or pre-flight goes, so a resubmit shows only its own.
  function clearErrors() {
    var err = document.getElementById("form-error");
    err.textContent = "";
    err.hidden = true;
    form.querySelectorAll(".field-error").forEach(function (el) { el.remove(); });
    document.querySelectorAll("[aria-invalid]").forEach(function (el) {
      el.removeAttribute("aria-invalid");
      el.removeAttribute("aria-describedby");
    });
  }
  // Shows `message` next to `field` (marked invalid, focused; a closed panel holding it opens),
  // or under the form when no field is known.
  function fail(message, field) {
    if (!field) {
      var err = document.getElementById("form-error");
      err.textContent = message;
      err.hidden = false;
      err.scrollIntoView({ block: "center" });
      return;
    }
    var panel = field.closest("details");
    if (panel) panel.open = true;
    var note = document.createElement("small");
    note.className = "field-error";
    note.id = (field.id || "field") + "-error";
    note.setAttribute("role", "alert");
    note.textContent = message;
    field.insertAdjacentElement("afterend", note);
    field.setAttribute("aria-invalid", "true");
    field.setAttribute("aria-describedby", note.id);
    field.focus();
    field.scrollIntoView({ block: "center" });
  }
  // The form field an API error's `param` names, if the form has it (and shows it).
  function fieldFor(param) {
    if (!param) return null;
    var ids = { model: "model", training_file: "training-file", validation_file: "validation-file", suffix: "suffix",
                "budget.max_wall_seconds": "budget-max-wall-seconds", "budget.max_tokens": "budget-max-tokens",
                "method.reinforcement.environment.max_turns": "env-max-turns",
                "method.reinforcement.environment.episode_limits.max_tool_calls": "env-max-tool-calls" };
    var el = ids[param] ? document.getElementById(ids[param]) : null;
    var hp = /^method\.[a-z]+\.hyperparameters\.([a-z_]+)/.exec(param);
    if (!el && hp) el = document.querySelector('[data-hp="' + hp[1] + '"]');
    if (!el && /^method\.reinforcement\.grader/.test(param)) el = grader;
    if (!el && /^method\.reinforcement\.environment/.test(param)) el = document.getElementById("env-json");
    return el && !el.closest("[hidden]") ? el : null;
  }
  // A number outside the range the field declares (`min`, `max`; `data-min-exclusive`: above
  // `min`): the API's range, as "must be in (0, 2]", else null.
  function outOfRange(el, n) {
    var min = el.getAttribute("min"), max = el.getAttribute("max");
    if (min === null && max === null) return null;
    var open = el.dataset.minExclusive === "true";
    var low = min === null ? -Infinity : Number(min), high = max === null ? Infinity : Number(max);
    if ((open ? n > low : n >= low) && n <= high) return null;
    return "must be in " + (open ? "(" : "[") + (min === null ? "-inf" : min) + ", " + (max === null ? "inf" : max) + "], got " + n;
  }
  // A whole number from an input: undefined when empty, NaN when not a whole number.
  function whole(el) {
    var v = el.value.trim();
    if (v === "") return undefined;
    return /^[0-9]+$/.test(v) ? Number(v) : NaN;
  }
  // The tools environment of the form: null for none, false after showing what is wrong.
  function environmentBlock() {
    var text = document.getElementById("env-json"), block = {};
    if (text.value.trim()) {
      try { block = JSON.parse(text.value); } catch (e) { fail("method.reinforcement.environment: not valid JSON: " + e.message, text); return false; }
      if (!block || typeof block !== "object" || Array.isArray(block)) { fail("method.reinforcement.environment: must be a JSON object", text); return false; }
    }
    var ticked = [];
    document.querySelectorAll("[data-tool]").forEach(function (el) { if (el.checked) ticked.push({ type: el.dataset.tool }); });
    if (ticked.length) block.tools = ticked;
    if (document.getElementById("env-parallel").checked) block.parallel_tool_calls = true;
    var fields = [["env-max-turns", "max_turns"], ["env-max-tool-calls", "max_tool_calls"]];
    for (var i = 0; i < fields.length; i++) {
      var el = document.getElementById(fields[i][0]), n = whole(el);
      if (n === undefined) continue;
      if (isNaN(n)) { fail("method.reinforcement.environment." + (fields[i][1] === "max_turns" ? "" : "episode_limits.") + fields[i][1] + ": must be a whole number", el); return false; }
      if (fields[i][1] === "max_turns") block.max_turns = n;
      else { block.episode_limits = block.episode_limits || {}; block.episode_limits.max_tool_calls = n; }
    }
    return Object.keys(block).length ? block : null;
  }
  // The budget caps of the form: null for none, false after showing what is wrong.
  function budgetBlock(m) {
    var caps = {}, any = false;
    var fields = [["budget-max-wall-seconds", "max_wall_seconds"], ["budget-max-tokens", "max_tokens"]];
    for (var i = 0; i < fields.length; i++) {
      var el = document.getElementById(fields[i][0]);
      if (el.closest("[hidden]")) continue;
      var n = whole(el);
      if (n === undefined) continue;
      if (isNaN(n) || n < 1) { fail("budget." + fields[i][1] + ": must be a positive whole number", el); return false; }
      caps[fields[i][1]] = n; any = true;
    }
    return any ? caps : null;
  }
  // The request body of the form, or null after showing what is wrong (naming the field).
  function jobBody() {
    var m = method(), spec;
    if (m === "reinforcement") {
      try { spec = JSON.parse(grader.value); } catch (e) { fail("method.reinforcement.grader: not valid JSON: " + e.message, grader); return null; }
    }
    var hp = {}, bad = null, why = "";
    document.querySelectorAll("[data-hp]").forEach(function (el) {
      var v = el.value.trim();
      if (bad || v === "" || el.closest("[hidden]")) return;
      if (el.dataset.type === "number") {
        if (v !== "auto" && !isFinite(Number(v))) { bad = el; why = "must be a number (or auto), got \"" + v + "\""; return; }
        var range = v === "auto" ? null : outOfRange(el, Number(v));
        if (range) { bad = el; why = range; return; }
        hp[el.dataset.hp] = v === "auto" ? "auto" : Number(v);
      } else if (el.dataset.type === "bool") hp[el.dataset.hp] = v === "true";
      else hp[el.dataset.hp] = v;
    });
    if (bad) {
      fail("method." + m + ".hyperparameters." + bad.dataset.hp + ": " + why, bad);
      return null;
    }
    var body = { model: document.getElementById("model").value, training_file: document.getElementById("training-file").value || null,
                 method: { type: m } };
    body.method[m] = m === "reinforcement" ? { grader: spec, hyperparameters: hp } : { hyperparameters: hp };
    if (m === "reinforcement") {
      var environment = environmentBlock();
      if (environment === false) return null;
      if (environment) body.method.reinforcement.environment = environment;
    }
    var budget = budgetBlock(m);
    if (budget === false) return null;
    if (budget) body.budget = budget;
    var valid = document.getElementById("validation-file").value;
    if (valid) body.validation_file = valid;
    var suffix = document.getElementById("suffix").value.trim();
    if (suffix) body.suffix = suffix;
    return body;
  }
  // The difficulty profile (profile.js) profiles the job this form describes.
  window.VerityNewJob = { jobBody: jobBody, clearErrors: clearErrors };
  function postJson(url, body) {
    return fetch(url, { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" }, body: JSON.stringify(body) })
      .then(function (r) { return r.json().then(function (b) { return { ok: r.ok, body: b }; }); });
  }
  function score(x) { return typeof x === "number" ? (Math.round(x * 1000) / 1000).toString() : "?"; }
  // The pre-flight report as HTML: row problems, grader runs, probe scores.
  function reportHtml(r) {
    var html = r.ok ? '<p class="ok" id="preflight-verdict" data-ok="true">Job creation would accept this request.</p>'
                    : '<p class="error" id="preflight-verdict" data-ok="false" role="alert">Job creation would refuse this request.</p>';
    (r.files || []).forEach(function (f) {
      if (!f.errors.length) { html += '<p class="muted">' + text(f.param + " " + f.file_id) + ": " + f.rows + " rows ok</p>"; return; }
      html += '<ul class="preflight-errors">' + f.errors.map(function (e) {
        return '<li class="line-error" data-line="' + e.line + '" data-field="' + text(e.field) + '">' + text(f.param + " " + f.file_id) + " line " + e.line +
          (e.field ? ": field <code>" + text(e.field) + "</code>" : "") + ": " + text(e.reason) + "</li>";
      }).join("") + "</ul>";
    });
    if ((r.grader_runs || []).length) {
      html += '<h3>Grader on the first rows</h3><ul class="grader-runs">' + r.grader_runs.map(function (g) {
        return "<li>line " + g.line + ", given <code>" + text(JSON.stringify(g.sample)) + "</code>: " +
          (g.error ? '<span class="error">' + text(g.error) + "</span>" : "scored " + score(g.score) + ' <span class="muted">' + text(g.reason) + "</span>") + "</li>";
      }).join("") + "</ul>";
    }
    if (r.probes) {
      html += "<h3>Exploit probes (line " + r.probes.line + ')</h3><table class="probes"><thead><tr><th>Probe</th><th>Score</th><th>What it tries</th></tr></thead><tbody>' +
        r.probes.results.map(function (p) {
          // Flagged: a hack the job can sample was rewarded (or the control was not); a reward
          // for an output the job's budget cannot reach is shown, muted, with the reason.
          var flag = p.flagged ? ' <strong class="error">' + (p.kind === "exploit" ? "rewarded" : "not rewarded") + "</strong>"
                   : (p.kind === "exploit" && p.rewarded ? ' <span class="muted">rewarded, out of reach</span>' : "");
          return '<tr data-probe="' + text(p.name) + '" data-score="' + p.score + '" data-flagged="' + (p.flagged ? "true" : "false") + '"><td>' + text(p.name) + "</td><td>scored " + score(p.score) + flag + "</td><td>" + text(p.description) +
            (p.out_of_reach ? ' <span class="muted out-of-reach">' + text(p.out_of_reach) + ".</span>" : "") +
            (p.fix ? ' <span class="probe-fix">Fix: ' + text(p.fix) + ".</span>" : "") +
            (p.error ? ' <span class="error">' + text(p.error) + "</span>" : "") + "</td></tr>";
        }).join("") + "</tbody></table>";
    }
    return html;
  }

  document.getElementById("run-preflight").addEventListener("click", function () {
    clearErrors();
    var out = document.getElementById("preflight-result");
    var body = jobBody();
    if (!body) { show(out, ""); return; }
    show(out, '<p class="muted">Checking every row and trying the probes…</p>');
    postJson("/v1/verity/preflight", body)
      .then(function (res) {
        if (!res.ok) {
          var message = apiError(res.body, "pre-flight failed"), field = fieldFor(res.body && res.body.error && res.body.error.param);
          show(out, '<p class="error" id="preflight-verdict" data-ok="false" role="alert">' + text(message) + "</p>");
          if (field) fail(message, field);
          return;
        }
        show(out, reportHtml(res.body));
      })
      .catch(function (e) { show(out, '<p class="error" role="alert">' + text(String(e)) + "</p>"); });
  });

  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    clearErrors();
    var body = jobBody();
    if (!body) return;
    postJson("/v1/fine_tuning/jobs", body)
      .then(function (res) {
        if (res.ok) { window.location.href = "/jobs/" + encodeURIComponent(res.body.id); return; }
        fail(apiError(res.body, "could not create the job"), fieldFor(res.body && res.body.error && res.body.error.param));
      })
      .catch(function (e) { fail(String(e)); });
  });
})();
