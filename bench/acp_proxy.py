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

``--turns`` measures instead what ``--deadline-ms`` trades: turns of an agent that streams
three sentences of thinking (a chunk of a few words every 20 ms) and then a tool call,
through the proxy and an ``llm`` sidecar whose chat server (here, a stand-in that answers
after ``--latency-ms``) is fast or slow. Per deadline: the tool call's wait (from writing
it to reading it back, which is what the agent's next step waits), the turn's time, and
the share of thought chunks that came out translated.

    .venv/bin/python bench/acp_proxy.py --turns 6 --latency-ms 300,4000 \
        --deadlines 0,500,1000,1500,2000,3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


# -- turns: what --deadline-ms trades -----------------------------------------------------

TURN = ("The test parses dates in the local timezone, so on CI the day can shift. "
        "Let me read the fixture that builds the dates first. "
        "Then I will run the failing test alone to see the offset")


def chat_server(latency_s: float) -> ThreadingHTTPServer:
    """An OpenAI-style chat endpoint that answers each translation request after
    ``latency_s``, each segment as ``<language>: <text>`` (the llm backend's format)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # /v1/models, the backend's start check
            self._answer({"object": "list", "data": [{"id": "m", "object": "model"}]})

        def _answer(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            user = next(m["content"] for m in body["messages"] if m["role"] == "user")
            payload = json.loads(user)
            items = [{"id": seg["id"], "text": f"{payload['target_language']}: {seg['text']}"}
                     for seg in payload["segments"]]
            time.sleep(latency_s)
            content = json.dumps({"translations": items})
            self._answer({"id": "c", "object": "chat.completion", "model": "m",
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": content}}]})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def turn_lines(n: int) -> list[bytes]:
    words = TURN.split(" ")
    pieces = [" ".join(words[i: i + 3]) + " " for i in range(0, len(words), 3)]
    lines = [json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "bench", "update": {"sessionUpdate": "agent_thought_chunk",
                                          "content": {"type": "text", "text": piece}}}})
             for piece in pieces]
    return [line.encode() + b"\n" for line in lines] + [update(n, "tool")]


async def turns(url: str, deadline_ms: float, count: int) -> dict[str, Any]:
    """``count`` turns through one proxy: the tool call's wait, the turn, the share."""
    command = [PROXY, "--url", url, "--target", "de", "--deadline-ms", f"{deadline_ms:g}",
               "--", sys.executable, "-c", ECHO]
    proc = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    assert proc.stdin is not None and proc.stdout is not None
    waits, spans, chunks, translated = [], [], 0, 0
    try:
        proc.stdin.write(update(-1, "tool"))  # the proxy and the agent are up: not timed
        await proc.stdin.drain()
        await asyncio.wait_for(proc.stdout.readline(), 60)
        for n in range(count):
            lines = turn_lines(n)
            started = time.perf_counter()
            for line in lines[:-1]:
                proc.stdin.write(line)
                await proc.stdin.drain()
                await asyncio.sleep(0.02)  # an agent streaming its thinking
            asked = time.perf_counter()
            proc.stdin.write(lines[-1])
            await proc.stdin.drain()
            while True:
                message = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
                update_ = message["params"]["update"]
                if update_["sessionUpdate"] != "agent_thought_chunk":
                    break
                chunks += 1
                translated += update_["_meta"]["thinktrans"]["status"] == "translated"
            done = time.perf_counter()
            waits.append((done - asked) * 1000)
            spans.append((done - started) * 1000)
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 60)
    return {"deadline_ms": deadline_ms, "tool_call_wait_ms": round(statistics.median(waits)),
            "turn_ms": round(statistics.median(spans)),
            "translated_share": round(translated / max(1, chunks), 2)}


def measure_turns(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for latency_ms in (float(v) for v in args.latency_ms.split(",")):
        chat = chat_server(latency_ms / 1000)
        server = Server({"THINKTRANS_BACKEND": "llm",
                         "THINKTRANS_LLM_BASE_URL": f"http://127.0.0.1:{chat.server_port}/v1",
                         "THINKTRANS_LLM_MODEL": "m", "THINKTRANS_CHECK_OUTPUT_LANGUAGE": "false"})
        try:
            for deadline_ms in (float(v) for v in args.deadlines.split(",")):
                row = asyncio.run(turns(server.url, deadline_ms, args.turns))
                rows.append({"latency_ms": latency_ms, **row})
                print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            server.stop()
            server.discard_log()
            chat.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--backend", default="passthrough")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--turns", type=int, default=0,
                        help="measure --deadline-ms instead: this many turns per deadline")
    parser.add_argument("--latency-ms", default="300,4000",
                        help="with --turns: the chat server's latencies, comma-separated")
    parser.add_argument("--deadlines", default="0,500,1000,1500,2000,3000",
                        help="with --turns: the proxy's --deadline-ms values")
    args = parser.parse_args()
    if args.turns:
        rows = measure_turns(args)
        if args.json:
            print(json.dumps(rows, indent=2))
            return
        print("| translator | --deadline-ms | tool call waits | turn | translated |\n"
              "| ---: | ---: | ---: | ---: | ---: |")
        for row in rows:
            print(f"| {row['latency_ms']:g} ms | {row['deadline_ms']:g} | "
                  f"{row['tool_call_wait_ms']} ms | {row['turn_ms']} ms | "
                  f"{row['translated_share']:.0%} |")
        return
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
