"""Streams under load: start `thinktrans serve` (passthrough) and run `thinktrans bench`.

    .venv/bin/python bench/stream_bench.py --streams 200 --duration 20

Reports chunk-POST latency, ready-to-emit latency, server CPU per delta and checks
every stream's originals. Everything runs on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--post-interval-ms", type=float, default=100.0)
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    parser.add_argument("--backend", default="passthrough")
    args = parser.parse_args()
    port = free_port()
    env = {**os.environ, "THINKTRANS_BACKEND": args.backend, "THINKTRANS_LOG_LEVEL": "warning",
           "THINKTRANS_CACHE_MB": "0",  # repeated bench text would measure the cache
           "THINKTRANS_MAX_WAIT_MS": str(args.max_wait_ms)}
    server = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                              env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        out = subprocess.run(
            [sys.executable, "-m", "service.cli", "bench", "--url", url, "--streams",
             str(args.streams), "--duration", str(args.duration), "--rate", str(args.rate),
             "--post-interval-ms", str(args.post_interval_ms), "--format", "json"],
            capture_output=True, text=True, timeout=args.duration + 300,
        )
        sys.stderr.write(out.stderr[-2000:])
        summary = json.loads(out.stdout)
        summary["max_wait_ms"] = args.max_wait_ms
        summary["post_interval_ms"] = args.post_interval_ms
        print(json.dumps(summary, indent=2))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
