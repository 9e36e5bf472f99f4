"""The Host header check (THINKTRANS_ALLOWED_HOSTS): a page that rebinds its own DNS name to
the sidecar's address reads nothing, on any route but /healthz, token or not; the names the
sidecar is reached by pass. In-process and against `thinktrans serve` on 127.0.0.1."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from service.exceptions import ConfigError
from service.http.hosts import HostCheck, host_name
from service.settings import load_settings
from tests.conftest import (
    PROBLEM,
    Running,
    Server,
    app_with,
    assert_problem,
    post_chunks,
    read_until,
    served,
)

# The thinking a rebinding page is after: it must never come back to it.
THOUGHT = "Zebrafish secret plan is seven."
EVIL = "evil.example:8088"
SID = "s:rebind"


@pytest.fixture
async def app() -> AsyncIterator[Running]:
    async with app_with(default_locale="zh-CN") as running:
        c = running.client
        assert (await post_chunks(c, SID, [(0, THOUGHT)])).status_code == 200
        assert (await c.post(f"/v1/streams/{SID}/close")).status_code == 200
        await read_until(c, SID)  # the thought is in the stream's events
        yield running


def _refused(resp: httpx.Response, name: str = "evil.example") -> None:
    problem = assert_problem(resp, 421, f"'{name}'", "THINKTRANS_ALLOWED_HOSTS")
    assert problem["type"] == "urn:thinktrans:problem:host-not-allowed"
    assert "Zebrafish" not in resp.text


READS = [
    ("GET", "/v1/streams", {}),
    ("GET", f"/v1/streams/{SID}/events", {}),
    ("GET", f"/v1/streams/{SID}/events", {"Accept": "text/event-stream"}),
    ("GET", "/v1/backends", {}),
    ("GET", "/metrics", {}),
    ("GET", "/readyz", {}),
    ("GET", "/viewer", {}),
    ("GET", "/viewer/app.js", {}),
    ("GET", "/openapi.json", {}),
    ("GET", "/docs", {}),
]


@pytest.mark.parametrize(("method", "path", "headers"), READS)
async def test_a_request_naming_another_host_is_refused_without_a_thought(
    app: Running, method: str, path: str, headers: dict[str, str]
) -> None:
    resp = await app.client.request(method, path, headers={"Host": EVIL, **headers})
    _refused(resp)
    # The same request under the server's own name is answered.
    assert (await app.client.request(method, path, headers=headers)).status_code == 200


async def test_writes_under_another_host_are_refused_before_the_body_is_read(
    app: Running
) -> None:
    c = app.client
    _refused(await c.post("/v1/streams/s:other/chunks",
                          json={"chunks": [{"seq": 0, "text": "Hi. "}]}, headers={"Host": EVIL}))
    _refused(await c.post("/v1/translate", json={"texts": [THOUGHT], "target": "de"},
                          headers={"Host": EVIL}))
    _refused(await c.post("/v1/streams", content=b"{not json", headers={
        "Host": EVIL, "Content-Type": "application/json"}))
    assert "s:other" not in app.runtime.streams.streams  # the chunk POST opened nothing


async def test_healthz_answers_any_host(app: Running) -> None:
    resp = await app.client.get("/healthz", headers={"Host": EVIL})
    assert resp.json() == {"status": "ok"}


@pytest.mark.parametrize("host", [
    "127.0.0.1:8088", "127.0.0.1", "localhost:8088", "LOCALHOST", "localhost.", "[::1]:8088",
    "[::1]", "viewer.localhost:8088", "10.1.2.3:80", "[fe80::1]:1",
])
async def test_the_servers_own_names_pass(app: Running, host: str) -> None:
    resp = await app.client.get("/v1/streams", headers={"Host": host})
    assert resp.status_code == 200, resp.text
    assert [s["stream_id"] for s in resp.json()["streams"]] == [SID]


@pytest.mark.parametrize(("host", "words"), [
    ("localhost.evil.example", ["'localhost.evil.example'"]),
    ("127.0.0.1.evil.example:8088", ["'127.0.0.1.evil.example'"]),
    ("evil.example:80:80", ["not a host name"]),
    ("[::1", ["not a host name"]),
    ("[evil.example]:8088", ["not a host name"]),
    ("evil example", ["not a host name"]),
    ("", ["not a host name"]),
])
async def test_what_only_looks_like_an_own_name_is_refused(
    app: Running, host: str, words: list[str]
) -> None:
    resp = await app.client.get("/v1/streams", headers={"Host": host})
    assert_problem(resp, 421, *words)
    assert "Zebrafish" not in resp.text


async def test_the_names_the_operator_allows_pass_and_no_other() -> None:
    async with app_with(allowed_hosts="thinktrans,*.agents.internal") as running:
        c = running.client
        for host in ("thinktrans:8088", "THINKTRANS", "a.agents.internal", "b.a.agents.internal"):
            assert (await c.get("/v1/streams", headers={"Host": host})).status_code == 200, host
        for host in ("agents.internal", "thinktrans.evil.example", "xthinktrans", EVIL):
            assert_problem(await c.get("/v1/streams", headers={"Host": host}), 421)


async def test_a_star_allows_every_name() -> None:
    async with app_with(allowed_hosts='["*"]') as running:
        resp = await running.client.get("/v1/streams", headers={"Host": EVIL})
        assert resp.status_code == 200


async def test_the_bound_name_passes() -> None:
    async with app_with(host="sidecar.lan") as running:
        c = running.client
        assert (await c.get("/v1/streams", headers={"Host": "sidecar.lan:8088"})).status_code == 200
        assert_problem(await c.get("/v1/streams", headers={"Host": EVIL}), 421)


async def test_the_host_is_checked_before_the_token() -> None:
    """With a token set the check holds all the same: /metrics, /readyz and the viewer
    never need the token, and a page under another name learns nothing of it."""
    async with app_with(api_token="s3cret") as running:
        c = running.client
        auth = {"Authorization": "Bearer s3cret"}
        _refused(await c.get("/v1/streams", headers={"Host": EVIL, **auth}))
        _refused(await c.get("/v1/streams", headers={"Host": EVIL}))
        _refused(await c.get("/metrics", headers={"Host": EVIL}))
        assert_problem(await c.get("/v1/streams"), 401)
        assert (await c.get("/v1/streams", headers=auth)).status_code == 200


async def test_a_refused_name_is_logged_once(app: Running,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="thinktrans.guard"):
        for _ in range(3):
            await app.client.get("/v1/streams", headers={"Host": "other.example"})
    lines = [r for r in caplog.records if r.name == "thinktrans.guard"]
    assert len(lines) == 1 and "'other.example'" in lines[0].getMessage()
    assert "THINKTRANS_ALLOWED_HOSTS" in lines[0].getMessage()


# -- the parts -----------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "name"), [
    ("Example.COM:8088", "example.com"), ("example.com.", "example.com"), ("[::1]:80", "[::1]"),
    ("127.0.0.1", "127.0.0.1"), ("host:", "host"), ("a_b", "a_b"),
    ("a:b", None), ("a:1:2", None), ("[x]", None), ("[::1]x", None), ("a..b", None),
    ("", None), ("é.example", None), ("a/b", None), ("a:１", None),
])
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


def test_the_check_keeps_few_answers() -> None:
    check = HostCheck([], "127.0.0.1")
    for n in range(1000):
        assert not check.allows(f"n{n}.example".encode())
    assert len(check._seen) <= 256
    assert check.allows(b"localhost:1") and check.allows(None)
    check._seen.clear()
    assert not check.allows(b"a" * 5000 + b".example")
    assert check._seen == {}  # a header longer than any name is answered, not kept


@pytest.mark.parametrize("value", [
    "http://thinktrans", "thinktrans:8088", "thinktrans/", "a b", "*thinktrans", "*.",
    "thinktrans,,http://x", '["thinktrans", 1.5]', "[::1]",
])
def test_a_bad_allowed_host_is_one_line_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(allowed_hosts=value)
    line = caught.value.detail
    assert "\n" not in line
    assert "THINKTRANS_ALLOWED_HOSTS" in line, line


def test_allowed_hosts_are_read_as_names() -> None:
    settings = load_settings(allowed_hosts=" Thinktrans., *.Agents.Internal ,* ")
    assert settings.allowed_hosts == ["thinktrans", "*.agents.internal", "*"]


# -- a real server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with served(THINKTRANS_ALLOWED_HOSTS="thinktrans", THINKTRANS_DEFAULT_LOCALE="de") as srv:
        r = httpx.post(f"{srv.url}/v1/streams/s:real/chunks",
                       json={"chunks": [{"seq": 0, "text": THOUGHT}]}, timeout=30)
        assert r.status_code == 200, r.text
        assert httpx.post(f"{srv.url}/v1/streams/s:real/close", timeout=30).status_code == 200
        yield srv


@pytest.mark.parametrize("path", ["/v1/streams", "/v1/streams/s:real/events", "/metrics",
                                  "/viewer", "/v1/backends"])
def test_a_real_server_refuses_another_host(server: Server, path: str) -> None:
    port = server.url.rsplit(":", 1)[1]
    resp = httpx.get(f"{server.url}{path}", headers={"Host": f"evil.example:{port}"},
                     timeout=30)
    assert resp.status_code == 421, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    assert "THINKTRANS_ALLOWED_HOSTS" in resp.json()["detail"]
    assert "Zebrafish" not in resp.text
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}",
                 f"thinktrans:{port}"):
        resp = httpx.get(f"{server.url}{path}", headers={"Host": host}, timeout=30)
        assert resp.status_code == 200, (host, resp.text)
    if path.endswith("/events"):
        assert "Zebrafish" in resp.text  # what was refused above is there to read
    assert "evil.example" in server.log()  # the refused name is logged, once
