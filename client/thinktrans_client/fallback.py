"""Falling back: when a stream gives up on the sidecar, and the originals it gives out then.

A stream falls back once, for the first reason that comes: a failed request (its parts
report it), or pushed text that went ``stall_s`` without a result (``StallClock``). From
then on every pending character goes out as it was pushed, as a segment with status
``error``, so that the originals of everything yielded still join back to the pushed text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from thinktrans_client.pending import PendingText
from thinktrans_client.results import TranslatedSegment
from thinktrans_client.sidecar import (
    ClientClosing,
    PastCloseWait,
    Sidecar,
    SidecarError,
    Skipped,
)

__all__ = ["Fallback", "StallClock"]

log = logging.getLogger("thinktrans.client")

T = TypeVar("T")


class Fallback:
    """Whether a stream has fallen back to the originals, and why."""

    def __init__(self, client: Sidecar, stream_id: str, pending: PendingText) -> None:
        self._client = client
        self._stream_id = stream_id
        self._pending = pending
        self.reason: str | None = None  # why the stream fell back to the originals
        self.slug: str | None = None  # the sidecar's problem slug, when it refused
        self.status = "error"  # of the originals given out: "deadline" past close_wait_s
        self._failed = asyncio.Event()

    @property
    def failed(self) -> bool:
        return self.reason is not None

    def fail(self, exc: SidecarError) -> bool:
        """Fall back for ``exc``, and tell the client; whether this call did (only the first)."""
        if self.reason is not None:
            return False
        self.reason = exc.reason
        self.slug = exc.slug
        if isinstance(exc, PastCloseWait):
            self.status = "deadline"
        self._client.note_failure(exc)
        # A skip follows a failure already logged: one warning per outage, not per stream;
        # the end of close_wait_s, and the client's own close, are no failure at all.
        quiet = isinstance(exc, Skipped | PastCloseWait | ClientClosing)
        log.log(logging.INFO if quiet else logging.WARNING,
                "stream %s falls back to the originals: %s pending_chars=%d",
                self._stream_id, exc.reason, len(self._pending))
        self._failed.set()
        return True

    async def wait(self) -> None:
        """Return once the stream has fallen back."""
        await self._failed.wait()

    async def unless_failed(self, coro: Awaitable[T]) -> T | None:
        """``await coro``, or None as soon as the stream falls back (``coro`` is cancelled)."""
        task = asyncio.ensure_future(coro)
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the reader was cancelled: leave no request behind
            task.cancel()
            raise
        finally:
            failed.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, SidecarError):
            pass
        return None

    def originals(self, target: str | None) -> TranslatedSegment | None:
        """All pending text as the next segment, status ``error`` (``deadline`` once the
        stream's ``close_wait_s`` ran out); None when none is pending."""
        if not len(self._pending):
            return None
        index, text = self._pending.give_out(len(self._pending))
        return TranslatedSegment(index, text, text, self.status, target=target,
                                 error=f"sidecar: {self.reason}")


class StallClock:
    """Pushed text may wait ``stall_s`` for a result, from the later of the last push and the
    last result; ``clock`` is ``time.monotonic`` but in tests."""

    def __init__(self, client: Sidecar, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._last_push = clock()
        self._last_result = 0.0

    def pushed(self) -> None:
        self._last_push = self._clock()

    def resulted(self) -> None:
        """A segment came back."""
        self._last_result = self._clock()

    def wait_s(self, *, waiting: bool) -> float:
        """How long the next poll may wait: ``poll_wait_s``, or less while text is ``waiting``
        for a result; SidecarError once it has waited ``stall_s``."""
        if not waiting:
            return self._client.poll_wait_s
        since = max(self._last_push, self._last_result)
        left = since + self._client.stall_s - self._clock()
        if left <= 0:
            raise SidecarError(f"no translation came back within {self._client.stall_s:g} s "
                               "(the client's stall_s)")
        return min(self._client.poll_wait_s, left)
