"""The pool as a Serve application, and ``thinktrans pool``, which runs it.

``build`` is the import path for operators' Serve configs (``pool.deployment:build``: ``serve
run``, ``serve deploy``, KubeRay); ``run`` starts Ray here (or joins a cluster), deploys the
application from the settings and takes it down again on SIGTERM or SIGINT.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

try:
    from ray import serve
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        "the pool needs Ray Serve: pip install 'thinktrans[pool]'", name="ray") from exc

from models.base import first_line
from models.errors import BackendConfigError
from models.registry import build_backend
from pool.calls import CallLimits
from pool.clients import Sharing
from pool.ray_logs import propagate
from pool.replica import Pool
from service.exceptions import ConfigError
from service.settings import Settings, load_settings

log = logging.getLogger("thinktrans.pool")

APP_NAME = "thinktrans-pool"


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
    sharing = Sharing.from_settings(settings)
    if token and _digest(token) in {p.token_sha256 for p in sharing.policies.values()}:
        raise ConfigError("pool_token is also a client's own token in pool_clients: a "
                          "shared token lets a sidecar call under any name; give each its own")
    size = settings.pool_max_batch_size
    limits = CallLimits.from_settings(settings)
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
    """The import path for Serve configs, ``pool.deployment:build``: ``args`` are settings by
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
        propagate("ray.serve")  # Serve's logger in this process writes text of its own
        serve.start(http_options={"host": host, "port": port},
                    logging_config=serve.schema.LoggingConfig(encoding="JSON", log_level=level))
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        propagate("ray.serve")
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


# Serve's own settings, as its processes read them from the environment: its logs off
# stderr; and its HTTP proxy's readiness and health checks given 30 s where Serve gives 5 s
# and 10 s, since a busy host (a model loading, other work) answered late and Serve then
# killed the proxy, and the pool's start failed with "the actor died unexpectedly".
SERVE_ENV = {
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}


def _start_ray(address: str | None, host: str, level: str, metrics_port: int | None) -> None:
    """A Ray instance of this machine's own (never one found running), or the cluster at
    ``address``; its logs as JSON lines, as the service's: Ray's own loggers in every process
    of this job (their lines then reach this terminal without Ray's coloured prefix), and
    Serve's in its log files (the session's ``logs/serve``), kept off stderr, where Serve
    writes only text."""
    import ray

    for name, value in SERVE_ENV.items():  # an operator's own value wins
        os.environ.setdefault(name, value)
    logs = ray.LoggingConfig(encoding="JSON", log_level=level)
    ours = logging.getLogger().handlers[:]  # Ray adds a root handler of its own here
    if address is None:
        local_only = host in ("127.0.0.1", "localhost")
        ray.init(address="local", include_dashboard=False, logging_config=logs,
                 _node_ip_address="127.0.0.1" if local_only else None,
                 _metrics_export_port=metrics_port)
    else:
        ray.init(address=address, logging_config=logs,
                 runtime_env={"env_vars": {name: os.environ[name] for name in SERVE_ENV}})
    logging.getLogger().handlers[:] = ours
    propagate("ray")  # Ray's records here in the service's format


def _delete_app() -> None:
    try:
        serve.delete(APP_NAME)
    except Exception as exc:  # Serve never started: nothing to delete
        log.warning("the pool's application was not deleted: %s", first_line(exc))


def _within(step: Callable[[], None], timeout_s: float) -> bool:
    """Run ``step`` in a thread; whether it finished within ``timeout_s``."""
    worker = threading.Thread(target=step, daemon=True, name="thinktrans-pool-stop")
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
