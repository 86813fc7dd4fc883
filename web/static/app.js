// Theme: follows prefers-color-scheme until the toggle picks one (remembered in localStorage).
(function () {
  var saved = null;
  try { saved = localStorage.getItem("verity-theme"); } catch (e) {}
  if (saved) document.documentElement.dataset.theme = saved;
  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("theme-toggle");
    if (!toggle) return;
    toggle.addEventListener("click", function () {
      var dark = document.documentElement.dataset.theme
        ? document.documentElement.dataset.theme === "dark"
        : window.matchMedia("(prefers-color-scheme: dark)").matches;
      var next = dark ? "light" : "dark";
      document.documentElement.dataset.theme = next;
      try { localStorage.setItem("verity-theme", next); } catch (e) {}
      document.dispatchEvent(new CustomEvent("verity:theme"));
    });
  });
})();
// Helpers the page scripts share.
window.Verity = {
  // An API error body's message, prefixed with the field it names (`param`), or `fallback`.
  apiError: function (body, fallback) {
    var e = body && body.error;
    if (!e) return fallback;
    return (e.param ? e.param + ": " : "") + e.message;
  },
  // POSTs `body` as JSON with the session cookie; resolves to {ok, status, body}.
  postJson: function (url, body) {
    return fetch(url, { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" },
                        body: body === undefined ? undefined : JSON.stringify(body) })
      .then(function (r) { return r.json().catch(function () { return {}; }).then(function (b) { return { ok: r.ok, status: r.status, body: b }; }); });
  },
};
