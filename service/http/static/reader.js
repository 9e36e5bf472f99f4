// One stream's events, followed to its end: read as Server-Sent Events with fetch (the token
// goes in a header), resumed with Last-Event-ID after a drop, and told apart when they
// cannot be had (evicted, not open yet, refused) or are a new stream's under the same id.

import { api, problemOf } from "./api.js";
import { readEvents } from "./sse.js";

const RETRY_FIRST_MS = 500;
const RETRY_MOST_MS = 5000;
// The sidecar sends a keep-alive every 15 s: this long without a byte, the connection is
// taken as dead (a sleeping laptop, a NAT or proxy that dropped it silently) and resumed.
const SILENCE_MS = 40_000;
// A connection that lasted this long was healthy: after it is cut, retry at once.
const HEALTHY_MS = 10_000;

// When the stream was opened, on every events answer: a stream opened again under the same
// id (deleted or expired first) has another.
const STARTED = "Thinktrans-Stream-Started";

const PARTIAL = "The stream's first events are no longer kept (THINKTRANS_MAX_EVENTS_RETAINED); "
  + "showing those that are.";
const GONE = "This stream was deleted or expired (404): the rows below are what was read of it. "
  + "Waiting for a stream with this id to open; it will replace them.";
const AGAIN = "This stream was deleted or expired and opened again under the same id: the rows "
  + "are the new stream's, from its start.";

const seconds = (ms) => `${ms / 1000} s`;

export class StreamReader {
  // onEvent(event, data): each event, parsed; onState(state, text, kind): what to tell the
  // reader (state: live, reconnecting, waiting, evicted, gone; text: a notice, or "");
  // onReset(): the events taken so far were an earlier stream's under this id, and the
  // new stream's follow from its start. ``replaced``: this reader begins on a stream that
  // replaced the one shown before (the page says so).
  constructor(streamId, { onEvent, onState, onReset = () => {}, replaced = false }) {
    this.streamId = streamId;
    this.onEvent = onEvent;
    this.onState = onState;
    this.onReset = onReset;
    this.lastId = -1; // the last event taken: where a new connection resumes
    this.partial = false; // the first events were gone when it began
    this.started = null; // when the stream read was opened (its events' STARTED header)
    this.stale = false; // the events taken are a gone stream's: reset at the next one's start
    this.replaced = replaced; // say that this stream replaced the one shown before
    this.evicted = false; // it ended and was evicted before it could be read
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

  // The stream read is gone, or was replaced: its events are not resumed, the next
  // connection reads a stream under this id from its start (and resets the rows then).
  forget() {
    this.lastId = -1;
    this.partial = false;
    this.started = null;
    this.stale = true;
  }

  async follow() {
    const path = `/v1/streams/${encodeURIComponent(this.streamId)}/events`;
    let delay = RETRY_FIRST_MS;
    const backOff = () => { delay = Math.min(delay * 2, RETRY_MOST_MS); };
    let restarts = 0; // times read from the start again, without an event since
    // The stream read is gone or was replaced: read the one under this id from its start,
    // at once the first time, after a backoff when it happens again before an event came.
    const restart = async () => {
      this.forget();
      restarts += 1;
      if (restarts > 1) {
        await this.wait(delay);
        backOff();
      }
    };
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
        const started = response.headers.get(STARTED);
        if (this.started !== null && started !== this.started) {
          // Resumed on another stream under this id: its first events would be skipped.
          connection.abort();
          await restart();
          continue;
        }
        this.started = started;
        if (this.stale) {
          this.stale = false;
          this.replaced = true;
          this.onReset();
        }
        let text = this.partial ? PARTIAL : "";
        if (this.replaced) text = text ? `${AGAIN} ${text}` : AGAIN;
        this.onState("live", text, this.replaced ? "info" : "warn");
        const opened = performance.now();
        const taken = this.lastId;
        const ended = await this.consume(response, connection);
        if (this.lastId !== taken) restarts = 0;
        if (ended) return; // its end
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
        this.evicted = true; // a stream opened under its id later is a new one
        this.onState("evicted", `This stream ended and was evicted (410): ${problem.detail}`, "error");
        return;
      }
      if (status === 410 && Number.isInteger(problem.resume_after) && problem.resume_after > this.lastId) {
        this.partial = true;
        this.lastId = problem.resume_after;
        continue;
      }
      if (status === 409 && Number.isInteger(problem.last_event_id)) {
        // Our Last-Event-ID is past the stream's last event: an earlier stream's.
        await restart();
        continue;
      }
      if (status === 404) {
        // Not open yet (the page was opened first), or deleted or expired: wait for it. One
        // that was read is not resumed: a stream opened again under its id is a new one.
        if (this.started !== null || this.lastId >= 0) this.forget();
        this.onState("waiting", this.stale ? GONE
          : `Waiting for the stream to open: ${problem.detail}`, "warn");
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
