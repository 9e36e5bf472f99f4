"""One pool, 1/4/16 sidecars posting streams: batch fill, ready-to-emit, and the pool's hop.

Starts `thinktrans pool` (a local Ray instance) on two random-weight checkpoints routed by
pair (``THINKTRANS_LOCAL_MODELS``): the Marian shape for en -> de, which the streams load,
and a tiny Marian for en -> ja, whose model time is small enough to show the hop. Then:

- the hop: ``--calls`` sequential one-sentence calls of the tiny model, through the pool's
  HTTP route (proxy, batch queue, replica) and through the same ``LocalTranslator``
  in-process; the medians' difference is what the pool adds to a batch (``batch_wait_ms``
  included: a call that comes alone waits it out), and a ``GET /v1/info`` round trip is the
  proxy and route alone;
- for each N of ``--sidecars``: N `thinktrans serve` processes (backend `pool`, cache off),
  each with ``--streams`` streams of English thinking posted as `thinktrans bench` posts
  them (deltas at ``--rate`` a second, read over SSE) for ``--duration`` seconds; the
  sidecars' segments (ready-to-emit p50/p99, statuses) and the pool's engine batches
  (``/v1/stats``: segments per batch against ``max_batch_size``, sidecars per batch);
- the same load on one sidecar whose backend is `local` (the Marian shape in-process).

    .venv/bin/python bench/pool_bench.py --sidecars 1,4,16 --duration 30

``--fairness`` runs, in its place, one flooding sidecar (``--flood-streams`` streams posting
``--flood-rate`` deltas a second each, more than the engine keeps up with) beside one light
sidecar (one stream at ``--light-rate``, a reader's pace), on a random-weight checkpoint
of the Marian shape for en -> de (``--fair-model tiny``: a tiny one), the engine on one
core: first on a pool as it was before fair turns (``THINKTRANS_POOL_FAIR=false``, oldest
calls first, and no per-client cap to speak of), then on one with the defaults (fair turns,
per-client caps). On each: the light sidecar alone, then both at once; per sidecar its
ready-to-emit p50/p99 and segments translated in time, and the engine's batch fill.

    .venv/bin/python bench/pool_bench.py --fairness --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from model_bench import SENTENCES, run_child

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} not ready in {timeout_s:g} s: {log.read_text()[-2000:]}")


@contextmanager
def process(args: list[str], env: dict[str, str], log: Path, port: int,
            timeout_s: float = 300.0) -> Iterator[str]:
    """``python -m service.cli ARGS --port PORT`` until ready; SIGTERM afterwards."""
    url = f"http://127.0.0.1:{port}"
    full = {k: v for k, v in os.environ.items() if not k.startswith("THINKTRANS_")}
    full.update(env, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", *args, "--port", str(port)],
                                env=full, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        _wait(url, proc, log, timeout_s)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def texts() -> list[str]:
    return [" ".join(SENTENCES[i:i + 3]) for i in range(0, len(SENTENCES), 3)]


async def hop(pool: str, tiny: Path, ct2: Path, calls: int) -> dict[str, float]:
    """Median ms of one one-sentence batch: through the pool, and in-process."""
    from models.registry import build_backend
    from service.settings import load_settings

    sentence = SENTENCES[0]
    async with httpx.AsyncClient(base_url=pool, timeout=60) as client:
        info = []  # the proxy and the replica's HTTP route alone: no batch, no engine
        for _ in range(calls + 2):
            started = time.perf_counter()
            (await client.get("/v1/info")).raise_for_status()
            info.append((time.perf_counter() - started) * 1000)
        through = []
        for _ in range(calls + 2):
            started = time.perf_counter()
            resp = await client.post("/v1/batch", json={
                "texts": [sentence], "source": "en", "target": "ja", "deadline_ms": 10_000})
            resp.raise_for_status()
            through.append((time.perf_counter() - started) * 1000)
    backend = build_backend("local", load_settings(local_model=str(tiny),
                                                   local_ct2_cache=str(ct2)))
    await backend.start()
    await backend.wait_ready(120)
    inproc = []
    for _ in range(calls + 2):
        started = time.perf_counter()
        await backend.translate([sentence], source="en", target="ja")
        inproc.append((time.perf_counter() - started) * 1000)
    await backend.aclose()
    pool_ms, local_ms = statistics.median(through[2:]), statistics.median(inproc[2:])
    return {"pool_ms": round(pool_ms, 1), "in_process_ms": round(local_ms, 1),
            "hop_ms": round(pool_ms - local_ms, 1),
            "info_round_trip_ms": round(statistics.median(info[2:]), 1)}


async def load(urls: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """``args.streams`` bench streams on each sidecar at once; their reports merged."""
    from service.ops.metrics import percentile
    from service.tools.bench import BenchConfig, run_bench

    reports = await asyncio.gather(*(run_bench(BenchConfig(
        url=url, streams=args.streams, duration_s=args.duration, rate=args.rate,
        target="de", texts=texts(), seed=i)) for i, url in enumerate(urls)))
    emit = [ms for r in reports for ms in r.ready_to_emit_ms]
    statuses: dict[str, int] = {}
    for r in reports:
        for status, n in r.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
    segments = sum(r.segments for r in reports)
    wall = max(r.wall_s for r in reports)
    return {"segments": segments, "segments_per_s": round(segments / wall, 2),
            "ready_to_emit_p50_ms": round(percentile(emit, 50) or 0, 1),
            "ready_to_emit_p99_ms": round(percentile(emit, 99) or 0, 1),
            "statuses": statuses, "updates": sum(r.updates for r in reports),
            "violations": sum(len(r.violations) for r in reports)}


def pool_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    batches = after["model_batches"] - before["model_batches"]
    segs = after["model_segments"] - before["model_segments"]
    recent = after["recent"][-batches:] if batches else []
    fill = segs / batches / after["max_batch_size"] if batches else 0.0
    return {"engine_batches": batches, "segments_per_batch": round(segs / batches, 2)
            if batches else 0.0, "batch_fill": round(fill, 3),
            "sidecars_per_batch": round(statistics.mean(b["sidecars"] for b in recent), 2)
            if recent else 0.0,
            "engine_ms_p50_max": [round(statistics.median(ms), 1), max(ms)] if (
                ms := [b.get("ms", 0.0) for b in recent]) else None,
            "merged_share": round((after["merged_batches"] - before["merged_batches"])
                                  / batches, 3) if batches else 0.0,
            "expired_segments": after["expired_segments"] - before["expired_segments"],
            "cancelled_segments": after["cancelled_segments"] - before["cancelled_segments"]}


def sidecar_env(**more: str) -> dict[str, str]:
    return {"THINKTRANS_DEFAULT_LOCALE": "de", "THINKTRANS_CACHE_MB": "0",
            # Random weights write noise in no language: the output check would refuse it.
            "THINKTRANS_CHECK_OUTPUT_LANGUAGE": "false", **more}


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from service.tools.testmodel import make_test_model

    big = tmp / "marian-shape"
    run_child("_build", "marian", str(big))
    tiny = make_test_model("marian", tmp / "tiny-en-ja", target_lang="ja")
    ct2 = tmp / "ct2"
    local = {"THINKTRANS_LOCAL_CT2_CACHE": str(ct2)}
    pool_env = {**local, "THINKTRANS_LOCAL_MODELS": f"en-ja={tiny},{big}",
                "THINKTRANS_POOL_BATCH_WAIT_MS": str(args.batch_wait_ms),
                "THINKTRANS_POOL_MAX_BATCH_SIZE": str(args.max_batch_size)}
    out: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                           "args": vars(args), "rows": []}
    with process(["pool"], pool_env, tmp / "pool.log", _free_port()) as pool:
        out["hop"] = asyncio.run(hop(pool, tiny, ct2, args.calls))
        print(json.dumps({"hop": out["hop"]}), flush=True)
        for n in args.sidecars:
            env = sidecar_env(THINKTRANS_BACKEND="pool", THINKTRANS_POOL_URL=pool)
            with ExitStack() as stack:
                urls = [stack.enter_context(process(["serve"], env, tmp / f"s{i}.log",
                                                    _free_port())) for i in range(n)]
                before = httpx.get(f"{pool}/v1/stats").json()
                row = {"sidecars": n, "backend": "pool", **asyncio.run(load(urls, args))}
                row.update(pool_delta(before, httpx.get(f"{pool}/v1/stats").json()))
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    env = sidecar_env(THINKTRANS_BACKEND="local", THINKTRANS_LOCAL_MODEL=str(big), **local)
    with process(["serve"], env, tmp / "local.log", _free_port()) as url:
        row = {"sidecars": 1, "backend": "local (in-process)", **asyncio.run(load([url], args))}
    out["rows"].append(row)
    print(json.dumps(row), flush=True)
    return out


# The pools of --fairness: as before fair turns, and with them (the defaults).
FAIRNESS_POOLS = {"oldest first, no cap": {"THINKTRANS_POOL_FAIR": "false",
                                           "THINKTRANS_POOL_CLIENT_MAX_WAITING": "1000000"},
                  "fair turns, cap 256": {}}


async def streams(url: str, count: int, rate: float, args: argparse.Namespace,
                  seed: int) -> dict[str, Any]:
    """``count`` bench streams at ``rate`` deltas/s on one sidecar: its segments."""
    from service.ops.metrics import percentile
    from service.tools.bench import BenchConfig, run_bench

    r = await run_bench(BenchConfig(url=url, streams=count, duration_s=args.duration,
                                    rate=rate, target="de", texts=texts(), seed=seed))
    return {"segments": r.segments, "in_time": r.statuses.get("translated", 0),
            "statuses": dict(r.statuses),
            "p50_ms": round(percentile(r.ready_to_emit_ms, 50) or 0, 1),
            "p99_ms": round(percentile(r.ready_to_emit_ms, 99) or 0, 1),
            "violations": len(r.violations)}


async def side_by_side(flood: str, light: str, args: argparse.Namespace
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    flooding, reading = await asyncio.gather(
        streams(flood, args.flood_streams, args.flood_rate, args, seed=1),
        streams(light, 1, args.light_rate, args, seed=2))
    return flooding, reading


def fairness(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from service.tools.testmodel import make_test_model

    model = tmp / "en-de"
    if args.fair_model == "tiny":
        make_test_model("marian", model)
    else:  # the Marian shape: an engine the flood keeps busy on CPU
        run_child("_build", "marian", str(model))
    base = {"THINKTRANS_LOCAL_MODEL": str(model), "THINKTRANS_LOCAL_CT2_CACHE": str(tmp / "ct2"),
            "THINKTRANS_POOL_BATCH_WAIT_MS": str(args.batch_wait_ms),
            "THINKTRANS_POOL_MAX_BATCH_SIZE": str(args.max_batch_size),
            # The engine on one core, the sidecars and the load on the other.
            "THINKTRANS_LOCAL_THREADS": "1"}
    out: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                           "args": vars(args), "fairness": []}
    for name, extra in FAIRNESS_POOLS.items():
        with process(["pool"], {**base, **extra}, tmp / "pool.log", _free_port()) as pool:
            with ExitStack() as stack:
                urls = {who: stack.enter_context(process(["serve"], sidecar_env(
                    THINKTRANS_BACKEND="pool", THINKTRANS_POOL_URL=pool,
                    THINKTRANS_POOL_CLIENT_ID=who,
                    THINKTRANS_DEADLINE_MS=str(args.deadline_ms)),
                    tmp / f"{who}.log", _free_port()))
                    for who in ("flood", "light")}
                alone = asyncio.run(streams(urls["light"], 1, args.light_rate, args, seed=2))
                before = httpx.get(f"{pool}/v1/stats").json()
                flooding, reading = asyncio.run(side_by_side(urls["flood"], urls["light"], args))
                after = httpx.get(f"{pool}/v1/stats").json()
            row = {"pool": name, "light_alone": alone, "light": reading, "flood": flooding,
                   **pool_delta(before, after),
                   "clients": {who: after["clients"].get(who) for who in ("flood", "light")}}
        out["fairness"].append(row)
        print(json.dumps(row), flush=True)
    return out


def fairness_table(out: dict[str, Any]) -> str:
    lines = ["| pool | sidecar | segments | translated in time | ready-to-emit p50 / p99 ms | "
             "pool: queue wait p99 ms, expired | engine batches | segments per batch | fill |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in out["fairness"]:
        for who, key in (("light, alone", "light_alone"), ("light, beside the flood", "light"),
                         ("flood", "flood")):
            s = r[key]
            seen = r["clients"].get(key.split("_")[0]) or {}
            wait = (seen.get("queue_wait_ms") or {}).get("p99", "")
            pool = "" if key == "light_alone" else f"{wait}, {seen.get('expired_segments', '')}"
            batches = " |  | " if key == "light_alone" else (
                f"{r['engine_batches']} | {r['segments_per_batch']} | {r['batch_fill']}")
            lines.append(f"| {r['pool']} | {who} | {s['segments']} | "
                         f"{s['in_time'] / max(1, s['segments']):.0%} | "
                         f"{s['p50_ms']} / {s['p99_ms']} | {pool} | {batches} |")
    return "\n".join(lines)


def table(out: dict[str, Any]) -> str:
    lines = ["| sidecars | backend | segments/s | ready-to-emit p50 / p99 ms | deadline | "
             "engine batches | segments per batch | fill | sidecars per batch | "
             "dropped: expired / given up |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in out["rows"]:
        late = r["statuses"].get("deadline", 0) / max(1, r["segments"])
        lines.append(
            f"| {r['sidecars']} | {r['backend']} | {r['segments_per_s']} | "
            f"{r['ready_to_emit_p50_ms']} / {r['ready_to_emit_p99_ms']} | {late:.1%} | "
            f"{r.get('engine_batches', '')} | {r.get('segments_per_batch', '')} | "
            f"{r.get('batch_fill', '')} | {r.get('sidecars_per_batch', '')} | "
            f"{r.get('expired_segments', '')} / {r.get('cancelled_segments', '')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecars", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4, 16])
    parser.add_argument("--streams", type=int, default=1, help="streams per sidecar")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="deltas/s per stream")
    parser.add_argument("--calls", type=int, default=30, help="calls for the hop")
    parser.add_argument("--batch-wait-ms", type=float, default=10.0)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--fairness", action="store_true",
                        help="a flooding sidecar beside a light one, with and without fair turns")
    parser.add_argument("--fair-model", choices=["marian", "tiny"], default="marian",
                        help="--fairness: the Marian shape, or a tiny checkpoint")
    parser.add_argument("--flood-streams", type=int, default=64)
    parser.add_argument("--flood-rate", type=float, default=50.0, help="deltas/s per stream")
    parser.add_argument("--light-rate", type=float, default=10.0, help="deltas/s")
    parser.add_argument("--deadline-ms", type=float, default=10_000.0,
                        help="--fairness: the sidecars' deadline_ms")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = fairness(args, Path(tmp)) if args.fairness else run(args, Path(tmp))
    print(fairness_table(out) if args.fairness else table(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
