// A stream's segments out of the page: JSONL (one segment a line), Markdown, the clipboard.

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

function quote(text) {
  return text.replace(/\s+$/, "").split(/\r\n|\r|\n/).map((line) => `> ${line}`.trimEnd()).join("\n");
}

// A readable record: each segment's original and translation, quoted (so that code and
// Markdown in them stay as they are), under a heading with its status.
export function toMarkdown(stream, segments, exported = new Date()) {
  const out = [`# Stream \`${stream.id}\``, ""];
  out.push(`Target: ${stream.target || "none"} · ${segments.length} segments · `
    + `exported ${exported.toISOString()}`, "");
  for (const s of segments) {
    const status = s.updated ? `${s.status} (after its deadline)` : s.status;
    const detail = [s.source_lang || "?", "→", s.target || "?"];
    if (s.backend) detail.push(`· ${s.backend}`);
    if (s.model) detail.push(`· ${s.model}`);
    out.push(`## ${s.index} · ${status} · ${detail.join(" ")}`, "");
    if (s.text === s.original) {
      out.push("Original, shown as it is:", "", quote(s.original), "");
    } else {
      out.push("Original:", "", quote(s.original), "");
      out.push("Translation:", "", s.status === "hidden" ? "_(hidden)_" : quote(s.text), "");
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
