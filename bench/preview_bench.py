"""Previews through the service: how soon, how many decodes, how much erased, what finals pay.

Issue #31's goals: normalized erasure (NE) at most 0.2, and no final segment later than
without previews. For each configuration (``--configs``: shape, target, ``preview_mask_k``,
``local_preview_bias``) a ``thinktrans serve`` of this checkout runs on 127.0.0.1 (as
bench/engine_bench.py starts it: the local backend, CTranslate2 int8, ``--threads``,
``deadline_ms`` 600000 so that a segment event carries its translation, the translation
cache off so that the same sentence twice is decoded twice, the preview settings at their
defaults otherwise). The recorded trace (examples/thinking_trace.jsonl) is replayed through
it a part per stream, one stream at a time, a delta per POST every ``pace_ms`` (the
configuration's, else ``--pace-ms``; on a fixed schedule), its events read live over SSE,
as examples/agent_standin.py does. Each part is
streamed twice, with ``"previews": true`` and without, the order alternating part by part,
so that previews on and off are measured by the same server in the same run; between two
streams the bench waits for the backend to finish what it runs (a preview decode whose
sentence has ended still runs to its end), so that one stream's leftovers do not fall on
the next.

For each segment translated by the local backend (the sentence; passthrough, code and
untranslated ones are left out), measured on the client:

- time to first preview: from the POST of the sentence's first chunk (the delta holding its
  first non-blank character) to its first ``preview`` event;
- decodes: ``thinktrans_previews_total{outcome}`` from /metrics over the run (streams
  without previews send none), per sentence: ``sent`` (decodes asked) and ``shown``;
- NE: the units deleted from what was shown, over the sentence's successive previews and
  then its segment (from each text to the next: the last one's length less their common
  prefix), over the segment's length; units are characters for a target written without
  spaces (zh, ja), words otherwise; over the sentences that had at least one preview;
- final latency: from the POST of the sentence's last chunk (its last non-blank character)
  to its ``segment`` event; the segment is cut when the next sentence's first text comes,
  a pace later, with or without previews. Also the paired difference, sentence by
  sentence, previews on less off.

The checkpoints are random weights of a real model's shape (``make_test_model(shape=...)``,
built once per ``--workdir`` by bench/engine_bench.py's ``build``): NE here measures how
much the engine's output moves as the prefix grows on noise weights, not a trained model's
stability; the latencies are the shapes' real costs on this machine, with outputs longer
than a trained model writes (the test tokenizer's short pieces).

    .venv/bin/python bench/preview_bench.py --workdir /tmp/preview-bench
    .venv/bin/python bench/preview_bench.py --configs marian:de:2:0.5:60 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import dataclasses
import itertools
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from agent_standin import TRACE, load_trace, sse_events  # noqa: E402
from engine_bench import Server, build, machine  # noqa: E402
from model_bench import cores  # noqa: E402

from service.text.typography import is_tight  # noqa: E402

# The model's pace on the Marian shape and on NLLB-600M's (zh-CN); mask_k and the bias at a
# slower one, where previews come before their sentence ends.
DEFAULT_CONFIGS = ("marian:de:2:0.5,marian:de:2:0.5:100,marian:de:0:0.5:100,"
                   "marian:de:2:0:100,nllb-600m:zh-CN:2:0.5")
OUTCOMES = ("sent", "shown", "unchanged", "superseded", "stopped", "failed", "no_backend")


@dataclass(frozen=True)
class Config:
    shape: str
    target: str
    mask_k: int
    bias: float
    pace_ms: float | None = None  # between two deltas; None: --pace-ms

    @property
    def label(self) -> str:
        return (f"{self.shape} -> {self.target}, mask_k {self.mask_k}, bias {self.bias:g}, "
                f"{self.pace_ms:g} ms")

    @property
    def pace_s(self) -> float:
        if self.pace_ms is None:
            raise ValueError("the pace is --pace-ms, not resolved yet")
        return self.pace_ms / 1000


@dataclass
class Sentence:
    key: tuple[int, int, int]  # (round, part, index): the same sentence on and off
    first_t: float  # the POST of its first chunk
    last_t: float  # the POST of its last chunk
    final_t: float = math.nan  # its segment event
    final: str = ""
    previews: list[tuple[float, str]] = field(default_factory=list)  # (received, text)


def common(a: list[str], b: list[str]) -> int:
    """How many units ``a`` and ``b`` start with alike."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def erasure(shown: list[str], final: str, tight: bool) -> float:
    """NE: units deleted over ``shown`` then ``final``, over ``final``'s length."""
    def units(text: str) -> list[str]:
        return list(text.strip()) if tight else text.split()

    texts = [units(t) for t in [*shown, final]]
    deleted = sum(len(a) - common(a, b) for a, b in itertools.pairwise(texts))
    return deleted / max(1, len(texts[-1]))


