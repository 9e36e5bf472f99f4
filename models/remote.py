"""What the remote backends (DeepL, an LLM endpoint, the pool) share: readiness that follows
the vendor, and its answers read within a bound (``AnswerBound``).

A remote backend counts as ready until its vendor says otherwise. A failure a person must fix
(a rejected key, a spent quota) marks it not ready and refuses requests at once; an outage
lets the next request try, and heals it when that one succeeds. Either way a background probe
(the subclass's ``_check``, never billed) runs until the vendor answers again: slowly after
the first kind, quickly after the second; without it nothing would bring the backend back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from abc import abstractmethod
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx

from models.base import Translator
from models.errors import BackendError, BackendUnavailable, BadOutput

# What ends a line of a streamed answer (server-sent events allow all three).
_EOL = re.compile(rb"\r\n|\r|\n")
# Headers of a body as it came, not as it is kept once read (decoded, perhaps cut).
_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class AnswerBound:
    """The most bytes a backend reads of one answer of its vendor (a body, or one line of a
    streamed body), and the setting that says so. Past it the reading stops and the
    connection is closed: an answer that never ends costs this much memory, no more."""

    max_bytes: int
    setting: str  # the THINKTRANS_* variable, named in the error

    def exceeded(self, what: str) -> BadOutput:
        return BadOutput(f"{what} exceeded {self.max_bytes} bytes ({self.setting}); "
                         "read no further")

    async def body(self, response: httpx.Response, what: str) -> bytes:
        """The whole body of a streamed ``response``; BadOutput past the bound."""
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > self.max_bytes:
                await response.aclose()
                raise self.exceeded(what)
        return bytes(body)

    async def prefix(self, response: httpx.Response) -> bytes:
        """The first ``max_bytes`` of a streamed ``response``'s body, the rest unread."""
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= self.max_bytes:
                await response.aclose()
                break
        return bytes(body[:self.max_bytes])

    async def read(self, response: httpx.Response, what: str) -> httpx.Response:
        """A streamed ``response``, read: a success's body whole (BadOutput past the bound),
        an error's (4xx, 5xx) first bytes only, which are enough for its reason."""
        content = (await self.prefix(response) if response.is_error
                   else await self.body(response, what))
        headers = [(name, value) for name, value in response.headers.multi_items()
                   if name.lower() not in _BODY_HEADERS]
        return httpx.Response(response.status_code, headers=headers, content=content,
                              request=response.request)

    async def lines(self, response: httpx.Response, what: str) -> AsyncIterator[str]:
        """The lines of a streamed ``response``, as text; BadOutput at a line longer than
        the bound, whatever lines came before it."""
        pending = bytearray()  # the line begun, not ended yet
        async for chunk in response.aiter_bytes():
            at = max(0, len(pending) - 1)  # a \r kept back may be half of a \r\n
            pending += chunk
            start = 0
            while (end := _EOL.search(pending, at)) is not None:
                if end.group() == b"\r" and end.end() == len(pending):
                    break  # perhaps half of a \r\n: the next chunk tells
                if end.start() - start > self.max_bytes:
                    break
                yield pending[start:end.start()].decode("utf-8", "replace")
                start = at = end.end()
            del pending[:start]
            if len(pending) > self.max_bytes:
                await response.aclose()
                raise self.exceeded(what)
        if pending:
            yield pending.decode("utf-8", "replace")


class RemoteTranslator(Translator):
    """A backend behind a vendor's endpoint; subclasses implement ``_check`` and ``translate``."""

    # Seconds between probes after a failure a person must fix, and after an outage.
    recheck_after_s: float = 60.0
    outage_recheck_s: float = 5.0

    def __init__(self) -> None:
        super().__init__()
        # Messages come from the backend's own module logger (models.deepl, models.llm).
        self._log = logging.getLogger(type(self).__module__)
        self._configured = True
        self._fail_fast = False  # refuse at once until the probe succeeds
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()  # start check and other background work
        self._prober: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None

    @abstractmethod
    async def _check(self) -> None:
        """Ask the vendor whether it would serve (not billed), marking the backend up or down.

        Raises BackendError, the backend already marked down, when the vendor would not.
        """

    def _not_configured(self, reason: str) -> None:
        """A setting is missing: not ready for good, and nothing is ever sent."""
        self._configured = False
        self.ready = False
        self.reason = reason

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Run the start-time check in the background; start-up does not wait for it."""
        if self._configured and not self._closed and self._start_task is None:
            self._start_task = self._spawn(self._start_check())

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait for the start-time check, ``timeout_s`` at most; return ``ready``."""
        task = self._start_task
        if task is not None and not task.done():
            # asyncio.wait neither cancels the check on timeout nor raises what it raised.
            await asyncio.wait([task], timeout=timeout_s)
        return self.ready

    async def aclose(self) -> None:
        """Stop the start check, the probe and any other background work."""
        self._closed = True
        tasks = [t for t in (*self._tasks, self._prober) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- readiness ---------------------------------------------------------------------------

    def _refuse_if_unusable(self) -> None:
        """Raise BackendUnavailable where a request must not be sent at all."""
        if not self._configured:
            raise BackendUnavailable(self.reason or f"the {self.name} backend is not configured")
        if self._closed:
            raise BackendUnavailable(f"the {self.name} backend is closed")
        if not self.ready and self._fail_fast:
            raise BackendUnavailable(self.reason or f"the {self.name} backend is not available")

    def _mark_down(self, reason: str, *, fail_fast: bool) -> None:
        """Not ready for ``reason``; start the probe that brings the backend back."""
        if self.ready or self.reason != reason:
            self._log.warning("%s backend not ready: %s", self.name, reason)
        self.ready = False
        self.reason = reason
        self._fail_fast = fail_fast
        if self._closed or (self._prober is not None and not self._prober.done()):
            return
        with contextlib.suppress(RuntimeError):  # no running loop: the next request probes
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())

    def _mark_up(self) -> None:
        """The vendor answered as it should: ready again."""
        if not self.ready and self._configured:
            self._log.info("%s backend ready again", self.name)
            self.ready = True
            self.reason = None
            self._fail_fast = False

    async def _probe_until_up(self) -> None:
        while not self.ready and not self._closed:
            await asyncio.sleep(self.recheck_after_s if self._fail_fast else self.outage_recheck_s)
            with contextlib.suppress(BackendError):  # the check marked it down again
                await self._check()

    async def _start_check(self) -> None:
        try:
            await self._check()
        except BackendError as exc:
            self._log.warning("%s start check failed: %s", self.name, exc.detail)

    # -- background tasks --------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` in the background, kept until done and stopped by ``aclose``."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            detail = exc.detail if isinstance(exc, BackendError) else type(exc).__name__
            self._log.warning("%s background check failed: %s", self.name, detail)
