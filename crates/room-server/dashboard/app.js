// Room's dashboard. Plain JavaScript, no build step and nothing fetched from elsewhere: the
// daemon compiles this file into its binary. Every value from the daemon is set as text
// (never as markup), so nothing an agent wrote can run here.
"use strict";

// The page key: handed over once in the login redirect's fragment, kept in this origin's
// storage (which no other port's page can read), sent with every request beside the cookie.
const KEY_STORE = "room-dashboard-key";

const S = {
  csrf: null,
  ops: [],
  es: null,
  route: null,
  refreshTimer: null,
  pending: 0,
  reachable: true,
  logPage: 50,
};

// ---------- small helpers

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

function state(s) {
  const v = s === null || s === undefined ? "unknown" : String(s);
  return h("span", { class: "state " + v.replace(/[^a-z_]/g, "") }, v);
}

function when(ms) {
  if (!ms) return "";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function table(head, rows, caption) {
  return h("table", {},
    caption ? h("caption", { class: "muted" }, caption) : null,
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))
      : h("tr", {}, h("td", { colspan: head.length, class: "muted" }, "none"))));
}

function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter((p) => p[1] !== undefined && p[1] !== null && p[1] !== "")
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function pretty(v) {
  // scrollable regions take the keyboard's focus, so they can be scrolled without a mouse
  return h("pre", { tabindex: "0" }, JSON.stringify(v, null, 2));
}

function link(href, text) {
  return h("a", { href }, text);
}

function enc(s) {
  return encodeURIComponent(s);
}

class Refused extends Error {
  constructor(r) {
    super(r ? `${r.code}: ${r.message}` : "refused");
    this.refusal = r;
  }
}

function refusalBox(e) {
  const r = e.refusal;
  if (!r) return h("p", { class: "error", role: "alert" }, String(e.message || e));
  return h("div", { class: "error", role: "alert" },
    h("p", {}, h("strong", {}, r.code), ": ", r.message),
    r.hint ? h("p", {}, "hint: ", r.hint) : null);
}

function banner(text) {
  const b = document.getElementById("banner");
  if (text) {
    b.textContent = text;
    b.hidden = false;
  } else {
    b.hidden = true;
    b.textContent = "";
  }
}

function setConn(text, cls) {
  const c = document.getElementById("conn");
  c.textContent = text;
  c.className = "conn " + (cls || "");
}

// ---------- the daemon

async function api(op, args) {
  let r;
  try {
    r = await fetch("/api/call", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json", "x-room-csrf": S.csrf || "" },
      body: JSON.stringify({ op, args: args || {} }),
      cache: "no-store",
    });
  } catch (e) {
    unreachable();
    throw new Error("the daemon is unreachable");
  }
  reached();
  let j;
  try {
    j = await r.json();
  } catch (e) {
    throw new Error(`the daemon answered ${r.status} without JSON`);
  }
  if (r.status === 401 || (r.status === 403 && j.refusal && j.refusal.code === "csrf_invalid")) loggedOut(j.refusal);
  if (!j.ok) throw new Refused(j.refusal);
  return j.result;
}

function unreachable() {
  if (!S.reachable) return;
  S.reachable = false;
  setConn("daemon unreachable", "down");
  banner("The Room daemon is not answering. Is it running? Start it with `room serve --listen 127.0.0.1:PORT`; this page reconnects by itself.");
}

function reached() {
  if (S.reachable) return;
  S.reachable = true;
  banner(null);
}

function loggedOut(refusal) {
  S.csrf = null;
  try { localStorage.removeItem(KEY_STORE); } catch (e) { /* storage refused: nothing kept */ }
  if (S.es) S.es.close();
  setConn("logged out", "down");
  const main = document.getElementById("main");
  main.replaceChildren(
    h("h1", {}, "Not logged in"),
    h("p", {}, refusal ? refusal.message : "This browser has no session."),
    h("p", {}, "Run ", h("code", {}, "room dashboard"), " on the machine where Room runs and open the link it prints. Each link works once and expires in two minutes."));
}

function session() {
  return fetch("/api/session", { credentials: "same-origin", cache: "no-store", headers: { "x-room-csrf": S.csrf || "" } });
}

let booted = false;

async function boot() {
  if (!booted) {
    booted = true;
    document.getElementById("logout").addEventListener("click", logout);
    window.addEventListener("hashchange", () => render());
    // the skip link moves focus, not the route
    document.querySelector(".skip").addEventListener("click", (ev) => {
      ev.preventDefault();
      document.getElementById("main").focus();
    });
    if (location.hash.startsWith("#k=")) {
      try { localStorage.setItem(KEY_STORE, location.hash.slice(3)); } catch (e) { /* below */ }
      history.replaceState(null, "", "/#/rooms");
    }
  }
  try { S.csrf = localStorage.getItem(KEY_STORE); } catch (e) { S.csrf = null; }
  if (!S.csrf) {
    loggedOut(null);
    return;
  }
  let r;
  try {
    r = await session();
  } catch (e) {
    unreachable();
    setTimeout(boot, 3000);
    return;
  }
  const j = await r.json().catch(() => ({}));
  if (!j.ok) {
    loggedOut(j.refusal);
    return;
  }
  reached();
  S.ops = j.result.ops || [];
  openEvents();
  if (!location.hash) location.hash = "#/rooms";
  else render();
  refreshApprovalCount();
}

async function logout() {
  try {
    await fetch("/api/logout", {
      method: "POST", credentials: "same-origin",
      headers: { "content-type": "application/json", "x-room-csrf": S.csrf || "" }, body: "{}",
    });
  } finally {
    loggedOut(null);
  }
}

// ---------- live events

const live = [];

