// The runbus console: plain JS over the ingress's own HTTP routes, with the user's token.
"use strict";

const state = { token: localStorage.getItem("runbus.token") || "", config: {}, stop: null };
const view = document.getElementById("view");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  if (!response.ok) {
    let code = "error", message = response.statusText;
    try { const body = await response.json(); code = body.error.code; message = body.error.message; } catch (_) { /* not JSON */ }
    if (response.status === 401) signOut();
    throw new ApiError(response.status, code, message);
  }
  return response.status === 204 ? null : response.json();
}

// SSE over fetch (an EventSource cannot send the Authorization header). `onTrace` gets the
// run's trace id from the stream's `Runbus-Trace-Id` (null when the stream does not name one).
async function follow(runId, onEvent, onTrace, signal) {
  const response = await fetch(`/v1/runs/${encodeURIComponent(runId)}/events`, {
    headers: { Authorization: `Bearer ${state.token}` }, signal,
  });
  if (response.ok) onTrace(response.headers.get("Runbus-Trace-Id"));
  if (response.status === 204) return;
  if (!response.ok) {
    const body = await response.json().catch(() => ({ error: { code: "error", message: response.statusText } }));
    throw new ApiError(response.status, body.error.code, body.error.message);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) onEvent(JSON.parse(data));
    }
  }
}

function status(value) { return el("span", { class: `status ${value}`, "data-status": value }, value); }
function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }
function failure(error) { return el("p", { class: "error", role: "alert" }, `${error.message} (${error.status || ""} ${error.code || ""})`); }

function show(...nodes) { view.replaceChildren(...nodes); }

async function runsPage() {
  const agents = await api("/v1/agents");
  const form = el("form", { class: "inline card", id: "start-form", onsubmit: startRun },
    el("label", {}, "Agent ", el("select", { name: "agent" }, agents.agents.map((a) => el("option", { value: a.name }, a.name)))),
    el("label", {}, "Session ", el("input", { name: "session_id", placeholder: "new session", size: 14 })),
    el("label", { style: "flex:1" }, "Message ", el("input", { name: "text", required: "", style: "width:100%" })),
    el("button", { class: "primary", type: "submit" }, "Start run"));
  const listed = await api("/v1/runs?limit=50");
  const rows = nested(listed.records).map(({ r, depth }) => el("tr", { "data-run": r.run_id, class: depth ? "child" : "" },
    el("td", { style: `padding-left:${0.5 + 1.5 * depth}em` }, depth ? "↳ " : "", el("a", { href: `#run/${r.run_id}`, class: "mono" }, r.run_id)),
    el("td", {}, r.agent), el("td", {}, el("a", { href: `#session/${r.session_id}`, class: "mono" }, r.session_id)),
    el("td", {}, status(r.status)), el("td", { class: "muted" }, when(r.created_at)),
    el("td", {}, (r.text || (r.error && r.error.message) || "").slice(0, 80))));
  show(el("h1", {}, "Runs"), form,
    el("div", { class: "table" }, el("table", { id: "runs" }, el("tr", {}, ["Run", "Agent", "Session", "Status", "Started", "Answer"].map((h) => el("th", {}, h))), rows)));
}

// Child runs (agents called as tools) under their parent, newest parents first; a child whose
// parent is not on the page is shown at the top level.
function nested(records) {
  const present = new Set(records.map((r) => r.run_id));
  const children = {};
  for (const r of records) if (r.parent_run_id && present.has(r.parent_run_id)) (children[r.parent_run_id] ||= []).push(r);
  const out = [];
  const add = (r, depth) => {
    out.push({ r, depth });
    for (const child of (children[r.run_id] || []).slice().reverse()) add(child, depth + 1);
  };
  for (const r of records) if (!(r.parent_run_id && present.has(r.parent_run_id))) add(r, 0);
  return out;
}

async function startRun(event) {
  event.preventDefault();
  const data = new FormData(event.target);
  const body = { agent: data.get("agent"), text: data.get("text") };
  if (data.get("session_id")) body.session_id = data.get("session_id");
  try {
    const started = await api("/v1/runs?detach=true", { method: "POST", body: JSON.stringify(body) });
    localStorage.setItem(`runbus.trace.${started.run_id}`, started.trace_id);
    location.hash = `#run/${started.run_id}`;
  } catch (error) { event.target.after(failure(error)); }
}

