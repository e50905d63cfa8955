// Operator page of the run ledger: reads the JSON API of the same server and
// shows which runs wait, and on whom. No framework, no external files; every
// value from the ledger goes into the page as text (never as HTML).
"use strict";

const REFRESH_MS = 5000;
// A run that is not terminal and has not changed for this long is flagged as idle.
const IDLE_WARN_MS = 10 * 60 * 1000;
const TERMINAL = new Set(["succeeded", "completed_with_errors", "failed", "canceled"]);
const RUN_STATES = ["queued", "running", "awaiting_review", "pausing", "paused", "canceling",
  "succeeded", "completed_with_errors", "failed", "canceled"];
const ITEM_STATES = ["pending", "in_progress", "retryable", "quarantined", "accepted", "rejected", "skipped"];
const WAITING_ON = ["reviewer", "operator", "controller", "workers", "nobody"];
const WAITING_HINT = {
  reviewer: "a reviewer must decide (review requested, or only quarantined items left)",
  operator: "an operator must resume or cancel (paused)",
  controller: "the controller must start, complete or fail the run",
  workers: "workers are claiming or holding leases",
  nobody: "terminal: nothing more will happen",
};

let timer = null;
let renderSeq = 0;

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

function shortId(id) {
  return id && id.length > 13 ? id.slice(0, 8) + "…" : id;
}

function runHref(id) {
  return "#/runs/" + encodeURIComponent(id);
}

function ago(iso) {
  if (!iso) return "";
  const ms = Date.now() - Date.parse(iso);
  if (!Number.isFinite(ms)) return iso;
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h " + (m % 60) + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
}

function timeCell(iso) {
  return el("time", { datetime: iso || "", title: iso || "" }, iso ? ago(iso) + " ago" : "–");
}

function stateBadge(state) {
  return el("span", { class: "badge state state-" + state }, state.replaceAll("_", " "));
}

function waitingBadge(who, big) {
  return el("span", {
    class: "badge waiting waiting-" + who + (big ? " big" : ""),
    title: WAITING_HINT[who] || "",
    dataset: { waitingOn: who },
  }, who === "nobody" ? "done: waiting on nobody" : "waiting on: " + who);
}

function countChips(counts) {
  const chips = el("span", { class: "chips" });
  for (const state of ITEM_STATES) {
    const n = counts && counts[state];
    if (!n) continue;
    chips.append(el("span", { class: "chip item-" + state, title: state }, state.replaceAll("_", " ") + " " + n));
  }
  if (!chips.childNodes.length) chips.append(el("span", { class: "muted" }, "no items"));
  return chips;
}

function progressBar(counts) {
  const total = ITEM_STATES.reduce((sum, s) => sum + ((counts && counts[s]) || 0), 0);
  const bar = el("span", { class: "bar", title: total + " items" });
  if (!total) return bar;
  for (const state of ITEM_STATES) {
    const n = (counts && counts[state]) || 0;
    if (n) bar.append(el("span", { class: "seg item-" + state, title: state + " " + n, style: { width: (100 * n / total) + "%" } }));
  }
  return bar;
}

// Replace the main view; null parts are left out (replaceChildren would print "null").
function show(...parts) {
  document.getElementById("view").replaceChildren(...parts.flat().filter((p) => p !== null && p !== undefined && p !== false));
}

function itemChip(state) {
  return el("span", { class: "chip item-" + state }, state.replaceAll("_", " "));
}

function reviewText(review) {
  if (!review) return null;
  const parts = [review.decision || "review"];
  if (review.input_version) parts.push("of " + review.input_version);
  if (review.approved_version) parts.push("· approved " + review.approved_version);
  return parts.join(" ");
}