function openEvents() {
  if (S.es) S.es.close();
  // an EventSource sends no header of its own: the page key rides in the query
  const es = new EventSource(`/api/events?k=${encodeURIComponent(S.csrf || "")}`);
  S.es = es;
  const onItem = (kind) => (m) => {
    let d = {};
    try { d = JSON.parse(m.data); } catch (e) { /* a keep-alive or a malformed item: skip */ }
    live.unshift({ kind, d, id: m.lastEventId });
    live.length = Math.min(live.length, 100);
    onLive(kind, d);
  };
  for (const k of ["event", "task", "wake", "room", "collab", "phase", "approval"]) {
    es.addEventListener(k, onItem(k));
  }
  // what the view loaded before the stream's start is read again: nothing falls between
  es.addEventListener("hello", () => { setConn("live", "live"); reached(); scheduleRefresh(0); });
  es.addEventListener("reset", () => { setConn("live", "live"); reached(); scheduleRefresh(0); });
  es.addEventListener("ended", (m) => {
    es.close();
    let d = {};
    try { d = JSON.parse(m.data); } catch (e) { /* empty */ }
    loggedOut({ message: d.message || "the session ended" });
  });
  es.onopen = () => { setConn("live", "live"); reached(); };
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) {
      // the stream was refused outright (a session that ended): ask why
      session()
        .then((r) => (r.status === 401 || r.status === 403 ? loggedOut(null) : setTimeout(openEvents, 3000)))
        .catch(() => { unreachable(); setTimeout(openEvents, 3000); });
    } else {
      setConn("reconnecting", "down");
      session().then(reached).catch(unreachable);
    }
  };
}

// What an item means for the view on screen: reload it (debounced) if it shows what moved.
function onLive(kind, d) {
  const r = S.route || {};
  if (kind === "approval") refreshApprovalCount();
  const log = document.getElementById("live-log");
  if (log) log.prepend(h("div", {}, `${kind}: ${summary(kind, d)}`));
  const touches =
    (r.view === "rooms" && (kind === "event" || kind === "room")) ||
    (r.view === "room" && (kind === "event" || kind === "task") && d.room === r.arg) ||
    (r.view === "task" && kind === "task" && d.task === r.arg) ||
    ((r.view === "wakes" || r.view === "sessions") && kind === "wake") ||
    (r.view === "wake" && kind === "wake" && d.wake === r.arg) ||
    (r.view === "collabs" && (kind === "collab" || kind === "phase")) ||
    (r.view === "collab" && (kind === "phase" || kind === "approval" || kind === "collab") && d.collab === r.arg) ||
    (r.view === "collab" && kind === "event" && S.collabRoom === d.room) ||
    (r.view === "approvals" && kind === "approval") ||
    (r.view === "identity" && kind === "event" && d.kind === "revoke");
  if (touches) scheduleRefresh(150);
}

function summary(kind, d) {
  switch (kind) {
    case "event": return `${d.room} #${d.seq} ${d.actor} ${d.kind}`;
    case "task": return `${d.room} task ${d.task} ${d.kind}`;
    case "wake": return `${d.wake} ${d.state}`;
    case "phase": return `${d.collab} ${d.phase} ${d.state}`;
    case "approval": return `${d.collab} approval ${d.phase} ${d.state}`;
    case "collab": return `${d.collab} ${d.state}`;
    default: return JSON.stringify(d);
  }
}

// Live process counts are no events: the workers' view looks again every two seconds.
setInterval(() => {
  if (S.csrf && S.route && S.route.view === "sessions" && !document.hidden) render({ keep: true });
}, 2000);

function scheduleRefresh(ms) {
  clearTimeout(S.refreshTimer);
  S.refreshTimer = setTimeout(() => render({ keep: true }), ms);
}

async function refreshApprovalCount() {
  try {
    const n = (await pendingApprovals()).length;
    document.getElementById("approval-count").textContent = n ? String(n) : "";
  } catch (e) { /* shown where it matters */ }
}

// ---------- routing

const VIEWS = {
  rooms: viewRooms, room: viewRoom, task: viewTask, wakes: viewWakes, wake: viewWake,
  sessions: viewSessions, identity: viewIdentity, collabs: viewCollabs, collab: viewCollab,
  approvals: viewApprovals,
};

function parseRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  const view = Object.hasOwn(VIEWS, parts[0]) ? parts[0] : "rooms";
  let arg = null;
  try {
    arg = parts.slice(1).map(decodeURIComponent).join("/") || null;
  } catch (e) {
    arg = null; // a malformed escape: the view without its argument
  }
  return { view, arg };
}

