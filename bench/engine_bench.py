"""The local backend's engines through the service: CTranslate2 int8 against transformers fp32.

The acceptance measure of the CTranslate2 engine: on the Marian and NLLB-600M shapes on 2 CPU
cores, the CTranslate2 int8 engine is at least 3x faster per output token than transformers
fp32 through the service, at batch 1 and at batch 8, and on the NLLB-600M shape it needs
less than half the resident memory.

    .venv/bin/python bench/engine_bench.py --shapes marian,nllb-600m --batch-sizes 1,8 --rounds 3

For each shape a random-weight checkpoint of the real model's shape, with a tokenizer of the
full vocabulary, is built once in a child process (``make_test_model(family, dir,
shape=...)``; ``tiny-nllb``, ``tiny-marian``, ``tiny-m2m100`` are the tiny test checkpoints,
for trying the script out). Then for each batch size B and each engine a server is started
as its own process (``python -m service.cli serve`` from this checkout), with
THINKTRANS_BACKEND=local, THINKTRANS_LOCAL_MODEL=the checkpoint directory,
THINKTRANS_LOCAL_ENGINE (transformers with THINKTRANS_LOCAL_DTYPE=float32, or ctranslate2
with THINKTRANS_LOCAL_COMPUTE_TYPE=int8), THINKTRANS_LOCAL_THREADS=--threads (default: the
cores this process may use), THINKTRANS_MAX_BATCH_SIZE=B, deadline and backend timeout far
above a batch's time, HF_HUB_OFFLINE=1 and no other THINKTRANS_* variable. The CTranslate2
engine converts the checkpoint on its first load (in a child process of the server, so not in
its memory) into THINKTRANS_LOCAL_CT2_CACHE under the work directory; later servers find it
there. /v1/backends must report the engine asked for, or the run stops.

Once /readyz answers 200, one untimed round, then ``--rounds`` timed rounds: a round is B
concurrent one-shot ``POST /v1/translate`` requests of one English sentence each, target
``de``, source ``en``; its time runs from the first request sent to the last answer. Every
segment must come back ``translated``. Output tokens are the backend's own count of the
tokens it generated and kept (``output_tokens`` in /v1/backends' local info), over the timed
rounds (re-tokenising the translations would be far off for the test shapes, whose filler
pieces do not tokenise back into themselves). The sentences are the same for both
engines; the test tokenizers cut them finer than a real one (about 3x), so segments are
longer than real ones, for both engines alike.
Seconds per output token = all timed rounds' seconds / their output tokens. The server's
resident memory (VmRSS after the rounds, VmHWM its peak) is read from /proc/PID/status, and
its batch-size histogram from /metrics, to show that the batches were full.

Prints the machine, the command, a table per server, and a table of the ratios:
transformers' seconds per output token over CTranslate2's (the speed-up; the goal is >= 3)
and CTranslate2's resident memory over transformers' (the goal on nllb-600m is < 0.5).
``--workdir DIR`` keeps the checkpoints and the conversion cache for a later run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import aiohttp
from checkouts import cpu_s, free_port, get, proc_status, stop
from model_bench import SENTENCES, SHAPES, TINY, cores, cpu_name, run_child

ROOT = Path(__file__).resolve().parent.parent
# What each engine is run at: the comparison.
ENGINE_ENV = {
    "transformers": {"THINKTRANS_LOCAL_ENGINE": "transformers",
                     "THINKTRANS_LOCAL_DTYPE": "float32"},
    "ctranslate2": {"THINKTRANS_LOCAL_ENGINE": "ctranslate2"},
}
SPEEDUP_GOAL = 3.0
MEMORY_GOAL = 0.5  # on nllb-600m


@dataclass
class Result:
    shape: str
    engine: str
    batch: int
    compute_type: str = "?"
    round_s: list[float] = field(default_factory=list)
    tokens: int = 0
    rss: int | None = None
    hwm: int | None = None
    idle_rss: int | None = None
    load_s: float | None = None
    ready_s: float | None = None
    batches: str = ""
    cpu: float | None = None  # the server's CPU seconds over the timed rounds' seconds

    @property
    def s_per_token(self) -> float:
        return sum(self.round_s) / self.tokens if self.tokens else float("nan")


def mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f}"


def package(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


def machine(threads: int) -> str:
    return (f"{cpu_name()}, {cores()} cores usable, engine threads {threads}; "
            f"ctranslate2 {package('ctranslate2')}, torch {package('torch')}, transformers "
            f"{package('transformers')}, Python {platform.python_version()}")


def build(shape: str, workdir: Path) -> Path:
    """The shape's checkpoint under ``workdir``, built in a child process unless there."""
    path = workdir / shape
    done = workdir / f".{shape}.built"
    if done.exists():
        print(f"{shape}: using the checkpoint in {path}", file=sys.stderr, flush=True)
        return path
    shutil.rmtree(path, ignore_errors=True)
    began = time.perf_counter()
    print(f"{shape}: building the checkpoint", file=sys.stderr, flush=True)
    run_child("_build", shape, str(path))
    done.write_text("")
    print(f"{shape}: built in {time.perf_counter() - began:.0f}s", file=sys.stderr, flush=True)
    return path


