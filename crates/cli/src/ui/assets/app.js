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

// Reads JSON from the dashboard's own API; null when the answer is no 200.
function getJson(url) {
  return fetch(url, { headers: { Accept: "application/json" } })
    .then(function (response) { return response.ok ? response.json() : null; });
}

// SVG drawing: elements made with createElementNS, text set with textContent.
var SVG = "http://www.w3.org/2000/svg";
function shape(parent, name, attributes, tooltip) {
  var node = document.createElementNS(SVG, name);
  Object.keys(attributes).forEach(function (key) { node.setAttribute(key, attributes[key]); });
  if (tooltip) {
    var title = document.createElementNS(SVG, "title");
    title.textContent = tooltip;
    node.appendChild(title);
  }
  parent.appendChild(node);
  return node;
}
function label(parent, x, y, text, anchor, klass) {
  var node = shape(parent, "text", { x: x, y: y, "text-anchor": anchor || "start", "class": klass || "" });
  node.textContent = text;
  return node;
}
// Empties an SVG but for its own <title>.
function clear(svg) {
  Array.prototype.slice.call(svg.childNodes).forEach(function (child) {
    if (child.nodeName !== "title") svg.removeChild(child);
  });
}

// The overview: instances by status, one bar each, summed over every workflow.
var STATUSES = ["running", "suspended", "completed", "failed", "cancelled"];
function drawStatuses(svg, counts) {
  var totals = {};
  STATUSES.forEach(function (s) { totals[s] = 0; });
  counts.instances.forEach(function (c) { totals[c.status] = (totals[c.status] || 0) + c.count; });
  var max = Math.max.apply(null, STATUSES.map(function (s) { return totals[s]; }).concat([1]));
  clear(svg);
  STATUSES.forEach(function (status, i) {
    var y = 6 + i * 26;
    var width = Math.round(300 * totals[status] / max);
    label(svg, 0, y + 15, status);
    shape(svg, "rect", { x: 80, y: y, width: Math.max(width, 1), height: 20, "class": "status-bar " + status },
      status + ": " + totals[status]);
    label(svg, 86 + width, y + 15, String(totals[status]), "start", "value");
  });
}

// The overview: completed, failed and cancelled per bucket, stacked, oldest on the left.
function drawThroughput(svg, data) {
  var buckets = data.buckets;
  var n = Math.max(buckets.length, 1);
  var left = 34, width = 600, height = 110, top = 8;
  var max = 1;
  buckets.forEach(function (b) { max = Math.max(max, b.completed + b.failed + b.cancelled); });
  clear(svg);
  shape(svg, "line", { x1: left, x2: left + width, y1: top + height, y2: top + height, "class": "baseline" });
  label(svg, left - 4, top + 8, String(max), "end", "value");
  label(svg, left - 4, top + height, "0", "end", "value");
  var step = width / n;
  buckets.forEach(function (b, i) {
    var x = left + i * step;
    var when = new Date(b.start);
    var tooltip = when.toLocaleTimeString() + ": " + b.completed + " completed, " + b.failed +
      " failed, " + b.cancelled + " cancelled";
    shape(svg, "rect", { x: x, y: top, width: step, height: height, "class": "bucket" }, tooltip);
    var base = top + height;
    [["completed", b.completed], ["failed", b.failed], ["cancelled", b.cancelled]].forEach(function (part) {
      if (part[1] <= 0) return;
      var h = Math.max(1, height * part[1] / max);
      base -= h;
      shape(svg, "rect", { x: x + 1, y: base, width: Math.max(step - 2, 1), height: h, "class": "ended " + part[0] }, tooltip);
    });
  });
  // The time axis: the window's start, its quarters, now.
  var minutes = n * data.bucket_secs / 60;
  label(svg, left, top + height + 16, "-" + Math.round(minutes) + " min");
  [1, 2, 3].forEach(function (q) {
    var x = left + width * q / 4;
    shape(svg, "line", { x1: x, x2: x, y1: top + height, y2: top + height + 4, "class": "baseline" });
    label(svg, x, top + height + 16, "-" + Math.round(minutes * (4 - q) / 4) + " min", "middle");
  });
  label(svg, left + width, top + height + 16, "now", "end");
}