async function render(opts) {
  if (!S.csrf) return;
  const route = parseRoute();
  const same = S.route && S.route.view === route.view && S.route.arg === route.arg;
  S.route = route;
  for (const a of document.querySelectorAll("nav a")) {
    const on = a.dataset.view === route.view || (a.dataset.view + "s") === route.view ||
      (route.view === "room" && a.dataset.view === "rooms") || (route.view === "collab" && a.dataset.view === "collabs") ||
      (route.view === "wake" && a.dataset.view === "wakes");
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const main = document.getElementById("main");
  const keep = opts && opts.keep && same;
  const scroll = window.scrollY;
  let content;
  try {
    content = await VIEWS[route.view](route.arg, keep);
  } catch (e) {
    content = [h("h1", {}, "Could not load this view"), refusalBox(e)];
  }
  if (parseRoute().view !== route.view || parseRoute().arg !== route.arg) return; // moved on
  main.replaceChildren(...[content].flat(Infinity).filter((x) => x !== null && x !== undefined && x !== false));
  if (keep) window.scrollTo(0, scroll);
  else {
    const h1 = main.querySelector("h1");
    if (h1) { h1.tabIndex = -1; h1.focus({ preventScroll: true }); }
  }
  if (route.view === "room") drawEdges();
}

// A button that runs an action, shows its refusal in place and re-renders after it.
function act(label, cls, run, confirmText) {
  const out = h("span", { class: "act-out", role: "status" });
  const b = h("button", {
    type: "button", class: cls,
    onclick: async () => {
      if (confirmText && !window.confirm(confirmText)) return;
      b.disabled = true;
      out.replaceChildren();
      try {
        await run();
        scheduleRefresh(0);
      } catch (e) {
        out.replaceChildren(refusalBox(e));
      } finally {
        b.disabled = false;
      }
    },
  }, label);
  return h("span", {}, b, out);
}

// ---------- rooms

async function viewRooms() {
  const v = await api("rooms");
  const rows = v.rooms.map((r) => [
    link(`#/room/${enc(r.room)}`, r.room),
    (r.members || []).join(", "),
    r.tip_seq ?? "",
    [r.archived ? state("archived") : null, r.read_only ? state("read_only") : null,
      r.quarantined ? state("quarantined") : null, r.unusable ? state("unusable") : null],
  ]);
  return [
    h("h1", {}, "Rooms"),
    h("p", { class: "muted" }, `${v.rooms.length} rooms, ${v.open_now} open of at most ${v.open_max}.`),
    table(["Room", "Members", "Events", "State"], rows),
    h("h2", {}, "Live"),
    h("div", { id: "live-log", class: "live-log", "aria-live": "off", tabindex: "0", role: "log", "aria-label": "live events" },
      live.slice(0, 30).map((l) => h("div", {}, `${l.kind}: ${summary(l.kind, l.d)}`))),
  ];
}

async function viewRoom(room, keep) {
  const [members, obligations, wakes] = await Promise.all([
    api("room_members", { room }),
    api("wakes_obligations", { room }).catch((e) => ({ error: e })),
    api("wakes_list", { room }).catch(() => ({ wakes: [] })),
  ]);
  const tip = members.tip_seq;
  // the newest page follows the tip as events arrive; an older page stays where it is
  if (!keep || !S.logFrom || S.logRoom !== room) S.logFollow = true;
  if (S.logFollow) {
    S.logRoom = room;
    S.logFrom = Math.max(1, tip - S.logPage + 1);
  }
  const log = await api("room_log", { room, from: S.logFrom, limit: S.logPage });
  const tasks = new Map();
  for (const e of log.events) {
    const t = e.event && e.event.task;
    if (t) tasks.set(t, e.kind);
  }
  const head = [
    h("h1", {}, "Room ", h("code", {}, room)),
    h("div", { class: "actions" },
      act("Cancel all work", "danger", () => api("room_cancel", { room }),
        `Cancel every task, wake and worker in ${room}? Work stops and is confirmed at zero processes.`),
      act("Resume", "quiet", () => api("room_resume", { room })),
      act("Show holds", "quiet", async () => {
        const v = await api("room_reconcile", { room });
        S.holds = v;
      })),
    S.holds && S.holds.room === room ? holdsView(room, S.holds) : null,
    h("h2", {}, "Members"),
    table(["Member", "Confirmed", "Lag", "Conversations"], members.members.map((m) => [
      m.agent, m.confirmed_seq ?? h("span", { class: "muted" }, "nothing yet"), String(m.lag),
      m.conversations.map((c) => `${c.conversation} @${c.confirmed_seq}`).join(", "),
    ]), `tip #${tip}`),
    h("h2", {}, "Tasks on this page"),
    tasks.size ? h("ul", {}, [...tasks].map(([t, k]) => h("li", {}, link(`#/task/${enc(t)}`, t), " ", h("span", { class: "muted" }, `last: ${k}`))))
      : h("p", { class: "muted" }, "none on this page"),
    h("h2", {}, "Obligations"),
    obligations.error ? refusalBox(obligations.error) : obligationsTable(obligations),
    h("h2", {}, "Wakes"),
    wakesTable(wakes.wakes || []),
  ];
  return [head, timeline(room, log, tip)];
}

// What a cancel held until the owner reconciles it with what the destination shows.
function holdsView(room, v) {
  const holds = v.holds || [];
  return [
    h("h2", {}, `Held until reconciled (${v.unresolved} unresolved)`),
    table(["Hold", "Kind", "Item", "Agent", "Task", "State", ""], holds.map((x) => [
      h("code", {}, x.hold), x.kind, h("code", {}, x.item || ""), x.agent || "", x.task || "",
      x.held_until_reconciled ? state("held") : [state("done"), " ", x.reconciled.outcome, " by ", x.reconciled.by || ""],
      x.held_until_reconciled ? reconcileForm(room, x) : "",
    ])),
  ];
}

function reconcileForm(room, x) {
  const id = `rec-${x.hold}`;
  const outcome = h("select", { id: `${id}-outcome`, "aria-label": `outcome of ${x.hold}` },
    ["accepted", "not_accepted", "compensated"].map((o) => h("option", { value: o }, o.replace("_", " "))));
  const evidence = h("input", { type: "text", id: `${id}-evidence`, "aria-label": `evidence for ${x.hold}`, placeholder: "what the destination shows" });
  return h("div", {}, outcome, evidence, act(`Reconcile ${x.hold}`, "primary", async () => {
    await api("room_reconcile", { room, hold: x.hold, outcome: outcome.value, evidence: evidence.value });
    S.holds = await api("room_reconcile", { room });
  }));
}

function obligationsTable(v) {
  const list = v.obligations || [];
  return [
    table(["Obligation", "From", "Owed by", "Task", "Reply due", "State"], list.map((o) => [
      h("code", {}, o.id), o.from || "", o.to || "", o.task ? link(`#/task/${enc(o.task)}`, o.task) : "",
      when(o.not_after_ms), state(o.fold),
    ]), `${v.dead || 0} dead${v.truncated ? "; only the oldest are listed" : ""}`),
    (v.circular_waits || []).length ? h("p", { class: "flag" }, `circular waits: ${JSON.stringify(v.circular_waits)}`) : null,
  ];
}

function timeline(room, log, tip) {
  const evs = log.events;
  const first = evs.length ? evs[0].seq : S.logFrom;
  const list = h("ol", { class: "timeline-list" },
    evs.map((e) => eventRow(e)));
  // an SVG element, not an HTML one of that name: only it draws its paths
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "edges");
  svg.setAttribute("id", "edges");
  svg.setAttribute("aria-hidden", "true");
  const wrap = h("div", { class: "timeline", id: "timeline" }, svg, list);
  return [
    h("h2", {}, "Timeline"),
    h("p", { class: "muted" }, `events #${first}–#${evs.length ? evs[evs.length - 1].seq : first} of ${tip}; causal parents on this page are drawn on the left`),
    h("div", { class: "actions" },
      first > 1 ? h("button", {
        type: "button", onclick: () => { S.logFollow = false; S.logFrom = Math.max(1, first - S.logPage); render({ keep: true }); },
      }, `Older ${S.logPage}`) : null,
      S.logFrom + evs.length <= tip ? h("button", {
        type: "button", onclick: () => { S.logFollow = true; render({ keep: true }); },
      }, "Newest") : null),
    wrap,
  ];
}

