"""What biasing a preview towards the previous one costs on the CTranslate2 engine.

A preview of an open sentence is decoded towards that sentence's previous preview
(``local_preview_bias``: CTranslate2's ``prefix_bias_beta`` over the previous preview's
tokens, with at least 2 beams). This measures one preview decode three ways, on the local
backend in this process (``LocalTranslator``, CTranslate2 int8, ``--threads``):

- ``greedy``: ``local_preview_bias=0``, one beam: a preview decoded as any segment;
- ``beam2``: ``local_preview_bias=0``, two beams: what the beams alone cost;
- ``biased``: ``local_preview_bias=--beta``, one beam asked (two used): the biased decode.

For each of ``--sentences`` English sentences (bench/model_bench.py's), its prefixes of 6,
9, 12 and 15 words (those shorter than it) are its previews in turn; each preview's
``previous`` is the one before it as shown: the greedy translation of the shorter prefix
less its last 2 words (mask-k, ``preview_mask_k``' default; its last 2 characters for a
translation without spaces, as the test checkpoints' noise often is); a sentence's first preview,
which has none, is left out. Every mode decodes the same previews with the same
``previous``; the three backends are loaded at once and take turns (one
untimed round, then ``--rounds`` timed ones, each round every mode in turn), each preview
its own one-text batch (previews come one per stream). Per mode: the median and p90
milliseconds of a preview decode, its mean output tokens (the backend's own count), and how
much of its ``previous`` a preview starts with (the common prefix in characters over the
shorter of the two, averaged): on a test checkpoint's noise that says only that the bias
took hold, not how well real text reads (its noise pieces tokenise back into many more
tokens than the model wrote, so a previous runs past a preview's output bound).

The checkpoint is a random-weight one of a real model's shape (``--shape``: marian,
nllb-600m, m2m-418m, or tiny-nllb etc. for the test checkpoints), built once in a child
process (bench/model_bench.py), converted on first load into a cache under ``--workdir``.

    .venv/bin/python bench/preview_bias.py --shape marian --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from model_bench import SENTENCES, cores, cpu_name, run_child  # noqa: E402

from models.base import Job  # noqa: E402
from models.local import LocalTranslator  # noqa: E402
from models.registry import build_backend  # noqa: E402
from service.settings import load_settings  # noqa: E402

PREFIX_WORDS = (6, 9, 12, 15)
MASK_K = 2


def previews(sentence: str) -> list[str]:
    words = sentence.split()
    return [" ".join(words[:n]) for n in PREFIX_WORDS if n < len(words)]


async def started(path: Path, cache: Path, threads: int, **overrides: Any) -> LocalTranslator:
    settings = load_settings(backend="local", local_model=str(path),
                             local_engine="ctranslate2", local_compute_type="int8",
                             local_threads=threads, local_ct2_cache=str(cache), **overrides)
    backend = build_backend("local", settings)
    assert isinstance(backend, LocalTranslator)
    await backend.start()
    if not await backend.wait_ready(timeout_s=1800):
        raise SystemExit(f"preview_bias: the backend did not load: {backend.reason}")
    return backend


async def shown_previous(backend: LocalTranslator, sentences: list[str]
                         ) -> list[tuple[str, str | None]]:
    """Each preview with the one before it as shown (greedy, less its last MASK_K words)."""
    out = []
    for sentence in sentences:
        before: str | None = None
        for prefix in previews(sentence):
            out.append((prefix, before))
            [text] = await backend.run(Job([prefix], "en", "de"))
            words = text.split()
            before = (" ".join(words[:-MASK_K]) if len(words) > MASK_K
                      else text[:-MASK_K] if len(words) == 1 else "") or None
    return out


def kept_share(text: str, previous: str) -> float:
    """How much of ``previous`` ``text`` starts with, over the shorter of the two."""
    same = 0
    for a, b in zip(text, previous, strict=False):
        if a != b:
            break
        same += 1
    return same / max(1, min(len(text), len(previous)))


async def one_round(backend: LocalTranslator, work: list[tuple[str, str | None]],
                    times: list[float], kept: list[float]) -> int:
    """Every preview once, timed into ``times``, its kept share into ``kept``; the output
    tokens it took."""
    before = backend.stats.output_tokens
    for prefix, previous in work:
        began = time.perf_counter()
        [text] = await backend.run(Job([prefix], "en", "de", preview=True,
                                       previous=[previous]))
        times.append((time.perf_counter() - began) * 1000)
        kept.append(kept_share(text, previous or ""))
    return backend.stats.output_tokens - before


async def main(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="preview-bias-"))
    path = workdir / args.shape
    if not (workdir / f".{args.shape}.built").exists():
        began = time.perf_counter()
        run_child("_build", args.shape, str(path))
        (workdir / f".{args.shape}.built").touch()
        print(f"{args.shape}: built in {time.perf_counter() - began:.0f}s", file=sys.stderr)
    cache = workdir / "ct2-cache"
    modes = {"greedy": {"local_preview_bias": 0.0},
             "beam2": {"local_preview_bias": 0.0, "local_num_beams": 2},
             "biased": {"local_preview_bias": args.beta}}
    backends = {mode: await started(path, cache, args.threads, **overrides)
                for mode, overrides in modes.items()}
    try:
        # The previews that have a previous one: what the bias touches.
        work = [w for w in await shown_previous(backends["greedy"],
                                                SENTENCES[:args.sentences]) if w[1]]
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        kept: dict[str, list[float]] = {mode: [] for mode in modes}
        tokens = dict.fromkeys(modes, 0)
        for r in range(args.rounds + 1):
            for mode, backend in backends.items():
                took = await one_round(backend, work, [] if r == 0 else times[mode],
                                       [] if r == 0 else kept[mode])
                tokens[mode] += took if r else 0
    finally:
        for backend in backends.values():
            await backend.aclose()
    results = {}
    for mode in modes:
        ordered = sorted(times[mode])
        results[mode] = {"median_ms": statistics.median(ordered),
                         "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
                         "tokens": tokens[mode] / len(ordered),
                         "kept": statistics.mean(kept[mode])}
    report(args, results, len(work))


def report(args: argparse.Namespace, results: dict[str, dict[str, float]], count: int) -> None:
    print(f"machine: {cpu_name()}, {cores()} cores, {platform.python_version()}; "
          f"threads {args.threads}")
    print(f"command: {' '.join(['bench/preview_bias.py', *sys.argv[1:]])}")
    print(f"shape {args.shape}, {count} previews x {args.rounds} rounds, beta {args.beta}")
    print("| mode | median ms | p90 ms | out tokens | previous kept |")
    print("|---|---:|---:|---:|---:|")
    greedy = results["greedy"]["median_ms"]
    for mode, r in results.items():
        print(f"| {mode} | {r['median_ms']:.1f} ({r['median_ms'] / greedy:.2f}x) | "
              f"{r['p90_ms']:.1f} | {r['tokens']:.1f} | {r['kept']:.2f} |")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="marian")
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=min(4, cores()))
    parser.add_argument("--workdir", default=None, help="keeps the checkpoint and the cache")
    return parser.parse_args(argv)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    asyncio.run(main(parse(sys.argv[1:])))
