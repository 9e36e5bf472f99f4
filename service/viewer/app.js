// The viewer: the stream list, one stream live, layouts, copy and export, follow mode, the
// operators' header and the token flow.

import { api, fragment, fragmentWith, onTokenNeeded, problemOf, takeTokenFromFragment } from "./api.js";
import { copyText, download, toJSONL, toMarkdown } from "./export.js";
import { Ops } from "./ops.js";
import { Rows } from "./rows.js";
import { readEvents } from "./sse.js";

const LAYOUT_KEY = "thinktrans.layout";
const LAYOUTS = ["side", "below", "only"];
const LIST_EVERY_MS = 2000;
const OPS_EVERY_MS = 2000;
const RETRY_FIRST_MS = 500;
const RETRY_MOST_MS = 5000;
const FOLLOW_SLACK_PX = 48; // this close to the bottom still counts as at the bottom

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

const rowsNode = $("rows");
const rows = new Rows(rowsNode, { onCopy: (text, button) => copied(copyText(text), button) });
const view = {
  id: null, // the stream shown
  target: null,
  generation: 0, // a new stream shown makes the previous reader stop
  abort: null,
  follow: true,
  lastId: -1,
};
const known = new Map(); // stream id: its summary from GET /v1/streams

// -- the token ---------------------------------------------------------------------------

function askToken(message) {
  const form = $("auth");
  const input = $("token");
  $("auth-error").textContent = message;
  form.hidden = false;
  input.value = "";
  input.focus();
  return new Promise((resolve) => {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      form.hidden = true;
      resolve(input.value.trim());
    }, { once: true });
  });
}

// -- what the page says ------------------------------------------------------------------

function notice(text, kind = "info") {
  const node = $("notice");
  node.hidden = !text;
  node.textContent = text || "";
  node.dataset.kind = kind;
}

function setState(state, text) {
  const node = $("state");
  node.dataset.state = state;
  node.textContent = text ?? state;
}

async function copied(done, button) {
  const ok = await done;
  const label = button.textContent;
  button.textContent = ok ? "Copied" : "Copy failed";
  setTimeout(() => { button.textContent = label; }, 1200);
}

// -- layouts and follow mode ---------------------------------------------------------------

function setLayout(layout, remember = true) {
  if (!LAYOUTS.includes(layout)) layout = "side";
  rowsNode.dataset.layout = layout;
  for (const button of document.querySelectorAll("#layouts button")) {
    button.setAttribute("aria-pressed", String(button.dataset.layout === layout));
  }
  if (remember) localStorage.setItem(LAYOUT_KEY, layout);
  rows.relax();
  if (view.follow) toBottom();
}

function atBottom() {
  return rowsNode.scrollHeight - rowsNode.scrollTop - rowsNode.clientHeight <= FOLLOW_SLACK_PX;
}

function toBottom() {
  rowsNode.scrollTop = rowsNode.scrollHeight;
}

function setFollow(on) {
  view.follow = on;
  $("follow").setAttribute("aria-pressed", String(on));
  if (on) toBottom();
}

// -- one stream, live ----------------------------------------------------------------------

function onEvent(event) {
  let data;
  try {
    data = JSON.parse(event.data);
  } catch {
    return;
  }
  if (event.id !== null) view.lastId = Number(event.id);
  const follow = view.follow;
  if (event.type === "segment") rows.segment(data);
  else if (event.type === "update") rows.update(data);
  else if (event.type === "end") {
    rows.running = false;
    setState("ended", `ended · ${data.segments} segments`);
  }
  if (event.type === "segment" && data.target) view.target = data.target;
  if (follow) toBottom();
  const some = rows.list.length > 0;
  for (const id of ["copy-all", "export-md", "export-jsonl"]) $(id).disabled = !some;
}

async function read(streamId, generation, signal) {
  let delay = RETRY_FIRST_MS;
  while (generation === view.generation) {
    const headers = { Accept: "text/event-stream" };
    if (view.lastId >= 0) headers["Last-Event-ID"] = String(view.lastId);
    let response;
    try {
      response = await api(`/v1/streams/${encodeURIComponent(streamId)}/events`, { headers, signal });
    } catch {
      if (signal.aborted) return;
      notice(`The connection to the sidecar was lost; trying again in ${delay / 1000} s.`, "warn");
      setState("reconnecting", "reconnecting");
      await sleep(delay);
      delay = Math.min(delay * 2, RETRY_MOST_MS);
      continue;
    }
    if (response.status === 410) {
      const problem = await problemOf(response);
      if (problem.evicted) {
        setState("evicted", "evicted");
        notice(`This stream ended and was evicted (410): ${problem.detail}`, "error");
        return;
      }
      if (Number.isInteger(problem.resume_after) && problem.resume_after > view.lastId) {
        notice("The stream's first events are no longer kept; showing what is.", "warn");
        view.lastId = problem.resume_after;
        continue;
      }
      setState("gone", "gone");
      notice(problem.detail, "error");
      return;
    }
    if (response.status === 404) {
      const problem = await problemOf(response);
      setState("gone", "not found");
      notice(problem.detail, "error");
      return;
    }
    if (!response.ok) {
      const problem = await problemOf(response);
      notice(`${problem.detail} (HTTP ${response.status}); trying again in ${delay / 1000} s.`, "warn");
      await sleep(delay);
      delay = Math.min(delay * 2, RETRY_MOST_MS);
      continue;
    }
    delay = RETRY_FIRST_MS;
    notice("");
    if ($("state").dataset.state !== "ended") setState("live", "live");
    let ended = false;
    try {
      await readEvents(response, (event) => {
        if (generation !== view.generation) return;
        onEvent(event);
        if (event.type === "end") ended = true;
      });
    } catch {
      if (signal.aborted) return;
    }
    if (ended || generation !== view.generation) return;
    notice("The event stream was cut; resuming where it stopped.", "warn");
    setState("reconnecting", "reconnecting");
    await sleep(delay);
  }
}

