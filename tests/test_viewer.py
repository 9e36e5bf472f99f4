"""The viewer's server side: GET /v1/streams, the page and its files, their headers, and
one SSE frame per event whatever the number of readers. The page in a browser is in
test_viewer_browser.py."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from importlib import resources

import httpx
import pytest

from service.http.routes import streams as stream_routes
from service.http.routes import viewer
from tests.conftest import app_with, assert_problem, parse_sse, post_chunks, read_until
from tests.fakes import FakeTranslator

CSP_NEEDS = ("script-src 'self'", "connect-src 'self'", "default-src 'none'")


def _time(value: str) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", value), value
    return datetime.fromisoformat(value)


async def _ended(c: httpx.AsyncClient, sid: str) -> None:
    for _ in range(200):
        listed = {s["stream_id"]: s for s in (await c.get("/v1/streams")).json()["streams"]}
        if listed[sid]["state"] == "ended":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{sid} did not end")


# -- GET /v1/streams ---------------------------------------------------------------------------


async def test_the_stream_list_gives_open_and_ended_streams_newest_first() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        assert (await c.get("/v1/streams")).json() == {"streams": []}
        await c.post("/v1/streams", json={"stream_id": "a", "target": "fr"})
        await asyncio.sleep(0.01)
        await post_chunks(c, "b", [(0, "Hello there. "), (1, "How are you? ")])
        streams = (await c.get("/v1/streams")).json()["streams"]
        assert [s["stream_id"] for s in streams] == ["b", "a"]
        b, a = streams
        assert set(b) == {"stream_id", "target", "state", "segments", "started", "last_active"}
        assert (a["target"], a["state"], a["segments"]) == ("fr", "open", 0)
        assert (b["target"], b["state"]) == ("de", "open")
        assert _time(a["started"]) <= _time(b["started"]) <= _time(b["last_active"])

        assert (await c.post("/v1/streams/b/close")).json() == {"segments": 2}
        await read_until(c, "b")
        b = (await c.get("/v1/streams")).json()["streams"][0]
        assert (b["stream_id"], b["state"], b["segments"]) == ("b", "ended", 2)

        assert (await c.delete("/v1/streams/a")).status_code == 204
        assert [s["stream_id"] for s in (await c.get("/v1/streams")).json()["streams"]] == ["b"]


async def test_the_list_can_give_only_the_newest() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        for i in range(5):
            await c.post("/v1/streams", json={"stream_id": f"s{i}"})
            await asyncio.sleep(0.002)
        r = await c.get("/v1/streams", params={"limit": 2})
        assert [s["stream_id"] for s in r.json()["streams"]] == ["s4", "s3"]
        assert_problem(await c.get("/v1/streams", params={"limit": 0}), 422)


async def test_an_evicted_stream_leaves_the_list() -> None:
    async with app_with(default_locale="de", max_ended_streams=1) as run:
        c = run.client
        for sid in ("old", "new"):
            await post_chunks(c, sid, [(0, "Hello there.")])
            await c.post(f"/v1/streams/{sid}/close")
            await read_until(c, sid)
        streams = (await c.get("/v1/streams")).json()["streams"]
        assert [(s["stream_id"], s["state"]) for s in streams] == [("new", "ended")]
        r = await c.get("/v1/streams/old/events")
        assert assert_problem(r, 410)["evicted"] is True


async def test_the_stream_list_needs_the_token_and_holds_no_text() -> None:
    async with app_with(default_locale="de", api_token="s3cret") as run:
        c = run.client
        assert_problem(await c.get("/v1/streams"), 401)
        auth = {"Authorization": "Bearer s3cret"}
        body = {"chunks": [{"seq": 0, "text": "A secret thought."}]}
        await c.post("/v1/streams/t/chunks", json=body, headers=auth)
        r = await c.get("/v1/streams", headers=auth)
        assert r.status_code == 200 and [s["stream_id"] for s in r.json()["streams"]] == ["t"]
        assert "secret thought" not in r.text


async def test_a_reader_behind_the_retained_events_is_told_where_to_resume() -> None:
    async with app_with(default_locale="de", max_events_retained=16) as run:
        c = run.client
        await post_chunks(c, "r", [(0, " ".join(f"Sentence {i}." for i in range(30)))])
        await c.post("/v1/streams/r/close")
        await _ended(c, "r")
        problem = assert_problem(await c.get("/v1/streams/r/events"), 410)
        r = await c.get("/v1/streams/r/events", params={"after": problem["resume_after"]})
        assert r.status_code == 200 and len(r.json()["events"]) == 16



# -- a stream opened again under its id --------------------------------------------------------


async def test_a_last_event_id_past_the_streams_last_event_is_409_not_a_silent_skip() -> None:
    """A reader resuming with an id of an earlier stream under the same id (deleted, then
    opened again) is told so, SSE or long-poll, instead of being sent nothing."""
    async with app_with(default_locale="de") as run:
        c = run.client
        await post_chunks(c, "again", [(0, "One. Two. Three. Four. Five.")])
        await c.post("/v1/streams/again/close")
        old = await read_until(c, "again")
        assert (await c.delete("/v1/streams/again")).status_code == 204
        await post_chunks(c, "again", [(0, "New one. New two.")])
        await c.post("/v1/streams/again/close")
        new = await read_until(c, "again")
        assert new[-1]["id"] < old[-1]["id"]
        for accept in ("text/event-stream", "application/json"):
            headers = {"Accept": accept, "Last-Event-ID": str(old[-1]["id"])}
            r = await c.get("/v1/streams/again/events", headers=headers)
            problem = assert_problem(r, 409, "Last-Event-ID", "from its start")
            assert problem["last_event_id"] == new[-1]["id"]
            # its own last id is no conflict: nothing after it
            headers["Last-Event-ID"] = str(new[-1]["id"])
            r = await c.get("/v1/streams/again/events", headers=headers)
            assert r.status_code == 200
        assert_problem(await c.get("/v1/streams/fresh/events",
                                   headers={"Last-Event-ID": "0"}), 404)
        await c.post("/v1/streams", json={"stream_id": "fresh"})
        r = await c.get("/v1/streams/fresh/events", headers={"Last-Event-ID": "0"})
        assert assert_problem(r, 409)["last_event_id"] == -1  # no event yet


async def test_events_say_when_their_stream_was_opened_so_a_new_one_is_told_apart() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        await post_chunks(c, "twice", [(0, "Hello there.")])
        await c.post("/v1/streams/twice/close")
        first = await c.get("/v1/streams/twice/events")
        sse = await c.get("/v1/streams/twice/events", headers={"Accept": "text/event-stream"})
        started = first.headers["thinktrans-stream-started"]
        assert sse.headers["thinktrans-stream-started"] == started
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", started)
        listed = (await c.get("/v1/streams")).json()["streams"][0]["started"]
        # the list's `started`, to the microsecond
        assert abs((datetime.fromisoformat(started) - _time(listed)).total_seconds()) < 0.002
        await c.delete("/v1/streams/twice")
        await post_chunks(c, "twice", [(0, "Hello again.")])
        again = (await c.get("/v1/streams/twice/events")).headers["thinktrans-stream-started"]
        assert datetime.fromisoformat(again) > datetime.fromisoformat(started)

# -- the page and its files --------------------------------------------------------------------


async def test_the_page_is_served_without_the_token_with_strict_headers() -> None:
    async with app_with(api_token="s3cret") as run:
        c = run.client
        r = await c.get("/viewer")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "<title>thinktrans viewer</title>" in r.text
        answers = [r]
        for name, media in viewer.FILES.items():
            f = await c.get(f"/viewer/{name}")
            assert f.status_code == 200, name
            assert f.headers["content-type"] == media
            assert f.content == resources.files("service.http.static").joinpath(name).read_bytes()
            answers.append(f)
        answers.append(await c.get("/viewer", headers={"If-None-Match": r.headers["etag"]}))
        assert answers[-1].status_code == 304
        answers.append(await c.get("/viewer/nothing.js"))
        assert answers[-1].status_code == 404
        for resp in answers:
            csp = resp.headers["content-security-policy"]
            assert all(need in csp for need in CSP_NEEDS), csp
            assert "unsafe" not in csp
            assert resp.headers["x-content-type-options"] == "nosniff"
            assert resp.headers["referrer-policy"] == "no-referrer"
        assert_problem(await c.get("/v1/backends"), 401)  # the data still needs it


async def test_files_not_in_the_page_are_not_served() -> None:
    async with app_with() as run:
        c = run.client
        for name in ("index.html.bak", "__init__.py", "x.js", "..%2Fapp.py"):
            assert_problem(await c.get(f"/viewer/{name}"), 404)
        r = await c.get("/viewer/")
        assert r.status_code == 308 and r.headers["location"] == "../viewer"


async def test_an_unchanged_file_is_revalidated_not_sent_again() -> None:
    async with app_with() as run:
        c = run.client
        first = await c.get("/viewer/app.js")
        again = await c.get("/viewer/app.js", headers={"If-None-Match": first.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        assert first.headers["cache-control"] == "no-cache"


def _page_files() -> dict[str, str]:
    root = resources.files("service.http.static")
    return {name: root.joinpath(name).read_text(encoding="utf-8")
            for name in [viewer.PAGE, *viewer.FILES] if not name.endswith(".svg")}


def test_the_page_loads_only_its_own_files_and_no_inline_script() -> None:
    files = _page_files()
    html = files[viewer.PAGE]
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(link.startswith("viewer/") for link in linked), linked
    assert {link.removeprefix("viewer/") for link in linked} <= set(viewer.FILES)
    assert re.findall(r"<script\b[^>]*>", html) == ['<script type="module" src="viewer/app.js">']
    assert not re.search(r"\son[a-z]+=", html)  # no inline handlers
    for name, text in files.items():
        if name.endswith(".js"):
            for imported in re.findall(r'from "\./([^"]+)"', text):
                assert imported in viewer.FILES, (name, imported)


def test_the_page_never_writes_html_from_a_string() -> None:
    """Thinking is untrusted: it goes into the page as text nodes only."""
    for name, text in _page_files().items():
        if name.endswith(".js"):
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                         "eval(", "new Function", "setAttribute(\"on", "srcdoc",
                         "createContextualFragment", "parseFromString", "setHTMLUnsafe",
                         "DOMParser"):
                assert sink not in text, (name, sink)


# -- one frame per event ---------------------------------------------------------------------


async def test_an_event_is_serialised_once_whatever_the_number_of_readers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[int] = []
    frame = stream_routes._sse_frame

    def counted(event: tuple[int, str, str]) -> bytes:
        made.append(event[0])
        return frame(event)

    monkeypatch.setattr(stream_routes, "_sse_frame", counted)
    fake = FakeTranslator(delay_s=0.05)
    async with app_with(fake, default_locale="zh-CN") as run:
        c = run.client
        await c.post("/v1/streams", json={"stream_id": "many"})
        sse = {"Accept": "text/event-stream"}

        async def reader() -> str:
            async with c.stream("GET", "/v1/streams/many/events", headers=sse) as r:
                return (await r.aread()).decode()

        readers = [asyncio.create_task(reader()) for _ in range(8)]
        await asyncio.sleep(0.2)
        await post_chunks(c, "many", [(0, "First one. "), (1, "Second one. "), (2, "Third.")])
        await c.post("/v1/streams/many/close")
        bodies = await asyncio.wait_for(asyncio.gather(*readers), 60)
        events = parse_sse(bodies[0])
        assert [e["type"] for e in events] == ["segment"] * 3 + ["end"]
        assert all(parse_sse(b) == events for b in bodies)
        assert sorted(made) == [e["id"] for e in events]  # once each, not once per reader


async def test_a_late_reader_still_gets_every_frame() -> None:
    async with app_with(default_locale="de") as run:
        c = run.client
        text = " ".join(f"Sentence number {i}." for i in range(40))
        await post_chunks(c, "late", [(0, text)])
        await c.post("/v1/streams/late/close")
        polled = await read_until(c, "late")
        r = await c.get("/v1/streams/late/events", headers={"Accept": "text/event-stream"})
        assert parse_sse(r.text) == polled and len(polled) == 41
