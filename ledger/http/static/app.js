// Operator page of the run ledger: what is stuck, and on whom. It reads the JSON API of
// the same server: the tally from /overview (every open run; at most once per
// OVERVIEW_MIN_MS), the list from /board (one page, in the attention order `ledger top`
// uses), a run page from /board/{id}/items and /attempts (one page each). Every "stuck"
// signal, the order, each owner's next step and whether a run can still succeed are
// computed by the ledger, never here. No framework, no external files;
// every value from the ledger goes into the page as text (never as HTML).
"use strict";

const REFRESH_MS = 5000;
const PAGE = 50;
const ITEM_PAGE = 100;
const ATTEMPT_PAGE = 50;
const RUN_STATES = ["queued", "running", "awaiting_review", "pausing", "paused", "canceling",
  "succeeded", "completed_with_errors", "failed", "canceled"];
const TERMINAL = new Set(["succeeded", "completed_with_errors", "failed", "canceled"]);
const ITEM_STATES = ["pending", "in_progress", "retryable", "quarantined", "accepted", "rejected", "skipped"];
const OWNERS = ["reconciler", "reviewer", "operator", "controller", "workers"];
// The tally is read at most this often, whatever triggers a render (polling, the change
// feed, a filter): the server answers it from a snapshot a few seconds old anyway.
const OVERVIEW_MIN_MS = REFRESH_MS;
let overviewCache = null;
let overviewAt = 0;

let timer = null;
let renderSeq = 0;
let skewMs = 0; // server clock minus browser clock, from the last answer carrying `at`

// ---- small DOM helpers --------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    // CSSOM, not a style attribute: the page's Content-Security-Policy forbids inline styles.
    else if (key === "style") Object.assign(node.style, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const words = (s) => String(s).replaceAll("_", " ");
const shortId = (id) => (id && id.length > 13 ? id.slice(0, 8) + "…" : id);
const runHref = (id) => "#/runs/" + encodeURIComponent(id);
const serverNow = () => Date.now() + skewMs;
function noteServerTime(iso) { if (iso) skewMs = Date.parse(iso) - Date.now(); }

function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h " + (m % 60) + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
}

function ago(iso) { return iso ? span(serverNow() - Date.parse(iso)) : ""; }

function timeCell(iso, suffix) {
  if (!iso) return el("span", { class: "muted" }, "–");
  return el("time", { datetime: iso, title: new Date(iso).toLocaleString() }, ago(iso) + (suffix === undefined ? " ago" : suffix));
}

// An ETA only for a running run that can still succeed (the ledger leaves `eta` null
// otherwise); a run that cannot succeed without a repair says so instead.
function etaCell(run) {
  if (TERMINAL.has(run.state) || (!run.rate && run.waiting_on !== "workers")) return el("span", { class: "muted" }, "–");
  const rate = run.rate ? run.rate.toFixed(run.rate < 10 ? 1 : 0) + "/min" : "0/min";
  let eta = "";
  if (!run.can_succeed) eta = "cannot succeed without a repair";
  else if (run.eta) eta = "done in ~" + span(Date.parse(run.eta) - serverNow());
  else if (run.state === "running" && run.remaining_required) eta = "no ETA";
  return el("span", {}, el("span", { class: "rate" }, rate), eta ? el("div", { class: "muted eta" + (run.can_succeed ? "" : " lost") }, eta) : null);
}

function stateBadge(state) {
  return el("span", { class: "badge state state-" + state }, words(state));
}

function failureText(run) {
  if (run.state !== "failed" || !run.failure_kind) return null;
  return el("div", { class: "failure failure-" + run.failure_kind, title: run.failure_reason || "" },
    run.failure_kind + (run.failure_reason ? " · " + words(run.failure_reason) : ""));
}

function ownerBadge(who, actors, big, step) {
  const people = (actors || []).join(", ");
  return el("span", { class: "owner" },
    el("span", { class: "badge waiting waiting-" + who + (big ? " big" : ""), title: step || "", dataset: { waitingOn: who } },
      who === "nobody" ? "done" : "waiting on: " + who),
    people ? el("span", { class: "person", title: "who, where known" }, " " + people) : null);
}

function flags(run) {
  return el("span", { class: "flags" },
    run.stalled ? el("span", { class: "badge alarm stalled", title: "waiting on workers with no activity for policy.stall_seconds" }, "stalled") : null,
    run.expired_leases ? el("span", { class: "badge alarm expired", title: "leases past expiry, not reconciled" }, run.expired_leases + " expired lease" + (run.expired_leases > 1 ? "s" : "")) : null);
}