function show(streamId) {
  if (streamId === view.id) return;
  if (view.abort) view.abort.abort();
  view.generation += 1;
  view.id = streamId;
  view.lastId = -1;
  view.target = null;
  rows.clear();
  rows.running = true;
  notice("");
  for (const id of ["copy-all", "export-md", "export-jsonl"]) $(id).disabled = true;
  markSelected();
  if (!streamId) {
    $("title").textContent = "Pick a stream";
    setState("none", "");
    return;
  }
  $("title").textContent = streamId;
  setState("connecting", "connecting");
  document.title = `${streamId} · thinktrans viewer`;
  setFollow(true);
  const controller = new AbortController();
  view.abort = controller;
  read(streamId, view.generation, controller.signal);
}

function fromFragment() {
  takeTokenFromFragment();
  show(fragment().get("stream") || null);
}

function open(streamId) {
  const params = fragment();
  params.set("stream", streamId);
  location.hash = fragmentWith(params); // hashchange shows it
}

// -- the stream list -------------------------------------------------------------------------

function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 60) return `${Math.round(seconds)} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function markSelected() {
  for (const item of document.querySelectorAll("#streams li")) {
    item.classList.toggle("selected", item.dataset.id === view.id);
  }
}

function renderList() {
  const filter = $("filter").value.trim().toLowerCase();
  const items = [];
  for (const s of known.values()) {
    if (filter && !`${s.stream_id} ${s.target || ""} ${s.state}`.toLowerCase().includes(filter)) continue;
    const item = document.createElement("li");
    item.dataset.id = s.stream_id;
    item.dataset.state = s.state;
    const button = document.createElement("button");
    button.type = "button";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = s.stream_id;
    const about = document.createElement("span");
    about.className = "about";
    about.textContent = `${s.state} · ${s.target || "no target"} · ${s.segments} seg · ${ago(s.last_active)}`;
    about.title = `started ${s.started}, last active ${s.last_active}`;
    button.append(name, about);
    button.addEventListener("click", () => open(s.stream_id));
    item.append(button);
    items.push(item);
  }
  $("streams").replaceChildren(...items);
  $("list-empty").hidden = items.length > 0;
  $("list-empty").textContent = known.size ? "No stream matches the filter." : "No streams yet.";
  markSelected();
}

async function refreshList() {
  try {
    const response = await api("/v1/streams");
    if (!response.ok) return;
    const body = await response.json();
    known.clear();
    for (const s of body.streams) known.set(s.stream_id, s); // newest first, as given
    renderList();
  } catch {
    // the header says when the sidecar is unreachable
  }
}

async function every(ms, work) {
  for (;;) {
    await work();
    await sleep(ms);
  }
}

// -- start -----------------------------------------------------------------------------------

onTokenNeeded(askToken);
setLayout(localStorage.getItem(LAYOUT_KEY) || "side", false);
for (const button of document.querySelectorAll("#layouts button")) {
  button.addEventListener("click", () => setLayout(button.dataset.layout));
}
$("follow").addEventListener("click", () => setFollow(!view.follow));
rowsNode.addEventListener("scroll", () => {
  const bottom = atBottom();
  if (bottom !== view.follow) setFollow(bottom);
}, { passive: true });
$("filter").addEventListener("input", renderList);
$("copy-all").addEventListener("click", (event) => {
  copied(copyText(rows.list.map((s) => s.text).join("")), event.currentTarget);
});
$("export-md").addEventListener("click", () => {
  const stream = { id: view.id, target: view.target ?? known.get(view.id)?.target };
  download(`${view.id}.md`, toMarkdown(stream, rows.list), "text/markdown;charset=utf-8");
});
$("export-jsonl").addEventListener("click", () => {
  download(`${view.id}.jsonl`, toJSONL(rows.list), "application/jsonl;charset=utf-8");
});
window.addEventListener("hashchange", fromFragment);
fromFragment();
const ops = new Ops({
  ready: $("ready"), reason: $("ready-reason"), backends: $("backends"), queue: $("queue"),
  hitRate: $("hit-rate"), rate: $("rate"),
});
every(OPS_EVERY_MS, () => ops.refresh());
every(LIST_EVERY_MS, refreshList);
