"""The roster of named streams: each by its id, from open until deleted, expired or evicted.

``StreamRoster`` holds the streams a client opened (ended ones too, while ``Retention``
keeps them for late readers), bounds how many are not yet ended (``max_streams``), and
answers a lookup of an unknown id with 404, or 410 when it ended and was evicted.
"""

from __future__ import annotations

import logging

from service.exceptions import NotFound, TooManyStreams
from service.stream.pipeline import Stream
from service.stream.retention import Retention
from service.stream.tally import StreamTally

log = logging.getLogger("thinktrans.streams")


class StreamRoster:
    """Every named stream of one runtime, by id."""

    def __init__(self, retention: Retention, tally: StreamTally, *, max_streams: int) -> None:
        self.retention = retention
        self.tally = tally
        self.max_streams = max_streams
        self.streams: dict[str, Stream] = {}

    def active(self) -> int:
        """Streams not yet ended; an ended one is kept only for late readers."""
        return len(self.streams) - len(self.retention)

    def find(self, stream_id: str) -> Stream | None:
        """The stream with this id; None when there is none (or it is gone)."""
        return self.streams.get(stream_id)

    def get(self, stream_id: str) -> Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            self.retention.check(stream_id)
            raise NotFound(f"no stream {stream_id!r}: it was never opened, was deleted, or "
                           "expired after THINKTRANS_STREAM_IDLE_EXPIRE_S")
        return stream

    def check_room(self) -> None:
        """Raise ``TooManyStreams`` (429) when ``max_streams`` are not yet ended."""
        active = self.active()
        if active >= self.max_streams:
            raise TooManyStreams(
                f"{active} streams are open (THINKTRANS_MAX_STREAMS="
                f"{self.max_streams}); close finished streams or retry later"
            )

    def add(self, stream: Stream) -> None:
        """A stream just opened (``check_room`` passed)."""
        self.streams[stream.stream_id] = stream
        self.retention.reuse(stream.stream_id)  # the id names this new stream now
        self._gauge()

    def delete(self, stream_id: str) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            self.retention.check(stream_id)
            raise NotFound(f"no stream {stream_id!r}")
        self._forget(stream)
        self._gauge()

    def ended(self, stream: Stream) -> None:
        """A stream ended: keep its events for late readers, within the bounds on ended
        streams (THINKTRANS_MAX_ENDED_STREAMS and _BYTES), evicting the oldest."""
        if self.streams.get(stream.stream_id) is not stream:
            return  # a one-shot text, or dropped already
        for oldest in self.retention.keep(stream.stream_id, stream.log.retained_bytes()):
            self.streams.pop(oldest).drop()
            self.tally.evicted()
            log.info("ended stream evicted", extra={"stream": oldest})
        self._gauge()

    def clear(self) -> None:
        """Drop every stream: the runtime is stopping."""
        for stream in list(self.streams.values()):
            stream.drop()
        self.streams.clear()
        self.retention.clear()
        self._gauge()

    def _forget(self, stream: Stream) -> None:
        """Drop a stream taken out of ``streams``, and its place among the ended ones."""
        stream.drop()
        self.retention.forget(stream.stream_id)

    def _gauge(self) -> None:
        self.tally.streams(self.active(), len(self.retention), self.retention.bytes)