function countChips(counts) {
  const chips = el("span", { class: "chips" });
  for (const state of ITEM_STATES) {
    const n = counts && counts[state];
    if (n) chips.append(el("span", { class: "chip item-" + state, title: words(state) }, words(state) + " " + n));
  }
  if (!chips.childNodes.length) chips.append(el("span", { class: "muted" }, "no items"));
  return chips;
}

function progressBar(counts) {
  const total = ITEM_STATES.reduce((sum, s) => sum + ((counts && counts[s]) || 0), 0);
  const bar = el("span", { class: "bar", title: total + " items", role: "img", "aria-label": total + " items" });
  for (const state of ITEM_STATES) {
    const n = (counts && counts[state]) || 0;
    if (n) bar.append(el("span", { class: "seg item-" + state, title: words(state) + " " + n, style: { width: (100 * n / total) + "%" } }));
  }
  return bar;
}

function show(...parts) {
  document.getElementById("view").replaceChildren(...parts.flat().filter((p) => p !== null && p !== undefined && p !== false));
}

function table(headers, rows, emptyText, cls) {
  if (!rows.length) return el("p", { class: "muted" }, emptyText);
  return el("table", { class: cls || "" },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows));
}

// A table cell carrying its column name, so the phone layout can label it.
const td = (label, attrs, ...children) => el("td", { ...(attrs || {}), dataset: { label } }, ...children);

// ---- the JSON API ---------------------------------------------------------------

class NeedsToken extends Error {}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) throw new NeedsToken((await response.json()).message);
  const body = await response.json();
  if (!response.ok) throw new Error((body.error || response.status) + ": " + (body.message || ""));
  return body;
}

async function overview() {
  if (overviewCache === null || Date.now() - overviewAt >= OVERVIEW_MIN_MS) {
    overviewAt = Date.now();
    try { overviewCache = await api("/overview"); } catch (error) { overviewAt = 0; throw error; }
  }
  return overviewCache;
}

function showSignIn(message) {
  stopTimer();
  const input = el("input", { type: "password", id: "token", autocomplete: "off", placeholder: "ledger_…", size: 48 });
  const status = el("p", { class: "error", role: "alert" });
  const form = el("form", {
    class: "signin",
    onsubmit: async (event) => {
      event.preventDefault();
      const response = await fetch("/session", {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ token: input.value.trim() }),
      });
      if (response.ok) { input.value = ""; route(); } else status.textContent = (await response.json()).message;
    },
  },
  el("h1", {}, "Sign in to read the ledger"),
  el("p", {}, message || "This server needs a token for reads."),
  el("p", { class: "muted" }, "Paste a token made by ", el("code", {}, "ledger token add ACTOR_ID ROLE"),
    ". It is kept in an HttpOnly cookie for this site and is only used for reads."),
  el("label", { for: "token" }, "Token "), input, " ", el("button", { type: "submit" }, "Sign in"), status);
  show(form);
  input.focus();
}

// ---- hash routing with query parameters --------------------------------------------

function hashQuery() { return new URLSearchParams(location.hash.split("?")[1] || ""); }

function go(path, params) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined && v !== false) query.set(k, v === true ? "1" : v);
  const text = query.toString();
  location.hash = "#" + path + (text ? "?" + text : "");
}

// ---- the runs list -------------------------------------------------------------------

function listFilter() {
  const q = hashQuery();
  return { state: q.get("state") || "", waiting_on: q.get("waiting_on") || "", stalled: q.get("stalled") === "1",
    terminal: q.get("terminal") === "1", after: q.get("after") || "" };
}

