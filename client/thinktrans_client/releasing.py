"""Releasing a client's streams on the sidecar: each deleted once its posts have ended.

A stream is held from its first push until released. A post is never cut off before the
delete: cut off, it could reach the sidecar after it and open the stream again (a stream not
yet opened is opened by its first chunk); one that got no answer may still land, so that
stream is closed instead (a closed stream refuses a late chunk). ``close`` releases what is
left, within a bound, when the client closes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from thinktrans_client.sidecar import Sidecar, SidecarError

__all__ = ["Releasable", "StreamReleases"]

log = logging.getLogger("thinktrans.client")


class Releasable(Protocol):
    """What releasing uses of a ``ThinkingStream``."""

    @property
    def stream_id(self) -> str: ...

    @property
    def may_exist(self) -> bool:
        """Whether the sidecar may hold the stream (its open went out, was not refused)."""
        ...

    @property
    def unanswered(self) -> bool:
        """Whether a post of the stream's went out and got no answer."""
        ...

    async def settle(self, *, hurry: bool = False) -> None:
        """Return once nothing of the stream's can reach the sidecar any more."""
        ...

    def abandon(self) -> None:
        """The client is closing: post nothing more, give out the rest as pushed."""
        ...


class StreamReleases:
    """The streams a client may have on the sidecar, and their releases under way."""

    def __init__(self, client: Sidecar) -> None:
        self._client = client
        self._held: dict[str, Releasable] = {}  # by stream id, until released
        self._tasks: dict[str, asyncio.Task[None]] = {}  # releases under way
        self._hurry = False  # the client is closing: no stream's posts are waited for

    def hold(self, stream: Releasable) -> None:
        self._held[stream.stream_id] = stream

    def release(self, stream_id: str) -> None:
        """Release in the background, once per stream (a stream not held: a plain DELETE)."""
        if stream_id in self._tasks:
            return
        task = asyncio.create_task(self._release(stream_id, self._held.get(stream_id)),
                                   name=f"thinktrans:release:{stream_id}")
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))

    async def close(self, timeout_s: float) -> None:
        """Release every stream still held, and wait up to ``timeout_s`` for all releases;
        past it, those left are cancelled (logged: the sidecar's idle expiry ends them)."""
        self._hurry = True
        for stream in list(self._held.values()):
            stream.abandon()
        for stream_id in list(self._held):
            self.release(stream_id)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while self._tasks and (left := give_up - loop.time()) > 0:
            await asyncio.wait(set(self._tasks.values()), timeout=left)
        if self._tasks:
            log.warning("%d streams not released within %g s (release_timeout_s); the "
                        "sidecar's idle expiry ends them", len(self._tasks), timeout_s)
            for task in list(self._tasks.values()):
                task.cancel()

    async def _release(self, stream_id: str, stream: Releasable | None) -> None:
        try:
            if stream is not None:
                await stream.settle(hurry=self._hurry)
                if not stream.may_exist:
                    return
                if stream.unanswered:
                    # A post of its may still land: a closed stream refuses it (409), where
                    # a deleted one would be opened again by it. The sidecar keeps the ended
                    # stream within its bounds on ended streams.
                    await self._client.request("POST", f"/v1/streams/{stream_id}/close")
                    return
            await self._client.request("DELETE", f"/v1/streams/{stream_id}")
        except SidecarError as exc:
            if exc.status != 404:  # 404: it expired, or the sidecar restarted
                log.debug("stream %s release failed: %s", stream_id, exc.reason)
        finally:
            if stream is not None and self._held.get(stream_id) is stream:
                del self._held[stream_id]
