// The memproxy inspector (docs/inspector.md): plain script over the memory API, no framework.
//
// Memory text is hostile input. Every piece of data reaches the page as a text node or an
// attribute value set through the DOM (el() below); nothing is ever parsed as HTML.
// The token lives in sessionStorage: this tab only, never in a URL or a cookie.
"use strict";

const API = "/memory/v1";
const TOKEN_KEY = "memproxy.inspector.token";
const PAGE = 1000;
const GRAPH_MAX_NODES = 60;
const FIRST_WORDS_OF = 50;  // conversations whose first words the users view fetches
const SVG = "http://www.w3.org/2000/svg";

// --- DOM -------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  return fill(node, attrs, children);
}

function svg(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

function fill(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
  main.focus();
}

function say(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text || "";
  status.className = kind || "";
}

function day(iso) {
  return iso ? iso.slice(0, 10) : "";
}

function when(iso) {
  return iso ? iso.slice(0, 19).replace("T", " ") + " UTC" : "";
}

function millis(iso) {
  // Python writes microseconds; Date.parse is only sure of milliseconds.
  return Date.parse(iso.replace(/(\.\d{3})\d+/, "$1"));
}

// --- the memory API ----------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(method, path, body) {
  const headers = {};
  const secret = token();
  if (secret) headers.Authorization = "Bearer " + secret;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(API + path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    const message = data && data.error ? data.error.message : "HTTP " + response.status;
    if (response.status === 401) signOut("The token was refused: " + message);
    throw new ApiError(response.status, message);
  }
  return data;
}

async function all(path, limit) {
  const items = [];
  let cursor = null;
  do {
    const query = "?limit=" + PAGE + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const page = await api("GET", path + query);
    items.push(...page.data);
    cursor = page.next_cursor;
  } while (cursor && items.length < (limit || Infinity));
  return items;
}

function userPath(user, ...parts) {
  return ["/users", user, ...parts].map((p, i) => (i ? encodeURIComponent(p) : p)).join("/");
}

// --- navigation: the view lives in the fragment (#user=..&view=..), never the token --------

function route() {
  return new URLSearchParams(location.hash.slice(1));
}

function go(params) {
  const hash = "#" + new URLSearchParams(params).toString();
  if (location.hash === hash) render();
  else location.hash = hash;
}

function link(text, params, attrs) {
  return el("a", { href: "#" + new URLSearchParams(params).toString(), ...(attrs || {}) }, text);
}

function nav(user, current) {
  const bar = document.getElementById("nav");
  bar.hidden = false;
  const views = [["users", "Users"], ["memories", "Memories"], ["graph", "Memory graph"], ["search", "Search"]];
  bar.replaceChildren(
    ...views.map(([view, label]) => link(label, user && view !== "users" ? { user, view } : { view: "users", user: user || "" },
      { "aria-current": view === current ? "page" : undefined, class: !user && view !== "users" ? "off" : undefined })),
    el("button", { type: "button", class: "quiet", onclick: () => signOut("Signed out.") }, "Sign out"));
}

// The view's fragment is written on <main> once the view has finished loading (tests wait for it).
async function render() {
  const main = document.getElementById("main");
  main.removeAttribute("data-view");
  try {
    await renderView();
  } finally {
    main.setAttribute("data-view", token() === null ? "login" : location.hash);
  }
}

async function renderView() {
  if (token() === null && !(await openWithoutToken())) return login();
  const params = route();
  const user = params.get("user") || "";
  const view = params.get("view") || "users";
  nav(user, view === "conversation" ? "users" : view);
  try {
    if (!user || view === "users") await usersView(user);
    else if (view === "conversation" && params.get("id")) await conversationView(user, params.get("id"));
    else if (view === "memories") await memoriesView(user);
    else if (view === "graph") await graphView(user);
    else if (view === "search") await searchView(user, params.get("q") || "");
    else await usersView(user);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return;
    show(el("p", { class: "error" }, "Could not load this view: " + error.message));
  }
}

