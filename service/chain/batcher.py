"""The batcher: one per backend, fed by every request and stream.

A model or a vendor call serves a batch for about the price of one text, so segments from
every stream wait a few milliseconds to share one. A batch goes when it is full
(``max_batch_size`` items or ``max_batch_chars`` characters) or ``max_wait_ms`` after its
first item, one pair and one model at a time, as a tokenizer or a vendor call takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from models.base import Job, Translator
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    Expired,
    PartialOutput,
    Throttled,
    UnsupportedLanguage,
)
from service.chain.batching import Breaker, Cutoff, GroupedQueue, Pair, check_outputs
from service.chain.work import SegmentWork, Translation
from service.exceptions import Overloaded, kind_of
from service.ops.logs import text_fields
from service.ops.metrics import Metrics

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger("thinktrans.batcher")

__all__ = ["BatchLimits", "Batcher", "Translation"]


@dataclass(slots=True, eq=False)
class _Item:
    """The batcher's own record of a work it holds: the future it answers, the group it
    waits in, and its place in the queue."""

    work: SegmentWork
    pair: Pair  # the group it shares a batch with: (source, target, model)
    future: asyncio.Future[Translation]
    chars: int  # len(work.text), counted once: batches are formed by it
    enqueued: float = field(default_factory=time.monotonic)
    queued: bool = True  # counted in the queue's size (False once taken or cancelled)
    weight: ClassVar[int] = 1  # one segment: one place in a batch

    @property
    def due(self) -> float | None:
        return self.work.due

    @property
    def preview(self) -> bool:
        return self.work.preview

    def gone(self) -> bool:
        """Its caller cancelled it (a queued item's future is done by nothing else)."""
        return self.future.done()


# Drops the items whose callers gave up; late ones still run (a stream's update needs them).
_GIVEN_UP: Cutoff[_Item] = Cutoff()


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The batcher's knobs, checked once with messages that give the bad value. Their
    defaults are the settings' (``from_settings``)."""

    max_batch_size: int
    max_batch_chars: int
    max_wait_ms: float
    max_queue_size: int
    max_concurrency: int
    timeout_s: float
    breaker_failures: int
    breaker_cooloff_s: float
    max_previews: int  # previews waiting in the low-priority lane

    @classmethod
    def from_settings(cls, s: Settings, translator: Translator) -> BatchLimits:
        """The settings' limits, within what ``translator`` takes (its batch size and
        concurrency, where it sets them)."""
        return cls(
            max_batch_size=min(s.max_batch_size, translator.max_batch_size or 1 << 30),
            max_batch_chars=s.max_batch_chars, max_wait_ms=s.max_wait_ms,
            max_queue_size=s.max_queue_size, max_previews=s.preview_max_queue,
            max_concurrency=translator.max_concurrency or s.max_concurrent_batches,
            timeout_s=s.backend_timeout_s, breaker_failures=s.breaker_failures,
            breaker_cooloff_s=s.breaker_cooloff_s)

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_batch_chars", "max_queue_size", "max_concurrency",
                     "max_previews"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not self.max_wait_ms >= 0:  # written so that NaN fails too
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.breaker_failures < 1:
            raise ValueError(f"breaker_failures must be >= 1, got {self.breaker_failures}")
        if not self.breaker_cooloff_s >= 0:
            raise ValueError(f"breaker_cooloff_s must be >= 0, got {self.breaker_cooloff_s}")


class Batcher:
    """Collects one backend's segment works into batches (its queue, its preview lane,
    its concurrency slots) and has its ``_Runner`` run each batch.

    Every future is resolved whatever happens: a result, a ``BackendError``, or cancelled by
    its caller (then dropped unrun). Previews wait in a low-priority lane, bounded by
    ``max_previews`` and not counted in the queue admission reads: a preview batch is formed
    only while no segment waits, and a segment that comes while preview batches hold every
    slot sets their ``Job.stop``. Preview failures neither open the breaker nor count as the
    backend's errors, nor does their success close it.
    """

    def __init__(self, translator: Translator, limits: BatchLimits, metrics: Metrics) -> None:
        self.translator = translator
        self.name = translator.name
        self.limits = limits
        self.metrics = metrics
        self._queue_depth = metrics.queue_depth.labels(self.name)  # looked up once
        self._queue: GroupedQueue[_Item] = GroupedQueue()  # len: items waiting, not cancelled
        # Segments waiting on identical work already here (the dispatcher joins them to
        # it): they take no place in a batch but hold memory, so they count in the queue.
        self._held = 0
        self._waiter: asyncio.Future[None] | None = None  # the loop, waiting for items
        self._slots = asyncio.Semaphore(limits.max_concurrency)
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closed = False
        self.breaker = Breaker(self.name, limits.breaker_failures, limits.breaker_cooloff_s)
        self._runner = _Runner(translator, limits.timeout_s, self.breaker, metrics)
        # The low-priority lane: previews (provisional translations of open sentences). A
        # batch is taken from it only while no segment waits; it has its own bound.
        self._previews: GroupedQueue[_Item] = GroupedQueue()
        # The stop signals of the preview batches running (``Job.stop``): set when a
        # segment comes while every slot is taken, so that it waits for no preview decode.
        self._preview_stops: set[threading.Event] = set()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._loop(), name=f"batcher:{self.name}")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking items, let running batches finish for ``grace_s``, fail the rest."""
        self._closed = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        if self._running:
            _, pending = await asyncio.wait(self._running, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        err = BackendUnavailable(f"backend {self.name!r} is shutting down")
        for item in [*self._queue.drain(), *self._previews.drain()]:  # counted out here
            _fail(item, err)
        self._gauge()

    # -- circuit breaker ---------------------------------------------------------------------

    def available(self) -> bool:
        """False while the breaker is open (``Breaker``): the backend failed
        ``breaker_failures`` batches in a row and is skipped for ``breaker_cooloff_s``."""
        return self.breaker.available()

    @property
    def breaker_reason(self) -> str | None:
        return self.breaker.reason

    # -- submitting ------------------------------------------------------------------------

    @property
    def queue_size(self) -> int:
        return len(self._queue) + self._held

    def free(self) -> int:
        """How many more items the queue takes before it is full."""
        return self.limits.max_queue_size - self.queue_size

    def hold(self) -> None:
        """Count a place for a segment that waits on identical work of this backend (no
        new item): the queue bound, and so admission, still covers every waiting segment.
        Like a forced submit, it is never refused: its text was accepted."""
        self._held += 1
        self._gauge()

    def unhold(self) -> None:
        """Give back a place taken by ``hold`` (its work is done, or its caller gave up)."""
        self._held -= 1
        self._gauge()

    def submit(self, work: SegmentWork, *, force: bool = False) -> asyncio.Future[Translation]:
        """Queue one segment's work; the future gets its Translation or a BackendError.

        Raises Overloaded when the queue is full, unless ``force``: text a stream has
        already accepted is never refused (admission checked the room before accepting
        it). A caller that no longer wants the answer cancels the future; its place in
        the queue is freed on the loop's next turn and the item is dropped unrun. The
        work's ``due`` is for backends that take a deadline. O(1) amortised.
        """
        if self._closed:
            raise BackendUnavailable(f"backend {self.name!r} is shutting down")
        if self.queue_size >= self.limits.max_queue_size and not force:
            raise Overloaded(
                f"the {self.name!r} queue is full ({self.limits.max_queue_size} segments); "
                "retry later or raise THINKTRANS_MAX_QUEUE_SIZE",
                retry_after_s=1,
            )
        item = self._item(work)
        self._queue.push(item)
        self._gauge()
        _wake(self._waiter)
        if self._preview_stops and len(self._running) >= self.limits.max_concurrency:
            for stop in self._preview_stops:  # a segment waits no decode of a preview
                stop.set()
        return item.future

    def submit_preview(self, work: SegmentWork) -> asyncio.Future[Translation] | None:
        """Queue a preview's work in the low-priority lane (``Batcher`` docstring); None when
        the lane holds ``limits.max_previews`` already or the batcher is stopping: no preview
        then. The caller cancels the future once the preview is superseded: unrun, it is
        dropped."""
        if self._closed or len(self._previews) >= self.limits.max_previews:
            return None
        item = self._item(work)
        self._previews.push(item)
        _wake(self._waiter)
        return item.future

    def _item(self, work: SegmentWork) -> _Item:
        """The batcher's record of ``work``, its future answered here."""
        target = work.target
        if target is None:
            raise ValueError(f"segment {work.index} has no target to translate into")
        future: asyncio.Future[Translation] = asyncio.get_running_loop().create_future()
        item = _Item(work, (work.source, target, work.model), future, len(work.text))
        future.add_done_callback(functools.partial(self._on_done, item))
        return item

    def _on_done(self, item: _Item, future: asyncio.Future[Translation]) -> None:
        """A queued item cancelled by its caller gives its place back now (an item taken
        into a batch, or already counted out, is not waiting)."""
        if item.preview:
            self._previews.discard(item)
        elif self._queue.discard(item):
            self._gauge()

    # -- the loop --------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            # A slot is taken *before* a batch is formed: while the backend is busy, items
            # pile up and the next batch goes full.
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            task = asyncio.create_task(self._run(batch), name=f"batch:{self.name}")
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[_Item]:
        """The group whose first item has waited longest, unless one is full: once it is
        full or that item has waited ``max_wait_ms``, its batch. Previews only while no
        segment waits: a segment always overtakes them."""
        size, chars = self.limits.max_batch_size, self.limits.max_batch_chars
        max_wait_s = self.limits.max_wait_ms / 1000.0
        while True:
            queue = self._queue
            head = queue.next_group(size, chars)
            if head is None:
                queue = self._previews
                head = queue.next_group(size, chars)
            if head is None:
                await self._wait_changed(None)
                continue
            pair, oldest, full = head
            remaining = oldest + max_wait_s - time.monotonic()
            if full or remaining <= 0:
                batch = queue.take(size, chars, pair=pair)
                self._gauge()
                return batch
            await self._wait_changed(remaining)

    async def _wait_changed(self, timeout_s: float | None) -> None:
        """Until an item comes (or ``timeout_s``): a bare future and a timer, which cost
        far less per wait than ``asyncio.wait_for`` and its task."""
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = None if timeout_s is None else loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def _run(self, batch: list[_Item]) -> None:
        """Run one batch taken from the queue (its items still wanted), then give its
        concurrency slot back. A preview batch's stop signal is kept while it runs."""
        try:
            live = _GIVEN_UP.sift(batch)
            if not live:
                return
            job = self._runner.job(live)
            if job.stop is not None:
                self._preview_stops.add(job.stop)
            try:
                await self._runner.run(job, live)
            finally:
                if job.stop is not None:
                    self._preview_stops.discard(job.stop)
        finally:
            self._slots.release()

    def _gauge(self) -> None:
        self._queue_depth.set(self.queue_size)


