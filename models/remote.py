"""What the remote backends (DeepL, an LLM endpoint) share: readiness that follows the vendor.

A remote backend counts as ready until its vendor says otherwise. A failure a person must fix
(a rejected key, a spent quota) marks it not ready and refuses requests at once; an outage
marks it not ready but lets the next request try, and heals it when that one succeeds.
Either way a background probe (the subclass's ``_check``, never billed) runs until the vendor
answers again: slowly after the first kind, quickly after the second. The pipeline skips a
backend that is not ready, so without the probe nothing would bring it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import abstractmethod
from collections.abc import Coroutine
from typing import Any

from models.base import Translator
from models.errors import BackendError, BackendUnavailable


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
