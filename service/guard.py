"""The ASGI guard in front of the app: the bearer token, the body size limit, the access
log and request metrics.

Pure ASGI, so that both checks happen before the body is parsed: a client without the
token gets 401 whatever it sent, and an oversized body gets 413, not a parse error.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from service.errors import PayloadTooLarge
from service.metrics import Metrics
from service.problems import problem

access_log = logging.getLogger("thinktrans.access")
QUIET_ROUTES = frozenset({"/v1/streams/{stream_id}/chunks"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Guard:
    """Request metrics and the access log around every request; the bearer token on /v1;
    the body size limit."""

    def __init__(self, app: ASGIApp, max_bytes: int, token: str | None, metrics: Metrics) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.token = token.encode() if token else None
        self.metrics = metrics
        self._observed: dict[tuple[str, str, int], tuple[Any, Any]] = {}

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
            self._observe(scope, status, time.monotonic() - started)

    def _observe(self, scope: Scope, status: int, elapsed: float) -> None:
        route = getattr(scope.get("route"), "path", "unmatched")
        method = scope.get("method", "")
        key = (method, route, status)
        children = self._observed.get(key)
        if children is None:  # label lookups take a lock: once per route and status
            children = self._observed[key] = (
                self.metrics.requests.labels(method, route, str(status)),
                self.metrics.request_seconds.labels(method, route),
            )
        children[0].inc()
        children[1].observe(elapsed)
        # A stream's chunk POSTs come many times a second: logged only when they fail
        # (or at debug); the request metrics count every one.
        level = logging.DEBUG if status < 400 and route in QUIET_ROUTES else logging.INFO
        if access_log.isEnabledFor(level):
            stream_id = scope.get("path_params", {}).get("stream_id")
            access_log.log(level, "request", extra={
                "method": method, "route": route, "status": status,
                "ms": round(elapsed * 1000, 2), **({"stream": stream_id} if stream_id else {}),
            })

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if self.token is not None and self._needs_token(scope):
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                await problem(
                    401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_API_TOKEN>'",
                    "unauthorized", headers={"WWW-Authenticate": "Bearer"},
                )(scope, receive, send)
                return
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or int(declared) > self.max_bytes:
                await self._too_big()(scope, receive, send)
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
                await self._too_big()(scope, receive, send)
                return
        await self.app(scope, _replay([{"type": "http.request", "body": bytes(body)}], receive),
                       send)

    @staticmethod
    def _needs_token(scope: Scope) -> bool:
        path = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]  # served under a proxy prefix
        return path == "/v1" or path.startswith("/v1/")

    def _too_big(self) -> ASGIApp:
        return problem(
            413, PayloadTooLarge.title,
            f"request body is over THINKTRANS_MAX_REQUEST_BYTES={self.max_bytes} bytes; "
            "send fewer or shorter texts per request", PayloadTooLarge.slug,
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
