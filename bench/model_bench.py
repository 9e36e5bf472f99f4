"""Throughput of a seq2seq translation model at fixed input and output lengths, per engine.

Measures what the local backend's worker does per batch, on either a checkpoint directory or
a model of a real checkpoint's shape with random weights (no download: the numbers depend on
the shape, not on the weights), with one of two engines:

- ``transformers``: ``model.generate`` under ``torch.inference_mode()``, in ``--dtype``;
- ``ctranslate2``: ``ctranslate2.Translator.translate_batch`` on the checkpoint converted
  with ``TransformersConverter`` (as the service converts it), in ``--compute-type``
  (``auto``: int8 on CPU, int8_float16 on CUDA, as the service).

Output length is pinned (transformers ``min_new_tokens = max_new_tokens``, CTranslate2
``min_decoding_length = max_decoding_length``) so that random weights cannot stop early and
every batch size does the same work per segment. Both engines generate ``--out-tokens`` new
tokens per segment, the target language token of NLLB/M2M included (transformers forces it
as the first new token; CTranslate2 takes it as the target prefix, which counts towards its
decoding length). The inputs are random ids of ordinary pieces (no specials, no language
tokens), drawn alike for both engines; CTranslate2 gets them as token strings.

The checkpoint is built (``--shape``: ``make_test_model(family, dir, shape=...)``, random
weights and a tokenizer of the full vocabulary; ``tiny-*``: the tiny test checkpoints) and
converted in child processes;
the measuring process only imports its engine and loads the model, so that its resident
memory (``VmRSS`` after each batch size's runs, ``VmHWM``, its peak, from /proc/self/status)
is the model's and the engine's.

    python bench/model_bench.py --shape nllb-600m --batch-sizes 1,8,32
    python bench/model_bench.py --shape nllb-600m --engine ctranslate2 --batch-sizes 1,8
    python bench/model_bench.py --checkpoint /models/nllb-200-distilled-600M --device cuda
    python bench/model_bench.py --checkpoint /models/nllb-ct2-int8 --engine ctranslate2

``--checkpoint`` names a checkpoint directory or hub id; with ``--engine ctranslate2`` it may
also name a converted CTranslate2 directory (``model.bin`` and a config.json without
``model_type``), which is loaded as it is.

Prints a markdown table: latency per batch, segments and output tokens per second and the
resident memory for each batch size, with lines saying which engine, compute type, model and
machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.local.engines import cpuinfo
from service.settings import Settings
from service.tools.testmodel import SHAPES as TESTMODEL_SHAPES
from service.tools.testmodel import shape_config

# The real models' shapes, built with random weights by make_test_model (name -> family);
# the tiny-* shapes are its tiny checkpoints.
SHAPES = TESTMODEL_SHAPES
# Thinking-like sentences, for the scripts that drive the service with real text.
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
TINY = {f"tiny-{family}": family for family in ("nllb", "m2m100", "marian")}
# The local backend's loop guard (the local_no_repeat_ngram_size setting's default): it costs
# CPU per step.
NO_REPEAT_NGRAM_SIZE = Settings.model_fields["local_no_repeat_ngram_size"].default
ENGINES = ("transformers", "ctranslate2")
COMPUTE_TYPES = ("auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16",
                 "bfloat16", "float32")
TARGET = "de"
# The target's language token, by family (the tokenizer's get_lang_id for M2M-100).
TARGET_TOKENS = {"nllb": "deu_Latn", "m2m100": "__de__"}
# Language tokens (NLLB flores codes, M2M __xx__, Marian >>xx<<) and <specials>: never inputs.
_NOT_ORDINARY = re.compile(r"^(<.*>|[a-z]{3}_[A-Z][a-z]{3}|__[a-z]{2,3}__|>>.*<<|madeupword\d+)$")


# -- child processes: build, convert, describe -------------------------------------------------


def build_checkpoint(shape: str, outdir: str) -> None:
    """Write the checkpoint of ``shape`` to ``outdir`` (runs in a child process)."""
    import torch

    from service.tools.testmodel import make_test_model

    torch.manual_seed(0)
    if shape in TINY:
        make_test_model(TINY[shape], outdir)
    else:
        make_test_model(SHAPES[shape], outdir, shape=shape)


def convert_checkpoint(src: str, outdir: str, quantization: str) -> None:
    """Convert an HF checkpoint as the service does (runs in a child process)."""
    import ctranslate2

    ctranslate2.converters.TransformersConverter(src).convert(
        outdir, quantization=quantization, force=True
    )


def is_ct2_dir(path: str) -> bool:
    """A converted CTranslate2 directory: model.bin and a config.json without model_type."""
    config = Path(path, "config.json")
    if not Path(path, "model.bin").is_file() or not config.is_file():
        return False
    try:
        return "model_type" not in json.loads(config.read_text(encoding="utf-8"))
    except ValueError:
        return False


def _ct2_vocabulary(path: str) -> tuple[list[str], list[str]]:
    """The source and target vocabularies of a CTranslate2 directory."""

    def read(stem: str) -> list[str] | None:
        json_path, txt_path = Path(path, stem + ".json"), Path(path, stem + ".txt")
        if json_path.is_file():
            return list(json.loads(json_path.read_text(encoding="utf-8")))
        if txt_path.is_file():
            return txt_path.read_text(encoding="utf-8").split("\n")[:-1]
        return None

    shared = read("shared_vocabulary")
    source = read("source_vocabulary") or shared
    target = read("target_vocabulary") or shared
    if source is None or target is None:
        raise SystemExit(f"{path}: no vocabulary file (shared_vocabulary.json, ...)")
    return source, target


def _random_ids(vocab_size: int, ordinary: Any, batch_size: int, n: int, seed: int) -> list:
    """``batch_size`` rows of ``n`` random ids of ordinary pieces: past the four specials,
    short of the language tokens at the end of the vocabulary."""
    rng = random.Random(seed)
    hi = max(5, vocab_size - 300)
    rows = []
    for _ in range(batch_size):
        row: list[int] = []
        while len(row) < n:
            i = rng.randrange(4, hi)
            if ordinary(i):
                row.append(i)
        rows.append(row)
    return rows


def describe(path: str, engine: str, batch_sizes: list[int], in_tokens: int) -> dict[str, Any]:
    """What the measuring process needs and should not load itself (tokenizer, vocabulary):
    the family, the target token, the inputs per batch size (runs in a child process)."""
    out: dict[str, Any] = {}
    if engine == "ctranslate2":
        source, target = _ct2_vocabulary(path)
        known = set(target)
        prefix = next((t for t in TARGET_TOKENS.values() if t in known), None)
        out["family"] = next((f for f, t in TARGET_TOKENS.items() if t == prefix), "marian")
        out["target_prefix"] = prefix
        out["vocab_size"] = len(source)

        def ordinary_ct2(i: int) -> bool:
            return not _NOT_ORDINARY.match(source[i])

        out["inputs"] = {
            str(b): [[source[i] for i in row]
                     for row in _random_ids(len(source), ordinary_ct2, b, in_tokens, b)]
            for b in batch_sizes
        }
        return out
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(path)
    vocab_size = int(config.vocab_size)
    forced = None
    tokenizer = AutoTokenizer.from_pretrained(path)
    if hasattr(tokenizer, "get_lang_id"):
        forced = int(tokenizer.get_lang_id(TARGET))
    elif TARGET_TOKENS["nllb"] in tokenizer.get_vocab():
        forced = int(tokenizer.convert_tokens_to_ids(TARGET_TOKENS["nllb"]))
    out["family"] = config.model_type
    out["forced_bos_token_id"] = forced
    out["vocab_size"] = vocab_size
    specials = set(tokenizer.all_special_ids) if tokenizer is not None else set()
    pieces = tokenizer.convert_ids_to_tokens if tokenizer is not None else None

    def ordinary_hf(i: int) -> bool:
        if i in specials:
            return False
        piece = pieces(i) if pieces is not None else ""
        return not (isinstance(piece, str) and _NOT_ORDINARY.match(piece))

    out["inputs"] = {
        str(b): _random_ids(vocab_size, ordinary_hf, b, in_tokens, b) for b in batch_sizes
    }
    return out


def child(argv: list[str]) -> int:
    """``model_bench.py _build SHAPE OUT``, ``_convert SRC OUT QUANT``,
    ``_describe PATH ENGINE SIZES IN_TOKENS OUT_JSON``."""
    what, *rest = argv
    if what == "_build":
        build_checkpoint(*rest)
    elif what == "_convert":
        convert_checkpoint(*rest)
    elif what == "_describe":
        path, engine, sizes, in_tokens, out_json = rest
        info = describe(path, engine, _sizes(sizes), int(in_tokens))
        Path(out_json).write_text(json.dumps(info))
    else:
        raise SystemExit(f"unknown child command {what!r}")
    return 0


def run_child(*argv: str) -> None:
    """Run this script's child command ``argv`` in a fresh interpreter; its memory is not
    the measuring process's."""
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    try:
        subprocess.run([sys.executable, __file__, *argv], check=True, env=env)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"model_bench: the child process {argv[0]} failed "
                         f"(exit {exc.returncode}); its error is above") from None


