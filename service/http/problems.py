"""RFC 9457 problem responses: the one place errors become HTTP answers, by the table of
``service.exceptions`` (``kind_of``)."""

from __future__ import annotations

import json
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


_TOO_DEEP = {"loc": ("body",), "type": "json_invalid",
             "msg": "the request body is nested too deeply to read; send flatter JSON"}


def unreadable_body(body: bytes) -> dict[str, Any] | None:
    """The validation error for a request body that is not UTF-8 or not JSON, in words that
    say where (the first bad byte; the line and column where the JSON breaks); None when
    the body is UTF-8 JSON. For error paths only: it decodes and parses the body again."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = body.count(b"\n", 0, exc.start) + 1
        column = exc.start - (body.rfind(b"\n", 0, exc.start) + 1) + 1
        return {"loc": ("body",), "type": "utf8_invalid",
                "msg": f"the request body must be UTF-8: byte {body[exc.start]:#04x} at offset "
                       f"{exc.start} (line {line}, byte {column} of the line) is not; send the "
                       "JSON encoded as UTF-8"}
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return _not_json(exc)
    except RecursionError:
        return _TOO_DEEP
    return None


def _not_json(exc: json.JSONDecodeError) -> dict[str, Any]:
    return {"loc": ("body",), "type": "json_invalid",
            "msg": f"the request body is not valid JSON: {exc.msg} at line {exc.lineno}, "
                   f"column {exc.colno}"}


def _in_words(errors: list[Any], body: Any) -> list[Any]:
    """FastAPI's error for a body that is not JSON (``("body", 30)``, "JSON decode error")
    in words that say what and where."""
    first = errors[0] if errors else {}
    loc = first.get("loc", ())
    if (first.get("type") == "json_invalid" and isinstance(body, str) and len(loc) == 2
            and isinstance(loc[1], int)):
        reason = str(first.get("ctx", {}).get("error") or "not JSON")
        return [_not_json(json.JSONDecodeError(reason, body, loc[1])), *errors[1:]]
    return errors


def answer_invalid(exc: RequestValidationError) -> JSONResponse:
    """The 422 for a request that failed validation, naming the first field at fault."""
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""),
         "type": e.get("type", "")}
        for e in _in_words(list(exc.errors()), exc.body)
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


# FastAPI's answer to a body that json.loads could not read for another reason than its
# JSON (not UTF-8, nested too deeply): a 400 with this detail, the reason as its cause.
_UNPARSED = "There was an error parsing the body"


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _UNPARSED:
        cause = exc.__cause__
        error = None
        if isinstance(cause, UnicodeDecodeError) and isinstance(cause.object, bytes):
            error = unreadable_body(cause.object)
        elif isinstance(cause, RecursionError):
            error = _TOO_DEEP
        if error is not None:
            return answer_invalid(RequestValidationError([error]))
        return problem(400, "Bad request", "the request body could not be read as JSON; send "
                       "one JSON object, encoded as UTF-8", "bad-request")
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
