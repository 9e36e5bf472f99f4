"""One replica of the pool: a local engine shared by many sidecars, and the routes it serves.

Serve's batches of calls join the replica's fair queue (``pool/fair.py``); one engine task
runs turns of the waiting calls, shared between their clients, and answers each call once
all its texts have run, or unrun at its deadline or when its sidecar gives up on it. How
the pool fits together is in docs/ARCHITECTURE.md (the pool).
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at run
# time, from inside Serve's wrapper of the class.

import asyncio
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from models.base import Job
from models.errors import BackendError, BackendTimeout, Expired
from models.local import LocalConfig, LocalTranslator
from models.pooled import PoolCall
from models.spans import Protected
from pool.calls import CallLimits, parse_call, read_within, too_large, unauthorized
from pool.clients import UNNAMED, Clients, Sharing, Unauthorized
from pool.fair import FairQueue, Slice
from pool.ray_logs import replica_logs
from service.chain.batching import Cutoff, Pair, check_outputs
from service.exceptions import PayloadTooLarge, ThinktransError
from service.http.problems import error_problem, install_handlers, problem
from service.settings import POOL_BATCH_WAIT_MS_MAX, Settings

log = logging.getLogger("thinktrans.pool")
# What a call is answered with when it is not served.
Failure = ThinktransError | BackendError

RECENT_BATCHES = 256  # model batches kept for /v1/stats
NOT_READY = "pool-not-ready"  # the problem slug that tells sidecars the pool is not serving
# Serve batches that may wait for the engine at once; the calls a replica takes
# (max_ongoing_requests) bound them first.
OVERLAPPING_BATCHES = 4096
# Serve's batch takes its limits when the class is made: the settings' defaults, until a
# replica's user_config (``pool.deployment.application``: the settings') sets its own.
FIRST_BATCH_SIZE: int = Settings.model_fields["pool_max_batch_size"].default
FIRST_BATCH_WAIT_MS: float = Settings.model_fields["pool_batch_wait_ms"].default

api = FastAPI(title="thinktrans pool", docs_url=None, redoc_url=None)
install_handlers(api)


@dataclass(slots=True)
class _Queued:
    """A call as the route hands it to Serve's batch."""

    call: PoolCall
    due: float | None  # monotonic; None: no deadline
    client: str = UNNAMED  # who it counts as (``Clients.identify``)
    cancelled: bool = False  # its sender gave up (closed the connection): never run
    late: bool = False  # answered expired by its route at its deadline, counted there
    kept: dict[str, int] | None = None  # how its texts' spans were kept, once run


@dataclass(slots=True, eq=False)
class _Waiting:
    """A call waiting for engine turns (an item of the replica's ``FairQueue``; its texts
    may run in several), what it has got so far, and where its answer goes."""

    sent: _Queued
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
        return self.sent.cancelled


def _answer(w: _Waiting, outcome: list[str] | Failure) -> None:
    """Answer a call once (a call dropped, then failed with its turn, keeps the first)."""
    if not w.answer.done():
        w.answer.set_result(outcome)


def _segments(queued: Sequence[_Queued]) -> int:
    """Serve's batch size, in segments rather than calls."""
    return sum(len(q.call.texts) for q in queued)


@dataclass
class _Stats:
    """What this replica ran, for ``/v1/stats`` and the benchmarks."""

    calls: int = 0
    expired_calls: int = 0
    expired_segments: int = 0
    cancelled_segments: int = 0  # given up by their sidecars before their engine turn
    model_batches: int = 0
    model_segments: int = 0
    merged_batches: int = 0  # model batches holding segments of two sidecars or more
    recent: deque[dict[str, float]] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def expired(self, call: PoolCall) -> None:
        self.expired_calls += 1
        self.expired_segments += len(call.texts)

    def cancelled(self, call: PoolCall) -> None:
        self.cancelled_segments += len(call.texts)

    def ran(self, segments: int, sidecars: int, ms: float) -> None:
        self.model_batches += 1
        self.model_segments += segments
        self.merged_batches += sidecars > 1
        self.recent.append({"segments": segments, "sidecars": sidecars, "ms": round(ms, 1)})