// Jaeger's UI shows `/trace/<id>`; another UI is given as a template with `{trace_id}`.
function traceLink(traceId) {
  const url = state.config.jaeger_url;
  return url.includes("{trace_id}") ? url.replace("{trace_id}", traceId) : `${url}/trace/${traceId}`;
}

function traceView(traceId) {
  if (!traceId) return el("span", { class: "muted" }, "not known (no stored event of the run names one)");
  return state.config.jaeger_url
    ? el("a", { id: "trace", class: "mono", href: traceLink(traceId), target: "_blank", rel: "noopener" }, traceId)
    : el("span", { id: "trace", class: "mono" }, traceId);
}

// A call's approval is decided: no longer shown pending, its buttons replaced by the decision.
function settled(box, decision) {
  box.classList.remove("approval");
  box.classList.add("approval-settled", decision);
  const buttons = box.querySelector(".buttons");
  if (buttons && !buttons.querySelector(".decided")) buttons.replaceChildren(el("span", { class: "decided" }, decision));
}

async function runPage(runId) {
  let record;
  // A run just started is there at once: `queued` until a gateway replica takes it.
  try { record = await api(`/v1/runs/${encodeURIComponent(runId)}`); } catch (error) {
    show(el("h1", {}, "Run ", el("span", { class: "mono" }, runId)), failure(error));
    return;
  }
  const answer = el("div", { class: "answer", id: "answer" });
  const tools = el("div", { id: "tools" });
  const todos = el("ul", { id: "todos" });
  const usage = el("div", { id: "usage", class: "muted" }, "—");
  const badge = el("span", { id: "run-status" }, status(record.status));
  // Known at once for a run started in this browser; for any other, the events stream names it.
  const startedHere = localStorage.getItem(`runbus.trace.${runId}`);
  const trace = el("span", { id: "trace-slot" }, startedHere ? traceView(startedHere) : el("span", { class: "muted" }, "…"));
  const onTrace = (traceId) => trace.replaceChildren(traceView(traceId || startedHere));
  const controls = el("div", { id: "controls", class: "inline" });
  const pausable = (value) => ["queued", "running", "waiting_approval"].includes(value);
  const pause = el("button", { id: "pause", onclick: async () => {
    try {
      const asked = await api(`/v1/runs/${encodeURIComponent(runId)}/pause`, { method: "POST" });
      pause.disabled = true;
      pause.textContent = asked.status === "paused" ? "Paused" : "Pausing at the next step…";
    } catch (error) { controls.append(failure(error)); }
  } }, "Pause");
  pause.hidden = !pausable(record.status);
  controls.append(pause, forkForm(runId));
  const parent = record.parent_run_id
    ? [" · child of ", el("a", { id: "parent", class: "mono", href: `#run/${record.parent_run_id}` }, record.parent_run_id)]
    : [];
  const children = el("ul", { id: "children" });
  show(el("h1", {}, "Run ", el("span", { class: "mono" }, runId), " ", badge),
    el("p", { class: "muted" }, `agent ${record.agent} · session `, el("a", { href: `#session/${record.session_id}` }, record.session_id), " · trace ", trace, ...parent),
    controls,
    el("div", { class: "card", id: "children-card", hidden: "" }, el("h2", {}, "Agents it called"), children),
    el("div", { class: "grid" },
      el("div", {}, el("div", { class: "card" }, el("h2", {}, "Answer"), answer), el("div", { class: "card" }, el("h2", {}, "Tool calls"), tools)),
      el("div", {}, el("div", { class: "card" }, el("h2", {}, "Todo list"), todos), el("div", { class: "card" }, el("h2", {}, "Usage"), usage))));
  const calls = {};
  const messages = {};
  const refreshTodos = async () => {
    const session = await api(`/v1/sessions/${encodeURIComponent(record.session_id)}`);
    const items = ((session.state || {}).todos || {}).items || [];
    todos.replaceChildren(...(items.length ? items.map((t) => el("li", {}, t.done ? "☑ " : "☐ ", t.title)) : [el("li", { class: "muted" }, "none")]));
  };
  refreshTodos().catch(() => {});
  const refreshChildren = async () => {
    const listed = await api(`/v1/runs?parent_run_id=${encodeURIComponent(runId)}`);
    children.replaceChildren(...listed.records.map((c) => el("li", { "data-child": c.run_id },
      el("a", { class: "mono", href: `#run/${c.run_id}` }, c.run_id), ` ${c.agent} `, status(c.status))));
    // Shown only for a run that called other agents.
    children.parentElement.hidden = !listed.records.length;
  };
  refreshChildren().catch((error) => { children.replaceChildren(failure(error)); children.parentElement.hidden = false; });
  const controller = new AbortController();
  state.stop = () => controller.abort();
  const onEvent = (event) => {
    switch (event.type) {
      case "run.started": badge.replaceChildren(status("running")); break;
      case "run.text_delta": {
        // Each assistant message of the run is a block of its own (one before a tool call,
        // another after it), never run together.
        let message = messages[event.message_id];
        if (!message) {
          message = messages[event.message_id] = el("div", { class: "message", "data-message": event.message_id });
          answer.append(message);
        }
        message.append(event.delta);
        break;
      }
      case "run.tool_call": {
        const box = el("div", { class: "tool", "data-call": event.call.call_id },
          el("b", {}, event.call.name), el("pre", {}, JSON.stringify(event.call.arguments)));
        calls[event.call.call_id] = box; tools.append(box); break;
      }
      case "run.approval_requested": {
        const box = calls[event.call_id] || tools.appendChild(el("div", { class: "tool" }, el("b", {}, event.tool)));
        box.classList.add("approval");
        badge.replaceChildren(status("waiting_approval"));
        const decide = (decision, reply) => async () => {
          try {
            const body = reply ? { decision, note: reply.value } : { decision };
            const decided = await api(`/v1/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(event.call_id)}`, { method: "POST", body: JSON.stringify(body) });
            settled(box, decided.decision);
            // Unless the run's own events got further while the decision was on its way.
            if (badge.firstChild && badge.firstChild.dataset.status === "waiting_approval") badge.replaceChildren(status("running"));
          } catch (error) { buttons.append(failure(error)); }
        };
        // A tool's question: the answer goes back as the approval's note.
        const reply = el("input", { class: "answer-input", placeholder: "your answer" });
        const buttons = event.question
          ? el("div", { class: "buttons" }, el("span", {}, `${event.tool} asks: ${event.reason} `), reply,
            el("button", { class: "primary", onclick: decide("approved", reply) }, "Answer"),
            el("button", { class: "deny", onclick: decide("denied") }, "Decline"))
          : el("div", { class: "buttons" }, el("span", {}, `Needs approval: ${event.reason} `),
            el("button", { class: "primary", onclick: decide("approved") }, "Approve"),
            el("button", { class: "deny", onclick: decide("denied") }, "Deny"));
        box.append(buttons); break;
      }
      case "run.tool_result": {
        const box = calls[event.result.call_id] || tools.appendChild(el("div", { class: "tool" }));
        // A call that waited for a person has been decided once it has a result.
        if (box.classList.contains("approval")) settled(box, event.result.error ? "denied" : "approved");
        const shown = event.result.error ? `error: ${event.result.error}` : JSON.stringify(event.result.result, null, 1);
        box.append(el("pre", { class: "result" }, "→ ", shown));
        if (box.textContent.includes("todos_")) refreshTodos().catch(() => {});
        break;
      }
      case "run.paused": {
        badge.replaceChildren(status("paused"));
        pause.hidden = true;
        const shown = document.getElementById("pending");
        if (shown) shown.remove();
        controls.after(pendingEditor(runId, event.calls));
        break;
      }
      case "run.resumed": {
        badge.replaceChildren(status("running"));
        const shown = document.getElementById("pending");
        if (shown) shown.remove();
        pause.hidden = false; pause.disabled = false; pause.textContent = "Pause";
        break;
      }
      case "run.completed":
        pause.hidden = true;
        badge.replaceChildren(status("completed"));
        if (!answer.textContent) answer.append(el("div", { class: "message" }, event.text));
        usage.textContent = `${event.usage.input_tokens} tokens in · ${event.usage.output_tokens} tokens out` +
          (event.usage.cost ? ` · cost ${event.usage.cost.toFixed(4)}` : "");
        refreshTodos().catch(() => {});
        refreshChildren().catch(() => {});  // the children it waited on have ended too
        break;
      case "run.failed":
        pause.hidden = true;
        badge.replaceChildren(status(event.error.code === "cancelled" ? "cancelled" : "failed"));
        answer.after(failure({ message: event.error.message, code: event.error.code }));
        break;
    }
  };
  follow(runId, onEvent, onTrace, controller.signal).catch((error) => { if (error.name !== "AbortError") answer.after(failure(error)); });
}

