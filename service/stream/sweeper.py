"""The end of streams nobody ends: idle expiry, and the drain at shutdown.

``Sweeper`` runs one task that deletes streams idle past ``stream_idle_expire_s``; at
shutdown it drains: new streams are refused (``draining``), open ones closed (their text
flushed) and given a grace for their translations, then whatever is left aborted.
"""

from __future__ import annotations

import asyncio
import logging
import time

from service.stream.roster import StreamRoster

log = logging.getLogger("thinktrans.streams")


class Sweeper:
    """Expires the roster's idle streams, and drains them at shutdown."""

    def __init__(self, roster: StreamRoster, *, idle_expire_s: float) -> None:
        self.roster = roster
        self.idle_expire_s = idle_expire_s
        self.draining = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._sweep(), name="streams:sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _sweep(self) -> None:
        interval = min(1.0, self.idle_expire_s / 4)
        while True:
            await asyncio.sleep(interval)
            self.expire()

    def expire(self) -> int:
        """Drop streams idle past ``idle_expire_s``; return how many."""
        cutoff = time.monotonic() - self.idle_expire_s
        stale = [s for s in self.roster.streams.values() if s.last_activity < cutoff]
        for stream in stale:
            log.info("stream expired", extra={"stream": stream.stream_id,
                                              "segments": stream.count})
            self.roster.delete(stream.stream_id)
        return len(stale)

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new streams, close open ones (flushing their text), and give
        their translations ``grace_s`` to come out; then drop what is left."""
        self.draining = True
        streams = self.roster.streams
        for stream in list(streams.values()):
            if not stream.closed:
                await stream.close_held()
        until = time.monotonic() + grace_s
        while time.monotonic() < until and not all(s.ended for s in streams.values()):
            await asyncio.sleep(0.05)
        stuck = [s for s in streams.values() if not s.ended]
        for stream in stuck:
            stream.abort("the service shut down before the translation came")
        if stuck:
            await asyncio.sleep(0.2)  # let SSE readers write out the last events
        for stream in streams.values():
            stream.drop()
        log.info("streams drained", extra={"streams": len(streams)})
