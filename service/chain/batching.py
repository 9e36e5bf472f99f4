"""The parts a batcher is made of, each testable alone.

The queue, the cut-off of given-up work, the circuit breaker and the check of a backend's
answer each own one state or one rule; the sidecar's ``Batcher`` uses them all, and the
pool's engine turns use the ``Cutoff`` and ``check_outputs`` too.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from models.errors import BadOutput

__all__ = ["Breaker", "Cutoff", "GroupedQueue", "Pair", "Queueable", "check_outputs"]

log = logging.getLogger("thinktrans.batcher")

# What a batch shares: (source, target, the model named or None).
Pair = tuple[str | None, str, str | None]
# Dead items a queue keeps before it may compact (and only once they outnumber live ones).
COMPACT_AFTER = 64


class Queueable(Protocol):
    """What a ``GroupedQueue`` holds: one segment of the batcher, with the pair it shares a
    batch with."""

    # True while counted among the live items; the queue sets and clears it.
    queued: bool

    @property
    def pair(self) -> Pair: ...

    @property
    def enqueued(self) -> float:
        """When it was queued (``time.monotonic()``): the oldest goes first."""

    @property
    def due(self) -> float | None:
        """When its answer is due (monotonic); None: no deadline."""

    @property
    def weight(self) -> int:
        """The places it takes in a batch: its segments."""

    @property
    def chars(self) -> int:
        """The characters it counts toward a batch's budget."""

    def gone(self) -> bool:
        """Given up by its caller: never run."""


T = TypeVar("T", bound=Queueable)


class Droppable(Protocol):
    """What a ``Cutoff`` judges: whether it was given up, and when it is due."""

    @property
    def due(self) -> float | None: ...

    def gone(self) -> bool: ...


D = TypeVar("D", bound=Droppable)


class Cutoff(Generic[D]):
    """What must not run: items given up by their callers, and, when ``now`` is given,
    items due by then. Each is handed to ``gone`` or ``expired``, which answer it where an
    answer is still read; without ``now`` only given-up items are dropped (the sidecar's
    batcher, whose late work still makes a stream's update)."""

    __slots__ = ("expired", "gone", "now")

    def __init__(self, now: float | None = None, *, expired: Callable[[D], None] | None = None,
                 gone: Callable[[D], None] | None = None) -> None:
        if now is not None and expired is None:
            raise ValueError("a cutoff at a time needs `expired`, to answer the late items")
        self.now = now
        self.expired = expired
        self.gone = gone

    def drops(self, item: D) -> bool:
        """Whether ``item`` must not run; if so it has been handed to its handler."""
        if item.gone():
            if self.gone is not None:
                self.gone(item)
            return True
        if self.now is not None and item.due is not None and item.due <= self.now:
            assert self.expired is not None
            self.expired(item)
            return True
        return False

    def sift(self, items: Iterable[D]) -> list[D]:
        """The items to run, in order; the others handed to their handlers."""
        return [item for item in items if not self.drops(item)]


class Breaker:
    """A backend's circuit breaker: after ``failures`` failed batches in a row it opens, and
    the backend is skipped until ``cooloff_s`` has passed; then one more batch is let
    through to try it again (its success closes it)."""

    __slots__ = ("cooloff_s", "failed", "failures", "name", "open_until")

    def __init__(self, name: str, failures: int, cooloff_s: float) -> None:
        self.name = name
        self.failures = failures
        self.cooloff_s = cooloff_s
        self.failed = 0  # consecutive failed batches
        self.open_until = 0.0

    def available(self) -> bool:
        return time.monotonic() >= self.open_until

    @property
    def reason(self) -> str | None:
        if self.available():
            return None
        left = self.open_until - time.monotonic()
        return f"skipped for {left:.0f} s more after {self.failed} failed batches in a row"

    def record(self, ok: bool) -> None:
        if ok:
            self.failed = 0
            return
        self.failed += 1
        if self.failed >= self.failures:
            self.open_until = time.monotonic() + self.cooloff_s
            log.warning("backend %s breaker open for %.0f s after %d failed batches",
                        self.name, self.cooloff_s, self.failed)