class Server:
    """``thinktrans serve`` from this checkout, not pinned: the engine gets every core this
    process may use."""

    def __init__(self, env_extra: dict[str, str], log_path: Path, ready_s: float) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("THINKTRANS_")}
        env.update({"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                    "THINKTRANS_LOG_LEVEL": "warning", **env_extra})
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in close()
        began = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=self._log,
        )
        deadline = time.monotonic() + ready_s
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise SystemExit(f"the server exited ({self.proc.returncode}): "
                                 f"{self.log_tail()}")
            try:
                if get(self.port, "/readyz", timeout=5)[0] == 200:
                    break
                info = self.local_info()
                if info.get("load_failures"):  # it would only retry the same
                    self.close()
                    raise SystemExit(f"the local backend failed to load: {info.get('reason')}")
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"the server was not ready in {ready_s:g} s: {self.log_tail()}")
            time.sleep(0.5)
        self.ready_s = time.perf_counter() - began

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def local_info(self) -> dict[str, Any]:
        status, body = get(self.port, "/v1/backends")
        if status != 200:
            raise SystemExit(f"GET /v1/backends answered {status}: {body[:500]}")
        for backend in json.loads(body)["backends"]:
            if backend["name"] == "local":
                return dict(backend.get("info") or {})
        raise SystemExit("/v1/backends lists no local backend")

    def metrics(self) -> str:
        return get(self.port, "/metrics")[1]

    def close(self) -> None:
        stop(self.proc)
        self._log.close()


def output_tokens(info: dict[str, Any]) -> int | None:
    """The backend's own count of generated tokens (as kept: neither the language token nor
    EOS), from /v1/backends."""
    for where in (info, info.get("stats") or {}):
        value = where.get("output_tokens") if isinstance(where, dict) else None
        if isinstance(value, int):
            return value
    return None


def batch_histogram(metrics: str) -> tuple[int, int]:
    """(segments, batches) the local backend got, from thinktrans_batch_size."""
    def sample(name: str) -> int:
        match = re.search(rf'^{name}\{{[^}}]*backend="local"[^}}]*\}} ([0-9.eE+-]+)$',
                          metrics, re.M)
        return int(float(match.group(1))) if match else 0
    return sample("thinktrans_batch_size_sum"), sample("thinktrans_batch_size_count")


async def one_round(http: aiohttp.ClientSession, port: int, texts: list[str]) -> list[str]:
    """B concurrent one-shot requests, one sentence each; the translations."""
    url = f"http://127.0.0.1:{port}/v1/translate"

    async def one(text: str) -> str:
        body = {"target": "de", "source": "en", "texts": [text]}
        async with http.post(url, json=body) as resp:
            answer = await resp.json(content_type=None)
            if resp.status != 200:
                raise SystemExit(f"POST /v1/translate answered {resp.status}: {answer}")
        [result] = answer["results"]
        statuses = {segment["status"] for segment in result["segments"]}
        if statuses != {"translated"}:
            raise SystemExit(f"a segment came back {statuses}, not translated: {result}")
        return str(result["text"])

    return list(await asyncio.gather(*(one(text) for text in texts)))


