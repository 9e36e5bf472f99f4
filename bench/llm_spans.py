"""What naming protected spans costs the ``llm`` backend, and how often a model that drops
them is rescued by the retry rather than by the chain's next backend.

Against the chat double of the tests (``tests/fakes_remote.FakeChat``, real HTTP on
127.0.0.1), with the sentences of ``tests/test_llm_spans.SAMPLE`` (reasoning sentences
with spans of most kinds, in eight languages) and the glossary there.

- ``growth``: the request (system prompt and user message, in characters) with each
  item's ``keep`` and ``terms`` (and so ``SPANS_PROMPT``) against the same request
  without them (``SYSTEM_PROMPT``, as before spans), a sentence a request and all of
  them in one; tokens as the double counts them (4 characters each).
- ``fallback``: the double drops an item's first span with probability ``--rates``
  (seeded); per rate and batch size, the items answered without a span, those the
  retry rescued, and the segments that went down the chain (those still without a span
  after the retry: a batch answers its good items, ``PartialOutput``, and a whole batch
  fails only when its answer is unusable).

    PYTHONPATH=.:client .venv/bin/python bench/llm_spans.py [--repeat 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from models.errors import BackendError, PartialOutput  # noqa: E402
from models.llm import LLMTranslator  # noqa: E402
from models.llm.prompt import Request, chat_body  # noqa: E402
from service.settings import load_settings  # noqa: E402
from tests.fakes_remote import FakeChat  # noqa: E402
from tests.test_llm_spans import GLOSSARY, SAMPLE, protect  # noqa: E402


def _size(cores: list[str], with_spans: bool) -> tuple[int, int]:
    """The system prompt's and the user message's characters of one request."""
    request = Request("German", None, "fake-model")
    protected = protect(cores, GLOSSARY) if with_spans else None
    body = chat_body(request, cores, [None] * len(cores), json_mode=False, protected=protected)
    system, user = (len(m["content"]) for m in body["messages"])
    return system, user


def growth() -> dict[str, Any]:
    rows: dict[str, Any] = {"sentences": len(SAMPLE), "text_chars": sum(map(len, SAMPLE))}
    for name, requests in (("alone", [[s] for s in SAMPLE]), ("batch", [SAMPLE])):
        with_, without = ([_size(r, spans) for r in requests] for spans in (True, False))
        user_with, user_without = sum(u for _, u in with_), sum(u for _, u in without)
        total_with = sum(map(sum, with_))
        total_without = sum(map(sum, without))
        rows[name] = {
            "requests": len(requests),
            "chars": total_with, "chars_without_spans": total_without,
            "ratio": round(total_with / total_without, 3),
            "user_chars": user_with, "user_chars_without_spans": user_without,
            "user_ratio": round(user_with / user_without, 3),
            "tokens_added_per_sentence": round(
                (total_with - total_without) / 4 / len(SAMPLE), 1),
        }  # fmt: skip
    return rows


async def fallback(rates: list[float], sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    fake = FakeChat()
    fake.start()
    rows = []
    try:
        for rate in rates:
            for size in sizes:
                fake.reset()
                fake.mode, fake.drop_rate = "drop_some", rate
                backend = LLMTranslator(load_settings(
                    llm_base_url=f"{fake.origin}/v1", llm_model="fake-model").llm_config())
                texts = SAMPLE * repeat
                down = 0
                try:
                    for at in range(0, len(texts), size):
                        batch = texts[at:at + size]
                        try:
                            await backend.translate(batch, source=None, target="de",
                                                    protected=protect(batch, GLOSSARY))
                        except PartialOutput as exc:
                            down += sum(out is None for out in exc.outputs)
                        except BackendError:
                            down += len(batch)
                    info = backend.info()
                finally:
                    await backend.aclose()
                lost = int(str(info["span_retries"]))
                failed = int(str(info["span_failures"]))
                rows.append({
                    "drop_rate": rate, "batch": size, "segments": len(texts),
                    "lost_first": lost, "rescued_by_retry": lost - failed,
                    "lost_after_retry": failed, "down_the_chain": down,
                    "requests": info["requests"],
                })  # fmt: skip
    finally:
        fake.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="times through the sample")
    parser.add_argument("--rates", default="0.05,0.2,0.5")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    sizes = [int(b) for b in args.batches.split(",")]
    result: dict[str, Any] = {"growth": growth(),
              "fallback": asyncio.run(fallback(rates, sizes, args.repeat))}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    g = result["growth"]
    print(f"growth over {g['sentences']} sentences ({g['text_chars']} characters of text):")
    for name in ("alone", "batch"):
        row = g[name]
        print(f"  {name} ({row['requests']} requests): {row['chars_without_spans']} -> "
              f"{row['chars']} characters (x{row['ratio']}); user messages "
              f"{row['user_chars_without_spans']} -> {row['user_chars']} "
              f"(x{row['user_ratio']}); {row['tokens_added_per_sentence']} tokens "
              "(4 characters) a sentence")
    print("fallback (drop_some):")
    for row in result["fallback"]:
        print(f"  rate {row['drop_rate']:<4} batch {row['batch']:<2}: {row['segments']} "
              f"segments, {row['lost_first']} lost a span, {row['rescued_by_retry']} "
              f"rescued by the retry, {row['lost_after_retry']} lost it again, "
              f"{row['down_the_chain']} went down the chain ({row['requests']} requests)")


if __name__ == "__main__":
    main()