class GroupedQueue(Generic[T]):
    """Items waiting for a batch, grouped by pair (``Queueable``). ``len()`` counts the live
    ones: neither taken nor given up.

    A batch is taken from one group, or across groups by the age of their first items,
    within a budget of places and characters. An item given up is counted out at once and
    removed lazily: the queue is compacted once dead items outnumber live ones, so a push
    and a discard are O(1) amortised."""

    def __init__(self) -> None:
        self._groups: OrderedDict[Pair, deque[T]] = OrderedDict()
        self._size = 0  # live items
        self._dead = 0  # discarded items still sitting in the groups

    def __len__(self) -> int:
        return self._size

    def push(self, item: T) -> None:
        """Queue ``item`` at the end of its pair's group. O(1)."""
        group = self._groups.get(item.pair)
        if group is None:
            group = self._groups[item.pair] = deque()
        group.append(item)
        item.queued = True
        self._size += 1

    def discard(self, item: T) -> bool:
        """Count out an item given up while it waits (its place is free now); it leaves its
        group when reached, or at the next compaction. Whether it was waiting."""
        if not item.queued:
            return False  # taken, or already counted out
        item.queued = False
        self._size -= 1
        self._dead += 1
        if self._dead > COMPACT_AFTER and self._dead > self._size:
            self.compact()  # O(queue), after at least as many discards
        return True

    def compact(self) -> None:
        """Remove every discarded item from the groups, and the groups left empty."""
        for pair in list(self._groups):
            live = deque(item for item in self._groups[pair] if item.queued)
            if live:
                self._groups[pair] = live
            else:
                del self._groups[pair]
        self._dead = 0

    def drain(self) -> list[T]:
        """Every item still in the groups, counted out, and the queue emptied."""
        items = [item for group in self._groups.values() for item in group]
        for item in items:
            item.queued = False
        self._groups.clear()
        self._size = self._dead = 0
        return items

    def next_group(self, max_weight: int, max_chars: int) -> tuple[Pair, float, bool] | None:
        """The group whose batch goes next: the first one full (``max_weight`` places or
        ``max_chars`` characters), else the one whose first item has waited longest; with
        that item's enqueue time and whether the group is full. Items given up are dropped
        from the groups' heads first. None: nothing waits."""
        self._prune()
        chosen: tuple[Pair, float] | None = None
        for pair, group in self._groups.items():
            if _full(group, max_weight, max_chars):
                return pair, group[0].enqueued, True
            if chosen is None or group[0].enqueued < chosen[1]:
                chosen = pair, group[0].enqueued
        return None if chosen is None else (*chosen, False)

    def take(self, max_weight: int, max_chars: int = sys.maxsize, *, pair: Pair | None = None,
             cutoff: Cutoff[T] | None = None) -> list[T]:
        """A batch, oldest first: from the group ``pair``, or, without one, from every group
        by the age of their first items; up to ``max_weight`` places and ``max_chars``
        characters (the first item goes whatever its size). Items ``cutoff`` drops (by
        default, those given up) leave the queue and take no room."""
        batch: list[T] = []
        weight = chars = 0
        while (head := self._head(pair)) is not None:
            key, group = head
            item = group[0]
            if not item.queued or (item.gone() if cutoff is None else cutoff.drops(item)):
                self._pop(key, group)
                continue
            if batch and (weight + item.weight > max_weight or chars + item.chars > max_chars):
                break
            batch.append(self._pop(key, group))
            weight += item.weight
            chars += item.chars
        if pair is not None and pair in self._groups:
            self._groups.move_to_end(pair)  # fairness: other pairs go before its rest
        return batch

    def _head(self, pair: Pair | None) -> tuple[Pair, deque[T]] | None:
        """The group ``pair``, or the one whose first item is oldest; None: none waits."""
        if pair is not None:
            group = self._groups.get(pair)
            return None if group is None else (pair, group)
        oldest: tuple[Pair, deque[T]] | None = None
        for key, group in self._groups.items():
            if oldest is None or group[0].enqueued < oldest[1][0].enqueued:
                oldest = key, group
        return oldest

    def _pop(self, pair: Pair, group: deque[T]) -> T:
        """Take a group's first item out, counting it out; an emptied group goes."""
        item = group.popleft()
        if item.queued:
            item.queued = False
            self._size -= 1
        else:
            self._dead -= 1
        if not group:
            del self._groups[pair]
        return item

    def _prune(self) -> None:
        """Drop given-up items from the groups' heads."""
        for pair in list(self._groups):
            group = self._groups[pair]
            while group and (not group[0].queued or group[0].gone()):
                self._pop(pair, group)  # the last one deletes the group


def _full(group: deque[T], max_weight: int, max_chars: int) -> bool:
    if len(group) >= max_weight:  # every item takes a place at least
        return True
    weight = chars = 0
    for item in group:
        weight += item.weight
        chars += item.chars
        if weight >= max_weight or chars >= max_chars:
            return True
    return False


def check_outputs(name: str, texts: Sequence[str], outputs: object, *,
                  partial: bool = False) -> None:
    """The one check of a backend's answer: a list of as many strings as ``texts`` (or,
    for a ``partial`` answer, ``models.errors.PartialOutput``, None for each bad one). No
    backend and no other batcher checks it again (Ray Serve's ``_validate_results``)."""
    if not isinstance(outputs, list) or len(outputs) != len(texts):
        got = len(outputs) if isinstance(outputs, list) else type(outputs).__name__
        raise BadOutput(f"backend {name!r} returned {got} outputs for {len(texts)} inputs")
    if not all(isinstance(o, str) or (partial and o is None) for o in outputs):
        raise BadOutput(f"backend {name!r} returned a non-string output")
