// The header, for operators: readiness and its reason, each backend's state, queue depth,
// cache hit rate and segments per second, from /readyz, /v1/backends and /metrics.

import { api } from "./api.js";

const SEGMENTS = /^thinktrans_segments_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)/;

// The sum of thinktrans_segments_total over its labels, from Prometheus text.
export function segmentsOut(metrics) {
  let total = 0;
  for (const line of metrics.split("\n")) {
    const match = SEGMENTS.exec(line);
    if (match) total += Number(match[1]);
  }
  return total;
}

export class Ops {
  constructor(nodes) {
    this.nodes = nodes; // {ready, reason, backends, queue, hitRate, rate}
    this.last = null; // [time, segments out]
  }

  async refresh() {
    await Promise.allSettled([this.readiness(), this.backends(), this.rate()]);
  }

  async readiness() {
    const { ready, reason } = this.nodes;
    try {
      const response = await api("/readyz");
      const body = await response.json();
      ready.dataset.state = body.status;
      ready.textContent = body.status.replace("_", " ");
      reason.textContent = body.reason || "";
      ready.title = body.reason || "GET /readyz";
    } catch {
      ready.dataset.state = "unreachable";
      ready.textContent = "unreachable";
      reason.textContent = "the sidecar does not answer";
    }
  }

  async backends() {
    const { backends, queue, hitRate } = this.nodes;
    const response = await api("/v1/backends");
    if (!response.ok) return;
    const body = await response.json();
    let depth = 0;
    const pills = [];
    for (const b of body.backends) {
      depth += b.queue_depth || 0;
      const pill = document.createElement("span");
      pill.className = "pill backend";
      pill.dataset.state = b.ready ? "ready" : "not_ready";
      pill.dataset.backend = b.name;
      pill.textContent = b.name;
      pill.title = `${b.ready ? "ready" : "not ready"}${b.reason ? `: ${b.reason}` : ""}`
        + `; queue ${b.queue_depth}${b.in_chain ? "" : "; not in the default chain"}`;
      pills.push(pill);
    }
    backends.replaceChildren(...pills);
    queue.textContent = String(depth);
    const rate = body.cache && body.cache.enabled ? body.cache.hit_rate : null;
    hitRate.textContent = rate === null || rate === undefined ? "–" : `${Math.round(rate * 100)}%`;
  }

  async rate() {
    const response = await api("/metrics");
    if (!response.ok) return;
    const total = segmentsOut(await response.text());
    const now = performance.now();
    if (this.last) {
      const [then, before] = this.last;
      const seconds = (now - then) / 1000;
      if (seconds > 0) this.nodes.rate.textContent = ((total - before) / seconds).toFixed(1);
    }
    this.last = [now, total];
  }
}
