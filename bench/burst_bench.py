"""A burst of large chunk POSTs against a slow, real backend: does /healthz keep answering?

    .venv/bin/python bench/burst_bench.py [--backend llm|local] [--checkout OTHER_DIR ...]

Each server is `thinktrans serve` (``python -m service.cli serve``) run from a checkout, with
that checkout on PYTHONPATH (the imported ``service`` package's file is printed, so that an
older checkout is known to run its own code), THINKTRANS_DEFAULT_LOCALE=de (English text
needs translation) and otherwise default settings. Its backend is slow but real:

- ``llm`` (default): the `llm` backend pointed at a chat server this script runs in a
  process of its own (``--serve-chat``), an OpenAI-compatible ``/v1/chat/completions``
  answering every request after ``--delay-ms`` with a valid answer: one German filler text
  per segment id, about the source's length (so that the backend's item checks and the
  output language check pass).
- ``local``: the `local` backend on a tiny random-weight NLLB checkpoint from
  `thinktrans make-test-model` (``--model DIR``; made in a temporary folder when not
  given), CPU-bound in the server's worker thread.

The burst: ``--streams`` streams at once each POST one request of ``--chunks`` chunks of
``--chunk-chars`` characters of short English sentences ("Short one here. " repeated),
while a probe (a process of its own) GETs /healthz every ``--probe-ms``. The clients follow
the contract: a 503 is answered by resending from ``accepted_through`` + 1 (all the chunks
when the problem has no ``accepted_through``) after ``--retry-sleep`` seconds (shorter than
the Retry-After the server asks for, to keep the run short); each stream is read from its
start by long-poll JSON (``?after=N&wait_ms=``) until `end`, while its chunks go in, and
closed once all its chunks are accepted. The whole run is capped by ``--budget-s``: what a
server reached by then is reported (streams ended, chunks accepted, segments read).

Reported per server: /healthz latency p50/p99/max while the burst runs (a probe still
waiting when the run ends counts with its wait so far; ``healthz_failed`` counts probes
that got no answer), chunk POST latency p50/max and the number of 503s, the largest
``thinktrans_queue_depth`` seen in /metrics (scraped every 250 ms), the server's peak RSS
(VmHWM from /proc), whether every stream's segment originals, in index order, joined equal
the text of its accepted chunks (``in_order``), the segment statuses, and the wall time.
The server is pinned to one core and this script, the probe and the chat server to
another (on a machine of two cores or more). Servers run one after another, in one run,
so that their figures can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.client import HTTPConnection
from pathlib import Path

import aiohttp
from checkouts import (
    LOAD_CPU,
    cpu_s,
    free_port,
    pin,
    proc_status,
    served_package,
    side_by_side,
    start_server,
    stop,
)

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "Short one here. "
FILLER_DE = "Hier steht ein kurzer Satz. "
TRANSLATED = ("translated", "same_language", "skipped")


# -- the chat server (a process of its own) --------------------------------------------------


def german_filler(text: str) -> str:
    """German text about as long as ``text`` (at least one sentence), its whitespace kept."""
    body = text.strip()
    reps = max(1, round(len(body) / len(FILLER_DE)))
    core = (FILLER_DE * reps).strip()
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()) :]
    return lead + core + trail


def serve_chat(port: int, delay_ms: float) -> None:
    """An OpenAI-compatible chat endpoint answering every request after ``delay_ms``."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        segments = json.loads(user)["segments"]
        await asyncio.sleep(delay_ms / 1000)
        items = [{"id": s["id"], "text": german_filler(s["text"])} for s in segments]
        content = json.dumps({"translations": items}, ensure_ascii=False)
        return web.json_response({
            "id": "chatcmpl-bench", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4},
        })

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench-model"}]})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([web.post("/v1/chat/completions", chat), web.get("/v1/models", models)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- the /healthz probe (a process of its own) -----------------------------------------------


