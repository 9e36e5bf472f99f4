"""What keeping protected spans costs the local backend, per family and engine.

    .venv/bin/python bench/spans_bench.py --rounds 2 --threads 2

On the tiny random-weight test checkpoints of the three families (``make_test_model``: NLLB,
M2M-100, Marian en-de), on each engine installed (transformers fp32, CTranslate2 int8), a
``LocalTranslator`` in this process translates a fixed list of reasoning sentences with inline
spans (code, paths, URLs, versions, math, identifiers, a glossary term; English, Chinese,
Japanese, German, Russian: every one has spans) as one batch, target ``de``, source ``en``
(Marian serves en-de only), three ways:

- ``plain``: without protection (``Job.protected`` None): the baseline;
- ``mask``: with the spans (``local_span_strategy`` mask): masked with the family's
  placeholders, and each text whose placeholders came back lost translated again as its
  prose runs, in a second engine call for the batch;
- ``runs``: with the spans, ``local_span_strategy`` runs: every text as its prose runs, in
  one engine call.

One untimed round warms each mode; then ``--rounds`` timed rounds, each the whole batch as one
``run``. ms per text = the rounds' wall time / (rounds x texts). The fallback share is the
share of texts whose spans the ``mask`` mode kept by their runs (``info()["spans"]``). Every
output of ``mask`` and ``runs`` is checked to hold every span's ``out``; the run stops if one
does not. Random weights lose every placeholder, so ``mask`` pays for both calls on every
text here: the worst case; with a real checkpoint that keeps them it costs ``plain`` and the
masking's bookkeeping, which the last line measures without an engine (an echo of the masked
texts through ``SpanBatch``, per text).

Prints the machine, the command and a table; ``--workdir DIR`` keeps the checkpoints and the
conversion cache for a later run (conversion takes a few seconds per family).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import platform
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models.base import Job
from models.local import LocalTranslator
from models.local.masking import FORMS, SpanBatch
from models.spans import Glossary, Protected, SpanFinder
from service.settings import load_settings

FAMILIES = ("nllb", "m2m100", "marian")
GLOSSARY = Glossary.of({"sidecar": "Beiwagen"}, ["thinktrans"])
SENTENCES = [
    "First I run `pip install -e .` and then open config.yaml to check the version 2.13.0.",
    "The sidecar sends each batch to https://pool.example.com/v1/batch within 250 ms.",
    "So the loop is O(n log n), and a[i] == b[j] holds when parse_args() returns early.",
    "Let me rewrite $x^2 + 1$ as \\frac{a}{b} and pass --dry-run to thinktrans.",
    "Maybe the bug is in src/cache.py, where evict_oldest() drops 64 entries at once.",
    "我需要检查 src/app.py 里的 parse_args() 函数，然后运行 `pytest -q`。",
    "用户说 thinktrans 在 v1.2.3 之后变慢了，大约 120 ms。",
    "まず `npm install` を実行して、~/.config/app.toml を確認します。",
    "このエラー \"ModuleNotFoundError: No module named 'yaml'\" は README.md にあります。",
    "Ich prüfe zuerst die Datei requirements.txt und rufe dann `make test` auf.",
    "Сначала я открою main.py и проверю функцию load_config() в строке 42.",
    "Ответ приходит на user@example.com, а версия Python 3.11.7 уже установлена.",
]


def protected_list() -> list[Protected]:
    finder = SpanFinder()
    out = []
    for text in SENTENCES:
        found = finder.find(text, GLOSSARY)
        assert found is not None, text
        out.append(found)
    return out


async def measure(model: Path, engine: str, threads: int | None, rounds: int,
                  ct2_cache: Path) -> dict[str, float]:
    """ms per text for each mode, and the share of texts the mask mode kept by their runs."""
    protected = protected_list()
    figures: dict[str, float] = {}
    base = load_settings(local_model=str(model), local_engine=engine, local_threads=threads,
                         local_ct2_cache=str(ct2_cache), local_dtype="float32",
                         local_compute_type="int8" if engine == "ctranslate2" else "auto",
                         ).local_config()
    for mode in ("plain", "mask", "runs"):
        config = dataclasses.replace(base, span_strategy="runs" if mode == "runs" else "mask")
        backend = LocalTranslator(config)
        await backend.start()
        if not await backend.wait_ready(300):
            raise SystemExit(f"{model} on {engine} did not load: {backend.reason}")
        job = Job(SENTENCES, "en", "de", protected=None if mode == "plain" else protected)
        try:
            await backend.run(job)  # warm
            before = dict(backend.stats.__dict__)
            started = time.perf_counter()
            for _ in range(rounds):
                out = await backend.run(job)
                if mode != "plain":
                    lost = [p.text for p, o in zip(protected, out, strict=True) if p.missing(o)]
                    if lost:
                        raise SystemExit(f"{mode} on {model.name}/{engine} lost spans: {lost}")
            seconds = time.perf_counter() - started
            figures[mode] = 1000 * seconds / (rounds * len(SENTENCES))
            if mode == "mask":
                masked = backend.stats.spans_masked - before["spans_masked"]
                fallback = backend.stats.spans_fallback - before["spans_fallback"]
                figures["fallback_share"] = fallback / max(masked + fallback, 1)
            figures[f"{mode}_calls"] = ((backend.stats.generate_calls - before["generate_calls"])
                                        / rounds)
        finally:
            await backend.aclose()
    return figures


def bookkeeping_us(rounds: int = 200) -> float:
    """Masking and restoring alone (no engine: the masked texts echoed), µs per text."""
    protected = protected_list()
    form = FORMS["nllb"]
    started = time.perf_counter()
    for _ in range(rounds):
        batch = SpanBatch(SENTENCES, protected, form)
        assert not batch.settle(batch.first)
        batch.finish([])
    return 1e6 * (time.perf_counter() - started) / (rounds * len(SENTENCES))


def machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    packages = []
    for name in ("torch", "transformers", "ctranslate2"):
        try:
            packages.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return (f"{platform.machine()} {platform.processor() or ''}".strip()
            + f", {cores} cores usable, Python {platform.python_version()}, "
            + ", ".join(packages))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None,
                        help="the engines' CPU threads (default: theirs)")
    parser.add_argument("--engines", default=",".join(
        ["transformers"] + (["ctranslate2"] if find_spec("ctranslate2") else [])))
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    from service.ops.logs import no_progress_bars
    from service.tools.testmodel import make_test_model

    no_progress_bars()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        rows = []
        for family in args.families.split(","):
            model = work / f"tiny-{family}"
            if not (model / "config.json").exists():
                make_test_model(family, model)
            for engine in args.engines.split(","):
                figures = asyncio.run(measure(model, engine, args.threads, args.rounds,
                                              work / "ct2-cache"))
                rows.append((family, engine, figures))
        print(f"machine: {machine()}")
        print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
        print(f"{len(SENTENCES)} sentences with spans, one batch, {args.rounds} timed rounds\n")
        print("| family | engine | plain ms/text | mask ms/text | runs ms/text | mask/plain "
              "| runs/plain | fallback share (mask) | generate calls per batch "
              "(plain/mask/runs) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for family, engine, f in rows:
            print(f"| {family} | {engine} | {f['plain']:.1f} | {f['mask']:.1f} | {f['runs']:.1f} "
                  f"| {f['mask'] / f['plain']:.2f} | {f['runs'] / f['plain']:.2f} "
                  f"| {f['fallback_share']:.0%} "
                  f"| {f['plain_calls']:g}/{f['mask_calls']:g}/{f['runs_calls']:g} |")
        print(f"\nmasking bookkeeping alone (SpanBatch, no engine): {bookkeeping_us():.0f} µs "
              "per text")
        print(f"total: {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