// A paused run's pending calls, each with its arguments to edit (JSON) or drop, a message to
// add, and Resume: the edit is sent first, and a refused edit leaves the run paused.
function pendingEditor(runId, calls) {
  const rows = calls.map((call) => ({
    call,
    args: el("textarea", { class: "args", "data-call": call.call_id, rows: 3, spellcheck: "false" }),
    drop: el("input", { type: "checkbox", "data-drop": call.call_id }),
  }));
  for (const row of rows) row.args.value = JSON.stringify(row.call.arguments, null, 1);
  const note = el("input", { id: "pause-note", placeholder: "a message for the model (optional)", style: "width:100%" });
  const problem = el("div", { id: "edit-error" });
  const path = (action) => `/v1/runs/${encodeURIComponent(runId)}/${action}`;
  const edit = () => {
    const body = { replace: [], drop: [], add: [] };
    for (const { call, args, drop } of rows) {
      if (drop.checked) { body.drop.push(call.call_id); continue; }
      let value;
      try { value = JSON.parse(args.value); } catch (_) { throw new ApiError(0, "bad_json", `the arguments of ${call.name} are not JSON`); }
      if (JSON.stringify(value) !== JSON.stringify(call.arguments)) body.replace.push({ call_id: call.call_id, arguments: value });
    }
    if (note.value.trim()) body.add.push(note.value.trim());
    return body;
  };
  const resume = async () => {
    problem.replaceChildren();
    try {
      const body = edit();
      if (body.replace.length || body.drop.length || body.add.length) {
        await api(path("edit"), { method: "POST", body: JSON.stringify(body) });
        note.value = "";
      }
      await api(path("resume"), { method: "POST" });
    } catch (error) { problem.replaceChildren(failure(error)); }
  };
  return el("div", { class: "card paused", id: "pending" },
    el("h2", {}, "Paused before these calls run"),
    rows.length ? rows.map(({ call, args, drop }) => el("div", { class: "tool", "data-pending": call.call_id },
      el("b", {}, call.name), " ", el("span", { class: "mono muted" }, call.call_id), args,
      el("label", {}, drop, " drop this call"))) : el("p", { class: "muted" }, "No pending calls: the model is asked next."),
    note, problem,
    el("div", { class: "buttons" }, el("button", { class: "primary", id: "resume", onclick: resume }, "Resume")));
}

