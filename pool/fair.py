"""Fair engine turns: calls waiting for a pool replica's engine, shared between its clients
(``FairQueue``), so that one sidecar's flood does not hold back the others' work.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from service.chain.batching import Cutoff, Pair

__all__ = ["FairItem", "FairQueue", "Slice", "Unit", "shares"]

Unit = Literal["characters", "segments"]

# A turn's room in characters when it has no bound of its own.
MAX_ROOM = float(1 << 40)


class FairItem(Protocol):
    """A call as the queue holds it."""

    queued: bool  # waiting, with texts not yet taken (the queue sets and clears it)
    taken: int  # its texts taken by turns so far (the queue moves it)

    @property
    def client(self) -> str: ...

    @property
    def pair(self) -> Pair: ...

    @property
    def enqueued(self) -> float: ...

    @property
    def due(self) -> float | None: ...

    @property
    def sizes(self) -> Sequence[int]:
        """Its texts' characters, one per text."""

    def gone(self) -> bool: ...


T = TypeVar("T", bound=FairItem)


@dataclass(frozen=True, slots=True)
class Slice(Generic[T]):
    """Texts ``start:end`` of a call, taken by one turn."""

    item: T
    start: int
    end: int

    @property
    def last(self) -> bool:
        """Whether it ends its call."""
        return self.end == len(self.item.sizes)


def shares(capacity: float, demand: Mapping[str, float], weight: Callable[[str], float]
           ) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity``: a client wanting less than its weighted
    share of what is left gets what it wants, and the rest is split again among the others."""
    out = dict.fromkeys(demand, 0.0)
    open_ = {c for c, d in demand.items() if d > 0}
    left = float(capacity)
    while open_ and left > 1e-9:
        total = sum(weight(c) for c in open_)
        met = {c for c in open_ if demand[c] - out[c] <= left * weight(c) / total}
        if not met:
            for c in open_:
                out[c] += left * weight(c) / total
            break
        for c in met:
            left -= demand[c] - out[c]
            out[c] = demand[c]
        open_ -= met
    return out


class _Turn(Generic[T]):
    """One turn's budget left, and what it has taken."""

    __slots__ = ("chars", "slices", "texts")

    def __init__(self, max_texts: int, max_chars: int) -> None:
        self.texts, self.chars = max_texts, max_chars
        self.slices: list[Slice[T]] = []

    def add(self, item: T, start: int, end: int, chars: int) -> None:
        """Texts ``start:end`` of ``item``: one slice with those of it taken before them."""
        for i, earlier in enumerate(self.slices):
            if earlier.item is item and earlier.end == start:
                self.slices[i] = Slice(item, earlier.start, end)
                break
        else:
            self.slices.append(Slice(item, start, end))
        self.texts -= end - start
        self.chars -= chars


