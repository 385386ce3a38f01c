// The console's page: polls the JSON API, draws tables and SVG charts, sends confirmed actions.
// Plain DOM, no framework, no build step. Data is always set as text (never parsed as HTML).
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { session: null, sample: null, points: [], deadCursor: [], deadNext: null, run: null, runLatest: null };
const COLORS = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7ea4", "#57606a"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = String(value);
    else node.setAttribute(key, String(value));
  }
  return node;
}

const num = (v) => (v === null || v === undefined ? "-" : Number(v).toLocaleString("en-US"));
const rate = (v) => (v === null || v === undefined ? "-" : Number(v).toFixed(1));
const ms = (v) => (v === null || v === undefined ? "-" : v < 1000 ? `${v} ms` : `${(v / 1000).toFixed(1)} s`);
const td = (text, cls, field) => el("td", { text, class: cls, "data-field": field });

function describeLimits(usage) {
  if (!usage) return "none";
  if (usage.error) return `INVALID: ${usage.error}`;
  const l = usage.limits || {};
  const parts = [];
  if (l.max_in_flight) parts.push(`max in flight ${l.max_in_flight}`);
  if (l.rate) parts.push(`rate ${l.rate}/s burst ${l.burst || 1}`);
  return parts.join(", ") || "none";
}

// The first time a view is drawn, for benchmarks/console_load.py (performance.getEntriesByName).
function mark(name) {
  if (!performance.getEntriesByName(name).length) performance.mark(name);
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function toast(text, bad) {
  const box = $("#toast");
  box.textContent = text;
  box.className = bad ? "bad" : "";
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, 8000);
}

function cookie(name) {
  const found = document.cookie.split("; ").find((c) => c.startsWith(`${name}=`));
  return found ? decodeURIComponent(found.slice(name.length + 1)) : "";
}

async function getJSON(url) {
  const response = await fetch(url, { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Console-CSRF": cookie("console_csrf") },
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

function confirmThen(text) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "yes"), { once: true });
    dialog.returnValue = "";
    dialog.showModal();
  });
}

async function act(action, body, question) {
  if (!(await confirmThen(question))) return false;
  try {
    const answer = await post(`/api/actions/${action}`, body);
    toast(answer.message, false);
    await poll();
    return true;
  } catch (err) {
    toast(`refused: ${err.message}`, true);
    return false;
  }
}

// ---- session ----

function showSession(doc) {
  state.session = { read_only: doc.read_only, signed_in: doc.signed_in, refresh: doc.refresh };
  const mode = $("#mode");
  mode.textContent = doc.read_only ? "read-only" : doc.signed_in ? "signed in: actions on" : "signed out";
  mode.className = doc.signed_in ? "badge on" : "badge";
  $("#signin").hidden = doc.read_only || doc.signed_in;
  $("#signout").hidden = !doc.signed_in;
  for (const button of document.querySelectorAll("button.act")) {
    button.disabled = doc.read_only || (button.id === "run-cancel" && !state.run);
    button.title = doc.read_only ? "read-only console: start it with --token" : "";
  }
}

$("#signin").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await post("/api/login", { token: $("#token").value });
    $("#token").value = "";
    toast("signed in", false);
  } catch (err) {
    toast(`sign-in refused: ${err.message}`, true);
  }
  await poll();
});

$("#signout").addEventListener("click", async () => {
  await post("/api/logout", {}).catch(() => null);
  await poll();
});

// ---- overview ----