# -- the measuring process --------------------------------------------------------------------


def memory() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(line.split()[1]) * 1024
    return out


def mib(n: int) -> str:
    return f"{n / 2**20:.0f}"


def cpu_name() -> str:
    return cpuinfo("model name") or platform.processor() or platform.machine()


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class TransformersEngine:
    """``model.generate`` on a checkpoint loaded with from_pretrained."""

    def __init__(self, path: str, info: dict[str, Any], args: argparse.Namespace) -> None:
        import torch
        from transformers import AutoModelForSeq2SeqLM

        self.torch = torch
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
        self.device = device
        self.before = memory()
        began = time.perf_counter()
        model = AutoModelForSeq2SeqLM.from_pretrained(path, dtype=dtype)
        self.model = model.to(device=device, dtype=dtype).eval()
        # A test checkpoint's generation_config bans specials and holds EOS back; a real
        # checkpoint's does not, and the length is pinned below anyway.
        self.model.generation_config.bad_words_ids = None
        self.model.generation_config.min_new_tokens = None
        self.load_s = time.perf_counter() - began
        self.compute_type = str(dtype).split(".")[-1]
        params = sum(p.numel() for p in self.model.parameters())
        self.size = f"{params / 1e6:.0f}M parameters"
        self.kwargs: dict[str, Any] = {
            "max_new_tokens": args.out_tokens,
            "min_new_tokens": args.out_tokens,  # pinned: random weights must not stop early
            "num_beams": args.num_beams,
            "do_sample": False,
            "no_repeat_ngram_size": args.no_repeat_ngram,
        }
        if info.get("forced_bos_token_id") is not None:
            self.kwargs["forced_bos_token_id"] = info["forced_bos_token_id"]

    def prepare(self, rows: list[list[int]]) -> Any:
        ids = self.torch.tensor(rows, device=self.device)
        return ids, self.torch.ones_like(ids)

    def run(self, inputs: Any) -> int:
        """One batch; the new tokens per segment."""
        ids, mask = inputs
        cuda = self.device.startswith("cuda")
        with self.torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, **self.kwargs)
        if cuda:
            self.torch.cuda.synchronize()
        return int(out.shape[1]) - 1  # row[0] is the decoder start token

    def machine(self) -> str:
        torch = self.torch
        where = f"{cpu_name()}, {cores()} cores usable, torch threads {torch.get_num_threads()}"
        if self.device.startswith("cuda"):
            where = f"{torch.cuda.get_device_name(self.device)}; host {where}"
        return f"{where}; torch {torch.__version__}, Python {platform.python_version()}"


