// The operator's page: the inventory (/api/inventory: one page of it, filtered,
// sorted and cut on the server, with the whole fleet's counts) and the live event
// feed (/api/events, server-sent events). No libraries: everything is drawn here.
"use strict";

const state = { inv: null, skew: 0, events: [], seen: new Set(),
  q: { ns: "", pod: "", root: "", expiry: "", sort: "expiry", order: "asc", offset: 0, limit: 100 } };
const $ = (s) => document.querySelector(s);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const now = () => Date.now() + state.skew;

// human: a duration in ms as "3d 4h", "12m 5s", "-2m 1s".
function human(ms) {
  const neg = ms < 0; ms = Math.abs(ms);
  const s = Math.floor(ms / 1000), units = [["y", 31536000], ["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
  const parts = [];
  let rest = s;
  for (const [u, n] of units) {
    if (rest >= n || (u === "s" && parts.length === 0)) { parts.push(Math.floor(rest / n) + u); rest %= n; }
    if (parts.length === 2) break;
  }
  return (neg ? "-" : "") + parts.join(" ");
}
// health: ok / warn / bad by the fraction of lifetime left.
function health(left, life) {
  if (left <= 0) return "bad";
  const f = left / life;
  return f < 0.2 ? "bad" : f < 0.5 ? "warn" : "ok";
}

// sum adds a map's counts; failures are the last hour's NACKs and renewal retries.
const sum = (m) => Object.values(m || {}).reduce((a, b) => a + b, 0);
const failures = (h) => (h?.sds_nacks || 0) + (h?.xds_nacks || 0) + (h?.renewals?.retry || 0);

// loads counts load() calls: only the answer to the latest is shown. A reload the
// live feed started before a click (next page, a filter) can answer after it, and
// would put the old page back.
let loads = 0;

async function load() {
  const mine = ++loads;
  try {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(state.q)) if (v !== "" && !(k === "offset" && v === 0)) params.set(k, v);
    const r = await fetch("api/inventory?" + params, { cache: "no-store" });
    if (!r.ok) throw new Error(await r.text());
    const inv = await r.json();
    if (mine !== loads) return;
    state.skew = Date.parse(inv.now) - Date.now();
    const before = new Set((state.inv?.certificates || []).map((c) => c.serial));
    state.inv = inv;
    render(before);
  } catch (e) {
    if (mine !== loads) return;
    $("#summary").innerHTML = `<span class="chip bad">inventory: ${esc(e.message)}</span>`;
  }
}

function render(before) {
  const inv = state.inv, t = now();
  const certs = inv.certificates || [], n = inv.counts || {};
  const soon = n.expire_within_1h || 0, expired = n.expired || 0;
  const roots = inv.trust?.roots || [];
  const chip = (v, label, cls = "") => `<span class="chip ${cls}"><b>${v}</b>${label}</span>`;
  // Every certificate the table lists, those of pods that said they stopped
  // included (rows marked "down"), so that the count and the table agree.
  $("#summary").innerHTML = chip((n.certificates || 0) + (n.down || 0), "certificates") +
    (n.down ? chip(n.down, "of stopped pods", "muted") : "") + chip(n.pods || 0, "pods") +
    chip(soon, "expire within 1h", soon ? "warn" : "") + chip(expired, "expired", expired ? "bad" : "") +
    chip(roots.length, "roots") +
    chip(sum(n.last_hour?.issued), "issued in the last hour") + chip(sum(n.last_hour?.renewals), "renewals sent in the last hour") +
    chip(failures(n.last_hour), "failures in the last hour", failures(n.last_hour) ? "bad" : "") + (inv.trust ? chip(inv.trust.generation, "bundle generation") : "") +
    (inv.skipped?.length ? `<span class="chip bad" title="${esc(inv.skipped.map((k) => k.key + ": " + k.reason).join("\n"))}"><b>${inv.skipped.length}</b>malformed record(s) skipped</span>` : "") +
    (inv.bench_hidden ? chip(inv.bench_hidden, "meshctl bench certificates not shown", "muted") : "") +
    // A replica that has just started serves while it reads the inventory.
    (inv.loading ? chip(inv.loading.remaining, "records still loading: counts are partial", "warn") : "");

  const body = $("#certs tbody");
  body.innerHTML = certs.map((c) => {
    const nb = Date.parse(c.not_before), na = Date.parse(c.not_after), life = na - nb, left = na - t;
    const h = health(left, life), pct = Math.max(0, Math.min(100, (100 * left) / life));
    const cls = (c.down ? "down " : "") + (before && before.size && !before.has(c.serial) ? "flash" : "");
    return `<tr class="${cls}" data-pod="${esc(c.pod)}" data-serial="${esc(c.serial)}">
      <td>${esc(c.pod || "—")}${c.down ? ' <span class="muted">(down)</span>' : ""}</td>
      <td class="id mono" title="${esc(c.spiffe_id)}">${esc(c.spiffe_id)}</td>
      <td class="mono" title="${esc(c.serial)}">${esc(c.serial.slice(0, 12))}</td>
      <td><div class="bar" title="${pct.toFixed(0)}% of ${human(life)} left"><i class="${h}" style="width:${pct}%"></i><s style="left:50%"></s></div></td>
      <td class="${h}">${left > 0 ? human(left) : "expired " + human(-left) + " ago"}</td>
      <td>${esc(c.signer)}</td>
      <td class="mono" title="${esc(c.root)}">${esc(c.root.slice(0, 12))}</td>
      <td>${c.sds_streams || 0} stream(s)</td>
      <td>${c.renewals}</td></tr>`;
  }).join("");
  $("#nocerts").hidden = certs.length > 0;
  tools(inv, roots);

  // The newest root signs; any other is leaving the bundle as its certificates renew.
  const newest = roots.reduce((a, r) => (!a || Date.parse(r.not_before) > Date.parse(a.not_before) ? r : a), null);
  $("#roots").innerHTML = roots.map((r) => {
    const nb = Date.parse(r.not_before), na = Date.parse(r.not_after), left = na - t, h = health(left, na - nb);
    const pct = Math.max(0, Math.min(100, (100 * left) / (na - nb)));
    const role = roots.length < 2 ? "signs" : r === newest ? "signs now" : "leaving";
    const held = (n.roots || {})[r.fingerprint] || 0;
    return `<div class="root" data-root="${esc(r.fingerprint)}" data-role="${role}">
      <div><span class="mono">${esc(r.fingerprint.slice(0, 16))}</span> <span class="muted">${esc(r.subject)}</span>
        <span class="chip ${role === "leaving" ? "warn" : ""}">${role}</span> <span class="muted">${held} certificate(s)</span></div>
      <div class="bar"><i class="${h}" style="width:${pct}%"></i></div>
      <div class="${h}">expires in ${human(left)} <span class="muted">(${new Date(na).toISOString().slice(0, 10)})</span></div></div>`;
  }).join("") || '<p class="muted">No trust.changed seen yet.</p>';
  timeline();
}

// tools fills the table's filter, sort and paging controls from the fleet's counts.
function tools(inv, roots) {
  const sel = (id, opts, cur) => {
    const el = $(id), html = opts.map(([v, l]) => `<option value="${esc(v)}"${v === cur ? " selected" : ""}>${esc(l)}</option>`).join("");
    if (el.dataset.html !== html) { el.innerHTML = html; el.dataset.html = html; }
  };
  const nss = Object.keys(inv.counts?.namespaces || {}).sort();
  sel("#f-ns", [["", "all namespaces"], ...nss.map((ns) => [ns, `${ns} (${inv.counts.namespaces[ns]})`])], state.q.ns);
  sel("#f-root", [["", "any root"], ...roots.map((r) => [r.fingerprint, r.fingerprint.slice(0, 12)])], state.q.root);
  const from = inv.total ? inv.offset + 1 : 0, to = inv.offset + (inv.certificates || []).length;
  $("#range").textContent = `${from}–${to} of ${inv.total}`;
  $("#prev").disabled = inv.offset <= 0;
  $("#next").disabled = to >= inv.total;
}

function bindTools() {
  const set = (k, v) => { state.q[k] = v; state.q.offset = 0; load(); };
  $("#f-ns").onchange = (e) => set("ns", e.target.value);
  $("#f-root").onchange = (e) => set("root", e.target.value);
  $("#f-exp").onchange = (e) => set("expiry", e.target.value);
  $("#f-sort").onchange = (e) => { const [k, o] = e.target.value.split(":"); state.q.order = o; set("sort", k); };
  let typing;
  $("#f-pod").oninput = (e) => { clearTimeout(typing); typing = setTimeout(() => set("pod", e.target.value.trim()), 250); };
  $("#prev").onclick = () => { state.q.offset = Math.max(0, state.q.offset - state.q.limit); load(); };
  $("#next").onclick = () => { state.q.offset += state.q.limit; load(); };
}

// timeline draws one lane per current certificate: its validity, its renew-due mark
// (half its life), the renewals and renew requests the feed has seen for its pod.
function timeline() {
  drawing = false;
  const svg = $("#timeline"), certs = (state.inv?.certificates || []).filter((c) => !c.down);
  const W = svg.clientWidth || 900, lane = 26, top = 18, left = 110, right = 10;
  const H = top + Math.max(1, certs.length) * lane + 8;
  svg.setAttribute("height", H);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const t = now();
  // The future up to the last expiry; the past one and a half times as long (at least
  // five minutes), so that the renewals that led here show.
  let future = 60e3;
  for (const c of certs) future = Math.max(future, Date.parse(c.not_after) - t);
  future = Math.min(future, 7 * 86400e3);
  const past = Math.max(5 * 60e3, future * 1.5);
  const span = past + future;
  const t0 = t - past, t1 = t + future * 1.04;
  const x = (ms) => left + ((ms - t0) / (t1 - t0)) * (W - left - right);
  const clamp = (v) => Math.max(left, Math.min(W - right, v));
  const out = [];
  const unit = span > 20 * 60e3 ? 60e3 : 1e3; // labels in whole minutes on a long axis
  for (let i = 0; i < 6; i++) {
    const ms = t0 + ((t1 - t0) * i) / 6, X = x(ms), d = Math.round(Math.abs(ms - t) / unit) * unit;
    out.push(`<line class="grid" x1="${X}" x2="${X}" y1="${top - 4}" y2="${H}"/>`);
    out.push(`<text x="${X + 2}" y="11">${ms < t ? "−" : "+"}${human(d)}</text>`);
  }
  // The feed's events by pod, once a drawing: each lane reads only its own pod's.
  const byPod = new Map();
  for (const e of state.events) {
    if (!e.pod) continue;
    if (!byPod.has(e.pod)) byPod.set(e.pod, []);
    byPod.get(e.pod).push(e);
  }
  certs.forEach((c, i) => {
    const mine = byPod.get(c.pod) || [];
    const y = top + i * lane, nb = Date.parse(c.not_before), na = Date.parse(c.not_after);
    const h = health(na - t, na - nb), x0 = clamp(x(nb)), x1 = clamp(x(na)), due = x(nb + (na - nb) / 2);
    out.push(`<text x="4" y="${y + 14}">${esc((c.pod || c.spiffe_id).slice(0, 16))}</text>`);
    // The certificates it replaced, from the feed: a thin bar from each one's start
    // to its replacement, so the renewals read as a chain.
    const past = mine.filter((e) => e.type === "cert.issued" && e.data && e.data.serial !== c.serial)
      .sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
    past.forEach((e, j) => {
      const end = j + 1 < past.length ? Date.parse(past[j + 1].time) : Date.parse(c.issued || c.not_before);
      const a = clamp(x(Date.parse(e.data.not_before))), b = clamp(x(Math.min(end, Date.parse(e.data.not_after))));
      if (b - 2 > a) out.push(`<rect class="past" x="${a}" y="${y + lane - 7}" width="${b - a - 2}" height="3" rx="1"><title>${esc(e.data.serial)} (replaced)</title></rect>`);
    });
    out.push(`<rect class="valid ${h}" x="${x0}" y="${y + 2}" width="${Math.max(1, x1 - x0)}" height="${lane - 11}" rx="3"><title>${esc(c.serial)}: ${clock(nb)} – ${clock(na)}</title></rect>`);
    if (due > left && due < W - right) out.push(`<line class="due" x1="${due}" x2="${due}" y1="${y + 2}" y2="${y + lane - 3}"/>`);
    for (const e of mine) {
      if (Date.parse(e.time) < t0) continue;
      const ex = x(Date.parse(e.time));
      if (e.type === "cert.issued") out.push(`<circle class="issued" cx="${ex}" cy="${y + lane / 2 - 1}" r="4"><title>issued ${esc(e.data?.serial)}</title></circle>`);
      if (e.type === "rotation.renew_due") out.push(`<path class="renew" d="M${ex - 4},${y + lane - 4} l4,-8 l4,8 z"><title>renew (${esc(e.data?.reason)})</title></path>`);
    }
  });
  const nx = x(t);
  out.push(`<line class="now" x1="${nx}" x2="${nx}" y1="${top - 4}" y2="${H}"/>`);
  svg.innerHTML = out.join("");
}

// drawSoon draws the timeline at the next frame, once however many events came
// before it. A new page is sent the feed's backlog as one message an event (300
// at fleet size), and drawing the timeline for each forced a layout each time:
// the page took 4× as long to be complete at 2,000 certificates as at 5 (issue 36).
let drawing = false;
function drawSoon() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => drawing && timeline());
}

