// Conveyor's dashboard: one WebSocket to the broker that served this page.
//
// hello (with the token kept in sessionStorage, when the broker asks for one), then
// watch; the broker pushes "snapshot" frames (queues, history, the hour's throughput,
// workers, the opened worker's jobs, the followed job, a page of dead letters) and the
// page renders them. It never polls. Admin actions are
// ordinary requests on the same socket. Everything the broker sends is put in the page
// with textContent (or as SVG attribute numbers): never parsed as HTML.

const TOKEN_KEY = "conveyor.token";
const HISTORY_SECONDS = 300; // the charts' window; the broker keeps as many samples
const HOUR_MINUTES = 60; // the throughput bars: one per minute, the broker's ring
const DEAD_LIMIT = 20;
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 5000;
const NOTICE_MS = 6000;
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

const state = {
  ws: null,
  rid: 0,
  pending: new Map(), // rid -> resolve(reply)
  roles: [],
  maxBatch: 1, // the most ids in one cancel_batch (the hello reply says)
  authed: false,
  sentToken: false,
  awaitingToken: false,
  backoffMs: BACKOFF_MIN_MS,
  reconnectTimer: null,
  firstSnapshot: true, // the next snapshot starts this connection's history
  watch: { job: null, worker: null, deadQueue: null, deadOffset: 0 },
  queue: null, // the queue whose detail is open
  throughput: new Map(), // queue -> Map(minute start -> [completed, failed])
  heldKey: null, // what the held-jobs rows show
  deadChosen: false, // the operator picked the dead-letter queue (else it follows the dead)
  history: new Map(), // queue -> [[t, enq/s, completed/s, retried/s, dead/s], ...]
  last: null, // the latest snapshot
  rolesRendered: null, // the roles the current rows were built for
  deadKey: null, // what the dead-letter rows show
  jobKey: null, // what the job view shows (relative times aside)
  jobTimes: [], // [dd, epoch] of the job view, refreshed on every snapshot
};

// -- small DOM helpers ----------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  node.append(...children); // strings become Text nodes
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

function isAdmin() {
  return state.roles.includes("admin");
}

// -- formatting ---------------------------------------------------------------------------

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

function fmtCount(n) {
  return typeof n === "number" ? integer.format(n) : "–";
}

function fmtRate(r) {
  if (typeof r !== "number" || !Number.isFinite(r)) return "–";
  if (r < 0.05) return "0";
  if (r < 10) return r.toFixed(1);
  return integer.format(Math.round(r));
}

function pad(n) {
  return String(n).padStart(2, "0");
}

function fmtTime(epoch) {
  if (typeof epoch !== "number" || !Number.isFinite(epoch)) return "–";
  const d = new Date(epoch * 1000);
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  const now = new Date();
  if (d.toDateString() === now.toDateString()) return time;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
}

function fmtDate(epoch) {
  return typeof epoch === "number" ? new Date(epoch * 1000).toString() : "";
}

function fmtDuration(seconds) {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function fmtAgo(epoch, now) {
  if (typeof epoch !== "number") return "–";
  const s = now - epoch;
  return s < 1 ? "just now" : `${fmtDuration(s)} ago`;
}

function fmtJson(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

// -- notices and connection state ---------------------------------------------------------

let noticeTimer = null;

function notice(text, kind = "info") {
  const node = $("notice");
  node.textContent = text;
  node.dataset.kind = kind;
  node.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => {
    node.hidden = true;
  }, NOTICE_MS);
}

function setConn(kind, label = kind) {
  const node = $("conn-state");
  node.dataset.state = kind;
  setText(node, label);
  document.body.dataset.conn = kind;
}

function showBanner(detail) {
  $("banner").hidden = false;
  setText($("banner-detail"), detail);
}

function hideBanner() {
  $("banner").hidden = true;
}

function renderRole() {
  const node = $("role");
  node.hidden = !state.authed;
  const admin = isAdmin();
  node.dataset.role = admin ? "admin" : "read";
  setText(node, admin ? "admin" : "read-only");
  document.body.classList.toggle("is-admin", admin);
  for (const item of document.querySelectorAll(".admin-only")) item.hidden = !admin;
}

// -- the socket ---------------------------------------------------------------------------

function socketUrl() {
  return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws";
}

function connect() {
  clearTimeout(state.reconnectTimer);
  state.reconnectTimer = null;
  if (state.ws) return;
  setConn("connecting");
  let ws;
  try {
    ws = new WebSocket(socketUrl());
  } catch {
    scheduleReconnect();
    return;
  }
  state.ws = ws;
  state.authed = false;
  state.firstSnapshot = true;
  ws.addEventListener("open", () => {
    if (ws === state.ws) hello();
  });
  ws.addEventListener("message", (event) => {
    if (ws === state.ws) onFrame(event.data);
  });
  ws.addEventListener("close", (event) => {
    if (ws === state.ws) onClose(event);
  });
}

function scheduleReconnect() {
  const delay = state.backoffMs * (0.8 + 0.4 * Math.random());
  state.backoffMs = Math.min(state.backoffMs * 2, BACKOFF_MAX_MS);
  showBanner(`next attempt in ${(delay / 1000).toFixed(1)} s`);
  clearTimeout(state.reconnectTimer);
  state.reconnectTimer = setTimeout(connect, delay);
}

function onClose(event) {
  state.ws = null;
  state.authed = false;
  for (const resolve of state.pending.values()) {
    resolve({ ok: false, error: { code: "unavailable", message: "the connection was lost" } });
  }
  state.pending.clear();
  document.body.classList.add("stale");
  if (state.awaitingToken) {
    setConn("token", "token needed");
    return;
  }
  setConn("disconnected");
  scheduleReconnect();
  if (event.code === 1008) notice(`The broker closed the connection: ${event.reason || "policy"}`, "error");
}

function request(op, fields = {}) {
  const ws = state.ws;
  if (!ws || ws.readyState !== WebSocket.OPEN) {
    return Promise.resolve({
      ok: false,
      error: { code: "unavailable", message: "not connected to the broker" },
    });
  }
  const rid = ++state.rid;
  return new Promise((resolve) => {
    state.pending.set(rid, resolve);
    ws.send(JSON.stringify({ op, rid, ...fields }));
  });
}

function onFrame(data) {
  let frame;
  try {
    frame = JSON.parse(data);
  } catch {
    return;
  }
  if (frame === null || typeof frame !== "object") return;
  if ("push" in frame) {
    if (frame.push === "snapshot") onSnapshot(frame);
    return; // a push kind we do not know is ignored
  }
  const resolve = state.pending.get(frame.rid);
  if (resolve) {
    state.pending.delete(frame.rid);
    resolve(frame);
  } else if (frame.ok === false && frame.error) {
    notice(frame.error.message || frame.error.code, "error");
  }
}

async function hello() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const fields = { client: "conveyor-dashboard" };
  if (token) fields.token = token;
  state.sentToken = Boolean(token);
  const reply = await request("hello", fields);
  if (reply.ok) {
    state.authed = true;
    state.awaitingToken = false;
    state.roles = Array.isArray(reply.roles) ? reply.roles : [];
    state.maxBatch = typeof reply.max_batch === "number" && reply.max_batch > 0 ? reply.max_batch : 1;
    $("token-panel").hidden = true;
    if (typeof reply.version === "string") setText($("server-version"), reply.version);
    renderRole();
    setConn("connecting", "syncing");
    sendWatch();
    schedules.forbidden = false;
    $("schedules-card").hidden = false;
    refreshSchedules(true);
    return;
  }
  const code = reply.error && reply.error.code;
  if (code === "unauthorized") {
    if (state.sentToken) sessionStorage.removeItem(TOKEN_KEY);
    askToken(state.sentToken ? "The broker refused that token. Try another." : "This broker needs a token.");
  } else if (code !== "unavailable") {
    notice(`hello refused: ${reply.error ? reply.error.message : "unknown error"}`, "error");
  }
}

function askToken(message) {
  state.awaitingToken = true;
  hideBanner();
  setConn("token", "token needed");
  setText($("token-message"), message);
  $("token-panel").hidden = false;
  $("token-input").focus();
}

function onTokenSubmit(event) {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token-input").value = "";
  state.awaitingToken = false;
  state.backoffMs = BACKOFF_MIN_MS;
  $("token-panel").hidden = true;
  if (state.ws && state.ws.readyState === WebSocket.OPEN && !state.authed) hello();
  else connect();
}

async function sendWatch() {
  if (!state.authed) return;
  const fields = {};
  if (state.watch.job) fields.job = state.watch.job;
  if (state.watch.worker) fields.worker = state.watch.worker;
  if (state.watch.deadQueue) {
    fields.dead_queue = state.watch.deadQueue;
    fields.dead_offset = state.watch.deadOffset;
    fields.dead_limit = DEAD_LIMIT;
  }
  const reply = await request("watch", fields);
  if (reply.ok) return;
  const code = reply.error.code;
  if (code === "forbidden" || code === "unauthorized") {
    // A token without the read role: ask for another one.
    sessionStorage.removeItem(TOKEN_KEY);
    askToken("That token may not read the dashboard (it needs the read or admin role).");
    if (state.ws) state.ws.close(1000);
  } else if (code !== "unavailable") {
    notice(`watch refused: ${reply.error.message}`, "error");
  }
}

// -- snapshots ----------------------------------------------------------------------------

