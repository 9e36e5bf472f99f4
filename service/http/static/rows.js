// A stream's segments as rows: the original and its translation, the status, and the
// backend and model on demand; a preview of the sentence still open in the row its segment
// will take, provisional until that segment replaces it. Everything a stream says is put
// in as text (textContent), never as HTML: thinking is untrusted.

const LABELS = {
  translated: "translated",
  same_language: "same language",
  skipped: "skipped",
  deadline: "deadline",
  error: "error",
  hidden: "hidden",
  no_target: "no target",
};
// The passthrough backend answers `translated` with the original (a dry run): its rows say
// so, and are not shown as translations.
export const PASSTHROUGH = "passthrough";
export const passedThrough = (segment) => segment.status === "translated"
  && segment.backend === PASSTHROUGH;
const FENCE = /^\s*(```|~~~)/;
const FENCE_LINE = /^ {0,3}(```|~~~)/gm;

// Whether a fenced block is still open after ``text``, given whether one was before it: a
// long block is cut into several segments, and those after the first are code too.
function fenceOpenAfter(text, open) {
  const fences = text.match(FENCE_LINE);
  return fences && fences.length % 2 === 1 ? !open : open;
}
const INLINE_CODE = /(`+)([^`][\s\S]*?)\1(?!`)/g;
const LANG = /^[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*$/;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Text into a cell: a fenced block stays code (monospace, never reflowed); in prose, `inline
// code` is shown as code; line breaks inside are kept, blank lines around are not shown
// (copy and export keep the segment's text as it is).
export function fill(cell, text, code = FENCE.test(text)) {
  cell.replaceChildren();
  if (code) {
    const pre = el("pre", "code");
    pre.append(el("code", "", text.replace(/^(\s*\n)+/, "").trimEnd()));
    cell.append(pre);
    return;
  }
  text = text.trim();
  let at = 0;
  for (const match of text.matchAll(INLINE_CODE)) {
    if (match.index > at) cell.append(document.createTextNode(text.slice(at, match.index)));
    cell.append(el("code", "", match[0]));
    at = match.index + match[0].length;
  }
  if (at < text.length) cell.append(document.createTextNode(text.slice(at)));
}

function setLang(node, lang) {
  if (typeof lang === "string" && LANG.test(lang)) node.lang = lang;
  else node.removeAttribute("lang");
}

export class Rows {
  constructor(container, { onCopy } = {}) {
    this.container = container;
    this.onCopy = onCopy;
    this.segments = []; // by index: the segment as the stream says it now
    this.nodes = new Map(); // index: its row (a segment's, or a preview's)
    this.previews = new Map(); // index: the revision of the preview shown in its row
    this.running = false; // rows keep their height while the stream runs
  }

  clear() {
    this.segments = [];
    this.nodes.clear();
    this.previews.clear();
    this.container.replaceChildren();
  }

  get list() {
    return this.segments.filter(Boolean);
  }

  segment(data) {
    // The segment replaces its preview in place; previews before it will get no segment
    // here (it went out while the page could not read it).
    this.dropPreviews(data.index);
    this.previews.delete(data.index);
    // Code: a segment that opens a fence, or one inside a block that an earlier one opened.
    const inside = data.index > 0 && Boolean(this.segments[data.index - 1]?.fenceOpen);
    const code = inside || FENCE.test(data.original);
    const segment = { ...data, updated: false, code,
      fenceOpen: fenceOpenAfter(data.original, inside) };
    this.segments[data.index] = segment;
    const existing = this.nodes.get(data.index);
    const row = existing || this.build(segment);
    if (!existing) {
      this.nodes.set(data.index, row);
      this.insert(row, data.index);
    }
    this.render(row, segment);
    return row;
  }

  // A preview of the sentence still open, in the row its segment will take: a newer
  // revision replaces the one shown; none comes after its segment.
  preview(data, target) {
    const index = data.index;
    // Segments come in order: one at this index or after it means this sentence is done.
    if (!Number.isInteger(index) || index < this.segments.length) return null;
    if ((this.previews.get(index) ?? 0) >= data.revision) return null;
    this.previews.set(index, data.revision);
    let row = this.nodes.get(index);
    if (!row) {
      row = this.build({ index });
      this.nodes.set(index, row);
      this.insert(row, index);
    }
    this.renderPreview(row, data, target);
    return row;
  }

  // Take out the previews whose segments will not come: those before index ``below``, or
  // all of them (at the stream's end).
  dropPreviews(below = Infinity) {
    for (const index of [...this.previews.keys()]) {
      if (index >= below) continue;
      this.previews.delete(index);
      this.nodes.get(index)?.remove();
      this.nodes.delete(index);
    }
  }

  update(data) {
    const segment = this.segments[data.index];
    if (!segment) return null;
    Object.assign(segment, {
      text: data.text, status: data.status, backend: data.backend ?? null,
      model: data.model ?? null, cached: Boolean(data.cached), error: data.error ?? null,
      updated: true,
    });
    const row = this.nodes.get(data.index);
    if (this.running) row.style.minHeight = `${row.getBoundingClientRect().height}px`;
    this.render(row, segment);
    return row;
  }

  // Layout changes and the stream's end let rows take their natural height again.
  relax() {
    for (const row of this.nodes.values()) row.style.minHeight = "";
  }

  insert(row, index) {
    // Segments come in index order; a row out of order still lands in its place.
    let after = null;
    for (let i = index - 1; i >= 0 && !after; i -= 1) after = this.nodes.get(i) || null;
    if (!after) this.container.prepend(row);
    else after.after(row);
  }

  build(segment) {
    const row = el("div", "row");
    row.dataset.index = String(segment.index);
    const gutter = el("div", "gutter");
    gutter.append(el("span", "index", String(segment.index)));
    const status = el("button", "status");
    status.type = "button";
    status.addEventListener("click", (event) => {
      event.stopPropagation();
      const meta = row.querySelector(".meta");
      meta.hidden = !meta.hidden;
      status.setAttribute("aria-expanded", String(!meta.hidden));
    });
    status.setAttribute("aria-expanded", "false");
    gutter.append(status);
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    copy.title = "Copy this row's translation";
    copy.addEventListener("click", (event) => {
      event.stopPropagation();
      const seg = this.segments[segment.index];
      if (seg && this.onCopy) this.onCopy(seg.text, copy);
    });
    gutter.append(copy);
    const original = el("div", "cell orig");
    const translation = el("div", "cell tran");
    const meta = el("div", "meta");
    meta.hidden = true;
    // Translation only: a tap shows the original (hovering does too).
    row.addEventListener("click", () => {
      if (this.container.dataset.layout === "only" && !window.getSelection().toString()) {
        row.classList.toggle("reveal");
      }
    });
    row.append(gutter, original, translation, meta);
    return row;
  }

  renderPreview(row, data, target) {
    const what = `Provisional (revision ${data.revision}): a preview of the sentence still `
      + "open, which its segment will replace";
    row.classList.add("preview");
    row.classList.remove("cached", "updated", "same");
    row.dataset.status = "preview";
    row.title = what;
    const button = row.querySelector(".status");
    button.replaceChildren("preview", el("span", "rev", `r${data.revision}`));
    button.title = what;
    button.setAttribute("aria-label", `provisional preview, revision ${data.revision}, `
      + "to be replaced by its segment");
    const original = row.querySelector(".orig");
    original.replaceChildren(el("span", "placeholder",
      `(still open: ${data.source_chars} characters so far)`));
    original.removeAttribute("lang");
    const translation = row.querySelector(".tran");
    fill(translation, String(data.text ?? ""), false);
    setLang(translation, target);
    translation.title = "";
    row.querySelector(".meta").textContent = [`preview, revision ${data.revision}`,
      `${data.source_chars} characters of the open sentence`, `→ ${target || "?"}`,
      "its segment will replace it"].join(" · ");
  }

  render(row, segment) {
    const status = segment.status;
    row.dataset.status = status;
    row.classList.remove("preview");
    row.removeAttribute("title");
    row.classList.toggle("cached", Boolean(segment.cached));
    row.classList.toggle("updated", segment.updated);
    row.classList.toggle("same", segment.text === segment.original);
    const passed = passedThrough(segment);
    row.classList.toggle("passed", passed);
    // One label, one line: a row's height does not change with its status. A cached
    // translation says "cached"; one that came after its deadline is marked (dashed).
    const button = row.querySelector(".status");
    button.textContent = passed ? "passed through"
      : segment.cached && status === "translated" ? "cached" : LABELS[status] || status;
    button.removeAttribute("aria-label");
    button.title = passed ? "Unchanged: the passthrough backend gives the original back (a dry "
      + "run), not a translation; click for details"
      : segment.updated ? "Translated after its deadline; click for details"
        : "Backend, model, languages and latency";
    const original = row.querySelector(".orig");
    const translation = row.querySelector(".tran");
    fill(original, segment.original, segment.code);
    setLang(original, segment.source_lang);
    if (status === "hidden") {
      translation.replaceChildren(el("span", "placeholder", "(hidden by the stream's policy)"));
    } else {
      fill(translation, segment.text, segment.code && segment.text === segment.original);
    }
    setLang(translation, status === "translated" && !passed ? segment.target
      : segment.source_lang);
    translation.title = status === "deadline" ? "Not translated in time: the original, until "
      + "its translation comes" : "";
    const parts = [];
    if (passed) parts.push("the original, unchanged (not a translation)");
    if (segment.backend) parts.push(`backend ${segment.backend}`);
    if (segment.model) parts.push(`model ${segment.model}`);
    parts.push(`${segment.source_lang || "?"} → ${segment.target || "?"}`);
    if (typeof segment.latency_ms === "number") {
      const ms = Math.round(segment.latency_ms);
      parts.push(segment.updated ? `out at its deadline after ${ms} ms` : `${ms} ms`);
    }
    if (segment.cached) parts.push("from the cache");
    if (segment.updated) parts.push("translated after it");
    if (segment.error) parts.push(`error: ${segment.error}`);
    row.querySelector(".meta").textContent = parts.join(" · ");
  }
}
