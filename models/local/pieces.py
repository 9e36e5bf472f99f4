"""Texts into pieces the model takes, and the translated pieces back into texts.

A text keeps its leading and trailing whitespace; a blank text skips the model. A text longer
than the input bound is cut at sentence ends, then between words, then (text without spaces)
at character midpoints (``split_text``), never inside a stretch it is told to keep whole (a
placeholder, a protected span); its translated pieces are rejoined with the whitespace that
separated them, none for targets written without spaces unless it was a newline
(``rejoin``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_SENTENCE_END = re.compile(r"(?<=[.!?;:…])\s+|(?<=[。！？；])\s*")
_WORD_END = re.compile(r"(?<=\s)(?=\S)")


# Stretches of a text that no cut may fall inside: (start, end) offsets, end exclusive.
Keep = Sequence[tuple[int, int]]


def split_text(text: str, count_tokens: Callable[[str], int], max_tokens: int,
               keep: Keep = ()) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_tokens`` tokens; joined, they give ``text``.

    Cuts fall at sentence ends first, then between words, then (for text without spaces) at
    character midpoints, but never inside a stretch of ``keep`` (a piece holding one may
    then run over the bound). Each piece keeps the whitespace that followed it.
    """
    if count_tokens(text) <= max_tokens:
        return [text]
    inside = {k for start, end in keep for k in range(start + 1, end)}
    atoms: list[str] = []
    for at, sentence in _cut(text, _SENTENCE_END, 0, inside):
        if count_tokens(sentence) <= max_tokens:
            atoms.append(sentence)
            continue
        for word_at, word in _cut(sentence, _WORD_END, at, inside):
            atoms.extend(_halve(word, word_at, count_tokens, max_tokens, inside))
    pieces: list[str] = []
    for atom in atoms:
        # Whitespace-only atoms never stand alone: they belong to the piece before.
        if pieces and (not atom.strip() or count_tokens(pieces[-1] + atom) <= max_tokens):
            pieces[-1] += atom
        else:
            pieces.append(atom)
    return pieces


def _cut(text: str, pattern: re.Pattern[str], at: int, inside: set[int]
         ) -> list[tuple[int, str]]:
    """Split after each match of ``pattern``, keeping the matched whitespace on the left piece;
    each piece with its offset (``text`` starts at ``at`` of the whole); no cut at a position
    in ``inside``."""
    out, start = [], 0
    for match in pattern.finditer(text):
        end = match.end()
        if start < end < len(text) and at + end not in inside:
            out.append((at + start, text[start:end]))
            start = end
    out.append((at + start, text[start:]))
    return [(where, piece) for where, piece in out if piece]


def _halve(text: str, at: int, count_tokens: Callable[[str], int], max_tokens: int,
           inside: set[int]) -> list[str]:
    if len(text) <= 1 or count_tokens(text) <= max_tokens:
        return [text]
    mid = _free_cut(len(text), at, inside)
    if mid is None:  # all of it one stretch to keep: it goes whole
        return [text]
    return (_halve(text[:mid], at, count_tokens, max_tokens, inside)
            + _halve(text[mid:], at + mid, count_tokens, max_tokens, inside))


def _free_cut(length: int, at: int, inside: set[int]) -> int | None:
    """The cut nearest the middle of a piece of ``length`` at ``at`` that falls inside no
    stretch to keep; None when every one does."""
    mid = length // 2
    for step in range(length):
        for cut in (mid - step, mid + step):
            if 0 < cut < length and at + cut not in inside:
                return cut
    return None


@dataclass
class Part:
    """A piece of one input text that goes through the model on its own."""

    index: int  # which input text
    text: str  # without surrounding whitespace
    sep: str  # whitespace that followed it in the source
    start: int = 0  # where ``text`` starts in its input text
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
              max_tokens: int, keep: Sequence[Keep] | None = None) -> Pieces:
    """Each non-blank text, stripped and split into parts of at most ``max_tokens``, never
    inside a stretch of its ``keep`` (offsets into the text); each part's ``n_tokens``
    counted."""
    pieces = Pieces(list(texts), [], [], [])
    for i, text in enumerate(texts):
        core = text.strip()
        lead = text[: len(text) - len(text.lstrip())]
        pieces.leads.append(lead)
        pieces.trails.append(text[len(text.rstrip()) :] if core else "")
        if not core:
            continue
        shift = len(lead)
        own = [(start - shift, end - shift) for start, end in keep[i]] if keep else ()
        split = split_text(core, count_tokens, max_tokens, own)
        if len(split) > 1:
            pieces.split += 1
        at = shift
        for piece in split:
            stripped = piece.rstrip()
            pieces.parts.append(Part(i, stripped, piece[len(stripped) :], at))
            at += len(piece)
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