function eventRow(e) {
  const b = e.event || {};
  const k = String(e.kind || "");
  // what the journal holds of refusals: an act an invariant rejected (recorded beside what
  // was not committed) and an assignment its recipient declined
  const declined = [b.transition, b.task_transition].some((t) => t && t.to === "declined");
  const refused = (k === "invariant_violation" && b.severity === "reject") || declined;
  const cls = ["ev", refused ? "refusal" : "", !refused && (k.includes("violation") || k.includes("invariant")) ? "violation" : "",
    k.includes("flag") ? "flag" : ""].join(" ");
  const why = k === "invariant_violation" ? ` · ${b.invariant} (${b.severity}) on ${b.act}` : declined ? " · declined" : "";
  const parents = [...new Set([...(Array.isArray(b.parents) ? b.parents : []), ...(b.reply_to ? [b.reply_to] : [])])];
  return h("li", { class: cls, id: `ev-${e.id}`, "data-id": e.id, "data-parents": parents.join(" ") },
    h("div", { class: "meta" }, `#${e.seq} · ${e.actor} · `, h("strong", {}, k), why, b.task ? [" · task ", link(`#/task/${enc(b.task)}`, b.task)] : null,
      parents.length ? [" · after ", parents.map((p, i) => [i ? ", " : "", h("a", {
        href: `#ev-${p}`,
        onclick: (ev) => { ev.preventDefault(); highlight(p); },
      }, p.slice(0, 10))])] : null),
    b.text ? h("div", { class: "text" }, b.text) : null,
    !b.text && k !== "message" ? h("details", {}, h("summary", {}, "body"), pretty(b)) : null);
}

function highlight(id) {
  const el = document.getElementById(`ev-${id}`);
  if (!el) return;
  el.classList.add("highlight");
  el.scrollIntoView({ block: "center" });
  setTimeout(() => el.classList.remove("highlight"), 1500);
}

// Draw each event's edges to its parents that are on this page.
function drawEdges() {
  const wrap = document.getElementById("timeline");
  const svg = document.getElementById("edges");
  if (!wrap || !svg) return;
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  svg.setAttribute("height", String(wrap.scrollHeight));
  const top = wrap.getBoundingClientRect().top;
  const y = (el) => el.getBoundingClientRect().top - top + 12;
  let lane = 0;
  for (const li of wrap.querySelectorAll("li.ev")) {
    for (const p of (li.dataset.parents || "").split(" ").filter(Boolean)) {
      const target = document.getElementById(`ev-${p}`);
      if (!target) continue;
      const x = 54 - (lane % 5) * 10;
      lane += 1;
      const path = document.createElementNS(ns, "path");
      path.setAttribute("d", `M60 ${y(li)} C ${x} ${y(li)}, ${x} ${y(target)}, 60 ${y(target)}`);
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", "#4a5058");
      path.setAttribute("stroke-width", "1.5");
      svg.append(path);
    }
  }
}

// ---------- tasks

async function viewTask(task) {
  const v = await api("owner_task_show", { task });
  const t = v.task || {};
  const lin = v.lineage || {};
  const checks = Array.isArray(t.acceptance) ? t.acceptance : [];
  return [
    h("h1", {}, "Task ", h("code", {}, task)),
    kv([
      ["Title", t.title], ["Status", state(t.status)], ["Stage", t.stage],
      ["Room", t.room ? link(`#/room/${enc(t.room)}`, t.room) : ""],
      ["Owner", t.owner], ["Recipient", t.recipient], ["Revision", t.revision],
      ["Successor", t.successor ? link(`#/task/${enc(t.successor)}`, t.successor) : null],
      ["Acceptance overridden", t.acceptance_override],
    ]),
    h("h2", {}, "Lineage"),
    table(["", "Task", "Status", "Recipient"], [
      ...(lin.ancestors || []).slice().reverse().map((a) => ["ancestor", link(`#/task/${enc(a.id)}`, a.id), state(a.status), a.recipient || ""]),
      ["this", h("code", {}, task), state(t.status), t.recipient || ""],
      ...(lin.children || []).map((c) => ["child", link(`#/task/${enc(c.id)}`, c.id), state(c.status), c.recipient || ""]),
    ]),
    h("h2", {}, "Lease"),
    v.lease ? kv([["Holder", v.lease.holder], ["Generation (fence)", v.lease.generation], ["Since", when(v.lease.since_ms)],
      ["Scopes", (v.lease.scopes || []).join(" ")]]) : h("p", { class: "muted" }, "no lease held"),
    h("h2", {}, "Acceptance"),
    checks.length ? table(["#", "Check"], checks.map((c, i) => [String(i + 1), h("code", {}, checkText(c))]))
      : h("p", { class: "muted" }, "the task declares no checks"),
    h("h3", {}, "Last measured"),
    v.last_acceptance ? evaluation(v.last_acceptance) : h("p", { class: "muted" }, "not measured yet"),
    h("div", { class: "actions" }, act("Measure acceptance now", "primary", async () => {
      S.lastCheck = { task, v: await api("owner_task_check", { task }) };
    })),
    S.lastCheck && S.lastCheck.task === task ? [h("h3", {}, "Measured now"), evaluation(S.lastCheck.v)] : null,
    h("details", {}, h("summary", {}, "Everything recorded"), pretty(v)),
  ];
}

