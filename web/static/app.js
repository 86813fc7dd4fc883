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
  // Follows a run's API object until it is final: `show(object)` updates the page; the page
  // reloads (to render the final state) when the run ends or `show` returns true. Polls every
  // 1.5 s, every 3 s after a failed request.
  follow: function (url, show) {
    function poll() {
      fetch(url, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (o) {
          if (!o) { setTimeout(poll, 3000); return; }
          var status = document.querySelector("[data-run-status]");
          if (status) { status.textContent = o.status; status.className = "badge big " + o.status; status.dataset.status = o.status; }
          if (show(o) === true || ["succeeded", "failed", "cancelled"].indexOf(o.status) >= 0) { window.location.reload(); return; }
          setTimeout(poll, 1500);
        })
        .catch(function () { setTimeout(poll, 3000); });
    }
    setTimeout(poll, 1000);
  },
  // POSTs `body` as JSON with the session cookie; resolves to {ok, status, body}.
  postJson: function (url, body) {
    return fetch(url, { method: "POST", credentials: "same-origin", headers: { "content-type": "application/json" },
                        body: body === undefined ? undefined : JSON.stringify(body) })
      .then(function (r) { return r.json().catch(function () { return {}; }).then(function (b) { return { ok: r.ok, status: r.status, body: b }; }); });
  },
};
// Destructive actions (forms with data-confirm) ask first, in a dialog; a confirmed form posts
// `confirm=yes` (without it the server asks on a page of its own). A form that needs no
// confirmation still announces `verity:confirmed` so its button can show what is under way.
(function () {
  function dialog() {
    var d = document.getElementById("confirm-dialog");
    if (d) return d;
    d = document.createElement("dialog");
    d.id = "confirm-dialog";
    d.innerHTML = '<form method="dialog"><p id="confirm-text"></p><div class="dialog-buttons">' +
      '<button value="no" id="confirm-no">Keep</button><button value="yes" class="danger" id="confirm-yes"></button></div></form>';
    document.body.appendChild(d);
    return d;
  }
  function go(form) {
    form.dispatchEvent(new CustomEvent("verity:confirmed"));
    HTMLFormElement.prototype.submit.call(form); // (a control named "submit" cannot shadow it)
  }
  document.addEventListener("submit", function (e) {
    var form = e.target;
    // getAttribute, not form.method: a control named "method" (the new-job page's radio
    // buttons) shadows the property.
    if (!(form instanceof HTMLFormElement) || (form.getAttribute("method") || "get").toLowerCase() !== "post") return;
    if (!form.dataset.confirm) {
      form.dispatchEvent(new CustomEvent("verity:confirmed"));
      return;
    }
    e.preventDefault();
    var d = dialog();
    d.querySelector("#confirm-text").textContent = form.dataset.confirm;
    d.querySelector("#confirm-yes").textContent = form.dataset.confirmButton || "Confirm";
    d.returnValue = "";
    d.onclose = function () {
      if (d.returnValue !== "yes") return;
      var field = form.querySelector('input[name="confirm"]');
      if (!field) {
        field = document.createElement("input");
        field.type = "hidden";
        field.name = "confirm";
        form.appendChild(field);
      }
      field.value = "yes";
      go(form);
    };
    d.showModal();
  });
})();
// Copy buttons: a button with data-copy="#selector" copies that element's text and says so;
// where the clipboard is out of reach (plain http on another host) it selects the text instead.
(function () {
  function copyBySelection(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) {}
    document.body.removeChild(area);
    return ok;
  }
  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("button[data-copy]") : null;
    if (!button) return;
    var source = document.querySelector(button.dataset.copy);
    if (!source) return;
    var text = source.textContent.trim();
    if (!button.dataset.label) button.dataset.label = button.textContent;
    function done(ok) {
      button.dataset.copied = String(ok);
      button.textContent = ok ? "Copied" : "Press Ctrl+C";
      if (!ok) {
        var range = document.createRange();
        range.selectNodeContents(source);
        window.getSelection().removeAllRanges();
        window.getSelection().addRange(range);
      }
      clearTimeout(button.copyTimer);
      button.copyTimer = setTimeout(function () { button.textContent = button.dataset.label; }, 2000);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(copyBySelection(text)); });
    } else {
      done(copyBySelection(text));
    }
  });
})();
