"""A replica's engine turns (``Turns``): the calls its lanes hold (``pool/lanes.py``), run on
its local engine one turn at a time, one engine call per (source, target, model) group, and
each call answered once all its texts have run, or unrun: given up, past its deadline,
failed, or (a preview) stopped for segment calls. The replica's routes and Serve's batches
feed it (``pool/replica.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from models.base import Job
from models.errors import BackendError, BackendTimeout, Expired, Stopped
from models.local import LocalTranslator
from models.pooled import PoolCall
from models.spans import Protected
from pool.clients import UNNAMED, Clients
from pool.fair import Slice
from pool.lanes import Lanes
from service.chain.batching import Cutoff, Pair, check_outputs
from service.exceptions import ThinktransError

log = logging.getLogger("thinktrans.pool")
# What a call is answered with when it is not served.
Failure = ThinktransError | BackendError

RECENT_BATCHES = 256  # model batches kept for /v1/stats


@dataclass(slots=True)
class Queued:
    """A call as the route hands it to Serve's batch."""

    call: PoolCall
    due: float | None  # monotonic; None: no deadline
    client: str = UNNAMED  # who it counts as (``Clients.identify``)
    cancelled: bool = False  # its sender gave up (closed the connection): never run
    late: bool = False  # answered expired by its route at its deadline, counted there
    coming: bool = False  # a segment call the lanes expect (``Lanes.expect``), not yet queued
    kept: dict[str, int] | None = None  # how its texts' spans were kept, once run


@dataclass(slots=True, eq=False)
class Waiting:
    """A call waiting for engine turns (an item of the replica's ``FairQueue``; its texts
    may run in several), what it has got so far, and where its answer goes."""

    sent: Queued
    answer: asyncio.Future[list[str] | Failure]
    pair: Pair = field(init=False)
    enqueued: float = field(default_factory=time.monotonic)
    queued: bool = False  # waiting with texts not yet taken (set by the queue)
    taken: int = 0  # texts taken by turns (moved by the queue)
    sizes: list[int] = field(init=False)  # its texts' characters
    outputs: list[str] = field(default_factory=list)  # translations, in order, so far
    started: bool = False  # a turn has taken some of it

    def __post_init__(self) -> None:
        call = self.sent.call
        self.pair = (call.source, call.target, call.model)
        self.sizes = [len(text) for text in call.texts]

    @property
    def client(self) -> str:
        return self.sent.client

    @property
    def due(self) -> float | None:
        return self.sent.due

    def gone(self) -> bool:
        """Given up by its sender, or answered already (a failed or stopped call whose
        other texts still wait): none of it runs any more."""
        return self.sent.cancelled or self.answer.done()


def _answer(w: Waiting, outcome: list[str] | Failure) -> None:
    """Answer a call once (a call dropped, then failed with its turn, keeps the first)."""
    if not w.answer.done():
        w.answer.set_result(outcome)


@dataclass
class Stats:
    """What this replica ran, for ``/v1/stats`` and the benchmarks."""

    calls: int = 0
    expired_calls: int = 0
    expired_segments: int = 0
    cancelled_segments: int = 0  # given up by their sidecars before their engine turn
    stopped_segments: int = 0  # of preview calls stopped for segment calls
    model_batches: int = 0
    model_segments: int = 0
    merged_batches: int = 0  # model batches holding segments of two sidecars or more
    recent: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def expired(self, call: PoolCall) -> None:
        self.expired_calls += 1
        self.expired_segments += len(call.texts)

    def cancelled(self, call: PoolCall) -> None:
        self.cancelled_segments += len(call.texts)

    def stopped(self, segments: int) -> None:
        self.stopped_segments += segments

    def ran(self, segments: int, sidecars: int, ms: float) -> None:
        self.model_batches += 1
        self.model_segments += segments
        self.merged_batches += sidecars > 1
        self.recent.append({"segments": segments, "sidecars": sidecars, "ms": round(ms, 1)})


# Texts start:end of a call, as an engine call takes them.
_Part = tuple[PoolCall, int, int]


def _by_pair(taken: Sequence[Slice[Waiting]]) -> dict[Pair, list[Slice[Waiting]]]:
    """A turn's slices grouped by (source, target, model), in order."""
    groups: dict[Pair, list[Slice[Waiting]]] = {}
    for piece in taken:
        groups.setdefault(piece.item.pair, []).append(piece)
    return groups