async def drive(port: int, texts: list[list[str]]) -> list[float]:
    """One round per entry of ``texts``: each round's seconds."""
    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(limit=0)
    times = []
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for round_texts in texts:
            started = time.perf_counter()
            await one_round(http, port, round_texts)
            times.append(time.perf_counter() - started)
    return times


def measure(shape: str, checkpoint: Path, engine: str, batch: int, args: argparse.Namespace,
            workdir: Path) -> Result:
    """Serve ``checkpoint`` on ``engine`` with batches of ``batch``, drive it, read it."""
    env = {
        "THINKTRANS_BACKEND": "local",
        "THINKTRANS_LOCAL_MODEL": str(checkpoint),
        "THINKTRANS_LOCAL_THREADS": str(args.threads),
        "THINKTRANS_LOCAL_CT2_CACHE": str(workdir / "ct2-cache"),
        "THINKTRANS_MAX_BATCH_SIZE": str(batch),
        # A batch goes as soon as it is full; the wait only covers the B requests arriving.
        "THINKTRANS_MAX_WAIT_MS": "200",
        "THINKTRANS_DEADLINE_MS": "600000",
        "THINKTRANS_BACKEND_TIMEOUT_S": "3600",
        "THINKTRANS_CACHE_MB": "0",  # the same sentences again would measure the cache
        **ENGINE_ENV[engine],
    }
    if engine == "ctranslate2":
        env["THINKTRANS_LOCAL_COMPUTE_TYPE"] = args.compute_type
    log_path = workdir / f"server-{shape}-{engine}-{batch}.log"
    print(f"{shape} {engine} batch {batch}: starting the server", file=sys.stderr, flush=True)
    server = Server(env, log_path, args.ready_timeout)
    result = Result(shape, engine, batch)
    # The same sentences for both engines: round r takes B of them, from r * B on.
    rounds = [[SENTENCES[(r * batch + i) % len(SENTENCES)] for i in range(batch)]
              for r in range(args.rounds)]
    try:
        info = server.local_info()
        served = info.get("engine", "transformers")  # code before the engines: transformers
        if served != engine:
            raise SystemExit(f"asked for the {engine} engine, the server runs {served!r} "
                             f"({info.get('engine_note') or 'no note'})")
        result.compute_type = str(info.get("compute_type") or info.get("dtype") or "?")
        result.load_s = info.get("load_s")
        result.ready_s = server.ready_s
        result.idle_rss = proc_status(server.proc.pid, "VmRSS")
        asyncio.run(drive(server.port, rounds[:1]))  # warm-up, untimed
        before = output_tokens(server.local_info())
        cpu_before = cpu_s(server.proc.pid)
        times = asyncio.run(drive(server.port, rounds))
        result.cpu = (cpu_s(server.proc.pid) - cpu_before) / sum(times)
        after = output_tokens(server.local_info())
        result.round_s = times
        result.rss = proc_status(server.proc.pid, "VmRSS")
        result.hwm = proc_status(server.proc.pid, "VmHWM")
        segments, batches = batch_histogram(server.metrics())
        result.batches = f"{batches} batches of {segments} segments (warm-up included)"
    finally:
        server.close()
    if before is None or after is None:
        raise SystemExit("/v1/backends does not give the local backend's output_tokens")
    result.tokens = after - before
    print(f"{shape} {engine} batch {batch}: {statistics.median(times):.2f}s per round, "
          f"{1000 * result.s_per_token:.1f} ms per output token", file=sys.stderr, flush=True)
    return result


def ratio(num: float | int | None, den: float | int | None) -> float | None:
    if num is None or den is None or not den or num != num or den != den:  # NaN
        return None
    return num / den


