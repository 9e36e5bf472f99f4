"""RFC 9457 problem responses: the one place errors become HTTP answers, by the table of
``service.exceptions`` (``kind_of``)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from models import errors as backend
from service import exceptions as own
from service.exceptions import CLIENT_SIDE, kind_of
from service.schemas import Problem

log = logging.getLogger("thinktrans.app")

PROBLEM_JSON = "application/problem+json"


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


def error_problem(exc: own.ThinktransError | backend.BackendError, *,
                  status: int | None = None) -> JSONResponse:
    """The problem response for one of our errors, as the table says (or ``status``)."""
    kind = kind_of(exc)
    retry_after = getattr(exc, "retry_after_s", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return problem(status or kind.status, kind.title, exc.detail, kind.slug, headers=headers,
                   **exc.extra)


def answer_error(exc: own.ThinktransError | backend.BackendError) -> JSONResponse:
    """What a route answers for one of our errors: the client's own (4xx, 503, 429) with
    their status, anything else (a backend's failure, a config error) as a 502."""
    if isinstance(exc, CLIENT_SIDE):
        return error_problem(exc)
    log.warning("request failed: %s", type(exc).__name__)
    return error_problem(exc, status=502)


def answer_invalid(exc: RequestValidationError) -> JSONResponse:
    """The 422 for a request that failed validation, naming the first field at fault."""
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


async def _thinktrans_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, own.ThinktransError | backend.BackendError)
    return answer_error(exc)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return answer_invalid(exc)


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
    app.add_exception_handler(own.ThinktransError, _thinktrans_error)
    app.add_exception_handler(backend.BackendError, _thinktrans_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
