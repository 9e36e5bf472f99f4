"""What finding and checking protected spans costs the service, per segment.

The span corpus's sentences (tests/data/spans_corpus.jsonl) one-shot through an in-process
runtime on passthrough (which renders the glossary's terms and nothing else), with spans on
and off (``protect_spans``), with and without a glossary, in alternating rounds; the time
of a ``Runtime.translate`` call per segment sent, the median of the rounds. Passthrough
costs almost nothing, so the difference is the finder, the check and the cache key.

    PYTHONPATH=.:client .venv/bin/python bench/spans_service.py [--rounds 7] [--repeat 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "client")]

from service.runtime import Runtime  # noqa: E402
from service.settings import load_settings  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "spans_corpus.jsonl"
GLOSSARY = {"terms": {"model": "MODELL", "function": "FUNKTION", "模型": "MODELL"},
            "keep": ["Python", "Windows"]}
CASES = {"spans off": (False, None), "spans on": (True, None),
         "spans on, glossary": (True, GLOSSARY)}


async def one_round(runtime: Runtime, texts: list[str], glossary: Any) -> tuple[float, int]:
    started = time.perf_counter()
    sent = 0
    for at in range(0, len(texts), 16):
        results = await runtime.translate(texts[at:at + 16], target="de", glossary=glossary)
        sent += sum(s.status != "same_language" and s.status != "skipped"
                    for r in results for s in r.segments)
    return time.perf_counter() - started, sent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=4, help="corpus passes per round")
    args = parser.parse_args()
    texts = [json.loads(line)["text"] for line in CORPUS.read_text("utf-8").splitlines()
             if line.strip()] * args.repeat
    runtimes = {}
    for name, (protect, _) in CASES.items():
        settings = load_settings(backend="passthrough", protect_spans=protect, cache_mb=0,
                                 default_locale="de")
        runtimes[name] = await Runtime(settings).__aenter__()
    times: dict[str, list[float]] = {name: [] for name in CASES}
    sent_by: dict[str, int] = {}
    try:
        for _ in range(args.rounds + 1):  # the first round warms up, untimed
            for name, (_, glossary) in CASES.items():
                elapsed, sent = await one_round(runtimes[name], texts, glossary)
                times[name].append(elapsed)
                sent_by[name] = sent
    finally:
        for runtime in runtimes.values():
            await runtime.__aexit__(None, None, None)
    base = statistics.median(times["spans off"][1:]) / sent_by["spans off"]
    print(f"{len(texts)} texts a round, {args.rounds} rounds, passthrough, median per "
          "segment sent:")
    for name in CASES:
        per = statistics.median(times[name][1:]) / sent_by[name]
        print(f"  {name:20s} {per * 1e6:8.1f} µs  ({per / base:.2f}x spans off; "
              f"{sent_by[name]} segments sent)")


if __name__ == "__main__":
    asyncio.run(main())