// Time travel: a new session from one of the run's checkpoints (empty: all of its messages).
function forkForm(runId) {
  const form = el("form", { id: "fork", class: "inline", onsubmit: async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const body = { session_id: data.get("session_id") };
    if (data.get("checkpoint") !== "") body.checkpoint = Number(data.get("checkpoint"));
    form.querySelector(".error")?.remove();
    try {
      const forked = await api(`/v1/runs/${encodeURIComponent(runId)}/fork`, { method: "POST", body: JSON.stringify(body) });
      location.hash = `#session/${forked.session_id}`;
    } catch (error) { form.append(failure(error)); }
  } },
  el("input", { name: "session_id", placeholder: "new session id", required: "", size: 14 }),
  el("input", { name: "checkpoint", type: "number", min: "0", placeholder: "checkpoint (all)", style: "width:11em" }),
  el("button", { type: "submit" }, "Fork"));
  return form;
}

async function sessionsPage() {
  const listed = await api("/v1/sessions?limit=100");
  show(el("h1", {}, "Sessions"), el("div", { class: "table" }, el("table", { id: "sessions" },
    el("tr", {}, ["Session", "Agent", "Messages", "Updated"].map((h) => el("th", {}, h))),
    listed.records.map((s) => el("tr", {},
      el("td", {}, el("a", { href: `#session/${s.session_id}`, class: "mono" }, s.session_id)),
      el("td", {}, s.agent), el("td", {}, s.history_length), el("td", { class: "muted" }, when(s.updated_at)))))));
}

