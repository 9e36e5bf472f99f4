"""The app factory: lifespan, middleware, error mapping and the HTTP routes."""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from models.base import Translator
from models.registry import build_backends
from service.batcher import Batcher, BatchLimits
from service.detect import get_detector
from service.errors import InputError, Overloaded, PayloadTooLarge, ThinktransError
from service.locale import resolve_target
from service.metrics import Metrics
from service.pipeline import Pipeline
from service.schemas import (
    STREAM_ID_PATTERN,
    ChunksRequest,
    ChunksResponse,
    CloseResponse,
    DetectRequest,
    DetectResponse,
    EventsResponse,
    OpenStreamRequest,
    OpenStreamResponse,
    Problem,
    TranslateRequest,
    TranslateResponse,
)
from service.settings import Settings, load_settings
from service.streams import EventsGone, Stream, StreamManager, TooManyStreams

log = logging.getLogger("thinktrans.app")
access_log = logging.getLogger("thinktrans.access")

PROBLEM_JSON = "application/problem+json"
StreamId = Annotated[str, Path(pattern=STREAM_ID_PATTERN, description="1-128 of A-Za-z0-9._:-")]
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for problem responses, with the media type they are sent as."""
    schema = Problem.model_json_schema()
    return {status: {"description": "Problem", "content": {PROBLEM_JSON: {"schema": schema}}}
            for status in statuses}


def problem(
    status: int, title: str, detail: str, slug: str, *,
    headers: dict[str, str] | None = None, **extra: Any,
) -> JSONResponse:
    """An RFC 9457 problem response."""
    body = {"type": f"urn:thinktrans:problem:{slug}", "title": title, "status": status,
            "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


class Guard:
    """Pure ASGI front door: request metrics, the bearer token on /v1, the body size limit.

    Both are checked before the body is parsed, so a client without the token gets
    401 whatever it sent, and an oversized body gets 413, not a parse error.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, token: str | None, metrics: Metrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.token = token.encode() if token else None
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, observed_send)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope.get("method", "")
            elapsed = time.monotonic() - started
            self.metrics.requests.labels(method, route, str(status)).inc()
            self.metrics.request_seconds.labels(method, route).observe(elapsed)
            if access_log.isEnabledFor(logging.INFO):
                stream_id = scope.get("path_params", {}).get("stream_id")
                access_log.info("request", extra={
                    "method": method, "route": route, "status": status,
                    "ms": round(elapsed * 1000, 2),
                    **({"stream": stream_id} if stream_id else {}),
                })

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]  # served under a proxy prefix
        if self.token is not None and (path == "/v1" or path.startswith("/v1/")):
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                await problem(
                    401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_API_TOKEN>'",
                    "unauthorized", headers={"WWW-Authenticate": "Bearer"},
                )(scope, receive, send)
                return
        too_big = problem(
            413, PayloadTooLarge.title,
            f"request body is over THINKTRANS_MAX_REQUEST_BYTES={self.max_bytes} bytes; "
            "send fewer or shorter texts per request", PayloadTooLarge.slug,
        )
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await too_big(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length given (chunked): read the body up to the limit, then replay it.
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await too_big(scope, receive, send)
                return
        await self.app(scope, _replay([{"type": "http.request", "body": bytes(body)}], receive),
                       send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


def _route_of(request: Request) -> str:
    route = request.scope.get("route")
    return getattr(route, "path", "unmatched")


def create_app(
    settings: Settings | None = None, *, backends: dict[str, Translator] | None = None
) -> FastAPI:
    """Build the app. ``backends`` replaces the built ones (tests pass fakes here)."""
    settings = settings or load_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        built = backends if backends is not None else build_backends(settings)
        for name in settings.all_backends():
            if name not in built:
                raise ThinktransError(f"backend {name!r} was configured but not built")
        batchers = {}
        for name, translator in built.items():
            limits = BatchLimits(
                max_batch_size=settings.max_batch_size,
                max_batch_chars=settings.max_batch_chars,
                max_wait_ms=settings.max_wait_ms,
                max_queue_size=settings.max_queue_size,
                max_concurrency=translator.max_concurrency or settings.max_concurrent_batches,
                timeout_s=settings.backend_timeout_s,
                breaker_failures=settings.breaker_failures,
                breaker_cooloff_s=settings.breaker_cooloff_s,
            )
            batchers[name] = Batcher(translator, limits, metrics)
        detector = get_detector(settings.detector)
        detector.warm_up()
        pipeline = Pipeline(settings, detector, built, batchers, metrics)
        app.state.pipeline = pipeline
        app.state.streams = streams = StreamManager(settings, pipeline)
        for translator in built.values():
            await translator.start()
        for batcher in batchers.values():
            await batcher.start()
        await streams.start()
        log.info("started", extra={"backends": list(built), "chain": settings.backend})
        try:
            yield
        finally:
            if not streams.draining:
                await streams.drain(settings.shutdown_grace_s)
            await streams.stop()
            for batcher in batchers.values():
                await batcher.stop()
            for translator in built.values():
                await translator.aclose()

    app = FastAPI(
        title="thinktrans",
        version="0.1.0",
        summary="Translates an agent's streamed thinking into the user's language.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics

    @app.exception_handler(ThinktransError)
    async def _thinktrans_error(request: Request, exc: ThinktransError) -> JSONResponse:
        headers = None
        if isinstance(exc, Overloaded | TooManyStreams):
            headers = {"Retry-After": str(exc.retry_after_s)}
        client_side = InputError | Overloaded | TooManyStreams
        status = exc.status if isinstance(exc, client_side) else 502
        if not isinstance(exc, client_side):
            log.warning("request failed: %s", type(exc).__name__)
        return problem(status, exc.title, exc.detail, exc.slug, headers=headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""),
             "type": e.get("type", "")}
            for e in exc.errors()
        ]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"][1:] if first["loc"][:1] == ["body"] else first["loc"])
        detail = f"{where}: {first['msg']}" if where else str(first["msg"])
        return problem(422, "Invalid request", detail, "invalid-request", errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, "HTTP error", str(exc.detail), f"http-{exc.status_code}",
                       headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled %s on %s", type(exc).__name__, _route_of(request))
        return problem(500, "Internal error", "the service failed; the error is logged",
                       "internal")

    token = settings.api_token.get_secret_value() if settings.api_token else None
    app.add_middleware(Guard, max_bytes=settings.max_request_bytes, token=token,
                       metrics=metrics)

    v1 = APIRouter(prefix="/v1", responses=problem_responses(401, 413, 422))

    def pipeline_of(request: Request) -> Pipeline:
        pipeline: Pipeline = request.app.state.pipeline
        return pipeline

    def check_texts(texts: list[str]) -> None:
        if not texts:
            raise InputError("texts is empty; send at least one text")
        if len(texts) > settings.max_texts:
            raise PayloadTooLarge(
                f"{len(texts)} texts in one request; at most THINKTRANS_MAX_TEXTS="
                f"{settings.max_texts}"
            )
        for i, text in enumerate(texts):
            if len(text) > settings.max_text_chars:
                raise PayloadTooLarge(
                    f"texts[{i}] has {len(text)} characters; at most "
                    f"THINKTRANS_MAX_TEXT_CHARS={settings.max_text_chars}"
                )
            check_encodable(text, f"texts[{i}]")

    # -- streams (first: the chunk route is the hot path, and routes match in order) ----

    def streams_of(request: Request) -> StreamManager:
        manager: StreamManager = request.app.state.streams
        return manager

    @v1.post("/streams", response_model=OpenStreamResponse, status_code=201,
             responses=problem_responses(409, 429, 503))
    async def open_stream(body: OpenStreamRequest, request: Request) -> JSONResponse:
        """Open a stream; opening it again with the same target is a no-op (200)."""
        pipeline = pipeline_of(request)
        if body.user_text is not None:
            check_encodable(body.user_text, "user_text")
        resolved = resolve_target(
            body.target, user_text=body.user_text, default_locale=settings.default_locale,
            allowed=settings.allowed_locales, detect=lambda t: pipeline.detect(t).lang,
        )
        stream, created = streams_of(request).open(body.stream_id, resolved, body.backend)
        return JSONResponse(
            {"stream_id": stream.stream_id, "target": stream.target,
             "target_source": stream.target_source},
            status_code=201 if created else 200,
        )

    @v1.post("/streams/{stream_id}/chunks", response_model=ChunksResponse,
             responses=problem_responses(409, 429, 503))
    async def post_chunks(stream_id: StreamId, body: ChunksRequest, request: Request
                          ) -> Response:
        """Accept chunks by seq; returns at once, never waiting for translation."""
        if len(body.chunks) > settings.max_chunks_per_request:
            raise PayloadTooLarge(
                f"{len(body.chunks)} chunks in one request; at most "
                f"THINKTRANS_MAX_CHUNKS_PER_REQUEST={settings.max_chunks_per_request}"
            )
        chunks = []
        for i, chunk in enumerate(body.chunks):
            if len(chunk.text) > settings.max_chunk_chars:
                raise PayloadTooLarge(
                    f"chunks[{i}] has {len(chunk.text)} characters; at most "
                    f"THINKTRANS_MAX_CHUNK_CHARS={settings.max_chunk_chars}"
                )
            check_encodable(chunk.text, f"chunks[{i}].text")
            chunks.append((chunk.seq, chunk.text))
        manager = streams_of(request)
        stream = manager.streams.get(stream_id)
        if stream is None:
            resolved = resolve_target(None, user_text=None,
                                      default_locale=settings.default_locale,
                                      allowed=settings.allowed_locales, detect=lambda t: None)
            stream, _ = manager.open(stream_id, resolved, None)
        accepted = stream.add_chunks(chunks)
        # Built by hand: this is the hot path, and the shape is one integer.
        return Response(b'{"accepted_through":%d}' % accepted, media_type="application/json")

    @v1.post("/streams/{stream_id}/close", response_model=CloseResponse,
             responses=problem_responses(404, 409))
    async def close_stream(stream_id: StreamId, request: Request) -> dict[str, int]:
        """Flush the last segment; `end` follows once every result is out."""
        return {"segments": streams_of(request).get(stream_id).close()}

    @v1.delete("/streams/{stream_id}", status_code=204, responses=problem_responses(404))
    async def delete_stream(stream_id: StreamId, request: Request) -> Response:
        """Drop a stream and its pending work."""
        streams_of(request).delete(stream_id)
        return Response(status_code=204)

    @v1.get("/streams/{stream_id}/events", response_model=EventsResponse,
            responses={200: {"content": {"text/event-stream": {}}},
                       **problem_responses(404, 410)})
    async def stream_events(
        stream_id: StreamId,
        request: Request,
        after: Annotated[int, Query(ge=-1, le=2**53, description="Events after this id.")] = -1,
        wait_ms: Annotated[int, Query(ge=0, le=3_600_000,
                                      description="Long-poll: longest wait.")] = 0,
        accept: Annotated[str | None, Header()] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Any:
        """Segment, update and end events: SSE with Accept: text/event-stream, else JSON."""
        stream = streams_of(request).get(stream_id)
        if last_event_id is not None:
            if not re.fullmatch(r"-?[0-9]{1,18}", last_event_id.strip()):
                raise InputError("Last-Event-ID must be an integer event id")
            after = max(after, int(last_event_id.strip()))
        stream.events_after(after)  # 410 now, not mid-stream, if events are gone
        if accept and "text/event-stream" in accept:
            return StreamingResponse(
                _sse(stream, after), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        wait_s = min(wait_ms, settings.max_wait_poll_ms) / 1000.0
        events = await stream.wait_events(after, wait_s)
        return {"events": [e.as_json() for e in events]}

    # -- one-shot ----------------------------------------------------------------------------

    @v1.post("/translate", response_model=TranslateResponse, responses=problem_responses(503))
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate whole texts; segments not in the target language go to the backend."""
        check_texts(body.texts)
        pipeline = pipeline_of(request)
        resolved = resolve_target(
            body.target, user_text=None, default_locale=settings.default_locale,
            allowed=settings.allowed_locales, detect=lambda t: pipeline.detect(t).lang,
        )
        results = await pipeline.translate_texts(
            body.texts, target=resolved.target, source=body.source, backend=body.backend
        )
        return {"results": results}

    @v1.post("/detect", response_model=DetectResponse)
    async def detect(body: DetectRequest, request: Request) -> dict[str, Any]:
        """Detect each text's language."""
        check_texts(body.texts)
        pipeline = pipeline_of(request)
        out = []
        for text in body.texts:
            det = pipeline.detect(text)
            out.append({"lang": det.lang, "confidence": det.confidence, "reliable": det.reliable})
        return {"results": out}

    @v1.get("/languages")
    async def languages(request: Request) -> dict[str, Any]:
        """Supported targets per backend, the default target and the allowed ones."""
        pipeline = pipeline_of(request)
        return {
            "default_target": settings.default_locale,
            "allowed_locales": settings.allowed_locales or None,
            "backends": {
                name: {"ready": t.ready, "targets": t.languages() if t.ready else None,
                       **({} if t.ready else {"reason": t.reason})}
                for name, t in pipeline.backends.items()
            },
        }

    @v1.get("/limits")
    async def limits() -> dict[str, Any]:
        """The size and count limits this instance enforces, so clients can stay inside."""
        names = ("max_request_bytes", "max_texts", "max_text_chars", "max_segment_chars",
                 "max_chunk_chars", "max_chunks_per_request", "max_gap",
                 "max_stream_buffer_chars", "max_streams", "max_events_retained",
                 "max_queue_size", "max_wait_poll_ms", "deadline_ms", "flush_idle_ms",
                 "stream_idle_expire_s")
        return {name: getattr(settings, name) for name in names}

    @v1.get("/backends")
    async def backends_route(request: Request) -> dict[str, Any]:
        """Configured backends, the default chain, readiness and queue depth."""
        pipeline = pipeline_of(request)
        return {
            "chain": settings.backend,
            "backends": [
                {"name": name, "ready": t.ready,
                 "reason": t.reason or pipeline.batchers[name].breaker_reason,
                 "in_chain": name in settings.backend,
                 "queue_depth": pipeline.batchers[name].queue_size, "info": t.info()}
                for name, t in pipeline.backends.items()
            ],
        }


    app.include_router(v1)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """Alive: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request) -> JSONResponse:
        """Ready when the default chain can serve: at least one of its backends is ready.

        ``status`` is ``ready`` (all of them), ``degraded`` (some: the chain falls through)
        or ``not_ready`` (none; 503), with each backend's reason.
        """
        pipeline: Pipeline | None = getattr(request.app.state, "pipeline", None)
        if pipeline is None:
            return JSONResponse({"status": "starting", "backends": {}}, status_code=503)
        states = _backend_states(pipeline)
        chain = [states[name]["ready"] for name in settings.backend]
        status = "ready" if all(chain) else "degraded" if any(chain) else "not_ready"
        return JSONResponse({"status": status, "backends": states},
                            status_code=503 if status == "not_ready" else 200)

    def _backend_states(pipeline: Pipeline) -> dict[str, dict[str, Any]]:
        states = {}
        for name in settings.backend:
            t = pipeline.backends[name]
            metrics.backend_ready.labels(name).set(1 if t.ready else 0)
            states[name] = {"ready": t.ready, "reason": t.reason}
        return states

    @app.get("/metrics", tags=["health"])
    async def metrics_route(request: Request) -> Response:
        """Prometheus text format."""
        pipeline: Pipeline | None = getattr(request.app.state, "pipeline", None)
        if pipeline is not None:
            _backend_states(pipeline)  # thinktrans_backend_ready, current at each scrape
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


SSE_HEARTBEAT_S = 15.0


async def _sse(stream: Stream, after: int) -> AsyncIterator[str]:
    """Server-Sent Events from ``after`` on, with heartbeats, until `end`."""
    last = after
    while True:
        try:
            events = await stream.wait_events(last, SSE_HEARTBEAT_S)
        except EventsGone:
            return  # the reader fell too far behind; it resumes with Last-Event-ID
        if not events:
            if stream.ended:
                return  # dropped or expired
            yield ": keep-alive\n\n"
            continue
        for event in events:
            data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
            yield f"id: {event.id}\nevent: {event.type}\ndata: {data}\n\n"
            last = event.id
            if event.type == "end":
                return


def check_encodable(text: str, where: str) -> None:
    """Refuse lone surrogates: they cannot be sent back as UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where} holds a lone surrogate (invalid UTF-16 escape); "
                         "send valid Unicode text") from None
