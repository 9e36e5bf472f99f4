"""Send a segment down a backend chain: the first usable backend's batcher, then the next.

A backend fails, goes down, or answers badly (the wrong language, a protected span lost);
the chain lets the next one serve the segment rather than leave it untranslated. Only
answers that passed every check are cached, and an instruction one stream plants in its
context steers only answers for that same context, never another client's.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.base import Translator
from models.errors import BackendError, BadOutput
from models.spans import Protected
from service.chain.batcher import Batcher
from service.chain.cache import CacheKey, TranslationCache, context_mark
from service.chain.work import SegmentWork, Translation
from service.exceptions import Overloaded, UnknownBackend
from service.ops.metrics import Metrics
from service.text.detect import Detector
from service.text.tags import same_language


@dataclass(eq=False, slots=True)
class _Attempt:
    """The dispatcher's own record of one segment's work on its way down a chain."""

    work: SegmentWork
    rest: list[str]  # the backends not tried yet
    result: asyncio.Future[Translation]
    errors: list[str] = field(default_factory=list)
    pending: _Work | None = None  # the work it waits on, while queued or running
    backend: str = ""  # the backend of that work
    key: CacheKey | None = None  # the cache key of that work (None: not cached)
    held: Batcher | None = None  # joined identical work there: holds a place in its queue

    def __post_init__(self) -> None:
        self.result.add_done_callback(self._on_result)

    def _on_result(self, result: asyncio.Future[Translation]) -> None:
        if result.cancelled() and self.pending is not None:
            self.unhold()
            self.pending.release()  # the caller gave up: drop the work unless shared

    def unhold(self) -> None:
        if self.held is not None:
            self.held.unhold()
            self.held = None

    def give_up(self) -> None:
        error = BackendError("; ".join(self.errors) or "no backend could serve this segment")
        self.result.set_exception(error)
        self.result.add_done_callback(_consume)  # its reader may have stopped waiting


@dataclass(eq=False, slots=True)
class _Work:
    """A batcher's future and how many attempts wait on it: identical segments in flight
    at once are translated once, and the work is cancelled only when none waits."""

    future: asyncio.Future[Translation]
    waiters: int = 1

    def release(self) -> None:
        self.waiters -= 1
        if self.waiters <= 0:
            self.future.cancel()


def _nothing() -> None:
    """A release with nothing to release: the stream names no model."""


def _consume(future: asyncio.Future[Translation]) -> None:
    if not future.cancelled():
        future.exception()


class Dispatcher:
    """Every configured backend with its batcher; runs segments down chains of them.

    A backend is passed over when it cannot serve the named model, is not ready, has its
    breaker open or cannot serve the pair. The cache is consulted before readiness and the
    breaker, so a backend that is down still serves what it translated before; a segment
    identical to one in flight joins it.
    """

    def __init__(
        self,
        backends: Mapping[str, Translator],
        batchers: Mapping[str, Batcher],
        detector: Detector,
        *,
        default_chain: Sequence[str],
        check_output_language: bool,
        cache: TranslationCache | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.backends = backends
        self.batchers = batchers
        self.detector = detector
        self.default_chain = list(default_chain)
        self.check_output_language = check_output_language
        self.cache = cache if cache is not None and cache.enabled else None
        # Work queued or running, by cache key: an identical segment joins it.
        self._inflight: dict[CacheKey, _Work] = {}
        self.metrics = metrics
        self._saved: dict[str, Any] = {}  # per billed backend: its saved-characters counter

    def chain(self, backend: str | None) -> list[str]:
        """The chain a request asked for (a name or ``a,b``), else the configured one."""
        if backend is None:
            return list(self.default_chain)
        names = [part.strip() for part in backend.split(",") if part.strip()]
        unknown = [n for n in names if n not in self.backends]
        twice = [n for i, n in enumerate(names) if n in names[:i]]
        if not names or unknown or twice:
            raise UnknownBackend(self._unknown(backend, names, unknown, twice),
                                 available=list(self.backends))
        return names

    def _unknown(self, backend: str, names: list[str], unknown: list[str],
                 twice: list[str]) -> str:
        """Why ``backend`` names no chain here, and the backends this server has."""
        have = [*self.default_chain, *(n for n in self.backends if n not in self.default_chain)]
        choose = f"choose from {', '.join(have)}"
        if len(have) > 1:
            choose += f", or a chain of them such as '{have[0]},{have[1]}'"
        if twice:
            return f"backend {backend!r} names {twice[0]!r} twice; name each once ({choose})"
        if not names:
            return f"backend {backend!r} names no backend; {choose}"
        close = difflib.get_close_matches(unknown[0], have, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return (f"backend {unknown[0]!r} is not configured here{hint} ({choose}; the server "
                "serves those of THINKTRANS_BACKEND and THINKTRANS_EXTRA_BACKENDS)")

    def use_model(self, chain: Sequence[str], model: str | None) -> Callable[[], None]:
        """A stream open on ``chain`` names ``model``: each backend keeps it (``use_model``)
        until the release that is returned is called, when the stream is over."""
        if model is None:
            return _nothing
        releases = [self.backends[name].use_model(model) for name in chain]

        def release() -> None:
            for each in releases:
                each()

        return release

    def uses_context(self, chain: Sequence[str]) -> bool:
        """Whether a backend of the chain translates better with the preceding text."""
        return any(self.backends[name].capabilities.context for name in chain)

    # -- room: what admission (service/stream/admission.py) asks ----------------------------------

    def room(self, chain: Sequence[str]) -> int:
        """How many more segments the chain's queues take now: the free places of each
        backend that would be tried (ready, breaker closed). A chain with none of those
        queues nothing (its segments fail at once), so its room is unbounded."""
        usable = [self.batchers[name] for name in chain
                  if self.backends[name].ready and self.batchers[name].available()]
        if not usable:
            return sys.maxsize
        return sum(max(0, batcher.free()) for batcher in usable)

    def queue_bound(self, chain: Sequence[str]) -> int | None:
        """The most the chain's first queue ever holds (None: no such backend)."""
        first = self.batchers.get(chain[0])
        return None if first is None else first.limits.max_queue_size

    # -- translating -------------------------------------------------------------------------

    def submit(self, work: SegmentWork, chain: Sequence[str]) -> asyncio.Future[Translation]:
        """Start one segment's work down the chain; the future gets the first good answer:
        one that keeps every protected span of ``work.protected`` (``models.spans``).

        The segment is accepted work (its caller checked ``room`` before accepting the
        text), so it is never refused: it goes to the first usable backend with room, else
        into the first usable one's queue past its bound. A translation in the cache is
        the answer at once; an identical segment in flight is joined. Cancelling the
        future drops the work wherever it is (unless another segment waits on it). Driven
        by callbacks, not a task: a segment costs no coroutine of its own.
        """
        attempt = _Attempt(work, list(chain), asyncio.get_running_loop().create_future())
        self._next(attempt)
        return attempt.result

    def _next(self, attempt: _Attempt) -> None:
        """Put the attempt on the next backend of its chain, or give up."""
        work = self._enter(attempt)
        if work is None:
            attempt.give_up()
            return
        attempt.pending = work
        work.future.add_done_callback(functools.partial(self._on_answer, attempt))

    def _on_answer(self, attempt: _Attempt, future: asyncio.Future[Translation]) -> None:
        attempt.unhold()
        if attempt.result.done():
            return  # cancelled by the caller
        name = attempt.backend
        try:
            if future.cancelled():
                raise BackendError("cancelled")
            answer = future.result()
            if not answer.cached:
                work = attempt.work
                assert work.target is not None  # a work to translate has one
                self._check_language(answer, work.target)
                _check_spans(answer, work.protected)
        except BackendError as exc:
            attempt.errors.append(f"{name}: {exc.detail}")
            self._next(attempt)
            return
        if attempt.key is not None and not answer.cached and self.cache is not None:
            self.cache.put(attempt.key, answer.text, answer.model)  # passed every check
        attempt.result.set_result(answer)

    def _enter(self, attempt: _Attempt) -> _Work | None:
        """The work for the attempt on the next usable backend of its rest of the chain: a
        cached answer, identical work in flight, or a new item in the backend's queue
        (past its bound when every usable backend is full)."""
        rest, errors = attempt.rest, attempt.errors
        full: list[str] = []
        while rest:
            name = rest.pop(0)
            problem = self.backends[name].model_problem(attempt.work.model)
            if problem is not None:
                errors.append(f"{name}: {problem}")
                continue
            key = self._key(name, attempt.work)
            found = self._found(name, attempt, key)
            if found is not None:
                return found
            if not self.usable(name, attempt.work, errors):
                continue
            try:
                return self._queue(name, attempt, key, force=False)
            except Overloaded:
                full.append(name)
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
        if full:
            name = full[0]
            attempt.rest[:0] = full[1:]  # still to try, should this one fail
            try:
                return self._queue(name, attempt, self._key(name, attempt.work), force=True)
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
        return None

    def _key(self, name: str, work: SegmentWork) -> CacheKey | None:
        """The work's cache key on backend ``name``; None: not cached there."""
        if self.cache is None or work.target is None:
            return None
        translator = self.backends[name]
        identity = translator.cache_identity(work.model, work.source, work.target)
        if identity is None:
            return None
        if translator.capabilities.context:  # the batcher sends it the context: its input
            identity = f"{identity}|{context_mark(work.context)}"
        if work.protected is not None:  # the spans and glossary decide the output too
            identity = f"{identity}|{work.protected.digest}"
        return (identity, work.source, work.target, work.text)

    def _found(self, name: str, attempt: _Attempt, key: CacheKey | None) -> _Work | None:
        """A cached answer of ``name``'s, or identical work in flight there; else None."""
        if key is None or self.cache is None:
            return None
        hit = self.cache.get(key)
        if hit is not None:
            if self.backends[name].capabilities.billed and self.metrics is not None:
                self._saved_counter(name, self.metrics).inc(len(attempt.work.text))
            future: asyncio.Future[Translation] = asyncio.get_running_loop().create_future()
            future.set_result(Translation(hit.text, name, 0.0, hit.model, cached=True))
            attempt.backend, attempt.key = name, None
            return _Work(future)
        work = self._inflight.get(key)
        if work is None or work.future.done():
            return None
        work.waiters += 1
        # Each waiter keeps the key: whichever is still waiting when the answer comes
        # caches it, should the one that queued it have given up.
        attempt.backend, attempt.key = name, key
        attempt.held = self.batchers[name]
        attempt.held.hold()  # a waiting segment all the same: the queue bound covers it
        return work

    def _queue(self, name: str, attempt: _Attempt, key: CacheKey | None, *,
               force: bool) -> _Work:
        future = self.batchers[name].submit(attempt.work, force=force)
        attempt.backend, attempt.key = name, key
        work = _Work(future)
        if key is not None:
            self._inflight[key] = work
            future.add_done_callback(functools.partial(self._done_inflight, key, work))
        return work

    def _done_inflight(self, key: CacheKey, work: _Work, _future: object) -> None:
        if self._inflight.get(key) is work:
            del self._inflight[key]

    def _saved_counter(self, name: str, metrics: Metrics) -> Any:
        counter = self._saved.get(name)
        if counter is None:  # a label lookup takes a lock: once per backend
            counter = self._saved[name] = metrics.cache_billed_chars_saved.labels(name)
        return counter

    def usable(self, name: str, work: SegmentWork, errors: list[str]) -> bool:
        """Whether backend ``name`` would be tried for the work's pair now (ready, breaker
        closed, serving it); if not, why, appended to ``errors``."""
        source, target, model = work.source, work.target, work.model
        if target is None:
            errors.append(f"{name}: no target to translate into")
            return False
        translator = self.backends[name]
        if not translator.ready:
            errors.append(f"{name}: {translator.reason or 'not ready'}")
            return False
        batcher = self.batchers[name]
        if not batcher.available():
            errors.append(f"{name}: {batcher.breaker_reason}")
            return False
        served = (translator.supports(source, target) if model is None
                  else translator.supports(source, target, model=model))
        if not served:
            what = "" if model is None else f" with model {model!r}"
            errors.append(f"{name}: cannot translate {source or 'auto'} -> {target}{what}")
            return False
        return True

    # -- previews ----------------------------------------------------------------------------

    def preview(self, work: SegmentWork, chain: Sequence[str], *,
                billed: bool) -> asyncio.Future[Translation] | None:
        """Start a preview's work on the first backend of the chain that would be tried for
        it, passing over billed ones unless ``billed``; its batcher's low-priority lane,
        never the cache, never down the chain. None: no backend, or its lane is full."""
        for name in chain:
            translator = self.backends[name]
            if translator.capabilities.billed and not billed:
                continue
            if translator.model_problem(work.model) is not None:
                continue
            if self.usable(name, work, []):
                return self.batchers[name].submit_preview(work)
        return None

    def _check_language(self, result: Translation, target: str) -> None:
        """A translation reliably detected in another language than the target is bad."""
        translator = self.backends[result.backend]
        if not self.check_output_language or not translator.capabilities.checked_output:
            return
        det = self.detector.detect(result.text)
        if det.reliable and det.lang is not None and not same_language(det.lang, target):
            raise BadOutput(f"output is in {det.lang}, not {target}")


def _check_spans(result: Translation, protected: Protected | None) -> None:
    """A translation that lost a protected span, or did not render a glossary term, is bad:
    the segment goes on down the chain. The reason names kinds and counts, never text."""
    if protected is None:
        return
    lost = protected.missing(result.text)
    if lost:
        kinds = ", ".join(sorted({span.kind for span in lost}))
        noun = "span" if len(lost) == 1 else "spans"
        raise BadOutput(f"lost {len(lost)} protected {noun} of {len(protected.spans)} "
                        f"({kinds})")
