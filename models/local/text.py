"""Texts into pieces the model takes, and the translated pieces back into texts.

A text keeps its leading and trailing whitespace; a blank text skips the model. A text longer
than the input bound is cut at sentence ends, then between words, then (text without spaces)
at character midpoints (``split_text``); its translated pieces are rejoined with the
whitespace that separated them, none for targets written without spaces unless it was a
newline (``rejoin``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_SENTENCE_END = re.compile(r"(?<=[.!?;:…])\s+|(?<=[。！？；])\s*")
_WORD_END = re.compile(r"(?<=\s)(?=\S)")


def split_text(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_tokens`` tokens; joined, they give ``text``.

    Cuts fall at sentence ends first, then between words, then (for text without spaces) at
    character midpoints. Each piece keeps the whitespace that followed it.
    """
    if count_tokens(text) <= max_tokens:
        return [text]
    atoms: list[str] = []
    for sentence in _cut(text, _SENTENCE_END):
        if count_tokens(sentence) <= max_tokens:
            atoms.append(sentence)
            continue
        for word in _cut(sentence, _WORD_END):
            atoms.extend(_halve(word, count_tokens, max_tokens))
    pieces: list[str] = []
    for atom in atoms:
        # Whitespace-only atoms never stand alone: they belong to the piece before.
        if pieces and (not atom.strip() or count_tokens(pieces[-1] + atom) <= max_tokens):
            pieces[-1] += atom
        else:
            pieces.append(atom)
    return pieces


def _cut(text: str, pattern: re.Pattern[str]) -> list[str]:
    """Split after each match of ``pattern``, keeping the matched whitespace on the left piece."""
    out, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start and match.end() < len(text):
            out.append(text[start : match.end()])
            start = match.end()
    out.append(text[start:])
    return [piece for piece in out if piece]


def _halve(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    if len(text) <= 1 or count_tokens(text) <= max_tokens:
        return [text]
    mid = len(text) // 2
    return _halve(text[:mid], count_tokens, max_tokens) + _halve(
        text[mid:], count_tokens, max_tokens
    )


@dataclass
class Part:
    """A piece of one input text that goes through the model on its own."""

    index: int  # which input text
    text: str  # without surrounding whitespace
    sep: str  # whitespace that followed it in the source
    n_tokens: int = 0
    out: str = ""  # its translation, once done


@dataclass
class Pieces:
    """A batch's texts cut into parts, with the whitespace the model never sees."""

    texts: list[str]
    parts: list[Part]
    leads: list[str]
    trails: list[str]
    split: int = 0  # texts cut into more than one part


def cut_texts(texts: Sequence[str], count_tokens: Callable[[str], int],
              max_tokens: int) -> Pieces:
    """Each non-blank text, stripped and split into parts of at most ``max_tokens``; each
    part's ``n_tokens`` counted."""
    pieces = Pieces(list(texts), [], [], [])
    for i, text in enumerate(texts):
        core = text.strip()
        pieces.leads.append(text[: len(text) - len(text.lstrip())])
        pieces.trails.append(text[len(text.rstrip()) :] if core else "")
        if not core:
            continue
        split = split_text(core, count_tokens, max_tokens)
        if len(split) > 1:
            pieces.split += 1
        for piece in split:
            stripped = piece.rstrip()
            pieces.parts.append(Part(i, stripped, piece[len(stripped) :]))
    for part in pieces.parts:
        part.n_tokens = count_tokens(part.text)
    return pieces


def rejoin(pieces: Pieces, no_space: bool) -> list[str]:
    """The texts again, each part replaced by its ``out``: the separators between parts (a
    space at least, none for a ``no_space`` target unless it was a newline) and each text's
    own leading and trailing whitespace; a blank text as it was."""
    by_text: list[list[Part]] = [[] for _ in pieces.texts]
    for part in pieces.parts:
        by_text[part.index].append(part)
    results = []
    for text, lead, trail, own in zip(pieces.texts, pieces.leads, pieces.trails, by_text,
                                      strict=True):
        if not own:
            results.append(text)
            continue
        joined = []
        for j, part in enumerate(own):
            joined.append(part.out)
            if j < len(own) - 1:
                sep = part.sep or " "
                joined.append("" if no_space and "\n" not in sep else sep)
        results.append(lead + "".join(joined) + trail)
    return results
