"""Streams: open, post chunks, close, delete, and read events (SSE or long-poll JSON).

The chunk POST is the hot path and comes first: routes match in order.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.sse import KEEPALIVE_COMMENT, EventSourceResponse, format_sse_event
from pydantic import ValidationError
from pydantic_core import PydanticCustomError
from starlette.routing import Match
from starlette.types import Message, Scope, Send

from models.errors import BackendError
from service.exceptions import Conflict, EventsGone, InputError, ThinktransError
from service.http.deps import StreamId, StreamsDep, get_streams, runtime_of
from service.http.problems import (
    answer_error,
    answer_invalid,
    problem_responses,
    unreadable_body,
)
from service.schemas import (
    STREAM_ID_PATTERN,
    ChunksRequest,
    ChunksResponse,
    CloseResponse,
    EventsResponse,
    OpenStreamRequest,
    OpenStreamResponse,
    StreamsResponse,
    check_stream_id,
)
from service.stream.emission import Event
from service.stream.pipeline import Stream

router = APIRouter(prefix="/v1", responses=problem_responses(401, 408, 413, 415, 421, 422))

# An SSE connection without an event this long gets a keep-alive comment.
SSE_KEEPALIVE_S = 15.0
_LAST_EVENT_ID = re.compile(r"-?[0-9]{1,18}")
_STREAM_ID = re.compile(STREAM_ID_PATTERN)
# Line ends that JSON leaves raw inside strings but common line splitters cut at
# (str.splitlines, httpx's aiter_lines): escaped, the JSON means the same and a reader
# that splits the SSE stream into lines at any of them still gets whole events. JSON
# escapes every other control character itself.
_LINE_ENDS_ESCAPED = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def _parse_chunks(stream_id: str, body: bytes) -> ChunksRequest:
    """The stream id and the body checked as the route's signature says (a
    ``RequestValidationError`` otherwise), the body validated by pydantic straight from its
    bytes: FastAPI's dependency resolution decodes it to Python objects first, at several
    times the cost."""
    if not _STREAM_ID.fullmatch(stream_id):
        raise RequestValidationError([{
            "loc": ("path", "stream_id"), "type": "string_pattern_mismatch",
            "msg": f"String should match pattern '{STREAM_ID_PATTERN}'"}])
    try:
        check_stream_id(stream_id)
    except PydanticCustomError as exc:
        raise RequestValidationError([{
            "loc": ("path", "stream_id"), "type": exc.type, "msg": exc.message()}]) from None
    try:
        return ChunksRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_input=False)]
        if errors[0]["type"] == "json_invalid":  # said as for the other routes' bodies
            errors = [unreadable_body(body) or errors[0]]
        raise RequestValidationError(errors) from None


class _ChunkRoute(APIRoute):
    """The chunk POST as a route of the app: what serves it when the guard does not
    (``ChunkPost``), and its OpenAPI entry, drawn from the endpoint's signature."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def handle(request: Request) -> Response:
            stream_id = request.path_params["stream_id"]
            body = _parse_chunks(stream_id, await request.body())
            return await post_chunks(stream_id, body, await get_streams(request))

        return handle


async def post_chunks(stream_id: StreamId, body: ChunksRequest, streams: StreamsDep) -> Response:
    """Accept chunks by seq; returns at once, never waiting for translation."""
    chunks = [(chunk.seq, chunk.text) for chunk in body.chunks]
    accepted = await streams.add_chunks(stream_id, chunks)
    # Built by hand: the shape is one integer.
    return Response(b'{"accepted_through":%d}' % accepted, media_type="application/json")


_CHUNKS_PATH = re.compile(r"/v1/streams/([^/]+)/chunks")


