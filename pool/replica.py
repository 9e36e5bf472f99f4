"""The pool: one Ray Serve application of the local engine, shared by many sidecars.

Sidecars (``THINKTRANS_BACKEND=pool``, ``models/pooled.py``) send the batches they formed,
one call each, to ``POST /v1/batch``, each naming itself (``sidecar``: its client id,
``THINKTRANS_POOL_CLIENT_ID``). A replica merges the calls of every sidecar that arrive
within ``batch_wait_ms`` (``@serve.batch``, its size counted in segments) and puts them in
its queue for the engine, one queue per client (``pool/fair.py``). Serve cuts a batch
every ``batch_wait_ms`` whether or not the engine is busy, so the engine does not run
Serve's batches one by one: each engine turn takes up to ``max_batch_size`` segments and
``max_call_chars`` characters of the waiting calls, whichever batch brought them, shared
between their clients by deficit round robin (``pool_fair``, measured in characters or
segments, ``pool_fair_unit``, weighted by ``pool_clients``; a client alone gets the whole
turn), and the calls that arrive while it runs make the next turn full. A call's texts may
run in several turns; it is answered once all have. A call is answered ``expired`` at its
deadline, whatever turn holds the engine then, and is never run after it; in a turn, calls
whose deadline has passed, or whose sidecar gave up on them, are answered unrun; the rest
are grouped by (source, target, model), each group one call to the local engine, the same
``LocalTranslator`` as the ``local`` backend (its splitting, output bounds and loop guard).
Every call gets its own answer: its translations, or a problem. The cut-off and the check
of the engine's answer are the sidecar batcher's own parts (``service/chain/batching.py``).

Who calls (``pool/clients.py``): a client's own token (``pool_clients``) makes a
call that client's whatever it names, and a client with a token of its own cannot be named
with the shared ``pool_token`` (403). Each client may have ``pool_client_max_waiting``
segments waiting in a replica (or its own ``max_waiting``): a call past that is refused
with 429 ``over-cap`` and a ``Retry-After``, and its sidecar's chain serves it. A replica
holds ``pool_max_ongoing_calls`` calls (Serve's ``max_ongoing_requests``), the calls its
turns share out. Its counts per client are in ``/v1/stats`` (``clients``) and Ray's metrics
(``ray_thinktrans_pool_segments``, ``ray_thinktrans_pool_waiting_segments``).

Run it with ``thinktrans pool`` (a local Ray instance, or ``--address`` to join one), or
deploy ``pool.replica:build`` from a Serve config (``serve run``, ``serve deploy``, KubeRay):
its ``args`` are settings (``local_model``, ..., or ``config``: a settings YAML file), the
deployment ``Pool`` takes Serve's own options (replicas, ``ray_actor_options.num_gpus``,
autoscaling) and ``user_config`` its batch limits (``max_batch_size``, ``batch_wait_ms``)
and turn rule (``fair``).

A call is bounded (``Limits``, each a 413 that names its setting): its body in bytes (read no
further than that, chunked or not), its texts' characters each and in all. The sidecars
read the limits from ``/v1/info`` and cut their batches to them.

A call may carry its texts' protected spans (``spans``: per text ``[start, end, kind, out]``,
checked here: in range, in order, not overlapping; a 422 otherwise); the engine gets them as
``Job.protected`` and keeps each, and the answer says how (``spans: {"masked", "fallback"}``).
Calls with spans and without merge into one engine call all the same.

A preview call (``preview: true``) may carry ``previous``, per text its sentence's previous
preview or null (one per text, each at most ``max_text_chars``, at most ``max_call_chars``
in all: a 422 or a 413 otherwise). The engine gets them as ``Job.previous`` of a preview job,
and its CTranslate2 engine decodes those texts towards them (``local_preview_bias``); a
preview call and final ones merge as any calls do, the final ones' texts with no previous
(decoded as ever). A call that is not a preview has its ``previous`` ignored.

``thinktrans pool`` writes JSON lines on stderr, as the service does: its own, its
replicas', Ray's (a JSON ``LoggingConfig``, so worker lines come without Ray's coloured
prefix); Serve's own logs go, as JSON, to its files in Ray's session directory
(``logs/serve``), not to stderr, where Serve writes text only. It stops by deleting the
application (its replicas finish their calls) and then the Ray instance it started.

Routes: ``GET /healthz`` (alive), ``GET /readyz`` (model loaded: 200, else 503), and, with
a bearer token when ``pool_token`` or a client's token is set, ``GET /v1/info`` (what
sidecars probe), ``POST /v1/batch`` and ``GET /v1/stats`` (this replica's batch fill and
per-client counts).
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at run
# time, from inside Serve's wrapper of the class.

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

try:
    from ray import serve
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        "the pool needs Ray Serve: pip install 'thinktrans[pool]'", name="ray") from exc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from models.base import Job, first_line
from models.errors import BackendConfigError, BackendError, BackendTimeout, Expired
from models.local import LocalConfig, LocalTranslator
from models.pooled import PoolCall
from models.registry import build_backend
from models.spans import Protected
from pool.clients import UNNAMED, ClientPolicy, Clients, Unauthorized
from pool.fair import FairQueue, Slice, Unit
from service.chain.batching import Cutoff, Pair, check_outputs
from service.exceptions import ConfigError, InputError, PayloadTooLarge, ThinktransError, kind_of
from service.http.problems import error_problem, install_handlers, problem
from service.ops.logs import configure as configure_logs
from service.settings import Settings, load_settings

log = logging.getLogger("thinktrans.pool")
# What a call is answered with when it is not served.
Failure = ThinktransError | BackendError

APP_NAME = "thinktrans-pool"
RECENT_BATCHES = 256  # model batches kept for /v1/stats
NOT_READY = "pool-not-ready"  # the problem slug that tells sidecars the pool is not serving
# Serve batches that may wait for the engine at once; the calls a replica takes
# (max_ongoing_requests) bound them first.
OVERLAPPING_BATCHES = 4096

api = FastAPI(title="thinktrans pool", docs_url=None, redoc_url=None)
install_handlers(api)


@dataclass(frozen=True)
class Limits:
    """What one call may carry, each refused past it with a 413 that names its setting; the
    call characters bound an engine turn too. Sidecars read them from ``/v1/info``."""

    max_text_chars: int = 2_000  # pool_max_text_chars
    max_call_chars: int = 32_000  # pool_max_call_chars
    max_call_bytes: int = 1 << 20  # pool_max_call_bytes


@dataclass(frozen=True)
class Sharing:
    """How a replica shares its engine between clients: the config's clients (tokens,
    weights, caps), the default cap, the clients it keeps counts for, and the turn rule."""

    policies: dict[str, ClientPolicy] = field(default_factory=dict)
    max_waiting: int = 256  # pool_client_max_waiting
    max_clients: int = 1024  # pool_max_clients
    fair: bool = True  # pool_fair
    unit: Unit = "characters"  # pool_fair_unit


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


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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


def _replica_logs(level: str) -> None:
    """A replica's own logs as the service's JSON lines, on the process's stderr, which Ray
    brings to the pool's terminal: Serve, keeping its own logs off stderr, puts a writer to
    its log file in ``sys.stderr``."""
    configure_logs(level)
    _propagate("ray")
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and sys.__stderr__ is not None:
            handler.setStream(sys.__stderr__)


def _check_spans(call: PoolCall) -> None:
    """A call's spans, if any: one list per text, each span inside its text, in order and not
    overlapping (its types pydantic has checked); InputError (a 422) says which is not."""
    if call.spans is None:
        return
    if len(call.spans) != len(call.texts):
        raise InputError(f"spans: {len(call.spans)} lists for {len(call.texts)} texts; "
                         "send one per text, an empty one for a text without spans")
    for i, (text, spans) in enumerate(zip(call.texts, call.spans, strict=True)):
        at = 0
        for j, (start, end, _, _) in enumerate(spans):
            if not at <= start < end <= len(text):
                raise InputError(
                    f"spans.{i}.{j}: [{start}, {end}] is not a span of text {i} "
                    f"({len(text)} characters) after the one before it (ending at {at}): "
                    "spans are offsets into their text, in order, not empty, not overlapping")
            at = end


def _check_previous(call: PoolCall, limits: Limits) -> None:
    """A preview call's previous previews: one per text (InputError: a 422), within the
    call's character limits (PayloadTooLarge: a 413)."""
    if call.previous is None:
        return
    if len(call.previous) != len(call.texts):
        raise InputError(f"previous: {len(call.previous)} for {len(call.texts)} texts; send "
                         "one per text, null for a text without a previous preview")
    sizes = [len(text or "") for text in call.previous]
    if max(sizes) > limits.max_text_chars or sum(sizes) > limits.max_call_chars:
        raise PayloadTooLarge(
            f"previous: at most {limits.max_text_chars} characters each and "
            f"{limits.max_call_chars} in all (pool_max_text_chars, pool_max_call_chars)")


