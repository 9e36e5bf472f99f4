"""What one sentence costs on the ``llm`` backend in each prompt style: requests, characters
sent and answered, and an estimate in tokens and dollars.

The English prose sentences of the built-in sample corpus (``service/data``), cut by the
service's segmenter, go to a chat double over real HTTP on 127.0.0.1 (``tests.fakes_remote
.FakeChat``, which answers a plain prompt with its text) as one stream into
Simplified Chinese, each with the stream's preceding text as its context (as the service
sends it):

- ``json-16``: JSON batches of up to 16 sentences (a busy stream, or several streams);
- ``json-1``: one sentence a request (a stream read at a reader's pace);
- ``plain``: the plain style (one sentence a request; Hunyuan-MT's template, which takes no
  context).

Characters are counted exactly from what was sent and answered; tokens are estimated (4
characters a token for English and JSON, 1 a token for CJK), and the translation itself is
taken to be as many tokens as its source (an English-Chinese rule of thumb), the same in every
style, so the styles differ only in what they add around it. ``--reasoning-tokens`` adds what
a reasoning model spends when its reasoning is left on (a median of 525 a sentence was
measured by one translation plugin; not measured here). Prices are per million tokens.

    PYTHONPATH=.:client .venv/bin/python bench/llm_styles.py [--price-in 0.25] [--price-out 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import unicodedata
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from models.llm import LLMTranslator  # noqa: E402
from service.settings import load_settings  # noqa: E402
from service.text.segmenter import is_translatable, segment  # noqa: E402
from service.tools.corpus import builtin_corpus  # noqa: E402
from tests.fakes_remote import FakeChat  # noqa: E402


def tokens(text: str) -> float:
    """Estimated tokens: a CJK character 1, anything else 4 characters a token."""
    wide = sum(unicodedata.east_asian_width(ch) in "WF" for ch in text)
    return wide + (len(text) - wide) / 4


def sentences() -> list[tuple[str, str]]:
    """(sentence, preceding text) of each English prose sentence of the sample corpus."""
    out: list[tuple[str, str]] = []
    limits = load_settings()  # the segment bounds a stream would cut with
    for item in builtin_corpus():
        before = ""
        for piece in segment(item.text, limits.max_segment_chars,
                             max_fence_chars=limits.max_fence_chars):
            if piece.kind == "text" and is_translatable(piece.text) and piece.text.isascii():
                out.append((piece.text, before[-2000:]))
            before += piece.text
    return out


async def measure(fake: FakeChat, style: str, size: int,
                  items: list[tuple[str, str]]) -> dict[str, Any]:
    fake.reset()
    backend = LLMTranslator(load_settings(
        llm_base_url=f"{fake.origin}/v1", llm_model="hunyuan-mt-7b", llm_prompt_style=style,
    ).llm_config())
    wrapper = 0  # characters an answer adds around its translations
    try:
        for start in range(0, len(items), size):
            group = items[start:start + size]
            texts = [text for text, _ in group]
            out = await backend.translate(texts, source="en", target="zh-CN",
                                          contexts=[context for _, context in group])
            if style == "json":  # the answer's JSON around the texts; a plain one has none
                answer = json.dumps({"translations": [{"id": k + 1, "text": t}
                                                      for k, t in enumerate(out)]},
                                    ensure_ascii=False)
                wrapper += len(answer) - sum(map(len, out))
    finally:
        await backend.aclose()
    sent = [rec.json for rec in fake.chat_requests]
    prompt = sum(len(m["content"]) for body in sent for m in body["messages"])
    source = sum(len(text) for text, _ in items)
    n = len(items)
    overhead_in = tokens("x" * (prompt - source)) / n
    source_tokens = sum(tokens(text) for text, _ in items) / n
    return {
        "requests_per_sentence": round(len(sent) / n, 3),
        "chars_sent_per_sentence": round(prompt / n, 1),
        "source_chars_per_sentence": round(source / n, 1),
        "tokens_in": round(source_tokens + overhead_in, 1),
        "tokens_out": round(source_tokens + tokens("x" * wrapper) / n, 1),
    }


def cost(row: dict[str, Any], reasoning: float, price_in: float, price_out: float) -> float:
    """Dollars per 1,000 sentences."""
    return round((row["tokens_in"] * price_in + (row["tokens_out"] + reasoning) * price_out)
                 / 1000, 4)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--price-in", type=float, default=0.25, help="USD per M input tokens")
    parser.add_argument("--price-out", type=float, default=2.0, help="USD per M output tokens")
    parser.add_argument("--reasoning-tokens", type=float, default=525.0)
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args()
    items = sentences()
    fake = FakeChat()
    fake.start()
    try:
        rows = {name: await measure(fake, style, size, items)
                for name, style, size in (("json-16", "json", 16), ("json-1", "json", 1),
                                          ("plain", "plain", 1))}
    finally:
        fake.stop()
    for row in rows.values():
        row["usd_per_1000"] = cost(row, 0, args.price_in, args.price_out)
        row["usd_per_1000_reasoning_on"] = cost(row, args.reasoning_tokens, args.price_in,
                                                args.price_out)
    report = {"sentences": len(items), "price_in": args.price_in, "price_out": args.price_out,
              "reasoning_tokens": args.reasoning_tokens, "styles": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{len(items)} sentences; prices {args.price_in}/{args.price_out} USD per M tokens")
    keys = list(next(iter(rows.values())))
    print("| style | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    asyncio.run(main())
