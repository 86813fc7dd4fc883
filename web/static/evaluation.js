// The pass@k chart of an evaluation report: one curve per model over k (log scale), drawn with
// the same uPlot as the job page. While the report runs, the page follows the evaluation
// object: its status and progress update in place, and the page redraws itself when a model's
// results arrive or the run ends.
(function () {
  var pending = document.getElementById("evaluation-pending");
  if (!pending) return;
  var id = pending.dataset.evaluation;
  var shown = Number(pending.dataset.models || 0);
  var progress = document.getElementById("evaluation-progress");
  Verity.follow("/v1/verity/evaluations/" + encodeURIComponent(id), function (o) {
    // A model's results arrived: redraw the page with them.
    if (((o.results || {}).models || []).length > shown) return true;
    var p = o.progress || {};
    if (p.prompts) {
      progress.textContent = "Model " + ((p.model_index || 0) + 1) + " of " + (p.models || "?") + ": " +
        (p.prompts_done || 0) + " / " + p.prompts + " prompts.";
    } else if (o.status === "running") {
      progress.textContent = "Loading the model…";
    }
  });
})();
(function () {
  var root = document.getElementById("passk-chart");
  var data = document.getElementById("report-data");
  if (!root || !data) return;
  var report = JSON.parse(data.textContent || "{}");
  var ks = report.ks || [];
  var models = report.models || [];
  if (!ks.length || !models.length) return;
  var palette = ["#6366f1", "#f59e0b", "#10b981", "#ef4444", "#0ea5e9", "#a855f7", "#84cc16", "#ec4899"];
  function css(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  var plot = null;
  function build() {
    if (plot) { plot.destroy(); plot = null; }
    root.innerHTML = "";
    var box = document.createElement("figure");
    box.className = "chart wide";
    box.innerHTML = "<figcaption><strong>pass@k</strong><small>Unbiased estimate from n samples per prompt; higher is better. Dashed: base models.</small></figcaption>";
    root.appendChild(box);
    var series = [{ label: "k" }];
    var columns = [ks];
    models.forEach(function (m, i) {
      var base = m.model === m.base;
      series.push({ label: m.model, stroke: palette[i % palette.length], width: 2, dash: base ? [6, 4] : undefined,
                    points: { show: true } });
      columns.push(ks.map(function (k) { var v = (m.pass_at_k || {})["pass@" + k]; return v === undefined ? null : v; }));
    });
    var axis = { stroke: css("--muted"), grid: { stroke: css("--grid"), width: 1 }, ticks: { stroke: css("--grid") } };
    var width = Math.max(260, Math.min(root.clientWidth || 800, 1200)) - 2;
    var opts = { width: width, height: 280, series: series, axes: [Object.assign({ label: "k" }, axis), axis],
                 scales: { x: { time: false, distr: ks.length > 1 ? 3 : 1, log: 2 }, y: { range: [0, 1] } } };
    plot = new uPlot(opts, columns, box);
    root.dataset.series = String(models.length);
  }
  build();
  var timer = null;
  window.addEventListener("resize", function () { clearTimeout(timer); timer = setTimeout(build, 200); });
})();