// --- sign in -----------------------------------------------------------------------------

// With no memory_api.token configured the API answers loopback clients without one: the page
// opens at once instead of asking for a token there is none of.
async function openWithoutToken() {
  const probe = await fetch(API + "/users/token-check", { credentials: "omit", cache: "no-store" }).catch(() => null);
  if (!probe || probe.status === 401 || probe.status === 403) return false;
  sessionStorage.setItem(TOKEN_KEY, "");
  return true;
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("nav").hidden = true;
  login(message);
}

function login(message) {
  const input = el("input", { id: "token", type: "password", name: "token", autocomplete: "off", spellcheck: "false" });
  const error = el("p", { id: "login-error", class: "error", role: "alert" }, message || "");
  const form = el("form", { id: "login", onsubmit: async (event) => {
    event.preventDefault();
    const typed = input.value.trim();
    // Any user will do to test the token: the API checks it before it looks at the path.
    const headers = typed ? { Authorization: "Bearer " + typed } : {};
    const probe = await fetch(API + "/users/token-check", { headers, credentials: "omit", cache: "no-store" });
    if (probe.status === 401 || probe.status === 403) {
      const body = await probe.json().catch(() => null);
      error.textContent = "Refused: " + (body && body.error ? body.error.message : "HTTP " + probe.status);
      input.select();
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, typed);
    render();
  } },
  el("label", { for: "token" }, "Memory API token (memory_api.token; leave empty on loopback when none is set)"),
  input, el("button", { type: "submit" }, "Open"), error);
  document.getElementById("nav").hidden = true;
  show(el("section", { class: "card" }, el("h2", {}, "Sign in"), form,
    el("p", { class: "hint" }, "The token is kept for this tab only and sent only to this memproxy.")));
  input.focus();
}

// --- confirmation --------------------------------------------------------------------------

function confirmDelete(what) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = "Delete " + what.kind + "?";
  document.getElementById("confirm-text").textContent = what.text;
  return new Promise((resolve) => {
    const ok = document.getElementById("confirm-ok");
    const cancel = document.getElementById("confirm-cancel");
    const done = (answer) => {
      ok.removeEventListener("click", yes);
      cancel.removeEventListener("click", no);
      dialog.removeEventListener("cancel", no);
      dialog.close();
      resolve(answer);
    };
    const yes = () => done(true);
    const no = () => done(false);
    ok.addEventListener("click", yes);
    cancel.addEventListener("click", no);
    dialog.addEventListener("cancel", no);
    dialog.showModal();
    cancel.focus();
  });
}

// `path` is the item's path under the user ("memories/<id>"), or "" for the user itself.
function deleteButton(user, kind, path, id, text, after) {
  return el("button", { type: "button", class: "danger small", "data-delete": kind, "data-id": id,
    "aria-label": "Delete " + kind + " " + id, onclick: async () => {
      if (!(await confirmDelete({ kind, text }))) return;
      const parts = path ? path.split("/") : [];
      const result = await api("DELETE", userPath(user, ...parts)).catch((e) => say(e.message, "error"));
      if (!result) return;
      say("Deleted " + kind + " " + id + ": " + counts(result.deleted), "ok");
      await after();
    } }, kind === "user" ? "Delete user " + id + "…" : ["conversation", "entity"].includes(kind) ? "Delete " + kind : "Delete");
}

function counts(deleted) {
  return Object.entries(deleted || {}).filter(([, n]) => n).map(([table, n]) => n + " " + table).join(", ") || "nothing";
}

// --- Users ---------------------------------------------------------------------------------

