"""Server CPU per chunk POST, against a floor: a bare Starlette route under the same uvicorn.

    .venv/bin/python bench/chunk_floor.py --posts 3000 [--checkout OTHER_DIR ...]

The floor parses the same JSON body and answers ``{"accepted_through": n}``: what any
Python service on this machine pays per POST (HTTP parsing, routing, JSON). thinktrans
(``thinktrans serve``, passthrough backend, default settings and logging, target zh-CN, so
that English segments are detected, batched and translated) then does its own work on
top. Each server runs in its own process; the load comes from this one over keep-alive
connections; the figure is the server process's CPU time (user + system, from /proc)
across the POSTs, divided by their count. On a machine of two cores or more the server
is pinned to one core and the load to another, so that they do not take turns on one.
Servers are measured in turns, ``--rounds`` times; each one's least CPU per POST (the
figure least disturbed by whatever else the machine does) and median are reported, with
their ratios to the floor's, so that the ratios come from one run. ``--checkout DIR``
adds the thinktrans of another checkout (an older commit, say) served by the same Python.

``--instructions`` counts instructions instead of CPU time: each server runs under
valgrind's callgrind, with counting switched on only across the measured POSTs. Slow
(tens of times), but the count does not move with the machine's other load, so small
changes show; it leaves out the kernel's share (system calls), which is larger for the
floor, so its ratios run higher than the CPU-time ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU, LOAD_CPU = 1, 0
# How long a server may take to answer its first POST: minutes under callgrind on a busy
# machine.
START_TIMEOUT_S = 1200.0
TEXT = (
    "Hmm, the user wants to know how long the whole hike took. Let me add up the parts first. "
    "The climb took 2 hours and 15 minutes, and the descent took 1 hour and 40 minutes. "
    "Wait, I should also count the 30-minute break at the top. So the total is 4 hours and "
    "25 minutes. Let me double-check that against what the user wrote. 我们再确认一下。 "
    "Yes, that matches. Now I can write the answer in a friendly way.\n"
)


def floor_app() -> object:
    """The floor: one route that parses the chunk body and answers the last seq."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def chunks(request: Request) -> Response:
        body = json.loads(await request.body())
        last = body["chunks"][-1]["seq"]
        return Response(b'{"accepted_through":%d}' % last, media_type="application/json")

    return Starlette(routes=[Route("/v1/streams/{stream_id}/chunks", chunks,
                                   methods=["POST"])])


def serve_floor(port: int) -> None:
    import uvicorn

    # The same uvicorn settings as `thinktrans serve` (service/cli.py).
    uvicorn.run(floor_app(), host="127.0.0.1", port=port, log_config=None,  # type: ignore[arg-type]
                access_log=False, log_level="info")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(name: str, checkout: Path | None, port: int,
          wrapper: list[str] | None = None) -> subprocess.Popen[bytes]:
    if checkout is None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-floor", str(port)]
        cwd = ROOT
    else:
        cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
        cwd = checkout
    cmd = [*(wrapper or []), *cmd]
    env = {**os.environ, "THINKTRANS_BACKEND": "passthrough",
           "THINKTRANS_DEFAULT_LOCALE": "zh-CN", "PYTHONPATH": str(cwd)}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(proc.pid, {SERVER_CPU})
    url = f"http://127.0.0.1:{port}"
    until = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < until:
        try:
            httpx.post(f"{url}/v1/streams/warm/chunks", timeout=10,
                       json={"chunks": [{"seq": 0, "text": "x"}]})
            return proc
        except httpx.TransportError:
            time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"{name} did not start")


def bodies(posts: int, streams: int, seed: int) -> list[tuple[str, bytes]]:
    """``posts`` chunk POSTs spread over ``streams`` streams: 5 model-sized deltas each."""
    rng = random.Random(seed)
    out: list[tuple[str, bytes]] = []
    seqs = [0] * streams
    pos = [rng.randrange(len(TEXT)) for _ in range(streams)]
    for i in range(posts):
        s = i % streams
        chunks = []
        for _ in range(5):
            size = rng.randint(1, 6)
            text = (TEXT * 2)[pos[s] : pos[s] + size]
            pos[s] = (pos[s] + size) % len(TEXT)
            chunks.append({"seq": seqs[s], "text": text})
            seqs[s] += 1
        out.append((f"bench-{seed}-{s}", json.dumps({"chunks": chunks}).encode()))
    return out