function checkText(c) {
  if (typeof c !== "object" || !c) return String(c);
  const k = c.kind || "check";
  const rest = Object.entries(c).filter(([key]) => key !== "kind").map(([key, val]) => `${key}=${typeof val === "string" ? val : JSON.stringify(val)}`);
  return `${k} ${rest.join(" ")}`;
}

// An evaluation (the seed's Exhibit 4): a verdict and each check's result, rendered.
function evaluation(v) {
  const results = v.acceptance_results || [];
  return [
    h("p", {}, "Verdict: ", state(v.acceptance_pass ? "passed" : "failed")),
    table(["Check", "Result", "Detail"], results.map((r) => [
      h("code", {}, r.kind), state(r.pass ? "passed" : "failed"),
      typeof r.detail === "string" ? r.detail : h("details", {}, h("summary", {}, detailLine(r.detail)), pretty(r.detail)),
    ])),
  ];
}

function detailLine(d) {
  if (!d || typeof d !== "object") return String(d ?? "");
  const keys = ["reason", "path", "command", "exit_code", "artifact", "why"].filter((k) => d[k] !== undefined);
  return keys.length ? keys.map((k) => `${k}: ${typeof d[k] === "string" ? d[k] : JSON.stringify(d[k])}`).join(" · ") : "detail";
}

// ---------- wakes

// Wakes newest first, at most WAKES_SHOWN (the permit's binding is flattened into it).
const WAKES_SHOWN = 200;

function wakesTable(wakes) {
  const shown = wakes.slice(-WAKES_SHOWN).reverse();
  return table(["Wake", "Room", "Agent", "Task", "State", "Permit", "Deferred"], shown.map((w) => {
    const path = `wakes/${w.room}/${w.agent}/${w.source_event}.json`;
    return [link(`#/wake/${enc(path)}`, w.source_event ? w.source_event.slice(0, 16) : "?"), w.room, w.agent,
      w.task ? link(`#/task/${enc(w.task)}`, w.task) : "",
      state(w.state), w.intact ? "intact" : h("strong", { class: "error" }, "digest mismatch"),
      w.deferred ? h("code", {}, w.deferred) : ""];
  }), wakes.length > WAKES_SHOWN ? `the newest ${WAKES_SHOWN} of ${wakes.length}` : null);
}

async function viewWakes() {
  const v = await api("wakes_list", {});
  return [h("h1", {}, "Wakes"),
    h("p", { class: "muted" }, "Sealed permits and their dispatch: queued, dispatched, delivered, replied or dead."),
    v.truncated ? h("p", { class: "flag" }, "Only the oldest permits are listed.") : null,
    wakesTable(v.wakes)];
}

async function viewWake(path) {
  const v = await api("wakes_show", { wake: path });
  const w = v.wake;
  const binding = Object.fromEntries(Object.entries(w).filter(([k]) => !["state", "intact", "launches", "deferred", "dead_letter", "reason", "detail"].includes(k)));
  return [
    h("h1", {}, "Wake permit"),
    kv([["Path", h("code", {}, path)], ["State", state(w.state)],
      ["Intact", w.intact ? "the sealed fields match their digest" : "DIGEST MISMATCH: it will not dispatch"],
      ["Room", link(`#/room/${enc(w.room)}`, w.room)], ["Agent", w.agent], ["From", w.from],
      ["Task", w.task ? link(`#/task/${enc(w.task)}`, w.task) : ""],
      ["Deadline", `${w.deadline_ms} ms`], ["Not after", w.not_after], ["Control epoch", w.control_epoch],
      ["Deferred (why it waits)", w.deferred], ["Reason", w.reason]]),
    h("h2", {}, "Launches and their dispatch checks"),
    pretty(w.launches || []),
    w.dead_letter ? [h("h2", {}, "Dead letter"), pretty(w.dead_letter)] : null,
    h("h2", {}, "The sealed binding"),
    pretty(binding),
  ];
}

// ---------- sessions and workers

async function viewSessions() {
  const [v, workers, stops] = await Promise.all([
    api("sessions_list", {}), api("workers_list", {}), api("stops_list", {}).catch(() => ({ stops: [] })),
  ]);
  return [
    h("h1", {}, "Sessions and workers"),
    h("h2", {}, "Workers running now"),
    table(["Launch", "Room", "Agent", "Adapter", "Owned job", "Live processes", "Since"], workers.workers.map((w) => [
      h("code", {}, w.launch), link(`#/room/${enc(w.room)}`, w.room), w.agent, w.adapter, w.job,
      [String(w.processes), w.pids.length ? h("span", { class: "muted" }, ` (pids ${w.pids.join(", ")})`) : null], when(w.since_ms),
    ])),
    h("h2", {}, "Sessions"),
    table(["Session", "Agent", "Host", "Launch", "Proof", "Updated"], v.sessions.map((s) => [
      h("code", {}, s.id), s.agent, s.host || "", s.lease && s.lease.launch ? h("code", {}, s.lease.launch) : h("span", { class: "muted" }, "idle"),
      s.proof || "", when(s.updated_ms),
    ]), v.truncated ? "the newest sessions only" : null),
    h("h2", {}, "Stops"),
    table(["Stop", "Launch", "Room", "Agent", "Reason", "Confirmed at zero processes"], (stops.stops || []).map((x) => [
      h("code", {}, x.stop), h("code", {}, x.launch || ""), x.room || "", x.agent || "", x.reason || "",
      x.termination_confirmed ? state("done") : state("pending"),
    ])),
  ];
}

// ---------- identity