async function usersView(user) {
  const input = el("input", { id: "user-id", name: "user", value: user, autocomplete: "off", spellcheck: "false" });
  const form = el("form", { id: "find-user", class: "inline", onsubmit: (event) => {
    event.preventDefault();
    go({ view: "users", user: input.value.trim() });
  } }, el("label", { for: "user-id" }, "User id"), input, el("button", { type: "submit" }, "Find"));
  const section = el("section", { id: "users" }, el("h2", {}, "Users"), form);
  show(section);
  if (!user) return input.focus();
  let stats;
  try {
    stats = await api("GET", userPath(user));
  } catch (error) {
    if (error.status !== 404) throw error;
    return section.append(el("p", { class: "empty" }, error.message));
  }
  const conversations = await all(userPath(user, "conversations"));
  const opening = await firstWords(user, conversations.slice(0, FIRST_WORDS_OF));
  section.append(
    el("dl", { class: "stats", id: "user-stats" },
      el("dt", {}, "User"), el("dd", {}, stats.user),
      el("dt", {}, "Conversations"), el("dd", { "data-count": "conversations" }, stats.conversations),
      el("dt", {}, "Messages"), el("dd", { "data-count": "messages" }, stats.messages),
      el("dt", {}, "Entities"), el("dd", { "data-count": "entities" }, stats.entities)),
    el("h3", {}, "Conversations"),
    el("ul", { class: "list", id: "conversations" }, conversations.map((c) => el("li", { "data-conversation": c.id },
      link(opening.get(c.id) || c.id, { user, view: "conversation", id: c.id }),
      el("span", { class: "meta" }, " " + c.id + ", " + plural(c.message_count, "message") + ", started " +
        when(c.created_at) + ", last active " + when(c.last_active_at))))),
    el("h3", {}, "Delete this user"),
    el("p", {}, deleteButton(user, "user", "", user,
      `Everything memproxy holds for user ${user}: ${stats.conversations} conversations, ${stats.messages} messages, ` +
      `${stats.entities} entities, their relationships, reasoning traces and the injection log. This cannot be undone.`,
      () => go({ view: "users", user }))));
}

// Each conversation's first words, to know it by (the listing holds ids and times only).
async function firstWords(user, conversations) {
  const firsts = await Promise.all(conversations.map((c) =>
    api("GET", userPath(user, "conversations", c.id, "messages") + "?limit=1").catch(() => null)));
  return new Map(conversations.map((c, i) => {
    const first = firsts[i] && firsts[i].data.length ? firsts[i].data[0].content.trim() : "";
    return [c.id, first ? "“" + short(first.replace(/\s+/g, " "), 80) + "”" : ""];
  }));
}

// The names of the entities a graph line was expanded from (the log keeps their ids).
async function entityNames(user, hits) {
  const ids = [...new Set(hits.map((h) => h.score && h.score.entity).filter(Boolean))];
  const found = await Promise.all(ids.map((id) => api("GET", userPath(user, "entities", id)).catch(() => null)));
  return new Map(ids.map((id, i) => [id, found[i] ? found[i].name : null]));
}

// --- Conversation --------------------------------------------------------------------------

async function conversationView(user, id) {
  const [messages, injections, traces] = await Promise.all([
    all(userPath(user, "conversations", id, "messages")),
    api("GET", userPath(user, "injections")),
    all(userPath(user, "reasoning"), PAGE),
  ]);
  const turns = new Map(messages.filter((m) => m.role === "user").map((m) => [m.id, { entries: [], traces: [] }]));
  const owner = (at) => {
    let found = null;
    for (const m of messages) if (m.role === "user" && millis(m.created_at) <= millis(at)) found = m;
    return found;
  };
  for (const entry of injections.data.filter((e) => e.conversation_id === id)) {
    const m = owner(entry.created_at);
    if (m) turns.get(m.id).entries.push(entry);
  }
  for (const trace of traces.filter((t) => t.conversation_id === id)) {
    const m = owner(trace.created_at);
    if (m) turns.get(m.id).traces.push(trace);
  }
  const names = await entityNames(user, injections.data.filter((e) => e.conversation_id === id)
    .flatMap((e) => (e.log && e.log.hits) || []));
  const reload = () => conversationView(user, id);
  const head = el("div", { class: "message-head" }, el("h2", {}, "Conversation " + id),
    deleteButton(user, "conversation", "conversations/" + id, id,
      `Conversation ${id}: its ${messages.length} messages, turns, reasoning traces and injection log. ` +
      "Entities extracted from it stay.", () => go({ view: "users", user })));
  show(el("section", { id: "conversation" }, head,
    el("p", { class: "hint" }, "Each user turn shows the memory block it was given, resolved now from the injection log " +
      "(the log keeps only ids and scores; the last 20 turns of the user are kept)."),
    el("ol", { class: "messages" }, messages.map((m) => el("li", { class: "message " + m.role, "data-message": m.id },
      el("div", { class: "message-head" }, el("strong", {}, m.role), el("span", { class: "meta" }, when(m.created_at)),
        deleteButton(user, "message", "messages/" + m.id, m.id, `Message ${m.id} (${m.role}, ${when(m.created_at)}): "${m.content}"`,
          reload)),
      el("p", { class: "text" }, m.content),
      turns.has(m.id) ? turnDetails(turns.get(m.id), names) : null)))));
}

