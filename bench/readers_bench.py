"""What SSE readers on a stream cost its writer: the chunk POST with 0 and with N readers.

    .venv/bin/python bench/readers_bench.py --posts 2000 --rounds 3 [--pace-ms 0] \
        [--readers 50] [--checkout OTHER_DIR ...]

One stream (target zh-CN, ``thinktrans serve`` with the passthrough backend and default
settings, so that English sentences are detected, batched and "translated" and Chinese ones
come out as they are) and one writer: chunk POSTs one after the other over one keep-alive
connection, each carrying 5 model-sized deltas (1 to 6 characters: a few words) of
reasoning-like text in mixed English and Chinese (``chunk_floor.TEXT``). Case (a) has no
reader; case (b) has ``--readers`` SSE readers open on the same stream
(``GET /v1/streams/{id}/events``, ``Accept: text/event-stream``) before the first POST.
The readers live in a third process, pinned with the writer to the load core but
scheduled SCHED_IDLE, so that their parsing does not delay the writer's own reading of its
answers (browsers on other machines would not); the server has the other core to itself.
Each reader reads and keeps every event up to ``end``, and at the
end every reader's events must be the stream's events (the long-poll JSON of the stream,
read once after the measurement) in order, ids rising, or the bench fails.

Server CPU is the server process's user + system time (/proc) from the first POST until
the writer's close has returned and, in case (b), every reader has its ``end``, divided by
the POSTs: what the writer's POSTs and their events cost, delivery to every reader
included. Latency is each POST's round trip as the writer sees it. Every case gets a fresh
server, warmed by the same short stream read by one SSE reader; servers and cases are
measured in turns, ``--rounds`` times; the least CPU per POST (the figure least disturbed
by the machine's other load) and the median are reported, with p50/p99 latency (median
over rounds), events published and delivered, and the ratios (b)/(a) from the same run.

Pacing. ``--pace-ms 0`` (the default) posts flat out: each POST goes as soon as the last
is answered. ``--pace-ms 50`` posts every 50 ms, as the client does by default
(``flush_interval_s=0.05``). Both post the same chunks, and neither reaches the idle flush
(1.5 s) nor a deadline (the passthrough answers at once), so the events per POST are the
same: the readers' work per POST is the same in both, and only how it falls in time
differs. Flat out is the harder case for the writer's latency: the frames that one POST's
events make for every reader are written while the next POST waits for the one event
loop. For CPU per POST neither is plainly the harder: paced, every event wakes every
reader on its own and runs with cold caches, but so does each POST. Run both.
``us_per_delivery`` is the CPU that (b) adds, per event per reader: (b - a) x POSTs /
events delivered, from the least figures.

``--checkout DIR`` adds the thinktrans of another checkout (an older commit, say) served by
the same Python, measured in the same turns.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import select
import statistics
import subprocess
import sys
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import aiohttp
from checkouts import LOAD_CPU, cpu_s, free_port, pin, served_package, start_server, stop
from chunk_floor import bodies

ROOT = Path(__file__).resolve().parent.parent
TARGET = "zh-CN"
WARM_POSTS = 200
JSON_HEADERS = {"content-type": "application/json"}
SSE_HEADERS = {"accept": "text/event-stream"}


# -- the readers (a process of their own) -----------------------------------------------------


def parse_frames(buf: bytes, events: list[tuple[int, str, bytes]]) -> tuple[bytes, bool]:
    """Take the whole SSE frames off ``buf`` into ``events``; the rest, and whether ``end``
    came."""
    while (cut := buf.find(b"\n\n")) >= 0:
        frame, buf = buf[:cut], buf[cut + 2 :]
        event_id, kind, data = -1, "message", b""
        for line in frame.split(b"\n"):
            field, _, value = line.partition(b": ")
            if field == b"id":
                event_id = int(value)
            elif field == b"event":
                kind = value.decode()
            elif field == b"data":
                data = value
        if event_id < 0:  # a keep-alive comment
            continue
        events.append((event_id, kind, data))
        if kind == "end":
            return buf, True
    return buf, False


def digest(events: list[tuple[int, str, Any]]) -> str:
    """One hash of the events' ids, types and data (as parsed JSON, so that the SSE and
    long-poll spellings of one event hash alike)."""
    h = hashlib.sha256()
    for event_id, kind, data in events:
        if isinstance(data, bytes | str):
            data = json.loads(data)
        h.update(f"{event_id}|{kind}|{json.dumps(data, sort_keys=True)}\n".encode())
    return h.hexdigest()


async def read_stream(url: str, readers: int) -> dict[str, Any]:
    """Open ``readers`` SSE connections, say "ready" once all have their headers, read each
    to ``end``; the CPU seconds that reading took and one summary per reader."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as http:
        responses = []
        for _ in range(readers):
            resp = await http.get(url, headers=SSE_HEADERS)
            if resp.status != 200:
                raise SystemExit(f"reader got {resp.status}: {await resp.text()}")
            responses.append(resp)
        print("ready", flush=True)
        cpu = time.process_time()

        async def one(resp: aiohttp.ClientResponse) -> list[tuple[int, str, bytes]]:
            events: list[tuple[int, str, bytes]] = []
            buf, ended = b"", False
            async for data in resp.content.iter_any():
                buf, ended = parse_frames(buf + data, events)
                if ended:
                    break
            resp.release()
            return events

        got = await asyncio.gather(*(one(resp) for resp in responses))
        cpu = time.process_time() - cpu
    # Checked after every reader has its end: the server is idle by then.
    return {"cpu_s": cpu, "readers": [
        {"events": len(events), "ended": bool(events) and events[-1][1] == "end",
         "rising": all(a[0] < b[0] for a, b in itertools.pairwise(events)),
         "digest": digest(events)} for events in got]}


