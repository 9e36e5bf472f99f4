"""``GET /docs``: a page of the HTTP API drawn from the OpenAPI document, and where that
document is (``/openapi.json``), that loads nothing from anywhere: FastAPI's own page
fetched Swagger UI from a CDN and was blank offline. No script, no style, no other origin.
"""

from __future__ import annotations

import html
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["docs"], include_in_schema=False)

HEADERS = {
    "Content-Security-Policy": "default-src 'none'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
METHODS = ("get", "post", "put", "patch", "delete")

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} API</title>
</head>
<body>
<h1>{title} {version}: the HTTP API</h1>
<p>The OpenAPI document of this server is <a href="openapi.json">openapi.json</a>
(<code>GET /openapi.json</code>, beside this page). Open it in any OpenAPI viewer you run
yourself (Swagger UI, Redoc, an editor's OpenAPI preview) or give it to a client generator;
this page loads nothing from other sites. The live viewer of streams is
<a href="viewer">viewer</a>.</p>
<table>
<thead><tr><th>method</th><th>path</th><th>what it does</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
</body>
</html>
"""


def _rows(document: dict[str, Any]) -> str:
    rows = []
    for path, item in document.get("paths", {}).items():
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            said = (operation.get("description") or operation.get("summary") or "")
            first = " ".join(said.split("\n\n")[0].split())
            rows.append(f"<tr><td>{method.upper()}</td><td><code>{html.escape(path)}</code>"
                        f"</td><td>{html.escape(first)}</td></tr>")
    return "\n".join(rows)


@router.get("/docs")
async def docs(request: Request) -> HTMLResponse:
    """The API's operations, and where its OpenAPI document is."""
    document = request.app.openapi()
    info = document.get("info", {})
    page = _PAGE.format(title=html.escape(str(info.get("title", ""))),
                        version=html.escape(str(info.get("version", ""))),
                        rows=_rows(document))
    return HTMLResponse(page, headers=HEADERS)