class CTranslate2Engine:
    """``Translator.translate_batch`` on a converted directory."""

    def __init__(self, path: str, info: dict[str, Any], args: argparse.Namespace) -> None:
        import ctranslate2

        self.ct2 = ctranslate2
        device, index = args.ct2_device, args.ct2_device_index
        self.device = device
        self.before = memory()
        began = time.perf_counter()
        # As the service runs it (models/local/engines.py CT2Engine): a small model's batch is cut
        # into one part per thread, run at once on single-threaded workers.
        threads = args.threads or min(4, cores())
        small = (d_model_of(args) or 1024) <= 512
        self.workers = args.workers or (threads if small and device == "cpu" else 1)
        self.intra_threads = max(1, threads // self.workers)
        self.translator = ctranslate2.Translator(
            path, device=device, device_index=index, compute_type=args.ct2_compute_type,
            intra_threads=self.intra_threads, inter_threads=self.workers,
        )
        self.load_s = time.perf_counter() - began
        actual = self.translator.compute_type
        wanted = args.ct2_compute_type
        self.compute_type = wanted if actual == wanted else f"{wanted} (runs as {actual})"
        size = Path(path, "model.bin").stat().st_size
        self.size = f"model.bin {size / 2**20:.0f} MiB"
        self.prefix = info.get("target_prefix")
        self.kwargs: dict[str, Any] = {
            "beam_size": args.num_beams,
            # The target prefix counts towards the decoding length, as the forced language
            # token counts towards transformers' max_new_tokens.
            "min_decoding_length": args.out_tokens,
            "max_decoding_length": args.out_tokens,
            "no_repeat_ngram_size": args.no_repeat_ngram,
        }

    def prepare(self, rows: list[list[str]]) -> Any:
        prefix = [[self.prefix] for _ in rows] if self.prefix else None
        return rows, prefix

    def run(self, inputs: Any) -> int:
        tokens, prefix = inputs
        part = math.ceil(len(tokens) / self.workers) if self.workers > 1 else 0
        results = self.translator.translate_batch(tokens, target_prefix=prefix,
                                                  max_batch_size=part, **self.kwargs)
        return len(results[0].hypotheses[0])

    def machine(self) -> str:
        where = (f"{cpu_name()}, {cores()} cores usable, {self.workers} worker(s) x "
                 f"{self.intra_threads} thread(s)")
        if self.device == "cuda":
            where = f"CUDA device {self.translator.device_index}; host {where}"
        return (f"{where}; ctranslate2 {self.ct2.__version__}, "
                f"Python {platform.python_version()}")


def d_model_of(args: argparse.Namespace) -> int | None:
    """The model's width: its shape's, or a checkpoint's config (thinktrans-ct2.json for a
    converted directory)."""
    if args.shape in SHAPES:
        return int(shape_config(args.shape)["d_model"])
    if args.shape in TINY:
        return 32
    for name in ("config.json", "thinktrans-ct2.json"):
        try:
            value = json.loads(Path(args.checkpoint, name).read_text()).get("d_model")
        except (OSError, ValueError, TypeError):
            continue
        if isinstance(value, int):
            return value
    return None


def resolve_ct2(args: argparse.Namespace) -> None:
    """Device and compute type for CTranslate2, without importing torch."""
    import ctranslate2

    device = args.device
    if device == "auto":
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    name, _, index = device.partition(":")
    if name not in ("cpu", "cuda"):
        raise SystemExit(f"--device {args.device!r}: CTranslate2 runs on cpu or cuda[:N]")
    args.ct2_device, args.ct2_device_index = name, int(index or 0)
    compute = args.compute_type
    if compute == "auto":
        compute = "int8_float16" if name == "cuda" else "int8"  # the service's defaults
    args.ct2_compute_type = compute


def prepare_model(args: argparse.Namespace, tmp: str) -> tuple[str, str]:
    """Build and convert what the engine loads, in child processes: (path, description)."""
    if args.checkpoint:
        path = args.checkpoint
        what = f"checkpoint `{path}`"
    else:
        path = str(Path(tmp, "hf"))
        began = time.perf_counter()
        run_child("_build", args.shape, path)
        what = f"`{args.shape}` shape, random weights (built in {time.perf_counter() - began:.0f}s)"
    if args.engine == "ctranslate2" and not is_ct2_dir(path):
        src, path = path, str(Path(tmp, "ct2"))
        began = time.perf_counter()
        run_child("_convert", src, path, args.ct2_compute_type)
        what += (f", converted to CTranslate2 ({args.ct2_compute_type}) in "
                 f"{time.perf_counter() - began:.0f}s")
    elif args.engine == "transformers" and is_ct2_dir(path):
        raise SystemExit(f"{path} is a converted CTranslate2 directory: use --engine ctranslate2")
    return path, what


def run(args: argparse.Namespace) -> str:
    """Measure and return the markdown report."""
    if args.engine == "ctranslate2":
        if args.dtype != "auto":
            raise SystemExit("--dtype is for --engine transformers; use --compute-type")
        resolve_ct2(args)
    elif args.compute_type != "auto":
        raise SystemExit("--compute-type is for --engine ctranslate2; use --dtype")
    with tempfile.TemporaryDirectory(prefix="model-bench-") as tmp:
        path, what = prepare_model(args, tmp)
        info_path = Path(tmp, "describe.json")
        run_child("_describe", path, args.engine, ",".join(map(str, args.batch_sizes)),
                  str(args.in_tokens), str(info_path))
        info = json.loads(info_path.read_text())
        # From here on this process holds only the engine and the model.
        engine: Any = (CTranslate2Engine if args.engine == "ctranslate2"
                       else TransformersEngine)(path, info, args)
        rows = []
        new_tokens = 0
        for batch_size in args.batch_sizes:
            inputs = engine.prepare(info["inputs"][str(batch_size)])
            times = []
            for i in range(args.warmup + args.repeats):
                start = time.perf_counter()
                new_tokens = engine.run(inputs)
                if i >= args.warmup:
                    times.append(time.perf_counter() - start)
            if new_tokens != args.out_tokens:
                raise SystemExit(f"{args.engine} generated {new_tokens} tokens per segment, "
                                 f"not the {args.out_tokens} pinned")
            p50 = statistics.median(times)
            mem = memory()
            rows.append(
                f"| {batch_size} | {p50:.2f} | {min(times):.2f}-{max(times):.2f} "
                f"| {batch_size / p50:.2f} | {batch_size * new_tokens / p50:.0f} "
                f"| {1000 * p50 / (batch_size * new_tokens):.1f} "
                f"| {mib(mem['VmRSS'])} | {mib(mem['VmHWM'])} |"
            )
            print(f"batch {batch_size}: {p50:.2f}s", file=sys.stderr, flush=True)
    command = "python bench/model_bench.py " + " ".join(args.argv)
    device = args.ct2_device if args.engine == "ctranslate2" else engine.device
    lines = [
        f"Model: {what}; {engine.size}",
        f"Engine: {args.engine}, compute type {engine.compute_type}, on {device}; "
        f"loaded in {engine.load_s:.1f}s",
        f"Machine: {engine.machine()}",
        f"Work per segment: {args.in_tokens} input tokens, {args.out_tokens} output tokens "
        f"(pinned, the target language token included), greedy={args.num_beams == 1} "
        f"(beams {args.num_beams}), no_repeat_ngram_size {args.no_repeat_ngram}; "
        f"{args.repeats} timed runs after {args.warmup} warm-up",
        f"Resident memory of the measuring process (MiB): {mib(engine.before['VmRSS'])} "
        f"before loading the model (interpreter and engine imports); VmRSS after each batch "
        f"size's runs and VmHWM (peak so far) in the table",
        f"Command: `{command}`",
        "",
        "| batch size | latency p50 (s) | latency min-max (s) | segments/s | output tokens/s "
        "| ms per output token | VmRSS (MiB) | VmHWM (MiB) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]
    return "\n".join(lines)


def _sizes(value: str) -> list[int]:
    try:
        sizes = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {value!r}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("_"):
        return child(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="DIR",
                        help="a checkpoint directory or hub id; for ctranslate2 also a "
                        "converted directory")
    source.add_argument("--shape", choices=sorted(SHAPES) + sorted(TINY),
                        help="a real model's shape (tiny-*: the test checkpoints)")
    parser.add_argument("--engine", choices=ENGINES, default="transformers")
    parser.add_argument("--batch-sizes", type=_sizes, default=[1, 8, 32], metavar="1,8,32")
    parser.add_argument("--in-tokens", type=int, default=32)
    parser.add_argument("--out-tokens", type=int, default=40)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:0")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
        help="transformers: auto is float32 on CPU, bfloat16 (or float16) on CUDA",
    )
    parser.add_argument(
        "--compute-type", default="auto", choices=COMPUTE_TYPES,
        help="ctranslate2: auto is int8 on CPU, int8_float16 on CUDA (the service's defaults); "
        "also the conversion's quantization",
    )
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--no-repeat-ngram", type=int, default=NO_REPEAT_NGRAM_SIZE)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per batch size")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first")
    parser.add_argument("--workers", type=int, default=None,
                        help="ctranslate2 on CPU: parts of a batch run at once (default: as "
                        "the service, one per thread for d_model <= 512, else 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads / CTranslate2 intra_threads")
    args = parser.parse_args(argv)
    if args.out_tokens < 2 or args.in_tokens < 1:
        parser.error("--out-tokens must be at least 2 and --in-tokens at least 1")
    args.argv = argv
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
