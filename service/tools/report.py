"""Presenting compare's and bench's figures: tables, markdown, a plot, a progress bar.

``service.tools.compare`` and ``service.tools.bench`` measure and build plain dicts (the JSON
shapes); everything here only draws those dicts, and imports rich or matplotlib when drawing.
"""

from __future__ import annotations

import importlib.util
import io
import math
import random
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.exceptions import ConfigError, InputError
from service.tools.compare import STATUSES, BackendRun

# -- progress --------------------------------------------------------------------------------


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


# -- compare ---------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}"


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
        ("segments with spans", [_fmt(b["span_segments"]) for b in backends]),
        ("  spans intact (%)", [_pct(b["spans_intact"]) for b in backends]),
    ]
    if any(b["glossary_terms"] for b in backends):
        out.append(("glossary terms", [_fmt(b["glossary_terms"]) for b in backends]))
        out.append(("  applied (%)", [_pct(b["glossary_applied"]) for b in backends]))
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


def check_plot(path: Path) -> None:
    """Fail before a long run, not after it, when the plot cannot be written."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot needs 'matplotlib': pip install 'thinktrans[compare]'")
    if not path.parent.is_dir():
        raise InputError(f"cannot write plot {str(path)!r}: its directory does not exist")


def write_plot(report: dict[str, Any], runs: Sequence[BackendRun], path: str | Path) -> None:
    """A PNG: per-text latency distributions (box per backend) beside throughput bars."""
    fig = plot_figure(report, runs)  # ConfigError, in one line, without matplotlib
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InputError(f"cannot write plot {str(path)!r}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def plot_figure(report: dict[str, Any], runs: Sequence[BackendRun]) -> Any:
    """The compare figure (matplotlib's Figure; the caller closes it)."""
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

    # The legend has the right-hand column to itself, below the title's band; the title is
    # centred over the plots and wrapped to their width (a corpus path can be long).
    fig.legend(handles=[Patch(facecolor=c, alpha=0.7, label=lab)
                        for c, lab in zip(colors, labels, strict=True)],
               loc="center right", bbox_to_anchor=(1.0, 0.5), title="backend")
    title = textwrap.fill(f"thinktrans compare: {caption(report)}", width=110)
    fig.suptitle(title, fontsize=10, x=0.44)
    fig.tight_layout(rect=(0, 0, 0.85, 1))  # room for the title: tight_layout makes it
    return fig


# -- bench -----------------------------------------------------------------------------------


def format_bench_table(summary: dict[str, Any]) -> str:
    """`thinktrans bench`'s summary as a plain two-column table."""
    pairs = []
    for key, value in summary.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        pairs.append((key.replace("_", " "), str(value)))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in pairs)