function turnDetails(turn, names) {
  const parts = [];
  for (const entry of turn.entries) parts.push(injected(entry, names));
  if (!turn.entries.length) parts.push(el("p", { class: "meta" }, "No injection logged for this turn (nothing found, memory off, or older than the last 20 turns)."));
  for (const trace of turn.traces) {
    parts.push(el("details", { class: "trace" }, el("summary", {}, "Tool loop: " + plural(trace.steps.length, "step") + " and the reasoning trace"),
      el("ol", { class: "steps" }, trace.steps.map((s) => el("li", {},
        el("code", {}, s.name + "(" + s.arguments + ")"), " → ", el("span", {}, s.result)))),
      el("p", {}, el("strong", {}, "Answer: "), trace.answer)));
  }
  return el("div", { class: "turn" }, parts);
}

function injected(entry, names) {
  const log = entry.log || {};
  const hits = log.hits || [];
  return el("div", { class: "injection", "data-turn": entry.turn_id },
    el("p", { class: "meta" }, (entry.injected ? `Injected ${plural(entry.injected, "memory", "memories")}` :
      "Nothing injected") + ", " + when(entry.created_at) +
      (log.budget_cut ? " (token budget cut some)" : "") + (log.cache ? " (cached block)" : "")),
    el("ol", { class: "hits" }, hits.map((hit) => hitItem(hit, names))),
    el("details", {}, el("summary", {}, "Retrieval details"),
      el("p", { class: "meta" }, "Candidates per source: " + JSON.stringify(log.candidates || {})),
      el("p", { class: "meta" }, "Milliseconds per source: " + JSON.stringify(log.sources_ms || {})),
      Object.keys(log.errors || {}).length ? el("p", { class: "error" }, "Errors: " + JSON.stringify(log.errors)) : null));
}

function hitItem(hit, names) {
  const state = hit.now && hit.now !== "current" ? el("span", { class: "badge " + hit.now }, hit.now === "deleted" ?
    "deleted since" : "changed since") : null;
  return el("li", { class: "hit", "data-source": hit.source, "data-id": hit.id },
    el("span", { class: "source" }, "[" + hit.source + "]"), " ",
    el("span", { class: "hit-text" }, hit.text === undefined ? hit.content : hit.text === null ? "(deleted)" : hit.text),
    state,
    el("span", { class: "why" }, " — " + reasonText(hit, names) + "; score " + scoreText(hit.score) +
      (hit.tokens !== undefined && hit.tokens !== null ? "; " + hit.tokens + " tokens" : "")));
}

// A graph line's reason names the entity it was expanded from, by name when it still exists.
function reasonText(hit, names) {
  const entity = hit.score && hit.score.entity;
  if (!entity) return hit.reason;
  const name = names.get(entity);
  return hit.reason + " from " + (name ? name : "entity " + entity + (names.has(entity) ? " (deleted)" : ""));
}

