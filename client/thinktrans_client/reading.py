"""Reading one stream's events: long-polled in order, segments checked against the pushed text.

Previews are taken only by a reader that asked for them, and only while their segment is
not out: the segment of an index supersedes its previews.
"""

from __future__ import annotations

import asyncio
from typing import Any

from thinktrans_client.fallback import Fallback, StallClock
from thinktrans_client.pending import PendingText
from thinktrans_client.results import Preview, SegmentUpdate, StreamItem, TranslatedSegment
from thinktrans_client.sidecar import Sidecar, SidecarError

__all__ = ["EventReader"]


class EventReader:
    """One stream's events in order: segments that continue the pending text, updates, end,
    and previews once ``previews`` is set (until then they are skipped, as any event of a
    kind not known): the stream asked for them, and the sidecar took it.

    Polls once ``opened`` is set; a poll gives up as soon as ``fallback`` has the stream fall
    back, and waits no longer than ``stall`` allows.
    """

    def __init__(self, client: Sidecar, stream_id: str, *, pending: PendingText,
                 stall: StallClock, fallback: Fallback, opened: asyncio.Event) -> None:
        self._client = client
        self._stream_id = stream_id
        self._pending = pending
        self._stall = stall
        self._fallback = fallback
        self._opened = opened
        self.previews = False  # take previews
        self._after = -1  # the last event id taken
        self.ended = False  # the sidecar sent ``end``

    async def poll(self) -> list[Any]:
        """The next events, after a stall check; [] when the stream failed meanwhile.

        ``GET /v1/streams/{id}/events?after=N``, ``after`` the last event id seen, so a failed
        poll resumes where it stopped. Long-poll rather than SSE because every poll then has
        a bounded duration (``poll_wait_s`` + ``timeout_s``): a hung sidecar is noticed
        within that, where SSE would show it only after its 15 s keep-alive.
        """
        wait_s = self._stall.wait_s(waiting=bool(len(self._pending)))
        if not self._opened.is_set():
            opened = asyncio.ensure_future(self._opened.wait())
            failed = asyncio.ensure_future(self._fallback.wait())
            await asyncio.wait({opened, failed}, timeout=wait_s,
                               return_when=asyncio.FIRST_COMPLETED)
            opened.cancel()
            failed.cancel()
            if not self._opened.is_set():
                return []
        params = {"after": self._after, "wait_ms": max(1, int(wait_s * 1000))}
        data = await self._fallback.unless_failed(self._client.request(
            "GET", f"/v1/streams/{self._stream_id}/events", params=params, wait_s=wait_s))
        if data is None:
            return []
        try:
            events = list(data["events"])
        except (KeyError, TypeError):
            raise SidecarError("the sidecar's answer to the events poll is malformed") from None
        return events

    def take(self, event: Any) -> StreamItem | None:
        """The item an event carries (None: seen already, or ``end``); SidecarError when it
        is malformed or a segment does not continue the pending text."""
        try:
            kind, data, event_id = event["type"], event["data"], int(event["id"])
            if kind == "segment":
                item: StreamItem | None = TranslatedSegment.from_json(data)
            elif kind == "update":
                item = SegmentUpdate.from_json(data)
            elif kind == "preview" and self.previews:
                item = Preview.from_json(data)
            else:
                item = None
        except (KeyError, TypeError, ValueError):
            raise SidecarError("the sidecar sent a malformed event") from None
        if event_id <= self._after:
            return None  # seen already
        if isinstance(item, TranslatedSegment):
            # The server's invariant, checked: a segment continues exactly where the last
            # ended. Should it not, the originals from here on are the only safe output.
            if not self._pending.continues(item.index, item.original):
                raise SidecarError(f"the sidecar's segment {item.index} does not continue the "
                                   "pushed text")
            self._pending.give_out(len(item.original))
            self._stall.resulted()
        elif isinstance(item, Preview) and item.index < self._pending.next_index:
            item = None  # its segment is out, which supersedes it
        self._after = event_id
        if kind == "end":
            self.ended = True
        return item