def probe(port: int, interval_ms: float, stop_file: str) -> None:
    """GET /healthz every ``interval_ms`` until ``stop_file`` exists; print the latencies.

    Requests run one at a time in a thread; one still waiting at the stop is reported with
    its wait so far (``pending_ms``)."""
    latencies: list[float] = []
    failed = 0
    started: list[float] = []  # the start of the request in flight, if any
    done = threading.Event()

    def run() -> None:
        nonlocal failed
        conn: HTTPConnection | None = None
        next_at = time.monotonic()
        while not done.is_set():
            t0 = time.monotonic()
            started[:] = [t0]
            try:
                if conn is None:
                    conn = HTTPConnection("127.0.0.1", port, timeout=600)
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    latencies.append((time.monotonic() - t0) * 1000)
                else:
                    failed += 1
            except OSError:
                failed += 1
                conn = None
            started[:] = []
            next_at = max(next_at + interval_ms / 1000, time.monotonic())
            time.sleep(max(0.0, next_at - time.monotonic()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not Path(stop_file).exists():
        time.sleep(0.02)
    done.set()
    pending = (time.monotonic() - started[0]) * 1000 if started else None
    print(json.dumps({"latencies_ms": latencies, "failed": failed, "pending_ms": pending}))
    sys.stdout.flush()
    os._exit(0)  # the thread may be stuck in a request


# -- servers ---------------------------------------------------------------------------------


QUEUE_DEPTH = re.compile(r"^thinktrans_queue_depth(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


# -- the burst -------------------------------------------------------------------------------


async def run_burst(url: str, args: argparse.Namespace, state: dict) -> None:
    """The streams; fills ``state`` as it goes so that a timed-out run still reports."""
    chunk = SENTENCE * (args.chunk_chars // len(SENTENCE))
    state.update(post_ms=[], n503=0, other_errors=[], connection_errors=0,
                 queue_depth_max=0.0, streams={},
                 metrics_failed=0)
    headers = {"content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:

        async def scrape() -> None:
            while True:
                try:
                    async with http.get(f"{url}/metrics",
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        text = await resp.text()
                    depth = sum(float(v) for v in QUEUE_DEPTH.findall(text))
                    state["queue_depth_max"] = max(state["queue_depth_max"], depth)
                except (TimeoutError, aiohttp.ClientError):
                    state["metrics_failed"] += 1
                await asyncio.sleep(0.25)

        async def read(sid: str, st: dict) -> None:
            after = -1
            while True:
                async with http.get(f"{url}/v1/streams/{sid}/events",
                                    params={"after": str(after), "wait_ms": "2000"}) as resp:
                    if resp.status != 200:
                        st["read_error"] = f"{resp.status} {(await resp.text())[:200]}"
                        return
                    page = await resp.json()
                for event in page["events"]:
                    after = event["id"]
                    data = event["data"]
                    if event["type"] == "segment":
                        st["indexes"].append(data["index"])
                        st["originals"][data["index"]] = data["original"]
                        st["statuses"][data["status"]] = st["statuses"].get(data["status"], 0) + 1
                    elif event["type"] == "update":
                        st["updates"] += 1
                    elif event["type"] == "end":
                        st["ended"] = True
                        return

        async def post_chunks(sid: str, st: dict) -> None:
            nxt = 0
            while nxt < args.chunks:
                body = {"chunks": [{"seq": s, "text": chunk} for s in range(nxt, args.chunks)]}
                t0 = time.monotonic()
                try:
                    async with http.post(f"{url}/v1/streams/{sid}/chunks",
                                         data=json.dumps(body), headers=headers) as resp:
                        answer = await resp.json(content_type=None)
                except aiohttp.ClientError:  # a reset under load: counted, resent
                    state["connection_errors"] += 1
                    await asyncio.sleep(args.retry_sleep)
                    continue
                state["post_ms"].append((time.monotonic() - t0) * 1000)
                if resp.status == 200:
                    nxt = answer["accepted_through"] + 1
                elif resp.status == 503:
                    state["n503"] += 1
                    if "accepted_through" in answer:
                        nxt = answer["accepted_through"] + 1
                    await asyncio.sleep(args.retry_sleep)
                else:
                    state["other_errors"].append(f"{resp.status} {str(answer)[:200]}")
                    return
                st["accepted"] = nxt
            async with http.post(f"{url}/v1/streams/{sid}/close") as resp:
                await resp.read()
                if resp.status != 200:
                    state["other_errors"].append(f"close {resp.status}")

        async def one_stream(i: int) -> None:
            sid = f"burst-{i}"
            st = state["streams"][sid] = {"accepted": 0, "originals": {}, "indexes": [],
                                          "statuses": {}, "updates": 0, "ended": False}
            # A stream opens by its first chunk: the reader starts once it exists.
            poster = asyncio.create_task(post_chunks(sid, st))
            reader = None
            while reader is None and not poster.done():
                async with http.get(f"{url}/v1/streams/{sid}/events",
                                    params={"after": "-1", "wait_ms": "0"}) as resp:
                    await resp.read()
                    if resp.status == 200:
                        reader = asyncio.create_task(read(sid, st))
                    else:
                        await asyncio.sleep(0.02)
            try:
                await poster
                if reader is None:
                    reader = asyncio.create_task(read(sid, st))
                await reader
            finally:  # at the budget's end, nothing is left running
                for task in (poster, reader):
                    if task is not None and not task.done():
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                            await task

        scraper = asyncio.create_task(scrape())
        try:
            await asyncio.gather(*(one_stream(i) for i in range(args.streams)))
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measure(name: str, checkout: Path, args: argparse.Namespace, chat_url: str | None,
            model: Path | None) -> dict:
    package = served_package(checkout)
    print(f"{name}: service package {package}", file=sys.stderr)
    env = {"THINKTRANS_DEFAULT_LOCALE": "de", "THINKTRANS_CACHE_MB": "0"}  # measure the backend
    if args.backend == "llm":
        env.update(THINKTRANS_BACKEND="llm", THINKTRANS_LLM_BASE_URL=f"{chat_url}/v1",
                   THINKTRANS_LLM_MODEL="bench-model")
    else:
        env.update(THINKTRANS_BACKEND="local", THINKTRANS_LOCAL_MODEL=str(model),
                   THINKTRANS_LOCAL_DEVICE="cpu", THINKTRANS_LOCAL_THREADS="1")
    port = free_port()
    server = start_server(checkout, port, env)
    url = f"http://127.0.0.1:{port}"
    stop_file = Path(tempfile.mkdtemp()) / "stop"
    prober = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--probe",
                               str(port), str(args.probe_ms), str(stop_file)],
                              stdout=subprocess.PIPE)
    pin(prober.pid, LOAD_CPU)
    state: dict = {}
    cpu0 = cpu_s(server.pid)
    t0 = time.monotonic()
    timed_out = False
    try:
        try:
            asyncio.run(asyncio.wait_for(run_burst(url, args, state), args.budget_s))
        except TimeoutError:
            timed_out = True
        wall = time.monotonic() - t0
        stop_file.touch()
        probed = json.loads(prober.communicate(timeout=30)[0])
        hwm = proc_status(server.pid, "VmHWM")
        cpu = cpu_s(server.pid) - cpu0
    finally:
        if prober.poll() is None:
            prober.kill()
        stop(server)
    health = list(probed["latencies_ms"])
    if probed["pending_ms"] is not None:
        health.append(probed["pending_ms"])
    streams = state.get("streams", {})
    text_per_chunk = SENTENCE * (args.chunk_chars // len(SENTENCE))
    in_order = True
    segments = 0
    statuses: dict[str, int] = {}
    for st in streams.values():
        originals = st["originals"]
        segments += len(originals)
        for status, n in st["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
        joined = "".join(originals[i] for i in range(len(originals)) if i in originals)
        if st["indexes"] != sorted(st["indexes"]) or len(set(originals)) != len(originals):
            in_order = False
        if st["ended"]:
            in_order &= joined == text_per_chunk * st["accepted"]
        else:  # what came out so far is a prefix of what went in
            in_order &= (text_per_chunk * st["accepted"]).startswith(joined)
            in_order &= sorted(originals) == list(range(len(originals)))
    posts = state.get("post_ms", [])
    return {
        "service_package": package,
        "wall_s": round(wall, 1),
        "timed_out": timed_out,
        "streams_ended": sum(st["ended"] for st in streams.values()),
        "chunks_accepted": sum(st["accepted"] for st in streams.values()),
        "chunks_sent": args.streams * args.chunks,
        "segments_read": segments,
        "updates_read": sum(st["updates"] for st in streams.values()),
        "statuses": statuses,
        "in_order": in_order,
        "read_errors": [st["read_error"] for st in streams.values() if "read_error" in st],
        "post_errors": state.get("other_errors", []),
        "connection_errors": state.get("connection_errors", 0),
        "healthz_ms": {"probes": len(health), "p50": _r(pct(health, 0.5)),
                       "p99": _r(pct(health, 0.99)), "max": _r(max(health, default=None)),
                       "pending_at_end": _r(probed["pending_ms"])},
        "healthz_failed": probed["failed"],
        "post_ms": {"posts": len(posts), "p50": _r(statistics.median(posts) if posts else None),
                    "max": _r(max(posts, default=None))},
        "n503": state.get("n503", 0),
        "queue_depth_max": state.get("queue_depth_max"),
        "metrics_failed": state.get("metrics_failed", 0),
        "peak_rss_mb": round(hwm / 2**20, 1) if hwm else None,
        "server_cpu_s": round(cpu, 1),
    }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def table(results: dict[str, dict]) -> str:
    rows = [
        ("healthz p50 / p99 / max ms", lambda r: "{p50} / {p99} / {max}".format(**r["healthz_ms"])),
        ("healthz probes (failed)",
         lambda r: f"{r['healthz_ms']['probes']} ({r['healthz_failed']})"),
        ("chunk POST p50 / max ms", lambda r: "{p50} / {max}".format(**r["post_ms"])),
        ("chunk POSTs (503s)", lambda r: f"{r['post_ms']['posts']} ({r['n503']})"),
        ("max queue depth", lambda r: f"{r['queue_depth_max']:.0f}"),
        ("peak RSS MB", lambda r: f"{r['peak_rss_mb']}"),
        ("chunks accepted", lambda r: f"{r['chunks_accepted']}/{r['chunks_sent']}"),
        ("streams ended", lambda r: f"{r['streams_ended']}"),
        ("segments read (updates)", lambda r: f"{r['segments_read']} ({r['updates_read']})"),
        ("statuses", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))),
        ("in order, nothing lost", lambda r: "yes" if r["in_order"] else "NO"),
        ("server CPU s", lambda r: f"{r['server_cpu_s']}"),
        ("wall s (timed out)", lambda r: f"{r['wall_s']}" + (" (yes)" if r["timed_out"] else "")),
    ]
    return side_by_side(results, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["llm", "local"], default="llm")
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="Another checkout of thinktrans to measure after this one.")
    parser.add_argument("--skip-this", action="store_true",
                        help="Measure only the --checkout servers, not this checkout.")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=4, help="Chunks in each stream's POST.")
    parser.add_argument("--chunk-chars", type=int, default=16_384)
    parser.add_argument("--delay-ms", type=float, default=200.0,
                        help="The chat server's delay per request (llm).")
    parser.add_argument("--model", type=Path, help="Checkpoint directory (local).")
    parser.add_argument("--probe-ms", type=float, default=50.0, help="/healthz probe interval.")
    parser.add_argument("--retry-sleep", type=float, default=0.25,
                        help="Seconds a client waits after a 503 before resending.")
    parser.add_argument("--budget-s", type=float, default=180.0,
                        help="Cap on each server's run; what it reached by then is reported.")
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    parser.add_argument("--serve-chat", nargs=2, metavar=("PORT", "DELAY_MS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_chat:
        serve_chat(int(args.serve_chat[0]), float(args.serve_chat[1]))
        return
    if args.probe:
        probe(int(args.probe[0]), float(args.probe[1]), args.probe[2])
        return
    pin(0, LOAD_CPU)
    servers: dict[str, Path] = {} if args.skip_this else {"now": ROOT}
    for path in args.checkout:
        servers[str(path)] = path.resolve()
    chat = None
    chat_url = None
    model = args.model
    try:
        if args.backend == "llm":
            chat_port = free_port()
            chat = subprocess.Popen([sys.executable, str(Path(__file__).resolve()),
                                     "--serve-chat", str(chat_port), str(args.delay_ms)])
            pin(chat.pid, LOAD_CPU)
            chat_url = f"http://127.0.0.1:{chat_port}"
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", chat_port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
        elif model is None:
            model = Path(tempfile.mkdtemp()) / "model"
            subprocess.run([sys.executable, "-m", "service.cli", "make-test-model", str(model)],
                           cwd=ROOT, check=True, capture_output=True)
        results = {name: measure(name, checkout, args, chat_url, model)
                   for name, checkout in servers.items()}
    finally:
        if chat is not None:
            chat.terminate()
            chat.wait(timeout=10)
    if args.json:
        print(json.dumps({"machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
                          "backend": args.backend, "streams": args.streams,
                          "chunks": args.chunks, "chunk_chars": args.chunk_chars,
                          "delay_ms": args.delay_ms, "budget_s": args.budget_s,
                          "servers": results}, indent=2))
    else:
        print(f"backend {args.backend}, {args.streams} streams x {args.chunks} chunks of "
              f"{args.chunk_chars} chars, budget {args.budget_s:.0f} s")
        print(table(results))
        for name, r in results.items():
            for key in ("read_errors", "post_errors"):
                if r[key]:
                    print(f"{name} {key}: {r[key][:3]}")


if __name__ == "__main__":
    main()
