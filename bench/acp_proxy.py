"""What ``thinktrans-acp`` adds between an editor and an agent.

The agent is an echo (each line it reads, written back), so one line makes the trip
editor -> proxy -> agent -> proxy -> editor. Measured, one line at a time:

- ``direct``: the echo alone, no proxy (the floor: two pipe hops and the child);
- ``relay``: a JSON-RPC message that is not a thought (a ``tool_call`` update), through
  the proxy: what every message of a session pays;
- ``thought``: an ``agent_thought_chunk`` holding one whole sentence followed by a
  ``tool_call`` (which ends the thinking part, as in a real turn), through the proxy and a
  passthrough sidecar, until the translated chunk is back (stream open, chunk POST,
  segmenting, the batch, the events read back, close). With ``--backend llm`` etc. the
  backend's own time adds to it. A part that nothing ends waits ``flush_idle_ms``.

The sidecar is a ``thinktrans serve`` started here with the cache off (``bench/load.py``).

    .venv/bin/python bench/acp_proxy.py [--lines 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from load import Server  # bench/load.py: `thinktrans serve` on a free port, until /readyz

ROOT = Path(__file__).resolve().parents[1]
PROXY = str(Path(sys.executable).with_name("thinktrans-acp"))
ECHO = ("import sys\n"
        "for line in sys.stdin.buffer:\n"
        "    sys.stdout.buffer.write(line); sys.stdout.buffer.flush()\n")
SENTENCE = "The test parses dates in the local timezone, so on CI the day can shift. "


def update(n: int, kind: str) -> bytes:
    body: dict[str, Any]
    if kind == "thought":
        body = {"sessionUpdate": "agent_thought_chunk",
                "content": {"type": "text", "text": f"{SENTENCE}"}, "messageId": f"m{n}"}
    else:
        body = {"sessionUpdate": "tool_call", "toolCallId": f"call_{n}", "title": "Read a file"}
    message = {"jsonrpc": "2.0", "method": "session/update",
               "params": {"sessionId": "bench", "update": body}}
    return json.dumps(message).encode() + b"\n"


async def round_trips(command: list[str], kind: str, lines: int) -> list[float]:
    """Milliseconds from writing each line to reading its (first) answer line back."""
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    times = []
    try:
        for n in range(lines + 5):
            started = time.perf_counter()
            proc.stdin.write(update(n, kind))
            if kind == "thought":
                proc.stdin.write(update(n, "tool"))
            await proc.stdin.drain()
            await asyncio.wait_for(proc.stdout.readline(), 30)
            if n >= 5:  # the first ones warm connections up
                times.append((time.perf_counter() - started) * 1000)
            if kind == "thought":
                await asyncio.wait_for(proc.stdout.readline(), 30)
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 30)
    return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"n": len(times), "p50_ms": round(statistics.median(ordered), 3),
            "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1], 3),
            "mean_ms": round(statistics.fmean(ordered), 3)}


async def measure(url: str, lines: int) -> dict[str, Any]:
    echo = [sys.executable, "-c", ECHO]
    proxied = [PROXY, "--url", url, "--target", "de", "--", *echo]
    return {"direct": summary(await round_trips(echo, "tool", lines)),
            "relay": summary(await round_trips(proxied, "tool", lines)),
            "thought": summary(await round_trips(proxied, "thought", lines))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--backend", default="passthrough")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    server = Server({"THINKTRANS_BACKEND": args.backend})  # the cache off, logs at warning
    try:
        result = asyncio.run(measure(server.url, args.lines))
    finally:
        server.stop()
        server.discard_log()
    result["backend"] = args.backend
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("| path | n | p50 | p99 | mean |\n| --- | ---: | ---: | ---: | ---: |")
    for name in ("direct", "relay", "thought"):
        row = result[name]
        print(f"| {name} | {row['n']} | {row['p50_ms']:.2f} ms | {row['p99_ms']:.2f} ms | "
              f"{row['mean_ms']:.2f} ms |")


if __name__ == "__main__":
    main()
