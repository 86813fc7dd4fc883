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