def _unauthorized() -> JSONResponse:
    return problem(401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_POOL_TOKEN>', "
                   "the pool's token or this sidecar's own", "unauthorized",
                   headers={"WWW-Authenticate": "Bearer"})


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


def _problem(exc: ThinktransError | BackendError) -> JSONResponse:
    # Defined above the deployment: Serve captures the class with what exists by then.
    return error_problem(exc)


def _too_large(detail: str) -> JSONResponse:
    """A 413 for a body not read to its end: the connection closes after it."""
    kind = kind_of(PayloadTooLarge)
    return problem(kind.status, kind.title, detail, kind.slug, headers={"Connection": "close"})


async def _read_within(request: Request, max_bytes: int) -> bytes | None:
    """The body, or None as soon as it is over ``max_bytes`` (declared or read so far):
    a body sent in chunks, with no ``Content-Length``, is read no further than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)


def _parse(body: bytes, max_batch_size: int, limits: Limits) -> PoolCall:
    """A call's body, checked against the pool's bounds (its batch size, characters per
    text and per call, spans, previous context)."""
    try:
        call = PoolCall.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InputError(f"{where}: {first['msg']}") from None
    if len(call.texts) > max_batch_size:
        raise PayloadTooLarge(f"{len(call.texts)} texts in one call; this pool takes at "
                              f"most {max_batch_size} (its max_batch_size)")
    longest = max(len(text) for text in call.texts)
    if longest > limits.max_text_chars:
        raise PayloadTooLarge(
            f"a text of {longest} characters; this pool takes at most "
            f"{limits.max_text_chars} per text (pool_max_text_chars, "
            "THINKTRANS_POOL_MAX_TEXT_CHARS): cut it at sentence ends")
    chars = sum(len(text) for text in call.texts)
    if chars > limits.max_call_chars:
        raise PayloadTooLarge(
            f"{chars} characters in one call; this pool takes at most "
            f"{limits.max_call_chars} (pool_max_call_chars, THINKTRANS_POOL_MAX_CALL_CHARS): "
            "send them as several calls")
    _check_spans(call)
    _check_previous(call, limits)
    return call


# Its options (replicas, CPUs, GPUs, max_ongoing_requests, user_config) are set in one
# place, ``application``; a Serve config overrides them.
@serve.deployment(name="Pool", health_check_period_s=10)
@serve.ingress(api)
class Pool:
    """One replica: a local engine and the batch queue in front of it."""

    async def __init__(self, local: LocalConfig, token_sha256: str | None = None,  # type: ignore[misc]
                       timeout_s: float = 60.0, limits: Limits | None = None,
                       log_level: str = "info", sharing: Sharing | None = None) -> None:
        _replica_logs(log_level)
        self.translator = LocalTranslator(local)
        self.timeout_s = timeout_s
        self.limits = limits or Limits()
        self.max_batch_size = 64
        self.batch_wait_ms = 10.0
        self.tally = _Stats()
        sharing = sharing or Sharing()
        self.clients = Clients(sharing.policies, shared_sha256=token_sha256,
                               max_waiting=sharing.max_waiting, max_clients=sharing.max_clients,
                               metrics=True)
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
        if size < 1 or not 0 <= wait_ms <= 10_000:
            raise ValueError("max_batch_size must be >= 1 and batch_wait_ms in 0..10000")
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
            return _unauthorized()
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
        if isinstance(self._owner(request), JSONResponse):
            return _unauthorized()
        s = self.tally
        body = {k: v for k, v in vars(s).items() if k != "recent"}
        body.update(max_batch_size=self.max_batch_size, fair=self.waiting.fair,
                    fair_unit=self.waiting.unit, clients=self.clients.view(),
                    clients_forgotten=self.clients.forgotten,
                    recent=list(s.recent))
        return JSONResponse(body)

    @api.post("/v1/batch")
    async def batch(self, request: Request) -> JSONResponse:
        owner = self._owner(request)
        if isinstance(owner, JSONResponse):
            return owner
        body = await _read_within(request, self.limits.max_call_bytes)
        if body is None:  # the rest is not read: the connection closes after the answer
            return _too_large(f"a call's body is at most {self.limits.max_call_bytes} bytes "
                              "(pool_max_call_bytes, THINKTRANS_POOL_MAX_CALL_BYTES)")
        try:
            call = _parse(body, self.max_batch_size, self.limits)
            client = self.clients.identify(owner, call.sidecar)
        except ThinktransError as exc:
            return _problem(exc)
        if not self.translator.ready:  # loaded at start; a model can only fail later
            return problem(503, "Pool not ready", self.translator.reason or "model not loaded",
                           NOT_READY)
        self.tally.calls += 1
        try:  # its segments count as its client's until it is answered
            self.clients.admit(client, len(call.texts), self.pace_s)
        except ThinktransError as exc:  # over its cap: a 429 with Retry-After
            return _problem(exc)
        try:
            return await self._serve_call(_Queued(call, None, client))
        finally:
            self.clients.release(client, len(call.texts))

    async def _serve_call(self, queued: _Queued) -> JSONResponse:
        call = queued.call
        if call.deadline_ms is not None and call.deadline_ms <= 0:
            self._expire(queued)
            return _problem(Expired("the call's deadline had passed when it arrived"))
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
            return _problem(PayloadTooLarge(f"this pool now takes at most "
                                            f"{self.max_batch_size} texts a call"))
        if isinstance(outcome, ThinktransError | BackendError):
            return _problem(outcome)
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
            return _unauthorized()

    def _expire(self, queued: _Queued) -> None:
        self.tally.expired(queued.call)
        self.clients.outcome(queued.client, "expired", len(queued.call.texts))

    # -- the batch ---------------------------------------------------------------------------

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01, batch_size_fn=_segments,
                 max_concurrent_batches=OVERLAPPING_BATCHES)
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


# -- building and running ---------------------------------------------------------------------


def application(settings: Settings) -> Any:
    """The pool as a Serve application, from the settings: the model from ``local_*``, the
    batch limits as ``user_config``, replicas, CPUs and GPUs as deployment options (a Serve
    config overrides any of them). Raises ConfigError for settings no replica could use."""
    try:
        build_backend("local", settings)  # checked here, in one line, not in each replica
    except BackendConfigError as exc:
        raise ConfigError(str(exc)) from exc
    gpus = settings.pool_num_gpus
    if settings.local_device.startswith("cuda") and gpus == 0:
        raise ConfigError("local_device is cuda but pool_num_gpus (THINKTRANS_POOL_NUM_GPUS) "
                          "is 0: Ray gives a replica a GPU only when it asks for one")
    if settings.pool_max_text_chars > settings.pool_max_call_chars:
        raise ConfigError(f"pool_max_text_chars ({settings.pool_max_text_chars}) is over "
                          f"pool_max_call_chars ({settings.pool_max_call_chars}): a call of "
                          "one text that long would be refused")
    token = settings.pool_token.get_secret_value() if settings.pool_token else None
    policies = {name: ClientPolicy(c.digest(), c.weight, c.max_waiting)
                for name, c in settings.pool_clients.items()}
    if token and _digest(token) in {p.token_sha256 for p in policies.values()}:
        raise ConfigError("pool_token is also a client's own token in pool_clients: a "
                          "shared token lets a sidecar call under any name; give each its own")
    sharing = Sharing(policies, settings.pool_client_max_waiting, settings.pool_max_clients,
                      settings.pool_fair, settings.pool_fair_unit)
    size = settings.pool_max_batch_size
    limits = Limits(settings.pool_max_text_chars, settings.pool_max_call_chars,
                    settings.pool_max_call_bytes)
    deployment = Pool.options(  # type: ignore[attr-defined]
        num_replicas=settings.pool_replicas,
        # Ray sets a replica's OMP_NUM_THREADS to its CPUs: reserve the engine's threads.
        ray_actor_options={"num_cpus": settings.local_threads or 1, "num_gpus": gpus},
        # The calls fair turns share out: those past it wait in Serve's queues, in order.
        max_ongoing_requests=settings.pool_max_ongoing_calls,
        user_config={"max_batch_size": size, "batch_wait_ms": settings.pool_batch_wait_ms,
                     "fair": settings.pool_fair},
    )
    return deployment.bind(settings.local_config(), _digest(token) if token else None,
                           settings.backend_timeout_s, limits, settings.log_level, sharing)


def build(args: dict[str, Any] | None = None) -> Any:
    """The import path for Serve configs, ``pool.replica:build``: ``args`` are settings by
    name (``local_model: ...``), ``config`` a settings YAML file; the environment's
    ``THINKTRANS_*`` variables as for ``thinktrans serve``."""
    args = dict(args or {})
    config = args.pop("config", None)
    return application(load_settings(config, **args))


def run(settings: Settings, *, address: str | None, host: str, port: int) -> None:
    """``thinktrans pool``: start Ray here (or join ``address``), deploy, serve on
    ``host:port`` until SIGTERM or SIGINT, then take the pool down. The settings are
    checked (ConfigError) before Ray starts."""
    import ray

    app = application(settings)
    level = settings.log_level.upper()
    _start_ray(address, host, level, settings.pool_metrics_port)
    stop = threading.Event()
    # Ours from here, over Ray's, which exit at once: a signal while Serve starts stops
    # the pool once it has started.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _propagate("ray.serve")  # Serve's logger in this process writes text of its own
        serve.start(http_options={"host": host, "port": port},
                    logging_config=serve.schema.LoggingConfig(encoding="JSON", log_level=level))
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        _propagate("ray.serve")
        log.info("pool serving on http://%s:%d (%s)", host, port, settings.local_model)
        print(f"thinktrans pool: http://{host}:{port}", flush=True)
        stop.wait()
    finally:
        # Bounded: a Ctrl-C in a terminal reaches Ray's own processes too, and Serve then
        # waits on a raylet that is gone. The application is deleted (its replicas finish
        # their calls); Serve's controller and proxy go with a Ray instance of our own:
        # serve.shutdown's call to the controller, which kills itself, is retried by Ray
        # ("graceful_shutdown failed ... will be retried") at every stop.
        stopped = _within(_delete_app, settings.shutdown_grace_s + 5)
        if not stopped or not _within(ray.shutdown, 10):
            log.warning("the pool's Ray processes did not stop in time; exiting without them")
            os._exit(1)


def _start_ray(address: str | None, host: str, level: str, metrics_port: int | None) -> None:
    """A Ray instance of this machine's own (never one found running), or the cluster at
    ``address``; its logs as JSON lines, as the service's: Ray's own loggers in every process
    of this job (their lines then reach this terminal without Ray's coloured prefix), and
    Serve's in its log files (the session's ``logs/serve``), kept off stderr, where Serve
    writes only text."""
    import ray

    os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")
    logs = ray.LoggingConfig(encoding="JSON", log_level=level)
    ours = logging.getLogger().handlers[:]  # Ray adds a root handler of its own here
    if address is None:
        local_only = host in ("127.0.0.1", "localhost")
        ray.init(address="local", include_dashboard=False, logging_config=logs,
                 _node_ip_address="127.0.0.1" if local_only else None,
                 _metrics_export_port=metrics_port)
    else:
        ray.init(address=address, logging_config=logs,
                 runtime_env={"env_vars": {"RAY_SERVE_LOG_TO_STDERR": "0"}})
    logging.getLogger().handlers[:] = ours
    _propagate("ray")  # Ray's records here in the service's format


def _delete_app() -> None:
    try:
        serve.delete(APP_NAME)
    except Exception as exc:  # Serve never started: nothing to delete
        log.warning("the pool's application was not deleted: %s", first_line(exc))


def _propagate(name: str) -> None:
    """Records of ``name`` go to the root's JSON handler only, not to a handler of its own."""
    logger = logging.getLogger(name)
    logger.handlers[:] = []
    logger.propagate = True


def _within(step: Callable[[], None], timeout_s: float) -> bool:
    """Run ``step`` in a thread; whether it finished within ``timeout_s``."""
    worker = threading.Thread(target=step, daemon=True, name="thinktrans-pool-stop")
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()
