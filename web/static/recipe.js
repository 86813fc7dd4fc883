// Recipe pages: the form loads a template into the body and posts it to /v1/verity/recipes
// (the API's own validation; its error names the stage and field) and opens the recipe; a
// recipe's page polls the recipe while it runs and reloads when a stage changes; Cancel and
// Resume call the API.
(function () {
  var form = document.getElementById("recipe-form");
  if (form) {
    var body = document.getElementById("recipe-body");
    var buttons = document.querySelectorAll("button.template");
    function load(key) { body.value = document.getElementById("template-body-" + key).value.trim() + "\n"; }
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].addEventListener("click", function (ev) { load(ev.currentTarget.dataset.template); });
    }
    if (buttons.length && !body.value) load(buttons[0].dataset.template);
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var err = document.getElementById("recipe-error");
      err.hidden = true;
      err.textContent = "";
      var request;
      try { request = JSON.parse(body.value); } catch (e) {
        err.textContent = "body: not valid JSON: " + e.message; err.hidden = false; return;
      }
      var button = document.getElementById("recipe-create");
      button.disabled = true;
      Verity.postJson("/v1/verity/recipes", request).then(function (res) {
        if (res.ok) { window.location.href = "/recipes/" + encodeURIComponent(res.body.id); return; }
        button.disabled = false;
        err.textContent = Verity.apiError(res.body, "could not create the recipe (HTTP " + res.status + ")");
        err.hidden = false;
        err.scrollIntoView({ block: "center" });
      }).catch(function (e) { button.disabled = false; err.textContent = String(e.message || e); err.hidden = false; });
    });
  }

  var page = document.getElementById("recipe");
  if (!page) return;
  var id = page.dataset.recipe;
  var path = "/v1/verity/recipes/" + encodeURIComponent(id);
  function control(buttonId, action, question) {
    var button = document.getElementById(buttonId);
    if (!button) return;
    button.addEventListener("click", function () {
      if (question && !window.confirm(question)) return;
      button.disabled = true;
      Verity.postJson(path + "/" + action).then(function (res) {
        if (res.ok) { window.location.reload(); return; }
        button.disabled = false;
        window.alert(Verity.apiError(res.body, action + " failed"));
      });
    });
  }
  control("recipe-cancel", "cancel", "Cancel " + id + " and its current stage?");
  control("recipe-resume", "resume", null);
  if (page.dataset.running !== "true") return;
  var shown = Array.prototype.map.call(document.querySelectorAll("#recipe-stages li"), function (li) { return li.dataset.status; }).join(",");
  function poll() {
    fetch(path, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (o) {
        if (!o) { setTimeout(poll, 4000); return; }
        var now = o.stages.map(function (s) { return s.status; }).join(",");
        if (o.status !== "running" || now !== shown) { window.location.reload(); return; }
        setTimeout(poll, 3000);
      })
      .catch(function () { setTimeout(poll, 4000); });
  }
  setTimeout(poll, 2000);
})();
