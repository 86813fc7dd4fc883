// Playground: "Run" streams both panes' answers at once from /v1/chat/completions
// (`stream: true`, read with fetch and a body reader as server-sent events); "Stop" aborts both
// requests, which closes the connections and frees their batch rows on the inference worker.
// From a job, a row of its validation file (/files/{id}/rows/{index}) fills the prompt, and once
// both answers are complete the job's grader scores each one with that row as `item`
// (/v1/fine_tuning/alpha/graders/run). The session cookie authenticates every call.
(function () {
  var form = document.getElementById("playground");
  if (!form) return;
  var sides = ["left", "right"];
  var $ = function (id) { return document.getElementById(id); };
  var run = $("pg-run"), stop = $("pg-stop"), error = $("pg-error");
  var system = $("pg-system"), user = $("pg-user");
  var grader = null;
  if ($("pg-grader")) { try { grader = JSON.parse($("pg-grader").textContent); } catch (e) { grader = null; } }
  var picker = $("row-pick");
  var row = null; // the loaded dataset row, while the prompt is still its own
  var controller = null;

  var apiError = Verity.apiError;
  function showError(message) { error.textContent = message; error.hidden = !message; }
  function jsonOf(response) {
    return response.json().catch(function () { return null; }).then(function (body) { return { ok: response.ok, status: response.status, body: body }; });
  }
  function text(content) {
    if (typeof content === "string") return content;
    if (Array.isArray(content)) return content.map(function (p) { return p && p.text ? p.text : ""; }).join("");
    return "";
  }

  // ---- dataset rows ----
  function fill(item) {
    var messages = Array.isArray(item.messages) ? item.messages : [{ role: "user", content: item.prompt || "" }];
    var sys = messages.filter(function (m) { return m.role === "system" || m.role === "developer"; })[0];
    var users = messages.filter(function (m) { return m.role === "user"; });
    system.value = sys ? text(sys.content) : "";
    user.value = users.length ? text(users[users.length - 1].content) : "";
    row = item;
  }
  function loadRow(number) {
    if (!picker) return Promise.resolve();
    var status = $("pg-row-status");
    status.textContent = "Loading row " + number + "…";
    delete picker.dataset.loaded;
    var url = "/files/" + encodeURIComponent(picker.dataset.file) + "/rows/" + (number - 1);
    return fetch(url, { credentials: "same-origin" }).then(jsonOf).then(function (res) {
      if (!res.ok) { status.textContent = apiError(res.body, "could not read the row (HTTP " + res.status + ")"); return; }
      fill(res.body.row);
      $("pg-row").value = String(number);
      picker.dataset.loaded = String(number);
      status.textContent = "Row " + number + " of " + picker.dataset.records + (grader ? ": both answers are scored by the job's grader." : ".");
    }).catch(function (e) { status.textContent = String(e.message || e); });
  }
  if (picker) {
    var records = Number(picker.dataset.records) || 0;
    $("pg-load-row").addEventListener("click", function () {
      var n = Math.floor(Number($("pg-row").value));
      if (!(n >= 1 && n <= records)) { $("pg-row-status").textContent = "Row: pick a number from 1 to " + records + "."; return; }
      loadRow(n);
    });
    $("pg-random-row").addEventListener("click", function () {
      if (records > 0) loadRow(1 + Math.floor(Math.random() * records));
    });
    if (records > 0 && !user.value) loadRow(1);
  }
  // An edited prompt is no longer the row's: its answers are not scored against it.
  [system, user].forEach(function (el) { el.addEventListener("input", function () { row = null; if (picker) delete picker.dataset.loaded; }); });

  // ---- the run ----
  function number(id, name, min, max, integer) {
    var raw = $(id).value.trim(), v = Number(raw);
    if (raw === "" || !isFinite(v) || v < min || (max !== null && v > max) || (integer && Math.floor(v) !== v)) {
      throw new Error(name + ": " + (integer ? "a whole number" : "a number") + " from " + min + (max !== null ? " to " + max : " up"));
    }
    return v;
  }
  function pane(side) {
    return { answer: $("answer-" + side), status: $("status-" + side), score: $("score-" + side), model: $("model-" + side) };
  }
  function setState(p, state, message) { p.answer.dataset.state = state; p.status.textContent = message; }

  // Reads the server-sent events of one streamed answer into its pane.
  function stream(side, body, signal) {
    var p = pane(side), answer = "", finish = null, usage = null;
    p.answer.textContent = "";
    p.score.textContent = "";
    setState(p, "streaming", "streaming…");
    return fetch("/v1/chat/completions", {
      method: "POST", credentials: "same-origin", signal: signal,
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify(body),
    }).then(function (response) {
      if (!response.ok) return jsonOf(response).then(function (res) { throw new Error(apiError(res.body, "HTTP " + res.status)); });
      var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "";
      function handle(event) {
        var data = event.split("\n").filter(function (l) { return l.indexOf("data:") === 0; })
          .map(function (l) { return l.slice(5).trim(); }).join("\n");
        if (!data || data === "[DONE]") return;
        var chunk = JSON.parse(data);
        if (chunk.error) throw new Error(apiError(chunk, "the generation failed"));
        if (chunk.usage) usage = chunk.usage;
        (chunk.choices || []).forEach(function (c) {
          if (c.delta && c.delta.content) { answer += c.delta.content; p.answer.textContent = answer; }
          if (c.finish_reason) finish = c.finish_reason;
        });
      }
      function pump() {
        return reader.read().then(function (part) {
          if (part.done) { if (buffer.trim()) handle(buffer); return; }
          buffer += decoder.decode(part.value, { stream: true }).replace(/\r/g, "");
          var events = buffer.split("\n\n");
          buffer = events.pop();
          events.forEach(handle);
          return pump();
        });
      }
      return pump();
    }).then(function () {
      var tokens = usage ? usage.completion_tokens + " tokens" : "";
      setState(p, "done", [finish ? "finished: " + finish : "finished", tokens].filter(Boolean).join(" · "));
      return answer;
    }, function (e) {
      if (e && e.name === "AbortError") { setState(p, "stopped", "stopped"); return null; }
      setState(p, "error", "");
      p.answer.textContent = String(e.message || e);
      return null;
    });
  }

  function score(side, answer, item) {
    var p = pane(side);
    p.score.textContent = "scoring…";
    return fetch("/v1/fine_tuning/alpha/graders/run", {
      method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" },
      body: JSON.stringify({ grader: grader, model_sample: answer, item: item }),
    }).then(jsonOf).then(function (res) {
      if (!res.ok) { p.score.textContent = "grader: " + apiError(res.body, "HTTP " + res.status); return; }
      p.score.innerHTML = "";
      var strong = document.createElement("strong");
      strong.textContent = res.body.reward.toFixed(3);
      p.score.append("score ", strong);
      p.score.dataset.reward = String(res.body.reward);
      var verity = (res.body.metadata && res.body.metadata.verity) || {};
      p.score.title = verity.reason || "";
    });
  }

  function start() {
    if (controller) return;
    showError("");
    var messages = [], settings;
    try {
      settings = {
        seed: number("pg-seed", "Seed", 0, null, true),
        temperature: number("pg-temperature", "Temperature", 0, 2, false),
        max_tokens: number("pg-max-tokens", "Max tokens", 1, null, true),
      };
    } catch (e) { showError(e.message); return; }
    if (system.value.trim()) messages.push({ role: "system", content: system.value });
    if (!user.value.trim()) { showError("User: write a message (or load a row)."); user.focus(); return; }
    messages.push({ role: "user", content: user.value });
    var item = row;
    controller = new AbortController();
    run.disabled = true;
    stop.disabled = false;
    form.dataset.running = "true";
    var panes = $("panes");
    if (panes.getBoundingClientRect().top > window.innerHeight * 0.6) panes.scrollIntoView({ behavior: "smooth", block: "start" });
    sides.forEach(function (side) { delete pane(side).score.dataset.reward; });
    var answers = sides.map(function (side) {
      var body = Object.assign({ model: pane(side).model.value, messages: messages, stream: true,
                                 stream_options: { include_usage: true } }, settings);
      return stream(side, body, controller.signal);
    });
    Promise.all(answers).then(function (texts) {
      controller = null;
      run.disabled = false;
      stop.disabled = true;
      delete form.dataset.running;
      var complete = texts.every(function (t) { return t !== null; });
      if (complete && item && grader) sides.forEach(function (side, i) { score(side, texts[i], item); });
    });
  }

  form.addEventListener("submit", function (ev) { ev.preventDefault(); start(); });
  stop.addEventListener("click", function () { if (controller) controller.abort(); });
  form.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); start(); }
    if (ev.key === "Escape" && controller) controller.abort();
  });
})();
