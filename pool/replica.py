"""One replica of the pool: a local engine shared by many sidecars, and the routes it serves.

Serve's batches of calls join the replica's lanes (``pool/lanes.py``: segments, previews
behind them), each a fair queue (``pool/fair.py``), and its engine turns (``pool/turns.py``)
answer each call once all its texts have run, or unrun. The routes admit, bound and time
the calls. How the pool fits together is in docs/ARCHITECTURE.md (the pool).
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at run
# time, from inside Serve's wrapper of the class.

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from models.errors import BackendError, Expired
from models.local import LocalConfig, LocalTranslator
from pool.calls import CallLimits, parse_call, read_within, too_large, unauthorized
from pool.clients import Clients, Sharing, Unauthorized
from pool.lanes import Lanes
from pool.ray_logs import replica_logs
from pool.turns import Failure, Queued, Turns, Waiting
from service.exceptions import PayloadTooLarge, ThinktransError
from service.http.problems import error_problem, install_handlers, problem
from service.settings import POOL_BATCH_WAIT_MS_MAX, Settings

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


def _segments(queued: Sequence[Queued]) -> int:
    """Serve's batch size, in segments rather than calls."""
    return sum(len(q.call.texts) for q in queued)


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
        self.limits = limits
        self.batch_wait_ms = FIRST_BATCH_WAIT_MS
        self.clients = Clients(sharing.policies, shared_sha256=token_sha256,
                               max_waiting=sharing.max_waiting, max_clients=sharing.max_clients,
                               metrics_max_clients=sharing.metrics_max_clients, metrics=True)
        # Calls, for the engine: segments, and previews behind them; one queue per client.
        lanes: Lanes[Waiting] = Lanes(fair=sharing.fair, unit=sharing.unit,
                                      weight=self.clients.weight)
        self.turns = Turns(self.translator, lanes, self.clients, timeout_s=timeout_s,
                           max_batch_size=FIRST_BATCH_SIZE,
                           max_call_chars=limits.max_call_chars)
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
        fair = config.get("fair", self.turns.lanes.fair)
        if not isinstance(fair, bool):
            raise ValueError("fair must be true or false")
        self.turns.lanes.fair = fair
        size = int(config.get("max_batch_size", self.turns.max_batch_size))
        wait_ms = float(config.get("batch_wait_ms", self.batch_wait_ms))
        if size < 1 or not 0 <= wait_ms <= POOL_BATCH_WAIT_MS_MAX:
            raise ValueError("max_batch_size must be >= 1 and batch_wait_ms in "
                             f"0..{POOL_BATCH_WAIT_MS_MAX}")
        self.turns.max_batch_size, self.batch_wait_ms = size, wait_ms
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
        body = {"ready": t.ready, "reason": t.reason,
                "max_batch_size": self.turns.max_batch_size,
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
        s, lanes = self.turns.tally, self.turns.lanes
        body = {k: v for k, v in vars(s).items() if k != "recent"}
        body.update(max_batch_size=self.turns.max_batch_size, fair=lanes.fair,
                    fair_unit=lanes.unit, preview_running=lanes.preview_running,
                    clients=self.clients.view(owner),
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
            call = parse_call(body, self.turns.max_batch_size, self.limits)
            client = self.clients.identify(owner, call.sidecar)
        except ThinktransError as exc:
            return error_problem(exc)
        if not self.translator.ready:  # loaded at start; a model can only fail later
            return problem(503, "Pool not ready", self.translator.reason or "model not loaded",
                           NOT_READY)
        self.turns.tally.calls += 1
        try:  # its segments count as its client's until it is answered
            self.clients.admit(client, len(call.texts), self.turns.pace_s)
        except ThinktransError as exc:  # over its cap: a 429 with Retry-After
            return error_problem(exc)
        try:
            return await self._serve_call(Queued(call, None, client))
        finally:
            self.clients.release(client, len(call.texts))

    async def _serve_call(self, queued: Queued) -> JSONResponse:
        call = queued.call
        if call.deadline_ms is not None and call.deadline_ms <= 0:
            self.turns.expire(queued)
            return error_problem(Expired("the call's deadline had passed when it arrived"))
        if call.deadline_ms is not None:
            queued.due = time.monotonic() + call.deadline_ms / 1000
        if not call.preview:  # a preview running yields to it now, not once it is queued
            self.turns.expect(queued)
        try:
            outcome = await self._by_deadline(queued)
        except asyncio.CancelledError:
            # The sidecar gave up on it (its deadline, its timeout). Serve drops a call it
            # still holds; one already waiting for an engine turn is dropped there.
            queued.cancelled = True
            self.turns.lanes.given_up()
            raise
        except RuntimeError:  # larger than a max_batch_size lowered while it waited
            return error_problem(PayloadTooLarge(f"this pool now takes at most "
                                            f"{self.turns.max_batch_size} texts a call"))
        finally:
            self.turns.arrived(queued)
        if isinstance(outcome, ThinktransError | BackendError):
            return error_problem(outcome)
        answer: dict[str, object] = {"translations": outcome, "identity": self.identity,
                                     "model": self.translator.resolve_model(
                                         call.model, call.source, call.target),
                                     "client": queued.client}
        if queued.kept is not None:
            answer["spans"] = queued.kept
        return JSONResponse(answer)

    async def _by_deadline(self, queued: Queued) -> list[str] | Failure:
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
            self.turns.lanes.given_up()
            self.turns.expire(queued)
            return Expired("the call's deadline passed while it waited in the pool")

    def _owner(self, request: Request) -> str | JSONResponse | None:
        """Whose token the request carries (a client's id; None: the shared token, or none
        needed), or a 401 problem."""
        try:
            return self.clients.owner(request.headers.get("authorization", ""))
        except Unauthorized:
            return unauthorized()

    # -- the batch ---------------------------------------------------------------------------

    @serve.batch(max_batch_size=FIRST_BATCH_SIZE, batch_wait_timeout_s=FIRST_BATCH_WAIT_MS / 1000,
                 batch_size_fn=_segments, max_concurrent_batches=OVERLAPPING_BATCHES)
    async def run(self, queued: list[Queued]) -> list[list[str] | Failure]:
        """Serve's batch of calls joins every call waiting for the engine; each engine turn
        takes its share of each client's waiting calls, whoever's batch brought them. While
        the engine is busy, batches formed meanwhile pile up here, so the next turn goes
        full. A call's answer goes back as soon as its last text has run."""
        mine = self.turns.push(queued)
        try:
            await asyncio.wait([w.answer for w in mine])
        except BaseException:
            for w in mine:  # cancelled: ours still waiting are dropped by the next turn
                w.sent.cancelled = True
            self.turns.lanes.given_up()
            raise
        lost = BackendError("the pool lost this call")
        return [w.answer.result() if w.answer.done() else lost for w in mine]
