"""Cut text into segments: sentences, lines, code fences and blanks.

The segmenter is incremental so that a stream's deltas can be fed as they arrive:
``feed`` returns the segments that are complete, ``flush`` the rest. Every character
fed comes out in exactly one segment, in order: the segments joined equal the input.
Whitespace after a boundary stays with the segment before it.

Boundaries: a sentence end (``.!?…`` followed by whitespace, ``。！？`` with or without),
a newline before more text, a code fence (one segment from its opening line through
its closing line), and the size bound (cut at the last whitespace before it).
Not boundaries: decimals, versions and file names (no whitespace after the dot),
abbreviations (``e.g.``, ``Mr.``), a dot before a lowercase word, ``1.`` list markers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "code", "blank"]

_CLOSERS = "\"'”’)\\]」』）》"
_BOUNDARY = re.compile(
    r"(?:\.\.\.|[.!?…])+[" + _CLOSERS + r"]*\s+(?=\S)"  # Latin-style end: whitespace needed
    r"|[。！？]+[" + _CLOSERS + r"]*\s*(?=\S)"  # CJK end: whitespace optional
    r"|\n\s*(?=\S)"  # a newline before more text
)
_FENCE_OPEN = re.compile(r"[ ]{0,3}(`{3,}|~{3,})")
_ABBREVIATIONS = frozenset(
    "e.g i.e cf vs mr mrs ms dr prof sr jr st no fig approx ca z.b d.h u.a bzw usw "
    "p.ex c.-à-d".split()
)
_TOKEN_BEFORE = re.compile(r"(\S+)$")
# Code pieces may run longer than prose before the size bound cuts them.
_CODE_BOUND_FACTOR = 8


@dataclass(frozen=True, slots=True)
class Piece:
    """A cut segment: its exact text and what kind of text it is."""

    text: str
    kind: Kind


@functools.lru_cache(maxsize=16)
def _fence_close(fence: str) -> re.Pattern[str]:
    return re.compile(
        r"^[ ]{0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*(?:\n|$)", re.M
    )


def _kind_of(text: str) -> Kind:
    return "blank" if not text.strip() else "text"


class Segmenter:
    """Incremental sentence segmenter; one per stream (or per one-shot text)."""

    def __init__(self, max_chars: int = 400) -> None:
        if max_chars < 16:
            raise ValueError(f"max_chars must be >= 16, got {max_chars}")
        self.max_chars = max_chars
        self._buf = ""
        self._fence: str | None = None  # the fence marker while inside a code block
        self._scan_from = 0  # no boundary starts before this offset of _buf
        self._body_start = 0  # inside a fence: where its body (after the opening line) starts

    @property
    def pending(self) -> str:
        """Text fed but not yet part of a segment."""
        return self._buf

    def feed(self, text: str) -> list[Piece]:
        """Add text; return the segments it completed."""
        if not text:
            return []
        self._buf += text
        out: list[Piece] = []
        while True:
            piece = self._next_piece()
            if piece is None:
                return out
            out.append(piece)

    def flush(self, *, final: bool = True) -> list[Piece]:
        """Return everything pending as segments.

        ``final=False`` (a stream gone idle) keeps an open code fence open, so that the
        rest of the code block that arrives later is still code, not prose.
        """
        if not self._buf:
            return []
        kind: Kind = "code" if self._fence is not None else _kind_of(self._buf)
        out = [Piece(self._buf, kind)]
        self._buf = ""
        self._scan_from = 0
        if final:
            self._fence = None
        elif self._fence is not None:
            self._body_start = 0
        return out

    def _take(self, end: int, kind: Kind) -> Piece:
        piece = Piece(self._buf[:end], kind)
        self._buf = self._buf[end:]
        self._scan_from = 0
        return piece

    def _next_piece(self) -> Piece | None:
        buf = self._buf
        if not buf:
            return None
        if self._fence is None:
            stripped = buf.lstrip(" \t\n\r")
            m = _FENCE_OPEN.match(stripped)
            if m:
                self._fence = m.group(1)
                self._body_start = -1  # the opening line is not complete yet
                self._scan_from = len(buf) - len(stripped) + len(m.group(0))
            elif stripped and len(stripped) < 3 and not stripped.strip("`~"):
                return None  # "``" could still become a fence: wait for more
        if self._fence is not None:
            return self._next_code_piece()
        return self._next_text_piece()

    def _next_text_piece(self) -> Piece | None:
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        for m in _BOUNDARY.finditer(buf, self._scan_from):
            if m.start() < lead:
                continue  # leading whitespace belongs to the segment it leads
            if self._is_false_end(buf, m):
                continue
            if m.end() >= self.max_chars:
                break  # at or past the size bound: cut there, as deltas would have
            return self._take(m.end(), "text")
        # No boundary yet: a later one needs its terminator and whitespace, so the
        # next scan restarts shortly before the end instead of at the start.
        self._scan_from = max(0, len(buf) - 8)
        if len(buf) >= self.max_chars:
            return self._take(self._cut_point(buf, self.max_chars), _kind_of(buf))
        return None

    def _next_code_piece(self) -> Piece | None:
        buf = self._buf
        fence = self._fence
        assert fence is not None
        if self._body_start < 0:
            newline = buf.find("\n", self._scan_from)
            if newline < 0:
                self._scan_from = len(buf)
                return None
            self._body_start = self._scan_from = newline + 1
        close = _fence_close(fence)
        bound = self.max_chars * _CODE_BOUND_FACTOR
        m = close.search(buf, max(self._scan_from, self._body_start))
        if m is not None and m.end() > bound:
            m = None  # past the code bound: cut there, as deltas would have
        if m is not None and m.group(0).endswith("\n"):
            stripped = buf[m.end() :].lstrip()
            if not stripped:
                self._scan_from = m.start()
                return None  # whitespace may go on; it joins the code segment
            self._fence = None
            return self._take(len(buf) - len(stripped), "code")
        if len(buf) >= bound:
            cut = buf.rfind("\n", 0, bound)
            piece = self._take(cut + 1 if cut > 0 else bound, "code")
            self._body_start = 0  # still inside the fence, now at a line start
            return piece
        self._scan_from = max(self._body_start, buf.rfind("\n") + 1)
        return None

    @staticmethod
    def _is_false_end(buf: str, m: re.Match[str]) -> bool:
        text = m.group(0)
        if text[0] != "." or "\n" in text:
            return False  # a newline before more text ends a segment whatever precedes it
        if text.startswith("..."):
            return False
        nxt = buf[m.end()] if m.end() < len(buf) else ""
        if nxt.islower():
            return True  # "e.g. the", "approx. five": a sentence goes on
        before = _TOKEN_BEFORE.search(buf, 0, m.start())
        if before is None:
            return False
        token = before.group(1)
        if token.lower().rstrip(".") in _ABBREVIATIONS:
            return True
        line_start = buf.rfind("\n", 0, before.start()) + 1
        # "1. First step": a list marker at the start of a line, not a sentence end.
        return token.isdigit() and not buf[line_start : before.start()].strip()

    @staticmethod
    def _cut_point(buf: str, bound: int) -> int:
        cut = max(buf.rfind(" ", 0, bound), buf.rfind("\n", 0, bound))
        if cut >= bound // 2:
            return cut + 1
        # Prefer a CJK comma or other pause over a cut mid-word.
        for mark in "，、；：,;":
            i = buf.rfind(mark, bound // 2, bound)
            if i >= 0:
                return i + 1
        return bound


def segment(text: str, max_chars: int = 400) -> list[Piece]:
    """Cut a whole text into segments."""
    seg = Segmenter(max_chars)
    return [*seg.feed(text), *seg.flush()]


_CODE_SPAN = re.compile(r"`[^`\n]*`")
_URL = re.compile(r"\b(?:https?|ftp)://\S+|\bwww\.\S+", re.IGNORECASE)
_LATEX = re.compile(r"\$\$?[^$]*\$\$?|\\[a-zA-Z]+")
_IDENTIFIER = re.compile(
    r"\b\w*(?:_\w*|\.\w+\(?|[a-z][A-Z]\w*|\d[A-Za-z]\w*|[A-Za-z]\d\w*)\b|\w+\(\)?"
)
_WORD = re.compile(r"[^\W\d_]{2,}")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CODE_MARKS = re.compile(r"[=(){}\[\];<>]")


def is_translatable(text: str) -> bool:
    """Whether a text segment holds prose, not only code, math, numbers, URLs or punctuation."""
    if _CJK.search(text):
        return True
    rest = _LATEX.sub(" ", _URL.sub(" ", _CODE_SPAN.sub(" ", text)))
    words = _WORD.findall(_IDENTIFIER.sub(" ", rest))
    if not words:
        return False
    if _CODE_MARKS.search(rest):
        letters = sum(len(w) for w in words)
        nonspace = sum(1 for ch in rest if not ch.isspace())
        return letters / max(nonspace, 1) >= 0.34
    return True