// The overview's counts table, and the status chart, refreshed every 2 seconds.
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
  getJson(table.getAttribute("data-live"))
    .then(function (counts) {
      if (!counts) return;
      var chart = document.getElementById("status-chart");
      if (chart) drawStatuses(chart, counts);
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
function refreshThroughput(svg) {
  getJson(svg.getAttribute("data-live"))
    .then(function (data) { if (data) drawThroughput(svg, data); })
    .catch(function () {});
}

// Instants read relative to now ("3 min ago"); the absolute time is the title.
function relative(at, now) {
  var delta = Math.round((now - at) / 1000);
  var secs = Math.abs(delta);
  if (secs < 5) return "just now";
  var amount = secs < 60 ? secs + " s" : secs < 3600 ? Math.floor(secs / 60) + " min"
    : secs < 86400 ? Math.floor(secs / 3600) + " h" : Math.floor(secs / 86400) + " d";
  return delta > 0 ? amount + " ago" : "in " + amount;
}
function refreshTimes() {
  var now = Date.now();
  document.querySelectorAll("time[datetime]").forEach(function (node) {
    var at = Date.parse(node.getAttribute("datetime"));
    if (!isNaN(at)) node.textContent = relative(at, now);
  });
}

// A stream followed live: its items appended as they come, until it ends.
var STREAM_ITEMS_SHOWN = 1000;
function follow(box) {
  var list = box.querySelector(".stream-items");
  var state = box.querySelector(".stream-state");
  var next = 0;
  function poll() {
    getJson(box.getAttribute("data-follow") + "?from=" + next)
      .then(function (page) {
        if (!page) { setTimeout(poll, 5000); return; }
        page.items.forEach(function (item) {
          var li = document.createElement("li");
          li.setAttribute("data-offset", String(item.offset));
          var offset = document.createElement("span");
          offset.className = "offset";
          offset.textContent = String(item.offset);
          var value = document.createElement("span");
          value.className = "value";
          value.textContent = JSON.stringify(item.value);
          li.appendChild(offset);
          li.appendChild(value);
          list.appendChild(li);
          while (list.children.length > STREAM_ITEMS_SHOWN) list.removeChild(list.firstChild);
        });
        next = page.next;
        if (page.ends) {
          state.textContent = page.closed ? "closed" : "ended (" + page.status + ")";
          box.setAttribute("data-ended", "true");
          return;
        }
        state.textContent = "open, following";
        setTimeout(poll, page.items.length > 0 ? 200 : 1000);
      })
      .catch(function () { setTimeout(poll, 5000); });
  }
  poll();
}

// The instance page's events, refreshed every 2 seconds while the run is live.
var TERMINAL = ["completed", "failed", "cancelled"];
function drawEvents(box, events) {
  var fresh;
  if (events.length === 0) {
    fresh = document.createElement("p");
    fresh.id = "events";
    fresh.className = "none";
    fresh.textContent = "None.";
  } else {
    fresh = document.createElement("table");
    fresh.id = "events";
    var head = fresh.createTHead().insertRow();
    ["key", "version", "set", "value"].forEach(function (name) {
      var th = document.createElement("th");
      th.textContent = name;
      head.appendChild(th);
    });
    var body = fresh.createTBody();
    events.forEach(function (event) {
      var row = body.insertRow();
      var key = document.createElement("code");
      key.textContent = event.key;
      row.insertCell().appendChild(key);
      row.insertCell().textContent = String(event.version);
      var time = document.createElement("time");
      time.setAttribute("datetime", event.updated_at);
      time.title = event.updated_at;
      time.textContent = relative(Date.parse(event.updated_at), Date.now());
      row.insertCell().appendChild(time);
      var value = document.createElement("code");
      value.textContent = JSON.stringify(event.value);
      row.insertCell().appendChild(value);
    });
  }
  while (box.firstChild) box.removeChild(box.firstChild);
  box.appendChild(fresh);
}
function watchEvents(box) {
  if (box.getAttribute("data-terminal") === "true") return;
  var timer = setInterval(function () {
    getJson(box.getAttribute("data-live"))
      .then(function (instance) {
        if (!instance) return;
        drawEvents(box, instance.events);
        if (TERMINAL.indexOf(instance.status) >= 0) {
          box.setAttribute("data-terminal", "true");
          clearInterval(timer);
        }
      })
      .catch(function () {});
  }, 2000);
}

document.addEventListener("DOMContentLoaded", function () {
  var events = document.getElementById("events-box");
  if (events) watchEvents(events);
  var table = document.querySelector("table#counts[data-live]");
  if (table) {
    refresh(table);
    setInterval(function () { refresh(table); }, 2000);
  }
  var throughput = document.getElementById("throughput-chart");
  if (throughput) {
    refreshThroughput(throughput);
    setInterval(function () { refreshThroughput(throughput); }, 5000);
  }
  document.querySelectorAll("[data-follow]").forEach(follow);
  setInterval(refreshTimes, 15000);
});
