"""What the sidecar's `pool` backend knows of its pool, and when it asks again.

The pool says what it serves, its limits and its identity in ``GET /v1/info``, and each
answer to a call names the model that served it. ``PoolInfo`` keeps that word and reads it
again on a schedule; the backend (``models.pooled``) reads it, judges the pool's answers
(up, down, refused) and hands each ready ``/v1/info`` answer here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from models.errors import BackendError
from models.languages import canonical, table_key

# Texts in one call when the pool has not said its own limit yet.
DEFAULT_CALL_TEXTS = 32
# Pairs whose serving model is remembered (resolve_model); past it the memory starts over.
MAX_SERVED_PAIRS = 4096
# Reads of /v1/info that answers asked for: at most one this often.
REFRESH_GAP_S = 5.0

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolLimits:
    """What one call to the pool may carry, by the names ``/v1/info`` gives them: texts, the
    characters of one text and of a call's texts in all, and a call's body in bytes."""

    max_batch_size: int
    max_text_chars: int
    max_call_chars: int
    max_call_bytes: int


class PoolInfo:
    """The pool's last ready ``/v1/info`` answer and the model its answers named per pair,
    read again every ``refresh_s`` while the backend is up, and soon (at most once every
    ``REFRESH_GAP_S``) after an answer says the pool changed.

    ``check`` reads ``/v1/info``, marks the backend up or down and hands a ready answer to
    ``take``; ``up`` says whether the backend is up (while it is down, its probe reads).
    ``defaults``: the limits until the pool has said its own."""

    refresh_s = 30.0  # what the pool serves, read again while it is up

    def __init__(self, defaults: PoolLimits, *, check: Callable[[], Awaitable[None]],
                 up: Callable[[], bool]) -> None:
        self.defaults = defaults
        self._check = check
        self._up = up
        self._info: dict[str, Any] = {}  # the pool's last /v1/info answer that was ready
        # (model named, source, target) -> the model the pool's answers named for it
        self._served: dict[tuple[str | None, str | None, str], str] = {}
        self._next_refresh = 0.0  # monotonic: no refresh on demand before it
        self._refresher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- what the pool said ------------------------------------------------------------------

    def take(self, body: dict[str, Any]) -> None:
        """A ready ``/v1/info`` answer: what the pool serves from now on."""
        if body.get("identity") != self._info.get("identity"):
            self._served.clear()  # another deployment: its models may route otherwise
        self._info = body

    def heard(self, model: str | None, source: str | None, target: str,
              body: dict[str, Any]) -> None:
        """A call's answer: the model it names serves the pair; an identity other than
        ``/v1/info``'s (redeployed or reconfigured) is read again soon, the cache key with it."""
        if isinstance(body.get("model"), str):
            if len(self._served) >= MAX_SERVED_PAIRS:
                self._served.clear()
            self._served[(model, source, target)] = body["model"]
        if body.get("identity") != self._info.get("identity"):
            self.refresh_soon()

    @property
    def identity(self) -> object:
        """The pool's deployment as ``/v1/info`` named it; None until it has."""
        return self._info.get("identity")

    @property
    def engine(self) -> object:
        return self._info.get("engine")

    @property
    def checked_output(self) -> bool:
        """False only when the pool says so: a random-weight test checkpoint, whose output
        is noise in no language, so the output check is off for it, as `local` turns it off."""
        return self._info.get("checked_output") is not False

    def limits(self) -> PoolLimits:
        """The pool's limits from ``/v1/info``; each of ``defaults`` until it has said."""
        d = self.defaults
        return PoolLimits(self._limit("max_batch_size", d.max_batch_size),
                          self._limit("max_text_chars", d.max_text_chars),
                          self._limit("max_call_chars", d.max_call_chars),
                          self._limit("max_call_bytes", d.max_call_bytes))

    def _limit(self, name: str, default: int) -> int:
        limit = self._info.get(name)
        return limit if isinstance(limit, int) and limit > 0 else default

    def languages(self) -> list[str] | None:
        langs = self._info.get("languages")
        return list(langs) if isinstance(langs, list) else None

    def supports(self, target: str, model: str | None) -> bool:
        """Whether the pool serves ``target`` (any, until it has said); a named model's
        languages are the pool's to judge."""
        langs = self.languages()
        if langs is None or model is not None:
            return True
        tag = canonical(target)
        return tag is not None and table_key(tag) in langs

    def catalog(self) -> list[dict[str, object]]:
        models = self._info.get("models")
        return list(models) if isinstance(models, list) else []

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model the pool's answers named for the pair, else the named one, else the
        pool's default."""
        served = self._served.get((model, source, target))
        if served is not None:
            return served
        default = self._info.get("default_model")
        return model if model is not None else (str(default) if default else None)

    # -- reading it again ----------------------------------------------------------------------

    def start(self) -> None:
        """Read ``/v1/info`` again every ``refresh_s`` while the backend is up: limits,
        catalog and identity change when the pool is reconfigured or redeployed."""
        if self._refresher is None and not self._closed:
            self._refresher = self._spawn(self._refresh_while_up())

    def refresh_soon(self) -> None:
        """Read ``/v1/info`` again now (an answer says it changed): at most one read every
        ``REFRESH_GAP_S``, however many answers say so."""
        now = time.monotonic()
        if self._closed or now < self._next_refresh:
            return
        self._next_refresh = now + REFRESH_GAP_S
        self._spawn(self._refresh())

    async def aclose(self) -> None:
        """Stop reading."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh_while_up(self) -> None:
        # A read that only waits behind a busy pool's batches does not count against it
        # (``check`` says so); the batches say soon enough when it is gone.
        while not self._closed:
            await asyncio.sleep(self.refresh_s)
            if self._up():
                await self._refresh()

    async def _refresh(self) -> None:
        with contextlib.suppress(BackendError):  # the check has marked the backend down
            await self._check()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning("pool backend: a read of /v1/info failed: %s",
                         type(task.exception()).__name__)
