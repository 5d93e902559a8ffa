// keiro ui: the only script of the dashboard, served from the binary (no inline script runs:
// the Content-Security-Policy forbids it). Values are written with textContent, never as HTML.
"use strict";

// Every action button asks for confirmation first.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-confirm]");
  if (button && !window.confirm(button.getAttribute("data-confirm"))) {
    event.preventDefault();
  }
});

// The retry's corrected input must be JSON: checked before the form goes.
document.addEventListener("submit", function (event) {
  var submitter = event.submitter;
  var field = event.target.querySelector("textarea[data-json]");
  if (!field || !submitter || submitter.id !== "action-retry-with-input") return;
  try {
    JSON.parse(field.value);
    field.setCustomValidity("");
  } catch (error) {
    field.setCustomValidity("not JSON: " + error.message);
    field.reportValidity();
    event.preventDefault();
  }
});

// The overview's counts, refreshed every 2 seconds.
var STATUSES = ["running", "suspended", "completed", "failed", "cancelled"];
function cell(row, text, href) {
  var td = row.insertCell();
  if (href) {
    var a = document.createElement("a");
    a.href = href;
    a.textContent = text;
    td.appendChild(a);
  } else {
    td.textContent = text;
  }
}
function refresh(table) {
  fetch(table.getAttribute("data-live"), { headers: { Accept: "application/json" } })
    .then(function (response) { return response.ok ? response.json() : null; })
    .then(function (counts) {
      if (!counts) return;
      var byName = {};
      counts.instances.forEach(function (c) {
        (byName[c.name] = byName[c.name] || {})[c.status] = c.count;
      });
      var body = document.createElement("tbody");
      Object.keys(byName).sort().forEach(function (name) {
        var row = body.insertRow();
        cell(row, name);
        STATUSES.forEach(function (status) {
          var n = byName[name][status] || 0;
          cell(row, String(n), n > 0 ? "/instances?name=" + encodeURIComponent(name) + "&status=" + status : null);
        });
      });
      table.replaceChild(body, table.tBodies[0]);
      var timers = document.getElementById("timers");
      if (timers) {
        timers.textContent = "Timers: " + counts.timers_due + " due, " + counts.timers_future + " scheduled later";
      }
    })
    .catch(function () {});
}
document.addEventListener("DOMContentLoaded", function () {
  var table = document.querySelector("table[data-live]");
  if (table) setInterval(function () { refresh(table); }, 2000);
});
