"""Throughput of a seq2seq translation model at fixed input and output lengths.

Measures what the local backend's worker does per batch, ``model.generate`` under
``torch.inference_mode()``, on either a checkpoint directory or a model of a real checkpoint's
shape with random weights (no download: the numbers depend on the shape, not on the weights).
Output length is pinned (``min_new_tokens = max_new_tokens``) so that random weights cannot
stop early and every batch size does the same work per segment.

    python bench/model_bench.py --shape nllb-600m --batch-sizes 1,8,32
    python bench/model_bench.py --checkpoint /models/nllb-200-distilled-600M --device cuda

Prints a markdown table: latency per batch and segments per second for each batch size.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

# The shapes of the real checkpoints (their config.json), to build with random weights.
SHAPES: dict[str, dict[str, Any]] = {
    "nllb-600m": {  # facebook/nllb-200-distilled-600M
        "family": "m2m_100",
        "vocab_size": 256206,
        "d_model": 1024,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
    },
    "m2m-418m": {  # facebook/m2m100_418M
        "family": "m2m_100",
        "vocab_size": 128112,
        "d_model": 1024,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
    },
    "marian": {  # Helsinki-NLP/opus-mt-en-de
        "family": "marian",
        "vocab_size": 58101,
        "d_model": 512,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
    },
}
# The local backend's loop guard (models/local.py NO_REPEAT_NGRAM_SIZE): it costs CPU per step.
NO_REPEAT_NGRAM_SIZE = 6


def build_model(shape: str, torch: Any) -> tuple[Any, int | None]:
    """A random-weight model of a named shape, and the forced BOS id its family needs."""
    spec = dict(SHAPES[shape])
    family = spec.pop("family")
    common: dict[str, Any] = {
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "max_position_embeddings": 1024,
    }
    if family == "marian":
        from transformers import MarianConfig, MarianMTModel

        pad = spec["vocab_size"] - 1
        marian = MarianConfig(
            **spec, **common, pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad
        )
        return MarianMTModel(marian), None
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config(
        **spec, **common, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2
    )
    # NLLB's and M2M's language tokens sit at the end of the vocabulary.
    return M2M100ForConditionalGeneration(config), spec["vocab_size"] - 100


def load_checkpoint(path: str, torch: Any) -> tuple[Any, int | None]:
    """A checkpoint directory (or cached hub id), and a target token for NLLB/M2M."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    forced = None
    if hasattr(tokenizer, "get_lang_id"):
        forced = tokenizer.get_lang_id("de")
    elif "deu_Latn" in tokenizer.get_vocab():
        forced = tokenizer.convert_tokens_to_ids("deu_Latn")
    return model, forced


def machine(torch: Any, device: str) -> str:
    """One line about where the numbers come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    where = f"{cpu}, {os.cpu_count()} cores visible, torch threads {torch.get_num_threads()}"
    if device.startswith("cuda"):
        where = f"{torch.cuda.get_device_name(device)}; host {where}"
    return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


def run(args: argparse.Namespace) -> str:
    """Measure and return the markdown report."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype == "auto":
        on_gpu = device.startswith("cuda")
        dtype = (
            (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
            if on_gpu
            else torch.float32
        )
    else:
        dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    began = time.perf_counter()
    if args.checkpoint:
        model, forced = load_checkpoint(args.checkpoint, torch)
        what = f"checkpoint `{args.checkpoint}`"
    else:
        model, forced = build_model(args.shape, torch)
        what = f"`{args.shape}` shape, random weights"
    model = model.to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - began
    vocab = model.config.vocab_size
    kwargs: dict[str, Any] = {
        "max_new_tokens": args.out_tokens,
        "min_new_tokens": args.out_tokens,  # pinned: random weights must not stop early
        "num_beams": args.num_beams,
        "do_sample": False,
        "no_repeat_ngram_size": args.no_repeat_ngram,
    }
    if forced is not None:
        kwargs["forced_bos_token_id"] = forced
    rows = []
    for batch_size in args.batch_sizes:
        # Ordinary pieces only: ids past the specials, short of the language tokens.
        ids = torch.randint(4, vocab - 300, (batch_size, args.in_tokens), device=device)
        mask = torch.ones_like(ids)
        times = []
        for i in range(args.warmup + args.repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - start)
        new_tokens = out.shape[1] - 1
        p50 = statistics.median(times)
        rows.append(
            f"| {batch_size} | {p50:.2f} | {min(times):.2f}-{max(times):.2f} "
            f"| {batch_size / p50:.2f} | {batch_size * new_tokens / p50:.0f} |"
        )
        print(f"batch {batch_size}: {p50:.2f}s", file=sys.stderr, flush=True)
    command = "python bench/model_bench.py " + " ".join(args.argv)
    lines = [
        f"Model: {what}, {params / 1e6:.0f}M parameters, {device}/{str(dtype).split('.')[-1]}, "
        f"built in {build_s:.0f}s",
        f"Machine: {machine(torch, device)}",
        f"Work per segment: {args.in_tokens} input tokens, {args.out_tokens} output tokens "
        f"(pinned), greedy={args.num_beams == 1} (beams {args.num_beams}), "
        f"no_repeat_ngram_size {args.no_repeat_ngram}; {args.repeats} timed runs after "
        f"{args.warmup} warm-up",
        f"Command: `{command}`",
        "",
        "| batch size | latency p50 (s) | latency min-max (s) | segments/s | output tokens/s |",
        "| ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]
    return "\n".join(lines)


def _sizes(value: str) -> list[int]:
    sizes = [int(part) for part in value.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {value!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="DIR", help="a checkpoint directory or hub id")
    source.add_argument("--shape", choices=sorted(SHAPES), help="a real model's shape")
    parser.add_argument("--batch-sizes", type=_sizes, default=[1, 8, 32], metavar="1,8,32")
    parser.add_argument("--in-tokens", type=int, default=32)
    parser.add_argument("--out-tokens", type=int, default=40)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:0")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"]
    )
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--no-repeat-ngram", type=int, default=NO_REPEAT_NGRAM_SIZE)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per batch size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    args.argv = argv
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
