// Server-Sent Events read from a fetch response with a stream reader, parsed as the HTML
// standard says: lines end in CRLF, LF or CR; `event`, `data` and `id` fields; a blank
// line dispatches; lines that start with a colon are comments (keep-alives).

export class SSEParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.lastId = null;
    this.reset();
  }

  reset() {
    this.type = "";
    this.data = [];
  }

  push(text) {
    const buffer = this.buffer + text;
    let start = 0;
    let lf = buffer.indexOf("\n");
    let cr = buffer.indexOf("\r");
    for (;;) {
      // Each search runs from where the last line ended: one pass over the text.
      if (lf !== -1 && lf < start) lf = buffer.indexOf("\n", start);
      if (cr !== -1 && cr < start) cr = buffer.indexOf("\r", start);
      const end = lf === -1 ? cr : cr === -1 ? lf : Math.min(lf, cr);
      if (end === -1) break;
      let skip = 1;
      if (end === cr) {
        if (end === buffer.length - 1) break; // a LF may follow in the next chunk
        if (buffer[end + 1] === "\n") skip = 2;
      }
      this.line(buffer.slice(start, end));
      start = end + skip;
    }
    this.buffer = buffer.slice(start);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) {
        this.onEvent({ id: this.lastId, type: this.type || "message", data: this.data.join("\n") });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.lastId = value;
  }
}

// Read a text/event-stream response to its end, calling onEvent for each event and onBytes
// whenever bytes come (keep-alives too); returns when the server closes the stream, throws
// when the connection breaks or is aborted, or when onEvent throws (the connection is
// cancelled then, not left open).
export async function readEvents(response, onEvent, onBytes = () => {}) {
  const parser = new SSEParser(onEvent);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onBytes();
      parser.push(value);
    }
  } catch (error) {
    reader.cancel().catch(() => {});
    throw error;
  }
}
