// The viewer: the stream list, one stream live, layouts, copy and export, follow mode, the
// operators' header and the token flow.

import { api, fragment, fragmentWith, onTokenNeeded, takeTokenFromFragment } from "./api.js";
import { copyText, download, toJSONL, toMarkdown } from "./export.js";
import { Ops } from "./ops.js";
import { StreamReader } from "./reader.js";
import { Rows } from "./rows.js";

const LAYOUT_KEY = "thinktrans.layout";
const LAYOUTS = ["side", "below", "only"];
const LIST_EVERY_MS = 2000;
const LIST_LIMIT = 200; // the newest streams listed (the filter looks among these)
const OPS_EVERY_MS = 5000;
const FOLLOW_SLACK_PX = 48; // this close to the bottom still counts as at the bottom

const $ = (id) => document.getElementById(id);
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

const rowsNode = $("rows");
const rows = new Rows(rowsNode, { onCopy: (text, button) => copied(copyText(text), button) });
const view = {
  id: null, // the stream shown
  target: null,
  reader: null,
  follow: true,
};
const known = new Map(); // stream id: its summary from GET /v1/streams
let listed = false; // the list was read at least once (before, it says nothing)
const items = new Map(); // stream id: its list item

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

function onEvent(event, data) {
  const follow = view.follow;
  if (event.type === "segment") {
    rows.segment(data);
    if (data.target) view.target = data.target;
  } else if (event.type === "update") {
    rows.update(data);
  } else if (event.type === "preview") {
    rows.preview(data, view.target ?? known.get(view.id)?.target);
  } else if (event.type === "end") {
    rows.dropPreviews(); // a preview left has no segment coming
    rows.running = false;
    rows.relax();
    setState("ended", `ended · ${data.segments} segments`);
  }
  if (follow) toBottom();
  const some = rows.list.length > 0;
  for (const id of ["copy-all", "export-md", "export-jsonl"]) $(id).disabled = !some;
}

function onState(state, text, kind) {
  if (state !== "live" || $("state").dataset.state !== "ended") setState(state);
  notice(text, kind);
}

// The rows of a stream that is gone make way for those of the one now read under its id.
function clearRows() {
  view.target = null;
  rows.clear();
  rows.running = true;
  for (const id of ["copy-all", "export-md", "export-jsonl"]) $(id).disabled = true;
}

function onReset() {
  clearRows();
  setState("connecting", "connecting");
}

// ``replaced``: show it anew, as a stream under this id replaced the one shown.
function show(streamId, replaced = false) {
  // The same stream again restarts it only when its reading has stopped (a refusal), or
  // when another stream now has its id.
  if (!replaced && streamId === view.id && view.reader && !view.reader.done) return;
  if (view.reader) view.reader.stop();
  view.reader = null;
  view.id = streamId;
  clearRows();
  notice("");
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
  const reader = new StreamReader(streamId, { onEvent, onState, onReset, replaced });
  view.reader = reader;
  reader.run();
}

function fromFragment() {
  takeTokenFromFragment();
  show(fragment().get("stream") || null);
}

function open(streamId) {
  const params = fragment();
  if (params.get("stream") === streamId) {
    show(streamId); // no hashchange: show it again if its reading stopped
    return;
  }
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
  for (const [id, item] of items) item.classList.toggle("selected", id === view.id);
}

// One item per stream, made once and updated in place: a refresh never takes the item a
// reader is clicking or has focused.
function itemFor(s) {
  let item = items.get(s.stream_id);
  if (!item) {
    item = document.createElement("li");
    item.dataset.id = s.stream_id;
    const button = document.createElement("button");
    button.type = "button";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = s.stream_id;
    const about = document.createElement("span");
    about.className = "about";
    button.append(name, about);
    button.addEventListener("click", () => open(s.stream_id));
    item.append(button);
    items.set(s.stream_id, item);
  }
  item.dataset.state = s.state;
  const about = item.querySelector(".about");
  const text = `${s.state} · ${s.target || "no target"} · ${s.segments} seg · ${ago(s.last_active)}`;
  if (about.textContent !== text) about.textContent = text;
  about.title = `started ${s.started}, last active ${s.last_active}`;
  return item;
}

function renderList() {
  const filter = $("filter").value.trim().toLowerCase();
  const list = $("streams");
  for (const [id, item] of items) {
    if (!known.has(id)) {
      item.remove();
      items.delete(id);
    }
  }
  const wanted = [...known.values()].map(itemFor); // newest first, as given
  const order = [...list.children];
  if (wanted.length !== order.length || wanted.some((item, i) => item !== order[i])) {
    list.append(...wanted);
  }
  let shown = 0;
  for (const s of known.values()) {
    const match = !filter || `${s.stream_id} ${s.target || ""} ${s.state}`.toLowerCase().includes(filter);
    items.get(s.stream_id).hidden = !match;
    shown += match ? 1 : 0;
  }
  $("list-empty").hidden = shown > 0 || !listed;
  $("list-empty").textContent = known.size ? "No stream matches the filter." : "No streams yet.";
  markSelected();
}

// A stream opened under the shown one's id after it (the shown one deleted, expired or
// evicted): shown anew. A reader still following reads the new one itself when its
// connection is cut; one that stopped (it read the end) is replaced here.
function checkReplaced() {
  const now = known.get(view.id);
  const reader = view.reader;
  if (!now || !reader || !reader.done) return;
  if (reader.started ? Date.parse(now.started) > Date.parse(reader.started) : reader.evicted) {
    show(view.id, true);
  }
}

async function refreshList() {
  try {
    const response = await api(`/v1/streams?limit=${LIST_LIMIT}`);
    if (!response.ok) return;
    const body = await response.json();
    known.clear();
    for (const s of body.streams) known.set(s.stream_id, s);
    listed = true;
    renderList();
    checkReplaced();
  } catch {
    // the header says when the sidecar is unreachable
  }
}

// Polls only while the page is visible; a page shown again is brought up to date at once.
async function every(ms, work) {
  for (;;) {
    if (document.visibilityState === "visible") await work();
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
window.addEventListener("resize", () => rows.relax());
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
document.addEventListener("visibilitychange", () => {
  if (document.visibilityState === "visible") {
    ops.refresh();
    refreshList();
  }
});
every(OPS_EVERY_MS, () => ops.refresh());
every(LIST_EVERY_MS, refreshList);
