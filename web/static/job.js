// Job page: uPlot charts of the metrics rows (and of up to three compared runs), kept live by
// the server-sent events of /jobs/{id}/stream, which also carry the job's progress (one source
// for the step label, phase, ETA and valid controls) and its new events.
(function () {
  var root = document.getElementById("charts");
  if (!root) return;
  var jobId = root.dataset.job;
  var rows = JSON.parse(document.getElementById("metrics-data").textContent || "[]");
  var others = JSON.parse((document.getElementById("compare-data") || {}).textContent || "[]");
  var charts = [];
  var range = null;

  // Nested metrics ({eval: {pass_at_k: {"pass@1": x}}}) become flat keys ("eval.pass_at_k.pass@1").
  function flatten(obj, prefix, out) {
    Object.keys(obj || {}).forEach(function (k) {
      var v = obj[k], key = prefix ? prefix + "." + k : k;
      if (v !== null && typeof v === "object") flatten(v, key, out);
      else if (typeof v === "number") out[key] = v;
    });
    return out;
  }
  // A step where dynamic sampling kept no group: nothing was trained, its reward fields describe
  // no completion, so its charts draw a gap (timings stay: that time was spent).
  function skipped(r) { return r.groups_kept === 0; }
  var KEPT_WHEN_SKIPPED = { sampling_seconds: 1, grading_seconds: 1, training_seconds: 1, learning_rate: 1, groups_drawn: 1 };
  function skipReason(r) {
    return "step " + r.step + ": dynamic sampling kept no group with reward contrast (" + (r.groups_drawn || 0) +
      " drawn, all completions of each scored the same) — nothing was trained";
  }
  function allRows() {
    var list = rows.slice();
    others.forEach(function (o) { list = list.concat(o.rows); });
    return list;
  }
  function keysLike(re) {
    var seen = {};
    allRows().forEach(function (r) { Object.keys(flatten(r, "", {})).forEach(function (k) { if (re.test(k)) seen[k] = 1; }); });
    return Object.keys(seen).sort();
  }
  // The keys of `list` that some row has (a chart shows only the metrics its job's method writes).
  function present(list) {
    var seen = {};
    allRows().forEach(function (r) { Object.keys(flatten(r, "", {})).forEach(function (k) { seen[k] = 1; }); });
    return list.filter(function (k) { return seen[k]; });
  }
  var palette = ["#6366f1", "#10b981", "#f59e0b", "#ef4444", "#06b6d4", "#a855f7", "#84cc16", "#ec4899"];
  var dashes = [undefined, [6, 4], [2, 3], [10, 3, 2, 3]];

  // Each chart: a title, a help line and its series (flat keys), or a pattern for dynamic ones.
  function definitions() {
    return [
      { title: "Reward (mean ± std)", help: "Mean total reward; the band is ± one std.", band: true, keys: present(["reward_mean"]) },
      { title: "Reward per grader", help: "Mean score of each named grader.", keys: keysLike(/^reward_per_grader\..*\.mean$/) },
      { title: "Accuracy", help: "Share of completions reaching the success threshold.", keys: present(["accuracy"]) },
      { title: "Eval pass@k", help: "On the validation file; step 0 and the dashed lines are the base model before training.", keys: keysLike(/^eval\..*pass@/), points: true, baseline: true },
      { title: "Loss", help: "Training loss per step; validation loss at eval steps.", keys: present(["loss", "eval.loss"]), points: true },
      { title: "Token accuracy", help: "Validation: share of assistant tokens the model predicts (argmax).", keys: present(["eval.token_accuracy"]), points: true },
      { title: "Preference accuracy", help: "Pairs whose preferred response earns the higher implicit reward.", keys: present(["preference_accuracy", "eval.preference_accuracy"]) },
      { title: "Reward margin", help: "β·(chosen − rejected) log-ratio to the reference, mean over pairs.", keys: present(["reward_margin", "eval.reward_margin"]) },
      { title: "DPO rewards", help: "Implicit rewards β·(log π − log π_ref) of preferred and non-preferred responses.", keys: present(["chosen_reward", "rejected_reward"]) },
      { title: "Completion length", help: "Mean and max tokens per completion.", keys: present(["completion_length_mean", "completion_length_max"]) },
      { title: "Truncated fraction", help: "Completions cut at max_completion_tokens.", keys: present(["truncated_fraction"]) },
      { title: "Entropy", help: "Mean per-token policy entropy; a collapse means no exploration.", keys: present(["entropy"]) },
      { title: "KL", help: "To the reference (k3) and sampler vs trainer.", keys: present(["kl", "sampler_kl"]) },
      { title: "Clip fraction", help: "Tokens clipped below / above the trust region.", keys: present(["clip_fraction_low", "clip_fraction_high"]) },
      { title: "Zero-advantage fraction", help: "Groups whose completions all scored the same: nothing to learn.", keys: present(["zero_advantage_group_fraction"]) },
      { title: "Grad norm", help: "Before clipping.", keys: present(["grad_norm"]) },
      { title: "Time split (s)", help: "Seconds per step sampling, grading and training.", keys: present(["sampling_seconds", "grading_seconds", "training_seconds"]) },
    ];
  }

  // The runs drawn: this job, then the compared ones.
  function runs() {
    return [{ id: jobId, label: "this job", rows: rows }].concat(others);
  }
  // Every step any run has, sorted: the shared x axis.
  function steps() {
    var seen = {};
    runs().forEach(function (run) { run.rows.forEach(function (r) { seen[r.step] = 1; }); });
    return Object.keys(seen).map(Number).sort(function (a, b) { return a - b; });
  }
  function value(r, key) {
    if (!r) return null;
    if (skipped(r) && !KEPT_WHEN_SKIPPED[key]) return null;
    var flat = flatten(r, "", {});
    return key in flat ? flat[key] : null;
  }
  function baselineOf(run, key) {
    var first = run.rows.find(function (r) { return r.step === 0; });
    return first ? value(first, key) : null;
  }
  function dataFor(def) {
    var xs = steps();
    var data = [xs];
    runs().forEach(function (run) {
      var byStep = {};
      run.rows.forEach(function (r) { byStep[r.step] = r; });
      def.keys.forEach(function (k) { data.push(xs.map(function (x) { return value(byStep[x], k); })); });
      if (def.baseline) {
        def.keys.forEach(function (k) {
          var b = baselineOf(run, k);
          data.push(xs.map(function () { return b; }));
        });
      }
    });
    if (def.band) {
      var byStep = {};
      rows.forEach(function (r) { byStep[r.step] = r; });
      var band = function (sign) {
        return xs.map(function (x) {
          var r = byStep[x];
          return r && !skipped(r) && "reward_std" in r ? r.reward_mean + sign * r.reward_std : null;
        });
      };
      data.push(band(-1));
      data.push(band(1));
    }
    return data;
  }

  // Numbers for axes and legends: no "-0", no 17 digits, small values in exponent form.
  function fmt(v, span) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    var scale = span || Math.abs(v);
    if (v === 0 || Math.abs(v) < scale * 1e-9) return "0";
    var a = Math.abs(v);
    if (a >= 1e5) return v.toExponential(2);
    if (a >= 100) return String(Math.round(v * 10) / 10);
    if (a < 1e-3) return v.toExponential(1);
    return String(Number(v.toPrecision(3)));
  }
  // The y range: the data's, padded; a flat series gets a small range around its value, not 0–100.
  function yRange(u, min, max) {
    if (min === null || max === null || !isFinite(min) || !isFinite(max)) return [0, 1];
    if (min === max) {
      var pad = min === 0 ? 1 : Math.abs(min) * 0.1;
      return [min === 0 ? 0 : min - pad, max + pad];
    }
    var p = (max - min) * 0.08;
    return [min >= 0 && min - p < 0 ? 0 : min - p, max + p];
  }
  // Whole-number step ticks only.
  var stepAxis = {
    incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000],
    values: function (u, ticks) { return ticks.map(function (t) { return Number.isInteger(t) ? String(t) : ""; }); },
  };

  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function lastIndex(data) {
    var xs = data[0];
    for (var i = xs.length - 1; i >= 0; i--) {
      for (var s = 1; s < data.length; s++) if (data[s][i] !== null && data[s][i] !== undefined) return i;
    }
    return xs.length ? xs.length - 1 : null;
  }
  // The legend shows the latest values unless the cursor is over a step.
  function showLatest(u) {
    var idx = lastIndex(u.data);
    if (idx !== null) u.setLegend({ idx: idx }, false);
  }

  function build() {
    charts.forEach(function (c) { c.plot.destroy(); c.box.remove(); });
    charts = [];
    var width = Math.max(260, Math.min(root.clientWidth, 1200));
    var cols = width > 900 ? 3 : width > 560 ? 2 : 1;
    var chartWidth = Math.floor((width - (cols - 1) * 16) / cols) - 26;
    var axis = { stroke: css("--muted"), grid: { stroke: css("--grid"), width: 1 }, ticks: { stroke: css("--grid") } };
    var compare = others.length > 0;
    definitions().forEach(function (def) {
      if (!def.keys.length) return;
      var box = document.createElement("figure");
      box.className = "chart";
      box.dataset.title = def.title;
      box.innerHTML = "<figcaption><strong></strong><small></small></figcaption><p class=\"skip-note\" hidden></p>";
      box.querySelector("strong").textContent = def.title;
      box.querySelector("small").textContent = def.help;
      root.appendChild(box);
      var note = box.querySelector(".skip-note");
      var series = [{ label: "step", value: function (u, v) { return v === null || v === undefined ? "–" : String(v); } }];
      runs().forEach(function (run, r) {
        var prefix = compare ? run.label + " · " : "";
        var add = function (k, i, base) {
          series.push({ label: prefix + (base ? "base " : "") + k.replace(/^reward_per_grader\.|\.mean$|^eval\.pass_at_k\./g, ""),
                        stroke: palette[(compare ? r : i) % palette.length], width: base ? 1 : 2,
                        dash: base ? [4, 4] : compare ? dashes[i % dashes.length] : undefined,
                        spanGaps: false, points: { show: !base && (!!def.points || rows.length < 3) },
                        value: function (u, v) { return fmt(v, u.scales.y.max - u.scales.y.min); } });
        };
        def.keys.forEach(function (k, i) { add(k, i, false); });
        if (def.baseline) def.keys.forEach(function (k, i) { add(k, i, true); });
      });
      var opts = {
        width: chartWidth, height: 180, series: series,
        axes: [Object.assign({}, axis, stepAxis),
               Object.assign({}, axis, { size: 56, values: function (u, ticks) {
                 var span = ticks.length > 1 ? Math.abs(ticks[ticks.length - 1] - ticks[0]) : 0;
                 return ticks.map(function (t) { return fmt(t, span); });
               } })],
        scales: { x: { time: false }, y: { range: yRange } },
        cursor: { drag: { x: true, y: false } },
        hooks: {
          setCursor: [function (u) {
            var idx = u.cursor.idx;
            if (idx === null || idx === undefined) { note.hidden = true; showLatest(u); return; }
            var step = u.data[0][idx];
            var row = rows.find(function (r) { return r.step === step; });
            note.hidden = !(row && skipped(row));
            if (!note.hidden) note.textContent = skipReason(row);
          }],
          setData: [showLatest],
        },
      };
      if (def.band) {
        // The band's lower edge names the std in the legend (mean − edge); its upper edge has
        // no legend entry of its own.
        series.push({ label: "± std", stroke: "transparent", points: { show: false }, value: function (u, v, sidx, idx) {
          var mean = idx === null || idx === undefined ? null : u.data[1][idx];
          return v === null || v === undefined || mean === null || mean === undefined ? "–" : fmt(mean - v);
        } });
        series.push({ label: "+std", stroke: "transparent", points: { show: false }, value: function () { return ""; } });
        opts.bands = [{ series: [series.length - 1, series.length - 2], fill: "rgba(99,102,241,0.15)" }];
      }
      var plot = new uPlot(opts, dataFor(def), box);
      if (def.band) {
        var entries = box.querySelectorAll(".u-legend .u-series");
        if (entries.length) entries[entries.length - 1].hidden = true;
      }
      showLatest(plot);
      charts.push({ def: def, plot: plot, box: box });
    });
    applyRange();
  }

  function trained() { return rows.filter(function (r) { return r.step > 0; }); }
  function refresh() {
    var before = charts.map(function (c) { return c.def.keys.join(","); }).join("|");
    var after = definitions().filter(function (d) { return d.keys.length; }).map(function (d) { return d.keys.join(","); }).join("|");
    if (before !== after) build();
    else charts.forEach(function (c) { c.plot.setData(dataFor(c.def)); });
    applyRange();
    var done = trained();
    root.dataset.points = String(done.length);
    root.dataset.lastStep = String(done.length ? done[done.length - 1].step : 0);
    root.dataset.skipped = done.filter(skipped).map(function (r) { return r.step; }).join(",");
    document.getElementById("no-metrics").hidden = done.length > 0;
  }

  function applyRange() {
    if (!range) return;
    charts.forEach(function (c) { c.plot.setScale("x", { min: range[0], max: range[1] }); });
  }
  var from = document.getElementById("range-from"), to = document.getElementById("range-to");
  function onRange() {
    var last = rows.length ? rows[rows.length - 1].step : 1;
    var a = from.value === "" ? 0 : Number(from.value), b = to.value === "" ? last : Number(to.value);
    range = b > a ? [a, b] : null;
    if (!range) charts.forEach(function (c) { c.plot.setData(dataFor(c.def)); });
    applyRange();
  }
  from.addEventListener("change", onRange);
  to.addEventListener("change", onRange);
  document.getElementById("range-reset").addEventListener("click", function () { from.value = ""; to.value = ""; range = null; refresh(); });

  // Progress: the stream's status object (the page starts from the same object, rendered).
  var NO_STEPS = { failed: "The job failed before its first step.", cancelled: "The job was cancelled before its first step.",
                   succeeded: "The job recorded no steps.", paused: "Paused before the first step." };
  function setStatus(s) {
    var terminal = s.status === "succeeded" || s.status === "failed" || s.status === "cancelled";
    var badge = document.getElementById("job-status");
    badge.textContent = s.status;
    badge.className = "badge big " + s.status;
    document.getElementById("job-progress").style.width = s.percent + "%";
    document.getElementById("job-progress").parentElement.setAttribute("aria-valuenow", s.percent);
    document.getElementById("job-steps").textContent = s.step_text || (s.total ? "step " + s.step + " / " + s.total : "");
    var phase = document.getElementById("job-phase");
    phase.textContent = terminal ? "" : s.phase;
    phase.dataset.phase = s.phase;
    document.getElementById("job-eta").textContent = s.eta || "";
    var error = document.getElementById("job-error");
    error.hidden = !s.error;
    document.getElementById("job-error-text").textContent = s.error || "";
    if (NO_STEPS[s.status]) document.getElementById("no-metrics").textContent = NO_STEPS[s.status];
    var controls = s.controls || {};
    [["pause", "pause-job"], ["resume", "resume-job"], ["cancel", "cancel-job"]].forEach(function (c) {
      var button = document.getElementById(c[1]);
      if (!button || button.dataset.busy) return;
      button.disabled = terminal || !controls[c[0]];
    });
    var paused = document.getElementById("job-paused");
    if (paused) {
      paused.hidden = !s.paused_reason;
      document.getElementById("job-paused-text").textContent = s.paused_reason || "";
    }
    var budget = document.getElementById("job-budget");
    if (budget) {
      budget.hidden = !s.budget;
      document.getElementById("job-budget-text").textContent = s.budget || "";
    }
    var tuned = document.getElementById("fine-tuned-line");
    if (tuned && s.fine_tuned_model) {
      document.getElementById("fine-tuned-model").textContent = s.fine_tuned_model;
      tuned.hidden = false;
    }
    var box = document.getElementById("warnings"), list = document.getElementById("warning-list");
    if (box && list && s.warnings) {
      list.innerHTML = "";
      s.warnings.forEach(function (w) { list.appendChild(warningItem(w)); });
      box.hidden = !s.warnings.length;
    }
  }
  // A monitor warning as the page renders it: kind, metric = value vs threshold, step, pause.
  function warningItem(w) {
    var li = document.createElement("li");
    li.className = "warning-item";
    li.dataset.kind = w.kind;
    li.dataset.autoPaused = String(w.paused_at !== null && w.paused_at !== undefined);
    function span(cls, text) { var e = document.createElement("span"); e.className = cls; e.textContent = text; return e; }
    var message = document.createElement("p");
    message.className = "w-message";
    message.textContent = w.message;
    [span("badge w-kind", w.kind), " ", span("mono w-metric", w.metric), " = ", span("w-value", w.value),
     " vs threshold ", span("w-threshold", w.threshold), " · step ", span("w-step", String(w.step)), " · ",
     span("w-pause", w.pause_text), message].forEach(function (part) {
      li.appendChild(typeof part === "string" ? document.createTextNode(part) : part);
    });
    return li;
  }
  // A control submitted: its button says what is under way until the page reloads.
  document.querySelectorAll("form.control").forEach(function (form) {
    form.addEventListener("verity:confirmed", function () {
      var button = form.querySelector("button");
      button.dataset.busy = "1";
      button.textContent = form.dataset.busy;
      button.disabled = true;
    });
  });

  var events = document.getElementById("events");
  function addEvents(list) {
    list.forEach(function (e) {
      if (events.querySelector('li[data-id="' + e.id + '"]')) return;
      var li = document.createElement("li");
      li.className = e.level;
      li.dataset.id = e.id;
      var time = document.createElement("time");
      time.textContent = e.time;
      var text = document.createElement("span");
      text.textContent = e.message;
      li.appendChild(time);
      li.appendChild(document.createTextNode(" "));
      li.appendChild(text);
      events.insertBefore(li, events.firstChild);
      events.dataset.last = String(Math.max(Number(events.dataset.last || 0), e.id));
    });
  }

  build();
  refresh();
  var initial = document.getElementById("progress-data");
  if (initial) setStatus(JSON.parse(initial.textContent || "{}"));
  var resizeTimer;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(build, 200); });
  document.addEventListener("verity:theme", build);
  // For tests and the curious: each chart's title, drawn columns and tick labels.
  window.verityCharts = function () {
    return charts.map(function (c) {
      return { title: c.def.title, data: c.plot.data, xTicks: c.plot.axes[0]._values || [], yTicks: c.plot.axes[1]._values || [] };
    });
  };

  var last = rows.length ? rows[rows.length - 1].step : 0;
  var source = new EventSource("/jobs/" + encodeURIComponent(jobId) + "/stream?after=" + last + "&events_after=" + (events.dataset.last || 0));
  source.addEventListener("metrics", function (e) {
    JSON.parse(e.data).forEach(function (r) { if (!rows.length || r.step > rows[rows.length - 1].step) rows.push(r); });
    refresh();
  });
  source.addEventListener("events", function (e) { addEvents(JSON.parse(e.data)); });
  source.addEventListener("status", function (e) { setStatus(JSON.parse(e.data)); });
  source.addEventListener("end", function () {
    source.close();
    root.dataset.terminal = "true";
    document.querySelectorAll(".actions form.control button").forEach(function (b) { b.disabled = true; });
  });
})();