def readers_main(url: str, readers: int) -> None:
    # The readers stand for browsers on other machines: their own parsing must not delay
    # the writer, with whom they share the load core. SCHED_IDLE runs them only when that
    # core has nothing else to do (at nice 10 alone they still held the writer back: its
    # p99 was 7.7 ms against 4.6 with SCHED_IDLE, the server's CPU the same).
    os.nice(10)
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    print(json.dumps(asyncio.run(read_stream(url, readers))), flush=True)


def start_readers(url: str, readers: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--read", url,
                             str(readers)], stdout=subprocess.PIPE, text=True)
    pin(proc.pid, LOAD_CPU)
    if line_from(proc, 120) != "ready":
        stop_readers(proc)
        raise SystemExit("the readers did not all connect")
    return proc


def line_from(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        stop_readers(proc)
        raise SystemExit(f"the readers said nothing in {timeout_s} s")
    return proc.stdout.readline().strip()


def stop_readers(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# -- the writer (this process) --------------------------------------------------------------


def request(conn: HTTPConnection, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.read()


def write(conn: HTTPConnection, stream_id: str, plan: list[bytes], pace_s: float) -> list[float]:
    """POST the chunk bodies in order, every ``pace_s`` (0: flat out); each round trip, s."""
    path = f"/v1/streams/{stream_id}/chunks"
    latencies = []
    due = time.perf_counter()
    for body in plan:
        if pace_s:
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            due += pace_s
        t0 = time.perf_counter()
        status, answer = request(conn, "POST", path, body, JSON_HEADERS)
        latencies.append(time.perf_counter() - t0)
        if status != 200:
            raise SystemExit(f"chunk POST got {status}: {answer[:300]!r}")
    return latencies


def open_stream(conn: HTTPConnection, stream_id: str) -> None:
    body = json.dumps({"stream_id": stream_id, "target": TARGET}).encode()
    status, answer = request(conn, "POST", "/v1/streams", body, JSON_HEADERS)
    if status not in (200, 201):
        raise SystemExit(f"opening {stream_id} got {status}: {answer[:300]!r}")


def close_stream(conn: HTTPConnection, stream_id: str) -> None:
    status, answer = request(conn, "POST", f"/v1/streams/{stream_id}/close")
    if status != 200:
        raise SystemExit(f"closing {stream_id} got {status}: {answer[:300]!r}")


def stream_events(port: int, stream_id: str) -> list[tuple[int, str, Any]]:
    """The stream's events, from the long-poll JSON, waiting for its ``end``."""
    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    events: list[tuple[int, str, Any]] = []
    try:
        while not events or events[-1][1] != "end":
            after = events[-1][0] if events else -1
            status, answer = request(conn, "GET", f"/v1/streams/{stream_id}/events"
                                     f"?after={after}&wait_ms=10000")
            if status != 200:
                raise SystemExit(f"long-poll of {stream_id} got {status}: {answer[:300]!r} "
                                 "(fewer --posts keep every event retained)")
            got = json.loads(answer)["events"]
            if not got:
                raise SystemExit(f"{stream_id} did not end")
            events += [(e["id"], e["type"], e["data"]) for e in got]
    finally:
        conn.close()
    return events


def warm(port: int, conn: HTTPConnection) -> None:
    """A short stream, posted, closed and read to its end by one SSE reader: the same
    first-use costs paid in every case before the measurement."""
    open_stream(conn, "warm")
    write(conn, "warm", [body for _, body in bodies(WARM_POSTS, 1, seed=99)], 0)
    close_stream(conn, "warm")
    sse = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        sse.request("GET", "/v1/streams/warm/events", headers=SSE_HEADERS)
        resp = sse.getresponse()
        events: list[tuple[int, str, bytes]] = []
        buf, ended = b"", False
        while not ended and (data := resp.read1(65536)):
            buf, ended = parse_frames(buf + data, events)
        if not ended:
            raise SystemExit("the warm-up stream did not end")
    finally:
        sse.close()
    stream_events(port, "warm")


def measure(checkout: Path, readers: int, posts: int, pace_s: float,
            seed: int) -> dict[str, Any]:
    port = free_port()
    server = start_server(checkout, port, {"THINKTRANS_BACKEND": "passthrough",
                                           "THINKTRANS_DEFAULT_LOCALE": TARGET,
                                           "THINKTRANS_LOG_LEVEL": "info"})
    readers_proc: subprocess.Popen[str] | None = None
    conn = HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        warm(port, conn)
        stream_id = f"readers-{seed}"
        open_stream(conn, stream_id)
        plan = [body for _, body in bodies(posts, 1, seed)]
        if readers:
            readers_proc = start_readers(
                f"http://127.0.0.1:{port}/v1/streams/{stream_id}/events", readers)
        before = cpu_s(server.pid)
        latencies = write(conn, stream_id, plan, pace_s)
        close_stream(conn, stream_id)
        summaries: list[dict[str, Any]] = []
        readers_cpu = 0.0
        if readers_proc:
            # The summaries come once every reader has its end; the server is idle while
            # the readers check what they got.
            read = json.loads(line_from(readers_proc, 300))
            summaries, readers_cpu = read["readers"], read["cpu_s"]
        used = cpu_s(server.pid) - before
        events = stream_events(port, stream_id)
    finally:
        conn.close()
        if readers_proc:
            stop_readers(readers_proc)
        stop(server)
    check(events, summaries, readers, checkout)
    latencies.sort()
    return {"cpu_us_per_post": used / posts * 1e6,
            "p50_ms": statistics.median(latencies) * 1e3,
            "p99_ms": statistics.quantiles(latencies, n=100)[98] * 1e3,
            "events": len(events),
            "delivered": sum(s["events"] for s in summaries),
            "readers_cpu_us_per_post": readers_cpu / posts * 1e6}


def check(events: list[tuple[int, str, Any]], summaries: list[dict[str, Any]], readers: int,
          checkout: Path) -> None:
    """Every reader got every event of the stream, in order, up to ``end``; or fail."""
    if not events or events[-1][1] != "end":
        raise SystemExit(f"{checkout}: the stream has no end")
    want = digest(events)
    bad = [i for i, s in enumerate(summaries)
           if not (s["ended"] and s["rising"] and s["events"] == len(events)
                   and s["digest"] == want)]
    if len(summaries) != readers:
        raise SystemExit(f"{checkout}: {len(summaries)} of {readers} readers reported")
    if bad:
        raise SystemExit(f"{checkout}: {len(bad)} of {readers} readers did not get the "
                         f"stream's {len(events)} events in order up to end: "
                         f"{[summaries[i] for i in bad[:3]]}")


# -- the report -----------------------------------------------------------------------------


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cpu = [r["cpu_us_per_post"] for r in runs]
    return {"cpu_us_per_post": round(min(cpu), 1),
            "median_cpu_us_per_post": round(statistics.median(cpu), 1),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in runs), 3),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in runs), 3),
            "events": runs[0]["events"],
            "delivered": runs[0]["delivered"],
            "readers_cpu_us_per_post": round(statistics.median(
                r["readers_cpu_us_per_post"] for r in runs), 1),
            "rounds_cpu_us_per_post": [round(v, 1) for v in cpu],
            "rounds_p99_ms": [round(r["p99_ms"], 3) for r in runs]}


