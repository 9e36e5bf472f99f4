"""RFC 9457 problem responses: the one place errors become HTTP answers.

``PROBLEMS`` is the one table from an error type (the service's own, ``service.errors``,
and the backends', ``models.errors``) to its HTTP status, problem slug and title; an
error takes the entry of the nearest type in its class hierarchy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from models import errors as backend
from service import errors as own
from service.schemas import Problem

log = logging.getLogger("thinktrans.app")

PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True, slots=True)
class Kind:
    """How an error type is answered over HTTP."""

    status: int
    slug: str
    title: str


PROBLEMS: dict[type[Exception], Kind] = {
    own.ThinktransError: Kind(500, "internal", "Internal error"),
    own.ConfigError: Kind(500, "invalid-config", "Invalid configuration"),
    own.InputError: Kind(422, "invalid-input", "Invalid input"),
    own.InvalidLocale: Kind(422, "invalid-locale", "Invalid locale"),
    own.LocaleNotAllowed: Kind(422, "locale-not-allowed", "Locale not allowed"),
    own.UnknownBackend: Kind(422, "unknown-backend", "Unknown backend"),
    own.PayloadTooLarge: Kind(413, "payload-too-large", "Payload too large"),
    own.UnsupportedMediaType: Kind(415, "unsupported-media-type", "Unsupported media type"),
    own.RequestTimeout: Kind(408, "request-timeout", "Request timeout"),
    own.NotFound: Kind(404, "not-found", "Not found"),
    own.EventsGone: Kind(410, "events-gone", "Events no longer retained"),
    own.Conflict: Kind(409, "conflict", "Conflict"),
    own.Forbidden: Kind(403, "forbidden", "Forbidden"),
    own.Overloaded: Kind(503, "overloaded", "Service overloaded"),
    own.OverCap: Kind(429, "over-cap", "Client over its cap"),
    own.TooManyStreams: Kind(429, "too-many-streams", "Too many streams"),
    backend.BackendError: Kind(502, "backend-error", "Backend error"),
    backend.BackendUnavailable: Kind(503, "backend-unavailable", "Backend unavailable"),
    backend.BackendTimeout: Kind(504, "backend-timeout", "Backend timeout"),
    backend.Expired: Kind(504, "expired", "Deadline passed"),
    backend.RateLimited: Kind(503, "rate-limited", "Backend rate limited"),
    backend.UnsupportedLanguage: Kind(422, "unsupported-language", "Unsupported language"),
    backend.BadOutput: Kind(502, "bad-output", "Bad backend output"),
}
# Errors the client caused or can retry: answered with their own status. Anything else
# that reaches a route (a backend's failure, a config error) is a 502.
_CLIENT_SIDE = own.InputError | own.Overloaded | own.TooManyStreams | own.OverCap


def kind_of(error: BaseException | type[BaseException]) -> Kind:
    """The table's entry for an error (or error type): its nearest listed ancestor's."""
    cls = error if isinstance(error, type) else type(error)
    for base in cls.__mro__:
        found = PROBLEMS.get(base)
        if found is not None:
            return found
    return PROBLEMS[own.ThinktransError]


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


async def _thinktrans_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, own.ThinktransError | backend.BackendError)
    if isinstance(exc, _CLIENT_SIDE):
        return error_problem(exc)
    log.warning("request failed: %s", type(exc).__name__)
    return error_problem(exc, status=502)


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
    app.add_exception_handler(own.ThinktransError, _thinktrans_error)
    app.add_exception_handler(backend.BackendError, _thinktrans_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
