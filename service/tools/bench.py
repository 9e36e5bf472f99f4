"""`thinktrans bench`: a bounded load generator against a running server (measuring only).

N concurrent streams post realistic deltas (1-6 characters, 1-2 for Chinese and
Japanese) at ``rate`` deltas per second each, gathered into one POST every
``post_interval_ms``, and read their events over SSE. Every stream is checked: the
originals of its segments, joined in index order, must equal what it sent. The run stops
by itself after ``duration_s`` (streams under way finish their text), and at once when the
server refuses the token (401/403): no stream could succeed.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from service.exceptions import InputError
from service.ops.metrics import percentile

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_DENIED = (401, 403)


async def _status(session: aiohttp.ClientSession, url: str) -> int:
    """The status ``url`` answers a GET with; InputError when it cannot be reached."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise InputError(f"cannot reach {url}: {type(exc).__name__}") from None


def _denied(url: str, status: int, token: str | None) -> str:
    """The one line for a refused token: what to set."""
    if token:
        return (f"{url} refused the token ({status}); give the server's token with --token "
                "or THINKTRANS_API_TOKEN")
    return (f"{url} needs a token ({status}); give it with --token or THINKTRANS_API_TOKEN")


@dataclass
class BenchConfig:
    url: str
    streams: int = 20
    duration_s: float = 5.0
    rate: float = 50.0  # deltas per second per stream
    post_interval_ms: float = 100.0
    target: str | None = "zh-CN"
    token: str | None = None
    texts: list[str] = field(default_factory=list)
    seed: int = 0
    read_timeout_s: float = 60.0


@dataclass
class BenchReport:
    concurrency: int = 0  # streams under way at once (--streams): one per worker
    streams: int = 0  # streams run in all: each worker starts a new one as the last ends
    deltas: int = 0
    posts: int = 0
    post_ms: list[float] = field(default_factory=list)
    ready_to_emit_ms: list[float] = field(default_factory=list)
    segments: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    updates: int = 0
    cached: int = 0  # segments served from the server's translation cache
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    server_cpu_s: float | None = None

    def summary(self) -> dict[str, Any]:
        cpu_per_delta_us = (
            self.server_cpu_s / self.deltas * 1e6 if self.server_cpu_s and self.deltas else None
        )
        # Labels say what they count: --streams N keeps N streams under way, each worker
        # starting its next as the last ends, so far more than N run in all; segments whose
        # status is "error" (the backend failed them) are not failed requests.
        return {
            "concurrent_streams": self.concurrency,
            "streams_run": self.streams,
            "deltas": self.deltas,
            "chunk_posts": self.posts,
            "chunk_post_ms": {"p50": percentile(self.post_ms, 50),
                              "p99": percentile(self.post_ms, 99)},
            "ready_to_emit_ms": {"p50": percentile(self.ready_to_emit_ms, 50),
                                 "p99": percentile(self.ready_to_emit_ms, 99)},
            "segments": self.segments,
            "segments_per_s": round(self.segments / self.wall_s, 1) if self.wall_s else 0.0,
            "segment_statuses": dict(sorted(self.statuses.items())),
            "deadline_misses": self.statuses.get("deadline", 0),
            "updates": self.updates,
            # The corpus is sent over and over: past its first round, a server with its
            # translation cache on serves it from memory (THINKTRANS_CACHE_MB=0 turns it off).
            "cached": self.cached,
            "failed_requests": len(self.errors),
            "violations": len(self.violations),
            "server_cpu_s": None if self.server_cpu_s is None else round(self.server_cpu_s, 2),
            "server_cpu_us_per_delta": (None if cpu_per_delta_us is None
                                        else round(cpu_per_delta_us, 1)),
            "wall_s": round(self.wall_s, 2),
        }


def split_deltas(text: str, rng: random.Random) -> list[str]:
    """Cut text as a model streams it: 1-6 characters, 1-2 where the text is CJK."""
    out, pos = [], 0
    while pos < len(text):
        size = rng.randint(1, 2) if _CJK.match(text[pos]) else rng.randint(1, 6)
        out.append(text[pos : pos + size])
        pos += size
    return out


