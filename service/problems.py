"""RFC 9457 problem responses: the one place errors become HTTP answers."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import InputError, Overloaded, ThinktransError, TooManyStreams
from service.schemas import Problem

log = logging.getLogger("thinktrans.app")

PROBLEM_JSON = "application/problem+json"
_CLIENT_SIDE = InputError | Overloaded | TooManyStreams


def problem(
    status: int, title: str, detail: str, slug: str, *,
    headers: dict[str, str] | None = None, **extra: Any,
) -> JSONResponse:
    """An RFC 9457 problem response."""
    body = {"type": f"urn:thinktrans:problem:{slug}", "title": title, "status": status,
            "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for problem responses, with the media type they are sent as."""
    schema = Problem.model_json_schema()
    return {status: {"description": "Problem", "content": {PROBLEM_JSON: {"schema": schema}}}
            for status in statuses}


async def _thinktrans_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ThinktransError)
    retry_after = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    status = exc.status if isinstance(exc, _CLIENT_SIDE) else 502
    if not isinstance(exc, _CLIENT_SIDE):
        log.warning("request failed: %s", type(exc).__name__)
    return problem(status, exc.title, exc.detail, exc.slug, headers=headers, **exc.extra)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""),
         "type": e.get("type", "")}
        for e in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"][1:] if first["loc"][:1] == ["body"] else first["loc"])
    detail = f"{where}: {first['msg']}" if where else str(first["msg"])
    if first["loc"] == ["body"] and first.get("type") == "missing":
        detail = "the request has no body: send a JSON object with 'Content-Type: application/json'"
    return problem(422, "Invalid request", detail, "invalid-request", errors=errors)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem(exc.status_code, "HTTP error", str(exc.detail), f"http-{exc.status_code}",
                   headers=getattr(exc, "headers", None))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    route = getattr(request.scope.get("route"), "path", "unmatched")
    log.exception("unhandled %s on %s", type(exc).__name__, route)
    return problem(500, "Internal error", "the service failed; the error is logged", "internal")


def install_handlers(app: FastAPI) -> None:
    """Map every error to a problem response: ours, validation, HTTP, and the unexpected."""
    app.add_exception_handler(ThinktransError, _thinktrans_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