function tallyView(ov, filter) {
  const pick = (changes) => (e) => { e.preventDefault(); go("/", { ...listFilter(), after: "", ...changes }); };
  const owners = OWNERS.filter((who) => ov.by_waiting_on[who]).map((who) => {
    const oldest = ov.oldest_wait[who];
    return el("a", { href: "#", class: "tally-item" + (filter.waiting_on === who ? " active" : ""), dataset: { owner: who },
      onclick: pick({ waiting_on: filter.waiting_on === who ? "" : who, terminal: false, stalled: false }) },
    ownerBadge(who), " ", el("strong", {}, String(ov.by_waiting_on[who])),
    oldest ? el("span", { class: "muted" }, " · oldest " + span(oldest.seconds * 1000)) : null);
  });
  return el("section", { class: "tally", "aria-label": "open runs by owner" },
    el("span", { class: "tally-total" }, el("strong", {}, String(ov.open_runs)), " open runs"),
    owners.length ? owners : el("span", { class: "muted" }, "nothing is waiting"),
    el("a", { href: "#", class: "tally-item alarm-link" + (filter.stalled ? " active" : ""), dataset: { owner: "stalled" }, onclick: pick({ stalled: !filter.stalled, terminal: false }) },
      el("span", { class: "badge " + (ov.stalled ? "alarm stalled" : "quiet") }, "stalled"), " ", el("strong", {}, String(ov.stalled))),
    el("span", { class: "tally-item", dataset: { owner: "expired" } },
      el("span", { class: "badge " + (ov.expired_leases ? "alarm expired" : "quiet") }, "expired leases"), " ",
      el("strong", {}, String(ov.expired_leases)), ov.runs_with_expired_leases ? el("span", { class: "muted" }, " in " + ov.runs_with_expired_leases + " runs") : null));
}

function runRow(run) {
  return el("tr", { class: "run-row" + (run.stalled || run.expired_leases ? " stuck" : ""), dataset: { runId: run.run_id, state: run.state, waitingOn: run.waiting_on } },
    td("Run", {}, el("a", { href: runHref(run.run_id), class: "mono run-link", title: run.run_id }, shortId(run.run_id)),
      run.scope ? el("div", { class: "scope" }, run.scope) : null,
      el("div", { class: "summary muted" }, run.summary)),
    td("State", {}, stateBadge(run.state), failureText(run),
      run.cancel_requested && run.state !== "canceled" ? el("div", { class: "muted" }, "cancel requested") : null),
    td("Waiting on", { class: "waiting-cell" }, ownerBadge(run.waiting_on, run.waiting_on_actors, false, run.next_step), flags(run),
      el("div", { class: "next-step" }, run.next_step)),
    td("Waiting since", {}, TERMINAL.has(run.state) ? el("span", { class: "muted" }, "stopped ", timeCell(run.stopped_at)) : timeCell(run.waiting_since)),
    td("Last activity", {}, timeCell(run.last_activity_at)),
    td("Items", {}, progressBar(run.counts), countChips(run.counts)),
    td("Rate · ETA", {}, etaCell(run)));
}

async function renderRuns(seq) {
  const filter = listFilter();
  const query = new URLSearchParams({ limit: String(PAGE) });
  for (const key of ["state", "waiting_on", "after"]) if (filter[key]) query.set(key, filter[key]);
  if (filter.stalled) query.set("stalled", "true");
  if (filter.terminal && !filter.state) query.set("terminal", "true");
  // open runs in the attention order of `ledger top`; finished ones newest first
  if (!filter.terminal && !TERMINAL.has(filter.state)) query.set("order", "attention");
  const [ov, page] = await Promise.all([overview(), api("/board?" + query)]);
  if (seq !== renderSeq) return;
  noteServerTime(ov.at);

  // from the hash as it is when the control is used (a render may still be on its way)
  const change = (changes) => go("/", { ...listFilter(), after: "", ...changes });
  const stateSelect = el("select", { id: "state-filter", onchange: (e) => change({ state: e.target.value }) },
    el("option", { value: "" }, filter.terminal ? "all terminal states" : "all open states"),
    RUN_STATES.map((s) => el("option", { value: s, selected: s === filter.state }, words(s))));
  const ownerSelect = el("select", { id: "owner-filter", onchange: (e) => change({ waiting_on: e.target.value }) },
    el("option", { value: "" }, "anyone"), [...OWNERS, "nobody"].map((w) => el("option", { value: w, selected: w === filter.waiting_on }, w)));
  const stalledBox = el("input", { type: "checkbox", id: "stalled-filter", checked: filter.stalled, onchange: (e) => change({ stalled: e.target.checked }) });
  const terminalBox = el("input", { type: "checkbox", id: "terminal-filter", checked: filter.terminal, onchange: (e) => change({ terminal: e.target.checked, state: "" }) });

  const pager = el("nav", { class: "pager", "aria-label": "pages" },
    filter.after ? el("a", { href: "#", class: "button", onclick: (e) => { e.preventDefault(); change({}); } }, "← first page") : null,
    page.next_after !== null ? el("a", { href: "#", class: "button", id: "next-page", onclick: (e) => { e.preventDefault(); go("/", { ...filter, after: String(page.next_after) }); } }, "next page →") : null);

  const what = filter.terminal ? "Finished runs" : "Open runs, most urgent first";
  show(
    tallyView(ov, filter),
    el("section", { class: "toolbar", "aria-label": "filters" },
      el("h1", {}, what),
      el("label", { for: "state-filter" }, "State "), stateSelect,
      el("label", { for: "owner-filter" }, "Waiting on "), ownerSelect,
      el("label", { class: "check" }, stalledBox, " stalled only"),
      el("label", { class: "check" }, terminalBox, " finished runs")),
    table(["Run", "State", "Waiting on", "Waiting since", "Last activity", "Items", "Rate · ETA"], page.runs.map(runRow),
      filter.state || filter.waiting_on || filter.stalled ? "No runs match this filter." : (filter.terminal ? "No finished runs." : "No open runs."), "runs"),
    pager);
}