def table(report: dict[str, Any], readers: int) -> str:
    out = ["| server | readers | CPU µs/POST (least) | median | p50 ms | p99 ms | events "
           "| delivered |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, server in report["servers"].items():
        for n in (0, readers):
            c = server[str(n)]
            out.append(f"| {name} | {n} | {c['cpu_us_per_post']} | "
                       f"{c['median_cpu_us_per_post']} | {c['p50_ms']:.2f} | "
                       f"{c['p99_ms']:.2f} | {c['events']} | {c['delivered']} |")
    out += ["", f"| server | CPU ratio {readers}/0 (least) | median | p99 ratio "
            "| CPU µs per event per reader |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, server in report["servers"].items():
        r = server["ratios"]
        out.append(f"| {name} | {r['cpu']} | {r['median_cpu']} | {r['p99']} "
                   f"| {r['us_per_delivery']} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readers", type=int, default=50, help="SSE readers in case (b).")
    parser.add_argument("--posts", type=int, default=2000, help="Chunk POSTs per measurement.")
    parser.add_argument("--rounds", type=int, default=3, help="Turns per server and case.")
    parser.add_argument("--pace-ms", type=float, default=0.0,
                        help="One POST every this many ms (0: flat out).")
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="Another checkout of thinktrans to measure beside this one.")
    parser.add_argument("--read", nargs=2, metavar=("URL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        readers_main(args.read[0], int(args.read[1]))
        return
    pin(os.getpid(), LOAD_CPU)
    servers = {"thinktrans": ROOT}
    for path in args.checkout:
        servers[f"thinktrans@{path}"] = path.resolve()
    cases = (0, args.readers)
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {
        name: {n: [] for n in cases} for name in servers}
    for round_ in range(args.rounds):
        for name, checkout in servers.items():
            for n in cases:
                runs[name][n].append(measure(checkout, n, args.posts, args.pace_ms / 1000,
                                             seed=round_))
                print(f"round {round_ + 1}/{args.rounds} {name} readers={n}: "
                      f"{runs[name][n][-1]['cpu_us_per_post']:.1f} µs/POST", file=sys.stderr)
    report: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "posts": args.posts, "readers": args.readers, "rounds": args.rounds,
        "pace_ms": args.pace_ms, "servers": {}}
    for name, checkout in servers.items():
        by_case = {str(n): summarise(runs[name][n]) for n in cases}
        a, b = by_case["0"], by_case[str(args.readers)]
        report["servers"][name] = {
            "package": served_package(checkout), **by_case,
            "ratios": {"cpu": round(b["cpu_us_per_post"] / a["cpu_us_per_post"], 2),
                       "median_cpu": round(b["median_cpu_us_per_post"]
                                           / a["median_cpu_us_per_post"], 2),
                       "p99": round(b["p99_ms"] / a["p99_ms"], 2),
                       "us_per_delivery": round((b["cpu_us_per_post"] - a["cpu_us_per_post"])
                                                * args.posts / max(1, b["delivered"]), 1)}}
    print(table(report, args.readers))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