function showSample(sample) {
  $("#c-shards").textContent = sample.shard_count === null ? "not set" : sample.shard_count;
  for (const key of ["pending", "due_later", "retrying", "in_flight"]) {
    $(`#c-${key}`).textContent = num(sample.outbox[key]);
  }
  $("#c-outbox_dlq").textContent = num(sample.outbox_dlq);
  $("#c-cancelled").textContent = num(sample.cancelled_runs);
  fill($("#queues tbody"), sample.queues.map((q) => el("tr", { "data-queue": q.name },
    td(q.name, null, "name"), td(num(q.backlog), "n", "backlog"), td(num(q.in_flight), "n", "in_flight"),
    td(num(q.consumers), "n", "consumers"), td(rate(q.handled_per_s), "n", "handled_per_s"),
    td(rate(q.failed_per_s), "n", "failed_per_s"), td(num(q.dead_letters), "n", "dead_letters"),
    td(describeLimits(q.limits), null, "limits"))));
  const shardRows = [];
  for (const q of sample.queues) {
    for (const s of q.shards) {
      const mark = s.in_count ? "in use" : s.draining ? "draining" : "removed";
      shardRows.push(el("tr", { "data-stream": s.stream, class: s.draining ? "draining" : null },
        td(s.stream, null, "stream"), td(num(s.length), "n", "length"), td(num(s.pending), "n", "pending"),
        td(num(s.lag), "n", "lag"), td(num(s.consumers), "n", "consumers"), td(mark, null, "state")));
    }
  }
  fill($("#shards tbody"), shardRows);
  fill($("#workers tbody"), sample.workers.map((w) => el("tr", { "data-consumer": `${w.queue}/${w.name}` },
    td(w.queue, null, "queue"), td(w.name, null, "name"), td(num(w.pending), "n", "pending"),
    td(ms(w.idle_ms), "n", "idle"), td(ms(w.inactive_ms), "n", "inactive"), td(num(w.streams), "n", "streams"))));
  fill($("#limits tbody"), sample.queues.filter((q) => q.limits).map((q) => el("tr", { "data-queue": q.name },
    td(q.name), td(describeLimits(q.limits), null, "limits"), td(num(q.limits.in_use), "n", "in_use"),
    td(num(q.limits.tokens), "n", "tokens"))));
  syncQueueChoices(sample.queues.map((q) => q.name));
  if (!$("#shards-count").value && sample.shard_count) $("#shards-count").value = sample.shard_count;
}

function syncQueueChoices(names) {
  for (const [select, keep] of [[$("#dead-source"), 1], [$("#limits-queue"), 0]]) {
    const have = [...select.options].slice(keep).map((o) => o.value);
    if (have.join("\n") === names.join("\n")) continue;
    const chosen = select.value;
    while (select.options.length > keep) select.remove(keep);
    for (const name of names) {
      select.append(el("option", { value: name, text: keep ? `workflow.dead.${name}` : name }));
    }
    select.value = [...select.options].some((o) => o.value === chosen) ? chosen : select.options[0]?.value ?? "";
  }
}

// ---- charts: inline SVG, one polyline per series ----

function drawChart(target, series, { from, to }) {
  const W = 600, H = 220, L = 48, R = 8, T = 8, B = 22;
  const top = Math.max(1, ...series.flatMap((s) => s.values.map((v) => v[1] ?? 0)));
  const x = (t) => L + ((t - from) / Math.max(to - from, 1)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const nodes = [svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d0d7de" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#d0d7de" }),
    svg("text", { x: L - 4, y: T + 10, "text-anchor": "end", text: top >= 10 ? Math.round(top).toLocaleString("en-US") : top.toFixed(1) }),
    svg("text", { x: L - 4, y: H - B, "text-anchor": "end", text: "0" }),
    svg("text", { x: L, y: H - 6, text: to - from >= 120 ? `-${Math.round((to - from) / 60)} min` : `-${Math.round(to - from)} s` }),
    svg("text", { x: W - R, y: H - 6, "text-anchor": "end", text: "now" })];
  series.forEach((s, i) => {
    const points = s.values.filter((v) => v[1] !== null && v[1] !== undefined).map((v) => `${x(v[0]).toFixed(1)},${y(v[1]).toFixed(1)}`);
    if (points.length) {
      nodes.push(svg("polyline", { points: points.join(" "), fill: "none", stroke: s.color,
        "stroke-width": 2, "stroke-dasharray": s.dashed ? "5 4" : "none", "data-series": s.name }));
    }
    if (!s.dashed) nodes.push(svg("text", { x: L + 8 + (i % 4) * 130, y: T + 12 + Math.floor(i / 4) * 14, fill: s.color, text: s.name }));
  });
  target.replaceChildren(...nodes);
}