// ---- one run ----------------------------------------------------------------------

function fact(label, value) {
  if (value === null || value === undefined || value === "") return null;
  return [el("dt", {}, label), el("dd", {}, value)];
}

function leaseCell(item) {
  if (!item.lease_worker) return "";
  if (item.lease_expired) {
    return el("span", { class: "lease expired-lease" }, el("span", { class: "badge alarm expired" }, "expired"),
      " " + item.lease_worker + " · " + ago(item.lease_expires_at) + " ago, not reconciled");
  }
  return el("span", { class: "lease" }, item.lease_worker + " · expires in " + span(Date.parse(item.lease_expires_at) - serverNow()));
}

function outcomeCell(a) {
  if (a.outcome) return words(a.outcome);
  if (a.lease_expired) return el("span", { class: "badge alarm expired" }, "lease expired, not reconciled");
  return "in flight";
}

function runQuery() {
  const q = hashQuery();
  return { items_state: q.get("items_state") || "", items_after: q.get("items_after") || "", attempts_after: q.get("attempts_after") || "" };
}

async function renderRun(runId, seq) {
  const enc = encodeURIComponent(runId);
  const q = runQuery();
  const itemQuery = new URLSearchParams({ limit: String(ITEM_PAGE) });
  if (q.items_state) itemQuery.set("state", q.items_state);
  if (q.items_after) itemQuery.set("after", q.items_after);
  const attemptQuery = new URLSearchParams({ limit: String(ATTEMPT_PAGE) });
  if (q.attempts_after) attemptQuery.set("after", q.attempts_after);
  const [status, run, items, attempts, history, lineage] = await Promise.all([
    api("/runs/" + enc), api("/board/" + enc), api("/board/" + enc + "/items?" + itemQuery),
    api("/board/" + enc + "/attempts?" + attemptQuery),
    api("/audit?run_id=" + enc + "&newest_first=true&limit=50"), api("/runs/" + enc + "/lineage"),
  ]);
  if (seq !== renderSeq) return;
  noteServerTime(items.at);
  const here = "/runs/" + runId;
  const move = (changes) => go(here, { ...runQuery(), ...changes });

  const facts = el("dl", { class: "facts" },
    fact("waiting since", run.waiting_since && !TERMINAL.has(run.state) ? timeCell(run.waiting_since) : null),
    fact("last activity", timeCell(run.last_activity_at)),
    fact("rate", TERMINAL.has(run.state) ? null : (run.rate || 0) + " items/min (last 5 min)"),
    fact("ETA", run.eta ? new Date(run.eta).toLocaleString() + " (in " + span(Date.parse(run.eta) - serverNow()) + ")" : null),
    fact("remaining", TERMINAL.has(run.state) ? null : run.remaining_required + " required items"),
    fact("outcome", TERMINAL.has(run.state) || run.can_succeed ? null : "cannot succeed without a repair"),
    fact("failure", status.failure_kind ? status.failure_kind + " · " + words(status.failure_reason || "") : null),
    fact("created", timeCell(status.created_at)), fact("created by", status.created_by),
    fact("started", status.started_at ? timeCell(status.started_at) : null),
    fact("stopped", status.stopped_at ? timeCell(status.stopped_at) : null),
    fact("stop reason", status.stop_reason),
    fact("review", status.review ? [status.review.decision, status.review.reviewer ? "for " + status.review.reviewer : null, "of " + status.review.input_version].filter(Boolean).join(" ") : null),
    fact("revision", String(status.revision)),
    fact("input version", el("code", {}, status.input_version)),
    fact("source version", status.source_version), fact("config version", status.config_version),
    fact("cancel requested", status.cancel_requested ? "yes" : null));

  const lineageList = lineage.length > 1 ? el("section", {}, el("h2", {}, "Lineage"),
    el("ol", { class: "lineage" }, lineage.map((r) => el("li", { class: r.run_id === runId ? "current" : "" },
      r.run_id === runId ? el("strong", { class: "mono" }, shortId(r.run_id) + " (this run)")
        : el("a", { href: runHref(r.run_id), class: "mono", title: r.run_id }, shortId(r.run_id)),
      " ", stateBadge(r.state), (r.links || []).map((l) => el("span", { class: "muted" }, " " + words(l.relation) + " " + shortId(l.run_id))))))) : null;

  const notAccepted = status.not_accepted && status.not_accepted.length ? el("section", {}, el("h2", {}, "Not accepted (first 20)"),
    table(["Item", "State", "Required", "Why"], status.not_accepted.map((n) => el("tr", {},
      td("Item", { class: "mono" }, n.item_id), td("State", {}, stateBadge(n.state)),
      td("Required", {}, n.required ? "yes" : "no"), td("Why", {}, n.reason || ""))), "")) : null;

  const itemRows = items.items.map((it) => el("tr", { class: it.lease_expired ? "stuck" : "", dataset: { itemId: it.item_id, leaseExpired: String(it.lease_expired) } },
    td("Item", { class: "mono" }, it.item_id), td("State", {}, el("span", { class: "chip item-" + it.state }, words(it.state))),
    td("Required", {}, it.required ? "yes" : "no"), td("Attempts", {}, String(it.attempts)), td("Lease", {}, leaseCell(it)),
    td("Reason / last error", {}, it.reason && it.reason !== it.state ? el("div", {}, it.reason) : null,
      it.last_error ? el("div", { class: "error-text" }, it.last_error) : null)));
  const itemState = el("select", { id: "item-state", onchange: (e) => move({ items_state: e.target.value, items_after: "" }) },
    el("option", { value: "" }, "all states"), ITEM_STATES.map((s) => el("option", { value: s, selected: s === q.items_state }, words(s))));
  const itemPager = el("nav", { class: "pager" },
    q.items_after ? el("a", { href: "#", class: "button", onclick: (e) => { e.preventDefault(); move({ items_after: "" }); } }, "← first items") : null,
    items.next_after !== null ? el("a", { href: "#", class: "button", id: "next-items", onclick: (e) => { e.preventDefault(); move({ items_after: String(items.next_after) }); } }, "next " + ITEM_PAGE + " items →") : null);

  const attemptRows = attempts.attempts.map((a) => el("tr", { class: a.lease_expired && !a.outcome ? "stuck" : "" },
    td("Item", { class: "mono" }, a.item_id), td("#", {}, String(a.attempt)), td("Worker", {}, a.worker_id),
    td("Started", {}, timeCell(a.started_at)), td("Finished", {}, a.finished_at ? timeCell(a.finished_at) : "–"),
    td("Stage", {}, a.stage || ""), td("Outcome", {}, outcomeCell(a)), td("Error", { class: "error-text" }, a.error || "")));
  const attemptPager = el("nav", { class: "pager" },
    q.attempts_after ? el("a", { href: "#", class: "button", onclick: (e) => { e.preventDefault(); move({ attempts_after: "" }); } }, "← newest attempts") : null,
    attempts.next_after !== null ? el("a", { href: "#", class: "button", onclick: (e) => { e.preventDefault(); move({ attempts_after: attempts.next_after }); } }, "older attempts →") : null);

  const timeline = el("ol", { class: "timeline" }, history.items.map((t) => el("li", { class: t.item_id === null ? "run-step" : "item-step" },
    el("time", { datetime: t.at, title: t.at }, new Date(t.at).toLocaleString()),
    el("span", { class: "what" }, t.item_id === null ? "run" : el("span", {}, "item ", el("code", {}, t.item_id))),
    " ", el("span", { class: "from" }, t.from_state === "-" ? "new" : words(t.from_state)), " → ",
    t.item_id === null ? stateBadge(t.to_state) : el("span", { class: "chip item-" + t.to_state }, words(t.to_state)),
    el("span", { class: "who" }, " by " + t.actor_id + " (" + t.role + ")"),
    t.reason && t.reason !== t.to_state ? el("div", { class: "reason" }, t.reason) : null)));

  const shownTo = items.items.length ? items.items.length : 0;
  show(
    el("p", {}, el("a", { href: "#/" }, "← open runs")),
    el("section", { class: "run-head" + (run.stalled || run.expired_leases ? " stuck" : "") },
      el("h1", {}, "Run ", el("span", { class: "mono" }, runId)),
      run.scope ? el("p", { class: "scope" }, run.scope) : null,
      el("div", { class: "head-badges" }, stateBadge(run.state), ownerBadge(run.waiting_on, run.waiting_on_actors, true, run.next_step), flags(run)),
      failureText(run),
      el("p", { class: "hint next-step" }, run.next_step),
      el("p", { class: "summary big-summary" }, status.summary),
      el("div", { class: "counts" }, progressBar(run.counts), countChips(run.counts))),
    facts,
    lineageList,
    notAccepted,
    el("section", {}, el("div", { class: "section-head" }, el("h2", {}, "Items (" + items.total + ")"),
      el("label", { for: "item-state" }, "State "), itemState, el("span", { class: "muted" }, " showing " + shownTo)),
    table(["Item", "State", "Required", "Attempts", "Lease", "Reason / last error"], itemRows, "No items here.", "items"), itemPager),
    el("section", {}, el("h2", {}, "Attempts (" + attempts.total + (attempts.total_capped ? "+" : "") + ", newest first)"),
      table(["Item", "#", "Worker", "Started", "Finished", "Stage", "Outcome", "Error"], attemptRows, "No attempts yet.", "attempts"), attemptPager),
    el("section", {}, el("h2", {}, "Timeline (latest 50)"), timeline));
}

