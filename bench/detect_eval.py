"""Detection accuracy and speed on tests/data/detect_eval.tsv, per detector and kind.

    .venv/bin/python bench/detect_eval.py [--detector default --detector langdetect]
"""

from __future__ import annotations

import argparse
import csv
import time
from collections import defaultdict
from pathlib import Path

from service.detect import get_detector
from service.locale import base_language

EVAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "detect_eval.tsv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--detector", action="append", default=None)
    parser.add_argument("--eval", type=Path, default=EVAL)
    args = parser.parse_args()
    with args.eval.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    print("| detector | sentences | two-word phrases | time per text |")
    print("| --- | --- | --- | --- |")
    for name in args.detector or ["default", "langdetect"]:
        detector = get_detector(name)
        detector.detect("warm up the profiles")
        hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        started = time.perf_counter()
        for row in rows:
            det = detector.detect(row["text"])
            ok = det.lang is not None and base_language(det.lang) == row["lang"]
            hits[row["kind"]][0] += ok
            hits[row["kind"]][1] += 1
        per_text_us = (time.perf_counter() - started) / len(rows) * 1e6
        acc = {k: f"{a / b:.3f} ({a}/{b})" for k, (a, b) in hits.items()}
        print(f"| {name} | {acc['sentence']} | {acc['phrase']} | {per_text_us:.0f} µs |")


if __name__ == "__main__":
    main()