def _previous(parts: Sequence[_Part]) -> list[str | None] | None:
    """A group's previous previews, one per text of all its parts (None for a text of a
    call that is not a preview); None: no preview call has any."""
    if not any(call.preview and call.previous for call, _, _ in parts):
        return None
    out: list[str | None] = []
    for call, start, end in parts:
        out += (call.previous[start:end] if call.preview and call.previous is not None
                else [None] * (end - start))
    return out


def _protected(parts: Sequence[_Part]) -> list[Protected | None] | None:
    """The spans of a group's parts, one per text of all of them; None: no call has any."""
    if all(call.spans is None for call, _, _ in parts):
        return None
    out: list[Protected | None] = []
    for call, start, end in parts:
        out += (call.protected() or [None] * len(call.texts))[start:end]
    return out


class Turns:
    """The engine turns of one replica, and what it ran (``tally``).

    Serve's batches ``push`` their calls into the lanes; one engine task, started while calls
    a turn would take wait, runs the turns one at a time. A route tells it of a segment call
    on its way (``expect``), so that a preview turn yields to it at once, and of one that
    came, or never will (``arrived``). Every call pushed is answered by a turn, or dropped
    (and answered) by a turn's cutoff.
    """

    def __init__(self, translator: LocalTranslator, lanes: Lanes[Waiting], clients: Clients,
                 *, timeout_s: float, max_batch_size: int, max_call_chars: int) -> None:
        self.translator = translator
        self.lanes = lanes
        self.clients = clients
        self.timeout_s = timeout_s
        self.max_batch_size = max_batch_size  # Serve's user_config sets it again
        self.max_call_chars = max_call_chars
        self.tally = Stats()
        # Runs engine turns, one at a time, while calls wait (started by the first call).
        self.engine: asyncio.Task[None] | None = None
        self.pace_s = 0.0  # seconds an engine turn spends per segment, recently

    def push(self, queued: Sequence[Queued]) -> list[Waiting]:
        """A batch of calls into the lanes, each with the future its answer goes to."""
        mine = [Waiting(q, asyncio.get_running_loop().create_future()) for q in queued]
        for w in mine:
            self.lanes.push(w, preview=w.sent.call.preview)
        for q in queued:
            self.arrived(q)
        self._kick()
        return mine

    def expect(self, queued: Queued) -> None:
        """A segment call admitted by its route, on its way to ``push``: a preview turn
        running stops now, and none starts until it has come (or never will)."""
        queued.coming = True
        self.lanes.expect()

    def arrived(self, queued: Queued) -> None:
        """A segment call the lanes expect is queued, or never will be: previews held back
        for it may run (the engine started for them if it is idle)."""
        if queued.coming:
            queued.coming = False
            self.lanes.arrived()
            self._kick()

    def expire(self, queued: Queued) -> None:
        """A call answered expired, unrun: counted."""
        self.tally.expired(queued.call)
        self.clients.outcome(queued.client, "expired", len(queued.call.texts))

    def _kick(self) -> None:
        """Start the engine task if calls a turn would take wait and it is not running."""
        if self.lanes.ready() and (self.engine is None or self.engine.done()):
            self.engine = asyncio.get_running_loop().create_task(self._turns())

    async def _turns(self) -> None:
        """Engine turns while calls a turn would take wait; every call pushed is answered by
        one, or dropped (and answered) by one's cutoff."""
        while self.lanes.ready():
            if not await self._turn():
                break

    async def _turn(self) -> bool:
        """One engine turn: up to ``max_batch_size`` segments and ``max_call_chars``
        characters of the waiting calls of one lane (``Lanes``: previews only while no
        segment call waits), shared between their clients (``FairQueue``), by (source,
        target, model) group, one engine call per group. A call whose sender gave up, or
        whose deadline has passed when it is taken or when its group's turn comes, is
        answered unrun and takes no room; a preview turn told to stop answers its calls
        ``Stopped``. Whether any call was taken."""
        popped = self.lanes.ready()  # the first call is taken (or dropped) whatever its size
        taken, stop = self.lanes.take(self.max_batch_size, self.max_call_chars,
                                      cutoff=self._cutoff())
        now = time.monotonic()
        for piece in taken:
            if not piece.item.started:
                piece.item.started = True
                self.clients.waited(piece.item.client, now - piece.item.enqueued)
        try:
            for (source, target, model), members in _by_pair(taken).items():
                # A group's calls may expire, or be given up, while an earlier group runs.
                cutoff = self._cutoff()
                live = [piece for piece in members if not cutoff.drops(piece.item)]
                if live and stop is not None and stop.is_set():  # segments came meanwhile
                    for piece in live:
                        self._stop(piece.item)
                elif live:
                    await self._run_group(live, source, target, model, stop)
        except BaseException as exc:  # a bug, an unmapped engine error, a cancellation
            if isinstance(exc, Exception):
                log.exception("engine turn failed: %s", type(exc).__name__)
            for piece in taken:  # every call taken is answered, whoever's batch brought it
                self._fail(piece.item, BackendError(f"the pool failed: {type(exc).__name__}"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self.lanes.finished(stop)
        segments = sum(piece.end - piece.start for piece in taken)
        if segments and stop is None:  # the pace a Retry-After is reckoned at
            self.pace_s = 0.8 * self.pace_s + 0.2 * (time.monotonic() - now) / segments
        return popped

    def _cutoff(self) -> Cutoff[Waiting]:
        """What must not run now: calls their senders gave up, calls past their deadline."""
        return Cutoff(time.monotonic(), expired=self._expired, gone=self._given_up)

    def _given_up(self, w: Waiting) -> None:
        if w.answer.done():  # answered already (failed, stopped): counted then
            return
        if not w.sent.late:  # a late one is counted, and answered, by its route
            self.tally.cancelled(w.sent.call)
            self.clients.outcome(w.client, "cancelled", len(w.sizes))
        _answer(w, Expired("the sender gave up on it"))

    def _expired(self, w: Waiting) -> None:
        self.expire(w.sent)
        _answer(w, Expired("the call's deadline passed while it waited in the pool"))

    def _fail(self, w: Waiting, error: Failure) -> None:
        if not w.answer.done():
            self.clients.outcome(w.client, "failed", len(w.sizes))
        _answer(w, error)

    def _stop(self, w: Waiting) -> None:
        """A preview call stopped for segment calls: answered ``Stopped``, its texts not yet
        translated counted stopped."""
        if not w.answer.done():
            left = len(w.sizes) - len(w.outputs)
            self.tally.stopped(left)
            self.clients.outcome(w.client, "stopped", left)
        _answer(w, Stopped("segment calls came to wait for this replica's engine: the "
                           "preview stopped"))

    async def _run_group(self, members: list[Slice[Waiting]], source: str | None,
                         target: str, model: str | None, stop: threading.Event | None
                         ) -> None:
        """One engine call of a turn's group; ``stop``: a preview turn's stop signal."""
        calls = [(piece.item.sent.call, piece.start, piece.end) for piece in members]
        texts = [text for call, start, end in calls for text in call.texts[start:end]]
        job = Job(texts, source, target, model, protected=_protected(calls),
                  preview=any(call.preview for call, _, _ in calls), previous=_previous(calls),
                  stop=stop)
        started = time.monotonic()
        try:
            outputs, kept = await asyncio.wait_for(self.translator.run_kept(job), self.timeout_s)
            check_outputs(LocalTranslator.name, texts, outputs)
        except Stopped:  # segment calls came while it decoded
            for piece in members:
                self._stop(piece.item)
            return
        except (BackendError, TimeoutError) as exc:
            error = exc if isinstance(exc, BackendError) else BackendTimeout(
                f"the engine took over {self.timeout_s:g} s")
            for piece in members:
                self._fail(piece.item, error)
            return
        self.tally.ran(len(texts), len({piece.item.client for piece in members}),
                       (time.monotonic() - started) * 1000)
        at = 0
        for piece in members:  # the outputs back, per call, answered once it is whole
            w, size = piece.item, piece.end - piece.start
            w.outputs += outputs[at:at + size]
            if w.sent.call.spans is not None:
                counts = w.sent.kept or {"masked": 0, "fallback": 0}
                own = kept[at:at + size]
                w.sent.kept = {name: counts[name] + own.count(name) for name in counts}
            at += size
            self.clients.outcome(w.client, "translated", size)
            if piece.last:
                _answer(w, w.outputs)