function drawCharts() {
  const points = state.points;
  if (!points.length) return;
  const to = points[points.length - 1].t, from = Math.min(points[0].t, to - 10);
  const names = [...new Set(points.flatMap((p) => Object.keys(p.queues)))].sort();
  const pick = (name, index) => points.map((p) => [p.t, p.queues[name] ? p.queues[name][index] : null]);
  const color = (i) => COLORS[i % COLORS.length];
  drawChart($("#chart-backlog"), names.map((n, i) => ({ name: n, color: color(i), values: pick(n, 0) })), { from, to });
  drawChart($("#chart-rates"), names.flatMap((n, i) => [
    { name: n, color: color(i), values: pick(n, 2) },
    { name: `${n} failed`, color: color(i), values: pick(n, 3), dashed: true },
  ]), { from, to });
}

function remember(sample) {
  const point = { t: sample.at, queues: {} };
  for (const q of sample.queues) point.queues[q.name] = [q.backlog, q.in_flight, q.handled_per_s, q.failed_per_s];
  const last = state.points[state.points.length - 1];
  if (!last || last.t < point.t) state.points.push(point);
  const horizon = point.t - 15 * 60;
  while (state.points.length && state.points[0].t < horizon) state.points.shift();
}

async function poll() {
  try {
    const doc = await getJSON("/api/overview");
    showSession(doc);
    $("#error").hidden = !doc.error;
    $("#error").textContent = doc.error ? `cannot read the servers: ${doc.error}` : "";
    if (doc.sample) {
      state.sample = doc.sample;
      showSample(doc.sample);
      remember(doc.sample);
      drawCharts();
      $("#updated").textContent = `updated ${new Date(doc.sample.at * 1000).toLocaleTimeString()}`;
      document.body.dataset.sampledAt = String(doc.sample.at);
      mark("console:sample-shown");
    }
  } catch (err) {
    $("#error").hidden = false;
    $("#error").textContent = `console unreachable: ${err.message}`;
  }
}

// ---- dead letters ----

async function loadDead(cursor) {
  const queue = $("#dead-source").value;
  const params = new URLSearchParams({ limit: "50" });
  if (queue) params.set("queue", queue);
  if (cursor) params.set("before", cursor);
  try {
    const page = await getJSON(`/api/dead-letters?${params}`);
    state.deadNext = page.next;
    $("#dead-total").textContent = `${num(page.total)} in all, ${page.entries.length} shown`;
    $("#dead-all").checked = false;
    fill($("#dead tbody"), page.entries.map((e) => deadRow(queue, e)));
    $("#dead-next").disabled = !page.next;
    document.body.dataset.deadLoaded = `${queue}|${cursor || ""}|${page.entries.length}`;
    mark("console:dead-shown");
  } catch (err) {
    toast(err.message, true);
  }
}

function deadRow(queue, e) {
  const source = queue ? `${e.source_stream || "?"} ${e.source_id || ""}` : e.stream;
  const runs = queue ? e.runs : e.attempts;
  const row = el("tr", { "data-id": e.id },
    el("td", {}, el("input", { type: "checkbox", class: "pick", value: e.id, "aria-label": `select ${e.id}` })),
    td(e.id, null, "id"), td(e.task_id ?? "-", null, "task_id"), td(e.run_id ?? "-", null, "run_id"),
    td(queue ? e.error : e.last_error, "err", "error"), td(runs ?? "-", "n", "runs"), td(source, null, "source"),
    el("td", {}, el("button", { type: "button", class: "payload", text: "payload", onclick: () => showPayload(row, queue, e.id) })));
  return row;
}

