"""The app factory: wiring only. The lifespan opens the runtime; routers, the guard and the
error handlers are plugged in here."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from models.base import Translator
from service.http.guard import Guard
from service.http.hosts import HostCheck
from service.http.problems import install_handlers
from service.http.routes import apidocs, health, info, streams, translate, viewer
from service.ops.metrics import Metrics
from service.runtime import Runtime
from service.settings import Settings, load_settings


def create_app(
    settings: Settings | None = None, *, backends: dict[str, Translator] | None = None,
    freeze_gc: bool = False,
) -> FastAPI:
    """Build the app. ``backends`` replaces the built ones (tests pass fakes here).

    ``freeze_gc`` (the server process): once started, everything loaded so far leaves the
    cyclic garbage collector's view, so that a full collection walks only what requests
    made; it held the event loop for up to 100 ms under a large request, 30 ms after.
    """
    settings = settings or load_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Runtime(settings, backends=backends, metrics=metrics) as runtime:
            app.state.runtime = runtime
            if freeze_gc:
                gc.freeze()
            try:
                yield
            finally:
                app.state.runtime = None

    app = FastAPI(
        title="thinktrans",
        version="0.1.0",
        summary="Translates an agent's streamed thinking into the user's language.",
        lifespan=lifespan,
        # An API answers the path it was given: no 307 to another one (a stream id of "/"
        # would be redirected to the stream collection).
        redirect_slashes=False,
        # Metrics are Prometheus at /metrics; FastAPI's OpenTelemetry hooks would look up
        # their providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # FastAPI's /docs and /redoc fetch their scripts from a CDN (blank offline): /docs
        # is a page of our own (routes/apidocs.py), /openapi.json stays.
        docs_url=None, redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.runtime = None
    install_handlers(app)
    token = settings.api_token.get_secret_value() if settings.api_token else None
    app.add_middleware(Guard, hosts=HostCheck(settings.allowed_hosts, settings.host),
                       max_bytes=settings.max_request_bytes, token=token,
                       metrics=metrics, body_timeout_s=settings.body_timeout_s,
                       drain_bytes=settings.refused_body_drain_bytes,
                       direct=streams.chunk_post)  # the hot path, past the router
    app.include_router(streams.router)  # first: the chunk POST is the hot path
    app.include_router(translate.router)
    app.include_router(info.router)
    app.include_router(health.router)
    app.include_router(viewer.router)
    app.include_router(apidocs.router)
    return app