function onSnapshot(snap) {
  state.backoffMs = BACKOFF_MIN_MS;
  hideBanner();
  document.body.classList.remove("stale");
  setConn("live");
  const first = state.firstSnapshot;
  state.firstSnapshot = false;
  mergeHistory(snap.history || {}, snap.at, first);
  mergeThroughput(snap.throughput || {}, snap.at, first);
  state.last = snap;
  const queues = snap.queues || {};
  followDead(queues);
  renderServer(snap.server || {}, snap.at);
  renderQueues(queues, snap.at);
  renderQueueDetail(queues, snap.at);
  renderWorkers(snap.workers || { total: 0, list: [] }, snap.at);
  renderWorkerDetail(snap.worker === undefined ? null : snap.worker, snap.at);
  renderDead(snap.dead || null, queues, snap.at);
  renderJob(snap.job === undefined ? null : snap.job, snap.at);
  renderSchedules(snap.at);
  refreshSchedules();
  setText($("as-of"), `as of ${fmtTime(snap.at)} (broker time)`);
}

function mergeHistory(history, at, first) {
  if (first) state.history.clear();
  for (const [name, samples] of Object.entries(history)) {
    if (!Array.isArray(samples)) continue;
    let kept = state.history.get(name) || [];
    const lastT = kept.length ? kept[kept.length - 1][0] : -Infinity;
    const newer = samples.filter((s) => Array.isArray(s) && s[0] > lastT);
    kept = kept.concat(newer);
    const from = at - HISTORY_SECONDS;
    let cut = 0;
    while (cut < kept.length && kept[cut][0] < from) cut++;
    if (kept.length - cut > HISTORY_SECONDS) cut = kept.length - HISTORY_SECONDS;
    state.history.set(name, cut ? kept.slice(cut) : kept);
  }
}

// The broker sends the hour's minutes once, then the minutes that may have changed.
function mergeThroughput(throughput, at, first) {
  if (first) state.throughput.clear();
  for (const [name, buckets] of Object.entries(throughput)) {
    if (!Array.isArray(buckets)) continue;
    let minutes = state.throughput.get(name);
    if (!minutes) state.throughput.set(name, (minutes = new Map()));
    for (const b of buckets) if (Array.isArray(b)) minutes.set(b[0], [b[1] || 0, b[2] || 0]);
  }
  const from = (Math.floor(at / 60) - HOUR_MINUTES + 1) * 60;
  for (const minutes of state.throughput.values()) {
    for (const t of minutes.keys()) if (t < from) minutes.delete(t);
  }
}

// -- header -------------------------------------------------------------------------------

function renderServer(server, at) {
  setText($("server-version"), server.version ?? "–");
  setText($("server-store"), server.store ?? "–");
  setText($("server-uptime"), typeof server.started_at === "number" ? fmtDuration(at - server.started_at) : "–");
  setText($("server-connections"), fmtCount(server.connections));
  // Several brokers share this job table (PostgreSQL): say how many, and whose worker is whose.
  const brokers = typeof server.brokers === "number" ? server.brokers : 1;
  setText($("server-brokers"), fmtCount(brokers));
  $("server-brokers-item").hidden = brokers <= 1;
  clusterView = brokers > 1;
  ownUrl = typeof server.url === "string" ? server.url : "";
}

// -- queues -------------------------------------------------------------------------------

const queueRows = new Map(); // name -> {row, cells}

function queueRow(name) {
  const cells = {};
  const cell = (key, cls) => (cells[key] = el("td", { class: cls, "data-field": key }));
  const open = el("button", {
    type: "button",
    class: "link",
    "data-testid": `open-queue-${name}`,
    title: `Open ${name}`,
    text: name,
    onclick: () => openQueue(name),
  });
  const row = el(
    "tr",
    { "data-testid": `queue-row-${name}`, "data-queue": name },
    el("th", { scope: "row", class: "name", "data-field": "name" }, open),
    cell("ready", "num"),
    cell("scheduled", "num"),
    cell("processing", "num"),
    cell("limited", "num"),
    cell("dead", "num"),
    cell("oldest_ready", "num"),
    cell("paused", "state"),
    cell("rate_enqueued", "num rate"),
    cell("rate_completed", "num rate"),
    cell("rate_retried", "num rate"),
    cell("rate_dead", "num rate"),
    cell("chart", "chart-col"),
    cell("last_hour", "hour-col"),
  );
  const showDead = el("button", {
    type: "button",
    class: "link",
    "data-testid": `show-dead-${name}`,
    title: "Show this queue's dead letters",
    onclick: () => chooseDeadQueue(name, true),
  });
  cells.limited.dataset.testid = `limited-${name}`;
  cells.dead.append(showDead);
  cells.showDead = showDead;
  const pill = el("span", { class: "pill" });
  cells.paused.append(pill);
  cells.pill = pill;
  cells.chartSvg = chartSvg();
  cells.chart.append(cells.chartSvg.root);
  cells.hourBars = hourBars("bars");
  cells.hourText = el("span", { class: "hour-text", "data-testid": `hour-total-${name}` });
  cells.last_hour.append(cells.hourBars.root, cells.hourText);
  if (isAdmin()) {
    const actions = el("td", { class: "actions-col" });
    cells.pause = el("button", {
      type: "button",
      "data-testid": `pause-${name}`,
      text: "Pause",
      onclick: () => act("pause", { queue: name }),
    });
    cells.resume = el("button", {
      type: "button",
      "data-testid": `resume-${name}`,
      text: "Resume",
      onclick: () => act("resume", { queue: name }),
    });
    actions.append(cells.pause, cells.resume);
    row.append(actions);
  }
  return { row, cells };
}

function renderQueues(queues, at) {
  const body = $("queues-body");
  const rolesKey = state.roles.join(",");
  if (state.rolesRendered !== rolesKey) {
    queueRows.clear();
    body.replaceChildren();
    state.rolesRendered = rolesKey;
  }
  const names = Object.keys(queues).sort();
  for (const [name, entry] of queueRows) {
    if (!(name in queues)) {
      entry.row.remove();
      queueRows.delete(name);
    }
  }
  for (const name of state.history.keys()) if (!(name in queues)) state.history.delete(name);
  let previous = null;
  for (const name of names) {
    const q = queues[name] || {};
    let entry = queueRows.get(name);
    if (!entry) {
      entry = queueRow(name);
      queueRows.set(name, entry);
    }
    // keep rows in name order without rebuilding them
    const expected = previous ? previous.nextSibling : body.firstChild;
    if (expected !== entry.row) body.insertBefore(entry.row, expected);
    previous = entry.row;
    const c = entry.cells;
    setText(c.ready, fmtCount(q.ready));
    setText(c.scheduled, fmtCount(q.scheduled));
    setText(c.processing, fmtCount(q.processing));
    renderLimitedCell(c.limited, q, at);
    setText(c.showDead, fmtCount(q.dead));
    c.dead.classList.toggle("has-dead", q.dead > 0);
    setText(c.oldest_ready, fmtOldestReady(q, at));
    const paused = q.paused === true;
    entry.row.dataset.paused = String(paused);
    c.pill.className = paused ? "pill paused" : "pill active";
    setText(c.pill, paused ? "paused" : "active");
    const rates = q.rates || {};
    setText(c.rate_enqueued, fmtRate(rates.enqueued));
    setText(c.rate_completed, fmtRate(rates.completed));
    setText(c.rate_retried, fmtRate(rates.retried));
    setText(c.rate_dead, fmtRate(rates.dead));
    c.rate_retried.classList.toggle("warn", rates.retried >= 0.05);
    c.rate_dead.classList.toggle("bad", rates.dead >= 0.05);
    drawChart(c.chartSvg, state.history.get(name) || [], at);
    const hour = drawHour(c.hourBars, name, at);
    setText(c.hourText, fmtHour(q.last_hour, hour));
    if (c.pause) {
      c.pause.hidden = paused;
      c.resume.hidden = !paused;
    }
  }
  $("queues-empty").hidden = names.length > 0;
  $("queues-table").hidden = names.length === 0;
}

// Ready jobs held back by a flow-control limit, with the limits (and any back-off of the
// whole queue) in the tooltip.
function renderLimitedCell(node, q, at) {
  const limited = typeof q.limited === "number" ? q.limited : 0;
  const until = backedOffUntil(q, at);
  setText(node, until === null ? fmtCount(q.limited) : `${fmtCount(q.limited)} · backed off until ${fmtTime(until)}`);
  node.classList.toggle("has-limited", limited > 0);
  node.classList.toggle("backed-off", until !== null);
  const parts = [fmtLimits(q.limits)];
  if (until !== null) parts.push(`backed off until ${fmtTime(until)}`);
  const title = parts.join("; ");
  if (node.title !== title) node.title = title;
}

// When a back-off of the whole queue ends, or null when none holds it now.
function backedOffUntil(q, at) {
  const t = q.backoff_until;
  return typeof t === "number" && Number.isFinite(t) && t > at ? t : null;
}

function fmtNumber(n) {
  return Number.isInteger(n) ? integer.format(n) : String(n);
}

// One set of limits (the queue's, or each key's) in words: "10 at once", "100 per 60 s (burst 5)".
function limitParts(l, prefix) {
  const parts = [];
  const at = l[`${prefix}concurrency`];
  const rate = l[`${prefix}rate`];
  if (typeof at === "number") parts.push(`${fmtCount(at)} at once`);
  if (typeof rate === "number") {
    const per = typeof l[`${prefix}per_s`] === "number" ? l[`${prefix}per_s`] : 1;
    const burst = l[`${prefix}burst`];
    let text = `${fmtCount(rate)} per ${fmtNumber(per)} s`;
    if (typeof burst === "number") text += ` (burst ${fmtCount(burst)})`;
    parts.push(text);
  }
  return parts;
}

function hasLimits(limits) {
  if (!limits || typeof limits !== "object") return false;
  return ["concurrency", "rate", "partition_concurrency", "partition_rate"].some((k) => typeof limits[k] === "number");
}

