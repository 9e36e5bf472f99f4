"""Does the service feed the model full batches? Service throughput / the model's own.

Builds a checkpoint of the NLLB-200 600M shape (``--shape``; random weights, a tokenizer of
the full vocabulary: ``make_test_model(..., shape=...)`` in a child process) and measures, on
the same inputs and the same batch size B, with the local backend's engine ``--engine``
(``local_engine``; ``--compute-type`` is ``local_compute_type``, ``--threads``
``local_threads``; the service's defaults otherwise, and the engine used is printed):

- the model's own throughput: the local backend's ``translate`` on batches of B, back to
  back, with no service around it;
- the service's: rounds x B concurrent one-shot requests of one segment each through a
  ``Runtime`` (detection, batcher, dispatcher), in-process.

    .venv/bin/python bench/service_vs_model.py --batch-size 8 --rounds 3
    .venv/bin/python bench/service_vs_model.py --engine ctranslate2 --batch-size 8 --rounds 3

A ctranslate2 run converts the checkpoint once (into a temporary cache) and both
measurements load that conversion.

The ratio is the service's segments/s over the model's; the goal is >= 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from model_bench import SENTENCES


def checkpoint(shape: str, outdir: Path) -> Path:
    """``shape``'s checkpoint: make_test_model(shape=...), built in a child process, as
    bench/model_bench.py builds it."""
    from model_bench import run_child

    run_child("_build", shape, str(outdir))
    return outdir


def local_settings(path: Path, args: argparse.Namespace, **more: Any) -> Any:
    """The service's settings for this run: the local backend on ``path``, with the engine,
    compute type and threads asked for (the service's defaults where not)."""
    from service.settings import load_settings

    engine: dict[str, Any] = {"local_ct2_cache": str(args.ct2_cache)}
    if args.engine:
        engine["local_engine"] = args.engine
    if args.compute_type:
        engine["local_compute_type"] = args.compute_type
    if args.threads:
        engine["local_threads"] = args.threads
    # The translation cache off: the same sentences again would measure the cache.
    return load_settings(backend="local", local_model=str(path), cache_mb=0, **engine, **more)


async def model_throughput(path: Path, args: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """The backend's own ``translate`` on batches of B, back to back: segments/s, and its
    info (engine, compute type)."""
    from models.registry import build_backend

    batch, rounds = args.batch_size, args.rounds
    translator = build_backend("local", local_settings(path, args))
    await translator.start()
    if not await translator.wait_ready(args.ready_timeout):
        raise SystemExit(f"the local backend did not load: {translator.reason}")
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    await translator.translate(texts, source="en", target="de")  # warm the shapes
    started = time.perf_counter()
    for _ in range(rounds):
        await translator.translate(texts, source="en", target="de")
    elapsed = time.perf_counter() - started
    info = translator.info()
    await translator.aclose()
    return batch * rounds / elapsed, info


async def service_throughput(path: Path, args: argparse.Namespace
                             ) -> tuple[float, list[int], dict[str, Any]]:
    """3 x B concurrent one-shot requests of one segment through a Runtime: segments/s,
    [segments, batches] the backend got, and the backend's info."""
    from service.runtime import Runtime

    batch, rounds = args.batch_size, args.rounds
    settings = local_settings(path, args, max_batch_size=batch, max_wait_ms=50,
                              deadline_ms=600_000, backend_timeout_s=3600, log_level="warning")
    async with Runtime(settings) as runtime:
        await runtime.wait_ready(timeout_s=args.ready_timeout)

        async def one(i: int) -> str:
            [result] = await runtime.translate([SENTENCES[i % len(SENTENCES)]], target="de")
            return result.segments[0].status

        await one(0)  # warm the shapes
        started = time.perf_counter()
        statuses = await asyncio.gather(*(one(i) for i in range(batch * rounds)))
        elapsed = time.perf_counter() - started
        assert set(statuses) == {"translated"}, statuses
        registry = runtime.metrics.registry
        sizes = registry.get_sample_value("thinktrans_batch_size_sum", {"backend": "local"})
        count = registry.get_sample_value("thinktrans_batch_size_count", {"backend": "local"})
        info = runtime.backends["local"].info()
    # The counts include the warm-up request's batch of one.
    return batch * rounds / elapsed, [int(sizes or 0), int(count or 0)], info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", default="nllb-600m",
                        choices=["nllb-600m", "m2m-418m", "marian", "tiny-nllb", "tiny-m2m100",
                                 "tiny-marian"],
                        help="the checkpoint's shape (tiny-*: the test checkpoints)")
    parser.add_argument("--engine", choices=["auto", "ctranslate2", "transformers"],
                        default=None, help="local_engine (default: the service's, auto)")
    parser.add_argument("--compute-type", default=None,
                        help="local_compute_type (ctranslate2; default: the service's, auto)")
    parser.add_argument("--threads", type=int, default=None, help="local_threads")
    parser.add_argument("--ready-timeout", type=float, default=1800,
                        help="seconds the backend may take to load (and convert)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        # Both runs load the same conversion: the first converts, the second finds it.
        args.ct2_cache = Path(tmp) / "ct2-cache"
        path = checkpoint(args.shape, Path(tmp) / f"{args.shape}-shape")
        model_sps, info = asyncio.run(model_throughput(path, args))
        service_sps, (seg_sum, batches), service_info = asyncio.run(
            service_throughput(path, args))
    engine = info.get("engine", "transformers")
    compute = info.get("compute_type") or info.get("dtype")
    if (service_info.get("engine"), service_info.get("compute_type")) != (
            info.get("engine"), info.get("compute_type")):
        raise SystemExit(f"the two runs used different engines: {info} / {service_info}")
    from model_bench import cores, cpu_name

    print(f"machine: {cpu_name()}, {cores()} cores usable, Python {platform.python_version()}; "
          f"engine {engine} ({compute}), threads {info.get('threads') or 'default'}")
    print("command: `.venv/bin/python bench/service_vs_model.py " + " ".join(sys.argv[1:]) + "`")
    print("| shape | engine | compute type | batch size | model segments/s "
          "| service segments/s | ratio | service batches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {args.shape} | {engine} | {compute} | {args.batch_size} | {model_sps:.3f} "
          f"| {service_sps:.3f} | {service_sps / model_sps:.2f} "
          f"| {batches} batches, {seg_sum} segments |")


if __name__ == "__main__":
    main()
