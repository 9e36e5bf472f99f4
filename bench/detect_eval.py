"""Detection accuracy and speed per detector and kind of text.

    .venv/bin/python bench/detect_eval.py [--detector default --detector lingua]
        [--eval tests/data/detect_heldout.tsv] [--by-language] [--errors N]

The evaluation sets are built by ``bench/build_detect_eval.py`` from Debian's translated
package descriptions and the Universal Declaration of Human Rights; ``detect_eval.tsv`` is
the older hand-written set. An answer is right when its language subtag is the label's.
Time per text is the median of ``--repeat`` first passes over the set, each in a fresh
detector with empty caches, so nearly every word is new; "again" is one more pass on full
caches, as a stream's recurring words find them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections import defaultdict
from pathlib import Path

from service.text.detect import clear_caches, get_detector
from service.text.tags import base_language

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
EVAL = DATA / "detect_heldout.tsv"
KINDS = ("sentence", "pair", "phrase", "word")


def load(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--detector", action="append", default=None)
    parser.add_argument("--eval", type=Path, default=EVAL)
    parser.add_argument("--by-language", action="store_true",
                        help="one row per detector and language")
    parser.add_argument("--errors", type=int, default=0, help="print this many misses")
    parser.add_argument("--repeat", type=int, default=3,
                        help="time this many first passes, each on fresh caches (median)")
    args = parser.parse_args()
    rows = load(args.eval)
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    print(f"| detector | {' | '.join(kinds)} | time per text | again |")
    print(f"| --- | {' | '.join('---' for _ in kinds)} | --- | --- |")
    for name in args.detector or ["default", "lingua", "langdetect"]:
        hits: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        misses = []
        cold: list[float] = []
        for attempt in range(args.repeat):
            clear_caches()
            detector = get_detector(name)
            detector.warm_up()
            spent = 0.0
            for row in rows:
                started = time.perf_counter()
                det = detector.detect(row["text"])
                spent += time.perf_counter() - started
                if attempt:
                    continue
                ok = det.lang is not None and base_language(det.lang) == row["lang"]
                for key in ((row["kind"], ""), (row["kind"], row["lang"])):
                    hits[key][0] += ok
                    hits[key][1] += 1
                if not ok:
                    misses.append((row["lang"], row["kind"], det.lang, row["text"]))
            cold.append(spent)
        per_text_us = statistics.median(cold) / len(rows) * 1e6
        started = time.perf_counter()  # again: the words are in the detector's caches now
        for row in rows:
            detector.detect(row["text"])
        again_us = (time.perf_counter() - started) / len(rows) * 1e6
        groups = [""] + (sorted({r["lang"] for r in rows}) if args.by_language else [])
        for lang in groups:
            cells = []
            for kind in kinds:
                right, total = hits[kind, lang]
                cells.append(f"{right / total:.3f} ({right}/{total})" if total else "-")
            label = f"{name} {lang}".strip()
            print(f"| {label} | {' | '.join(cells)} | {per_text_us:.0f} µs | {again_us:.0f} µs |")
        for miss in misses[: args.errors]:
            print("  miss", *miss)


if __name__ == "__main__":
    main()