// A queue's limits in words: "10 at once · 100 per 60 s (burst 5) · per key: 2 at once".
function fmtLimits(limits) {
  if (!hasLimits(limits)) return "No limits";
  const parts = limitParts(limits, "");
  const perKey = limitParts(limits, "partition_");
  if (perKey.length) parts.push(`per key: ${perKey.join(", ")}`);
  return parts.join(" · ");
}

// The age of the queue's oldest ready job: its latency. The broker's stats carry
// `oldest_ready_at` (epoch seconds, null when nothing is ready); "–" without it.
function fmtOldestReady(q, at) {
  const t = q.oldest_ready_at;
  if (typeof t !== "number") return "–";
  return fmtDuration(at - t);
}

function fmtHour(lastHour, drawn) {
  const done = lastHour && typeof lastHour.completed === "number" ? lastHour.completed : drawn.completed;
  const failed = lastHour && typeof lastHour.failed === "number" ? lastHour.failed : drawn.failed;
  return failed > 0 ? `${fmtCount(done)} · ${fmtCount(failed)} failed` : fmtCount(done);
}

// Bars of the last hour, one per minute: completed from the axis up, failed on top.
const BAR_H = 28;

function hourBars(cls) {
  const root = svg("svg", {
    viewBox: `0 0 ${HOUR_MINUTES} ${BAR_H}`,
    preserveAspectRatio: "none",
    class: cls,
    role: "img",
  });
  const title = svg("title");
  root.append(title, svg("line", { x1: 0, x2: HOUR_MINUTES, y1: BAR_H - 0.25, y2: BAR_H - 0.25, class: "axis" }));
  const done = [];
  const failed = [];
  for (let i = 0; i < HOUR_MINUTES; i++) {
    done.push(svg("rect", { x: i + 0.1, width: 0.8, y: BAR_H, height: 0, class: "bar completed" }));
    failed.push(svg("rect", { x: i + 0.1, width: 0.8, y: BAR_H, height: 0, class: "bar failed" }));
  }
  root.append(...done, ...failed);
  return { root, title, done, failed };
}

function drawHour(chart, name, at) {
  const minutes = state.throughput.get(name) || new Map();
  const last = Math.floor(at / 60);
  let peak = 0;
  let done = 0;
  let failed = 0;
  const values = [];
  for (let i = 0; i < HOUR_MINUTES; i++) {
    const v = minutes.get((last - HOUR_MINUTES + 1 + i) * 60) || [0, 0];
    values.push(v);
    peak = Math.max(peak, v[0] + v[1]);
    done += v[0];
    failed += v[1];
  }
  const scale = peak > 0 ? (BAR_H - 1) / peak : 0;
  for (let i = 0; i < HOUR_MINUTES; i++) {
    const [c, f] = values[i];
    const hc = c * scale;
    const hf = f * scale;
    chart.done[i].setAttribute("y", (BAR_H - hc).toFixed(2));
    chart.done[i].setAttribute("height", hc.toFixed(2));
    chart.failed[i].setAttribute("y", (BAR_H - hc - hf).toFixed(2));
    chart.failed[i].setAttribute("height", hf.toFixed(2));
  }
  chart.title.textContent =
    peak > 0
      ? `last hour: ${fmtCount(done)} completed, ${fmtCount(failed)} failed; busiest minute ${fmtCount(peak)}`
      : "last hour: idle";
  return { completed: done, failed };
}

// -- one queue ----------------------------------------------------------------------------

let queueDetail = null; // {bars, summary cells} of the open queue's card

function openQueue(name) {
  const again = state.queue === name;
  state.queue = name;
  queueDetail = null;
  limitsForm.queue = null; // filled afresh from the queue's limits
  $("queue-card").hidden = false;
  if (!again) openJobs();
  if (state.last) renderQueueDetail(state.last.queues || {}, state.last.at);
  $("queue-card").scrollIntoView({ block: "nearest", behavior: "smooth" });
}

function closeQueue() {
  state.queue = null;
  queueDetail = null;
  limitsForm.queue = null;
  closeJobs();
  $("queue-card").hidden = true;
}

const QUEUE_SUMMARY = [
  ["ready", "ready"],
  ["scheduled", "scheduled"],
  ["processing", "processing"],
  ["dead", "dead"],
  ["oldest_ready", "oldest ready"],
  ["enqueued", "enqueued, all time"],
  ["completed", "completed, all time"],
];

function renderQueueDetail(queues, at) {
  const name = state.queue;
  const card = $("queue-card");
  if (!name) return;
  const q = queues[name];
  if (!q) {
    closeQueue(); // the queue is gone
    return;
  }
  if (!queueDetail) {
    setText($("queue-detail-name"), name);
    const summary = $("queue-detail-summary");
    const cells = {};
    summary.replaceChildren(
      ...QUEUE_SUMMARY.map(([key, label]) => {
        cells[key] = el("dd", {});
        return el("div", { "data-field": key }, el("dt", { text: label }), cells[key]);
      }),
    );
    const bars = hourBars("bars wide");
    $("queue-hour-chart").replaceChildren(bars.root);
    queueDetail = { cells, bars };
  }
  card.dataset.queue = name;
  const pill = $("queue-detail-state");
  pill.className = q.paused ? "pill paused" : "pill active";
  setText(pill, q.paused ? "paused" : "active");
  const c = queueDetail.cells;
  for (const key of ["ready", "scheduled", "processing", "dead"]) setText(c[key], fmtCount(q[key]));
  setText(c.oldest_ready, fmtOldestReady(q, at));
  const totals = q.totals || {};
  setText(c.enqueued, fmtCount(totals.enqueued));
  setText(c.completed, fmtCount(totals.completed));
  const hour = drawHour(queueDetail.bars, name, at);
  const lastHour = q.last_hour || hour;
  setText($("queue-hour-total"), `${fmtCount(lastHour.completed)} completed, ${fmtCount(lastHour.failed)} failed`);
  renderLimits(name, q, at);
  jobsOnCounts(q);
}

// -- one queue's limits -------------------------------------------------------------------
//
// The panel says the limits in words; with the admin role a form edits them (set_limits,
// which replaces them all). The inputs follow the snapshots only while the operator is not
// editing them: not while one has the focus, nor after a change until it is saved, cleared
// or the queue is opened again.

const LIMIT_FIELDS = [
  "concurrency",
  "rate",
  "per_s",
  "burst",
  "partition_concurrency",
  "partition_rate",
  "partition_per_s",
  "partition_burst",
];

const limitsForm = {
  queue: null, // the queue the inputs were filled for
  key: null, // the limits they were filled from
  dirty: false, // changed by the operator since
};

function limitInputs() {
  return LIMIT_FIELDS.map((field) => [field, $(`limit-${field}`)]);
}

function fillLimits(name, limits) {
  const l = limits || {};
  for (const [field, input] of limitInputs()) {
    let value = l[field];
    // A period means nothing without its rate (the broker answers 1 for it regardless).
    if (field === "per_s" && typeof l.rate !== "number") value = null;
    if (field === "partition_per_s" && typeof l.partition_rate !== "number") value = null;
    input.value = typeof value === "number" ? String(value) : "";
  }
  limitsForm.queue = name;
  limitsForm.key = JSON.stringify(limits || null);
  limitsForm.dirty = false;
}

function renderLimits(name, q, at) {
  const summary = $("limits-summary");
  setText(summary, fmtLimits(q.limits));
  summary.classList.toggle("none", !hasLimits(q.limits));
  setText($("limits-limited"), fmtCount(q.limited));
  setText($("limits-partitions"), fmtCount(q.partitions));
  const until = backedOffUntil(q, at);
  $("limits-backoff-item").hidden = until === null;
  setText($("limits-backoff"), until === null ? "" : `until ${fmtTime(until)}`);
  const form = $("limits-form");
  const focused = document.activeElement;
  const editing = limitsForm.dirty || (focused instanceof HTMLInputElement && form.contains(focused));
  const key = JSON.stringify(q.limits || null);
  if (limitsForm.queue !== name || (key !== limitsForm.key && !editing)) fillLimits(name, q.limits);
}

// The filled inputs as set_limits fields, or null (with a notice) when one is not a number.
function limitsFields(queue) {
  const fields = { queue };
  for (const [field, input] of limitInputs()) {
    if (input.validity.badInput) {
      notice(`set_limits not sent: ${field}: not a number`, "error");
      input.focus();
      return null;
    }
    const text = input.value.trim();
    if (text !== "") fields[field] = Number(text);
  }
  return fields;
}

async function saveLimits(event) {
  event.preventDefault();
  const queue = state.queue;
  if (!queue) return;
  const fields = limitsFields(queue);
  if (!fields) return;
  const reply = await act("set_limits", fields);
  if (reply && reply.ok && state.queue === queue) fillLimits(queue, reply.limits);
}

async function clearLimits() {
  const queue = state.queue;
  if (!queue) return;
  const confirmText = `Remove every limit of ${queue}? Its jobs are then handed out as fast as workers take them.`;
  const reply = await act("set_limits", { queue }, confirmText);
  if (reply && reply.ok && state.queue === queue) fillLimits(queue, reply.limits);
}

// -- one queue's jobs, by state -----------------------------------------------------------
//
// A page of `list_jobs` on the dashboard's socket: keyset pages (the op's cursor), with a
// stack of the cursors the earlier pages started from, for "previous". The open page is
// asked for again when the feed's counts for its queue change (at most once a second) or
// on the operator's action; it is never polled.

const JOB_STATES = ["ready", "scheduled", "processing", "completed", "dead", "waiting"];
const JOBS_LIMIT = 20;
const JOBS_REFRESH_MS = 1000; // the most often the open page is asked for again
const SEARCH_DEBOUNCE_MS = 300;
const SEARCH_HOPS = 10; // a search's empty pages followed on one "page" (2,000 jobs each)
const PREVIEW_LEN = 120;

