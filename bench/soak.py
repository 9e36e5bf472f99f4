"""Soak: streams that are closed, and streams that are abandoned to expire, for minutes on end.

    .venv/bin/python bench/soak.py --minutes 10
    .venv/bin/python bench/soak.py --minutes 1 --workers 10      # a quick look

Starts `thinktrans serve` (passthrough unless --backend) on 127.0.0.1 with a short
THINKTRANS_STREAM_IDLE_EXPIRE_S (--expire-s, default 5) and runs --workers stream writers
for --minutes. Each stream is, in turn:

- closed and deleted: its SSE reader must see every original, then `end`;
- closed and left: read to `end`, never deleted, so it expires;
- abandoned: the writer stops mid-text and never closes (an SSE reader that drops after a
  few events, or none at all), so the stream expires with text still pending.

Every --sample-s seconds it samples the server's RSS (/proc/<pid>/status) and the
thinktrans_open_streams gauge. After the load it waits for expiry (and checks that the
last 300 streams left behind answer 404), then reports whether
memory grows: the mean RSS of the first and the last minute, and the slope of a
least-squares line through the samples after the first minute (MiB per minute). It stops
by itself: the writers stop at the deadline, every read and wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from load import Server, machine, make_checkpoint, parse_metrics, proc_cpu_s, proc_status

from service.tools.bench import split_deltas
from service.tools.corpus import load_corpus

MIB = 2**20


@dataclass
class Counts:
    closed_deleted: int = 0
    closed_left: int = 0
    abandoned: int = 0
    deltas: int = 0
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


@dataclass
class Sample:
    t_s: float
    rss: int
    open_streams: float
    cpu_s: float | None


class Soak:
    def __init__(self, url: str, pid: int, args: argparse.Namespace, texts: list[str]) -> None:
        self.url = url
        self.pid = pid
        self.args = args
        self.texts = texts
        self.counts = Counts()
        self.left: deque[str] = deque(maxlen=300)  # streams left to expire (most recent)
        self.samples: list[Sample] = []
        self.not_expired = -1
        self.started = time.monotonic()
        self.stop_at = self.started + args.minutes * 60.0
        self.timeout = aiohttp.ClientTimeout(total=None, sock_read=30)

    # -- one stream --------------------------------------------------------------------------

    async def post(self, session: aiohttp.ClientSession, sid: str, chunks: list[dict[str, Any]]
                   ) -> bool:
        for _ in range(20):
            try:
                async with session.post(f"{self.url}/v1/streams/{sid}/chunks",
                                        json={"chunks": chunks}) as r:
                    status = r.status
                    body = await r.read()
                    retry_after = float(r.headers.get("Retry-After", "1"))
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.counts.errors.append(f"{sid}: chunks {type(exc).__name__}")
                await asyncio.sleep(0.2)
                continue
            if status == 200:
                return True
            if status == 503:
                await asyncio.sleep(retry_after)
                continue
            self.counts.errors.append(f"{sid}: chunks -> {status} {body[:120]!r}")
            return False
        return False

    async def read(self, session: aiohttp.ClientSession, sid: str, limit: int | None
                   ) -> tuple[list[str], bool]:
        """SSE until `end` (or ``limit`` events, then drop); the originals and whether it ended."""
        originals: dict[int, str] = {}
        event = ""
        seen = 0
        async with session.get(f"{self.url}/v1/streams/{sid}/events",
                               headers={"Accept": "text/event-stream"}) as resp:
            if resp.status != 200:
                self.counts.errors.append(f"{sid}: events -> {resp.status}")
                return [], False
            async for raw in resp.content:
                line = raw.decode("utf-8").rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    seen += 1
                    data = json.loads(line[6:])
                    if event == "segment":
                        originals[data["index"]] = data["original"]
                    elif event == "end":
                        return [originals[i] for i in sorted(originals)], True
                    if limit is not None and seen >= limit:
                        break
        return [originals[i] for i in sorted(originals)], False

    async def one_stream(self, session: aiohttp.ClientSession, sid: str, rng: random.Random
                         ) -> None:
        text = rng.choice(self.texts)
        kind = rng.choices(["closed_deleted", "closed_left", "abandoned"],
                           weights=[1.0, 1.0, self.args.abandon_weight])[0]
        async with session.post(f"{self.url}/v1/streams",
                                json={"stream_id": sid, "target": self.args.to}) as r:
            if r.status not in (200, 201):
                self.counts.errors.append(f"{sid}: open -> {r.status}")
                return
        deltas = split_deltas(text, rng)
        if kind == "abandoned":
            deltas = deltas[: rng.randint(1, max(1, len(deltas) - 1))]
            limit = rng.choice([None, 1, 3])  # None: no reader at all
            reader = (asyncio.create_task(self.read(session, sid, limit))
                      if limit is not None else None)
        else:
            reader = asyncio.create_task(self.read(session, sid, None))
        sent = 0
        begun = time.monotonic()
        interval = self.args.post_interval_ms / 1000.0
        while sent < len(deltas):
            due = min(len(deltas), int((time.monotonic() - begun) * self.args.rate) + 1)
            if due > sent:
                chunks = [{"seq": s, "text": deltas[s]} for s in range(sent, due)]
                if not await self.post(session, sid, chunks):
                    break
                self.counts.deltas += len(chunks)
                sent = due
            await asyncio.sleep(interval)
        if kind == "abandoned":
            self.counts.abandoned += 1
            self.left.append(sid)
            if reader is not None:
                try:
                    await asyncio.wait_for(reader, 2.0)  # drops after a few events
                except TimeoutError:
                    pass  # it waits on a stream that will expire: let it go
                except aiohttp.ClientError:
                    pass
            return
        async with session.post(f"{self.url}/v1/streams/{sid}/close") as r:
            if r.status != 200:
                self.counts.errors.append(f"{sid}: close -> {r.status}")
        assert reader is not None
        try:
            originals, ended = await asyncio.wait_for(reader, 60)
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.counts.violations.append(f"{sid}: no end ({type(exc).__name__})")
            return
        if not ended or "".join(originals) != text:
            self.counts.violations.append(f"{sid}: originals do not join back (ended={ended})")
        if kind == "closed_deleted":
            async with session.delete(f"{self.url}/v1/streams/{sid}") as r:
                if r.status != 204:
                    self.counts.errors.append(f"{sid}: delete -> {r.status}")
            self.counts.closed_deleted += 1
        else:
            self.counts.closed_left += 1
            self.left.append(sid)

    async def worker(self, i: int) -> None:
        rng = random.Random(self.args.seed * 100_003 + i)
        connector = aiohttp.TCPConnector(limit=4)
        async with aiohttp.ClientSession(connector=connector, timeout=self.timeout) as session:
            n = 0
            while time.monotonic() < self.stop_at:
                await self.one_stream(session, f"soak-{i}-{n}", rng)
                n += 1
                await asyncio.sleep(rng.uniform(0, self.args.pause_s))

    # -- sampling ----------------------------------------------------------------------------

    async def open_streams(self, session: aiohttp.ClientSession) -> float:
        try:
            async with session.get(f"{self.url}/metrics") as r:
                metrics = parse_metrics(await r.text())
        except (aiohttp.ClientError, TimeoutError):
            return float("nan")
        return metrics.get("thinktrans_open_streams", [({}, float("nan"))])[0][1]

    async def sample(self, session: aiohttp.ClientSession) -> Sample:
        s = Sample(round(time.monotonic() - self.started, 1),
                   proc_status(self.pid).get("VmRSS", 0), await self.open_streams(session),
                   proc_cpu_s(self.pid))
        self.samples.append(s)
        if self.args.verbose:
            print(f"t={s.t_s:7.1f}s rss={s.rss / MIB:7.1f} MiB open={s.open_streams:5.0f}",
                  file=sys.stderr, flush=True)
        return s

    async def sampler(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < self.stop_at:
                await self.sample(session)
                await asyncio.sleep(min(self.args.sample_s,
                                        max(0.0, self.stop_at - time.monotonic())))

    async def run(self) -> dict[str, Any]:
        sampler = asyncio.create_task(self.sampler())
        await asyncio.gather(*(self.worker(i) for i in range(self.args.workers)))
        await sampler
        load_end = time.monotonic()
        # After the load: every stream not deleted must expire (sweep: expire_s/4, <= 1 s).
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            give_up = load_end + self.args.expire_s * 3 + 10
            final = await self.sample(session)
            while final.open_streams > 0 and time.monotonic() < give_up:
                await asyncio.sleep(1.0)
                final = await self.sample(session)
            # The gauge counts streams not yet ended; closed ones are kept for late
            # readers until they expire too: ask for the last ones left, until all are gone.
            remaining = list(self.left)
            while remaining and time.monotonic() < give_up:
                await asyncio.sleep(1.0)
                remaining = [sid for sid in remaining if await self.exists(session, sid)]
            self.not_expired = len(remaining)
        return self.report(load_end)

    async def exists(self, session: aiohttp.ClientSession, sid: str) -> bool:
        try:
            async with session.get(f"{self.url}/v1/streams/{sid}/events") as r:
                return r.status != 404
        except (aiohttp.ClientError, TimeoutError):
            return True

    def report(self, load_end: float) -> dict[str, Any]:
        load_s = load_end - self.started
        during = [s for s in self.samples if s.t_s <= load_s + 0.5]
        first = [s.rss for s in during if s.t_s <= 60.0]
        last = [s.rss for s in during if s.t_s >= load_s - 60.0]
        tail = [s for s in during if s.t_s > 60.0] or during
        slope = _slope([s.t_s / 60.0 for s in tail], [s.rss / MIB for s in tail])
        first_mib = sum(first) / len(first) / MIB if first else 0.0
        last_mib = sum(last) / len(last) / MIB if last else 0.0
        # "Grows": over 1 MiB/min after warm-up and the last minute 5% above the first.
        grows = slope is not None and slope > 1.0 and last_mib > first_mib * 1.05
        final = self.samples[-1]
        cpu = [s.cpu_s for s in (self.samples[0], final) if s.cpu_s is not None]
        c = self.counts
        return {
            "minutes": self.args.minutes,
            "streams": {"closed_deleted": c.closed_deleted, "closed_left": c.closed_left,
                        "abandoned": c.abandoned, "deltas": c.deltas},
            "errors": len(c.errors), "violations": len(c.violations),
            "rss_mib": {
                "first_minute_mean": round(first_mib, 1), "last_minute_mean": round(last_mib, 1),
                "slope_after_first_minute_mib_per_min": None if slope is None
                else round(slope, 2),
                "min": round(min(s.rss for s in during) / MIB, 1),
                "max": round(max(s.rss for s in during) / MIB, 1),
                "peak_vmhwm": round(proc_status(self.pid).get("VmHWM", 0) / MIB, 1),
                "after_expiry": round(final.rss / MIB, 1),
            },
            "memory_grows": grows,
            "open_streams": {"max": max(s.open_streams for s in during),
                             "after_expiry": final.open_streams,
                             "left_streams_checked": len(self.left),
                             "left_streams_not_expired": self.not_expired,
                             "expired_within_s": round(time.monotonic() - load_end, 1)},
            "server_cpu_s": round(cpu[-1] - cpu[0], 1) if len(cpu) == 2 else None,
            "samples": [[s.t_s, round(s.rss / MIB, 1), s.open_streams] for s in self.samples],
            "_failures": c.errors + c.violations,
        }


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=40, help="concurrent stream writers")
    parser.add_argument("--expire-s", type=float, default=5.0,
                        help="THINKTRANS_STREAM_IDLE_EXPIRE_S of the server")
    parser.add_argument("--abandon-weight", type=float, default=1.0,
                        help="weight of abandoned streams against each closed kind (1.0 each)")
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="deltas/s per stream")
    parser.add_argument("--post-interval-ms", type=float, default=100.0)
    parser.add_argument("--pause-s", type=float, default=0.5, help="most pause between streams")
    parser.add_argument("--backend", default="passthrough", choices=["passthrough", "local"])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--to", default="zh-CN")
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="print each sample to stderr")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args()
    if args.minutes <= 0 or args.workers < 1 or args.expire_s <= 0:
        raise SystemExit("--minutes, --workers and --expire-s must be positive")

    texts = [item.text for item in load_corpus(args.corpus)]
    env = {"THINKTRANS_BACKEND": args.backend, "THINKTRANS_CACHE_MB": "0",
           "THINKTRANS_STREAM_IDLE_EXPIRE_S": str(args.expire_s)}
    with tempfile.TemporaryDirectory(prefix="thinktrans-soak-") as tmp:
        if args.backend == "local":
            model = args.model_dir or make_checkpoint(Path(tmp) / "nllb")
            env.update({"THINKTRANS_LOCAL_MODEL": str(model), "THINKTRANS_LOCAL_DEVICE": "cpu"})
        server = Server(env)
        try:
            soak = Soak(server.url, server.pid, args, texts)
            if args.uvloop:
                import uvloop

                runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            else:
                runner = asyncio.Runner()
            with runner:
                report = runner.run(soak.run())
        finally:
            stop_s = server.stop()
    failures = report.pop("_failures")
    report["sigterm_exit_s"] = None if stop_s is None else round(stop_s, 2)
    report["config"] = {"workers": args.workers, "expire_s": args.expire_s,
                        "backend": args.backend, "rate": args.rate,
                        "client_loop": "uvloop" if args.uvloop else "asyncio",
                        "machine": machine(), "date": time.strftime("%Y-%m-%d")}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    for line in failures[:10]:
        print(f"soak: {line}", file=sys.stderr)
    if failures:
        raise SystemExit(f"soak: {len(failures)} failures; the server's log: {server.log.name}")
    server.discard_log()


if __name__ == "__main__":
    main()
