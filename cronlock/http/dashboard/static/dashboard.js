// cronlock dashboard: the little the pages need JavaScript for. Everything reads without it.
(function () {
  "use strict";

  // Times in the viewer's zone; the UTC time stays in the title (shown on hover).
  function localTimes(root) {
    var format = new Intl.DateTimeFormat(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
    });
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var when = new Date(el.getAttribute("datetime"));
      if (!isNaN(when)) {
        el.textContent = format.format(when);
        el.title = el.title || (el.getAttribute("datetime") + " UTC");
      }
    });
  }

  // The overview refreshes itself every few seconds (its <main>, fetched again), pausable;
  // the choice is kept for the next visit.
  function autoRefresh() {
    var box = document.querySelector(".refresh[data-refresh]");
    var button = document.getElementById("refresh-toggle");
    if (!box || !button || !window.fetch) { return; }
    var seconds = parseInt(box.getAttribute("data-refresh"), 10) || 5;
    var paused = localStorage.getItem("cronlock.refresh") === "paused";
    var timer = null;
    function label() {
      button.textContent = paused ? "Resume auto-refresh" : "Pause auto-refresh (" + seconds + " s)";
      button.setAttribute("aria-pressed", paused ? "true" : "false");
    }
    function schedule() {
      clearTimeout(timer);
      if (!paused) { timer = setTimeout(refresh, seconds * 1000); }
    }
    function refresh() {
      fetch(window.location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : null; })
        .then(function (html) {
          if (html && !paused) {
            var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
            var main = document.querySelector("main");
            if (fresh && main) {
              var focused = document.activeElement && document.activeElement.id;
              main.innerHTML = fresh.innerHTML;
              localTimes(main);
              autoRefreshButton();
              if (focused && document.getElementById(focused)) { document.getElementById(focused).focus(); }
            }
          }
        })
        .catch(function () {})
        .then(schedule);
    }
    function autoRefreshButton() {
      button = document.getElementById("refresh-toggle");
      if (!button) { return; }
      button.hidden = false;
      label();
      button.onclick = function () {
        paused = !paused;
        localStorage.setItem("cronlock.refresh", paused ? "paused" : "on");
        label();
        schedule();
      };
    }
    window.cronlockToggleRefresh = function () { if (button) { button.click(); } };
    autoRefreshButton();
    schedule();
  }

  // Keys: g o overview, g j jobs, / the first filter field, p pause or resume the refresh.
  function keys() {
    var pending = false;
    var base = (document.querySelector("a.brand") || {}).getAttribute
      ? document.querySelector("a.brand").getAttribute("href").replace(/\/$/, "") : "";
    document.addEventListener("keydown", function (event) {
      var target = event.target;
      if (event.ctrlKey || event.metaKey || event.altKey) { return; }
      if (target && /^(INPUT|SELECT|TEXTAREA)$/.test(target.tagName)) { return; }
      if (pending) {
        pending = false;
        if (event.key === "o") { window.location.href = base + "/"; }
        if (event.key === "j") { window.location.href = base + "/jobs"; }
        return;
      }
      if (event.key === "g") { pending = true; setTimeout(function () { pending = false; }, 1500); }
      if (event.key === "/") {
        var field = document.querySelector("[data-filter]");
        if (field) { event.preventDefault(); field.focus(); }
      }
      if (event.key === "p" && window.cronlockToggleRefresh) { window.cronlockToggleRefresh(); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    localTimes(document);
    autoRefresh();
    keys();
  });
})();
