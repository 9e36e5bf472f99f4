"""A replica's two lanes (``Lanes``): segment calls, and preview calls behind them, so that a
preview never holds the engine while segment work waits, as the sidecar's batcher keeps
its previews (service/chain/batcher.py).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from pool.fair import FairItem, FairQueue, Slice, Unit
from service.chain.batching import Cutoff

T = TypeVar("T", bound=FairItem)


class Lanes(Generic[T]):
    """Calls waiting for engine turns, in two fair queues: ``segments`` and ``previews``
    (calls marked ``preview``); ``len()`` counts both.

    A turn takes segment calls while any wait; preview calls only while none waits and
    none is on its way (``expect``: admitted by the route, not yet queued). A preview turn
    runs under a stop signal of its own (``Job.stop``), set as soon as a segment call is
    expected or queued, or once every call the turn took has been given up: the engine
    then ends the preview's decode within a step (models/local/engines.py) and its calls
    are answered ``Stopped``. Preview calls never share a turn with segment calls.
    """

    def __init__(self, *, fair: bool, unit: Unit, weight: Callable[[str], float]) -> None:
        self.segments: FairQueue[T] = FairQueue(fair=fair, unit=unit, weight=weight)
        self.previews: FairQueue[T] = FairQueue(fair=fair, unit=unit, weight=weight)
        self.coming = 0  # segment calls admitted and not yet queued
        self._stop: threading.Event | None = None  # the running preview turn's
        self._running: list[T] = []  # the calls that turn took

    def __len__(self) -> int:
        return len(self.segments) + len(self.previews)

    @property
    def fair(self) -> bool:
        return self.segments.fair

    @fair.setter
    def fair(self, fair: bool) -> None:
        self.segments.fair = self.previews.fair = fair

    @property
    def unit(self) -> Unit:
        return self.segments.unit

    @property
    def preview_running(self) -> bool:
        """Whether a preview turn runs now."""
        return self._stop is not None

    def expect(self) -> None:
        """A segment call admitted, on its way to ``push``: previews yield to it now."""
        self.coming += 1
        self._stop_previews()

    def arrived(self) -> None:
        """A call ``expect`` announced has been pushed, or will never be."""
        self.coming = max(0, self.coming - 1)

    def push(self, item: T, *, preview: bool) -> None:
        if preview:
            self.previews.push(item)
        else:
            self.segments.push(item)
            self._stop_previews()

    def ready(self) -> bool:
        """Whether a turn would take calls now."""
        return len(self.segments) > 0 or (len(self.previews) > 0 and self.coming == 0)

    def take(self, max_texts: int, max_chars: int = sys.maxsize, *,
             cutoff: Cutoff[T] | None = None) -> tuple[list[Slice[T]], threading.Event | None]:
        """One turn (``FairQueue.take``): of the segment calls while any wait or is on its
        way; else of the preview calls, with the stop signal they run under until
        ``finished`` (None for a segment turn)."""
        if len(self.segments) > 0 or self.coming:
            return self.segments.take(max_texts, max_chars, cutoff=cutoff), None
        taken = self.previews.take(max_texts, max_chars, cutoff=cutoff)
        if not taken:
            return taken, None
        self._stop = threading.Event()
        self._running = [piece.item for piece in taken]
        return taken, self._stop

    def finished(self, stop: threading.Event | None) -> None:
        """The turn that ran under ``stop`` is over."""
        if stop is not None and stop is self._stop:
            self._stop, self._running = None, []

    def given_up(self) -> None:
        """A call's sender gave up on it: a preview turn whose every call is given up
        stops."""
        if self._stop is not None and all(item.gone() for item in self._running):
            self._stop.set()

    def _stop_previews(self) -> None:
        if self._stop is not None:
            self._stop.set()