async def _server_cpu(session: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with session.get(f"{url}/metrics") as resp:
            body = await resp.text()
    except aiohttp.ClientError:
        return None
    m = re.search(r"^process_cpu_seconds_total ([0-9.e+-]+)$", body, re.M)
    return float(m.group(1)) if m else None


class _Run:
    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        self.report = BenchReport(concurrency=cfg.streams)
        self.run_id = uuid.uuid4().hex[:8]
        self.stop_at = 0.0
        self.denied: str | None = None  # set by the first 401/403: the run stops
        self.headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}

    def session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            headers=self.headers, connector=aiohttp.TCPConnector(limit=4),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.cfg.read_timeout_s),
        )

    async def worker(self, i: int) -> None:
        # A session per stream worker keeps each connection pool small.
        async with self.session() as session:
            n = 0
            rng = random.Random(self.cfg.seed * 100_003 + i)
            while time.monotonic() < self.stop_at:
                text = self.cfg.texts[(i + n) % len(self.cfg.texts)]
                await self.one_stream(session, f"bench-{self.run_id}-{i}-{n}", text, rng)
                n += 1

    async def one_stream(self, session: aiohttp.ClientSession, sid: str, text: str,
                         rng: random.Random) -> None:
        report = self.report
        report.streams += 1
        base = f"{self.cfg.url}/v1/streams"
        async with session.post(base, json={"stream_id": sid, "target": self.cfg.target}) as r:
            if r.status in _DENIED:
                self.deny(r.status)
                return
            if r.status not in (200, 201):
                report.errors.append(f"{sid}: open -> {r.status} {(await r.text())[:120]}")
                return
        reader = asyncio.create_task(self.read(session, sid))
        deltas = split_deltas(text, rng)
        sent = 0
        started = time.monotonic()
        interval = self.cfg.post_interval_ms / 1000.0
        while sent < len(deltas):
            if self.denied is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                return
            due = min(len(deltas), int((time.monotonic() - started) * self.cfg.rate) + 1)
            if due > sent:
                chunks = [{"seq": s, "text": deltas[s]} for s in range(sent, due)]
                if await self.post(session, sid, chunks):
                    report.deltas += len(chunks)
                    sent = due
            await asyncio.sleep(interval)
        async with session.post(f"{base}/{sid}/close") as r:
            if r.status != 200:
                report.errors.append(f"{sid}: close -> {r.status} {(await r.text())[:120]}")
        try:
            originals = await asyncio.wait_for(reader, self.cfg.read_timeout_s)
        except TimeoutError:
            report.violations.append(f"{sid}: no end event within {self.cfg.read_timeout_s} s")
            return
        except Exception as exc:
            report.errors.append(f"{sid}: reading events failed: {type(exc).__name__}")
            return
        if originals is None:
            return
        if "".join(originals) != text:
            report.violations.append(f"{sid}: originals do not join back to the sent text")
        async with session.delete(f"{base}/{sid}"):
            pass

    async def post(self, session: aiohttp.ClientSession, sid: str,
                   chunks: list[dict[str, Any]]) -> bool:
        """POST chunks, retrying the same seqs on 503 or a dropped connection."""
        url = f"{self.cfg.url}/v1/streams/{sid}/chunks"
        for _ in range(20):
            t0 = time.perf_counter()
            try:
                async with session.post(url, json={"chunks": chunks}) as r:
                    body = await r.read()
                    status, retry_after = r.status, r.headers.get("Retry-After", "1")
            except aiohttp.ClientError as exc:
                self.report.errors.append(f"{sid}: {type(exc).__name__}")
                await asyncio.sleep(0.2)
                continue
            self.report.post_ms.append((time.perf_counter() - t0) * 1000.0)
            self.report.posts += 1
            if status == 200:
                return True
            if status == 503:
                await asyncio.sleep(float(retry_after))
                continue
            if status in _DENIED:
                self.deny(status)
                return False
            self.report.errors.append(f"{sid}: chunks -> {status} {body[:120]!r}")
            return False
        return False

    def deny(self, status: int) -> None:
        """Stop every worker: with the token refused, no stream can succeed."""
        if self.denied is None:
            self.denied = _denied(self.cfg.url, status, self.cfg.token)
        self.stop_at = 0.0

    async def read(self, session: aiohttp.ClientSession, sid: str) -> list[str] | None:
        """Read SSE until `end`; return the originals in index order."""
        originals: dict[int, str] = {}
        event = ""
        url = f"{self.cfg.url}/v1/streams/{sid}/events"
        async with session.get(url, headers={"Accept": "text/event-stream"}) as resp:
            if resp.status != 200:
                self.report.errors.append(f"{sid}: events -> {resp.status}")
                return None
            async for raw in resp.content:
                line = raw.decode("utf-8").rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if event == "segment":
                        self.segment(sid, data, originals)
                    elif event == "update":
                        self.report.updates += 1
                    elif event == "end":
                        break
        indexes = sorted(originals)
        if indexes != list(range(len(indexes))):
            self.report.violations.append(f"{sid}: segment indexes are not 0..n-1")
        return [originals[i] for i in indexes]

    def segment(self, sid: str, data: dict[str, Any], originals: dict[int, str]) -> None:
        report = self.report
        index = data["index"]
        if index in originals:
            report.violations.append(f"{sid}: segment {index} came twice")
        originals[index] = data["original"]
        report.segments += 1
        status = data["status"]
        report.statuses[status] = report.statuses.get(status, 0) + 1
        if data.get("cached"):
            report.cached += 1
        if data.get("backend") is not None or status in ("deadline", "error"):
            report.ready_to_emit_ms.append(float(data["latency_ms"]))


async def run_bench(cfg: BenchConfig) -> BenchReport:
    """Run the load; raises InputError when the server cannot be reached or refuses the
    token."""
    if cfg.streams < 1 or cfg.duration_s <= 0 or cfg.rate <= 0:
        raise InputError("--streams, --duration and --rate must be positive")
    if not cfg.texts:
        raise InputError("the corpus holds no text")
    run = _Run(cfg)
    async with run.session() as session:
        status = await _status(session, f"{cfg.url}/healthz")
        if status != 200:
            raise InputError(f"{cfg.url}/healthz answered {status}")
        # /healthz needs no token; a /v1 route does: refused now, not once per stream.
        status = await _status(session, f"{cfg.url}/v1/backends")
        if status in _DENIED:
            raise InputError(_denied(cfg.url, status, cfg.token))
        cpu0 = await _server_cpu(session, cfg.url)
        started = time.monotonic()
        run.stop_at = started + cfg.duration_s
        await asyncio.gather(*(run.worker(i) for i in range(cfg.streams)))
        if run.denied is not None:
            raise InputError(run.denied)
        run.report.wall_s = time.monotonic() - started
        cpu1 = await _server_cpu(session, cfg.url)
    if cpu0 is not None and cpu1 is not None:
        run.report.server_cpu_s = cpu1 - cpu0
    return run.report
