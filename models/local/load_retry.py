"""``LoadRetry``: the local backend's load, tried until it succeeds, and the readiness it reports.

The service starts at once and stays up while the model cannot load: each failure says why
(``reason``, which every segment carries) and when the next attempt comes (``retrying``, for
/readyz and the log); the wait doubles up to a bound, so a directory mounted later or a hub
that comes back is picked up without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from models.base import first_line
from models.local.checkpoint import LoadError


class LoadRetry:
    """Runs ``load`` on ``executor`` until it succeeds, ``initial_s`` after a failure, doubling
    up to ``max_s``; owns the task that retries, the attempt in flight and readiness.

    ``load(closed)`` runs on the executor's thread: True once the models are loaded and
    served, False when ``closed()`` turned true meanwhile; LoadError (its message is the
    reason) or anything else when they cannot be.
    """

    def __init__(self, executor: Executor, load: Callable[[Callable[[], bool]], bool], *,
                 model_id: str, initial_s: float, max_s: float, log: logging.Logger) -> None:
        self._executor = executor
        self._load = load
        self._model_id = model_id
        self._initial_s = initial_s
        self._max_s = max_s
        self._log = log  # the backend's: its messages are the backend's
        # The load attempt in flight (None between attempts) and the task that retries.
        self._attempt: asyncio.Future[bool] | None = None
        self._task: asyncio.Task[None] | None = None
        self.attempts = 0
        self.failures = 0
        self.closed = False
        self.ready = False
        self.reason: str | None = f"model {model_id!r} not loaded: the backend has not been started"
        self.retrying: str | None = None  # when the next attempt comes, after a failure

    async def start(self) -> None:
        """Begin the first attempt and return at once; retry while it fails."""
        if self._task is not None or self.closed:
            return
        self.reason = f"loading model {self._model_id!r}"
        loop = asyncio.get_running_loop()
        first = self._begin(loop)
        self._task = loop.create_task(self._until_ready(first), name="thinktrans-local-load")

    def _begin(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[bool]:
        self.attempts += 1
        attempt = loop.run_in_executor(self._executor, self._run)
        self._attempt = attempt
        return attempt

    def _run(self) -> bool:
        """On the worker: one attempt; ``ready`` once it loads, else ``reason`` says why (the
        retry task logs it)."""
        try:
            loaded = self._load(lambda: self.closed)
        except LoadError as exc:
            self.reason = str(exc)
            return False
        except Exception as exc:  # never let a bad checkpoint take the service down
            self.reason = f"loading model {self._model_id!r} failed: {first_line(exc)}"
            self._log.exception("local: loading %r failed", self._model_id)
            return False
        if not loaded:
            return False
        self.reason = None
        self.ready = True
        return True

    async def _until_ready(self, attempt: asyncio.Future[bool]) -> None:
        """Await each attempt; after a failure, wait (5 s, doubling, capped) and retry."""
        loop = asyncio.get_running_loop()
        delay = self._initial_s
        while not await attempt and not self.closed:
            self.failures += 1
            self._attempt = None
            wait = min(delay, self._max_s)
            delay = wait * 2
            # The reason stays as the attempt left it (every segment carries it); the
            # schedule is /readyz's and the log's.
            failed = self.attempts
            self.retrying = f"{_attempt_name(failed)} failed; trying again in {wait:g} s"
            self._log.error("local: %s; %s", self.reason, self.retrying)
            await asyncio.sleep(wait)
            if self.closed:
                return
            self.retrying = f"trying again now (attempt {failed + 1})"
            try:
                attempt = self._begin(loop)
            except RuntimeError:  # the executor is shut down: closed meanwhile
                return
        self.retrying = None

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait for the attempt in flight, ``timeout_s`` at most, starting if need be; return
        ``ready``. Between retries (an attempt has failed) it answers False at once: it never
        waits through the backoff."""
        if self._task is None:
            await self.start()
        future = self._attempt
        if future is None:  # closed before it started, or waiting to retry
            return self.ready
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            # The load itself was dropped (the executor shut down); only our own
            # cancellation propagates.
            task = asyncio.current_task()
            if not future.cancelled() or (task is not None and task.cancelling()):
                raise
        return self.ready

    def close(self) -> None:
        """Not ready for good: stop retrying (the task ends at the loop's next turn). An
        attempt running finishes; the owner of the executor drops queued ones."""
        self.closed = True
        self.ready = False
        self.reason = "the local backend is closed"
        self.retrying = None
        if self._task is not None:
            self._task.cancel()

    async def aclose(self) -> None:
        """``close``, and wait for the task that retried to end."""
        self.close()
        task = self._task
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)


def _attempt_name(number: int) -> str:
    return "the first attempt" if number == 1 else f"attempt {number}"
