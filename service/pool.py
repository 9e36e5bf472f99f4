"""The pool: one Ray Serve application of the local engine, shared by many sidecars.

Sidecars (``THINKTRANS_BACKEND=pool``, ``models/pool.py``) send the batches they formed,
one call each, to ``POST /v1/batch``. A replica merges the calls of every sidecar that
arrive within ``batch_wait_ms`` into one batch of at most ``max_batch_size`` segments
(``@serve.batch``, its size counted in segments); when the batch runs, calls whose deadline
has passed are answered ``expired`` and never reach the model, the rest are grouped by
(source, target, model) and each group is one call to the local engine, the same
``LocalTranslator`` as the ``local`` backend (its splitting, output bounds and loop guard).
Every call gets its own answer: its translations, or a problem.

Run it with ``thinktrans pool`` (a local Ray instance, or ``--address`` to join one), or
deploy ``service.pool:build`` from a Serve config (``serve run``, ``serve deploy``, KubeRay):
its ``args`` are settings (``local_model``, ..., or ``config``: a settings YAML file), the
deployment ``Pool`` takes Serve's own options (replicas, ``ray_actor_options.num_gpus``,
autoscaling) and ``user_config`` its batch limits (``max_batch_size``, ``batch_wait_ms``).

Routes: ``GET /healthz`` (alive), ``GET /readyz`` (model loaded: 200, else 503), and, with
the bearer token when ``pool_token`` is set, ``GET /v1/info`` (what sidecars probe),
``POST /v1/batch`` and ``GET /v1/stats`` (this replica's batch fill).
"""


import asyncio
import hashlib
import hmac
import json
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Sequence
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

from models.local import LocalConfig, LocalTranslator
from models.pool import PoolCall
from models.registry import local_config
from service.errors import BackendError, Expired, InputError, PayloadTooLarge, ThinktransError
from service.problems import install_handlers, problem
from service.settings import Settings, load_settings

log = logging.getLogger("thinktrans.pool")

APP_NAME = "thinktrans-pool"
MAX_CALL_BYTES = 1 << 20  # one call's body; a sidecar sends far less (models/pool.py)
RECENT_BATCHES = 256  # model batches kept for /v1/stats

api = FastAPI(title="thinktrans pool", docs_url=None, redoc_url=None)
install_handlers(api)


@dataclass(slots=True)
class _Queued:
    """A call waiting in the replica's batch queue."""

    call: PoolCall
    due: float | None  # monotonic; None: no deadline


def _segments(queued: Sequence[_Queued]) -> int:
    """Serve's batch size, in segments rather than calls."""
    return sum(len(q.call.texts) for q in queued)


@dataclass
class _Stats:
    """What this replica ran, for ``/v1/stats`` and the benchmarks."""

    calls: int = 0
    expired_calls: int = 0
    expired_segments: int = 0
    model_batches: int = 0
    model_segments: int = 0
    merged_batches: int = 0  # model batches holding segments of two sidecars or more
    recent: deque[dict[str, int]] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))

    def expired(self, call: PoolCall) -> None:
        self.expired_calls += 1
        self.expired_segments += len(call.texts)

    def ran(self, segments: int, sidecars: int) -> None:
        self.model_batches += 1
        self.model_segments += segments
        self.merged_batches += sidecars > 1
        self.recent.append({"segments": segments, "sidecars": sidecars})


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _identity(local: LocalConfig, info: dict[str, object]) -> str:
    """What decides every replica's output (config, model versions, engine): the sidecars'
    cache key. The same on every replica of one deployment."""
    facts = {"config": asdict(local), "info": {k: info.get(k) for k in sorted(info)
                                                if k not in ("ready", "reason", "loaded")}}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _problem(exc: ThinktransError) -> JSONResponse:
    # Defined above the deployment: Serve captures the class with what exists by then.
    return problem(exc.status, exc.title, exc.detail, exc.slug)


@serve.deployment(name="Pool", max_ongoing_requests=128, ray_actor_options={"num_cpus": 1},
                  health_check_period_s=10)