async function viewIdentity() {
  const v = await api("agent_list");
  const byParent = new Map();
  for (const a of v.agents) {
    const p = a.parent || "";
    if (!byParent.has(p)) byParent.set(p, []);
    byParent.get(p).push(a);
  }
  const names = new Set(v.agents.map((a) => a.name));
  const node = (a) => h("li", {},
    h("strong", {}, a.name), " ", h("span", { class: "muted" }, `${a.max_tier} · ${a.host} · gen ${a.generation}`), " ",
    a.revoked ? state("revoked") : act(`Revoke ${a.name}`, "danger", () => api("agent_revoke", { name: a.name }),
      `Revoke ${a.name}${byParent.has(a.name) ? " and every agent delegated from it" : ""}? Its next call is refused.`),
    a.scopes ? h("div", { class: "muted mono" }, a.scopes.join(" ")) : null,
    byParent.has(a.name) ? h("ul", {}, byParent.get(a.name).map(node)) : null);
  const roots = v.agents.filter((a) => !a.parent || !names.has(a.parent));
  return [
    h("h1", {}, "Identity"),
    h("p", { class: "muted" }, "Enrolled agents and the children delegated from them. Enrolling and rotating credentials stays on the owner console: no token ever reaches this page."),
    h("ul", { class: "tree" }, roots.map(node)),
  ];
}

// ---------- collaborations

async function viewCollabs() {
  const v = await api("collab_list");
  return [
    h("h1", {}, "Collaborations"),
    h("div", { class: "actions" }, h("button", { type: "button", class: "primary", onclick: openCreate }, "New collaboration")),
    table(["Collaboration", "Goal", "State", "Room", "Started"], v.collabs.map((c) => [
      link(`#/collab/${enc(c.collab)}`, c.collab), c.goal, state(c.state), link(`#/room/${enc(c.room)}`, c.room), when(c.created_ms),
    ])),
  ];
}

async function openCreate() {
  const dlg = document.getElementById("dialog");
  let prof, projects;
  try {
    [prof, projects] = await Promise.all([api("collab_profile"), api("project_list")]);
  } catch (e) {
    dlg.replaceChildren(h("h2", { id: "dialog-title" }, "New collaboration"), refusalBox(e),
      h("button", { type: "button", onclick: () => dlg.close() }, "Close"));
    dlg.showModal();
    return;
  }
  const adapters = prof.adapters.map((a) => a.adapter);
  const caps = Object.fromEntries(prof.adapters.map((a) => [a.adapter, a.capabilities || {}]));
  const out = h("div", { role: "status" });
  const toggle = h("input", { type: "checkbox", id: "collaborative", checked: true, role: "switch" });
  const goal = h("textarea", { id: "goal", name: "goal", required: true });
  const project = h("select", { id: "project", name: "project" },
    h("option", { value: "" }, "(no project)"),
    (projects.projects || []).map((p) => h("option", { value: p.id }, `${p.name || p.id} ${p.root ? "— " + p.root : ""}`)));
  const seatRow = (seat, phases, optional) => {
    const sel = h("select", { id: `adapter-${seat}`, "aria-label": `${seat} backend`, "data-seat": seat },
      h("option", { value: "" }, optional ? "(not bound: Room's scheduler)" : "(choose a backend)"),
      adapters.map((a) => h("option", { value: a }, a)));
    // what the chosen backend offers: an ACP backend's presets, an API backend's model routes
    // from config.toml; a script or a command is typed
    const offered = h("datalist", { id: `models-${seat}` });
    const model = h("input", { type: "text", id: `model-${seat}`, "aria-label": `${seat} model`,
      placeholder: "model, preset or script", list: `models-${seat}` });
    const flag = h("div", { class: "flag", "aria-live": "polite" });
    sel.addEventListener("change", () => {
      const c = caps[sel.value] || {};
      flag.textContent = c.tool_deny === "advisory"
        ? "advisory confinement: the agent's own tools are held only by the worker's confinement" : "";
      const names = sel.value === "acp" ? (prof.presets || [])
        : ["openai", "anthropic"].includes(sel.value) ? (prof.model_routes || []) : [];
      offered.replaceChildren(...names.map((n) => h("option", { value: n })));
    });
    return h("div", { class: "row" },
      h("label", { for: `adapter-${seat}` }, seat, h("div", { class: "muted sub-label" }, phases.join(", "))),
      sel, h("div", {}, model, offered, flag));
  };
  const roles = h("fieldset", {}, h("legend", {}, "Roles: a backend and model for each"),
    seatRow(prof.orchestrator, ["plans and dispatches"], true),
    prof.seats.map((s) => seatRow(s.seat, s.phases, false)));
  const roomName = h("input", { type: "text", id: "room-name", name: "room" });
  const plain = h("div", { hidden: true },
    h("label", { for: "room-name" }, "Room name"), roomName,
    h("p", { class: "muted" }, "Without Collaborative: a plain room; add members from the owner console."));
  toggle.addEventListener("change", () => { roles.hidden = !toggle.checked; plain.hidden = toggle.checked; });
  const form = h("form", {
    method: "dialog",
    onsubmit: async (ev) => {
      ev.preventDefault();
      out.replaceChildren();
      try {
        if (!toggle.checked) {
          await api("room_create", { name: roomName.value.trim() });
          dlg.close();
          location.hash = `#/room/${enc(roomName.value.trim())}`;
          return;
        }
        const bindings = [];
        for (const sel of roles.querySelectorAll("select")) {
          const seat = sel.dataset.seat;
          if (!sel.value) continue;
          const model = document.getElementById(`model-${seat}`).value.trim();
          bindings.push(`${seat}=${sel.value}${model ? ":" + model : ""}`);
        }
        const args = { goal: goal.value, roles: bindings };
        if (project.value) args.project = project.value;
        const r = await api("collab_start", args);
        dlg.close();
        location.hash = `#/collab/${enc(r.collab)}`;
      } catch (e) {
        out.replaceChildren(refusalBox(e));
      }
    },
  },
  h("h2", { id: "dialog-title" }, "New collaboration"),
  h("div", { class: "switch" }, toggle, h("label", { for: "collaborative" }, "Collaborative: several models in roles")),
  h("label", { for: "goal" }, "Goal"), goal,
  h("label", { for: "project" }, "Project"), project,
  roles, plain,
  out,
  h("div", { class: "actions" },
    h("button", { type: "submit", class: "primary" }, "Start"),
    h("button", { type: "button", onclick: () => dlg.close() }, "Cancel")));
  dlg.replaceChildren(form);
  dlg.showModal();
  goal.focus();
}