class FairQueue(Generic[T]):
    """Calls waiting for engine turns, one queue per client; ``len()`` counts the calls with
    texts still to take, given up or not.

    Each client (a sidecar, named by ``THINKTRANS_POOL_CLIENT_ID``) has a queue of its own,
    first in first out. An engine turn takes at most ``max_texts`` texts and ``max_chars``
    characters; when more waits than that, the turn is shared by deficit round robin, measured
    in what the engine spends (``unit``: its texts' characters, about its tokens, or its
    segments), never in calls:

    1. each client with work waiting is owed its weighted max-min share of the turn (water
       filling: a client wanting less than an even share gets all it wants, the others split
       the rest by weight), added to its deficit; it takes texts while their cost is within its
       deficit, the clients wanting least first;
    2. room left over (a client's next text costs more than it is owed yet) goes to the clients
       owed most, charged to their deficits (at most one turn into debt), so no turn runs part
       empty while work waits: a client alone gets the whole turn.

    A turn's room is ``max_chars`` characters (or ``max_texts`` segments). In characters a text
    costs its length, and at least its place in the turn (``max_chars / max_texts``): a short
    text takes one of the turn's ``max_texts`` places all the same, so shares hold whichever
    bound binds. A client's deficit carries over while it has work waiting (a text larger than
    its share runs once its deficit has grown to it), within one turn's room either way, and is
    cleared when its queue empties, so one idle for a while comes back with no credit and no
    debt. A call's texts may run in several turns: a turn takes what fits, and the rest of
    the call waits at the head of its queue.

    Without fairness (``fair=False``) a turn takes the oldest calls first, whoever sent them,
    as a plain queue would; a call that does not fit whole is still split to fill the turn.

    Items given up, or past due (``Cutoff``), are dropped where a turn meets them, unrun, and
    handed to the cutoff's handlers.
    """

    def __init__(self, *, fair: bool, unit: Unit,
                 weight: Callable[[str], float] = lambda client: 1.0) -> None:
        self.fair = fair
        self.unit: Unit = unit
        self.weight = weight
        self._queues: dict[str, deque[T]] = {}  # clients with calls waiting, in turn order
        self._deficit: dict[str, float] = {}
        self._size = 0
        self._cutoff: Cutoff[T] | None = None  # the turn's, while it is taken
        self._slot = 0.0  # a text's least cost in a turn (characters): max_chars / max_texts

    def __len__(self) -> int:
        return self._size

    def clients(self) -> list[str]:
        """The clients with calls waiting."""
        return list(self._queues)

    def deficit(self, client: str) -> float:
        """What a client is owed (negative: in debt), in the queue's unit."""
        return self._deficit.get(client, 0.0)

    def push(self, item: T) -> None:
        self._queues.setdefault(item.client, deque()).append(item)
        item.queued = True
        self._size += 1

    def take(self, max_texts: int, max_chars: int = sys.maxsize, *,
             cutoff: Cutoff[T] | None = None) -> list[Slice[T]]:
        """One turn's texts, at most ``max_texts`` and ``max_chars`` characters (its first
        text whatever its size), as slices of calls, the oldest first. Calls ``cutoff``
        drops (by default, those given up) leave the queue, handed to its handlers, and
        take no room."""
        self._cutoff = cutoff
        try:
            self._prune()
            turn: _Turn[T] = _Turn(max_texts, max_chars)
            if not self._queues:
                return []
            if self.fair:
                chars = float(min(max_chars, MAX_ROOM))
                self._slot = 0.0 if self.unit == "segments" else chars / max_texts
                self._shared(turn, float(max_texts) if self.unit == "segments" else chars)
            else:
                self._oldest_first(turn)
            self._settle()
        finally:
            self._cutoff = None
        return sorted(turn.slices, key=lambda piece: piece.item.enqueued)  # oldest first

    # -- the two rules ------------------------------------------------------------------------

    def _oldest_first(self, turn: _Turn[T]) -> None:
        while turn.texts > 0:
            self._prune(settle=False)
            heads = [q[0] for q in self._queues.values() if q]
            if not heads or not self._take(min(heads, key=lambda i: i.enqueued), turn, None):
                return

    def _shared(self, turn: _Turn[T], capacity: float) -> None:
        demand = {c: self._demand(q, capacity) for c, q in self._queues.items()}
        owed = shares(capacity, demand, self.weight)
        for client in sorted(self._queues, key=lambda c: demand[c]):  # the smallest first
            # Credit of at most one turn: a client a full turn keeps from its share does not
            # bank it without end.
            self._deficit[client] = min(capacity, self._deficit.get(client, 0.0) + owed[client])
            self._serve(client, turn, floor=None)
        # The room left: to those owed most, into debt of at most one turn.
        for client in sorted(self._queues, key=lambda c: -self._deficit[c]):
            self._serve(client, turn, floor=-capacity)
        waiting = [c for c, q in self._queues.items() if q]
        if not turn.slices and waiting:  # texts larger than any deficit: the most owed runs
            client = max(waiting, key=lambda c: self._deficit[c])
            self._take(self._queues[client][0], turn, float("inf"))

    def _serve(self, client: str, turn: _Turn[T], floor: float | None) -> None:
        """Texts of ``client`` while they fit the turn and, without a ``floor``, its deficit
        (with one, until its deficit would fall below it)."""
        queue = self._queues[client]
        while queue and turn.texts > 0:
            if self._dead(queue[0]):  # given up, or late, behind a call taken before it
                self._pop(queue)
                continue
            limit = self._deficit[client] - (0.0 if floor is None else floor)
            if not self._take(queue[0], turn, limit):
                return

    def _cost(self, size: int) -> float:
        """What one text of ``size`` characters costs a turn, in the queue's unit: a segment;
        or its characters, and at least its place in the turn (``max_chars / max_texts``)."""
        return 1.0 if self.unit == "segments" else max(float(size), self._slot)

    def _take(self, item: T, turn: _Turn[T], budget: float | None) -> bool:
        """The next texts of ``item`` that fit the turn (and cost at most ``budget``, charged
        to its client's deficit); whether it took any."""
        sizes, start = item.sizes, item.taken
        end, chars, cost = start, 0, 0.0
        slack = 1e-9 * max(1.0, abs(budget or 0.0)) if budget is not None else 0.0
        while end < len(sizes) and end - start < turn.texts:
            step = self._cost(sizes[end]) if budget is not None else 0.0
            if budget is not None and cost + step > budget + slack:
                break
            first = end == start and not turn.slices  # goes whatever its size
            if chars + sizes[end] > turn.chars and not first:
                break
            chars += sizes[end]
            cost += step
            end += 1
        if end == start:
            return False
        turn.add(item, start, end, chars)
        item.taken = end
        if budget is not None:
            self._deficit[item.client] -= cost
        if end == len(sizes):
            self._pop(self._queues[item.client])
        return True

    # -- bookkeeping --------------------------------------------------------------------------

    def _demand(self, queue: Iterable[T], capacity: float) -> float:
        """What a client wants of a turn, counted no further than the whole turn."""
        total = 0.0
        for item in queue:
            for size in item.sizes[item.taken:]:
                total += self._cost(size)
                if total >= capacity:
                    return capacity
        return total

    def _pop(self, queue: deque[T]) -> None:
        item = queue.popleft()
        if item.queued:
            item.queued = False
            self._size -= 1

    def _dead(self, item: T) -> bool:
        """Whether a call must leave the queue unrun: taken whole already, given up, or
        dropped by the turn's cutoff (which hands it to its handler)."""
        cutoff = self._cutoff
        return not item.queued or (item.gone() if cutoff is None else cutoff.drops(item))

    def _prune(self, *, settle: bool = True) -> None:
        """Drop the calls at the queues' heads that must not run."""
        for queue in self._queues.values():
            while queue and self._dead(queue[0]):
                self._pop(queue)
        if settle:
            self._settle(rotate=False)

    def _settle(self, *, rotate: bool = True) -> None:
        """Clients whose queue emptied leave the turn order, their deficit cleared; the
        first of the others goes last next turn (ties in size take turns)."""
        for client in [c for c, q in self._queues.items() if not q]:
            del self._queues[client]
            self._deficit.pop(client, None)
        if rotate and len(self._queues) > 1:
            first = next(iter(self._queues))
            self._queues[first] = self._queues.pop(first)
