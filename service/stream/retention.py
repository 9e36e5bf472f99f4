"""Retention of ended streams: their events kept for late readers, within bounds.

An ended stream keeps only its event log. ``Retention`` keeps ended streams within
``max_ended_streams`` and ``max_ended_bytes`` (estimated from their events), names the
oldest to evict when one more would pass them, and remembers the evicted ids, so that a
reader of one is told 410 (gone), not 404 (never there).
"""

from __future__ import annotations

from collections import OrderedDict

from service.exceptions import EventsGone

# Evicted ended streams remembered (for 410 instead of 404), oldest forgotten first.
GONE_REMEMBERED = 4096


class Retention:
    """The ended streams kept, oldest first, with their estimated bytes; and the ids of
    those evicted to bound them."""

    def __init__(self, *, max_streams: int, max_bytes: int) -> None:
        self.max_streams = max_streams
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, int] = OrderedDict()
        self.bytes = 0
        self._gone: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, stream_id: str, size: int) -> list[str]:
        """Keep an ended stream of ``size`` bytes; return the ids to evict (oldest first,
        remembered as gone) so that the kept ones stay within the bounds."""
        self._kept[stream_id] = size
        self.bytes += size
        evicted = []
        while self._kept and (len(self._kept) > self.max_streams
                              or self.bytes > self.max_bytes):
            oldest, size = self._kept.popitem(last=False)
            self.bytes -= size
            evicted.append(oldest)
            self._gone[oldest] = None
            if len(self._gone) > GONE_REMEMBERED:
                self._gone.popitem(last=False)
        return evicted

    def forget(self, stream_id: str) -> None:
        """A stream is no longer kept (deleted or expired); ended or not."""
        size = self._kept.pop(stream_id, None)
        if size is not None:
            self.bytes -= size

    def reuse(self, stream_id: str) -> None:
        """The id names a new stream now: no longer gone."""
        self._gone.pop(stream_id, None)

    def check(self, stream_id: str) -> None:
        """Raise ``EventsGone`` (410) if the stream ended and was evicted."""
        if stream_id in self._gone:
            raise EventsGone(
                f"stream {stream_id!r} ended and was evicted to bound the memory of ended "
                f"streams (THINKTRANS_MAX_ENDED_STREAMS={self.max_streams}, "
                f"THINKTRANS_MAX_ENDED_BYTES={self.max_bytes}); read ended streams "
                "sooner, or raise these limits", evicted=True,
            )

    def clear(self) -> None:
        """Forget the kept streams (not the gone ids): the runtime is stopping."""
        self._kept.clear()
        self.bytes = 0
