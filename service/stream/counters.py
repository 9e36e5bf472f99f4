"""A stream's metrics, counted by the part where each event happens.

One ``StreamCounters`` serves every stream of a runtime: the emitter counts each segment
result as it goes out, the cutter each segment the stream's memory settled, the previewer
each preview's outcome. Label lookups take a lock: each series is looked up once and kept.
"""

from __future__ import annotations

from typing import Any

from service.ops.metrics import Metrics
from service.schemas import SegmentResult


class StreamCounters:
    """The streams' series of ``Metrics``, looked up once each."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._segments: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._previews: dict[str, Any] = {}

    def segment(self, result: SegmentResult) -> None:
        """A segment result went out (``thinktrans_segments``, its seconds, a miss)."""
        key = (result.status, result.backend or "")
        children = self._segments.get(key)
        if children is None:  # once per status and backend
            children = self._segments[key] = (self.metrics.segments.labels(*key),
                                              self.metrics.segment_seconds.labels(key[0]))
        children[0].inc()
        children[1].observe(result.latency_ms / 1000.0)
        if result.status == "deadline":
            self.metrics.deadline_misses.inc()

    def preview(self, outcome: str) -> None:
        """A preview's outcome (``thinktrans_previews``: sent, shown, ...)."""
        child = self._previews.get(outcome)
        if child is None:
            child = self._previews[outcome] = self.metrics.previews.labels(outcome)
        child.inc()

    def memory(self, outcome: str) -> None:
        """A segment the stream's memory settled (``kept`` or ``own``)."""
        self.metrics.stream_memory.labels(outcome).inc()
