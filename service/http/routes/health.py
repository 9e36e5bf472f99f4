"""Liveness, readiness and metrics: never behind the token."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.ops.metrics import Metrics
from service.runtime import Runtime

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Alive: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Ready when the default chain can serve: at least one of its backends is ready.

    ``status`` is ``ready`` (all of them, each able to translate into the default target),
    ``degraded`` (some: the chain falls through; or none of the ready ones translates into
    the default target, while they still serve other targets) or ``not_ready`` (none;
    503), with each backend's reason and, unless ``ready``, a ``reason`` for the whole.
    A model that failed to load is retried with backoff; its reason says when.
    """
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None:
        return JSONResponse({"status": "starting", "backends": {}}, status_code=503)
    state = runtime.status.readiness()
    return JSONResponse(state, status_code=503 if state["status"] == "not_ready" else 200)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.status.readiness()  # thinktrans_backend_ready, current at each scrape
    registry: Metrics = request.app.state.metrics
    return Response(registry.render(), media_type="text/plain; version=0.0.4; charset=utf-8")
