"""Cut text into segments: sentences, lines, code fences and blanks.

A sentence is the unit of detection, translation and output, and a stream's deltas come
a few characters at a time: the segmenter is incremental (``feed`` gives the segments
complete, ``flush`` the rest) and cuts the same whatever the chunking. Every character fed
comes out in exactly one segment, in order: the segments joined equal the input.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "code", "blank"]

_CLOSERS = "\"'”’)\\]」』）》"
_BOUNDARY = re.compile(
    r"(?:\.\.\.|[.!?…])+[" + _CLOSERS + r"]*\s+(?=\S)"  # Latin-style end: whitespace needed
    # CJK end: whitespace optional, so the closers and the terminators are taken whole
    # before it is one (a delta that ends in "。" before its "」" or its second "。" must
    # not cut between them).
    r"|[。！？]+[" + _CLOSERS + r"]*\s*(?=[^\s。！？" + _CLOSERS + r"])"
    r"|\n\s*(?=\S)"  # a newline before more text
)
_FENCE_OPEN = re.compile(r"[ ]{0,3}(`{3,}|~{3,})")
# A line that closes a fence of its character at most as long as its run.
_CLOSER = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})[ \t\r]*\n", re.M)
# The start of a line that may still become one.
_CLOSER_HEAD = re.compile(r"[ ]{0,3}(?:(?:`+|~+)[ \t\r]*)?")
_ABBREVIATIONS = frozenset(
    "e.g i.e cf vs mr mrs ms dr prof sr jr st no fig approx ca z.b d.h u.a bzw usw "
    "p.ex ex c.-à-d".split()
)
# What may open an inline code span or inline math; a dollar before an amount ("$5. Then",
# "$6,768 saved", "$160-$240") is a price, as models.spans has it, not math.
_SPAN_OPENER = re.compile(r"[`$]")
_PRICE = re.compile(r"\$[\d.,]*\d(?:[\s)\-–]|[.,;:!?](?:\s|$)|$)", re.ASCII)
# Whitespace as ``models.spans`` reads it (its patterns are ASCII): a dollar after "\x1f"
# closes math there, so it must here too.
_SPACE = frozenset(" \t\n\r\f\v")
# The word before a period is looked back at this far at most: every abbreviation and list
# number is shorter, and a longer word is neither (so a long word before many of them is not
# read again at each).
_WORD_LOOK_BACK = 32
# Code pieces may run longer than prose before the size bound cuts them.
_CODE_BOUND_FACTOR = 8


@dataclass(frozen=True, slots=True)
class Piece:
    """A cut segment: its exact text and what kind of text it is."""

    text: str
    kind: Kind


class _Closers:
    """Lines that could close a fence (a run of 3+ backticks or tildes alone on its line),
    found once each as the text goes by, per fence character, so that a stray fence
    answered by another one is not a rescan of the text after it.

    Each line links to the next one with a longer run: the first line after a position
    whose run is at least n long is found in a few jumps, however many shorter ones lie
    between. Positions are offsets in the whole text fed.
    """

    def __init__(self) -> None:
        self.frontier = 0  # lines starting before it have been looked at
        self.head = ""  # the start of the line at the frontier when it lies before the buffer
        self.checked = 0  # no newline between the frontier and here
        self._runs: dict[str, _Runs] = {"`": _Runs(), "~": _Runs()}

    def scan(self, buf: str, base: int, upto: int) -> None:
        """Look at the lines of ``buf`` (at offset ``base``) that end by ``upto``."""
        start = self.frontier - base
        stop = min(upto - base, len(buf))
        if start < 0:  # an idle flush took the start of this line: finish it first
            newline = buf.find("\n", max(self.checked - base, 0), stop)
            if newline < 0:
                self.checked = max(self.checked, base + stop)
                return
            line = self.head + buf[: newline + 1]
            m = _CLOSER.fullmatch(line)
            if m:
                self._runs[m.group(1)[0]].add(self.frontier, base + newline + 1, len(m.group(1)))
            self.head = ""
            start = newline + 1
            self.frontier = base + start
        # Only a newline that came since the last look completes a line.
        newline = buf.rfind("\n", max(start, self.checked - base), stop)
        self.checked = max(self.checked, base + stop)
        if newline < 0:
            return
        for m in _CLOSER.finditer(buf, start, newline + 1):
            self._runs[m.group(1)[0]].add(base + m.start(), base + m.end(), len(m.group(1)))
        self.frontier = base + newline + 1

    def first(self, fence: str, after: int) -> int | None:
        """Where the first line at or after ``after`` that closes ``fence`` ends."""
        return self._runs[fence[0]].first(after, len(fence))

    def keep_head(self, buf: str, base: int) -> None:
        """An idle flush takes ``buf``: keep the start of its last line while it could still
        become a closing line."""
        line = self.head + buf if self.frontier < base else buf[self.frontier - base :]
        self.head = line if _CLOSER_HEAD.fullmatch(line) else "\0"


class _Runs:
    """One fence character's closing lines, in order; ``longer[i]``: the next one with a
    longer run than line i (-1: none yet)."""

    __slots__ = ("end", "longer", "pos", "size", "waiting")

    def __init__(self) -> None:
        self.pos: list[int] = []
        self.end: list[int] = []
        self.size: list[int] = []
        self.longer: list[int] = []
        self.waiting: list[int] = []  # lines without a longer one yet; runs not increasing

    def add(self, pos: int, end: int, size: int) -> None:
        i = len(self.pos)
        self.pos.append(pos)
        self.end.append(end)
        self.size.append(size)
        self.longer.append(-1)
        while self.waiting and self.size[self.waiting[-1]] < size:
            self.longer[self.waiting.pop()] = i
        self.waiting.append(i)

    def first(self, after: int, size: int) -> int | None:
        i = bisect.bisect_left(self.pos, after)
        if i > 64 and 2 * i > len(self.pos):
            self._drop(i)  # lines before a fence's body are never asked for again
            i = 0
        while 0 <= i < len(self.pos):
            if self.size[i] >= size:
                return self.end[i]
            i = self.longer[i]
        return None

    def _drop(self, n: int) -> None:
        del self.pos[:n], self.end[:n], self.size[:n], self.longer[:n]
        self.longer = [j - n if j >= 0 else -1 for j in self.longer]
        self.waiting = [j - n for j in self.waiting if j >= n]


def _word_start(buf: str, end: int) -> int:
    """Where the run of non-whitespace that ends at ``end`` starts, looking back at most
    ``_WORD_LOOK_BACK`` characters past the dots it ends in; -1: no run, or a longer one.

    A period is read after dots only where a scan began among them (once a scan), so the
    walk over them is paid once for each."""
    i = end
    while i > 0 and buf[i - 1] == ".":
        i -= 1
    stop = max(i - _WORD_LOOK_BACK, 0)
    while i > stop and not buf[i - 1].isspace():
        i -= 1
    if i == end or (i > 0 and not buf[i - 1].isspace()):
        return -1
    return i


def _at_line_start(buf: str, i: int) -> bool:
    """Whether only whitespace lies between the start of ``buf[i]``'s line and it (the
    whitespace before one word: each is walked for its own word alone)."""
    while i > 0 and buf[i - 1] != "\n":
        if not buf[i - 1].isspace():
            return False
        i -= 1
    return True


def _kind_of(text: str) -> Kind:
    return "blank" if not text.strip() else "text"


def _in_span(buf: str, pos: int, limit: int, done: bool) -> bool | None:
    """Whether ``buf[pos]`` lies inside an inline code span (CommonMark's pairing of
    backtick runs of one length) or inline math (``$x$`` as Pandoc reads it, as
    ``models.spans`` finds it, and ``$$x$$``) of its line. None while that depends on text
    not seen yet: a span opened before ``pos`` may still close, and its line is not complete
    (no newline after ``pos``, ``done`` false). Only ``buf[:limit]`` is looked at (the size
    bound), so that a text fed whole is cut where the same text fed in deltas is."""
    start = buf.rfind("\n", 0, pos) + 1
    end = buf.find("\n", pos, limit)
    complete = done or end >= 0
    if end < 0:
        end = limit
    at = start
    while (m := _SPAN_OPENER.search(buf, at, pos)) is not None:
        j = m.start()
        if buf[j] == "`":
            k = _run_end(buf, j, end)
            close, at = _closing_ticks(buf, k, end, k - j, complete), k
        elif buf.startswith("$$", j):
            close, at = buf.find("$$", j + 2, end), j + 2
            if close >= 0:
                close += 1
        elif _word_at(buf, j - 1, "_\\$") or buf[j + 1] in _SPACE or _PRICE.match(buf, j):
            at = j + 1  # not an opening dollar: "US$5", "costs $ 5", "$5. Then"
            continue
        else:
            close, at = _closing_dollar(buf, j + 1, end, complete), j + 1
        if close == -2 or (close == -1 and not complete):
            return None  # it may still close
        if close >= pos:
            return True
        if close >= 0:
            at = close + 1
        # else unclosed on its line: literal backticks or dollars; look on after them
    return False


def _run_end(buf: str, i: int, end: int) -> int:
    """The end of the run of backticks at ``buf[i]``."""
    while i < end and buf[i] == "`":
        i += 1
    return i


def _word_at(buf: str, i: int, also: str) -> bool:
    """Whether ``buf[i]`` is an ASCII letter or digit, or one of ``also``."""
    ch = buf[i] if 0 <= i < len(buf) else ""
    return ch != "" and ch.isascii() and (ch.isalnum() or ch in also)


def _closing_ticks(buf: str, at: int, end: int, size: int, complete: bool) -> int:
    """Where the next run of exactly ``size`` backticks in ``buf[at:end]`` ends (its last
    backtick); -1: none; -2: a run that ends where the text looked at ends, which what
    follows may make longer."""
    while (i := buf.find("`", at, end)) >= 0:
        k = _run_end(buf, i, end)
        if k == end and not complete:
            return -2
        if k - i == size:
            return k - 1
        at = k
    return -1


def _closing_dollar(buf: str, at: int, end: int, complete: bool) -> int:
    """Where the dollar that closes inline math opened before ``at`` is: one after a
    non-space and before no letter, digit or dollar. -1: none on the line; -2: the text
    looked at ends in a dollar that may close it, before what follows it."""
    while (i := buf.find("$", at, end)) >= 0:
        if buf[i - 1] not in _SPACE:
            if i + 1 == end and not complete:
                return -2
            if not _word_at(buf, i + 1, "_$"):
                return i
        at = i + 1
    return -1


class Segmenter:
    """Incremental sentence segmenter; one per stream (or per one-shot text).

    Boundaries: a sentence end (``.!?…`` and whitespace, ``。！？`` with or without), a
    newline before more text, a code fence (opening line through closing line), the size
    bound; whitespace after a boundary stays with the segment before it. Not boundaries:
    decimals, versions, file names, abbreviations, a dot before a lowercase word, ``1.``
    list markers, a sentence end inside inline code or math (a protected span never splits
    a sentence). A fence not closed within ``max_fence_chars`` was stray: its line is a
    ``code`` segment and prose resumes, so one stray fence cannot make a stream code.
    """

    def __init__(self, max_chars: int, *, max_fence_chars: int) -> None:
        if max_chars < 16:
            raise ValueError(f"max_chars must be >= 16, got {max_chars}")
        if max_fence_chars < 8:
            raise ValueError(f"max_fence_chars must be >= 8, got {max_fence_chars}")
        self.max_chars = max_chars
        self.max_fence_chars = max_fence_chars
        self._buf = ""
        self._base = 0  # offset of _buf in the whole text fed
        self._scan_from = 0  # prose: no boundary starts before this offset of _buf
        # A sentence end after an unclosed backtick or dollar waits for its line to end.
        self._waiting = False
        self._done = False  # a flush: the text fed so far is all there is for now
        self._closers = _Closers()
        # Inside a fence (offsets in the whole text fed):
        self._fence: str | None = None  # its marker, e.g. "```"
        self._fence_end = 0  # the end of the marker
        self._window_end = 0  # its closing line must end by here
        self._line_scan = 0  # the opening line has no newline before this
        self._body_start = -1  # after its opening line; -1: that line is not complete yet
        self._close_end = -1  # after its closing line; -1: not found yet
        self._shown = False  # an idle flush gave out its start already

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
            if final:
                self._reset()
            return []
        out: list[Piece] = []
        if self._fence is None and self._waiting:
            # Sentence ends that waited for their line to end: it has, for now.
            self._done = True
            try:
                while self._fence is None and (piece := self._next_piece()) is not None:
                    out.append(piece)
            finally:
                self._done = False
            if not self._buf:
                if final:
                    self._reset()
                return out
        if self._fence is None:
            stripped = self._buf.lstrip(" \t\n\r")
            m = _FENCE_OPEN.match(stripped)
            if m:  # a fence marker the text ends in
                self._open_fence(len(self._buf) - len(stripped), m)
        if self._fence is None:
            out.append(self._take(len(self._buf), _kind_of(self._buf)))
        else:
            if not final and self._body_start >= 0 and self._close_end < 0:
                # The line in progress may be the closing line: keep its start.
                self._closers.scan(self._buf, self._base, self._window_end)
                self._closers.keep_head(self._buf, self._base)
            bound = self.max_chars * _CODE_BOUND_FACTOR
            while len(self._buf) > bound:
                out.append(self._take(self._code_cut(bound), "code"))
            out.append(self._take(len(self._buf), "code"))
            if self._close_end >= 0:
                self._fence = None
            self._shown = True
        if final:
            self._reset()
        return out

    def _reset(self) -> None:
        self._fence = None
        self._closers = _Closers()
        self._closers.frontier = self._base

    def _take(self, end: int, kind: Kind) -> Piece:
        piece = Piece(self._buf[:end], kind)
        self._buf = self._buf[end:]
        self._base += end
        self._scan_from = 0
        self._waiting = False
        return piece

    def _code_cut(self, bound: int) -> int:
        cut = self._buf.rfind("\n", 0, bound)
        return cut + 1 if cut > 0 else bound

    def _open_fence(self, lead: int, m: re.Match[str]) -> None:
        self._fence = m.group(1)
        self._fence_end = self._line_scan = self._base + lead + len(m.group(0))
        self._window_end = self._base + lead + self.max_fence_chars
        self._body_start = self._close_end = -1
        self._shown = False

    def _next_piece(self) -> Piece | None:
        buf = self._buf
        if not buf:
            return None
        if self._fence is None:
            stripped = buf.lstrip(" \t\n\r")
            m = _FENCE_OPEN.match(stripped)
            if m:
                if m.end() == len(stripped):
                    return None  # the marker may go on: "```" then "`" is a "````" fence
                self._open_fence(len(buf) - len(stripped), m)
            elif stripped and len(stripped) < 3 and not stripped.strip("`~"):
                return None  # "``" could still become a fence: wait for more
        if self._fence is not None:
            return self._next_code_piece()
        return self._next_text_piece()

    def _next_text_piece(self) -> Piece | None:
        buf = self._buf
        lead = len(buf) - len(buf.lstrip())
        # A sentence end is inside code or math only after a backtick or a dollar; most
        # prose has neither, and buf[:clear] is known to have none.
        clear, opened = 0, False
        # A boundary at or past the size bound is not taken: the search ends there, not at
        # the end of a long text fed at once.
        for m in _BOUNDARY.finditer(buf, self._scan_from, self.max_chars):
            at = m.start()
            if at < lead:
                continue  # leading whitespace belongs to the segment it leads
            if self._is_false_end(buf, m):
                continue
            if not opened and clear < at:
                opened = buf.find("`", clear, at) >= 0 or buf.find("$", clear, at) >= 0
                clear = at
            if opened and buf.find("\n", at, m.end()) < 0:
                inside = _in_span(buf, at, min(len(buf), self.max_chars), self._done)
                if inside is None:
                    # Decided when the line ends or the span closes: look again from here.
                    self._scan_from, self._waiting = at, True
                    break
                if inside:
                    continue
            return self._take(m.end(), "text")
        else:
            # No boundary yet: a later one needs its terminator and whitespace, so the
            # next scan restarts shortly before the end instead of at the start.
            self._scan_from = max(0, len(buf) - 8)
            self._waiting = False
        if len(buf) >= self.max_chars:
            return self._take(self._cut_point(buf, self.max_chars), _kind_of(buf))
        return None

    def _next_code_piece(self) -> Piece | None:
        buf, base, fence = self._buf, self._base, self._fence
        assert fence is not None
        end = base + len(buf)
        if self._close_end < 0:
            if self._body_start < 0:
                newline = buf.find("\n", max(self._line_scan - base, 0), self._window_end - base)
                if newline >= 0:
                    self._body_start = base + newline + 1
                else:
                    self._line_scan = min(end, self._window_end)
            if self._body_start >= 0:
                if self._closers.frontier < self._body_start:
                    self._closers.frontier, self._closers.head = self._body_start, ""
                self._closers.scan(buf, base, self._window_end)
                close = self._closers.first(fence, self._body_start)
                if close is not None and close <= self._window_end:
                    self._close_end = close
            if self._close_end < 0:
                if end < self._window_end:
                    return None  # the closing line may still come
                return self._stray_fence()
        bound = self.max_chars * _CODE_BOUND_FACTOR
        if self._close_end - base > bound:
            return self._take(self._code_cut(bound), "code")  # a long block: in parts
        stripped = buf[self._close_end - base :].lstrip()
        if not stripped:
            return None  # whitespace may go on; it joins the code segment
        self._fence = None
        return self._take(len(buf) - len(stripped), "code")

    def _stray_fence(self) -> Piece | None:
        """No closing line within max_fence_chars: the opening line is a segment of its
        own and what follows it is prose."""
        self._fence = None
        if self._shown:
            return self._next_piece()  # the opening line is out already (an idle flush)
        line_end = self._body_start if self._body_start >= 0 else self._fence_end
        return self._take(line_end - self._base, "code")

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
        start = _word_start(buf, m.start())
        if start < 0:
            return False  # no word before the period, or one longer than any that counts
        token = buf[start : m.start()]
        if token.lower().rstrip(".") in _ABBREVIATIONS:
            return True
        # "1. First step": a list marker at the start of a line, not a sentence end.
        return token.isdigit() and _at_line_start(buf, start)

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


def segment(text: str, max_chars: int, *, max_fence_chars: int) -> list[Piece]:
    """Cut a whole text into segments (``max_segment_chars`` and ``max_fence_chars``, as the
    settings name them)."""
    seg = Segmenter(max_chars, max_fence_chars=max_fence_chars)
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
