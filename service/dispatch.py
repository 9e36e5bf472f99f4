"""Send a segment down a backend chain: the first usable backend's batcher, then the next.

A backend is passed over when it is not ready, its circuit breaker is open, or it cannot
serve the pair; a failed batch, or an answer reliably detected in another language than
the target, sends the segment on to the next backend of the chain. Every backend of the
service has one batcher, shared by every stream and one-shot request.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from models.base import Translator
from service.batcher import Batcher, Translation
from service.detect import Detector
from service.errors import BackendError, BadOutput, Overloaded, PayloadTooLarge, UnknownBackend
from service.locale import same_language


@dataclass(eq=False, slots=True)
class _Attempt:
    """One segment on its way down a chain."""

    text: str
    source: str | None
    target: str
    context: str | None
    rest: list[str]  # the backends not tried yet
    result: asyncio.Future[Translation]
    errors: list[str] = field(default_factory=list)
    pending: asyncio.Future[Translation] | None = None  # the batcher's, while queued

    def __post_init__(self) -> None:
        self.result.add_done_callback(self._on_result)

    def _on_result(self, result: asyncio.Future[Translation]) -> None:
        if result.cancelled() and self.pending is not None:
            self.pending.cancel()  # the caller gave up: drop the queued item unrun

    def give_up(self) -> None:
        error = BackendError("; ".join(self.errors) or "no backend could serve this segment")
        self.result.set_exception(error)
        self.result.add_done_callback(_consume)  # its reader may have stopped waiting


def _consume(future: asyncio.Future[Translation]) -> None:
    if not future.cancelled():
        future.exception()


class Dispatcher:
    """Every configured backend with its batcher; runs segments down chains of them."""

    def __init__(
        self,
        backends: Mapping[str, Translator],
        batchers: Mapping[str, Batcher],
        detector: Detector,
        *,
        default_chain: Sequence[str],
        check_output_language: bool = True,
    ) -> None:
        self.backends = backends
        self.batchers = batchers
        self.detector = detector
        self.default_chain = list(default_chain)
        self.check_output_language = check_output_language
        # Characters streams have accepted and not cut yet: each may still become a segment
        # to queue, so admission counts a place for each (service/streams.py).
        self.uncut = 0

    def chain(self, backend: str | None) -> list[str]:
        """The chain a request asked for (a name or ``a,b``), else the configured one."""
        if backend is None:
            return list(self.default_chain)
        names = [part.strip() for part in backend.split(",") if part.strip()]
        unknown = [n for n in names if n not in self.backends]
        if not names or unknown or len(set(names)) != len(names):
            raise UnknownBackend(
                f"backend {backend!r} is not configured here; choose from "
                f"{', '.join(self.backends)} (or a chain such as 'deepl,local')",
                available=list(self.backends),
            )
        return names

    def uses_context(self, chain: Sequence[str]) -> bool:
        """Whether a backend of the chain translates better with the preceding text."""
        return any(self.backends[name].uses_context for name in chain)

    # -- admission ---------------------------------------------------------------------------

    def room(self, chain: Sequence[str]) -> int:
        """How many more segments the chain's queues take now: the free places of each
        backend that would be tried (ready, breaker closed). A chain with none of those
        queues nothing (its segments fail at once), so its room is unbounded."""
        usable = [self.batchers[name] for name in chain
                  if self.backends[name].ready and self.batchers[name].available()]
        if not usable:
            return sys.maxsize
        return sum(max(0, batcher.free()) for batcher in usable)

    def check_room(self, chain: Sequence[str], wanted: int) -> None:
        """Refuse, before anything is queued, a request whose segments cannot all be queued.

        More than the whole queue holds is 413 (no retry can help); more than the chain's
        queues hold now is 503 with Retry-After.
        """
        first = self.batchers.get(chain[0])
        if first is None or wanted <= 0:
            return
        limit = first.limits.max_queue_size
        if wanted > limit:
            raise PayloadTooLarge(
                f"this request needs {wanted} segments translated; a backend queue holds at "
                f"most THINKTRANS_MAX_QUEUE_SIZE={limit}: send fewer or shorter texts per "
                "request"
            )
        room = max(0, self.room(chain) - self.uncut)
        if wanted > room:
            raise Overloaded(
                f"the {','.join(chain)!r} queue has room for {room} segments, this request "
                f"needs {wanted}; nothing was queued, retry later",
                retry_after_s=1,
            )

    # -- translating -------------------------------------------------------------------------

    def submit(
        self, text: str, source: str | None, target: str, chain: Sequence[str],
        context: str | None = None,
    ) -> asyncio.Future[Translation]:
        """Start one segment's text down the chain; the future gets the first good answer.

        The segment is accepted work (its caller checked ``room`` before accepting the
        text), so it is never refused: it goes to the first usable backend with room, else
        into the first usable one's queue past its bound. Cancelling the future drops the
        work wherever it is. Driven by callbacks, not a task: a segment costs no coroutine
        of its own.
        """
        attempt = _Attempt(text, source, target, context, list(chain),
                           asyncio.get_running_loop().create_future())
        entered = self._enter(attempt)
        if entered is None:
            attempt.give_up()
        else:
            self._await(attempt, *entered)
        return attempt.result

    def _await(self, attempt: _Attempt, name: str, future: asyncio.Future[Translation]) -> None:
        attempt.pending = future
        future.add_done_callback(functools.partial(self._on_answer, attempt, name))

    def _on_answer(self, attempt: _Attempt, name: str,
                   future: asyncio.Future[Translation]) -> None:
        if attempt.result.done():
            return  # cancelled by the caller
        try:
            if future.cancelled():
                raise BackendError("cancelled")
            answer = future.result()
            self._check_language(answer, attempt.target)
        except BackendError as exc:
            attempt.errors.append(f"{name}: {exc.detail}")
            entered = self._enter(attempt)
            if entered is None:
                attempt.give_up()
            else:
                self._await(attempt, *entered)
            return
        attempt.result.set_result(answer)

    def _enter(self, attempt: _Attempt) -> tuple[str, asyncio.Future[Translation]] | None:
        """Queue the text on the next usable backend of the attempt's rest of the chain
        that has room; when every usable one is full, on the first of them regardless."""
        rest, errors = attempt.rest, attempt.errors
        full: list[str] = []
        while rest:
            name = rest.pop(0)
            if not self._usable(name, attempt.source, attempt.target, errors):
                continue
            try:
                return name, self.batchers[name].submit(
                    attempt.text, attempt.source, attempt.target, attempt.context)
            except Overloaded:
                full.append(name)
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
        if full:
            name = full[0]
            attempt.rest[:0] = full[1:]  # still to try, should this one fail
            try:
                return name, self.batchers[name].submit(
                    attempt.text, attempt.source, attempt.target, attempt.context, force=True)
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
        return None

    def _usable(self, name: str, source: str | None, target: str, errors: list[str]) -> bool:
        translator = self.backends[name]
        if not translator.ready:
            errors.append(f"{name}: {translator.reason or 'not ready'}")
            return False
        batcher = self.batchers[name]
        if not batcher.available():
            errors.append(f"{name}: {batcher.breaker_reason}")
            return False
        if not translator.supports(source, target):
            errors.append(f"{name}: cannot translate {source or 'auto'} -> {target}")
            return False
        return True

    def _check_language(self, result: Translation, target: str) -> None:
        """A translation reliably detected in another language than the target is bad."""
        translator = self.backends[result.backend]
        if not self.check_output_language or not translator.check_output_language:
            return
        det = self.detector.detect(result.text)
        if det.reliable and det.lang is not None and not same_language(det.lang, target):
            raise BadOutput(f"output is in {det.lang}, not {target}")
