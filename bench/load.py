"""Load: N concurrent streams plus concurrent one-shot translations against a real server.

    .venv/bin/python bench/load.py --backend passthrough --streams 200 --duration 30
    .venv/bin/python bench/load.py --backend local --streams 200 --duration 30

Starts `thinktrans serve` on 127.0.0.1 (a free port) in its own process, with the
`passthrough` backend or the `local` one on a tiny test checkpoint (built with
`python -m service.tools.testmodel --family nllb DIR` unless --model-dir names one). The
streams part is `thinktrans bench` (service.tools.bench.run_bench: realistic deltas, every
stream's originals checked); at the same time --oneshot-clients clients POST /v1/translate at
--oneshot-rate requests/s in all, each checking that every result's segments join back
to its text.

Reports: errors, violations, chunk-POST latency as the client saw it (p50/p99) and as the
server measured it (its request-duration histogram: the share under 25 ms, and the bucket
that holds p99), how late the client's own event loop wakes (the share of the client-side
figure that is the client's), one-shot latency, segment statuses, the server's CPU and
peak RSS (VmHWM from /proc). Exits 1 on any error or violation. Everything stops by
itself: the load runs --duration seconds, streams under way finish their text, and every
wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from service.ops.metrics import percentile
from service.tools.bench import BenchConfig, BenchReport, run_bench
from service.tools.corpus import load_corpus

ROOT = Path(__file__).resolve().parent.parent
CHUNKS_ROUTE = "/v1/streams/{stream_id}/chunks"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """`thinktrans serve` on 127.0.0.1 in its own process; stopped with SIGTERM."""

    def __init__(self, env: dict[str, str], *, ready_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="thinktrans-serve-", suffix=".log",
                                               delete=False)
        # The translation cache off: repeated bench text would measure the cache.
        full_env = {**os.environ, "THINKTRANS_LOG_LEVEL": "warning", "THINKTRANS_CACHE_MB": "0",
                    **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
             "--port", str(self.port)],
            env=full_env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
        )
        give_up = time.monotonic() + ready_timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > give_up:
                self.stop()
                raise SystemExit(f"the server did not get ready; its log: {self.log.name}")
            time.sleep(0.2)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def discard_log(self) -> None:
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def stop(self, timeout_s: float = 30.0) -> float | None:
        """SIGTERM and wait; the seconds it took, or None if it had to be killed."""
        if self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None
        return time.monotonic() - started


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for key in ("VmRSS", "VmHWM"):
        m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
        if m:
            out[key] = int(m.group(1)) * 1024
    return out


def proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, from /proc/<pid>/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def run_queue_wait_s(pid: int) -> float | None:
    """Seconds the process's main thread spent runnable but waiting for a CPU (schedstat)."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except (OSError, IndexError):
        return None
    return int(fields[1]) / 1e9


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format: samples by name, each with its labels."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


def route_latency(metrics: dict[str, list[tuple[dict[str, str], float]]], route: str,
                  method: str = "POST", under_s: float = 0.025) -> dict[str, Any]:
    """From the request-duration histogram: count, share under ``under_s``, p99's bucket."""
    buckets = sorted(
        (float(labels["le"]), value)
        for labels, value in metrics.get("thinktrans_http_request_duration_seconds_bucket", [])
        if labels.get("route") == route and labels.get("method") == method
    )
    if not buckets or buckets[-1][1] == 0:
        return {"count": 0}
    total = buckets[-1][1]
    under = next((v for le, v in buckets if le >= under_s), total)
    p99_le = next(le for le, v in buckets if v >= 0.99 * total)
    p50_le = next(le for le, v in buckets if v >= 0.50 * total)
    return {"count": int(total), f"share_under_{under_s * 1000:g}ms": round(under / total, 4),
            "p50_at_most_ms": p50_le * 1000, "p99_at_most_ms": p99_le * 1000}


def backend_stats(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, Any]:
    """Batches, mean batch size and failed batches per backend."""
    out: dict[str, Any] = {}
    sums = {labels["backend"]: v for labels, v in metrics.get("thinktrans_batch_size_sum", [])}
    for labels, count in metrics.get("thinktrans_batch_size_count", []):
        name = labels["backend"]
        out[name] = {"batches": int(count),
                     "mean_batch_size": round(sums.get(name, 0.0) / count, 1) if count else None,
                     "failed_batches": 0}
    for labels, value in metrics.get("thinktrans_backend_errors_total", []):
        out.setdefault(labels["backend"], {"failed_batches": 0})["failed_batches"] += int(value)
    return out