// Phases in columns by how far they stand from the start: a phase comes after the phases it
// names in `after` and after those that write what it reads.
function layers(phases) {
  const depth = new Map();
  const deps = (p) => phases.filter((q) => q !== p && ((p.after || []).includes(q.phase) ||
    (q.writes || []).some((w) => (p.reads || []).includes(w))));
  const d = (p, seen) => {
    if (depth.has(p.phase)) return depth.get(p.phase);
    if (seen.has(p.phase)) return 0; // a loop (a fix loop reads what it writes): cut here
    seen.add(p.phase);
    const before = deps(p);
    const v = before.length ? Math.max(...before.map((q) => d(q, seen) + 1)) : 0;
    depth.set(p.phase, v);
    return v;
  };
  phases.forEach((p) => d(p, new Set()));
  const out = [];
  for (const p of phases) (out[depth.get(p.phase)] ||= []).push(p);
  return out.filter(Boolean);
}

async function viewCollab(id) {
  const s = await api("collab_status", { id });
  S.collabRoom = s.room;
  const arts = await api("collab_artifacts", { room: s.room }).catch(() => ({ artifacts: [] }));
  const pending = (s.approvals || []).filter((a) => a.state === "pending");
  const graph = h("div", { class: "graph", role: "list", "aria-label": "phases", tabindex: "0" },
    layers(s.phases || []).map((layer, i) => h("div", { class: "layer", role: "listitem", "aria-label": `step ${i + 1}` },
      layer.map((p) => h("div", { class: `phase ${p.state}`, "data-phase": p.phase },
        h("div", { class: "name" }, p.phase, " ", state(p.state)),
        h("div", { class: "sub" }, `${p.kind}${p.role ? " · " + p.role : ""} · runs ${p.runs}`),
        (p.reads || []).length ? h("div", { class: "sub" }, "reads ", p.reads.join(", ")) : null,
        (p.writes || []).length ? h("div", { class: "sub" }, "writes ", p.writes.join(", ")) : null,
        p.refusal ? h("div", { class: "error" }, p.refusal.code) : null,
        act("Rerun", "quiet", () => api("collab_rerun", { id, phase: p.phase })))))));
  const artifactList = (arts.artifacts || arts.entries || []);
  return [
    h("h1", {}, "Collaboration ", h("code", {}, id)),
    kv([["Goal", s.goal], ["State", state(s.state)], ["Room", link(`#/room/${enc(s.room)}`, s.room)],
      ["Orchestrated by", typeof s.orchestrated_by === "string" ? s.orchestrated_by : (s.orchestrated_by && s.orchestrated_by.agent)],
      ["Goal task", s.goal_task ? link(`#/task/${enc(s.goal_task)}`, s.goal_task) : null]]),
    s.state === "running" ? h("div", { class: "actions" },
      act("Cancel collaboration", "danger", () => api("collab_cancel", { id }), "Cancel this collaboration? Its workers are stopped.")) : null,
    pending.length ? [h("h2", {}, `Waiting for you (${pending.length})`), pending.map((a) => approvalCard(a, id))] : null,
    (s.flags || []).length ? [h("h2", {}, "Flags"), table(["Flag", "Detail"], s.flags.map((f) => [h("code", {}, f.code || f.flag || ""), f.message || JSON.stringify(f)]))] : null,
    h("h2", {}, "Phases"),
    graph,
    (s.phases || []).filter((p) => p.panel).map((p) => panelView(p)),
    h("h2", {}, "Artifacts"),
    table(["Kind", "Key", "Version", "Written by", ""], artifactList.map((a) => [
      h("code", {}, a.kind), a.key || "", String(a.version ?? ""), a.producer || "",
      h("button", { type: "button", class: "quiet", onclick: () => showArtifact(s.room, a) }, `View ${a.kind}${a.key ? " " + a.key : ""}`),
    ])),
    h("div", { id: "artifact" }),
    h("h2", {}, "Cost"),
    costView(s.cost),
    s.guards ? [h("h2", {}, "Guards"), pretty(s.guards)] : null,
  ];
}

function money(v) {
  return typeof v === "number" ? `$${v.toFixed(4)}` : "unknown";
}

function costView(c) {
  if (!c) return h("p", { class: "muted" }, "no cost recorded");
  const models = c.by_agent_and_model || [];
  const reported = c.by_agent_reported || [];
  return [
    table(["Agent", "Model", "Calls", "Tokens in", "Tokens out", "USD"], models.map((r) => [
      r.agent, r.model, String(r.calls), String(r.tokens_in), String(r.tokens_out), money(r.usd),
    ]), "from the adapters' usage records"),
    reported.length ? table(["Agent", "Reported by", "Launches", "USD"], reported.map((r) => [
      r.agent, r.reported_by, String(r.launches), money(r.usd),
    ]), "as the agents reported their turns' cost") : null,
    h("p", {}, h("strong", {}, "Total: ", money(c.usd)), ` · ${c.tokens_in ?? 0} tokens in, ${c.tokens_out ?? 0} out`,
      c.launches_without_usage ? ` · ${c.launches_without_usage} launches reported no usage, so money is unknown` : ""),
  ];
}

function approvalCard(a, collab) {
  const prompt = h("textarea", { id: `revise-${a.approval}` });
  prompt.value = (a.input && (a.input.prompt || a.input.text)) || "";
  const decide = (verdict, extra) => api("collab_decide", { approval: a.approval, digest: a.digest, verdict, ...extra });
  return h("section", { class: "approval", "aria-label": `approval for ${a.phase}` },
    h("h3", {}, `${a.phase} (run ${a.run})`, " ", state(a.state)),
    collab ? h("p", {}, "Collaboration ", link(`#/collab/${enc(collab)}`, collab)) : null,
    h("p", { class: "muted" }, "The full delegation input, as the child will receive it; the decision is bound to its digest ", h("code", {}, String(a.digest).slice(0, 16)), "."),
    pretty(a.input),
    h("div", { class: "actions" },
      act("Approve", "primary", () => decide("approve")),
      act("Reject", "danger", () => decide("reject"), "Reject this dispatch?")),
    h("details", {}, h("summary", {}, "Revise the prompt"),
      h("label", { for: `revise-${a.approval}` }, "Prompt to approve instead"), prompt,
      h("div", { class: "actions" }, act("Approve revised", "primary", () => decide("revise", { prompt: prompt.value })))));
}

