// One stream's events, followed to its end: read as Server-Sent Events with fetch (the token
// goes in a header), resumed with Last-Event-ID after a drop, and told apart when they
// cannot be had (evicted, not open yet, refused).

import { api, problemOf } from "./api.js";
import { readEvents } from "./sse.js";

const RETRY_FIRST_MS = 500;
const RETRY_MOST_MS = 5000;
// The sidecar sends a keep-alive every 15 s: this long without a byte, the connection is
// taken as dead (a sleeping laptop, a NAT or proxy that dropped it silently) and resumed.
const SILENCE_MS = 40_000;
// A connection that lasted this long was healthy: after it is cut, retry at once.
const HEALTHY_MS = 10_000;

const PARTIAL = "The stream's first events are no longer kept (THINKTRANS_MAX_EVENTS_RETAINED); "
  + "showing those that are.";

const seconds = (ms) => `${ms / 1000} s`;

export class StreamReader {
  // onEvent(event, data): each event, parsed; onState(state, text, kind): what to tell the
  // reader (state: live, reconnecting, waiting, evicted, gone; text: a notice, or "").
  constructor(streamId, { onEvent, onState }) {
    this.streamId = streamId;
    this.onEvent = onEvent;
    this.onState = onState;
    this.lastId = -1; // the last event taken: where a new connection resumes
    this.partial = false; // the first events were gone when it began
    this.stopped = false;
    this.done = false; // the stream's end was read, or it cannot be read
    this.connection = null;
    this.wake = null;
  }

  stop() {
    this.stopped = true;
    if (this.connection) this.connection.abort();
    if (this.wake) this.wake();
  }

  wait(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.wake = () => { clearTimeout(timer); resolve(); };
    });
  }

  async run() {
    try {
      await this.follow();
    } finally {
      this.done = true;
    }
  }

  async follow() {
    const path = `/v1/streams/${encodeURIComponent(this.streamId)}/events`;
    let delay = RETRY_FIRST_MS;
    const backOff = () => { delay = Math.min(delay * 2, RETRY_MOST_MS); };
    while (!this.stopped) {
      const connection = new AbortController();
      this.connection = connection;
      const headers = { Accept: "text/event-stream" };
      if (this.lastId >= 0) headers["Last-Event-ID"] = String(this.lastId);
      let response;
      try {
        response = await api(path, { headers, signal: connection.signal });
      } catch {
        if (this.stopped) return;
        this.onState("reconnecting", `The sidecar cannot be reached; trying again in ${seconds(delay)}.`, "warn");
        await this.wait(delay);
        backOff();
        continue;
      }
      if (this.stopped) return;
      const type = response.headers.get("content-type") || "";
      if (response.ok && type.startsWith("text/event-stream")) {
        this.onState("live", this.partial ? PARTIAL : "", "warn");
        const opened = performance.now();
        if (await this.consume(response, connection)) return; // its end
        if (this.stopped) return;
        if (performance.now() - opened > HEALTHY_MS) delay = RETRY_FIRST_MS;
        this.onState("reconnecting", "The event stream was cut; resuming where it stopped.", "warn");
        await this.wait(delay);
        backOff();
        continue;
      }
      const problem = await problemOf(response);
      if (this.stopped) return;
      const status = response.status;
      if (status === 410 && problem.evicted) {
        this.onState("evicted", `This stream ended and was evicted (410): ${problem.detail}`, "error");
        return;
      }
      if (status === 410 && Number.isInteger(problem.resume_after) && problem.resume_after > this.lastId) {
        this.partial = true;
        this.lastId = problem.resume_after;
        continue;
      }
      if (status === 404) {
        // Not open yet (the page was opened first), or deleted or expired: wait for it.
        this.onState("waiting", `Waiting for the stream to open: ${problem.detail}`, "warn");
        await this.wait(delay);
        backOff();
        continue;
      }
      if (status === 429 || status >= 500 || response.ok) {
        const after = Number(response.headers.get("retry-after"));
        const pause = after > 0 ? Math.min(after * 1000, 60_000) : delay;
        const what = response.ok ? `the answer was not an event stream (${type || "no type"})`
          : `${problem.detail} (HTTP ${status})`;
        this.onState("reconnecting", `${what}; trying again in ${seconds(pause)}.`, "warn");
        await this.wait(pause);
        backOff();
        continue;
      }
      // Any other refusal (a malformed id, 422) will not change by asking again.
      this.onState("gone", `${problem.detail} (HTTP ${status})`, "error");
      return;
    }
  }

  // Read one connection; true once the stream's end is in.
  async consume(response, connection) {
    let ended = false;
    let silence = setTimeout(() => connection.abort(), SILENCE_MS);
    const heard = () => {
      clearTimeout(silence);
      silence = setTimeout(() => connection.abort(), SILENCE_MS);
    };
    try {
      await readEvents(response, (event) => {
        if (this.stopped) return;
        let data;
        try {
          data = JSON.parse(event.data);
        } catch {
          return;
        }
        if (event.id !== null) this.lastId = Number(event.id);
        this.onEvent(event, data);
        if (event.type === "end") ended = true;
      }, heard);
    } catch {
      // cut, silent too long, or stopped: the caller tells which
    } finally {
      clearTimeout(silence);
    }
    return ended;
  }
}
