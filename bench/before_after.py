"""This checkout against another, side by side in one run: the pipeline and stream benches.

    .venv/bin/python bench/before_after.py --checkout ../before [--streams 50 --streams 100]

Runs ``bench/pipeline_bench.py`` (one-shot, in-process, passthrough) and
``bench/stream_bench.py`` (``thinktrans serve`` under ``thinktrans bench``) for each
checkout in turn, the same Python for both (each checkout's code first on the path), and
prints Markdown tables with a row per checkout, so that every ratio comes from one run on
one machine. ``bench/chunk_floor.py --checkout`` does the same for the chunk POST.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _run(checkout: Path, script: str, *args: str, timeout_s: float = 900) -> str:
    env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'client'}"}
    done = subprocess.run([sys.executable, str(HERE / "bench" / script), *args], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {checkout}:\n{done.stderr[-3000:]}")
    return done.stdout


def pipeline(checkouts: dict[str, Path], concurrency: list[int], requests: int) -> None:
    print("| code | concurrent requests | segments | wall µs/segment | CPU µs/segment "
          "| segments/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for c in concurrency:
        for name, checkout in checkouts.items():
            out = _run(checkout, "pipeline_bench.py", "--concurrency", str(c),
                       "--requests", str(requests))
            row = next(line for line in out.splitlines() if line.startswith(f"| {c} |"))
            print(f"| {name} {row}")


def streams(checkouts: dict[str, Path], counts: list[int], duration_s: float) -> None:
    print("| streams | code | deltas | chunk POST p50 / p99 (ms) | ready-to-emit p50 / p99 "
          "(ms) | server CPU per delta (µs) | segments | deadline misses | violations |")
    print("| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |")
    for n in counts:
        for name, checkout in checkouts.items():
            out = _run(checkout, "stream_bench.py", "--streams", str(n), "--duration",
                       str(duration_s), timeout_s=duration_s + 600)
            s = json.loads(out[out.index("{"):])
            post, ready = s["chunk_post_ms"], s["ready_to_emit_ms"]
            print(f"| {n} | {name} | {s['deltas']} | {post['p50']:.2f} / {post['p99']:.2f} | "
                  f"{ready['p50']:.2f} / {ready['p99']:.2f} | "
                  f"{s['server_cpu_us_per_delta']:.1f} | {s['segments']} | "
                  f"{s['deadline_misses']} | {s['violations']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkout", type=Path, required=True,
                        help="The other checkout (an older commit, say).")
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--streams", type=int, action="append")
    parser.add_argument("--duration", type=float, default=20.0)
    args = parser.parse_args()
    checkouts = {"before": args.checkout.resolve(), "now": HERE}
    pipeline(checkouts, args.concurrency or [1, 64], args.requests)
    print()
    streams(checkouts, args.streams or [50, 100, 200], args.duration)


if __name__ == "__main__":
    main()
