// The overview's figures, refreshed in place from /api/overview (same origin, the session's own credentials).
// Progressive enhancement: without JavaScript the page reloads itself (a <noscript> meta refresh) instead.
(function () {
  "use strict";
  var box = document.getElementById("refresh");
  if (!box || !window.fetch) { return; }
  var every = Math.max(1, parseInt(box.getAttribute("data-every"), 10) || 10) * 1000;
  function put(selector, value) {
    var cell = document.querySelector(selector);
    if (cell && value !== undefined && value !== null) { cell.textContent = String(value); }
  }
  function quote(text) { return String(text).replace(/["\\]/g, "\\$&"); }
  function apply(data) {
    Object.keys(data.stats || {}).forEach(function (name) { put('[data-stat="' + quote(name) + '"]', data.stats[name]); });
    Object.keys(data.depths || {}).forEach(function (name) { put('[data-depth="' + quote(name) + '"]', data.depths[name]); });
    Array.prototype.forEach.call(document.querySelectorAll("[data-group-count]"), function (cell) {
      cell.textContent = String((data.groups || {})[cell.getAttribute("data-group-count")] || 0);  // 0: emptied
    });
    Object.keys(data.trends || {}).forEach(function (kind) {
      put('[data-trend-hour="' + quote(kind) + '"]', data.trends[kind].hour);
      put('[data-trend-week="' + quote(kind) + '"]', data.trends[kind].week);
    });
    put("#refreshed", " (last: " + new Date(data.at * 1000).toISOString().slice(11, 19) + " UTC)");
  }
  function tick() {
    fetch(box.getAttribute("data-url"), {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(apply)
      .catch(function (status) { put("#refreshed", " (could not refresh: " + status + ")"); })
      .then(function () { window.setTimeout(tick, every); });
  }
  window.setTimeout(tick, every);
}());