// clock: a time as HH:MM:SS, local.
function clock(t) {
  const d = new Date(t), p = (n) => String(n).padStart(2, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

function feed(e) {
  if (e.id && state.seen.has(e.id)) return; // the backlog again, after a reconnect
  if (e.id) state.seen.add(e.id);
  state.events.push(e);
  // The ids of the events kept, no more: a reconnect's backlog (the server's last
  // 300) is among them, and a page left open through a fleet's worth of events
  // does not keep an id for each.
  if (state.events.length > 500) state.seen.delete(state.events.shift().id);
  const li = document.createElement("li");
  const fail = /nack|down|disconnected/.test(e.type) || e.error;
  if (fail) li.className = "fail";
  li.dataset.type = e.type;
  li.innerHTML = `<span class="t">${clock(e.time)}</span><span class="k">${esc(e.type)}</span><span>${esc(e.text || e.error)}</span>`;
  const list = $("#feed");
  list.prepend(li);
  while (list.children.length > 200) list.lastChild.remove();
}

function connect() {
  const es = new EventSource("api/events");
  const conn = $("#conn");
  es.onopen = () => { conn.textContent = "live"; conn.className = "conn live"; };
  es.onerror = () => { conn.textContent = "reconnecting…"; conn.className = "conn down"; };
  es.addEventListener("ev", (m) => { feed(JSON.parse(m.data)); drawSoon(); });
  let pending = false;
  es.addEventListener("inventory", () => {
    if (pending) return;
    pending = true;
    setTimeout(() => { pending = false; load(); }, 150);
  });
}

bindTools();
load();
connect();
setInterval(() => state.inv && render(null), 5000);
window.addEventListener("resize", timeline);