function panelView(p) {
  const panel = p.panel;
  const merged = panel.merged || {};
  const reviewers = (panel.seats || []).map((s) => s.seat);
  return [
    h("h2", {}, `Panel ${p.phase}: run ${panel.run}, fix loops ${panel.fix_loops}/${panel.fix_loops_max ?? "∞"}`),
    table(["Seat", "Agent", "Backend", "Family", "State", "Debate"], (panel.seats || []).map((s) => [
      s.seat, s.agent || "", s.backend || "", s.family || "", state(s.state), s.debate || "",
    ])),
    findingsSides(merged, reviewers),
    panel.judge ? [h("h3", {}, `Judge: ${panel.judge.role}`), state(panel.judge.state),
      panel.judge.synthesis ? pretty(panel.judge.synthesis.content) : null] : null,
  ];
}

// The merged findings: each reviewer's column side by side, then every disagreement (a
// finding one reviewer reports and another does not, or classes differently) kept and shown.
function findingsSides(merged, reviewers) {
  const seats = merged.reviewers || reviewers;
  const items = merged.findings || [];
  const where = (f) => (f.file ? `${f.file}${f.line ? ":" + f.line : ""}` : "");
  const columns = h("div", { class: "sides" }, seats.map((seat) => {
    const mine = items.filter((f) => f.classes && f.classes[seat]);
    const byClass = (cls) => mine.filter((f) => f.classes[seat] === cls);
    return h("section", { class: "side", "aria-label": `findings of ${seat}` }, h("h3", {}, seat),
      mine.length ? ["blocking", "non_blocking", "suggestions"].map((cls) => byClass(cls).length
        ? [h("h4", {}, `${cls.replace("_", " ")} (${byClass(cls).length})`),
          h("ul", {}, byClass(cls).map((f) => h("li", {}, where(f) ? [h("code", {}, where(f)), " "] : null, f.title)))]
        : null) : h("p", { class: "muted" }, "no findings"));
  }));
  const dis = items.filter((f) => f.disagreement);
  return [
    columns,
    dis.length ? [h("h3", {}, `Disagreements (${dis.length}): kept, never voted`),
      table(["Finding", ...seats], dis.map((f) => [
        [where(f) ? [h("code", {}, where(f)), " "] : null, f.title],
        ...seats.map((seat) => (f.classes[seat] ? f.classes[seat].replace("_", " ") : h("span", { class: "muted" }, "not reported"))),
      ]))] : h("p", { class: "muted" }, "The reviewers agree."),
  ];
}

function findingsList(f) {
  if (!f || typeof f !== "object") return h("p", { class: "muted" }, "none");
  const group = (name) => {
    const items = f[name] || [];
    if (!items.length) return null;
    return [h("h4", {}, `${name.replace("_", " ")} (${items.length})`), h("ul", {}, items.map((i) => h("li", {},
      typeof i === "string" ? i : [i.file ? h("code", {}, `${i.file}${i.line ? ":" + i.line : ""}`) : null, " ", i.message || i.text || i.summary || JSON.stringify(i)])))];
  };
  return [group("blocking"), group("non_blocking"), group("suggestions")];
}

async function showArtifact(room, a) {
  const box = document.getElementById("artifact");
  box.replaceChildren(h("p", { class: "muted" }, "loading"));
  try {
    const v = await api("collab_artifact", { room, kind: a.kind, key: a.key || undefined });
    const c = v.content;
    let body;
    if (a.kind === "diff") body = diffView(typeof c === "string" ? c : (c && (c.diff || c.patch)) || "");
    else if (a.kind === "findings") body = h("div", { class: "side" }, findingsList(c));
    else body = typeof c === "string" ? h("pre", { tabindex: "0" }, c) : pretty(c);
    box.replaceChildren(h("h3", { tabindex: "-1" }, `${a.kind}${a.key ? " " + a.key : ""} v${v.version}`), body);
    box.querySelector("h3").focus();
  } catch (e) {
    box.replaceChildren(refusalBox(e));
  }
}

function diffView(text) {
  return h("div", { class: "diff mono", role: "region", "aria-label": "diff", tabindex: "0" },
    String(text).split("\n").map((l) => {
      const cls = l.startsWith("+++") || l.startsWith("---") || l.startsWith("diff ") ? "file"
        : l.startsWith("@@") ? "hunk" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : "";
      return h("div", { class: cls }, l || " ");
    }));
}

// ---------- approvals

async function pendingApprovals() {
  const v = await api("collab_list");
  const running = v.collabs.filter((c) => c.state === "running");
  const all = [];
  for (const c of running) {
    const s = await api("collab_status", { id: c.collab });
    for (const a of s.approvals || []) if (a.state === "pending") all.push({ a, collab: c.collab, goal: c.goal, cost: s.cost });
  }
  return all;
}

async function viewApprovals() {
  const all = await pendingApprovals();
  document.getElementById("approval-count").textContent = all.length ? String(all.length) : "";
  return [
    h("h1", {}, "Approvals"),
    all.length ? null : h("p", { class: "muted" }, "Nothing waits for you."),
    all.map(({ a, collab, goal, cost }) => [
      h("p", {}, h("strong", {}, goal)),
      approvalCard(a, collab),
      h("details", {}, h("summary", {}, "cost so far"), costView(cost)),
    ]),
  ];
}

document.addEventListener("DOMContentLoaded", boot);
