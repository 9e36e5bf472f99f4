// A stream's segments out of the page: JSONL (one segment a line), Markdown, the clipboard.

import { passedThrough } from "./rows.js";

// One JSON object per segment, in index order: as the stream says it now (a late update
// applied).
export function toJSONL(segments) {
  return segments.map((s) => JSON.stringify({
    index: s.index,
    original: s.original,
    translation: s.text,
    status: s.status,
    source_lang: s.source_lang ?? null,
    target: s.target ?? null,
    backend: s.backend ?? null,
    model: s.model ?? null,
    cached: Boolean(s.cached),
    updated: Boolean(s.updated),
    error: s.error ?? null,
  })).map((line) => `${line}\n`).join("");
}

const longestTicks = (text) => Math.max(0, ...Array.from(text.matchAll(/`+/g),
  (m) => m[0].length));

// A value a client or a backend chose (a model name, a stream id, an error) as inline code
// on one line: its fence longer than any run of backticks in it, its line breaks written
// as \n (a break would end a heading and begin a block of its own), so that nothing in it
// is rendered as Markdown or HTML.
export function code(value) {
  const text = String(value).replace(/\r\n|[\r\n]/g, "\\n");
  const fence = "`".repeat(longestTicks(text) + 1);
  // A space inside each fence, which a reader drops, lets the value begin or end with a
  // backtick or a space.
  const pad = /^[ `]|[ `]$/.test(text) ? " " : "";
  return `${fence}${pad}${text}${pad}${fence}`;
}

// A text as a fenced block, its fence longer than any run of backticks in it: whatever the
// text holds (Markdown, HTML, a fence of its own) is shown as it is and never rendered.
function block(text) {
  const fence = "`".repeat(Math.max(3, longestTicks(text) + 1));
  return `${fence}text\n${text.replace(/\s+$/, "")}\n${fence}`;
}

// A readable record: each segment's original and translation as text blocks, under a
// heading with its index, status, languages, backend and model; every value a client or a
// backend chose is inline code.
export function toMarkdown(stream, segments, exported = new Date()) {
  const out = [`# Stream ${code(stream.id)}`, ""];
  out.push(`Target: ${stream.target ? code(stream.target) : "none"} · ${segments.length} `
    + `segments · exported ${exported.toISOString()}`, "");
  for (const s of segments) {
    let status = passedThrough(s) ? "passed through, unchanged" : s.status;
    if (s.updated) status += " (after its deadline)";
    const detail = [s.source_lang ? code(s.source_lang) : "?", "→",
      s.target ? code(s.target) : "?"];
    if (s.backend) detail.push(`· ${code(s.backend)}`);
    if (s.model) detail.push(`· ${code(s.model)}`);
    out.push(`## ${s.index} · ${status} · ${detail.join(" ")}`, "");
    if (s.error) out.push(`Error: ${code(s.error)}`, "");
    if (s.text === s.original) {
      out.push("Original, shown as it is:", "", block(s.original), "");
    } else {
      out.push("Original:", "", block(s.original), "");
      out.push("Translation:", "", s.status === "hidden" ? "_(hidden)_" : block(s.text), "");
    }
  }
  return `${out.join("\n").trimEnd()}\n`;
}

export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// The clipboard API where the page may use it (localhost or HTTPS), else the old way.
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // refused (no permission): the old way below
    }
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.append(area);
  area.select();
  const done = document.execCommand("copy");
  area.remove();
  return done;
}
