"""Corpora for `compare` and `bench`: plain text, JSONL or TSV, or the built-in sample."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from service.exceptions import InputError


@dataclass(frozen=True, slots=True)
class CorpusItem:
    text: str
    ref: str | None = None


def builtin_corpus() -> list[CorpusItem]:
    """Reasoning-style text in several languages, shipped with the package."""
    raw = resources.files("service.data").joinpath("sample_corpus.jsonl").read_text("utf-8")
    return _parse_jsonl(raw.splitlines(), "built-in sample")


def read_lines(path: Path, what: str) -> list[str]:
    """A UTF-8 text file's lines, or InputError naming ``what`` and why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{what} {str(path)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {str(path)!r} is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {str(path)!r}: {exc.strerror}") from None


def load_corpus(path: str | Path | None) -> list[CorpusItem]:
    """Read a corpus: ``.jsonl`` (``text``, optional ``ref``), ``.tsv`` (text, reference),
    else plain text with one item per line. Raises InputError naming the bad line."""
    if path is None:
        return builtin_corpus()
    p = Path(path)
    lines = read_lines(p, "corpus file")
    if p.suffix == ".jsonl":
        items = _parse_jsonl(lines, str(p))
    elif p.suffix == ".tsv":
        items = []
        for line in lines:
            if not line.strip():
                continue
            text, _, ref = line.partition("\t")
            items.append(CorpusItem(text, ref or None))
    else:
        items = [CorpusItem(line) for line in lines if line.strip()]
    if not items:
        raise InputError(f"corpus file {str(p)!r} holds no text")
    return items


def _parse_jsonl(lines: list[str], where: str) -> list[CorpusItem]:
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where} line {n} is not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise InputError(f"{where} line {n} needs a string field 'text'")
        ref = obj.get("ref")
        if ref is not None and not isinstance(ref, str):
            raise InputError(f"{where} line {n}: 'ref' must be a string")
        items.append(CorpusItem(obj["text"], ref))
    return items
