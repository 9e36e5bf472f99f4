"""Previews: provisional translations of a stream's sentence while it is still open.

A long sentence can take seconds of thinking to end; a reader sees its translation so far
instead of nothing. A preview is a prefix re-translated, a cheap best effort: it never
holds up a segment, never reaches the cache or the rest of the chain, and what it shows
is superseded by the segment the sentence becomes.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from models.errors import Stopped
from service.chain.work import SegmentWork, Translation
from service.schemas import PreviewResult
from service.settings import Settings
from service.stream.counters import StreamCounters
from service.stream.emission import Emitter
from service.text.typography import is_tight

_WORD = re.compile(r"\S+")
# Held text that ends as a sentence ends: the segmenter holds it only to see what comes
# next, and the next text cuts it. A preview then would only hold up its segment.
_ENDED = re.compile(r"(?:[.!?…。！？][\"'”’)\]」』）》]*|\n)\s*$")
# Text the segmenter holds that starts a code fence is code until the fence closes.
_FENCES = ("```", "~~~")


@dataclass(frozen=True, slots=True)
class PreviewConfig:
    """When previews are made and how they are shown (the ``preview_*`` settings, where
    each default is: ``from_settings``)."""

    min_words: int
    min_chars: int
    after_s: float
    step_words: int
    step_chars: int
    interval_s: float
    max_decodes: int
    mask_k: int
    billed: bool

    @classmethod
    def from_settings(cls, settings: Settings) -> PreviewConfig:
        return cls(
            min_words=settings.preview_min_words, min_chars=settings.preview_min_chars,
            after_s=settings.preview_after_ms / 1000.0,
            step_words=settings.preview_step_words, step_chars=settings.preview_step_chars,
            interval_s=settings.preview_interval_ms / 1000.0,
            max_decodes=settings.preview_max_decodes, mask_k=settings.preview_mask_k,
            billed=settings.preview_billed,
        )


def _wide(char: str) -> bool:
    """A character of a script written without spaces between words (Han, Kana; Hangul
    is counted with them, by its syllables)."""
    return unicodedata.east_asian_width(char) in "WF" and char.isalpha()


def measure(text: str) -> tuple[int, bool]:
    """How long an open sentence is: for one mostly in Chinese, Japanese or Korean script
    (more of its characters than words of other scripts), (those characters and the other
    words, True), else (words, False)."""
    wide = sum(1 for char in text if _wide(char))
    if not wide:
        return len(text.split()), False
    others = sum(1 for word in text.split() if not any(_wide(char) for char in word))
    if wide >= others:
        return wide + others, True
    return len(text.split()), False


def mask(text: str, k: int, *, tight: bool) -> str:
    """``text`` without its last ``k`` words (characters, for a ``tight`` target); "" when
    nothing is left. Trailing punctuation goes with the last word. Mask-k: a prefix's
    translation changes most at its end."""
    text = text.strip()
    if k <= 0 or not text:
        return text
    if tight:
        chars = text.rstrip(".,;:!?。，、；：！？…")
        return chars[:-k].rstrip() if len(chars) > k else ""
    words = list(_WORD.finditer(text))
    return text[: words[-k].start()].rstrip() if len(words) > k else ""


class StartPreview(Protocol):
    """Starts one preview's work (``Dispatcher.preview``, bound to the stream's chain)."""

    def __call__(self, work: SegmentWork) -> asyncio.Future[Translation] | None: ...


class Previewer:
    """One stream's previews of its open sentence: one at a time, once it is long or old
    enough and again as it grows (``PreviewConfig``); each decoded towards the last one
    shown (``previous``), and cancelled unrun when the sentence is cut.

    ``pending``: the text the segmenter holds; ``work``: that text's preview work, made
    as it would be decided (``Cutter.preview_work``; None: not translated); ``start``:
    starts a preview; ``counters``: each outcome is counted there.
    """

    def __init__(self, config: PreviewConfig, emitter: Emitter, *,
                 pending: Callable[[], str],
                 work: Callable[[str, str | None], SegmentWork | None],
                 start: StartPreview, counters: StreamCounters) -> None:
        self.config = config
        self._emitter = emitter
        self._pending = pending
        self._work = work
        self._start = start
        self._count = counters.preview
        self._tight = is_tight(emitter.target)
        self._index = -1  # the open sentence's index (its segment's, once cut)
        self._opened = 0.0  # when it was first seen
        self._decodes = 0  # previews of it sent
        self._revision = 0  # previews of it shown
        self._units = 0  # its length at its last preview
        self._at = 0.0  # when its last preview was sent
        self._shown: str | None = None  # its last preview, as shown
        self._inflight: asyncio.Future[Translation] | None = None
        self._timer: asyncio.TimerHandle | None = None

    # -- when ------------------------------------------------------------------------------

    def poke(self) -> None:
        """Look at the open sentence: preview it now if it is due, or set the timer for
        when it will be (its age, the interval)."""
        emitter = self._emitter
        if self._inflight is not None or emitter.closed or emitter.dropped:
            return  # one at a time: its answer pokes again
        text = self._pending()
        if not text.strip() or _ENDED.search(text):
            return  # nothing open, or its end is there already (``_ENDED``)
        now = time.monotonic()
        if emitter.count != self._index:  # a new sentence
            self._new_sentence(emitter.count, now)
        cfg = self.config
        if self._decodes >= cfg.max_decodes or text.lstrip().startswith(_FENCES):
            return
        units, wide = measure(text)
        step = cfg.step_chars if wide else cfg.step_words
        if self._units and units - self._units < step:
            return  # looked at already: it must grow by a step first
        if self._decodes == 0 and units < (cfg.min_chars if wide else cfg.min_words):
            # Not long enough: old enough, with a step's worth of words, will do.
            age = now - self._opened
            if units < step:
                return
            if age < cfg.after_s:
                self._arm(cfg.after_s - age)
                return
        elif self._decodes and now - self._at < cfg.interval_s:
            self._arm(self._at + cfg.interval_s - now)
            return
        self._send(text, units, now)

    def _new_sentence(self, index: int, now: float) -> None:
        self._index, self._opened = index, now
        self._decodes = self._revision = self._units = 0
        self._shown = None
        self._cancel_timer()

    def _arm(self, delay_s: float) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(max(delay_s, 0.0), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.poke()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- sending and showing ---------------------------------------------------------------

    def _send(self, text: str, units: int, now: float) -> None:
        self._units, self._at = units, now  # looked at: the next one needs more text
        work = self._work(text, self._shown)
        if work is None:
            return  # not to be translated (yet): looked at again as it grows
        future = self._start(work)
        if future is None:
            self._count("no_backend")
            return
        self._decodes += 1
        self._count("sent")
        self._inflight = future
        future.add_done_callback(functools.partial(self._answered, work))

    def _answered(self, work: SegmentWork, future: asyncio.Future[Translation]) -> None:
        if self._inflight is future:
            self._inflight = None
        if future.cancelled():
            return  # superseded (counted by ``cut``) or dropped with the stream
        index = work.index
        if isinstance(future.exception(), Stopped):
            self._count("stopped")  # segments came to wait for its backend
        elif future.exception() is not None:
            self._count("failed")
        elif index != self._index or self._emitter.count > index:
            self._count("superseded")
        else:
            self._show(work, future.result().text)
        if not self._emitter.dropped:
            self.poke()  # it may have grown meanwhile, or a new sentence be open

    def _show(self, work: SegmentWork, translated: str) -> None:
        protected, index = work.protected, work.index
        if protected is not None and protected.missing(translated):
            self._count("failed")  # a preview never shows a span lost
            return
        text = mask(translated, self.config.mask_k, tight=self._tight)
        if not text or text == self._shown:
            self._count("unchanged")
            return
        self._revision += 1
        if self._emitter.publish_preview(PreviewResult(
                index=index, text=text, source_chars=len(work.original),
                revision=self._revision)):
            self._shown = text
            self._count("shown")

    # -- the sentence ends -----------------------------------------------------------------

    def cut(self, index: int) -> None:
        """Segment ``index`` was cut: its previews are over; one still queued is dropped."""
        if index != self._index:
            return
        self._cancel_timer()
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.done():
            inflight.cancel()
            self._count("superseded")

    def drop(self) -> None:
        """The stream is over: nothing more is previewed."""
        self._cancel_timer()
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.cancel()
