"""One segment's work: made once where the segment is cut, carried by reference to its emission.

A segment's facts (its text, decision, target, context, spans, due) are decided once, by
the cutter, and read by every part after it; nothing repacks them on the way, so no part
can see a stale or partial copy.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from models.spans import Protected
from service.text.decide import Decision

__all__ = ["SegmentWork", "Translation"]


@dataclass(frozen=True, slots=True)
class Translation:
    """A backend's answer for one segment, with the time it waited in the queue."""

    text: str
    backend: str
    queued_ms: float
    model: str | None = None  # the model that translated it, where the backend has one
    cached: bool = False  # served from the translation cache


@dataclass(eq=False, slots=True)
class SegmentWork:
    """One segment from its cut to its emission.

    Each part writes only its own fields: the cutter makes the work (a preview's too, at
    the previewer's asking) and settles a held one; the emitter sets ``answer`` and
    ``late``. The dispatcher's attempt and the batcher's item are their own records that
    hold the work, never copies of it.
    """

    # -- the cutter's --------------------------------------------------------------------
    index: int  # its place in the stream (an open sentence's, for a preview)
    original: str  # the text as cut: what goes out when it is not translated
    decision: Decision  # a placeholder while ``held``; settled by the cutter
    ready_at: float  # when it was cut (one-shot: started); its deadline runs from here
    target: str | None  # the stream's target (None: no target, nothing is translated)
    text: str = ""  # what is sent: the original without its surrounding blanks
    model: str | None = None  # the model the request or stream named; None: the backend's
    context: str | None = None  # the stream's preceding text, for backends that use it
    protected: Protected | None = None  # its protected spans and glossary terms, if any
    due: float | None = None  # when it is due out (monotonic), once started; None: never
    # Waiting for the stream's next segment to settle its language (stream memory).
    held: bool = False
    # A preview of the open sentence (the batcher's low-priority lane), and that sentence's
    # last preview as shown, which a backend may keep close to.
    preview: bool = False
    previous: str | None = None
    # -- the emitter's -------------------------------------------------------------------
    answer: asyncio.Future[Translation] | None = None  # its translation, once started
    late: bool = False  # emitted as `deadline`; an update is owed

    @property
    def source(self) -> str | None:
        """The source sent with it (None: the backend detects)."""
        return self.decision.send_source