// ---- routing and refresh -----------------------------------------------------------

// Live refresh from the change feed (GET /events/stream, one stream per page): a
// re-render after committed transitions, at most once per LIVE_MIN_MS however busy the
// ledger is (each re-render reads /overview and a page of /board); the timer stays as a
// slow fallback while the stream is open.
const STREAM_FALLBACK_MS = 60000;
const LIVE_MIN_MS = 5000;
let stream = null;
let streamTimer = null;
let lastLive = 0;

function follow() {
  if (stream !== null || typeof EventSource === "undefined") return;
  stream = new EventSource("/events/stream", { withCredentials: true });
  stream.addEventListener("transition", () => {
    if (streamTimer !== null) return;  // a re-render is already due: this one joins it
    const wait = Math.max(300, lastLive + LIVE_MIN_MS - Date.now());
    streamTimer = setTimeout(() => {
      streamTimer = null;
      if (document.hidden) return;
      lastLive = Date.now();
      refresh();
    }, wait);
  });
}

function live() { return stream !== null && stream.readyState === 1; }

function stopTimer() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
}

async function route() {
  stopTimer();
  const seq = ++renderSeq;
  const path = location.hash.replace(/^#/, "").split("?")[0];
  const match = path.match(/^\/runs\/(.+)$/);
  try {
    if (match) await renderRun(decodeURIComponent(match[1]), seq);
    else await renderRuns(seq);
    if (seq !== renderSeq) return;
    document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString() + (live() ? " · live" : " · every " + REFRESH_MS / 1000 + " s");
    document.getElementById("signout").hidden = false;
    follow();
  } catch (error) {
    if (seq !== renderSeq) return;
    if (error instanceof NeedsToken) { showSignIn(error.message); return; }
    show(el("p", { class: "error", role: "alert" }, String(error.message || error)), el("p", {}, el("a", { href: "#/" }, "← open runs")));
  }
  // Poll only what is on screen; a hidden tab waits until it is shown again. While the
  // change feed's stream is open, the stream triggers refreshes and polling is slow.
  const every = live() ? STREAM_FALLBACK_MS : REFRESH_MS;
  if (seq === renderSeq) timer = setTimeout(function tick() { if (document.hidden) timer = setTimeout(tick, every); else refresh(); }, every);
}

// A refresh keeps keyboard focus where it was (by element id) so polling never steals it.
async function refresh() {
  const focused = document.activeElement && document.activeElement.id;
  await route();
  if (focused) { const again = document.getElementById(focused); if (again) again.focus(); }
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", async () => {
    await fetch("/session", { method: "DELETE", credentials: "same-origin" });
    if (stream !== null) { stream.close(); stream = null; }
    overviewCache = null;
    route();
  });
  route();
});
