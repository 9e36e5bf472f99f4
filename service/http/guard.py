"""The ASGI guard in front of the app: the Host header, the bearer token, the body's media
type, size limit and time limit, the access log and request metrics.

Pure ASGI, so that the checks happen before the body is parsed: a request naming another
server gets 421 and a client without the token 401 whatever it sent, an oversized body 413,
not a parse error, and a slow body cannot hold a worker past ``body_timeout_s``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from service.exceptions import (
    HostNotAllowed,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
    kind_of,
)
from service.http.hosts import HostCheck, host_name
from service.http.problems import problem
from service.ops.metrics import Metrics

access_log = logging.getLogger("thinktrans.access")
log = logging.getLogger("thinktrans.guard")
QUIET_ROUTES = frozenset({"/v1/streams/{stream_id}/chunks"})
# Methods whose body /v1 reads as JSON.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
CLOSE = {"Connection": "close"}
# Answered whatever the Host: it says "ok" and nothing else, and liveness probes and
# `thinktrans health --url` may reach the server by any name.
ANY_HOST_PATHS = frozenset({"/healthz"})
# Refused Host names warned about once each, at most this many.
MAX_WARNED_HOSTS = 64

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Direct(Protocol):
    """A route the guard serves itself once it has read the body, past the app's router
    (the chunk POST: ``service.http.routes.streams.ChunkPost``)."""

    path: str

    def match(self, scope: Scope) -> str | None: ...

    async def __call__(self, scope: Scope, key: str, body: bytes, send: Send) -> None: ...


class Guard:
    """Request metrics and the access log around every request; the Host header on every
    route but ``/healthz``; the bearer token on /v1; the body size limit. The app factory
    gives it its settings (``allowed_hosts`` and ``host`` as ``hosts``, ``max_request_bytes``,
    ``api_token``, ``body_timeout_s``, ``refused_body_drain_bytes``), and the route it
    serves itself (``direct``)."""

    def __init__(self, app: ASGIApp, *, hosts: HostCheck, max_bytes: int, token: str | None,
                 metrics: Metrics, body_timeout_s: float, drain_bytes: int,
                 direct: Direct | None = None) -> None:
        self.app = app
        self.direct = direct
        self.hosts = hosts
        self._warned: set[str] = set()
        self.max_bytes = max_bytes
        self.token = token.encode() if token else None
        self.metrics = metrics
        self.body_timeout_s = body_timeout_s
        self.drain_bytes = drain_bytes
        self._observed: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._clock = _BodyClock()

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
        declared = headers.get(b"content-length")
        chunked = b"transfer-encoding" in headers
        # A body the server has not read: a refusal closes the connection after it.
        unread = {**CLOSE} if chunked or (declared is not None and declared != b"0") else {}
        path = self._path(scope)
        host = headers.get(b"host")
        if not self.hosts.allows(host) and path not in ANY_HOST_PATHS:
            await self._refuse(self._misdirected(host or b"", unread), scope, receive, send,
                               unread)
            return
        on_v1 = path == "/v1" or path.startswith("/v1/")
        if self.token is not None and on_v1:
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.token):
                await self._refuse(problem(
                    401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_API_TOKEN>'",
                    "unauthorized", headers={"WWW-Authenticate": "Bearer", **unread},
                ), scope, receive, send, unread)
                return
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(self._too_big(unread), scope, receive, send, unread)
            return
        check_type = on_v1 and scope.get("method") in BODY_METHODS
        content_type = headers.get(b"content-type")
        if check_type and declared not in (None, b"0") and not _is_json(content_type):
            await self._refuse(_not_json(content_type, unread), scope, receive, send, unread)
            return
        if declared is None and not chunked:
            await self.app(scope, receive, send)  # no body (RFC 9112 6.3)
            return
        # Read the whole body here: within the size limit and the time limit, then replay it.
        body = bytearray()
        task = asyncio.current_task()
        assert task is not None
        self._clock.start(task, self.body_timeout_s)
        try:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    await self.app(scope, _replay([message]), send)
                    return
                more = message.get("more_body", False)
                if not body and not more:
                    break  # the whole body in one message: no copy
                body += message.get("body", b"")
                if len(body) > self.max_bytes:
                    size, more_body = len(body), more
                    del body[:]
                    await self._refuse(self._too_big(CLOSE), scope, receive, send, CLOSE,
                                       read=size, more=more_body)
                    return
                if not more:
                    message = {"type": "http.request", "body": bytes(body)}
                    break
        except asyncio.CancelledError:
            if not self._clock.expired(task):
                raise
            await self._timed_out(declared, len(body))(scope, receive, send)
            return
        finally:
            self._clock.stop(task)
        if check_type and message.get("body") and not _is_json(content_type):
            await _not_json(content_type, {})(scope, receive, send)
            return
        if self.direct is not None and (key := self.direct.match(scope)) is not None:
            await self.direct(scope, key, message.get("body", b""), send)
            return
        await self.app(scope, _replay([message], receive), send)

    async def _refuse(self, refusal: ASGIApp, scope: Scope, receive: Receive, send: Send,
                      unread: dict[str, str], *, read: int = 0, more: bool = True) -> None:
        """Send ``refusal``, having first read and dropped the rest of the request's body if
        it is within ``drain_bytes`` (``read`` bytes of it already were): closing a socket
        with unread data resets the connection, and a client still sending loses the
        answer. Past the bound, or past the body's time limit, or when the client waits on
        ``Expect: 100-continue`` (it sends nothing more), the refusal goes out as is."""
        headers = dict(scope.get("headers", []))
        limit = self.drain_bytes
        declared = headers.get(b"content-length", b"")
        if (unread and more and headers.get(b"expect", b"").lower() != b"100-continue"
                and not (declared.isdigit() and int(declared) > limit)):
            task = asyncio.current_task()
            assert task is not None
            self._clock.start(task, self.body_timeout_s)
            try:
                while read <= limit:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # the client is gone: nobody to answer
                    read += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
            except asyncio.CancelledError:
                if not self._clock.expired(task):
                    raise
            finally:
                self._clock.stop(task)
        await refusal(scope, receive, send)

    def _timed_out(self, declared: bytes | None, got: int) -> ASGIApp:
        expected = f"{int(declared)} bytes declared by Content-Length, " if declared else ""
        return problem(
            408, kind_of(RequestTimeout).title,
            f"the request body was not complete {self.body_timeout_s:g} s after its "
            f"headers ({expected}{got} received; THINKTRANS_BODY_TIMEOUT_S); send the whole "
            "body at once, with a Content-Length that matches it", kind_of(RequestTimeout).slug,
            headers=CLOSE,
        )

    @staticmethod
    def _path(scope: Scope) -> str:
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]  # served under a proxy prefix
        return path

    def _misdirected(self, header: bytes, headers: dict[str, str]) -> ASGIApp:
        """The 421 for a Host header that names another server, saying which setting
        takes the name; the name is logged once (a name, never a request's text)."""
        given = header.decode("latin-1")[:300]
        name = host_name(given)
        kind = kind_of(HostNotAllowed)
        if name is None:
            detail = (f"the Host header {given!r} is not a host name with an optional port; "
                      "send the name or address this server is reached by")
        else:
            detail = (f"this server does not answer to the name {name!r} (a defence against "
                      "DNS rebinding); if clients reach it by that name, add it to "
                      f"THINKTRANS_ALLOWED_HOSTS (e.g. THINKTRANS_ALLOWED_HOSTS={name}); "
                      "localhost, IP addresses and the bound address always pass")
            if name not in self._warned and len(self._warned) < MAX_WARNED_HOSTS:
                self._warned.add(name)
                log.warning("refused a request for host %r: not in THINKTRANS_ALLOWED_HOSTS",
                            name, extra={"host": name})
        return problem(421, kind.title, detail, kind.slug, headers=headers)

    def _too_big(self, headers: dict[str, str]) -> ASGIApp:
        return problem(
            413, kind_of(PayloadTooLarge).title,
            f"request body is over THINKTRANS_MAX_REQUEST_BYTES={self.max_bytes} bytes; "
            "send fewer or shorter texts per request", kind_of(PayloadTooLarge).slug,
            headers=headers,
        )


class _BodyClock:
    """The body time limit of every request being read, kept by one timer that looks every
    ``TICK_S`` and cancels the reads past their time: a timer per request cost a few
    microseconds on every chunk POST, whose body is almost always there already."""

    TICK_S = 0.25

    def __init__(self) -> None:
        self._until: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self, task: asyncio.Task[Any], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._until[task] = loop.time() + timeout_s
        if self._timer is None:
            self._timer = loop.call_later(self.TICK_S, self._tick)

    def stop(self, task: asyncio.Task[Any]) -> None:
        self._until.pop(task, None)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether the cancellation ``task`` got was this clock's; if so, it is taken back."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for task, until in list(self._until.items()):
            if now >= until:
                del self._until[task]
                self._expired.add(task)
                task.cancel()
        self._timer = loop.call_later(self.TICK_S, self._tick) if self._until else None


def _is_json(content_type: bytes | None) -> bool:
    """``application/json`` or ``application/<anything>+json``, parameters (charset) allowed."""
    if content_type is None:
        return False
    media = content_type.partition(b";")[0].strip().lower()
    kind, _, subtype = media.partition(b"/")
    return kind == b"application" and (subtype == b"json" or subtype.endswith(b"+json"))


def _not_json(content_type: bytes | None, headers: dict[str, str]) -> ASGIApp:
    given = (f"Content-Type {content_type.decode('latin-1')!r}" if content_type is not None
             else "no Content-Type")
    return problem(
        415, kind_of(UnsupportedMediaType).title,
        f"the request body is JSON: send 'Content-Type: application/json' ({given} given)",
        kind_of(UnsupportedMediaType).slug, headers={"Accept-Post": "application/json", **headers},
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