async function sessionPage(sessionId) {
  try {
    const [loaded, runs] = await Promise.all([
      api(`/v1/sessions/${encodeURIComponent(sessionId)}/messages`),
      api(`/v1/runs?session_id=${encodeURIComponent(sessionId)}`)]);
    const text = (m) => m.contents.map((c) => c.type === "text" ? c.text : c.type === "function_call" ? `[calls ${c.name}]` : c.type === "function_result" ? `[result ${JSON.stringify(c.result ?? c.error)}]` : "").join(" ");
    show(el("h1", {}, "Session ", el("span", { class: "mono" }, sessionId)),
      el("div", { class: "card", id: "transcript" }, loaded.messages.map((m) => el("div", { class: "msg" }, el("b", {}, m.role), text(m)))),
      el("h2", {}, "Runs"), el("ul", {}, runs.records.map((r) => el("li", {}, el("a", { href: `#run/${r.run_id}` }, r.run_id), " ", status(r.status)))));
  } catch (error) { show(el("h1", {}, "Session"), failure(error)); }
}

async function memoriesPage() {
  const listed = await api("/v1/memories?limit=200");
  const forget = (id, row) => async () => {
    try { await api(`/v1/memories/${encodeURIComponent(id)}`, { method: "DELETE" }); row.remove(); } catch (error) { row.append(failure(error)); }
  };
  show(el("h1", {}, "Memories"), el("div", { class: "table" }, el("table", { id: "memories" },
    el("tr", {}, ["Memory", "Session", "When", ""].map((h) => el("th", {}, h))),
    listed.memories.map((m) => {
      const row = el("tr", {}, el("td", {}, m.text), el("td", { class: "mono" }, m.session_id), el("td", { class: "muted" }, when(m.created_at)));
      row.append(el("td", {}, el("button", { class: "deny", onclick: forget(m.memory_id, row) }, "Forget")));
      return row;
    }))));
}

function signOut() {
  state.token = ""; state.me = null; localStorage.removeItem("runbus.token"); sessionStorage.clear(); route();
}

// Who the token stands for, shown in the header while signed in.
async function whoAmI() {
  if (!state.me) state.me = await api("/v1/me");
  document.getElementById("who").replaceChildren("Signed in as ",
    el("b", { id: "who-user" }, state.me.user_id), el("span", { class: "tenant" }, ` (${state.me.tenant})`));
}

async function route() {
  if (state.stop) { state.stop(); state.stop = null; }
  const signedIn = Boolean(state.token);
  document.getElementById("signin").hidden = signedIn;
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("signout").hidden = !signedIn;
  if (!signedIn) { document.getElementById("who").replaceChildren(); view.replaceChildren(); return; }
  whoAmI().catch(() => {});
  const [page, arg] = (location.hash.slice(1) || "runs").split("/");
  try {
    if (page === "run") await runPage(decodeURIComponent(arg));
    else if (page === "sessions") await sessionsPage();
    else if (page === "session") await sessionPage(decodeURIComponent(arg));
    else if (page === "memories") await memoriesPage();
    else await runsPage();
  } catch (error) { show(failure(error)); }
}

document.getElementById("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  state.token = document.getElementById("token").value.trim();
  try {
    state.me = await api("/v1/me");
    localStorage.setItem("runbus.token", state.token);
    document.getElementById("signin-error").textContent = "";
    route();
  } catch (error) {
    state.token = "";
    document.getElementById("signin-error").textContent = `Sign-in refused: ${error.message}`;
  }
});
document.getElementById("signout").addEventListener("click", signOut);
window.addEventListener("hashchange", route);
fetch("/console/config.json").then((r) => r.json()).then((c) => { state.config = c; }).finally(route);