def fmt(value: float | None, digits: int = 2) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def report(results: list[Result], args: argparse.Namespace) -> str:
    command = "python bench/engine_bench.py " + " ".join(args.argv)
    lines = [
        f"Machine: {machine(args.threads)}",
        f"Command: `{command}`",
        f"Work: {args.rounds} timed rounds (after one untimed) of B concurrent one-shot "
        "requests, one English sentence each, en -> de; output tokens counted by "
        "the backend; transformers at float32, ctranslate2 at "
        f"{args.compute_type}",
        f"Load average (1 min) at the start and at the end: {args.load_before} / {loadavg()}; "
        "other work on the machine skews the figures (torch's threads most); server CPU / "
        "wall is how many cores the server kept busy during the timed rounds",
        "",
        "| shape | batch | engine | compute type | s per round p50 (min-max) | output tokens "
        "| ms per output token | idle RSS (MiB) | VmRSS after (MiB) | VmHWM (MiB) "
        "| server CPU / wall | ready in (s) | batches |",
        "| --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        p50 = statistics.median(r.round_s)
        lines.append(
            f"| {r.shape} | {r.batch} | {r.engine} | {r.compute_type} | {p50:.2f} "
            f"({min(r.round_s):.2f}-{max(r.round_s):.2f}) | {r.tokens} "
            f"| {1000 * r.s_per_token:.1f} | {mib(r.idle_rss)} | {mib(r.rss)} | {mib(r.hwm)} "
            f"| {fmt(r.cpu)} | {fmt(r.ready_s, 0)} | {r.batches} |"
        )
    lines += [
        "",
        f"Speed-up = transformers' seconds per output token / ctranslate2's (goal >= "
        f"{SPEEDUP_GOAL:g}); memory = ctranslate2's / transformers' (goal on nllb-600m < "
        f"{MEMORY_GOAL:g}).",
        "",
        "| shape | batch | transformers ms/token | ctranslate2 ms/token | speed-up "
        "| VmRSS ratio | VmHWM ratio | goals met |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    by_key = {(r.shape, r.engine, r.batch): r for r in results}
    for shape in args.shapes:
        for batch in args.batch_sizes:
            tf = by_key.get((shape, "transformers", batch))
            ct = by_key.get((shape, "ctranslate2", batch))
            if tf is None or ct is None:
                continue
            speedup = ratio(tf.s_per_token, ct.s_per_token)
            rss = ratio(ct.rss, tf.rss)
            hwm = ratio(ct.hwm, tf.hwm)
            met = speedup is not None and speedup >= SPEEDUP_GOAL
            verdict = f"speed {'yes' if met else 'no'}"
            if shape == "nllb-600m":
                mem_met = rss is not None and hwm is not None and max(rss, hwm) < MEMORY_GOAL
                verdict += f", memory {'yes' if mem_met else 'no'}"
            lines.append(
                f"| {shape} | {batch} | {1000 * tf.s_per_token:.1f} | "
                f"{1000 * ct.s_per_token:.1f} | {fmt(speedup)} | {fmt(rss)} | {fmt(hwm)} "
                f"| {verdict} |"
            )
    return "\n".join(lines)


def _list(value: str) -> list[str]:
    items = [part.strip() for part in value.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {value!r}")
    return items


def _sizes(value: str) -> list[int]:
    try:
        sizes = [int(part) for part in _list(value)]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {value!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=_list, default=["marian", "nllb-600m"],
                        metavar="marian,nllb-600m",
                        help=f"of {', '.join([*SHAPES, *TINY])}")
    parser.add_argument("--batch-sizes", type=_sizes, default=[1, 8], metavar="1,8")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per server")
    parser.add_argument("--engines", type=_list, default=list(ENGINE_ENV),
                        metavar="transformers,ctranslate2")
    parser.add_argument("--compute-type", default="int8", help="the ctranslate2 engine's")
    parser.add_argument("--threads", type=int, default=cores(),
                        help="THINKTRANS_LOCAL_THREADS (default: the cores usable)")
    parser.add_argument("--ready-timeout", type=float, default=1800,
                        help="seconds a server may take to load (and convert)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep the checkpoints and the conversion cache here (reused)")
    args = parser.parse_args(argv)
    args.argv = argv
    for shape in args.shapes:
        if shape not in SHAPES and shape not in TINY:
            parser.error(f"unknown shape {shape!r}; choose from {', '.join([*SHAPES, *TINY])}")
    for engine in args.engines:
        if engine not in ENGINE_ENV:
            parser.error(f"unknown engine {engine!r}; choose from {', '.join(ENGINE_ENV)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        results = []
        for shape in args.shapes:
            checkpoint = build(shape, workdir)
            # Each pair compared one right after the other, so that drift in the machine's
            # other load weighs on both alike.
            for batch in args.batch_sizes:
                for engine in args.engines:
                    results.append(measure(shape, checkpoint, engine, batch, args, workdir))
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