def statuses_from(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for labels, value in metrics.get("thinktrans_segments_total", []):
        out[labels["status"]] = out.get(labels["status"], 0) + int(value)
    return dict(sorted(out.items()))


@dataclass
class OneShotReport:
    requests: int = 0
    texts: int = 0
    latency_ms: list[float] = field(default_factory=list)
    overloaded: int = 0
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "texts": self.texts,
            "latency_ms": {"p50": percentile(self.latency_ms, 50),
                           "p99": percentile(self.latency_ms, 99)},
            "overloaded_503": self.overloaded, "errors": len(self.errors),
            "violations": len(self.violations),
        }


async def one_shot_load(url: str, texts: list[str], clients: int, per_request: int,
                        duration_s: float, target: str, rate: float, seed: int = 0
                        ) -> OneShotReport:
    """``clients`` loops of POST /v1/translate for ``duration_s``, ``rate`` requests/s in
    all (0: each as fast as it can); checks every result."""
    report = OneShotReport()
    stop_at = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=120)
    interval = clients / rate if rate > 0 else 0.0

    async def client(i: int) -> None:
        rng = random.Random(seed * 7919 + i)
        next_at = time.monotonic() + rng.uniform(0, interval)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while time.monotonic() < stop_at:
                # An offered load, not a closed loop: a closed loop would take whatever
                # the server has left and so set the chunk POSTs' latency itself.
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at + interval, time.monotonic())
                batch = [rng.choice(texts) for _ in range(rng.randint(1, per_request))]
                t0 = time.perf_counter()
                try:
                    async with session.post(f"{url}/v1/translate",
                                            json={"texts": batch, "target": target}) as r:
                        status = r.status
                        body = await r.json(content_type=None)
                        retry_after = float(r.headers.get("Retry-After", "1"))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    report.errors.append(f"translate: {type(exc).__name__}")
                    await asyncio.sleep(0.2)
                    continue
                if status == 503:
                    report.overloaded += 1
                    await asyncio.sleep(retry_after)
                    continue
                report.requests += 1
                report.latency_ms.append((time.perf_counter() - t0) * 1000.0)
                if status != 200:
                    report.errors.append(f"translate -> {status} {str(body)[:120]}")
                    continue
                results = body["results"]
                report.texts += len(results)
                if len(results) != len(batch):
                    report.violations.append("one result per text broken")
                for text, result in zip(batch, results, strict=False):
                    if "".join(s["original"] for s in result["segments"]) != text:
                        report.violations.append("one-shot originals do not join back")

    await asyncio.gather(*(client(i) for i in range(clients)))
    return report