function table(headers, rows, emptyText) {
  if (!rows.length) return el("p", { class: "muted" }, emptyText);
  return el("table", {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

// ---- the JSON API ---------------------------------------------------------------

class NeedsToken extends Error {}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (response.status === 401) throw new NeedsToken((await response.json()).message);
  const body = await response.json();
  if (!response.ok) throw new Error((body.error || response.status) + ": " + (body.message || ""));
  return body;
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
      if (response.ok) { input.value = ""; route(); }
      else status.textContent = (await response.json()).message;
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

// ---- the runs table ----------------------------------------------------------------

function currentFilter() {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  return { state: query.get("state") || "", waiting: query.get("waiting_on") || "" };
}

function setFilter(filter) {
  const query = new URLSearchParams();
  if (filter.state) query.set("state", filter.state);
  if (filter.waiting) query.set("waiting_on", filter.waiting);
  const text = query.toString();
  location.hash = "#/" + (text ? "?" + text : "");
}

async function renderRuns(seq) {
  const filter = currentFilter();
  const runs = await api("/runs?limit=500" + (filter.state ? "&state=" + encodeURIComponent(filter.state) : ""));
  if (seq !== renderSeq) return;

  const byWho = {};
  for (const run of runs) byWho[run.waiting_on] = (byWho[run.waiting_on] || 0) + 1;
  const shown = filter.waiting ? runs.filter((r) => r.waiting_on === filter.waiting) : runs;

  const stateSelect = el("select", { id: "state-filter", onchange: (e) => setFilter({ ...filter, state: e.target.value }) },
    el("option", { value: "" }, "all states"),
    RUN_STATES.map((s) => el("option", { value: s, selected: s === filter.state }, s.replaceAll("_", " "))));

  const tally = el("div", { class: "tally" }, el("span", { class: "muted" }, "Waiting on: "),
    WAITING_ON.filter((w) => byWho[w]).map((who) => el("a", {
      href: "#", class: "tally-item" + (filter.waiting === who ? " active" : ""),
      onclick: (e) => { e.preventDefault(); setFilter({ ...filter, waiting: filter.waiting === who ? "" : who }); },
    }, waitingBadge(who), " ", el("strong", {}, byWho[who]))),
    runs.length ? null : el("span", { class: "muted" }, "no runs"));

  const rows = shown.map((run) => {
    const idle = !TERMINAL.has(run.state) && Date.now() - Date.parse(run.updated_at) > IDLE_WARN_MS;
    return el("tr", { class: "run-row" + (idle ? " idle" : ""), dataset: { runId: run.run_id, state: run.state, waitingOn: run.waiting_on } },
      el("td", {}, el("a", { href: runHref(run.run_id), class: "mono", title: run.run_id }, shortId(run.run_id)),
        run.scope ? el("div", { class: "scope" }, run.scope) : null),
      el("td", {}, stateBadge(run.state), run.cancel_requested && run.state !== "canceled" ? el("div", { class: "muted" }, "cancel requested") : null),
      el("td", { class: "waiting-cell" }, waitingBadge(run.waiting_on)),
      el("td", {}, progressBar(run.counts), countChips(run.counts)),
      el("td", {}, timeCell(run.created_at)),
      el("td", {}, timeCell(run.updated_at), idle ? el("div", { class: "idle-note" }, "no change for " + ago(run.updated_at)) : null),
      el("td", { class: "summary" }, run.summary),
      el("td", {}, (run.links || []).map((link) => el("div", {}, el("span", { class: "muted" }, link.relation.replaceAll("_", " ") + " "),
        el("a", { href: runHref(link.run_id), class: "mono", title: link.run_id }, shortId(link.run_id))))));
  });

  show(
    el("section", { class: "toolbar" }, el("h1", {}, "Runs"), el("label", { for: "state-filter" }, "State "), stateSelect,
      filter.waiting ? el("button", { type: "button", onclick: () => setFilter({ ...filter, waiting: "" }) }, "show all waiting") : null),
    tally,
    table(["Run", "State", "Waiting on", "Items", "Age", "Last change", "Summary", "Links"], rows,
      filter.state || filter.waiting ? "No runs match this filter." : "No runs yet."));
}

// ---- one run ----------------------------------------------------------------------

function fact(label, value) {
  if (value === null || value === undefined || value === "") return null;
  return [el("dt", {}, label), el("dd", {}, value)];
}

function leaseText(lease) {
  if (!lease) return "";
  return lease.worker_id + " (attempt " + lease.attempt + ", expires " + new Date(lease.expires_at).toLocaleTimeString() + ")";
}

async function renderRun(runId, seq) {
  const enc = encodeURIComponent(runId);
  const [run, items, attempts, history, lineage] = await Promise.all([
    api("/runs/" + enc), api("/runs/" + enc + "/items"), api("/runs/" + enc + "/attempts"),
    api("/runs/" + enc + "/history"), api("/runs/" + enc + "/lineage"),
  ]);
  if (seq !== renderSeq) return;

  const facts = el("dl", { class: "facts" },
    fact("revision", String(run.revision)),
    fact("input version", el("code", {}, run.input_version)),
    fact("source version", run.source_version), fact("config version", run.config_version),
    fact("created by", run.created_by), fact("created", timeCell(run.created_at)),
    fact("started", run.started_at ? timeCell(run.started_at) : null),
    fact("stopped", run.stopped_at ? timeCell(run.stopped_at) : null),
    fact("last change", timeCell(run.updated_at)),
    fact("failure", run.failure_kind ? run.failure_kind + " · " + (run.failure_reason || "") : null),
    fact("review", reviewText(run.review)),
    fact("cancel requested", run.cancel_requested ? "yes" : null));

  const lineageList = lineage.length > 1 ? el("section", {}, el("h2", {}, "Lineage"),
    el("ol", { class: "lineage" }, lineage.map((r) => el("li", { class: r.run_id === run.run_id ? "current" : "" },
      r.run_id === run.run_id ? el("strong", { class: "mono" }, shortId(r.run_id) + " (this run)")
        : el("a", { href: runHref(r.run_id), class: "mono", title: r.run_id }, shortId(r.run_id)),
      " ", stateBadge(r.state), " ", waitingBadge(r.waiting_on),
      (r.links || []).map((l) => el("span", { class: "muted" }, " " + l.relation.replaceAll("_", " ") + " " + shortId(l.run_id))))))) : null;

  const notAccepted = run.not_accepted && run.not_accepted.length ? el("section", {}, el("h2", {}, "Not accepted"),
    table(["Item", "State", "Required", "Why"], run.not_accepted.map((n) =>
      el("tr", {}, el("td", { class: "mono" }, n.item_id), el("td", {}, stateBadge(n.state)),
        el("td", {}, n.required ? "yes" : "no"), el("td", {}, n.reason || ""))), "")) : null;


  const itemRows = items.map((it) => el("tr", { dataset: { itemId: it.item_id } },
    el("td", { class: "mono" }, it.item_id), el("td", {}, itemChip(it.state)),
    el("td", {}, it.required ? "yes" : "no"), el("td", {}, String(it.attempts)), el("td", {}, leaseText(it.lease)),
    el("td", {}, it.reason && it.reason !== it.state ? el("div", {}, it.reason) : null,
      it.last_error ? el("div", { class: "error-text" }, it.last_error) : null)));

  const attemptRows = attempts.map((a) => el("tr", {},
    el("td", { class: "mono" }, a.item_id), el("td", {}, String(a.attempt)), el("td", {}, a.worker_id),
    el("td", {}, timeCell(a.started_at)), el("td", {}, a.finished_at ? timeCell(a.finished_at) : "running"),
    el("td", {}, a.stage || ""), el("td", {}, a.outcome || "in flight"), el("td", { class: "error-text" }, a.error || "")));

  const timeline = el("ol", { class: "timeline" }, history.map((t) => el("li", { class: t.item_id === null ? "run-step" : "item-step" },
    el("time", { datetime: t.at, title: t.at }, new Date(t.at).toLocaleString()),
    el("span", { class: "what" }, t.item_id === null ? "run" : el("span", {}, "item ", el("code", {}, t.item_id))),
    " ", el("span", { class: "from" }, t.from_state === "-" ? "new" : t.from_state.replaceAll("_", " ")), " → ",
    t.item_id === null ? stateBadge(t.to_state) : itemChip(t.to_state),
    el("span", { class: "who" }, " by " + t.actor_id + " (" + t.role + ")"),
    t.reason && t.reason !== t.to_state ? el("div", { class: "reason" }, t.reason) : null)));

  show(
    el("p", {}, el("a", { href: "#/" }, "← all runs")),
    el("section", { class: "run-head" },
      el("h1", {}, "Run ", el("span", { class: "mono" }, run.run_id)),
      run.scope ? el("p", { class: "scope" }, run.scope) : null,
      el("div", { class: "head-badges" }, stateBadge(run.state), waitingBadge(run.waiting_on, true)),
      el("p", { class: "hint" }, WAITING_HINT[run.waiting_on] || ""),
      el("p", { class: "summary big-summary" }, run.summary),
      el("div", { class: "counts" }, progressBar(run.counts), countChips(run.counts))),
    facts,
    (run.links || []).length ? el("p", {}, (run.links || []).map((l) => el("span", { class: "link" },
      l.relation.replaceAll("_", " ") + " ", el("a", { href: runHref(l.run_id), class: "mono" }, shortId(l.run_id)), " "))) : null,
    lineageList,
    notAccepted,
    el("section", {}, el("h2", {}, "Items (" + items.length + ")"),
      table(["Item", "State", "Required", "Attempts", "Lease", "Reason / last error"], itemRows, "No items.")),
    el("section", {}, el("h2", {}, "Attempts (" + attempts.length + ")"),
      table(["Item", "#", "Worker", "Started", "Finished", "Stage", "Outcome", "Error"], attemptRows, "No attempts yet.")),
    el("section", {}, el("h2", {}, "Timeline"), timeline));
}

// ---- routing and refresh -----------------------------------------------------------

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
    document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString() + " · every " + REFRESH_MS / 1000 + " s";
    document.getElementById("signout").hidden = false;
  } catch (error) {
    if (seq !== renderSeq) return;
    if (error instanceof NeedsToken) { showSignIn(error.message); return; }
    show(el("p", { class: "error", role: "alert" }, String(error.message || error)),
      el("p", {}, el("a", { href: "#/" }, "← all runs")));
  }
  if (seq === renderSeq) timer = setTimeout(() => { if (!document.hidden) route(); else timer = setTimeout(route, REFRESH_MS); }, REFRESH_MS);
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signout").addEventListener("click", async () => {
    await fetch("/session", { method: "DELETE", credentials: "same-origin" });
    route();
  });
  route();
});