const TIME_OF_STATE = {
  ready: ["Ready since", (job) => Math.max(job.ready_at, job.enqueued_at), "waiting since (its ready time, or its enqueue)"],
  scheduled: ["Due at", (job) => job.ready_at, "when it becomes ready"],
  processing: ["Running since", (job) => job.claimed_at, "when its worker took it"],
  completed: ["Completed at", (job) => job.completed_at, "when its ack landed"],
  dead: ["Died at", (job) => job.died_at, "when it died"],
  waiting: ["Waiting since", (job) => job.enqueued_at, "when it was enqueued: it waits for the jobs it depends on"],
};

const listing = {
  state: "ready",
  search: "",
  cursor: null, // where the open page starts (null: the first page)
  stack: [], // the cursors the earlier pages started from
  page: null, // {jobs, next, total, queue, state} of the open page, once it came
  error: null,
  selected: new Set(), // job ids ticked on the open page
  gen: 0, // the request generation: a reply to an older one is dropped
  inFlight: false,
  again: false, // asked again while a request was in flight
  lastLoad: 0, // performance.now() of the last request
  timer: null,
  countsKey: null, // the queue's counts the open page was loaded at
  searchTimer: null,
  rowsKey: null, // what the rows show (rebuilt only when it changed)
  rows: new Map(), // job id -> its checkbox
};

function resetJobs(keepSearch = true) {
  listing.gen++;
  listing.cursor = null;
  listing.stack = [];
  listing.page = null;
  listing.error = null;
  listing.selected.clear();
  listing.inFlight = false;
  listing.again = false;
  listing.rowsKey = null;
  clearTimeout(listing.timer);
  listing.timer = null;
  if (!keepSearch) {
    listing.search = "";
    $("jobs-search").value = "";
  }
  setText($("jobs-result"), "");
}

function countsKeyOf(q) {
  return JSON.stringify([q.ready, q.scheduled, q.processing, q.dead, q.totals || null]);
}

function openJobs() {
  resetJobs(false);
  listing.state = "ready";
  const q = state.last && state.last.queues ? state.last.queues[state.queue] : null;
  listing.countsKey = q ? countsKeyOf(q) : null;
  $("jobs-body").replaceChildren();
  loadJobs();
}

function closeJobs() {
  resetJobs(false);
  listing.countsKey = null;
}

function chooseJobState(name) {
  if (!JOB_STATES.includes(name)) return;
  if (name === listing.state && listing.cursor === null) return;
  listing.state = name;
  resetJobs();
  loadJobs();
}

function onSearchInput() {
  clearTimeout(listing.searchTimer);
  listing.searchTimer = setTimeout(() => {
    const search = $("jobs-search").value.trim();
    if (search === listing.search) return;
    listing.search = search;
    resetJobs();
    loadJobs();
  }, SEARCH_DEBOUNCE_MS);
}

// The feed's counts of the open queue: when they change, the open page may have.
function jobsOnCounts(q) {
  const key = countsKeyOf(q);
  renderJobTabs(q);
  if (key === listing.countsKey) return;
  listing.countsKey = key;
  refreshJobs();
}

// Ask for the open page again, at most once every JOBS_REFRESH_MS.
function refreshJobs() {
  if (!state.queue) return;
  if (listing.inFlight) {
    listing.again = true;
    return;
  }
  if (listing.timer) return;
  const wait = listing.lastLoad + JOBS_REFRESH_MS - performance.now();
  if (wait <= 0) loadJobs();
  else
    listing.timer = setTimeout(() => {
      listing.timer = null;
      loadJobs();
    }, wait);
}

async function loadJobs() {
  const queue = state.queue;
  if (!queue) return;
  clearTimeout(listing.timer);
  listing.timer = null;
  const gen = ++listing.gen;
  listing.inFlight = true;
  listing.again = false;
  listing.lastLoad = performance.now();
  if (listing.page) renderJobsChrome();
  else renderJobs(); // a new listing: its rows go, "Loading…" until the reply
  const fields = { queue, state: listing.state, limit: JOBS_LIMIT };
  if (listing.search) fields.search = listing.search;
  let cursor = listing.cursor;
  let reply;
  // A search looks at 2,000 jobs per call and may come back empty with a cursor to go
  // on from: follow a few of those, so that a page shows matches when there are some.
  for (let hop = 0; ; hop++) {
    reply = await request("list_jobs", cursor ? { ...fields, cursor } : fields);
    if (gen !== listing.gen) return; // the operator moved on meanwhile
    if (!reply.ok || !listing.search || reply.jobs.length > 0 || !reply.next || hop + 1 >= SEARCH_HOPS) break;
    cursor = reply.next;
  }
  listing.inFlight = false;
  if (reply.ok) {
    listing.error = null;
    listing.page = { jobs: reply.jobs, next: reply.next, total: reply.total, queue, state: listing.state };
    // The page went past the end (its jobs left the state): step back a page.
    if (reply.jobs.length === 0 && !listing.search && listing.stack.length > 0) {
      listing.cursor = listing.stack.pop();
      loadJobs();
      return;
    }
  } else {
    listing.error = reply.error ? reply.error.message || reply.error.code : "unknown error";
    listing.countsKey = null; // the next snapshot asks again
  }
  renderJobs();
  if (listing.again) refreshJobs();
}

function pageJobs(step) {
  if (!listing.page) return;
  if (step > 0) {
    if (!listing.page.next) return;
    listing.stack.push(listing.cursor);
    listing.cursor = listing.page.next;
  } else {
    if (listing.stack.length === 0) return;
    listing.cursor = listing.stack.pop();
  }
  listing.selected.clear();
  listing.page = null;
  loadJobs();
}

function renderJobTabs(q) {
  for (const tab of $("jobs-tabs").querySelectorAll("button[data-state]")) {
    const name = tab.dataset.state;
    const selected = name === listing.state;
    tab.setAttribute("aria-selected", String(selected));
    tab.classList.toggle("selected", selected);
    if (q) setText(tab.querySelector(".tab-count"), fmtCount(q[name]));
  }
}

// What does not wait for a reply: the tabs, the time column's name, the buttons.
function renderJobsChrome() {
  const q = state.last && state.last.queues ? state.last.queues[state.queue] : null;
  renderJobTabs(q || null);
  const [head, , title] = TIME_OF_STATE[listing.state];
  const th = $("jobs-time-head");
  setText(th, head);
  th.title = title;
  const admin = isAdmin();
  const dead = listing.state === "dead";
  $("jobs-actions").hidden = !admin;
  $("jobs-cancel").hidden = dead;
  $("jobs-redrive-all").hidden = !dead;
  $("jobs-select-head").hidden = !admin || dead;
  const page = listing.page;
  $("jobs-prev").disabled = listing.stack.length === 0;
  $("jobs-next").disabled = !page || !page.next;
  renderSelection();
  $("jobs-redrive-all").disabled = !q || !(q.dead > 0);
}

function renderJobs() {
  renderJobsChrome();
  const page = listing.page;
  const list = page ? page.jobs : [];
  const admin = isAdmin();
  const selectable = admin && listing.state !== "dead";
  // What a row shows that may change (a payload never does; it may be big).
  const key = JSON.stringify([
    selectable,
    listing.state,
    list.map((j) => [j.id, j.priority, j.attempts, j.max_attempts, j.ready_at, j.claimed_at, j.died_at, j.last_error]),
  ]);
  if (key !== listing.rowsKey) {
    listing.rowsKey = key;
    listing.rows.clear();
    const ids = new Set(list.map((job) => String(job.id)));
    for (const id of listing.selected) if (!ids.has(id)) listing.selected.delete(id);
    $("jobs-body").replaceChildren(...list.map((job) => jobRow(job, selectable)));
    renderSelection();
  }
  $("jobs-table").hidden = list.length === 0;
  const empty = $("jobs-empty");
  let text = "";
  if (listing.error) text = `Could not list the jobs: ${listing.error}`;
  else if (!page) text = "Loading…";
  else if (list.length === 0 && listing.search && page.next) {
    text = `No ${listing.state} job matches “${listing.search}” among those looked at so far: Next → looks further.`;
  } else if (list.length === 0 && listing.search) text = `No ${listing.state} job matches “${listing.search}”.`;
  else if (list.length === 0) text = `No ${listing.state} jobs in ${state.queue}.`;
  empty.hidden = !text;
  empty.dataset.kind = listing.error ? "error" : "";
  setText(empty, text);
  let range = "";
  if (page && list.length > 0) {
    const pageNo = listing.stack.length + 1;
    if (listing.search) range = `${fmtCount(list.length)} matching · page ${fmtCount(pageNo)}`;
    else {
      const from = listing.stack.length * JOBS_LIMIT + 1;
      range = `${fmtCount(from)}–${fmtCount(from + list.length - 1)} of ${fmtCount(page.total)}`;
    }
  }
  setText($("jobs-range"), range);
}

function payloadPreview(payload) {
  let text;
  try {
    text = JSON.stringify(payload);
  } catch {
    text = String(payload);
  }
  if (text === undefined) text = String(payload);
  return text.length > PREVIEW_LEN ? `${text.slice(0, PREVIEW_LEN)}…` : text;
}