async def run_load(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    texts = [item.text for item in load_corpus(args.corpus)]
    cfg = BenchConfig(url=url, streams=args.streams, duration_s=args.duration, rate=args.rate,
                      post_interval_ms=args.post_interval_ms, target=args.to, texts=texts,
                      seed=args.seed, read_timeout_s=args.read_timeout)
    rss_peak_sampled = 0
    sampling = True

    async def sample() -> None:
        nonlocal rss_peak_sampled
        while sampling:
            rss_peak_sampled = max(rss_peak_sampled, proc_status(pid).get("VmRSS", 0))
            await asyncio.sleep(1.0)

    lag_ms: list[float] = []

    async def lag() -> None:
        # How late the client's own loop wakes: latency it adds to every request it times.
        while sampling:
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            lag_ms.append((time.perf_counter() - t0 - 0.01) * 1000.0)

    sampler = asyncio.create_task(sample())
    ticker = asyncio.create_task(lag())
    cpu0, wait0 = proc_cpu_s(pid), run_queue_wait_s(pid)
    client0 = time.process_time()
    started = time.monotonic()
    streams_report: BenchReport
    oneshot_report: OneShotReport
    streams_report, oneshot_report = await asyncio.gather(
        run_bench(cfg),
        one_shot_load(url, texts, args.oneshot_clients, args.oneshot_texts, args.duration,
                      args.to or "zh-CN", args.oneshot_rate, args.seed),
    )
    wall_s = time.monotonic() - started
    cpu1, wait1 = proc_cpu_s(pid), run_queue_wait_s(pid)
    client_cpu_s = time.process_time() - client0
    sampling = False
    await sampler
    await ticker
    async with httpx.AsyncClient(timeout=10) as client:
        metrics = parse_metrics((await client.get(f"{url}/metrics")).text)
    status = proc_status(pid)
    rss_metric = metrics.get("process_resident_memory_bytes", [({}, 0.0)])[0][1]
    streams = streams_report.summary()
    streams.pop("server_cpu_s", None)
    streams.pop("server_cpu_us_per_delta", None)
    return {
        "streams": streams,
        "chunk_post_server_side": route_latency(metrics, CHUNKS_ROUTE),
        "client": {"loop_lag_ms": {"p50": percentile(lag_ms, 50), "p99": percentile(lag_ms, 99)},
                   "cpu_share_of_one_core": round(client_cpu_s / wall_s, 2)},
        "one_shot": oneshot_report.summary(),
        "one_shot_server_side": route_latency(metrics, "/v1/translate", under_s=0.1),
        "segment_statuses_server": statuses_from(metrics),
        "backends": backend_stats(metrics),
        "server": {
            "cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 2),
            "cpu_share_of_one_core": (None if cpu0 is None or cpu1 is None
                                      else round((cpu1 - cpu0) / wall_s, 2)),
            # Share of the run the server's event-loop thread was ready but had no CPU.
            "loop_thread_waiting_for_cpu_share": (None if wait0 is None or wait1 is None
                                                  else round((wait1 - wait0) / wall_s, 3)),
            "peak_rss_mib": round(status.get("VmHWM", 0) / 2**20, 1),
            "rss_at_end_mib": round(status.get("VmRSS", 0) / 2**20, 1),
            "rss_sampled_peak_mib": round(rss_peak_sampled / 2**20, 1),
            "process_resident_memory_mib": round(rss_metric / 2**20, 1),
        },
        "wall_s": round(wall_s, 1),
        "_failures": (streams_report.errors + streams_report.violations
                      + oneshot_report.errors + oneshot_report.violations),
    }


def machine() -> str:
    """Cores and CPU model, e.g. '2 cores, AMD EPYC'."""
    model = platform.machine()
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        model = m.group(1).strip() if m else model
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


def make_checkpoint(outdir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "service.tools.testmodel", "--family", "nllb",
                    str(outdir)], check=True, cwd=ROOT, timeout=300, capture_output=True)
    return outdir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="passthrough", choices=["passthrough", "local"])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="local checkpoint (default: a tiny test checkpoint built now)")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=50.0, help="deltas/s per stream")
    parser.add_argument("--post-interval-ms", type=float, default=100.0)
    parser.add_argument("--oneshot-clients", type=int, default=8)
    parser.add_argument("--oneshot-texts", type=int, default=3, help="most texts per request")
    parser.add_argument("--oneshot-rate", type=float, default=20.0,
                        help="one-shot requests per second in all (0: as fast as they can)")
    parser.add_argument("--to", default="zh-CN")
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--read-timeout", type=float, default=60.0)
    parser.add_argument("--uvloop", action="store_true",
                        help="run the client on uvloop (less client CPU on a shared machine)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra THINKTRANS_* settings for the server")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()

    env = {"THINKTRANS_BACKEND": args.backend,
           "THINKTRANS_MAX_STREAMS": str(max(1000, args.streams * 4))}
    with tempfile.TemporaryDirectory(prefix="thinktrans-load-") as tmp:
        if args.backend == "local":
            model = args.model_dir or make_checkpoint(Path(tmp) / "nllb")
            env.update({"THINKTRANS_LOCAL_MODEL": str(model), "THINKTRANS_LOCAL_DEVICE": "cpu"})
        for item in args.server_env:
            name, _, value = item.partition("=")
            env[name] = value
        server = Server(env)
        try:
            if args.uvloop:
                import uvloop

                runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            else:
                runner = asyncio.Runner()
            with runner:
                report = runner.run(run_load(server.url, server.pid, args))
        finally:
            stop_s = server.stop()
    failures = report.pop("_failures")
    report["server"]["sigterm_exit_s"] = None if stop_s is None else round(stop_s, 2)
    shown_env = dict(env)
    if args.backend == "local" and args.model_dir is None:
        shown_env["THINKTRANS_LOCAL_MODEL"] = "(tiny nllb test checkpoint, built for the run)"
    report["config"] = {
        "backend": args.backend, "streams": args.streams, "duration_s": args.duration,
        "rate": args.rate, "post_interval_ms": args.post_interval_ms,
        "oneshot_clients": args.oneshot_clients, "oneshot_rate": args.oneshot_rate,
        "client_loop": "uvloop" if args.uvloop else "asyncio", "server_env": shown_env,
        "machine": machine(), "date": time.strftime("%Y-%m-%d"),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for line in failures[:10]:
        print(f"load: {line}", file=sys.stderr)
    if failures:
        raise SystemExit(f"load: {len(failures)} failures; the server's log: {server.log.name}")
    server.discard_log()


if __name__ == "__main__":
    main()