class _Runner:
    """Runs one batch on the backend: the batch as its ``Job``, the call and its check,
    the outcome counted (breaker, metrics, a debug line), and every item's future settled."""

    def __init__(self, translator: Translator, timeout_s: float, breaker: Breaker,
                 metrics: Metrics) -> None:
        self.translator = translator
        self.name = translator.name
        self.timeout_s = timeout_s
        self.breaker = breaker
        self.metrics = metrics
        # This backend's series, looked up once (a label lookup takes a lock).
        self._batch_size = metrics.batch_size.labels(self.name)
        self._batch_seconds = metrics.batch_seconds.labels(self.name)

    async def run(self, job: Job, live: Sequence[_Item]) -> None:
        """The backend's answer to ``job``, made of the items ``live``: a result or an
        error for each."""
        started = time.monotonic()
        self._batch_size.observe(len(live))
        served_by = self.translator.resolve_model(job.model, job.source, job.target)
        # A model one stream named may fail without the backend being at fault: only the
        # backend's own choice counts for its breaker; previews never count.
        counted = job.model is None and not job.preview
        try:
            outputs, partial = await self._call(job)
        except BackendError as exc:
            # Work dropped late, a pair the backend does not serve, or a shared backend
            # holding this client's share already: no fault of it.
            blameless = isinstance(exc, Expired | UnsupportedLanguage | Throttled)
            self._fail_all(live, exc, counted=counted and not blameless)
            return
        except asyncio.CancelledError:
            self._fail_all(live, BackendUnavailable(f"backend {self.name!r} stopped"))
            raise
        if counted:
            self.breaker.record(ok=True)
        self._count_batch(job, live, started, served_by, partial)
        self._settle(live, outputs, partial, started, served_by)

    async def _call(self, job: Job) -> tuple[Sequence[str | None], PartialOutput | None]:
        """The backend's outputs for the job, checked, with the ``PartialOutput`` when only
        some are good; every failure as a ``BackendError`` (a timeout, or a bug or an
        unmapped vendor error: fail the batch, don't hang it)."""
        try:
            try:
                outputs: list[str] = await asyncio.wait_for(
                    self.translator.run(job), self.timeout_s)
            except PartialOutput as exc:  # the good ones are answered, the rest fail
                check_outputs(self.name, job.texts, exc.outputs, partial=True)
                return exc.outputs, exc
            check_outputs(self.name, job.texts, outputs)
            return outputs, None
        except BackendError:
            raise
        except TimeoutError as exc:
            raise BackendTimeout(f"backend {self.name!r} took over "
                                 f"{self.timeout_s:g} s for a batch") from exc
        except Exception as exc:
            log.exception("backend %s raised %s", self.name, type(exc).__name__)
            raise BackendError(f"backend {self.name!r} failed: {type(exc).__name__}") from exc

    def _count_batch(self, job: Job, live: Sequence[_Item], started: float,
                     served_by: str | None, partial: PartialOutput | None) -> None:
        """Metrics and the debug line of a batch the backend answered."""
        elapsed = time.monotonic() - started
        self._batch_seconds.observe(elapsed)
        if self.translator.capabilities.billed:
            self.metrics.billed_chars.labels(self.name).inc(sum(map(len, job.texts)))
        if log.isEnabledFor(logging.DEBUG):  # a line per batch: too many for info
            log.debug("batch", extra={
                "backend": self.name, "size": len(live), "ms": round(elapsed * 1000, 2),
                "source": job.source, "target": job.target, "model": served_by,
                "queued_ms": round((started - live[0].enqueued) * 1000, 2),
                **text_fields("\n".join(job.texts)),  # lengths and a hash, unless log_text
            })
        if partial is not None and not job.preview:
            self.metrics.backend_errors.labels(self.name, kind_of(partial).slug).inc()

    def _settle(self, live: Sequence[_Item], outputs: Sequence[str | None],
                partial: PartialOutput | None, started: float, served_by: str | None) -> None:
        """Each item's future: its translation (``served_by`` the model that made it), or,
        where a partial answer has none, the reason."""
        for item, out in zip(live, outputs, strict=True):
            if out is None:
                assert partial is not None
                _fail(item, BadOutput(partial.detail))
            elif not item.future.done():
                queued_ms = (started - item.enqueued) * 1000.0
                item.future.set_result(Translation(out, self.name, queued_ms, served_by))

    def job(self, live: Sequence[_Item]) -> Job:
        """The batch as the backend takes it, read from its works: contexts only for a
        backend that uses them; due, the latest of theirs (None when one has no deadline)."""
        source, target, model = live[0].pair
        works = [item.work for item in live]
        contexts = ([w.context for w in works] if self.translator.capabilities.context
                    else None)
        dues = [w.due for w in works]
        due = None if None in dues else max(d for d in dues if d is not None)
        protected = [w.protected for w in works]
        preview = works[0].preview  # a batch comes from one lane
        return Job([w.text for w in works], source, target, model, contexts, due,
                   protected if any(p is not None for p in protected) else None,
                   preview=preview,
                   previous=[w.previous for w in works] if preview else None,
                   stop=threading.Event() if preview else None)

    def _fail_all(self, items: Sequence[_Item], exc: BackendError, *,
                  counted: bool = True) -> None:
        slug = kind_of(exc).slug
        preview = items[0].preview  # a preview's failure: no error metric, no breaker
        if not preview:
            self.metrics.backend_errors.labels(self.name, slug).inc()
        log.log(logging.DEBUG if preview else logging.WARNING, "batch failed", extra={
            "backend": self.name, "size": len(items), "error": slug, "preview": preview})
        if counted and not preview:
            self.breaker.record(ok=False)
        for item in items:
            _fail(item, exc)



def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _fail(item: _Item, exc: BaseException) -> None:
    if not item.future.done():
        item.future.set_exception(exc)
        # The caller may have stopped waiting (deadline); don't warn about an unread error.
        item.future.add_done_callback(_consume)


def _consume(future: asyncio.Future[Translation]) -> None:
    if not future.cancelled():
        future.exception()