function jobRow(job, selectable) {
  const id = String(job.id);
  const [, timeOf] = TIME_OF_STATE[listing.state];
  const at = timeOf(job);
  const known = typeof at === "number" && Number.isFinite(at);
  const row = el("tr", { "data-testid": `job-row-${id}`, "data-job": id });
  if (selectable) {
    const box = el("input", {
      type: "checkbox",
      "data-testid": `select-${id}`,
      "aria-label": `Select job ${id}`,
      onchange: (e) => {
        if (e.target.checked) listing.selected.add(id);
        else listing.selected.delete(id);
        renderSelection();
      },
    });
    box.checked = listing.selected.has(id);
    listing.rows.set(id, box);
    row.append(el("td", { class: "select-col" }, box));
  }
  const preview = payloadPreview(job.payload);
  row.append(
    el(
      "th",
      { scope: "row", class: "mono", "data-field": "id" },
      el("button", { type: "button", class: "link mono", text: id, title: "Look this job up", onclick: () => followJob(id) }),
    ),
    el("td", { class: "num", "data-field": "priority", text: fmtCount(job.priority) }),
    el("td", { class: "num", "data-field": "attempts", text: `${fmtCount(job.attempts)} / ${fmtCount(job.max_attempts)}` }),
    el("td", {
      "data-field": "time",
      text: known ? fmtTime(at) : "–",
      title: known ? fmtDate(at) : listing.state === "processing" ? "held by a worker of another broker, or re-attached after a reconnect" : null,
    }),
    el("td", { "data-field": "payload" }, el("code", { class: "preview", text: preview, title: preview })),
    el("td", { class: "error-text", "data-field": "last_error", text: job.last_error ?? "" }),
  );
  return row;
}

function renderSelection() {
  const onPage = Array.from(listing.rows.keys());
  const ticked = onPage.filter((id) => listing.selected.has(id)).length;
  const all = $("jobs-select-all");
  all.checked = onPage.length > 0 && ticked === onPage.length;
  all.indeterminate = ticked > 0 && ticked < onPage.length;
  all.disabled = onPage.length === 0;
  for (const [id, box] of listing.rows) box.checked = listing.selected.has(id);
  const cancel = $("jobs-cancel");
  cancel.disabled = ticked === 0;
  setText(cancel, ticked > 0 ? `Cancel selected (${fmtCount(ticked)})` : "Cancel selected");
}

function onSelectAll(event) {
  const on = event.target.checked;
  for (const id of listing.rows.keys()) {
    if (on) listing.selected.add(id);
    else listing.selected.delete(id);
  }
  renderSelection();
}

async function cancelSelected() {
  const ids = Array.from(listing.rows.keys()).filter((id) => listing.selected.has(id));
  if (ids.length === 0) return;
  const what = ids.length === 1 ? `job ${ids[0]}` : `${fmtCount(ids.length)} jobs`;
  if (!window.confirm(`Cancel ${what}? They are deleted for good.`)) return;
  // In batches of the broker's max_batch (a page is 20: one batch, unless it is tiny).
  const cancelled = [];
  let failed = null;
  for (let i = 0; i < ids.length && !failed; i += state.maxBatch) {
    const reply = await request("cancel_batch", { ids: ids.slice(i, i + state.maxBatch) });
    if (reply.ok) cancelled.push(...reply.cancelled);
    else failed = reply.error;
  }
  const done = DONE.cancel_batch({ ids: ids.slice(0, cancelled.length) }, { cancelled });
  if (failed) notice(`cancel_batch refused: ${failed.message || failed.code}${cancelled.length ? ` (${done})` : ""}`, "error");
  else {
    notice(done, "ok");
    setText($("jobs-result"), done);
    listing.selected.clear();
  }
  loadJobs();
}

async function redriveAll() {
  const queue = state.queue;
  if (!queue) return;
  const q = state.last && state.last.queues ? state.last.queues[queue] : null;
  const count = q && typeof q.dead === "number" ? `${fmtCount(q.dead)} ` : "";
  const reply = await act("redrive_all", { queue }, `Redrive all ${count}dead jobs of ${queue}? Each is put back, ready now.`);
  if (!reply) return;
  if (reply.ok) setText($("jobs-result"), DONE.redrive_all({ queue }, reply));
  loadJobs();
}

// A sparkline: completed as a soft area, enqueued, retried and dead as lines, on one scale.
const CHART_W = HISTORY_SECONDS;
const CHART_H = 36;

function chartSvg() {
  const root = svg("svg", {
    viewBox: `0 0 ${CHART_W} ${CHART_H}`,
    preserveAspectRatio: "none",
    class: "spark",
    role: "img",
  });
  const title = svg("title");
  const area = svg("path", { class: "area completed" });
  const lines = {};
  root.append(title, svg("line", { x1: 0, x2: CHART_W, y1: CHART_H - 0.5, y2: CHART_H - 0.5, class: "axis" }), area);
  for (const key of ["completed", "enqueued", "retried", "dead"]) {
    lines[key] = svg("polyline", { class: `line ${key}`, fill: "none" });
    root.append(lines[key]);
  }
  return { root, title, area, lines };
}

// The window is the last five minutes, or less while the broker has not been up that long
// (at least a minute), so a fresh broker's chart is not a sliver at the right edge.
function chartSpan(samples, at) {
  const first = samples.length ? samples[0][0] : at;
  return Math.min(HISTORY_SECONDS, Math.max(60, Math.ceil((at - first) / 60) * 60));
}

// Per-second rates are jumpy; the chart draws a trailing average over SMOOTH samples.
const SMOOTH = 5;

function smooth(samples) {
  const out = [];
  const sums = [0, 0, 0, 0];
  for (let i = 0; i < samples.length; i++) {
    for (let k = 0; k < 4; k++) sums[k] += samples[i][k + 1] || 0;
    if (i >= SMOOTH) for (let k = 0; k < 4; k++) sums[k] -= samples[i - SMOOTH][k + 1] || 0;
    const n = Math.min(i + 1, SMOOTH);
    out.push([samples[i][0], sums[0] / n, sums[1] / n, sums[2] / n, sums[3] / n]);
  }
  return out;
}

function drawChart(chart, samples, at) {
  const span = chartSpan(samples, at);
  const from = at - span;
  const visible = smooth(samples).filter((s) => s[0] >= from);
  let peak = 0;
  for (const s of visible) peak = Math.max(peak, s[1] || 0, s[2] || 0, s[3] || 0, s[4] || 0);
  const scale = peak > 0 ? (CHART_H - 4) / peak : 0;
  const x = (t) => (((t - from) / span) * CHART_W).toFixed(1);
  const y = (v) => (CHART_H - 1 - (v || 0) * scale).toFixed(1);
  const series = { enqueued: 1, completed: 2, retried: 3, dead: 4 };
  for (const [key, index] of Object.entries(series)) {
    const used = visible.some((s) => (s[index] || 0) > 0);
    const points = used ? visible.map((s) => `${x(s[0])},${y(s[index])}`).join(" ") : "";
    chart.lines[key].setAttribute("points", points);
  }
  if (visible.length > 1 && visible.some((s) => (s[2] || 0) > 0)) {
    const first = visible[0];
    const last = visible[visible.length - 1];
    const top = visible.map((s) => `L${x(s[0])},${y(s[2])}`).join(" ");
    chart.area.setAttribute("d", `M${x(first[0])},${CHART_H} ${top} L${x(last[0])},${CHART_H} Z`);
  } else {
    chart.area.setAttribute("d", "");
  }
  const label = span >= 120 ? `last ${span / 60} min` : `last ${span} s`;
  chart.title.textContent =
    peak > 0 ? `${label}, ${SMOOTH} s averages; peak ${fmtRate(peak)}/s` : `${label}; idle`;
}

// -- workers ------------------------------------------------------------------------------

const workerRows = new Map();
let clusterView = false; // several brokers: the workers table shows each one's broker
let ownUrl = "";

function workerRow(id) {
  const cells = {};
  const cell = (key, cls) => (cells[key] = el("td", { class: cls, "data-field": key }));
  const open = el("button", {
    type: "button",
    class: "link mono",
    "data-testid": `open-worker-${id}`,
    title: "Show the jobs it holds",
    text: id,
    onclick: () => openWorker(id),
  });
  const row = el(
    "tr",
    { "data-testid": `worker-row-${id}`, "data-worker": id },
    el("th", { scope: "row", class: "name mono", "data-field": "worker_id" }, open),
    cell("queues"),
    cell("prefetch", "num"),
    cell("in_hand", "in-hand"),
    cell("oldest", "num"),
    cell("connected_at"),
    cell("last_seen_at"),
    cell("broker", "broker-col mono"),
  );
  cells.inHandText = el("span", { class: "in-hand-text" });
  cells.meter = el("span", { class: "meter-fill" });
  cells.in_hand.append(cells.inHandText, el("span", { class: "meter", "aria-hidden": "true" }, cells.meter));
  return { row, cells };
}

function renderWorkers(workers, at) {
  const list = Array.isArray(workers.list) ? workers.list : [];
  const body = $("workers-body");
  const seen = new Set();
  let previous = null;
  for (const w of list) {
    const id = String(w.worker_id);
    seen.add(id);
    let entry = workerRows.get(id);
    if (!entry) {
      entry = workerRow(id);
      workerRows.set(id, entry);
    }
    const expected = previous ? previous.nextSibling : body.firstChild;
    if (expected !== entry.row) body.insertBefore(entry.row, expected);
    previous = entry.row;
    const c = entry.cells;
    setText(c.queues, Array.isArray(w.queues) ? w.queues.join(", ") : "");
    setText(c.prefetch, fmtCount(w.prefetch));
    setText(c.inHandText, fmtCount(w.in_hand));
    const share = w.prefetch > 0 ? Math.min(1, (w.in_hand || 0) / w.prefetch) : 0;
    c.meter.style.width = `${Math.round(share * 100)}%`;
    setText(c.oldest, typeof w.oldest_since === "number" ? fmtDuration(at - w.oldest_since) : "–");
    const since = typeof w.connected_at === "number" ? w.connected_at : null;
    setText(c.connected_at, since === null ? "–" : `${fmtTime(since)} (${fmtDuration(at - since)})`);
    setText(c.last_seen_at, fmtAgo(w.last_seen_at, at));
    const broker = typeof w.broker === "string" ? w.broker : "";
    setText(c.broker, broker === ownUrl ? `${broker} (this one)` : broker);
    c.broker.hidden = !clusterView;
  }
  for (const th of document.querySelectorAll("#workers-table th.broker-col")) th.hidden = !clusterView;
  for (const [id, entry] of workerRows) {
    if (!seen.has(id)) {
      entry.row.remove();
      workerRows.delete(id);
    }
  }
  const total = typeof workers.total === "number" ? workers.total : list.length;
  let count = `${fmtCount(total)} connected`;
  if (total > list.length) count += ` (showing ${fmtCount(list.length)})`;
  setText($("workers-count"), count);
  $("workers-empty").hidden = list.length > 0;
  $("workers-table").hidden = list.length === 0;
}