function plural(count, one, many) {
  return count + " " + (count === 1 ? one : many || one + "s");
}

function scoreText(score) {
  const parts = Object.entries(score || {}).filter(([k]) => k !== "entity").map(([k, v]) => k + " " + (typeof v === "number" ? +v.toPrecision(3) : v));
  return parts.length ? parts.join(", ") : "—";
}

// --- Memories: list, correct, delete ---------------------------------------------------------

async function memoriesView(user) {
  const memories = await all(userPath(user, "memories"));
  const reload = () => memoriesView(user);
  show(el("section", { id: "memories" }, el("h2", {}, "Memories of " + user),
    memories.length ? null : el("p", { class: "empty" }, "No long-term memories."),
    el("ul", { class: "list" }, memories.map((m) => memoryItem(user, m, reload)))));
}

// How a memory stored explicitly came in (the memory API's `stored_via`).
const STORED_VIA = { mcp: "MCP", tools: "tools mode", memory_api: "the memory API" };

function memoryItem(user, memory, reload) {
  const text = el("p", { class: "text" }, memory.content);
  const item = el("li", { class: "memory", "data-memory": memory.id },
    el("div", { class: "message-head" },
      memory.name && memory.name !== memory.content ? el("strong", {}, memory.name) : null,
      el("span", { class: "meta" }, [...new Set([memory.type, memory.entity_type].filter(Boolean))].join(", ") +
        ", " + when(memory.updated_at || memory.created_at) +
        (memory.stored_via ? ", stored via " + (STORED_VIA[memory.stored_via] || memory.stored_via) : ""))),
    text);
  const edit = el("button", { type: "button", class: "small", onclick: () => {
    const area = el("textarea", { rows: 3, "aria-label": "Corrected text of memory " + memory.id });
    area.value = memory.content;
    const form = el("form", { class: "edit", onsubmit: async (event) => {
      event.preventDefault();
      const saved = await api("PATCH", userPath(user, "memories", memory.id), { content: area.value })
        .catch((e) => say(e.message, "error"));
      if (saved) { say("Corrected memory " + memory.id, "ok"); await reload(); }
    } }, area, el("button", { type: "submit" }, "Save"), el("button", { type: "button", onclick: reload }, "Cancel"));
    text.replaceWith(form);
    area.focus();
  } }, "Correct");
  item.append(el("div", { class: "actions" }, edit,
    deleteButton(user, "memory", "memories/" + memory.id, memory.id, `Memory ${memory.id}: "${memory.content}"`, reload)));
  return item;
}

// --- Memory graph ----------------------------------------------------------------------------

async function graphView(user) {
  const [stats, entities] = await Promise.all([api("GET", userPath(user)).catch(() => null),
    all(userPath(user, "entities"), GRAPH_MAX_NODES)]);
  const shown = entities.slice(0, GRAPH_MAX_NODES);
  const details = await Promise.all(shown.map((e) => api("GET", userPath(user, "entities", e.id))));
  const edges = new Map();
  for (const d of details) for (const r of d.relationships) edges.set(r.id, r);
  const selfId = stats ? stats.user_entity_id : null;
  const facts = el("section", { id: "facts", "aria-live": "polite", tabindex: -1 },
    el("p", { class: "hint" }, "Choose a node (click, or Tab to it and press Enter) to list its facts."));
  const reload = () => graphView(user);
  show(el("section", { id: "graph" }, el("h2", {}, "Memory graph of " + user),
    entities.length > GRAPH_MAX_NODES ? el("p", { class: "meta" }, `Showing the first ${GRAPH_MAX_NODES} of the entities.`) : null,
    legend(),
    drawGraph(details, [...edges.values()], selfId, (id) => nodeFacts(user, details.find((d) => d.id === id), facts, reload)),
    el("h3", {}, "Relationships"), edgeTable(user, [...edges.values()], reload), facts));
}

function legend() {
  return el("p", { class: "legend" }, el("span", { class: "key self" }, "your node"), " ",
    el("span", { class: "key current" }, "current"), " ", el("span", { class: "key superseded" }, "superseded (dashed)"));
}

