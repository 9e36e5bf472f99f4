"""What a route needs, handed over by FastAPI's dependency injection."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request
from pydantic import AfterValidator

from service.exceptions import Overloaded
from service.ops.metrics import Metrics
from service.ops.status import StatusReport
from service.runtime import Runtime
from service.schemas import STREAM_ID_PATTERN, check_stream_id
from service.stream.manager import StreamManager

# Dependencies are coroutines: FastAPI runs a plain function in a worker thread, which
# costs a thread hand-off on every request.


def runtime_of(app: Any) -> Runtime:
    """The runtime ``app``'s lifespan opened; 503 while the app starts."""
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    if runtime is None:
        raise Overloaded("the service is starting; retry shortly", retry_after_s=1)
    return runtime


async def get_runtime(request: Request) -> Runtime:
    """The runtime the app's lifespan opened."""
    return runtime_of(request.app)


async def get_started(request: Request) -> Runtime | None:
    """The runtime, or None while the app starts (for the routes that answer then too)."""
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    return runtime


async def get_metrics(request: Request) -> Metrics:
    """The app's metrics registry: there before the runtime starts."""
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_streams(request: Request) -> StreamManager:
    return (await get_runtime(request)).streams


async def get_status(request: Request) -> StatusReport:
    return (await get_runtime(request)).status


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
StartedDep = Annotated[Runtime | None, Depends(get_started)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
StreamsDep = Annotated[StreamManager, Depends(get_streams)]
StatusDep = Annotated[StatusReport, Depends(get_status)]
StreamId = Annotated[str, Path(pattern=STREAM_ID_PATTERN,
                               description="1-128 of A-Za-z0-9._:-, not '.' or '..'"),
                     AfterValidator(check_stream_id)]