// -- one worker: the jobs it holds ---------------------------------------------------------

function openWorker(id) {
  state.watch.worker = id;
  state.heldKey = null;
  $("held-body").replaceChildren();
  $("worker-card").hidden = false;
  setText($("worker-detail-id"), id);
  setText($("worker-detail-count"), "");
  showWorkerNote(`Loading the jobs of ${id}…`);
  $("held-table").hidden = true;
  sendWatch();
  $("worker-card").scrollIntoView({ block: "nearest", behavior: "smooth" });
}

function closeWorker() {
  state.watch.worker = null;
  $("worker-card").hidden = true;
  sendWatch();
}

function showWorkerNote(text) {
  const note = $("worker-detail-note");
  note.hidden = !text;
  setText(note, text || "");
}

const heldRows = new Map(); // job id -> {row, running}

function renderWorkerDetail(detail, at) {
  const wanted = state.watch.worker;
  const card = $("worker-card");
  if (!wanted) return;
  if (!detail || detail.worker_id !== wanted) return; // the next snapshot has it
  card.dataset.state = detail.gone ? "gone" : detail.here ? "here" : "elsewhere";
  const jobs = Array.isArray(detail.jobs) ? detail.jobs : [];
  if (detail.gone) {
    setText($("worker-detail-count"), "");
    showWorkerNote(`${wanted} is not connected (any more).`);
  } else if (!detail.here) {
    const held = fmtCount(detail.held);
    const oldest = typeof detail.oldest_since === "number" ? `, the oldest for ${fmtDuration(at - detail.oldest_since)}` : "";
    setText($("worker-detail-count"), `${held} in hand`);
    showWorkerNote(`Connected to another broker (${detail.broker ?? "?"}): it holds ${held} jobs${oldest}. That broker's dashboard lists them.`);
  } else {
    const held = typeof detail.held === "number" ? detail.held : jobs.length;
    let count = `${fmtCount(held)} in hand`;
    if (held > jobs.length) count += ` (showing the ${fmtCount(jobs.length)} longest-running)`;
    if (detail.connections > 1) count += ` on ${fmtCount(detail.connections)} connections`;
    setText($("worker-detail-count"), count);
    showWorkerNote(jobs.length ? "" : "It holds no jobs now.");
  }
  const key = JSON.stringify(jobs.map((j) => [j.id, j.queue, j.attempt, j.since]));
  if (key !== state.heldKey) {
    state.heldKey = key;
    heldRows.clear();
    $("held-body").replaceChildren(...jobs.map((job) => heldRow(job)));
  }
  for (const job of jobs) {
    const entry = heldRows.get(String(job.id));
    if (entry) setText(entry.running, typeof job.since === "number" ? fmtDuration(at - job.since) : "–");
  }
  $("held-table").hidden = jobs.length === 0;
}

function heldRow(job) {
  const id = String(job.id);
  const running = el("td", { class: "num", "data-field": "running_for" });
  const started = job.reattached ? `${fmtTime(job.since)} (re-attached)` : fmtTime(job.since);
  const row = el(
    "tr",
    { "data-testid": `held-row-${id}`, "data-job": id },
    el(
      "th",
      { scope: "row", class: "mono", "data-field": "id" },
      el("button", { type: "button", class: "link mono", text: id, title: "Follow this job", onclick: () => followJob(id) }),
    ),
    running,
    el("td", { "data-field": "queue", text: job.queue ?? "–" }),
    el("td", { class: "num", "data-field": "attempt", text: fmtCount(job.attempt) }),
    el("td", {
      "data-field": "since",
      text: started,
      title: job.reattached ? "when the worker re-attached its lease (after a reconnect): it started earlier" : fmtDate(job.since),
    }),
  );
  heldRows.set(id, { row, running });
  return row;
}

// -- dead letters -------------------------------------------------------------------------

function followDead(queues) {
  const names = Object.keys(queues).sort();
  const current = state.watch.deadQueue;
  if (state.deadChosen && current && current in queues) return;
  // Not chosen by the operator: follow the first queue holding dead letters.
  const kept = current && current in queues ? current : null;
  const pick = names.find((n) => queues[n].dead > 0) || kept || names[0] || null;
  if (pick !== current) chooseDeadQueue(pick, false);
}

function chooseDeadQueue(name, byOperator) {
  if (byOperator) state.deadChosen = true;
  if (state.watch.deadQueue === name) return;
  state.watch.deadQueue = name;
  state.watch.deadOffset = 0;
  $("dead-queue").value = name || "";
  clearDeadRows();
  state.deadKey = null;
  sendWatch();
  if (byOperator) $("dead-card").scrollIntoView({ block: "nearest", behavior: "smooth" });
}

function clearDeadRows() {
  $("dead-body").replaceChildren();
  setText($("dead-range"), "");
}

function renderDeadSelect(queues) {
  const select = $("dead-queue");
  const names = Object.keys(queues).sort();
  const have = Array.from(select.options, (o) => o.value);
  if (have.join("\n") !== names.join("\n")) {
    select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  }
  for (const option of select.options) {
    const q = queues[option.value];
    setText(option, q && q.dead > 0 ? `${option.value} (${fmtCount(q.dead)})` : option.value);
  }
  select.value = state.watch.deadQueue || "";
  select.disabled = names.length === 0;
}

function renderDead(dead, queues, at) {
  renderDeadSelect(queues);
  const body = $("dead-body");
  const admin = isAdmin();
  const page = dead && dead.queue === state.watch.deadQueue ? dead : null;
  const jobs = page && Array.isArray(page.jobs) ? page.jobs : [];
  // Rebuilt only when the page changed, so a selection or a click is not lost to a snapshot.
  const key = JSON.stringify([admin, jobs]);
  if (key !== state.deadKey) {
    state.deadKey = key;
    body.replaceChildren(...jobs.map((job) => deadRow(job, admin)));
  }
  const total = page ? page.total : 0;
  const offset = page ? page.offset : 0;
  $("dead-empty").hidden = jobs.length > 0;
  $("dead-table").hidden = jobs.length === 0;
  const queue = state.watch.deadQueue;
  let empty = "No dead letters.";
  if (queue) empty = page ? `No dead letters in ${queue}.` : `Loading the dead letters of ${queue}…`;
  setText($("dead-empty"), empty);
  setText($("dead-range"), total > 0 ? `${fmtCount(offset + 1)}–${fmtCount(offset + jobs.length)} of ${fmtCount(total)}` : "");
  $("dead-prev").disabled = !page || offset <= 0;
  $("dead-next").disabled = !page || offset + jobs.length >= total;
  const purge = $("purge-dead");
  purge.hidden = !admin || !state.watch.deadQueue;
  purge.disabled = total === 0;
  // The page went past the end (jobs redriven or purged): step back to the last one.
  if (page && jobs.length === 0 && offset > 0 && offset === state.watch.deadOffset) {
    state.watch.deadOffset = Math.max(0, Math.floor((total - 1) / DEAD_LIMIT) * DEAD_LIMIT);
    sendWatch();
  }
}

function deadRow(job, admin) {
  const id = String(job.id);
  const row = el(
    "tr",
    { "data-testid": `dead-row-${id}`, "data-job": id },
    el(
      "th",
      { scope: "row", class: "mono", "data-field": "id" },
      el("button", { type: "button", class: "link mono", text: id, title: "Follow this job", onclick: () => followJob(id) }),
    ),
    el("td", { class: "error-text", "data-field": "last_error", text: job.last_error ?? "" }),
    el("td", { class: "num", "data-field": "attempts", text: fmtCount(job.attempts) }),
    el("td", { "data-field": "died_at", text: fmtTime(job.died_at), title: fmtDate(job.died_at) }),
    el("td", { "data-field": "payload_preview" }, el("code", { class: "preview", text: job.payload_preview ?? "" })),
  );
  if (admin) {
    row.append(
      el(
        "td",
        { class: "actions-col" },
        el("button", { type: "button", "data-testid": `redrive-${id}`, text: "Redrive", onclick: () => act("redrive", { id }) }),
        el("button", {
          type: "button",
          class: "danger",
          "data-testid": `cancel-dead-${id}`,
          text: "Cancel",
          onclick: () => act("cancel", { id }, `Cancel job ${id}? It is deleted for good.`),
        }),
      ),
    );
  }
  return row;
}

function pageDead(step) {
  const offset = Math.max(0, state.watch.deadOffset + step * DEAD_LIMIT);
  if (offset === state.watch.deadOffset) return;
  state.watch.deadOffset = offset;
  sendWatch();
}

// -- the followed job ---------------------------------------------------------------------