def sample(metrics: str, name: str, **labels: str) -> float:
    """One sample of /metrics' text (0 when absent)."""
    for match in re.finditer(rf"^{name}\{{([^}}]*)\}} ([0-9.eE+-]+)$", metrics, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


async def wait_idle(client: httpx.AsyncClient, timeout_s: float, still_s: float = 2.0
                    ) -> None:
    """Until the local backend runs no batch: every batch begun has ended or failed, or,
    as a failed or stopped preview batch counts no error, no batch has begun or ended for
    ``still_s`` (longer than a decode here) with no segment waiting."""
    until = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < until:
        text = (await client.get("/metrics")).text
        begun = sample(text, "thinktrans_batch_size_count", backend="local")
        ended = sample(text, "thinktrans_batch_duration_seconds_count", backend="local")
        failed = sum(float(v) for v in re.findall(
            r'^thinktrans_backend_errors_total\{[^}]*backend="local"[^}]*\} (\S+)$', text, re.M))
        if begun <= ended + failed:
            return
        if (begun, ended) != last:
            last, since = (begun, ended), time.monotonic()
        elif (time.monotonic() - since >= still_s
              and not sample(text, "thinktrans_queue_depth", backend="local")):
            return
        await asyncio.sleep(0.1)
    print(f"  the backend was still busy after {timeout_s:g} s; going on", file=sys.stderr)


def sentences_of(deltas: list[str], times: list[float], events: list[tuple[str, dict, float]],
                 key: tuple[int, int]) -> list[Sentence]:
    """The stream's translated sentences, from its events and its chunks' POST times."""
    starts, at = [], 0
    for delta in deltas:
        starts.append(at)
        at += len(delta)

    def chunk_time(offset: int) -> float:
        return times[bisect.bisect_right(starts, offset) - 1]

    out: dict[int, Sentence] = {}
    previews: dict[int, list[tuple[float, str]]] = {}
    offset = 0
    for kind, data, t in events:
        if kind == "preview":
            previews.setdefault(data["index"], []).append((t, data["text"]))
        if kind != "segment":
            continue
        original = data["original"]
        core = original.strip()
        if data["status"] == "translated" and data.get("backend") == "local" and core:
            first = offset + original.index(core[0])
            last = offset + len(original.rstrip()) - 1
            out[data["index"]] = Sentence((*key, data["index"]), chunk_time(first),
                                          chunk_time(last), t, data["text"])
        offset += len(original)
    if offset != sum(map(len, deltas)):
        raise SystemExit(f"stream {key}: the segments do not give back the deltas")
    for index, shown in previews.items():
        if index in out:
            out[index].previews = shown
    return list(out.values())


async def stream_once(client: httpx.AsyncClient, sid: str, deltas: list[str], target: str,
                      previews: bool, pace_s: float, key: tuple[int, int]) -> list[Sentence]:
    """One part through one stream, a delta per POST on a fixed schedule; its sentences."""
    opened = await client.post("/v1/streams", json={"stream_id": sid, "target": target,
                                                    "previews": previews})
    opened.raise_for_status()
    events: list[tuple[str, dict, float]] = []
    listening = asyncio.Event()

    async def read() -> None:
        async with client.stream("GET", f"/v1/streams/{sid}/events",
                                 headers={"Accept": "text/event-stream"},
                                 timeout=httpx.Timeout(10.0, read=None)) as response:
            response.raise_for_status()
            listening.set()
            async for kind, data in sse_events(response):
                events.append((kind, data, time.monotonic()))
                if kind == "end":
                    return

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(listening.wait(), 10.0)
        times: list[float] = []
        began = time.monotonic()
        for seq, delta in enumerate(deltas):
            await asyncio.sleep(max(0.0, began + seq * pace_s - time.monotonic()))
            times.append(time.monotonic())
            posted = await client.post(f"/v1/streams/{sid}/chunks",
                                       json={"chunks": [{"seq": seq, "text": delta}]})
            posted.raise_for_status()
        await asyncio.sleep(pace_s)
        (await client.post(f"/v1/streams/{sid}/close")).raise_for_status()
        await asyncio.wait_for(reader, timeout=1800.0)
    finally:
        reader.cancel()
    await client.delete(f"/v1/streams/{sid}")
    return sentences_of(deltas, times, events, key)


def server_env(cfg: Config, checkpoint: Path, args: argparse.Namespace) -> dict[str, str]:
    return {
        "THINKTRANS_BACKEND": "local",
        "THINKTRANS_LOCAL_MODEL": str(checkpoint),
        "THINKTRANS_LOCAL_ENGINE": "ctranslate2",
        "THINKTRANS_LOCAL_COMPUTE_TYPE": "int8",
        "THINKTRANS_LOCAL_THREADS": str(args.threads),
        "THINKTRANS_LOCAL_CT2_CACHE": str(args.workdir / "ct2-cache"),
        "THINKTRANS_DEADLINE_MS": "600000",  # the segment event carries the translation
        "THINKTRANS_BACKEND_TIMEOUT_S": "3600",
        "THINKTRANS_CACHE_MB": "0",  # each stream decodes its sentences itself
        "THINKTRANS_PREVIEW_MASK_K": str(cfg.mask_k),
        "THINKTRANS_LOCAL_PREVIEW_BIAS": str(cfg.bias),
    }


async def drive(cfg: Config, port: int, parts: list[list[str]], args: argparse.Namespace
                ) -> tuple[dict[bool, list[Sentence]], dict[str, float]]:
    """Every part, ``--rounds`` times, on and off; the sentences by previews on/off, and
    the preview outcomes counted over the run."""
    by: dict[bool, list[Sentence]] = {True: [], False: []}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
        before = (await client.get("/metrics")).text
        for r in range(args.rounds):
            for p, deltas in enumerate(parts):
                order = (True, False) if (r + p) % 2 == 0 else (False, True)
                for on in order:
                    sid = f"bench-{r}-{p}-{'on' if on else 'off'}"
                    by[on] += await stream_once(client, sid, deltas, cfg.target, on,
                                                cfg.pace_s, (r, p))
                    await wait_idle(client, 120.0)
                print(f"  {cfg.label}: round {r + 1} part {p + 1} done", file=sys.stderr,
                      flush=True)
        after = (await client.get("/metrics")).text
    counts = {o: sample(after, "thinktrans_previews_total", outcome=o)
              - sample(before, "thinktrans_previews_total", outcome=o) for o in OUTCOMES}
    return by, counts


def quantile(values: list[float], q: float) -> float:
    """Nearest rank; nan for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summary(cfg: Config, by: dict[bool, list[Sentence]], counts: dict[str, float]
            ) -> dict[str, Any]:
    tight = is_tight(cfg.target)
    on, off = by[True], by[False]
    previewed = [s for s in on if s.previews]
    firsts = [(s.previews[0][0] - s.first_t) * 1000 for s in previewed]
    ne = [erasure([text for _, text in s.previews], s.final, tight) for s in previewed]
    latency = {flag: [(s.final_t - s.last_t) * 1000 for s in by[flag]] for flag in by}
    offs = {s.key: s for s in off}
    paired = [(s.final_t - s.last_t - (offs[s.key].final_t - offs[s.key].last_t)) * 1000
              for s in on if s.key in offs]
    return {
        "cfg": cfg, "sentences": len(on), "previewed": len(previewed),
        "first_p50": quantile(firsts, 0.5), "first_p90": quantile(firsts, 0.9),
        "sent": counts["sent"] / max(1, len(on)), "shown": counts["shown"] / max(1, len(on)),
        "shown_events": sum(len(s.previews) for s in on), "counts": counts,
        "ne_mean": statistics.mean(ne) if ne else math.nan, "ne_p90": quantile(ne, 0.9),
        "ne_max": max(ne, default=math.nan),
        "on_p50": quantile(latency[True], 0.5), "on_p99": quantile(latency[True], 0.99),
        "off_p50": quantile(latency[False], 0.5), "off_p99": quantile(latency[False], 0.99),
        "paired_median": quantile(paired, 0.5), "paired_max": max(paired, default=math.nan),
        "later": sum(1 for d in paired if d > 100), "pairs": len(paired),
    }


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"machine: {machine(args.threads)}")
    print(f"command: bench/preview_bench.py {' '.join(sys.argv[1:])}")
    print(f"trace {args.trace.name}, a delta per POST every `pace` ms, "
          f"{args.rounds} round(s); NE in characters for zh/ja targets, words otherwise")
    print("| shape -> target | pace ms | mask_k | bias | sentences (previewed) "
          "| first preview p50 / p90 ms | sent / shown per sentence | NE mean / p90 / max "
          "| final p50 / p99 ms, off | final p50 / p99 ms, on "
          "| on - off per sentence: median / max ms (> 100 ms) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        cfg = r["cfg"]
        print(f"| {cfg.shape} -> {cfg.target} | {cfg.pace_ms:g} | {cfg.mask_k} | {cfg.bias:g} "
              f"| {r['sentences']} ({r['previewed']}) "
              f"| {r['first_p50']:.0f} / {r['first_p90']:.0f} "
              f"| {r['sent']:.2f} / {r['shown']:.2f} "
              f"| {r['ne_mean']:.2f} / {r['ne_p90']:.2f} / {r['ne_max']:.2f} "
              f"| {r['off_p50']:.0f} / {r['off_p99']:.0f} "
              f"| {r['on_p50']:.0f} / {r['on_p99']:.0f} "
              f"| {r['paired_median']:+.0f} / {r['paired_max']:+.0f} "
              f"({r['later']}/{r['pairs']}) |")
    print("thinktrans_previews_total over each run:")
    for r in results:
        counts = ", ".join(f"{o} {int(v)}" for o, v in r["counts"].items())
        print(f"- {r['cfg'].label}: {counts}; preview events read {r['shown_events']}")


def parse_configs(value: str) -> list[Config]:
    out = []
    for item in value.split(","):
        shape, target, mask_k, bias, *pace = item.strip().split(":")
        out.append(Config(shape, target, int(mask_k), float(bias),
                          float(pace[0]) if pace else None))
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", type=parse_configs, default=parse_configs(DEFAULT_CONFIGS),
                        help="shape:target:mask_k:bias[:pace_ms], comma-separated (default: "
                             f"{DEFAULT_CONFIGS})")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--pace-ms", type=float, default=40.0,
                        help="between two deltas, for a config that names none")
    parser.add_argument("--rounds", type=int, default=1, help="passes over the trace")
    parser.add_argument("--threads", type=int, default=min(4, cores()))
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keeps the checkpoints and the conversion cache")
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="preview-bench-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = load_trace(args.trace)
    results = []
    for cfg in [dataclasses.replace(c, pace_ms=c.pace_ms or args.pace_ms) for c in args.configs]:
        checkpoint = build(cfg.shape, args.workdir)
        log = args.workdir / f"server-{cfg.shape}-{cfg.mask_k}-{cfg.bias:g}.log"
        server = Server(server_env(cfg, checkpoint, args), log, args.ready_timeout)
        try:
            by, counts = asyncio.run(drive(cfg, server.port, parts, args))
        finally:
            server.close()
        results.append(summary(cfg, by, counts))
    report(results, args)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1:])