async def drive(url: str, plan: list[tuple[str, bytes]], concurrency: int) -> int:
    """Send the POSTs, ``concurrency`` at a time, each stream's in order."""
    by_stream: dict[str, list[bytes]] = {}
    for sid, body in plan:
        by_stream.setdefault(sid, []).append(body)
    errors = 0
    sem = asyncio.Semaphore(concurrency)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def one_stream(sid: str, posts: list[bytes]) -> None:
            nonlocal errors
            for body in posts:
                async with sem, http.post(f"{url}/v1/streams/{sid}/chunks", data=body,
                                          headers=headers) as resp:
                    await resp.read()
                    errors += resp.status != 200

        await asyncio.gather(*(one_stream(sid, posts) for sid, posts in by_stream.items()))
    return errors


def measure(proc: subprocess.Popen[bytes], url: str, posts: int, streams: int,
            concurrency: int, seed: int) -> float:
    plan = bodies(posts, streams, seed)
    asyncio.run(drive(url, plan[: streams * 2], concurrency))  # open the streams, warm up
    before = cpu_s(proc.pid)
    errors = asyncio.run(drive(url, plan[streams * 2 :], concurrency))
    used = cpu_s(proc.pid) - before
    if errors:
        raise SystemExit(f"{errors} POSTs failed against {url}")
    return used / (posts - streams * 2) * 1e6


def instructions(name: str, checkout: Path | None, posts: int, streams: int,
                 concurrency: int) -> float:
    """Instructions per chunk POST, counted by callgrind across the measured POSTs only."""
    out = Path(tempfile.mkdtemp()) / "callgrind.out"
    port = free_port()
    proc = start(name, checkout, port, ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                                        f"--callgrind-out-file={out}"])
    url = f"http://127.0.0.1:{port}"
    plan = bodies(posts, streams, seed=0)
    try:
        asyncio.run(drive(url, plan[: streams * 2], concurrency))
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True,
                       capture_output=True)
        asyncio.run(drive(url, plan[streams * 2 :], concurrency))
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True,
                       capture_output=True)
    finally:
        proc.terminate()
        proc.wait(timeout=300)
    total = 0
    for path in out.parent.glob("callgrind.out*"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return total / (posts - streams * 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--posts", type=int, default=3000, help="Chunk POSTs per measurement.")
    parser.add_argument("--streams", type=int, default=50, help="Streams the POSTs go to.")
    parser.add_argument("--concurrency", type=int, default=8, help="POSTs in flight.")
    parser.add_argument("--rounds", type=int, default=3, help="Turns per server (median).")
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="Another checkout of thinktrans to measure beside this one.")
    parser.add_argument("--instructions", action="store_true",
                        help="Count instructions under callgrind instead of CPU time.")
    parser.add_argument("--serve-floor", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(args.serve_floor)
        return
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {LOAD_CPU})
    servers: dict[str, Path | None] = {"floor": None, "thinktrans": ROOT}
    for path in args.checkout:
        servers[f"thinktrans@{path}"] = path.resolve()
    if args.instructions:
        counts = {name: instructions(name, checkout, args.posts, args.streams,
                                     args.concurrency) for name, checkout in servers.items()}
        print(json.dumps({
            "posts": args.posts, "streams": args.streams, "concurrency": args.concurrency,
            "servers": {name: {"instructions_per_post": round(n),
                               "ratio_to_floor": round(n / counts["floor"], 2)}
                        for name, n in counts.items()},
        }, indent=2))
        return
    samples: dict[str, list[float]] = {name: [] for name in servers}
    for round_ in range(args.rounds):
        for name, checkout in servers.items():
            port = free_port()
            proc = start(name, checkout, port)
            try:
                samples[name].append(measure(proc, f"http://127.0.0.1:{port}", args.posts,
                                             args.streams, args.concurrency, seed=round_))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    floor_min, floor_median = min(samples["floor"]), statistics.median(samples["floor"])
    report = {
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "posts": args.posts, "streams": args.streams, "concurrency": args.concurrency,
        "servers": {name: {"cpu_us_per_post": round(min(values), 1),
                           "ratio_to_floor": round(min(values) / floor_min, 2),
                           "median_cpu_us_per_post": round(statistics.median(values), 1),
                           "median_ratio_to_floor": round(statistics.median(values)
                                                          / floor_median, 2),
                           "rounds": [round(v, 1) for v in values]}
                    for name, values in samples.items()},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