@serve.ingress(api)
class Pool:
    """One replica: a local engine and the batch queue in front of it."""

    async def __init__(self, local: LocalConfig, token_sha256: str | None = None,  # type: ignore[misc]
                       timeout_s: float = 60.0) -> None:
        self.local = local
        self.translator = LocalTranslator(local)
        self.token_sha256 = token_sha256
        self.timeout_s = timeout_s
        self.max_batch_size = 64
        self.tally = _Stats()
        await self.translator.start()  # loads in its worker thread; /readyz says when

    def reconfigure(self, config: dict[str, Any]) -> None:
        """Serve's ``user_config``: the batch limits, changeable without a restart."""
        unknown = set(config) - {"max_batch_size", "batch_wait_ms"}
        if unknown:
            raise ValueError(f"unknown user_config keys {sorted(unknown)}; "
                             "use max_batch_size, batch_wait_ms")
        size = int(config.get("max_batch_size", self.max_batch_size))
        wait_ms = float(config.get("batch_wait_ms", 10.0))
        if size < 1 or not 0 <= wait_ms <= 10_000:
            raise ValueError("max_batch_size must be >= 1 and batch_wait_ms in 0..10000")
        self.max_batch_size = size
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
        refused = self._refuse(request)
        if refused is not None:
            return refused
        t = self.translator
        facts = t.info()
        body = {"ready": t.ready, "reason": t.reason, "max_batch_size": self.max_batch_size,
                "engine": facts.get("engine"), "default_model": facts.get("model"),
                "models": t.catalog(), "languages": t.languages(),
                "identity": _identity(self.local, facts) if t.ready else None}
        return JSONResponse(body, status_code=200 if t.ready else 503)

    @api.get("/v1/stats")
    async def stats(self, request: Request) -> JSONResponse:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        s = self.tally
        body = {k: v for k, v in vars(s).items() if k != "recent"}
        body["max_batch_size"] = self.max_batch_size
        body["recent"] = list(s.recent)
        return JSONResponse(body)

    @api.post("/v1/batch")
    async def batch(self, request: Request) -> JSONResponse:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        try:
            call = self._parse(await request.body())
        except ThinktransError as exc:
            return _problem(exc)
        if not self.translator.ready:
            return problem(503, "Pool not ready", self.translator.reason or "model loading",
                           "backend-unavailable")
        self.tally.calls += 1
        due = None if call.deadline_ms is None else time.monotonic() + call.deadline_ms / 1000
        if due is not None and due <= time.monotonic():
            self.tally.expired(call)
            return _problem(Expired("the call's deadline had passed when it arrived"))
        outcome = await self.run(_Queued(call, due))
        if isinstance(outcome, ThinktransError):
            return _problem(outcome)
        return JSONResponse({"translations": outcome,
                             "model": self.translator.resolve_model(call.model, call.source,
                                                                    call.target)})

    def _refuse(self, request: Request) -> JSONResponse | None:
        """A 401 problem unless the request carries the pool's token (when it has one)."""
        if self.token_sha256 is None:
            return None
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(_digest(token.strip()),
                                                              self.token_sha256):
            return None
        return problem(401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_POOL_TOKEN>'",
                       "unauthorized", headers={"WWW-Authenticate": "Bearer"})

    def _parse(self, body: bytes) -> PoolCall:
        if len(body) > MAX_CALL_BYTES:
            raise PayloadTooLarge(f"a call is at most {MAX_CALL_BYTES} bytes")
        try:
            call = PoolCall.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise InputError(f"{where}: {first['msg']}") from None
        if len(call.texts) > self.max_batch_size:
            raise PayloadTooLarge(f"{len(call.texts)} texts in one call; this pool takes at "
                                  f"most {self.max_batch_size} (its max_batch_size)")
        return call

    # -- the batch ---------------------------------------------------------------------------

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01, batch_size_fn=_segments)
    async def run(self, queued: list[_Queued]) -> list[list[str] | ThinktransError]:
        """One merged batch: expired calls answered unrun, the rest by (source, target,
        model) group, one engine call per group; an answer per call."""
        out: list[list[str] | ThinktransError] = [Expired("unset")] * len(queued)
        groups: dict[tuple[str | None, str, str | None], list[int]] = {}
        for i, q in enumerate(queued):
            c = q.call
            groups.setdefault((c.source, c.target, c.model), []).append(i)
        for (source, target, model), members in groups.items():
            now = time.monotonic()  # a group's calls may expire while an earlier one runs
            live = []
            for i in members:
                if queued[i].due is not None and queued[i].due <= now:  # type: ignore[operator]
                    self.tally.expired(queued[i].call)
                    out[i] = Expired("the call's deadline passed while it waited in the pool")
                else:
                    live.append(i)
            if live:
                await self._run_group([queued[i].call for i in live], live, out,
                                      source, target, model)
        return out

    async def _run_group(self, calls: list[PoolCall], slots: list[int],
                         out: list[list[str] | ThinktransError], source: str | None,
                         target: str, model: str | None) -> None:
        texts = [text for call in calls for text in call.texts]
        extra = {"model": model} if model is not None else {}
        try:
            outputs = await asyncio.wait_for(
                self.translator.translate(texts, source=source, target=target, **extra),
                self.timeout_s)
            if len(outputs) != len(texts):
                raise BackendError(f"the engine returned {len(outputs)} for {len(texts)}")
        except ThinktransError as exc:
            for i in slots:
                out[i] = exc
            return
        except TimeoutError:
            for i in slots:
                out[i] = BackendError(f"the engine took over {self.timeout_s:g} s")
            return
        self.tally.ran(len(texts), len({call.sidecar for call in calls}))
        start = 0
        for i, call in zip(slots, calls, strict=True):
            out[i] = outputs[start:start + len(call.texts)]
            start += len(call.texts)