const JOB_FIELDS = [
  ["id", "text"],
  ["queue", "text"],
  ["state", "state"],
  ["progress", "progress"],
  ["priority", "count"],
  ["attempts", "count"],
  ["max_attempts", "count"],
  ["visibility_timeout_s", "seconds"],
  ["backoff_base_s", "seconds"],
  ["backoff_max_s", "seconds"],
  ["enqueued_at", "time"],
  ["ready_at", "time"],
  ["expires_at", "time"],
  ["worker_id", "text"],
  ["deadline", "time"],
  ["last_error", "text"],
  ["died_at", "time"],
  ["completed_at", "time"],
  ["key", "text"],
  ["waiting_for", "count"],
  ["after", "jobs"],
  ["payload", "json"],
  ["result", "json"],
];
// Shown only for a completed job: the result its handler returned, and when it was acked.
const COMPLETED_FIELDS = new Set(["completed_at", "result"]);
// Shown only for a job with dependencies: how many it still waits for, and which they are.
const DEPENDENCY_FIELDS = new Set(["waiting_for", "after"]);

// The ids of other jobs (a job's dependencies), each a link that follows it here.
function jobLinks(ids) {
  const list = el("ul", { class: "job-links" });
  for (const id of Array.isArray(ids) ? ids : []) {
    const text = String(id);
    list.append(el("li", {}, el("button", { type: "button", class: "link mono", text, title: "Follow this job", onclick: () => followJob(text) })));
  }
  return list;
}

// A job's progress as its handler reported it (job.progress): [fraction, label]. A number
// from 0 to 1 is a fraction, so is an object's `value`; an object's `message` is shown
// after it. Anything else is shown as JSON, with no bar.
function progressOf(progress) {
  let value = progress;
  let message = null;
  if (progress && typeof progress === "object" && !Array.isArray(progress) && "value" in progress) {
    value = progress.value;
    if (typeof progress.message === "string") message = progress.message;
  }
  const fraction = typeof value === "number" && value >= 0 && value <= 1 ? value : null;
  const parts = [];
  if (fraction !== null) parts.push(`${Math.round(fraction * 100)}%`);
  else if (message === null) parts.push(fmtJson(progress));
  else if (value !== null && value !== undefined) parts.push(fmtJson(value));
  if (message !== null) parts.push(message);
  return [fraction, parts.join(" ")];
}

function progressView(progress) {
  const [fraction, label] = progressOf(progress);
  const text = el("span", { class: "progress-label", "data-testid": "job-progress-label", text: label });
  if (fraction === null) return text;
  const bar = el("progress", { max: "1", "data-testid": "job-progress", "aria-label": `progress ${label}` });
  bar.value = fraction;
  return el("span", { class: "progress-row" }, bar, text);
}

function followJob(id) {
  $("job-input").value = id;
  state.watch.job = id;
  $("job-clear").hidden = false;
  renderJob(null, state.last ? state.last.at : 0);
  sendWatch();
  $("job-card").scrollIntoView({ block: "nearest", behavior: "smooth" });
}

function fmtField(kind, value, at) {
  if (value === null || value === undefined) return "—";
  switch (kind) {
    case "count":
      return fmtCount(value);
    case "seconds":
      return typeof value === "number" ? `${value} s` : String(value);
    case "time": {
      if (typeof value !== "number") return String(value);
      const delta = value - at;
      const rel = Math.abs(delta) < 1 ? "now" : delta > 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
      return `${fmtTime(value)} (${rel})`;
    }
    case "json":
      return fmtJson(value);
    default:
      return typeof value === "string" ? value : fmtJson(value);
  }
}

function renderJob(job, at) {
  const view = $("job-view");
  const wanted = state.watch.job;
  const key = JSON.stringify([wanted, isAdmin(), job]);
  if (key === state.jobKey) {
    for (const [node, epoch] of state.jobTimes) setText(node, fmtField("time", epoch, at));
    return;
  }
  state.jobKey = key;
  state.jobTimes = [];
  if (!wanted) {
    view.dataset.state = "none";
    view.replaceChildren(el("p", { class: "empty", text: "Type a job id to follow it live." }));
    return;
  }
  if (!job || job.id !== wanted) {
    view.dataset.state = "loading";
    view.replaceChildren(el("p", { class: "empty", text: `Looking up ${wanted}…` }));
    return;
  }
  if (job.gone) {
    view.dataset.state = "gone";
    view.replaceChildren(
      el("p", { class: "empty", "data-testid": "job-gone", text: `No job ${wanted}: never enqueued, or gone (acked, cancelled or purged).` }),
    );
    return;
  }
  view.dataset.state = String(job.state);
  const list = el("dl", { class: "fields" });
  const known = new Set(JOB_FIELDS.map(([key]) => key));
  const fields = JOB_FIELDS.concat(Object.keys(job).filter((k) => !known.has(k)).map((k) => [k, "text"]));
  // Short values two to a row (when the card is wide), long ones across, after them.
  const isWide = ([key, kind]) => kind === "json" || kind === "jobs" || (typeof job[key] === "string" && job[key].length > 40);
  const ordered = fields.filter((f) => !isWide(f)).concat(fields.filter(isWide));
  for (const [key, kind] of ordered) {
    if (COMPLETED_FIELDS.has(key) && job.state !== "completed") continue;
    if (kind === "progress" && (job[key] === null || job[key] === undefined)) continue;
    if (DEPENDENCY_FIELDS.has(key) && !(Array.isArray(job.after) && job.after.length)) continue;
    let value;
    if (kind === "progress") value = progressView(job[key]);
    else if (kind === "state") value = el("span", { class: `pill state-${job.state}`, text: String(job.state) });
    else if (kind === "jobs") value = jobLinks(job[key]);
    else if (kind === "json") value = el("pre", { class: "payload", text: fmtField(kind, job[key], at) });
    else value = fmtField(kind, job[key], at);
    const wide = isWide([key, kind]);
    const dd = el("dd", {}, value);
    if (kind === "time" && typeof job[key] === "number") state.jobTimes.push([dd, job[key]]);
    list.append(el("div", { "data-field": key, class: wide ? "wide" : null }, el("dt", { text: key }), dd));
  }
  const children = [list];
  if (isAdmin()) {
    const id = String(job.id);
    const actions = el("div", { class: "job-actions" });
    if (job.state === "dead") {
      actions.append(el("button", { type: "button", "data-testid": "job-redrive", text: "Redrive", onclick: () => act("redrive", { id }) }));
    }
    actions.append(
      el("button", {
        type: "button",
        class: "danger",
        "data-testid": "job-cancel",
        text: "Cancel job",
        onclick: () => act("cancel", { id }, `Cancel job ${id}? It is deleted for good.`),
      }),
    );
    children.push(actions);
  }
  view.replaceChildren(...children);
}

// -- schedules ------------------------------------------------------------------------------

// The Schedules card: a page of list_schedules, asked for on the dashboard's socket at most
// every few seconds while the page is visible, and at once after an action. The feed does
// not carry schedules; their relative times move with each snapshot. Every value the broker
// sends is set as text.
const SCHEDULES_LIMIT = 100;
const SCHEDULES_REFRESH_MS = 3000;

const schedules = {
  after: null, // where the page shown starts (the previous page's last id), null: the first
  back: [], // the `after` of each page before this one, for Previous
  next: null, // the page's `next`: where the following page starts
  list: [], // the page's schedules
  key: null, // what the rows were built from (relative times aside)
  times: [], // [cell, epoch, "in"/"ago"] refreshed on every snapshot
  asked: 0, // when the page was last asked for (ms)
  loading: false,
  forbidden: false,
};

// "every 5 min", "every 30 s", "every 2 h", "every 1.5 s", "every day".
function fmtEvery(seconds) {
  if (typeof seconds !== "number" || !(seconds > 0)) return "–";
  const units = [
    [86400, "d"],
    [3600, "h"],
    [60, "min"],
  ];
  for (const [size, unit] of units) {
    if (seconds >= size && seconds % size === 0) {
      const n = seconds / size;
      if (n === 1 && unit === "d") return "every day";
      return `every ${n} ${unit}`;
    }
  }
  return `every ${Number(seconds.toFixed(3))} s`;
}

// A schedule's timing in words, with its zone when the zone says when it fires: the
// words and the zone ("every 5 min", "") or ("cron 30 2 * * *", "(Europe/Paris)").
function fmtTiming(s) {
  if (typeof s.every_s === "number") return [fmtEvery(s.every_s), ""];
  const cron = String(s.cron ?? "");
  return [cron.startsWith("@") ? cron.slice(1) : `cron ${cron}`, `(${s.tz ?? "UTC"})`];
}

// The timing cell: the words and the zone, each on one line, so a narrow column breaks
// between them and never inside a cron expression.
function timingCell(s) {
  const [words, zone] = fmtTiming(s);
  const cell = el("td", { "data-field": "timing", title: s.cron ? `${s.cron} in ${s.tz}` : null });
  cell.append(el("span", { class: "when", text: words }));
  if (zone) cell.append(" ", el("span", { class: "when", text: zone }));
  return cell;
}

// How far a time is from the broker's now: "in 4 min", "5 s ago", "now".
function fmtRelative(epoch, at) {
  const delta = epoch - at;
  if (Math.abs(delta) < 1) return "now";
  return delta > 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
}

function scheduleState(s) {
  if (s.paused === true) return "paused";
  return typeof s.next_at === "number" ? "active" : "ended";
}

// Ask for the page again when it is due: at most every SCHEDULES_REFRESH_MS while the
// dashboard is visible (or at once: `now`).
function refreshSchedules(now = false) {
  if (!state.authed || schedules.forbidden || schedules.loading) return;
  if (document.visibilityState !== "visible" && !now) return;
  if (!now && Date.now() - schedules.asked < SCHEDULES_REFRESH_MS) return;
  loadSchedules();
}

