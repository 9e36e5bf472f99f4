"""Posting one stream's text: the sidecar stream opened, deltas batched into chunks, closed.

``push`` only appends to a buffer; a background task posts it as chunks, so the agent never
waits on the network. Each chunk's seq is fixed when it is formed, so a retry re-posts the
same seq and text, which the sidecar ignores: retries are safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from thinktrans_client.reasons import client_bug
from thinktrans_client.sidecar import Sidecar, SidecarError

__all__ = ["MAX_CHARS_PER_POST", "MAX_CHUNKS_PER_POST", "MAX_CHUNK_CHARS", "ChunkPoster",
           "backoff"]

log = logging.getLogger("thinktrans.client")

# Below the server's defaults (max_chunk_chars 16384, max_chunks_per_request 1024, and
# max_request_bytes 1 MiB: 65536 characters are at most 6 bytes each as JSON).
MAX_CHUNK_CHARS = 8192
MAX_CHUNKS_PER_POST = 256
MAX_CHARS_PER_POST = 65536


async def backoff(exc: SidecarError, since: float, timeout_s: float) -> None:
    """Wait as a 429/503 asks, or raise if that would take the wait past ``timeout_s``."""
    delay = exc.retry_after_s if exc.retry_after_s is not None else 0.1
    # A sidecar that is shutting down asks for 5 s: the originals should not wait that.
    if time.monotonic() + delay - since > timeout_s:
        raise SidecarError(f"{exc.reason}, and it asks to retry after {delay:g} s, past the "
                           f"client's budget of {timeout_s:g} s", status=exc.status,
                           slug=exc.slug)
    await asyncio.sleep(delay)


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class ChunkPoster:
    """Posts one stream's deltas: opens the sidecar's stream, posts chunks, closes it.

    ``open_body`` gives the body of the open, called when it is sent; ``on_open`` takes the
    sidecar's answer (KeyError or TypeError: malformed); ``on_failure`` hears why posting
    gave up, once, after which nothing more is posted. ``optional``: fields of the open a
    sidecar older than they are may not know; one it refuses as unknown is left out and
    the open sent again, and ``on_unknown`` hears its name.
    """

    def __init__(self, client: Sidecar, stream_id: str, *,
                 open_body: Callable[[], Mapping[str, Any]], on_open: Callable[[Any], None],
                 on_failure: Callable[[SidecarError], None], flush_interval_s: float,
                 flush_chars: int, optional: frozenset[str] = frozenset(),
                 on_unknown: Callable[[str], None] | None = None) -> None:
        self._client = client
        self._stream_id = stream_id
        self._open_body = open_body
        self._on_open = on_open
        self._on_failure = on_failure
        self._optional = optional
        self._on_unknown = on_unknown
        self._flush_interval_s = flush_interval_s
        self._flush_chars = flush_chars
        self.opened = asyncio.Event()  # the sidecar's stream is open: its events can be read
        self._unsent: list[str] = []  # added, not yet in a chunk
        self._unsent_chars = 0
        self._unsent_since = 0.0
        self._unacked: list[tuple[int, str]] = []  # chunks posted or due, not yet accepted
        self._unacked_since = 0.0
        self._next_seq = 0
        self._closing = False
        self._stopped = False
        self._refused = False  # the sidecar answered the open with an error: no stream
        # A post went out and got no answer: it may still reach the sidecar, even after the
        # stream's delete, and open the stream again (its owner closes it instead).
        self.unanswered = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def started(self) -> bool:
        """Whether anything was added, so the sidecar has (or will have) this stream."""
        return self._task is not None

    @property
    def may_exist(self) -> bool:
        """Whether the sidecar may hold this stream: opened, or the open went out and got
        no answer (it may have arrived). False once the sidecar refused the open."""
        return self.started and not self._refused

    def add(self, delta: str) -> None:
        """Queue a delta to post; the first one starts the posting task. Ignored once stopped."""
        if self._stopped:
            return
        if not self._unsent:
            self._unsent_since = time.monotonic()
            self._wake.set()  # the task sleeps without a timer while nothing waits
        self._unsent.append(delta)
        self._unsent_chars += len(delta)
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"thinktrans:{self._stream_id}")
        if self._unsent_chars >= self._flush_chars:
            self._wake.set()

    def close(self) -> None:
        """No more deltas: post the rest at once, then close the sidecar's stream."""
        self._closing = True
        self._wake.set()

    def stop(self) -> None:
        """Post nothing more. A post in flight is let end (within ``timeout_s``), not cut off:
        cut off, it may still reach the sidecar, after the stream's delete, and open the
        stream again (a stream not yet opened is opened by its first chunk)."""
        self._stopped = True
        self._wake.set()

    async def settle(self, *, hurry: bool = False) -> None:
        """Return once nothing of this stream's can reach the sidecar any more: the posting
        task given ``timeout_s`` to post what it has (none when ``hurry``), then stopped and
        its post in flight let end. Cancelled only past twice that, which a post bounded by
        ``timeout_s`` never takes."""
        task = self._task
        if task is None or task.done():
            return
        if not hurry:
            await asyncio.wait({task}, timeout=self._client.timeout_s)
        self.stop()
        _done, pending = await asyncio.wait({task}, timeout=self._client.timeout_s * 2)
        if pending:
            log.warning("stream %s: a post outlived its budget and was cut off",
                        self._stream_id)
            task.cancel()

    async def _run(self) -> None:
        try:
            await self._open()
            while await self._batch_due():
                self._form_chunks()
                await self._post_chunks()
                if self._closing and not self._stopped and not self._unsent and (
                        not self._unacked):
                    await self._retrying(lambda: self._post(
                        f"/v1/streams/{self._stream_id}/close"), time.monotonic())
                    return
        except SidecarError as exc:
            if not self._stopped:  # else its owner stopped it, and knows why
                self._on_failure(exc)
        except Exception as exc:  # a bug here must not cost the agent its thoughts
            log.exception("stream %s sender failed", self._stream_id)
            self._on_failure(SidecarError(client_bug(exc)))

    async def _post(self, path: str, body: Any = None) -> Any:
        """One POST; one the sidecar did not answer (a timeout, a connection lost, a cut)
        may still reach it later, and is remembered as such (``unanswered``)."""
        try:
            return await self._client.request("POST", path, json=body)
        except SidecarError as exc:
            if exc.status is None:
                self.unanswered = True
            raise
        except asyncio.CancelledError:
            self.unanswered = True
            raise

    async def _retrying(self, call: Callable[[], Awaitable[Any]], since: float) -> Any:
        while True:
            try:
                return await call()
            except SidecarError as exc:
                if not exc.transient or self._stopped:
                    raise
                await backoff(exc, since, self._client.timeout_s)

    async def _open(self) -> None:
        body = dict(self._open_body())
        while True:
            try:
                data = await self._retrying(
                    lambda: self._post("/v1/streams", body),
                    time.monotonic())
                break
            except SidecarError as exc:
                unknown = sorted(self._optional.intersection(exc.unknown_fields, body))
                if exc.status != 422 or not unknown or self._stopped:
                    self._refused = exc.status is not None
                    raise
            for name in unknown:  # each round leaves one out at least: it ends
                del body[name]
                if self._on_unknown is not None:
                    self._on_unknown(name)
        try:
            self._on_open(data)
        except (KeyError, TypeError):
            raise SidecarError("the sidecar's answer to opening the stream is malformed") from None
        self.opened.set()

    async def _batch_due(self) -> bool:
        """Wait until a chunk is due: enough text, ``flush_interval_s`` after its first, close."""
        while not self._stopped:
            if self._unacked or self._closing:
                return True
            timeout: float | None = None
            if self._unsent:
                if self._unsent_chars >= self._flush_chars:
                    return True
                timeout = self._unsent_since + self._flush_interval_s - time.monotonic()
                if timeout <= 0:
                    return True
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return True
        return False

    def _form_chunks(self) -> None:
        """Turn unsent text into chunks with fixed seqs (a retry re-posts them unchanged, and
    the sidecar ignores a seq it has)."""
        if not self._unsent:
            return
        text = "".join(self._unsent)
        self._unsent.clear()
        self._unsent_chars = 0
        if not self._closing and "\ud800" <= text[-1] <= "\udbff":
            # The low half of a surrogate pair may be in the next delta: keep them together.
            self._unsent.append(text[-1])
            self._unsent_chars = 1
            self._unsent_since = time.monotonic()
            text = text[:-1]
        if not text:
            return
        if _lone_surrogate(text):
            raise SidecarError("the thinking text holds a lone surrogate, which cannot be "
                               "sent as UTF-8")
        if not self._unacked:
            self._unacked_since = time.monotonic()
        for start in range(0, len(text), MAX_CHUNK_CHARS):
            self._unacked.append((self._next_seq, text[start: start + MAX_CHUNK_CHARS]))
            self._next_seq += 1

    async def _post_chunks(self) -> None:
        while self._unacked and not self._stopped:
            batch: list[tuple[int, str]] = []
            chars = 0
            for chunk in self._unacked[:MAX_CHUNKS_PER_POST]:
                if batch and chars + len(chunk[1]) > MAX_CHARS_PER_POST:
                    break
                batch.append(chunk)
                chars += len(chunk[1])
            body = {"chunks": [{"seq": seq, "text": text} for seq, text in batch]}
            try:
                data = await self._post(f"/v1/streams/{self._stream_id}/chunks", body)
                through = int(data["accepted_through"])
            except SidecarError as exc:
                if not exc.transient or self._stopped:
                    raise
                await backoff(exc, self._unacked_since, self._client.timeout_s)
                continue
            except (KeyError, TypeError, ValueError):
                raise SidecarError("the sidecar's answer to the chunks is malformed") from None
            if through < batch[0][0]:
                raise SidecarError(f"the sidecar did not accept the chunks (accepted through "
                                   f"seq {through}, below seq {batch[0][0]})")
            self._unacked = [chunk for chunk in self._unacked if chunk[0] > through]
            self._unacked_since = time.monotonic()
