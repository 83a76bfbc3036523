// Live request feed: prepends records from the console's SSE stream to the feed table.
// Records come from sandboxes and are untrusted: every cell is set with textContent.
"use strict";

function cell(text, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  td.textContent = text == null ? "" : String(text);
  return td;
}

function size(bytes) {
  if (bytes < 1000) return bytes + " Bytes";
  const units = ["kB", "MB", "GB", "TB"];
  let value = bytes, unit = -1;
  do { value /= 1000; unit += 1; } while (value >= 1000 && unit < units.length - 1);
  return value.toFixed(1) + " " + units[unit];
}

function recordRow(r, root, labels) {
  const tr = document.createElement("tr");
  tr.className = "row-" + r.decision + " fresh";
  tr.dataset.id = r.id;
  const ts = cell(r.ts.slice(0, 10) + " " + r.ts.slice(11, 23), "ts");
  ts.title = r.ts;
  tr.appendChild(ts);
  const sandbox = document.createElement("td");
  const link = document.createElement("a");
  link.href = root + "/sandboxes/" + encodeURIComponent(r.sandbox);
  link.textContent = r.sandbox;
  sandbox.appendChild(link);
  tr.appendChild(sandbox);
  tr.appendChild(cell(labels[r.kind] || r.kind));  // the kinds table's console labels
  const decision = document.createElement("td");
  const badge = document.createElement("span");
  badge.className = "badge " + r.decision;
  badge.textContent = r.decision;
  decision.appendChild(badge);
  tr.appendChild(decision);
  const port = r.port && r.port !== 80 && r.port !== 443 ? ":" + r.port : "";
  const req = cell("", "req");
  if (r.method) {
    const b = document.createElement("b");
    b.textContent = r.method + " ";
    req.appendChild(b);
  }
  req.appendChild(document.createTextNode((r.scheme ? r.scheme + "://" : "") + (r.host || "") + port));
  const path = document.createElement("span");
  path.className = "path";
  path.textContent = r.path || "";
  req.appendChild(path);
  tr.appendChild(req);
  tr.appendChild(cell(r.status));
  const binding = document.createElement("td");
  if (r.binding) {
    const span = document.createElement("span");
    span.className = "binding";
    span.textContent = r.binding;
    binding.appendChild(span);
  }
  tr.appendChild(binding);
  tr.appendChild(cell(r.reason, "reason"));
  tr.appendChild(cell(r.rule, "rule"));
  tr.appendChild(cell(size(r.bytes_in) + " / " + size(r.bytes_out), "num"));
  tr.appendChild(cell(r.duration_ms == null ? "" : Math.round(r.duration_ms), "num"));
  return tr;
}

function startFeed() {
  const status = document.getElementById("feed-status");
  const table = document.getElementById("feed");
  const toggle = document.getElementById("live");
  if (!status || !table || !toggle) return;
  const root = document.querySelector("a.brand").getAttribute("href");
  const labels = JSON.parse(status.dataset.kindLabels || "{}");
  const body = table.tBodies[0];
  let source = null;
  let received = 0;

  function connect() {
    source = new EventSource(status.dataset.stream);
    source.addEventListener("open", () => { status.dataset.live = "on"; status.textContent = "Live: waiting for new records."; });
    source.addEventListener("record", (event) => {
      const record = JSON.parse(event.data);
      const empty = body.querySelector("tr.empty");
      if (empty) empty.remove();
      // A request's write-ahead row (event "incomplete") is replaced by its finished record (same id).
      for (const earlier of body.querySelectorAll("tr[data-id]")) {
        if (earlier.dataset.id === record.id) earlier.remove();
      }
      body.insertBefore(recordRow(record, root, labels), body.firstChild);
      received += 1;
      status.textContent = "Live: " + received + " new record" + (received === 1 ? "" : "s") + " since the page loaded.";
    });
    source.addEventListener("error", () => { status.textContent = "Live feed reconnecting..."; });
  }
  function disconnect() {
    if (source) source.close();
    source = null;
    status.dataset.live = "off";
    status.textContent = "Live feed paused.";
  }
  toggle.addEventListener("change", () => (toggle.checked ? connect() : disconnect()));
  if (toggle.checked) connect();
}

document.addEventListener("DOMContentLoaded", startFeed);