async function showPayload(row, queue, id) {
  const params = new URLSearchParams({ id });
  if (queue) params.set("queue", queue);
  try {
    const doc = await getJSON(`/api/dead-letters/payload?${params}`);
    const shown = el("tr", { class: "payload-row" }, el("td", { colspan: 8 }, el("pre", { class: "payload", text: JSON.stringify(doc.payload, null, 2) })));
    if (row.nextElementSibling?.classList.contains("payload-row")) row.nextElementSibling.remove();
    row.after(shown);
  } catch (err) {
    toast(err.message, true);
  }
}

function picked() {
  return [...document.querySelectorAll("#dead input.pick:checked")].map((box) => box.value);
}

async function deadAction(op) {
  const ids = picked();
  const queue = $("#dead-source").value;
  const where = queue ? `workflow.dead.${queue}` : "outbox_dlq";
  if (!ids.length) { toast("select dead letters first", true); return; }
  const what = op === "replay" ? "Replay (send back to be handled again)" : "Delete for good";
  if (await act("dead-letters", { op, queue: queue || null, ids }, `${what} ${ids.length} of ${where}: ${ids.join(", ")}?`)) {
    await loadDead(state.deadCursor[state.deadCursor.length - 1]);
  }
}

$("#dead-source").addEventListener("change", () => { state.deadCursor = []; loadDead(null); });
$("#dead-all").addEventListener("change", (event) => {
  for (const box of document.querySelectorAll("#dead input.pick")) box.checked = event.target.checked;
});
$("#dead-replay").addEventListener("click", () => deadAction("replay"));
$("#dead-delete").addEventListener("click", () => deadAction("delete"));
$("#dead-first").addEventListener("click", () => { state.deadCursor = []; loadDead(null); });
$("#dead-next").addEventListener("click", () => {
  if (!state.deadNext) return;
  state.deadCursor.push(state.deadNext);
  loadDead(state.deadNext);
});

// ---- runs ----

// A run's lookup is a search of bounded steps: each answer holds what one step found and
// `next`, the cursor of the next step. The page keeps what all steps found (one row per id or
// attempt key: SCAN may return a key twice) until a new lookup.
function newRunSearch(runId) {
  return { runId, asked: 0, outbox: new Map(), dlq: new Map(), attempts: new Map(), next: null,
    searched: { outbox_rows: 0, outbox_dlq_rows: 0, redis_keys: 0, steps: 0 }, doc: null };
}

function showRunSearch(search) {
  const doc = search.doc;
  const said = doc.cancelled ? "cancelled: workers start none of its tasks" : doc.cancel_waiting ? "cancel committed, not yet relayed to the workers" : "not cancelled";
  const s = search.searched;
  const how = search.next
    ? `searched so far (${s.steps} step${s.steps === 1 ? "" : "s"}): ${num(s.outbox_rows)} outbox rows, ${num(s.outbox_dlq_rows)} outbox_dlq rows, ~${num(s.redis_keys)} Redis keys; not complete`
    : `search complete (${s.steps} step${s.steps === 1 ? "" : "s"})`;
  $("#run-state").textContent = `run ${search.runId}: ${said}; ${search.outbox.size} waiting, ${search.attempts.size} attempts seen, ${search.dlq.size} in outbox_dlq; ${how}`;
  $("#run-state").dataset.cancelled = String(doc.cancelled || doc.cancel_waiting);
  $("#run-state").dataset.complete = String(!search.next);
  $("#run-further").hidden = !search.next;
  fill($("#run-outbox tbody"), [...search.outbox.values()].map((r) => el("tr", { "data-id": r.id }, td(r.id), td(r.task_id ?? "-"), td(r.status), td(r.attempt_count, "n"), td(r.next_attempt_at ?? "-"), td(r.last_error ?? "", "err"))));
  const attempts = [...search.attempts.values()].sort((a, b) => (a.task_id === b.task_id ? Number(a.attempt) - Number(b.attempt) : a.task_id < b.task_id ? -1 : 1));
  fill($("#run-attempts tbody"), attempts.map((a) => el("tr", { "data-task": a.task_id }, td(a.task_id), td(a.attempt, "n"), td(a.state, null, "state"))));
  fill($("#run-dlq tbody"), [...search.dlq.values()].map((r) => el("tr", { "data-id": r.id }, td(r.id), td(r.task_id ?? "-"), td(r.attempts, "n"), td(r.last_error ?? "", "err"))));
}

