"""What a stream's memory does for short segments, on the held-out pairs and words.

    .venv/bin/python bench/stream_memory.py [--eval tests/data/detect_heldout.tsv]

Each pair or word of the set is placed, as a segment of its own, in a stream of one of two
shapes, and decided by the service's own ``decide`` (with ``leans_on_memory``, as
``service/stream/cutting.py`` does):

- *between*: the segments before and after it are reliably in its own language;
- *switch*: the segment before it is reliably in another language of the same script
  (en <-> de, fr <-> es, ru -> uk, zh <-> ja), the one after it in its own: the segment
  opens a new part of the stream.

Three ways of deciding: *detection alone* (no memory); *memory* (the recent language for
an unclear segment, as before issue 18; ``THINKTRANS_STREAM_MEMORY_WAIT_MS=0``); *memory
with the next segment* (the default: an unclear segment waits for the next one; between
two of the recent language it is that language, before another it keeps its own
detection). A segment counts as right when the language it is sent as, or kept as, is its
label's.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

from service.text.decide import decide, leans_on_memory, settled_memory
from service.text.detect import Detection, get_detector
from service.text.tags import base_language

EVAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "detect_heldout.tsv"
AS_TAG = {"zh": "zh-Hans"}
OTHER = {"en": "de", "de": "en", "fr": "es", "es": "fr", "ru": "uk", "zh": "ja", "ja": "zh-Hans",
         "ko": None}


def language(det: Detection, before: str | None, after: str | None, mode: str) -> str | None:
    """The language a segment is decided to be in (target None: nothing is the same)."""
    memory = before if mode != "alone" else None
    if mode == "next" and leans_on_memory(det, before):  # held, then settled by the next
        memory = settled_memory(before, after)
    return decide(True, target="xx", detection=det, fallback_lang=memory,
                  policy="translate").source_lang


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--eval", type=Path, default=EVAL)
    args = parser.parse_args()
    with args.eval.open(encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                if r["kind"] in ("pair", "word")]
    detector = get_detector("default")
    modes = {"alone": "detection alone", "memory": "memory",
             "next": "memory with the next segment (default)"}
    hits: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        det = detector.detect(row["text"])
        own = AS_TAG.get(row["lang"], row["lang"])
        shapes = {"between": (own, own)}
        if OTHER[row["lang"]]:
            shapes["switch"] = (OTHER[row["lang"]], own)
        for shape, (before, after) in shapes.items():
            for mode in modes:
                lang = language(det, before, after, mode)
                ok = lang is not None and base_language(lang) == row["lang"]
                hits[shape, row["kind"], mode][0] += ok
                hits[shape, row["kind"], mode][1] += 1
    print("| stream | kind | " + " | ".join(modes.values()) + " |")
    print("| --- | --- |" + " --- |" * len(modes))
    for shape in ("between", "switch"):
        for kind in ("pair", "word"):
            cells = []
            for mode in modes:
                right, total = hits[shape, kind, mode]
                cells.append(f"{right / total:.3f}")
            print(f"| {shape} | {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