// The user's node in the middle, the others on a ring; the picture is wider than the ring so
// names written beside the nodes on the left and right still fit.
function layout(nodes, selfId) {
  const width = 1000, height = 640;
  const centre = [width / 2, height / 2];
  const others = nodes.filter((n) => n.id !== selfId);
  const places = new Map();
  if (selfId && nodes.some((n) => n.id === selfId)) places.set(selfId, centre);
  const radius = height * 0.36;
  others.forEach((n, i) => {
    const angle = (2 * Math.PI * i) / Math.max(others.length, 1) - Math.PI / 2;
    places.set(n.id, [centre[0] + radius * Math.cos(angle), centre[1] + radius * Math.sin(angle)]);
  });
  return { width, height, centre, places };
}

function drawGraph(nodes, edges, selfId, choose) {
  const { width, height, centre, places } = layout(nodes, selfId);
  const picture = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": "Entities and relationships", id: "graph-svg" },
    svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 24, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }))));
  for (const edge of edges) {
    const from = places.get(edge.from_id), to = places.get(edge.to_id);
    if (!from || !to) continue;
    const state = edge.invalid_at ? "superseded" : "current";
    const label = edge.type + (edge.invalid_at ? ` (${day(edge.valid_from)} – ${day(edge.invalid_at)})` : ` (since ${day(edge.valid_from)})`);
    picture.append(svg("g", { class: "edge " + state, "data-edge": edge.id, "data-state": state },
      svg("title", {}, `${edge.from} ${edge.type} ${edge.to}: ${state}, ${label}`),
      svg("line", { x1: from[0], y1: from[1], x2: to[0], y2: to[1], "marker-end": "url(#arrow)" }),
      svg("text", { x: (from[0] + to[0]) / 2, y: (from[1] + to[1]) / 2 - 6, "text-anchor": "middle", class: "edge-label" }, label)));
  }
  for (const node of nodes) {
    const [x, y] = places.get(node.id);
    const self = node.id === selfId;
    const group = svg("g", { class: "node" + (self ? " self" : ""), "data-entity": node.id, tabindex: 0, role: "button",
      "aria-label": `${node.name} (${node.type})${self ? ", the user's own node" : ""}`,
      onclick: () => choose(node.id),
      onkeydown: (event) => { if (event.key === "Enter" || event.key === " ") { event.preventDefault(); choose(node.id); } } },
    svg("title", {}, node.name + (node.description ? " — " + node.description : "")),
    svg("circle", { cx: x, cy: y, r: self ? 22 : 16 }),
    labelOf(node, x, y, centre, self));
    picture.append(group);
  }
  return el("div", { class: "graph-box" }, picture);
}

// A node's name sits on the far side of the node from the centre, clear of the edges that reach it.
function labelOf(node, x, y, centre, self) {
  const dx = x - centre[0], dy = y - centre[1];
  const away = Math.hypot(dx, dy);
  const [ux, uy] = away ? [dx / away, dy / away] : [-1, 0];  // the centre's name to its left
  const anchor = Math.abs(ux) < 0.35 ? "middle" : ux > 0 ? "start" : "end";
  const gap = self ? 30 : 24;
  return svg("text", { x: x + ux * gap, y: y + uy * gap + 5, "text-anchor": anchor },
    short(node.name, 24) + (self ? " (user)" : ""));
}

function short(text, limit) {
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
}