async function lookUpRun(runId, further) {
  const search = further ? state.run : newRunSearch(runId);
  if (further && !search?.next) return;
  state.runLatest = search;
  const asked = ++search.asked;
  $("#run-further").disabled = true;
  try {
    const query = { run_id: search.runId };
    if (further) query.cursor = search.next;
    const doc = await getJSON(`/api/run?${new URLSearchParams(query)}`);
    if (state.runLatest !== search || asked !== search.asked) return; // a later lookup began
    state.run = search;
    for (const r of doc.outbox) search.outbox.set(r.id, r);
    for (const r of doc.outbox_dlq) search.dlq.set(r.id, r);
    for (const a of doc.attempts) search.attempts.set(`${a.task_id}:${a.attempt}`, a);
    const s = doc.searched;
    search.searched.outbox_rows += s.outbox_rows;
    search.searched.outbox_dlq_rows += s.outbox_dlq_rows;
    search.searched.redis_keys += s.redis_scans * s.redis_scan_count;
    search.searched.steps += 1;
    search.next = doc.next;
    search.doc = doc;
    showRunSearch(search);
    showSession(state.session || { read_only: true, signed_in: false });
  } catch (err) {
    toast(err.message, true);
  } finally {
    $("#run-further").disabled = false;
  }
}

$("#run-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const runId = $("#run-id").value.trim();
  if (runId) lookUpRun(runId, false);
});
$("#run-further").addEventListener("click", () => lookUpRun(null, true));
$("#run-cancel").addEventListener("click", async () => {
  const runId = state.run?.runId;
  if (runId && await act("cancel", { run_id: runId }, `Cancel run ${runId}? Its tasks not started yet will not run.`)) {
    await lookUpRun(runId, false);
  }
});

// ---- limits and shards ----

$("#limits-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const queue = $("#limits-queue").value;
  const value = (id, parse) => ($(id).value === "" ? null : parse($(id).value));
  const body = { queue, max_in_flight: value("#limits-max", Number), rate: value("#limits-rate", Number),
    burst: value("#limits-burst", Number), clear: $("#limits-clear").checked };
  const parts = [];
  if (body.max_in_flight !== null) parts.push(`max in flight ${body.max_in_flight}`);
  if (body.rate !== null) parts.push(`rate ${body.rate}/s`);
  if (body.burst !== null) parts.push(`burst ${body.burst}`);
  if (body.clear) parts.push("clearing the others");
  act("limits", body, `Set the limits of ${queue}: ${parts.join(", ") || "nothing"}?`);
});

$("#shards-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const count = Number($("#shards-count").value);
  act("shards", { count }, `Change the shard count to ${count}? Enqueuers publish by it within seconds.`);
});

// ---- views ----

function route() {
  const view = (location.hash || "#overview").slice(1);
  for (const section of document.querySelectorAll("section.view")) section.hidden = section.id !== `view-${view}`;
  for (const link of document.querySelectorAll("nav a")) link.classList.toggle("active", link.dataset.view === view);
  if (view === "dead" && !document.body.dataset.deadLoaded) loadDead(null);
}

window.addEventListener("hashchange", route);

async function start() {
  route();
  try {
    const history = await getJSON("/api/history");
    state.points = history.points;
  } catch (err) { /* the first poll says what is wrong */ }
  await poll();
  const every = (state.session?.refresh || 2) * 1000;
  setInterval(poll, every);
}

start();