class ChunkPost:
    """The chunk POST, served by the guard once it has read the body, past the app's router,
    its dependency resolution and its middleware: the hot path, many times a second per
    stream. The route's own checks and endpoint (``_parse_chunks``, ``post_chunks``), and
    the answers the app's error handlers give (``service.http.problems``)."""

    path = "/v1/streams/{stream_id}/chunks"  # the route's name in metrics and logs

    def match(self, scope: Scope) -> str | None:
        """The stream id when ``scope`` is a chunk POST, else None."""
        if scope["method"] != "POST" or scope.get("root_path"):
            return None
        found = _CHUNKS_PATH.fullmatch(scope["path"])
        return found[1] if found else None

    async def __call__(self, scope: Scope, key: str, body: bytes, send: Send) -> None:
        stream_id = key
        scope["route"] = self
        scope["path_params"] = {"stream_id": stream_id}
        response: Response
        try:
            response = await post_chunks(stream_id, _parse_chunks(stream_id, body),
                                         runtime_of(scope["app"]).streams)
        except RequestValidationError as exc:
            response = answer_invalid(exc)
        except (ThinktransError, BackendError) as exc:
            response = answer_error(exc)
        await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


chunk_post = ChunkPost()


router.add_api_route(
    "/streams/{stream_id}/chunks", post_chunks, methods=["POST"], response_model=ChunksResponse,
    responses=problem_responses(409, 410, 429, 503), route_class_override=_ChunkRoute,
)


@router.post("/streams", response_model=OpenStreamResponse, status_code=201,
             responses=problem_responses(409, 429, 503))
async def open_stream(body: OpenStreamRequest, streams: StreamsDep) -> JSONResponse:
    """Open a stream; opening it again with the same choices is a no-op (200)."""
    stream, created = streams.open(body.stream_id, body.target, body.backend, body.user_text,
                                   model=body.model, policy=body.policy,
                                   glossary=None if body.glossary is None
                                   else body.glossary.model_dump(), previews=body.previews)
    answer = OpenStreamResponse(stream_id=stream.stream_id, target=stream.target,
                                target_source=stream.target_source, model=stream.model,
                                policy=stream.policy, previews=stream.previews)
    return JSONResponse(answer.model_dump(), status_code=201 if created else 200)


@router.get("/streams", response_model=StreamsResponse)
async def list_streams(
    streams: StreamsDep,
    limit: Annotated[int | None, Query(ge=1, le=100_000,
                                       description="Only the newest this many.")] = None,
) -> Response:
    """The open streams and the ended ones still kept, newest first: ids, targets, states,
    segment counts and times; no text. At most THINKTRANS_MAX_STREAMS open plus
    THINKTRANS_MAX_ENDED_STREAMS ended ones; ``limit``: the newest that many."""
    # Built as plain JSON in StreamsResponse's shape, not as a model per stream.
    body = json.dumps({"streams": streams.summaries(limit)}, ensure_ascii=False,
                      separators=(",", ":"))
    return Response(body, media_type="application/json")


@router.post("/streams/{stream_id}/close", response_model=CloseResponse,
             responses=problem_responses(404, 409, 410))
async def close_stream(stream_id: StreamId, streams: StreamsDep) -> CloseResponse:
    """Flush the last segment; `end` follows once every result is out."""
    return CloseResponse(segments=await streams.get(stream_id).close())


@router.delete("/streams/{stream_id}", status_code=204,
                responses=problem_responses(404, 410))
async def delete_stream(stream_id: StreamId, streams: StreamsDep) -> Response:
    """Drop a stream and its pending work."""
    streams.delete(stream_id)
    return Response(status_code=204)


# -- events --------------------------------------------------------------------------------


async def events_cursor(
    stream_id: StreamId,
    streams: StreamsDep,
    after: Annotated[int, Query(ge=-1, le=2**53, description="Events after this id.")] = -1,
    last_event_id: Annotated[str | None, Header()] = None,
) -> tuple[Stream, int]:
    """The stream and where to read from; 404 or 410 now, before any event is sent."""
    stream = streams.get(stream_id)
    if last_event_id is not None:
        if not _LAST_EVENT_ID.fullmatch(last_event_id.strip()):
            raise InputError("Last-Event-ID must be an integer event id")
        resume = int(last_event_id.strip())
        last = stream.log.next_id - 1
        if resume > last:
            # Not an id this stream gave: one read from an earlier stream under this id
            # (deleted or expired, then opened again), whose events it would skip.
            raise Conflict(
                f"Last-Event-ID {resume} is past the last event of stream {stream_id!r} "
                f"({last}): it is not an event of this stream (one opened again under the "
                "same id starts its ids at 0); read the stream from its start, without "
                "Last-Event-ID", last_event_id=last)
        after = max(after, resume)
    stream.log.after(after)  # raises EventsGone if the reader fell behind the log
    return stream, after