def _identity(translator: LocalTranslator) -> str | None:
    """What decides a replica's output, for the sidecars' cache key: its config and, per
    target it serves, the local engine's own cache identity (the model and its version,
    engine, compute type, device, decoding options). Stable over time and the same on every
    replica of one deployment; None until the model is loaded."""
    if not translator.ready:
        return None
    routes = sorted({str(translator.cache_identity(None, None, target))
                     for target in translator.languages() or []})
    facts = {"config": asdict(translator.config), "routes": routes}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Texts start:end of a call, as an engine call takes them.
_Part = tuple[PoolCall, int, int]


def _by_pair(taken: Sequence[Slice[_Waiting]]) -> dict[Pair, list[Slice[_Waiting]]]:
    """A turn's slices grouped by (source, target, model), in order."""
    groups: dict[Pair, list[Slice[_Waiting]]] = {}
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


# Its options (replicas, CPUs, GPUs, max_ongoing_requests, user_config) are set in one
# place, ``pool.deployment.application``; a Serve config overrides them.
@serve.deployment(name="Pool", health_check_period_s=10)
@serve.ingress(api)
class Pool:
    """One replica: a local engine and the batch queue in front of it."""

    async def __init__(self, local: LocalConfig, token_sha256: str | None,  # type: ignore[misc]
                       timeout_s: float, limits: CallLimits, log_level: str,
                       sharing: Sharing) -> None:
        replica_logs(log_level)
        self.translator = LocalTranslator(local)
        self.timeout_s = timeout_s
        self.limits = limits
        self.max_batch_size = FIRST_BATCH_SIZE
        self.batch_wait_ms = FIRST_BATCH_WAIT_MS
        self.tally = _Stats()
        self.clients = Clients(sharing.policies, shared_sha256=token_sha256,
                               max_waiting=sharing.max_waiting, max_clients=sharing.max_clients,
                               metrics_max_clients=sharing.metrics_max_clients, metrics=True)
        # Calls, for the engine, one queue per client.
        self.waiting: FairQueue[_Waiting] = FairQueue(fair=sharing.fair, unit=sharing.unit,
                                                      weight=self.clients.weight)
        # Runs engine turns, one at a time, while calls wait (started by the first call).
        self.engine: asyncio.Task[None] | None = None
        self.pace_s = 0.0  # seconds an engine turn spends per segment, recently
        # Serve routes to a replica once this returns: not before its model is loaded. A
        # load that fails fails the replica, and Serve starts another.
        await self.translator.start()
        if not await self.translator.wait_ready():
            reason = self.translator.reason
            await self.translator.aclose()  # no retries in a replica that is failing
            raise RuntimeError(f"the pool's model did not load: {reason}")
        self.identity = _identity(self.translator)

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's ``user_config``: the batch limits, changeable without a restart."""
        unknown = set(config) - {"max_batch_size", "batch_wait_ms", "fair"}
        if unknown:
            raise ValueError(f"unknown user_config keys {sorted(unknown)}; "
                             "use max_batch_size, batch_wait_ms, fair")
        fair = config.get("fair", self.waiting.fair)
        if not isinstance(fair, bool):
            raise ValueError("fair must be true or false")
        self.waiting.fair = fair
        size = int(config.get("max_batch_size", self.max_batch_size))
        wait_ms = float(config.get("batch_wait_ms", self.batch_wait_ms))
        if size < 1 or not 0 <= wait_ms <= POOL_BATCH_WAIT_MS_MAX:
            raise ValueError("max_batch_size must be >= 1 and batch_wait_ms in "
                             f"0..{POOL_BATCH_WAIT_MS_MAX}")
        self.max_batch_size, self.batch_wait_ms = size, wait_ms
        self.run.set_max_batch_size(size)  # type: ignore[attr-defined]
        self.run.set_batch_wait_timeout_s(wait_ms / 1000.0)  # type: ignore[attr-defined]

    # -- routes ------------------------------------------------------------------------------

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @api.get("/readyz")
    async def readyz(self) -> JSONResponse:
        ready = self.translator.ready
        return JSONResponse({"ready": ready, "reason": self.translator.reason},
                            status_code=200 if ready else 503)

    @api.get("/v1/info")
    async def info(self, request: Request) -> JSONResponse:
        if isinstance(self._owner(request), JSONResponse):
            return unauthorized()
        t = self.translator
        facts = t.info()
        body = {"ready": t.ready, "reason": t.reason, "max_batch_size": self.max_batch_size,
                **asdict(self.limits), "engine": facts.get("engine"),
                "default_model": facts.get("model"), "models": t.catalog(),
                "languages": t.languages(), "identity": self.identity,
                # False for a random-weight test checkpoint: its output is in no language,
                # and the sidecars' language check is off for it, as for `local`.
                "checked_output": t.capabilities.checked_output}
        return JSONResponse(body, status_code=200 if t.ready else 503)

    @api.get("/v1/stats")
    async def stats(self, request: Request) -> JSONResponse:
        """The replica's counts; of its clients, every one's for the shared token (or none
        needed), a client's own for its own token."""
        owner = self._owner(request)
        if isinstance(owner, JSONResponse):
            return owner
        s = self.tally
        body = {k: v for k, v in vars(s).items() if k != "recent"}
        body.update(max_batch_size=self.max_batch_size, fair=self.waiting.fair,
                    fair_unit=self.waiting.unit, clients=self.clients.view(owner),
                    clients_forgotten=self.clients.forgotten,
                    recent=list(s.recent))
        return JSONResponse(body)

    @api.post("/v1/batch")
    async def batch(self, request: Request) -> JSONResponse:
        owner = self._owner(request)
        if isinstance(owner, JSONResponse):
            return owner
        body = await read_within(request, self.limits.max_call_bytes)
        if body is None:  # the rest is not read: the connection closes after the answer
            return too_large(self.limits.max_call_bytes)
        try:
            call = parse_call(body, self.max_batch_size, self.limits)
            client = self.clients.identify(owner, call.sidecar)
        except ThinktransError as exc:
            return error_problem(exc)
        if not self.translator.ready:  # loaded at start; a model can only fail later
            return problem(503, "Pool not ready", self.translator.reason or "model not loaded",
                           NOT_READY)
        self.tally.calls += 1
        try:  # its segments count as its client's until it is answered
            self.clients.admit(client, len(call.texts), self.pace_s)
        except ThinktransError as exc:  # over its cap: a 429 with Retry-After
            return error_problem(exc)
        try:
            return await self._serve_call(_Queued(call, None, client))
        finally:
            self.clients.release(client, len(call.texts))

    async def _serve_call(self, queued: _Queued) -> JSONResponse:
        call = queued.call
        if call.deadline_ms is not None and call.deadline_ms <= 0:
            self._expire(queued)
            return error_problem(Expired("the call's deadline had passed when it arrived"))
        if call.deadline_ms is not None:
            queued.due = time.monotonic() + call.deadline_ms / 1000
        try:
            outcome = await self._by_deadline(queued)
        except asyncio.CancelledError:
            # The sidecar gave up on it (its deadline, its timeout). Serve drops a call it
            # still holds; one already waiting for an engine turn is dropped there.
            queued.cancelled = True
            raise
        except RuntimeError:  # larger than a max_batch_size lowered while it waited
            return error_problem(PayloadTooLarge(f"this pool now takes at most "
                                            f"{self.max_batch_size} texts a call"))
        if isinstance(outcome, ThinktransError | BackendError):
            return error_problem(outcome)
        answer: dict[str, object] = {"translations": outcome, "identity": self.identity,
                                     "model": self.translator.resolve_model(
                                         call.model, call.source, call.target),
                                     "client": queued.client}
        if queued.kept is not None:
            answer["spans"] = queued.kept
        return JSONResponse(answer)

    async def _by_deadline(self, queued: _Queued) -> list[str] | Failure:
        """The call's outcome, or ``Expired`` at its deadline: a call does not wait past it
        for an engine turn of others' work. Once late it is never run (dropped by the turn
        that would take it); an engine turn already running it goes on."""
        if queued.due is None:
            return await self.run(queued)
        try:
            async with asyncio.timeout(queued.due - time.monotonic()):
                return await self.run(queued)
        except TimeoutError:
            queued.cancelled = queued.late = True
            self._expire(queued)
            return Expired("the call's deadline passed while it waited in the pool")

    def _owner(self, request: Request) -> str | JSONResponse | None:
        """Whose token the request carries (a client's id; None: the shared token, or none
        needed), or a 401 problem."""
        try:
            return self.clients.owner(request.headers.get("authorization", ""))
        except Unauthorized:
            return unauthorized()

    def _expire(self, queued: _Queued) -> None:
        self.tally.expired(queued.call)
        self.clients.outcome(queued.client, "expired", len(queued.call.texts))

    # -- the batch ---------------------------------------------------------------------------

    @serve.batch(max_batch_size=FIRST_BATCH_SIZE, batch_wait_timeout_s=FIRST_BATCH_WAIT_MS / 1000,
                 batch_size_fn=_segments, max_concurrent_batches=OVERLAPPING_BATCHES)
    async def run(self, queued: list[_Queued]) -> list[list[str] | Failure]:
        """Serve's batch of calls joins every call waiting for the engine; each engine turn
        takes its share of each client's waiting calls, whoever's batch brought them. While
        the engine is busy, batches formed meanwhile pile up here, so the next turn goes
        full. A call's answer goes back as soon as its last text has run."""
        mine = [_Waiting(q, asyncio.get_running_loop().create_future()) for q in queued]
        for w in mine:
            self.waiting.push(w)
        if self.engine is None or self.engine.done():
            self.engine = asyncio.get_running_loop().create_task(self._turns())
        try:
            await asyncio.wait([w.answer for w in mine])
        except BaseException:
            for w in mine:  # cancelled: ours still waiting are dropped by the next turn
                w.sent.cancelled = True
            raise
        lost = BackendError("the pool lost this call")
        return [w.answer.result() if w.answer.done() else lost for w in mine]

    async def _turns(self) -> None:
        """Engine turns while calls wait; every call pushed is answered by one, or dropped
        (and answered) by one's cutoff."""
        while len(self.waiting) > 0:
            if not await self._turn():
                break

    async def _turn(self) -> bool:
        """One engine turn: up to ``max_batch_size`` segments and ``max_call_chars``
        characters of the waiting calls, shared between their clients (``FairQueue``), by
        (source, target, model) group, one engine call per group. A call whose sender gave
        up, or whose deadline has passed when it is taken or when its group's turn comes,
        is answered unrun and takes no room. Whether any call was taken."""
        popped = len(self.waiting) > 0  # the first call is taken (or dropped) whatever its size
        taken = self.waiting.take(self.max_batch_size, self.limits.max_call_chars,
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
                if live:
                    await self._run_group(live, source, target, model)
        except BaseException as exc:  # a bug, an unmapped engine error, a cancellation
            if isinstance(exc, Exception):
                log.exception("engine turn failed: %s", type(exc).__name__)
            for piece in taken:  # every call taken is answered, whoever's batch brought it
                self._fail(piece.item, BackendError(f"the pool failed: {type(exc).__name__}"))
            if not isinstance(exc, Exception):
                raise
        segments = sum(piece.end - piece.start for piece in taken)
        if segments:  # the pace a Retry-After is reckoned at
            self.pace_s = 0.8 * self.pace_s + 0.2 * (time.monotonic() - now) / segments
        return popped

    def _cutoff(self) -> Cutoff[_Waiting]:
        """What must not run now: calls their senders gave up, calls past their deadline."""
        return Cutoff(time.monotonic(), expired=self._expired, gone=self._given_up)

    def _given_up(self, w: _Waiting) -> None:
        if not w.sent.late:  # a late one is counted, and answered, by its route
            self.tally.cancelled(w.sent.call)
            self.clients.outcome(w.client, "cancelled", len(w.sizes))
        _answer(w, Expired("the sender gave up on it"))

    def _expired(self, w: _Waiting) -> None:
        self._expire(w.sent)
        _answer(w, Expired("the call's deadline passed while it waited in the pool"))

    def _fail(self, w: _Waiting, error: Failure) -> None:
        if not w.answer.done():
            self.clients.outcome(w.client, "failed", len(w.sizes))
        _answer(w, error)

    async def _run_group(self, members: list[Slice[_Waiting]], source: str | None,
                         target: str, model: str | None) -> None:
        calls = [(piece.item.sent.call, piece.start, piece.end) for piece in members]
        texts = [text for call, start, end in calls for text in call.texts[start:end]]
        job = Job(texts, source, target, model, protected=_protected(calls),
                  preview=any(call.preview for call, _, _ in calls), previous=_previous(calls))
        started = time.monotonic()
        try:
            outputs, kept = await asyncio.wait_for(self.translator.run_kept(job), self.timeout_s)
            check_outputs(LocalTranslator.name, texts, outputs)
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
