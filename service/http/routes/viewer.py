"""The live viewer page (``GET /viewer``) and its files, served as they ship in the package.

The page holds no data: it is served without the token, and every data call it makes goes
to ``/v1`` with the token the reader gives it. It runs no inline script and no ``eval``,
and talks to this origin only (its Content-Security-Policy says so); the thinking text it
shows is rendered as text, never as HTML.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from service.http.problems import problem

router = APIRouter(tags=["viewer"], include_in_schema=False)

# The page's files, by name, with their media types: nothing else under /viewer/ is served.
FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "sse.js": "text/javascript; charset=utf-8",
    "reader.js": "text/javascript; charset=utf-8",
    "rows.js": "text/javascript; charset=utf-8",
    "export.js": "text/javascript; charset=utf-8",
    "ops.js": "text/javascript; charset=utf-8",
    "viewer.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
PAGE = "index.html"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-cache",  # revalidated by ETag: an upgraded sidecar serves its own
}


@cache
def _file(name: str) -> tuple[bytes, str]:
    """A file's bytes and ETag, read once from the package."""
    body = resources.files("service.http.static").joinpath(name).read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def _serve(request: Request, name: str, media_type: str) -> Response:
    body, etag = _file(name)
    headers = {**HEADERS, "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=media_type, headers=headers)


@router.get("/viewer")
async def viewer(request: Request) -> Response:
    """The viewer page. Fragment parameters (``&``-separated, never sent to the server):
    ``#stream=<id>`` opens a stream, ``#token=<t>`` gives the token."""
    return _serve(request, PAGE, "text/html; charset=utf-8")


@router.get("/viewer/")
async def viewer_slash() -> Response:
    # Relative, so that it holds behind a proxy that mounts the sidecar under a prefix.
    return RedirectResponse("../viewer", status_code=308, headers=HEADERS)


@router.get("/viewer/{name}")
async def viewer_file(request: Request, name: str) -> Response:
    """One of the page's files."""
    media_type = FILES.get(name)
    if media_type is None:
        return problem(404, "Not found", f"the viewer has no file {name!r}; open /viewer",
                       "not-found", headers=HEADERS)
    return _serve(request, name, media_type)
