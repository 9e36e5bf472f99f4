"""HTTP at its edges: request bodies that are not JSON, that never finish, that are too big.

Timeouts and connection closes are checked against a real server on 127.0.0.1 over raw
sockets; media types against the app in-process.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.http.app import create_app
from tests.conftest import PROBLEM, Running, Server, assert_problem, make_settings, served

BODY_TIMEOUT_S = 1.0
# A socket's timeout: long enough for a hang to fail a test, never what it measures.
HANG_S = 60.0
TRANSLATE = b'{"texts": ["Hello there."], "target": "de"}'


# -- media types (in-process) ------------------------------------------------------------------

JSON_ROUTES = [
    ("/v1/translate", TRANSLATE),
    ("/v1/detect", b'{"texts": ["Hello there."]}'),
    ("/v1/streams", b'{"stream_id": "m1", "target": "de"}'),
    ("/v1/streams/m1/chunks", b'{"chunks": [{"seq": 0, "text": "Hi. "}]}'),
    ("/v1/streams/m1/close", b"{}"),
]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "application/jsonx", "json"])
@pytest.mark.parametrize(("path", "body"), JSON_ROUTES)
async def test_a_body_that_is_not_json_gets_415_saying_what_to_send(
    passthrough_app: Running, path: str, body: bytes, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    resp = await passthrough_app.client.post(path, content=body, headers=headers)
    problem = assert_problem(resp, 415, "Content-Type: application/json")
    assert problem["type"] == "urn:thinktrans:problem:unsupported-media-type"
    assert (repr(content_type) if content_type else "no Content-Type") in problem["detail"]
    assert resp.headers["accept-post"] == "application/json"


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8",
    "application/vnd.thinktrans+json", " application/json ",
])
async def test_json_with_parameters_or_a_json_suffix_is_json(
    passthrough_app: Running, content_type: str
) -> None:
    c = passthrough_app.client
    resp = await c.post("/v1/translate", content=TRANSLATE, headers={"content-type": content_type})
    assert resp.status_code == 200, resp.text
    resp = await c.post("/v1/streams/j1/chunks", content=b'{"chunks": [{"seq": 0, "text": "Hi"}]}',
                        headers={"content-type": content_type})
    assert resp.status_code == 200, resp.text


async def test_a_post_without_a_body_needs_no_content_type(passthrough_app: Running) -> None:
    c = passthrough_app.client
    resp = await c.post("/v1/streams", json={"stream_id": "e1", "target": "de"})
    assert resp.status_code == 201
    assert (await c.post("/v1/streams/e1/close")).status_code == 200
    resp = await c.post("/v1/streams/e1/close", content=b"", headers={"content-type": "text/plain"})
    assert resp.status_code == 200, resp.text
    resp = await c.post("/v1/translate")  # no body, no type: the body's fields are missing
    assert_problem(resp, 422, "no body", "Content-Type: application/json")


async def test_a_chunked_body_that_is_not_json_gets_415(passthrough_app: Running) -> None:
    async def body() -> Any:
        yield TRANSLATE

    resp = await passthrough_app.client.post("/v1/translate", content=body(),
                                             headers={"content-type": "text/plain"})
    assert_problem(resp, 415, "Content-Type: application/json")


# -- bodies that are not JSON, or not UTF-8: said in words, with where ------------------------

JSON_BODY_ROUTES = ["/v1/translate", "/v1/detect", "/v1/streams", "/v1/streams/w1/chunks"]
HEADERS = {"content-type": "application/json"}


@pytest.mark.parametrize("path", JSON_BODY_ROUTES)
async def test_a_body_that_is_not_valid_json_says_what_and_where(
    passthrough_app: Running, path: str
) -> None:
    body = b'{\n  "texts": ["Hello there."]\n  "target": "de"\n}'  # a comma missing
    resp = await passthrough_app.client.post(path, content=body, headers=HEADERS)
    problem = assert_problem(resp, 422, "the request body is not valid JSON",
                             "Expecting ',' delimiter", "at line 3, column 3")
    assert "decode error" not in problem["detail"]


@pytest.mark.parametrize("path", JSON_BODY_ROUTES)
async def test_a_body_that_is_not_utf8_says_so_and_where(
    passthrough_app: Running, path: str
) -> None:
    body = b'{"texts": ["caf\xe9"], "stream_id": "w2", "chunks": []}'  # Latin-1, not UTF-8
    resp = await passthrough_app.client.post(path, content=body, headers=HEADERS)
    assert_problem(resp, 422, "must be UTF-8", "byte 0xe9 at offset 15", "line 1")


@pytest.mark.parametrize("path", JSON_BODY_ROUTES)
async def test_a_body_nested_too_deeply_says_so(passthrough_app: Running, path: str) -> None:
    resp = await passthrough_app.client.post(path, content=b"[" * 50_000 + b"]" * 50_000,
                                             headers=HEADERS)
    assert resp.status_code < 500, resp.text
    assert_problem(resp, resp.status_code, "nested too deeply")


async def test_the_token_is_checked_before_the_media_type() -> None:
    app = create_app(make_settings(api_token="s3cret"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        resp = await c.post("/v1/translate", content=TRANSLATE, headers={"content-type": "text/x"})
    assert_problem(resp, 401)


async def test_a_body_that_stops_midway_times_out_in_process() -> None:
    """The guard's clock, without a server: the rest of the body never comes."""
    import asyncio

    app = create_app(make_settings(body_timeout_s=0.2))
    scope = {"type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"",
             "root_path": "", "query_string": b"", "http_version": "1.1", "scheme": "http",
             "server": ("test", 80), "client": ("test", 1), "app": app,
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")]}
    parts = [{"type": "http.request", "body": TRANSLATE[:10], "more_body": True}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await asyncio.sleep(3600)
        raise AssertionError("not reached")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        await asyncio.wait_for(app(scope, receive, send), HANG_S)  # its guard, or a hang
    assert sent[0]["status"] == 408
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == PROBLEM.encode() and headers[b"connection"] == b"close"
    detail = json.loads(sent[1]["body"])["detail"]
    assert "100 bytes declared by Content-Length, 10 received" in detail
    assert "THINKTRANS_BODY_TIMEOUT_S" in detail


@pytest.mark.parametrize(("drain_bytes", "reads"), [(0, 0), (1_000_000, 2)])
async def test_a_refused_body_is_drained_as_the_settings_say(drain_bytes: int,
                                                              reads: int) -> None:
    """The app factory hands the guard refused_body_drain_bytes: within it, a body over
    max_request_bytes is read to its end before the 413; at 0 it is not read at all."""
    app = create_app(make_settings(max_request_bytes=1024, refused_body_drain_bytes=drain_bytes))
    scope = {"type": "http", "method": "POST", "path": "/v1/translate", "raw_path": b"",
             "root_path": "", "query_string": b"", "http_version": "1.1", "scheme": "http",
             "server": ("test", 80), "client": ("test", 1), "app": app,
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"4000")]}
    parts = [{"type": "http.request", "body": b"x" * 2000, "more_body": more}
             for more in (False, True)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return parts.pop()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 413
    assert 2 - len(parts) == reads


# -- a real server, raw sockets ----------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with served(THINKTRANS_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
                THINKTRANS_DEFAULT_LOCALE="de") as srv:
        yield srv


