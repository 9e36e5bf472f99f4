"""Counting streams: their metrics, and the summaries ``GET /v1/streams`` (and the viewer's
list) reads.

``StreamTally`` counts evictions and sets the gauges of open and ended streams (what a
stream's own parts count is ``service/stream/counters.py``); ``summaries`` says what each
stream is, without its text.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Collection
from typing import Any

from service.ops.metrics import Metrics
from service.stream.pipeline import Stream


class StreamTally:
    """The stream metrics of one runtime."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def evicted(self) -> None:
        """An ended stream evicted to bound the memory of ended streams."""
        self.metrics.streams_evicted.inc()

    def streams(self, active: int, ended: int, ended_bytes: int) -> None:
        """The gauges: streams not yet ended, ended ones kept, and their estimated bytes."""
        self.metrics.open_streams.set(active)
        self.metrics.ended_streams.set(ended)
        self.metrics.ended_stream_bytes.set(ended_bytes)


def summaries(streams: Collection[Stream], limit: int | None = None) -> list[dict[str, Any]]:
    """``streams`` newest first (the ``limit`` newest), each a ``StreamSummary``'s fields."""
    chosen = heapq.nlargest(limit, streams, key=_started) if limit else (
        sorted(streams, key=_started, reverse=True))
    now, clock = time.time(), time.monotonic()
    return [summary(stream, now, clock) for stream in chosen]


def summary(stream: Stream, now: float, clock: float) -> dict[str, Any]:
    """What ``GET /v1/streams`` says of a stream (a ``StreamSummary``), no text; ``now`` and
    ``clock``: the wall clock and the monotonic one, read once for every stream."""
    return {"stream_id": stream.stream_id, "target": stream.target,
            "state": "ended" if stream.ended else "open",
            "segments": stream.count, "started": _rfc3339(stream.started_at),
            "last_active": _rfc3339(now - (clock - stream.last_activity))}


def _started(stream: Stream) -> float:
    return stream.started_at


def _rfc3339(wall: float) -> str:
    """A wall-clock time as RFC 3339 in UTC, to the millisecond."""
    t = time.gmtime(wall)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031 (a third of f-string's cost)
        t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, int(wall * 1000) % 1000)
