"""The translation cache's hit rate on recorded thinking traces.

Replays each source through a runtime whose one backend counts what reaches it (a real
``Translator``; the hit rate depends on the text, the segmenter and the detector, not on
the backend), target ``zh-CN``, the cache at its default size:

- ``examples/thinking_trace.jsonl``: one thinking part per line (its deltas joined);
- ``examples/acp_trace.jsonl``: the ``agent_thought_chunk`` texts of each prompt turn;
- the built-in sample corpus (``service/data/sample_corpus.jsonl``);
- all of them in one runtime, in that order (a session that sees each source in turn).

Each text goes through ``Runtime.translate``, the same path as a stream. Reported per
source: segments sent for translation, cache hits, the hit rate, and the characters the
backend did not have to translate (for DeepL: characters not billed).

    .venv/bin/python bench/cache_hits.py [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from models.base import Capabilities, Job, Translator
from models.passthrough import PassthroughTranslator
from service.runtime import Runtime
from service.settings import load_settings
from service.tools.corpus import builtin_corpus

ROOT = Path(__file__).resolve().parents[1]
TARGET = "zh-CN"


class Counting(Translator):
    """Answers each text tagged, and counts the texts and characters it was sent."""

    name = "counting"
    capabilities = Capabilities(checked_output=False)

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0
        self.chars = 0

    async def run(self, job: Job) -> list[str]:
        self.texts += len(job.texts)
        self.chars += sum(map(len, job.texts))
        return [f"[{job.target}] {text}" for text in job.texts]


def thinking_parts() -> list[str]:
    lines = (ROOT / "examples" / "thinking_trace.jsonl").read_text("utf-8").splitlines()
    return ["".join(json.loads(line)["deltas"]) for line in lines if line.strip()]


def acp_turns() -> list[str]:
    """The thought text of each prompt turn (a turn ends at the prompt's response)."""
    turns: list[str] = []
    current: list[str] = []
    for line in (ROOT / "examples" / "acp_trace.jsonl").read_text("utf-8").splitlines():
        message = json.loads(line)
        update = message.get("params", {}).get("update", {})
        if update.get("sessionUpdate") == "agent_thought_chunk":
            current.append(update["content"]["text"])
        elif "result" in message and current:
            turns.append("".join(current))
            current = []
    if current:
        turns.append("".join(current))
    return turns


async def replay(runtime: Runtime, backend: Counting, texts: list[str]) -> dict[str, Any]:
    cache = runtime.cache
    assert cache is not None
    hits0, misses0, chars0 = cache.hits, cache.misses, backend.chars
    sent = 0
    saved = 0
    for text in texts:
        [result] = await runtime.translate([text], target=TARGET)
        for seg in result.segments:
            if seg.status == "translated":
                sent += 1
                if seg.cached:
                    saved += len(seg.original.strip())
    hits = cache.hits - hits0
    return {"texts": len(texts), "segments_translated": sent, "hits": hits,
            "misses": cache.misses - misses0,
            "hit_rate": round(hits / sent, 3) if sent else None,
            "chars_to_backend": backend.chars - chars0, "chars_saved": saved}


def _backends(backend: Counting) -> dict[str, Translator]:
    return {"counting": backend, "passthrough": PassthroughTranslator()}


async def main_async() -> dict[str, Any]:
    os.environ.setdefault("THINKTRANS_LOG_LEVEL", "warning")
    sources = {"thinking_trace": thinking_parts(), "acp_trace": acp_turns(),
               "sample_corpus": [item.text for item in builtin_corpus()]}
    settings = load_settings(backend="counting", default_locale=TARGET, deadline_ms=60_000)
    report: dict[str, Any] = {}
    for name, texts in sources.items():
        backend = Counting()
        async with Runtime(settings, backends=_backends(backend)) as runtime:
            report[name] = await replay(runtime, backend, texts)
    backend = Counting()
    async with Runtime(settings, backends=_backends(backend)) as runtime:
        every = [text for texts in sources.values() for text in texts]
        report["all, one session"] = await replay(runtime, backend, every)
        report["all, read again"] = await replay(runtime, backend, every)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args()
    report = asyncio.run(main_async())
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("| source | texts | segments translated | cache hits | hit rate | chars saved |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, row in report.items():
        rate = "-" if row["hit_rate"] is None else f"{row['hit_rate']:.1%}"
        print(f"| {name} | {row['texts']} | {row['segments_translated']} | {row['hits']} | "
              f"{rate} | {row['chars_saved']} |")


if __name__ == "__main__":
    main()