def _connect(server: Server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=HANG_S)
    return sock


def _read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (a socket timeout fails the test)."""
    data = b""
    while True:
        got = sock.recv(65536)
        if not got:
            return data
        data += got


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def _head(path: str, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *extra, "", ""]
    return "\r\n".join(lines).encode()


def test_a_body_that_stops_midway_gets_408_and_the_connection_is_closed(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/v1/translate", "Content-Type: application/json",
                           "Content-Length: 100") + TRANSLATE[:10])
        raw = _read_to_eof(sock)  # EOF: the server closed the connection
    status, headers, body = _parse(raw)
    assert status == 408, raw
    assert headers["content-type"] == PROBLEM
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["status"] == 408 and problem["type"] == "urn:thinktrans:problem:request-timeout"
    assert "THINKTRANS_BODY_TIMEOUT_S" in problem["detail"]


def test_a_chunked_body_that_stops_midway_gets_408(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/v1/streams/t2/chunks", "Content-Type: application/json",
                           "Transfer-Encoding: chunked") + b"5\r\n{\"chu\r\n")
        raw = _read_to_eof(sock)
    status, headers, _ = _parse(raw)
    assert status == 408, raw
    assert headers["connection"] == "close"


def test_a_slow_body_complete_in_time_is_served(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/v1/translate", "Content-Type: application/json",
                           f"Content-Length: {len(TRANSLATE)}", "Connection: close"))
        # Five pieces with pauses, complete within a fifth of body_timeout_s: a loaded
        # machine's slower turns still leave it in time.
        for i in range(0, len(TRANSLATE), 10):
            time.sleep(BODY_TIMEOUT_S / 25)
            sock.sendall(TRANSLATE[i:i + 10])
        status, _, body = _parse(_read_to_eof(sock))
    assert status == 200, body
    assert json.loads(body)["results"][0]["segments"]


def test_a_request_without_a_body_is_not_on_the_body_clock(server: Server) -> None:
    """A long-poll outlives body_timeout_s: the clock is for bodies, not for answers."""
    assert httpx.post(f"{server.url}/v1/streams", json={"stream_id": "lp"}).status_code == 201
    wait_ms = int(BODY_TIMEOUT_S * 2500)
    started = time.monotonic()
    resp = httpx.get(f"{server.url}/v1/streams/lp/events", params={"wait_ms": wait_ms},
                     timeout=30)
    assert resp.status_code == 200, resp.text
    assert time.monotonic() - started >= wait_ms / 1000 * 0.9


def test_an_oversized_body_gets_413_without_being_read(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/v1/translate", "Content-Type: application/json",
                           "Content-Length: 1000000000") + b'{"texts": [')
        status, headers, _ = _parse(_read_to_eof(sock))
    assert status == 413  # not waiting for the body: that would end in 408
    assert headers["connection"] == "close"


def test_a_body_that_is_not_json_gets_415_and_the_connection_is_closed(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(_head("/v1/translate", "Content-Type: text/plain",
                           f"Content-Length: {len(TRANSLATE)}") + TRANSLATE)
        status, headers, body = _parse(_read_to_eof(sock))
    assert status == 415, body
    assert headers["content-type"] == PROBLEM
    assert "Content-Type: application/json" in json.loads(body)["detail"]


def test_every_urllib_client_reads_the_413_of_an_oversized_body(server: Server) -> None:
    """A 3 MiB POST, over THINKTRANS_MAX_REQUEST_BYTES (1 MiB) and within the drain bound:
    the server reads and drops the body before answering, so closing the connection resets
    nothing, and a client that sends its whole body before reading (urllib) reads the
    problem document every time, not ``Connection reset by peer``."""
    body = b'{"target": "de", "texts": ["' + b"a" * (3 * 1024 * 1024) + b'"]}'
    outcomes = []
    for _ in range(20):
        request = urllib.request.Request(f"{server.url}/v1/translate", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                outcomes.append(f"{response.status}")
        except urllib.error.HTTPError as exc:
            problem = json.loads(exc.read())
            outcomes.append(f"{exc.code} {problem['type']}")
        except OSError as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
    assert outcomes == ["413 urn:thinktrans:problem:payload-too-large"] * 20, outcomes


def test_a_refused_body_announced_with_expect_100_continue_is_not_waited_for(
        server: Server) -> None:
    """A client that waits for `100 Continue` before its body gets the 413 at once: the
    drain does not ask it for a body the server will drop."""
    with _connect(server) as sock:
        sock.sendall(_head("/v1/translate", "Content-Type: application/json",
                           f"Content-Length: {3 * 1024 * 1024}", "Expect: 100-continue"))
        raw = _read_to_eof(sock)
    assert b"100 Continue" not in raw, raw
    status, headers, _ = _parse(raw)
    # Not waiting for the body: that would end in 408 (body_timeout_s).
    assert status == 413 and headers["connection"] == "close"
