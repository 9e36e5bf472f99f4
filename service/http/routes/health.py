"""Liveness, readiness and metrics: never behind the token."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from service.http.deps import MetricsDep, StartedDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: StartedDep) -> JSONResponse:
    """Ready when the default chain can serve: at least one of its backends is ready.

    ``status`` is ``ready`` (all of them, each able to translate into the default target),
    ``degraded`` (some: the chain falls through; or none of the ready ones translates into
    the default target, while they still serve other targets) or ``not_ready`` (none;
    503), with each backend's reason and, unless ``ready``, a ``reason`` for the whole.
    A model that failed to load is retried with backoff; its reason says when.
    """
    if runtime is None:
        return JSONResponse({"status": "starting", "backends": {}}, status_code=503)
    state = runtime.status.readiness()
    return JSONResponse(state, status_code=503 if state["status"] == "not_ready" else 200)


@router.get("/metrics")
async def metrics(runtime: StartedDep, registry: MetricsDep) -> Response:
    """Prometheus text format."""
    if runtime is not None:
        runtime.status.readiness()  # thinktrans_backend_ready, current at each scrape
    return Response(registry.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