Cursor = Annotated[tuple[Stream, int], Depends(events_cursor)]

# On each events answer: when the stream was opened (RFC 3339, UTC, to the microsecond).
# A stream deleted or expired and opened again under its id has another, so a reader that
# resumes can tell that the events it holds are an earlier stream's.
STARTED_HEADER = "Thinktrans-Stream-Started"


def _started(stream: Stream) -> str:
    return datetime.fromtimestamp(stream.started_at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _EventStreamRoute(APIRoute):
    """Matches only readers that accept text/event-stream; the rest get long-poll JSON."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            for name, value in scope.get("headers", ()):
                if name == b"accept" and b"text/event-stream" in value:
                    return match, child
        return Match.NONE, {}


async def stream_events_sse(cursor: Cursor) -> EventSourceResponse:
    """Server-Sent Events from the cursor on, until `end`."""
    stream, after = cursor
    return EventSourceResponse(_sse(stream, after),
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                        STARTED_HEADER: _started(stream)})


async def _sse(stream: Stream, after: int) -> AsyncIterator[bytes]:
    """Each event in FastAPI's SSE wire format, and its keep-alive comment when idle.

    Written as the response's own iterator, not as a generator route: FastAPI runs a
    generator route through a producer task, a keep-alive task and two memory streams per
    connection, which cost about 15 % more server CPU per delta at 100 streams.
    """
    last = after
    while True:
        try:
            events = await stream.wait_events(last, SSE_KEEPALIVE_S, shared_timeout=True)
        except EventsGone:
            return  # the reader fell too far behind; it resumes with Last-Event-ID
        if not events:
            if stream.ended:
                return  # dropped or expired
            yield KEEPALIVE_COMMENT
            continue
        # What this wake found, in one write; each frame made once for every reader.
        yield stream.log.encoded_block(events, _sse_frame)
        last = events[-1][0]
        if events[-1][1] == "end":
            return


def _sse_frame(event: Event) -> bytes:
    event_id, kind, data = event
    return format_sse_event(data_str=data.translate(_LINE_ENDS_ESCAPED), event=kind,
                            id=str(event_id))


router.add_api_route(
    "/streams/{stream_id}/events", stream_events_sse, methods=["GET"],
    route_class_override=_EventStreamRoute, include_in_schema=False,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


# Each SSE event: `id`, `event` (its type) and `data` (its data as JSON).
_SSE_ITEM = {
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string"},
        "event": {"enum": ["segment", "update", "preview", "end"]},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"oneOf": [_ref("SegmentResult"), _ref("SegmentUpdate"),
                                             _ref("PreviewResult"), _ref("StreamEnd")]}},
    },
}


@router.get(
    "/streams/{stream_id}/events", response_model=EventsResponse,
    responses={200: {"content": {"text/event-stream": {"itemSchema": _SSE_ITEM}}},
               **problem_responses(404, 409, 410)},
)
async def stream_events(
    cursor: Cursor,
    streams: StreamsDep,
    wait_ms: Annotated[int, Query(ge=0, le=3_600_000, description="Long-poll: longest wait.")] = 0,
) -> Response:
    """Segment, update, preview (a stream opened with `previews`) and end events: SSE with
    `Accept: text/event-stream`, else long-poll JSON (waiting up to `wait_ms` for the first
    event after `after`)."""
    stream, after = cursor
    max_wait_ms = streams.settings.max_wait_poll_ms
    events = await stream.wait_events(after, min(wait_ms, max_wait_ms) / 1000.0)
    # Built from each event's JSON as kept (EventsResponse's shape, serialised once).
    body = ",".join(f'{{"id":{event_id},"type":"{kind}","data":{data}}}'
                    for event_id, kind, data in events)
    return Response(f'{{"events":[{body}]}}', media_type="application/json",
                    headers={STARTED_HEADER: _started(stream)})