# -- building and running ---------------------------------------------------------------------


def application(settings: Settings) -> Any:
    """The pool as a Serve application, from the settings: the model from ``local_*``, the
    batch limits as ``user_config``, replicas and GPUs as deployment options (a Serve config
    overrides any of them)."""
    token = settings.pool_token.get_secret_value() if settings.pool_token else None
    size = settings.pool_max_batch_size
    deployment = Pool.options(  # type: ignore[attr-defined]
        num_replicas=settings.pool_replicas,
        ray_actor_options={"num_cpus": 1, "num_gpus": settings.pool_num_gpus},
        # Room for a full batch of one-segment calls while the one before it runs.
        max_ongoing_requests=max(16, 2 * size),
        user_config={"max_batch_size": size, "batch_wait_ms": settings.pool_batch_wait_ms},
    )
    return deployment.bind(local_config(settings), _digest(token) if token else None,
                           settings.backend_timeout_s)


def build(args: dict[str, Any] | None = None) -> Any:
    """The import path for Serve configs, ``service.pool:build``: ``args`` are settings by
    name (``local_model: ...``), ``config`` a settings YAML file; the environment's
    ``THINKTRANS_*`` variables as for ``thinktrans serve``."""
    args = dict(args or {})
    config = args.pop("config", None)
    return application(load_settings(config, **args))


def run(settings: Settings, *, address: str | None, host: str, port: int) -> None:
    """``thinktrans pool``: start Ray here (or join ``address``), deploy, serve on
    ``host:port`` until SIGTERM or SIGINT, then take the pool down."""
    import ray

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if address is None:  # a new instance of this machine's own, never one found running
        local_only = host in ("127.0.0.1", "localhost")
        ray.init(address="local", include_dashboard=False,
                 _node_ip_address="127.0.0.1" if local_only else None)
    else:
        ray.init(address=address)
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(application(settings), name=APP_NAME, route_prefix="/", blocking=False)
        log.info("pool serving on http://%s:%d (%s)", host, port, settings.local_model)
        print(f"thinktrans pool: http://{host}:{port}", flush=True)
        stop.wait()
    finally:
        if address is None:
            serve.shutdown()
        else:
            serve.delete(APP_NAME)
        ray.shutdown()

