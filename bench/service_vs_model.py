"""Does the service feed the model full batches? Service throughput / the model's own.

Builds a checkpoint of the NLLB-200 600M shape (random weights, the test tokenizer) and
measures, on the same inputs and the same batch size B:

- the model's own throughput: the local backend's ``translate`` on batches of B, back to
  back, with no service around it;
- the service's: 3 x B concurrent one-shot requests of one segment each through a
  ``Runtime`` (detection, batcher, dispatcher), in-process.

    .venv/bin/python bench/service_vs_model.py --batch-size 8 --rounds 3

The ratio is the service's segments/s over the model's; the goal is >= 0.9.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

SENTENCES = [
    "The first leg of the hike is three and a half kilometres on flat ground at four km/h.",
    "Then there is a climb of six hundred metres, which usually adds about an hour.",
    "They also mentioned two stops of ten minutes each, so twenty minutes of breaks.",
    "Adding it all up gives fifty two plus sixty plus twenty, about two hours in total.",
    "Let me double check the flat part once more, since the rest depends on it.",
    "The function returns nothing when the list is empty, which the caller does not expect.",
    "Returning an empty list seems cleaner than raising an error in this situation.",
    "I should also look at the tests to see whether any of them rely on the old value.",
]


def build_checkpoint(outdir: Path) -> Path:
    """The test NLLB tokenizer with a model of the real 600M shape, random weights."""
    import torch
    from transformers import AutoConfig, M2M100ForConditionalGeneration

    from service.tools.testmodel import make_test_model

    path = make_test_model("nllb", outdir)
    config = AutoConfig.from_pretrained(path)
    config.update({"d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
                   "encoder_attention_heads": 16, "decoder_attention_heads": 16,
                   "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096, "vocab_size": 256206,
                   "init_std": 0.02})
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config)
    model.generation_config.min_new_tokens = None
    model.save_pretrained(path)
    return path


async def model_throughput(path: Path, batch: int, rounds: int) -> float:
    from models.local import LocalTranslator
    from service.settings import load_settings

    settings = load_settings(backend="local", local_model=str(path))
    translator = LocalTranslator.from_settings(settings)
    await translator.start()
    await translator.wait_ready(600)
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
    await translator.translate(texts, source="en", target="de")  # warm the shapes
    started = time.perf_counter()
    for _ in range(rounds):
        await translator.translate(texts, source="en", target="de")
    elapsed = time.perf_counter() - started
    await translator.aclose()
    return batch * rounds / elapsed


async def service_throughput(path: Path, batch: int, rounds: int) -> tuple[float, list[int]]:
    from service.runtime import Runtime
    from service.settings import load_settings

    settings = load_settings(backend="local", local_model=str(path), max_batch_size=batch,
                             max_wait_ms=50, deadline_ms=600_000, backend_timeout_s=600,
                             log_level="warning")
    async with Runtime(settings) as runtime:
        await runtime.wait_ready(timeout_s=600.0)

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
    # The counts include the warm-up request's batch of one.
    return batch * rounds / elapsed, [int(sizes or 0), int(count or 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "nllb-600m-shape")
        model_sps = asyncio.run(model_throughput(path, args.batch_size, args.rounds))
        service_sps, (seg_sum, batches) = asyncio.run(
            service_throughput(path, args.batch_size, args.rounds))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print("| batch size | model segments/s | service segments/s | ratio | service batches |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| {args.batch_size} | {model_sps:.3f} | {service_sps:.3f} | "
          f"{service_sps / model_sps:.2f} | {batches} batches, {seg_sum} segments |")


if __name__ == "__main__":
    main()
