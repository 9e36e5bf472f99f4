"""Prometheus metrics, one registry per app so that apps in one process stay apart."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by nearest rank (the smallest value with q% at or below it)."""
    if not values:
        return None
    # inverted_cdf is nearest rank: a value that was measured, never one between two.
    return round(float(np.percentile(values, q, method="inverted_cdf")), 2)


class Metrics:
    """Every metric the service exports, with conventional names and units."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, ...
        self.requests = Counter(
            "thinktrans_http_requests", "HTTP requests by route and status.",
            ["method", "route", "status"], registry=r,
        )
        self.request_seconds = Histogram(
            "thinktrans_http_request_duration_seconds", "HTTP request latency by route.",
            ["method", "route"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.segments = Counter(
            "thinktrans_segments", "Segments out, by status and backend.",
            ["status", "backend"], registry=r,
        )
        self.queue_depth = Gauge(
            "thinktrans_queue_depth", "Segments waiting in a backend's batcher.",
            ["backend"], registry=r,
        )
        self.batch_size = Histogram(
            "thinktrans_batch_size", "Segments per batch sent to a backend.",
            ["backend"], buckets=_BATCH_BUCKETS, registry=r,
        )
        self.batch_seconds = Histogram(
            "thinktrans_batch_duration_seconds", "Time a backend took for one batch.",
            ["backend"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.segment_seconds = Histogram(
            "thinktrans_segment_latency_seconds",
            "From a segment being ready to its result going out (ready-to-emit).",
            ["status"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.deadline_misses = Counter(
            "thinktrans_deadline_misses", "Segments sent out untranslated at their deadline.",
            registry=r,
        )
        self.backend_errors = Counter(
            "thinktrans_backend_errors", "Failed batches by backend and error kind.",
            ["backend", "kind"], registry=r,
        )
        self.billed_chars = Counter(
            "thinktrans_billed_characters", "Characters sent to backends that bill them.",
            ["backend"], registry=r,
        )
        self.open_streams = Gauge(
            "thinktrans_open_streams", "Streams currently open.", registry=r,
        )
        self.ended_streams = Gauge(
            "thinktrans_ended_streams", "Ended streams kept for late readers.", registry=r,
        )
        self.ended_stream_bytes = Gauge(
            "thinktrans_ended_stream_bytes",
            "Estimated memory held by the events of ended streams.", registry=r,
        )
        self.streams_evicted = Counter(
            "thinktrans_streams_evicted", "Ended streams evicted to bound their memory.",
            registry=r,
        )
        self.backend_ready = Gauge(
            "thinktrans_backend_ready", "1 when a backend is ready, else 0.",
            ["backend"], registry=r,
        )
        self.stream_memory = Counter(
            "thinktrans_stream_memory",
            "Short segments of unclear language that waited for the next one: `kept` the "
            "stream's recent language, or took their `own` detection (a switch came next).",
            ["outcome"], registry=r,
        )
        self.previews = Counter(
            "thinktrans_previews",
            "Previews of open sentences: `sent` to a backend, `shown` (a `preview` event), "
            "`unchanged` (nothing new once masked), `superseded` (its sentence ended first: "
            "dropped unrun, or its answer unused), `stopped` (its decode ended early: "
            "segments came to wait for its backend), `failed`, `no_backend` (none usable, "
            "or its preview lane full).",
            ["outcome"], registry=r,
        )
        self._cache_metrics(r)

    def _cache_metrics(self, r: CollectorRegistry) -> None:
        """The translation cache's series (``service/chain/cache.py``)."""
        self.cache_hits = Counter(
            "thinktrans_cache_hits", "Translation cache lookups answered from memory or file.",
            registry=r,
        )
        self.cache_misses = Counter(
            "thinktrans_cache_misses", "Translation cache lookups that found nothing.",
            registry=r,
        )
        self.cache_bytes = Gauge(
            "thinktrans_cache_bytes", "Estimated memory held by the translation cache.",
            registry=r,
        )
        self.cache_entries = Gauge(
            "thinktrans_cache_entries", "Translations held in the cache's memory.", registry=r,
        )
        self.cache_billed_chars_saved = Counter(
            "thinktrans_cache_billed_chars_saved",
            "Characters a billing backend was not sent because the cache answered.",
            ["backend"], registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
