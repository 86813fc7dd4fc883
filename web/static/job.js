// Job page: uPlot charts of the metrics rows, kept live by the server-sent events of
// /jobs/{id}/stream; a step range shared by every chart; status, progress and warnings.
(function () {
  var root = document.getElementById("charts");
  if (!root) return;
  var jobId = root.dataset.job;
  var rows = JSON.parse(document.getElementById("metrics-data").textContent || "[]");
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
  function keysLike(re) {
    var seen = {};
    rows.forEach(function (r) { Object.keys(flatten(r, "", {})).forEach(function (k) { if (re.test(k)) seen[k] = 1; }); });
    return Object.keys(seen).sort();
  }
  // The keys of `list` that some row has (a chart shows only the metrics its job's method writes).
  function present(list) {
    var seen = {};
    rows.forEach(function (r) { Object.keys(flatten(r, "", {})).forEach(function (k) { seen[k] = 1; }); });
    return list.filter(function (k) { return seen[k]; });
  }
  var palette = ["#6366f1", "#10b981", "#f59e0b", "#ef4444", "#06b6d4", "#a855f7", "#84cc16", "#ec4899"];

  // Each chart: a title, a help line and its series (flat keys), or a pattern for dynamic ones.
  function definitions() {
    return [
      { title: "Reward (mean ± std)", help: "Mean total reward; the band is ± one std.", band: true, keys: present(["reward_mean"]) },
      { title: "Reward per grader", help: "Mean score of each named grader.", keys: keysLike(/^reward_per_grader\..*\.mean$/) },
      { title: "Accuracy", help: "Share of completions reaching the success threshold.", keys: present(["accuracy"]) },
      { title: "Eval pass@k", help: "On the validation file, at eval steps.", keys: keysLike(/^eval\..*pass@/), points: true },
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

  function dataFor(def) {
    var flat = rows.map(function (r) { return flatten(r, "", {}); });
    var xs = flat.map(function (r) { return r.step; });
    var data = [xs];
    def.keys.forEach(function (k) { data.push(flat.map(function (r) { return k in r ? r[k] : null; })); });
    if (def.band) {
      data.push(flat.map(function (r) { return "reward_std" in r ? r.reward_mean - r.reward_std : null; }));
      data.push(flat.map(function (r) { return "reward_std" in r ? r.reward_mean + r.reward_std : null; }));
    }
    return data;
  }

  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

  function build() {
    charts.forEach(function (c) { c.plot.destroy(); c.box.remove(); });
    charts = [];
    var width = Math.max(260, Math.min(root.clientWidth, 1200));
    var cols = width > 900 ? 3 : width > 560 ? 2 : 1;
    var chartWidth = Math.floor((width - (cols - 1) * 16) / cols) - 2;
    var axis = { stroke: css("--muted"), grid: { stroke: css("--grid"), width: 1 }, ticks: { stroke: css("--grid") } };
    definitions().forEach(function (def) {
      if (!def.keys.length) return;
      var box = document.createElement("figure");
      box.className = "chart";
      box.innerHTML = "<figcaption><strong></strong><small></small></figcaption>";
      box.querySelector("strong").textContent = def.title;
      box.querySelector("small").textContent = def.help;
      root.appendChild(box);
      var series = [{ label: "step" }];
      def.keys.forEach(function (k, i) {
        series.push({ label: k.replace(/^reward_per_grader\.|\.mean$|^eval\.pass_at_k\./g, ""), stroke: palette[i % palette.length], width: 2,
                      points: { show: !!def.points || rows.length < 3 } });
      });
      var opts = { width: chartWidth, height: 180, series: series, axes: [axis, axis], scales: { x: { time: false } },
                   cursor: { drag: { x: true, y: false } } };
      if (def.band) {
        series.push({ label: "−std", stroke: "transparent", points: { show: false } });
        series.push({ label: "+std", stroke: "transparent", points: { show: false } });
        opts.bands = [{ series: [3, 2], fill: "rgba(99,102,241,0.15)" }];
      }
      var plot = new uPlot(opts, dataFor(def), box);
      charts.push({ def: def, plot: plot, box: box });
    });
    applyRange();
  }

  function refresh() {
    var before = charts.map(function (c) { return c.def.keys.join(","); }).join("|");
    var after = definitions().filter(function (d) { return d.keys.length; }).map(function (d) { return d.keys.join(","); }).join("|");
    if (before !== after) build();
    else charts.forEach(function (c) { c.plot.setData(dataFor(c.def)); });
    applyRange();
    root.dataset.points = String(rows.length);
    document.getElementById("no-metrics").hidden = rows.length > 0;
  }

  function applyRange() {
    if (!range) return;
    charts.forEach(function (c) { c.plot.setScale("x", { min: range[0], max: range[1] }); });
  }
  var from = document.getElementById("range-from"), to = document.getElementById("range-to");
  function onRange() {
    var last = rows.length ? rows[rows.length - 1].step : 1;
    var a = from.value === "" ? 1 : Number(from.value), b = to.value === "" ? last : Number(to.value);
    range = b > a ? [a, b] : null;
    if (!range) charts.forEach(function (c) { c.plot.setData(dataFor(c.def)); });
    applyRange();
  }
  from.addEventListener("change", onRange);
  to.addEventListener("change", onRange);
  document.getElementById("range-reset").addEventListener("click", function () { from.value = ""; to.value = ""; range = null; refresh(); });

  function setStatus(s) {
    var badge = document.getElementById("job-status");
    badge.textContent = s.status + (s.pending_control ? " (" + s.pending_control + " requested)" : "");
    badge.className = "badge big " + s.status;
    document.getElementById("job-progress").style.width = s.percent + "%";
    document.getElementById("job-progress").parentElement.setAttribute("aria-valuenow", s.percent);
    if (s.total) document.getElementById("job-steps").textContent = "step " + s.step + " / " + s.total;
    var box = document.getElementById("warnings"), list = document.getElementById("warning-list");
    list.innerHTML = "";
    (s.warnings || []).forEach(function (w) { var li = document.createElement("li"); li.textContent = w; list.appendChild(li); });
    box.hidden = !(s.warnings || []).length;
  }

  build();
  refresh();
  var resizeTimer;
  window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(build, 200); });
  document.addEventListener("verity:theme", build);

  var last = rows.length ? rows[rows.length - 1].step : 0;
  var source = new EventSource("/jobs/" + encodeURIComponent(jobId) + "/stream?after=" + last);
  source.addEventListener("metrics", function (e) {
    JSON.parse(e.data).forEach(function (r) { if (!rows.length || r.step > rows[rows.length - 1].step) rows.push(r); });
    refresh();
  });
  source.addEventListener("status", function (e) { setStatus(JSON.parse(e.data)); });
  source.addEventListener("end", function () {
    source.close();
    root.dataset.terminal = "true";
    document.querySelectorAll(".actions form").forEach(function (f) { f.remove(); });
  });
})();
