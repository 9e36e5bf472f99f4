"""Memory held by ended streams that nobody reads: server RSS after N closed, unread streams.

    .venv/bin/python bench/memory_bench.py [--streams 300] [--checkout OTHER_DIR ...]

Each server is `thinktrans serve` (``python -m service.cli serve``) run from a checkout, with
that checkout on PYTHONPATH (the imported ``service`` package's file is printed, so that an
older checkout is known to run its own code): passthrough backend and
THINKTRANS_DEFAULT_LOCALE=en, so that English text comes back as `same_language` segments
(no backend work; every segment is an event kept for a reader), other settings default.

``--streams`` streams, ``--concurrency`` at a time, each get ``--stream-chars`` characters
of short English sentences ("Short one here. " repeated: many small segments, the case
where the events around the text weigh most) in chunks of ``--chunk-chars``, four chunks
a POST, and are closed; their events are never read. Once the server's
``thinktrans_open_streams`` gauge is 0 (every stream ended) and a second has passed, the
server's VmRSS (and VmHWM, its peak) is read from /proc, with the
``thinktrans_ended_streams`` and ``thinktrans_ended_stream_bytes`` gauges (absent in code
older than the ended-stream bounds) and ``thinktrans_streams_evicted``. The RSS of the same
server right after it is ready, before any stream, is the idle reference. Then the first
and the last stream's events are asked for (an evicted stream answers 410).
Servers run one after another, in one run, so that their figures can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

import aiohttp
from checkouts import (
    LOAD_CPU,
    free_port,
    get,
    pin,
    proc_status,
    served_package,
    side_by_side,
    start_server,
    stop,
)

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "Short one here. "


def gauge(metrics: str, name: str) -> float | None:
    values = re.findall(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", metrics, re.M)
    return sum(float(v) for v in values) if values else None


async def fill(port: int, args: argparse.Namespace) -> int:
    """Open, fill and close the streams; returns the 503s met (resent after a pause)."""
    url = f"http://127.0.0.1:{port}"
    text = SENTENCE * (args.stream_chars // len(SENTENCE))
    chunks = [text[i : i + args.chunk_chars] for i in range(0, len(text), args.chunk_chars)]
    headers = {"content-type": "application/json"}
    sem = asyncio.Semaphore(args.concurrency)
    refused = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:

        async def one(i: int) -> None:
            nonlocal refused
            sid = f"mem-{i}"
            async with sem:
                nxt = 0
                while nxt < len(chunks):
                    body = {"chunks": [{"seq": s, "text": chunks[s]}
                                       for s in range(nxt, min(nxt + 4, len(chunks)))]}
                    async with http.post(f"{url}/v1/streams/{sid}/chunks",
                                         data=json.dumps(body), headers=headers) as resp:
                        answer = await resp.json(content_type=None)
                        if resp.status == 200:
                            nxt = answer["accepted_through"] + 1
                        elif resp.status == 503:
                            refused += 1
                            nxt = answer.get("accepted_through", nxt - 1) + 1
                            await asyncio.sleep(0.2)
                        else:
                            raise SystemExit(f"{sid}: {resp.status} {answer}")
                async with http.post(f"{url}/v1/streams/{sid}/close") as resp:
                    if resp.status != 200:
                        raise SystemExit(f"{sid}: close answered {resp.status}")

        await asyncio.gather(*(one(i) for i in range(args.streams)))
    return refused


def measure(name: str, checkout: Path, args: argparse.Namespace) -> dict:
    package = served_package(checkout)
    print(f"{name}: service package {package}", file=sys.stderr)
    port = free_port()
    server = start_server(checkout, port, {"THINKTRANS_BACKEND": "passthrough",
                                           "THINKTRANS_DEFAULT_LOCALE": "en"})
    try:
        time.sleep(1)
        idle = proc_status(server.pid, "VmRSS")
        t0 = time.monotonic()
        refused = asyncio.run(fill(port, args))
        filled_s = time.monotonic() - t0
        while True:  # every stream ended: its last segment out, `end` published
            open_now = gauge(get(port, "/metrics")[1], "thinktrans_open_streams")
            if not open_now or time.monotonic() - t0 > args.settle_s:
                break
            time.sleep(0.2)
        time.sleep(1)
        metrics = get(port, "/metrics")[1]
        rss = proc_status(server.pid, "VmRSS")
        hwm = proc_status(server.pid, "VmHWM")
        first = get(port, "/v1/streams/mem-0/events?after=-1&wait_ms=0")[0]
        last = get(port, f"/v1/streams/mem-{args.streams - 1}/events?after=-1&wait_ms=0")[0]
    finally:
        stop(server)
    ended_bytes = gauge(metrics, "thinktrans_ended_stream_bytes")
    return {
        "service_package": package,
        "idle_rss_mb": round(idle / 2**20, 1),
        "rss_after_mb": round(rss / 2**20, 1),
        "rss_added_mb": round((rss - idle) / 2**20, 1),
        "peak_rss_mb": round(hwm / 2**20, 1),
        "open_streams": gauge(metrics, "thinktrans_open_streams"),
        "ended_streams": gauge(metrics, "thinktrans_ended_streams"),
        "ended_stream_mb": None if ended_bytes is None else round(ended_bytes / 2**20, 1),
        "streams_evicted": gauge(metrics, "thinktrans_streams_evicted_total"),
        "segments": gauge(metrics, "thinktrans_segments_total"),
        "read_first": first,
        "read_last": last,
        "n503": refused,
        "fill_s": round(filled_s, 1),
    }


def table(results: dict[str, dict]) -> str:
    def num(value: float | None) -> str:
        return "n/a" if value is None else f"{value:g}"

    rows = [
        ("idle RSS MB", lambda r: num(r["idle_rss_mb"])),
        ("RSS after the streams ended MB", lambda r: num(r["rss_after_mb"])),
        ("added by the streams MB", lambda r: num(r["rss_added_mb"])),
        ("peak RSS MB", lambda r: num(r["peak_rss_mb"])),
        ("thinktrans_ended_streams", lambda r: num(r["ended_streams"])),
        ("thinktrans_ended_stream_bytes MB", lambda r: num(r["ended_stream_mb"])),
        ("thinktrans_streams_evicted", lambda r: num(r["streams_evicted"])),
        ("segments", lambda r: num(r["segments"])),
        ("read first / last stream", lambda r: f"{r['read_first']} / {r['read_last']}"),
        ("503s", lambda r: str(r["n503"])),
        ("fill s", lambda r: num(r["fill_s"])),
    ]
    return side_by_side(results, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=300)
    parser.add_argument("--stream-chars", type=int, default=51_200,
                        help="Text per stream (about 50 KB).")
    parser.add_argument("--chunk-chars", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=8, help="Streams filled at once.")
    parser.add_argument("--settle-s", type=float, default=300.0,
                        help="Longest wait for every stream to end.")
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="Another checkout of thinktrans to measure after this one.")
    parser.add_argument("--skip-this", action="store_true",
                        help="Measure only the --checkout servers, not this checkout.")
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    pin(0, LOAD_CPU)
    servers: dict[str, Path] = {} if args.skip_this else {"now": ROOT}
    for path in args.checkout:
        servers[str(path)] = path.resolve()
    results = {name: measure(name, checkout, args) for name, checkout in servers.items()}
    if args.json:
        print(json.dumps({"machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
                          "streams": args.streams, "stream_chars": args.stream_chars,
                          "chunk_chars": args.chunk_chars, "servers": results}, indent=2))
    else:
        print(f"{args.streams} streams x {args.stream_chars} chars, closed, never read")
        print(table(results))


if __name__ == "__main__":
    main()