async function loadSchedules() {
  schedules.loading = true;
  schedules.asked = Date.now();
  const fields = { limit: SCHEDULES_LIMIT };
  if (schedules.after !== null) fields.after = schedules.after;
  const asked = schedules.after;
  let reply;
  try {
    reply = await request("list_schedules", fields);
  } finally {
    schedules.loading = false;
  }
  if (asked !== schedules.after) return; // paged meanwhile: that page's answer comes
  if (!reply.ok) {
    const code = reply.error && reply.error.code;
    if (code === "forbidden") schedules.forbidden = true;
    if (code === "unknown_op") schedules.forbidden = true; // an older broker: no schedules
    $("schedules-card").hidden = schedules.forbidden;
    return;
  }
  const list = Array.isArray(reply.schedules) ? reply.schedules : [];
  if (list.length === 0 && schedules.after !== null) {
    // The page emptied (schedules deleted): back to the one before.
    schedules.after = schedules.back.pop() ?? null;
    loadSchedules();
    return;
  }
  schedules.list = list;
  schedules.next = typeof reply.next === "string" ? reply.next : null;
  renderSchedules(state.last ? state.last.at : Date.now() / 1000);
}

function pageSchedules(step) {
  if (step > 0) {
    if (schedules.next === null) return;
    schedules.back.push(schedules.after);
    schedules.after = schedules.next;
  } else {
    if (schedules.back.length === 0) return;
    schedules.after = schedules.back.pop();
  }
  schedules.key = null;
  refreshSchedules(true);
}

function renderSchedules(at) {
  const admin = isAdmin();
  const list = schedules.list;
  const key = JSON.stringify([admin, list]);
  if (key !== schedules.key) {
    schedules.key = key;
    schedules.times = [];
    $("schedules-body").replaceChildren(...list.map((s) => scheduleRow(s, admin)));
  }
  // A time as "14:05:00 (in 4 min)": two spans, so that a narrow column breaks between them.
  for (const [cell, epoch] of schedules.times) {
    const [time, rel] = cell.children;
    setText(time, fmtTime(epoch));
    setText(rel, `(${fmtRelative(epoch, at)})`);
    cell.title = fmtDate(epoch);
  }
  $("schedules-table").hidden = list.length === 0;
  $("schedules-empty").hidden = list.length > 0;
  const first = schedules.back.length * SCHEDULES_LIMIT;
  const paged = schedules.back.length > 0 || schedules.next !== null;
  $("schedules-pager").hidden = !paged;
  setText($("schedules-range"), list.length ? `${fmtCount(first + 1)}–${fmtCount(first + list.length)}` : "");
  $("schedules-prev").disabled = schedules.back.length === 0;
  $("schedules-next").disabled = schedules.next === null;
  setText($("schedules-count"), paged ? "" : list.length === 1 ? "1 schedule" : `${fmtCount(list.length)} schedules`);
}

function timeCell(field, epoch) {
  if (typeof epoch !== "number") return el("td", { "data-field": field, text: "–" });
  const cell = el("td", { "data-field": field }, el("span", { class: "when" }), " ", el("span", { class: "when" }));
  schedules.times.push([cell, epoch]);
  return cell;
}

function scheduleRow(s, admin) {
  const id = String(s.id);
  const status = scheduleState(s);
  const lastJob = typeof s.last_job === "string" ? s.last_job : null;
  const row = el(
    "tr",
    { "data-testid": `schedule-row-${id}`, "data-schedule": id, "data-state": status },
    el("th", { scope: "row", class: "mono", "data-field": "id", text: id }),
    el("td", { "data-field": "queue", text: s.queue ?? "" }),
    timingCell(s),
    timeCell("next_at", status === "active" ? s.next_at : null),
    timeCell("last_at", s.last_at),
    el(
      "td",
      { "data-field": "last_job" },
      lastJob === null
        ? "–"
        : el("button", { type: "button", class: "link mono", text: lastJob, title: "Follow this job", onclick: () => followJob(lastJob) }),
    ),
    el("td", { class: "num", "data-field": "fired", text: fmtCount(s.fired) }),
    el("td", { "data-field": "state" }, el("span", { class: status === "paused" ? "pill paused" : "pill active", text: status })),
    el("td", { "data-field": "payload" }, el("code", { class: "preview", text: payloadPreview(s.payload) })),
  );
  if (admin) {
    const paused = s.paused === true;
    row.append(
      el(
        "td",
        { class: "actions-col" },
        el("button", {
          type: "button",
          "data-testid": `schedule-${paused ? "resume" : "pause"}-${id}`,
          text: paused ? "Resume" : "Pause",
          onclick: () => scheduleAct(paused ? "resume_schedule" : "pause_schedule", id),
        }),
        el("button", { type: "button", "data-testid": `schedule-run-${id}`, text: "Run now", onclick: () => scheduleAct("run_schedule", id) }),
        el("button", {
          type: "button",
          class: "danger",
          "data-testid": `schedule-delete-${id}`,
          text: "Delete",
          onclick: () => scheduleAct("delete_schedule", id, `Delete schedule ${id}? The jobs it made stay.`),
        }),
      ),
    );
  }
  return row;
}

async function scheduleAct(op, id, confirmText) {
  const reply = await act(op, { id }, confirmText);
  if (reply) refreshSchedules(true);
}

// -- admin actions ------------------------------------------------------------------------

const DONE = {
  pause: (f) => `Paused ${f.queue}.`,
  resume: (f) => `Resumed ${f.queue}.`,
  redrive: (f, r) => (r.redriven ? `Redrove ${f.id}.` : `${f.id} was not dead any more.`),
  purge_dead: (f, r) => `Purged ${fmtCount(r.purged)} dead letters of ${f.queue}.`,
  cancel: (f, r) => (r.cancelled ? `Cancelled ${f.id}.` : `${f.id} no longer existed.`),
  cancel_batch: (f, r) => {
    const done = Array.isArray(r.cancelled) ? r.cancelled.filter(Boolean).length : 0;
    const gone = f.ids.length - done;
    const more = gone ? ` (${fmtCount(gone)} no longer existed)` : "";
    return `Cancelled ${fmtCount(done)} ${done === 1 ? "job" : "jobs"}${more}.`;
  },
  set_limits: (f, r) =>
    hasLimits(r.limits) ? `Limits of ${f.queue}: ${fmtLimits(r.limits)}.` : `${f.queue} has no limits now.`,
  pause_schedule: (f, r) => (r.schedule ? `Paused schedule ${f.id}.` : `No schedule ${f.id} any more.`),
  resume_schedule: (f, r) => (r.schedule ? `Resumed schedule ${f.id}.` : `No schedule ${f.id} any more.`),
  run_schedule: (f, r) => (r.id ? `Enqueued ${r.id} from schedule ${f.id}.` : `No schedule ${f.id} any more.`),
  delete_schedule: (f, r) => (r.deleted ? `Deleted schedule ${f.id}.` : `No schedule ${f.id} any more.`),
  redrive_all: (f, r) => `Redrove ${fmtCount(r.redriven)} dead ${r.redriven === 1 ? "job" : "jobs"} of ${f.queue}.`,
};

async function act(op, fields, confirmText) {
  if (confirmText && !window.confirm(confirmText)) return null;
  const reply = await request(op, fields);
  if (reply.ok) notice(DONE[op] ? DONE[op](fields, reply) : `${op}: done`, "ok");
  else notice(`${op} refused: ${refusal(reply.error)}`, "error");
  return reply;
}

// The broker's message, naming the field it refused when the message does not.
function refusal(error) {
  const message = error.message || error.code;
  const field = typeof error.field === "string" ? error.field : "";
  return field && !String(message).startsWith(`${field}:`) ? `${field}: ${message}` : message;
}

// -- start --------------------------------------------------------------------------------

function start() {
  $("token-form").addEventListener("submit", onTokenSubmit);
  $("dead-queue").addEventListener("change", (e) => chooseDeadQueue(e.target.value || null, true));
  $("queue-detail-close").addEventListener("click", closeQueue);
  for (const tab of $("jobs-tabs").querySelectorAll("button[data-state]")) {
    tab.addEventListener("click", () => chooseJobState(tab.dataset.state));
  }
  $("jobs-search").addEventListener("input", onSearchInput);
  $("jobs-prev").addEventListener("click", () => pageJobs(-1));
  $("jobs-next").addEventListener("click", () => pageJobs(1));
  $("jobs-select-all").addEventListener("change", onSelectAll);
  $("jobs-cancel").addEventListener("click", cancelSelected);
  $("jobs-redrive-all").addEventListener("click", redriveAll);
  $("worker-detail-close").addEventListener("click", closeWorker);
  $("limits-form").addEventListener("submit", saveLimits);
  $("limits-clear").addEventListener("click", clearLimits);
  $("limits-form").addEventListener("input", () => {
    limitsForm.dirty = true;
  });
  $("schedules-prev").addEventListener("click", () => pageSchedules(-1));
  $("schedules-next").addEventListener("click", () => pageSchedules(1));
  document.addEventListener("visibilitychange", () => refreshSchedules());
  $("dead-prev").addEventListener("click", () => pageDead(-1));
  $("dead-next").addEventListener("click", () => pageDead(1));
  $("purge-dead").addEventListener("click", () => {
    const queue = state.watch.deadQueue;
    if (queue) act("purge_dead", { queue }, `Purge every dead letter of ${queue}? They are deleted for good.`);
  });
  $("job-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("job-input").value.trim();
    if (id) followJob(id);
  });
  $("job-clear").addEventListener("click", () => {
    state.watch.job = null;
    $("job-input").value = "";
    $("job-clear").hidden = true;
    renderJob(null, 0);
    sendWatch();
  });
  // For tests and the console: a request on the dashboard's own connection.
  window.conveyorDashboard = Object.freeze({ request: (op, fields) => request(op, fields ?? {}) });
  connect();
}

start();