function edgeTable(user, edges, reload) {
  if (!edges.length) return el("p", { class: "empty" }, "No relationships.");
  const rows = [...edges].sort((a, b) => (a.valid_from < b.valid_from ? -1 : 1)).map((r) => el("tr", {
    class: r.invalid_at ? "superseded" : "current", "data-edge": r.id },
  el("td", {}, r.from), el("td", {}, r.type), el("td", {}, r.to),
  el("td", {}, r.invalid_at ? "superseded" : "current"),
  el("td", {}, day(r.valid_from) + (r.invalid_at ? " – " + day(r.invalid_at) : " –")),
  el("td", {}, deleteButton(user, "relationship", "relationships/" + r.id, r.id, `Relationship ${r.from} ${r.type} ${r.to} (${r.id})`, reload))));
  return el("div", { class: "scroll" }, el("table", { id: "edges" },
    el("thead", {}, el("tr", {}, ["From", "Type", "To", "State", "Held", ""].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows)));
}

// The entity's facts (its relationships) and the messages each came from, the entity's own first.
async function nodeFacts(user, entity, box, reload) {
  box.replaceChildren();
  const ids = [...new Set([...entity.provenance, ...entity.relationships.flatMap((r) => r.provenance)])];
  const found = new Map(await Promise.all(ids.map(async (id) =>
    [id, await api("GET", userPath(user, "memories", id)).catch(() => null)])));
  const saidIn = (provenance) => el("ul", { class: "list provenance" }, provenance.map((id) => el("li", {},
    found.get(id) ? [el("span", { class: "text" }, found.get(id).content), " ",
      found.get(id).conversation_id ? link("conversation", { user, view: "conversation", id: found.get(id).conversation_id }) : null]
      : "message " + id + " (deleted)")));
  fill(box, {}, [el("h3", {}, entity.name),
    el("p", { class: "meta" }, entity.type + (entity.aliases.length ? "; also " + entity.aliases.join(", ") : "")),
    entity.description ? el("p", { class: "text" }, entity.description) : null,
    entity.provenance.length ? [el("h4", {}, "Said in"), saidIn(entity.provenance)] : null,
    el("h4", {}, "Facts"),
    entity.relationships.length ? null : el("p", { class: "empty" }, "No relationships."),
    el("ul", { class: "list facts" }, entity.relationships.map((r) => el("li", { class: r.invalid_at ? "superseded" : "current" },
      el("span", { class: "fact" }, `${r.from} ${r.type} ${r.to}` +
        (r.invalid_at ? ` (superseded ${day(r.invalid_at)})` : ` (since ${day(r.valid_from)})`)),
      saidIn(r.provenance)))),
    el("p", {}, deleteButton(user, "entity", "entities/" + entity.id, entity.id, `Entity ${entity.name} (${entity.id}) and its relationships`, reload))]);
  box.focus();
}

// --- Search ----------------------------------------------------------------------------------

async function searchView(user, query) {
  const area = el("textarea", { id: "query", rows: 3 });
  area.value = query;
  const results = el("div", { id: "results", "aria-live": "polite" });
  const form = el("form", { id: "search-form", onsubmit: async (event) => {
    event.preventDefault();
    if (!area.value.trim()) return;
    results.replaceChildren(el("p", { class: "meta" }, "Searching…"));
    const found = await api("POST", userPath(user, "search"), { query: area.value }).catch((e) => {
      results.replaceChildren(el("p", { class: "error" }, e.message));
      return null;
    });
    if (found) results.replaceChildren(searchResults(found, await entityNames(user, found.hits)));
  } }, el("label", { for: "query" }, "What would be injected for this text?"), area, el("button", { type: "submit" }, "Search"));
  show(el("section", { id: "search" }, el("h2", {}, "Search " + user), form, results));
  area.focus();
}

function searchResults(found, names) {
  if (!found.hits.length) return el("p", { class: "empty" }, "Nothing would be injected.");
  return el("div", {}, el("ol", { class: "hits" }, found.hits.map((hit) => hitItem(hit, names))),
    found.budget_cut ? el("p", { class: "meta" }, "The token budget cut some hits.") : null,
    el("details", {}, el("summary", {}, "The block as the model reads it"), el("pre", { class: "block" }, found.block)));
}

// A message about the last action stays until the operator moves to another view.
window.addEventListener("hashchange", () => {
  say("");
  render();
});
document.addEventListener("DOMContentLoaded", render);
