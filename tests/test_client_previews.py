"""Previews through thinktrans_client, against the real app on 127.0.0.1: asked, not asked,
an older sidecar that does not know the field, and ACP, which never takes them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from thinktrans_client import Preview, ThinktransClient, ThoughtTranslator, TranslatedSegment
from thinktrans_client.acp import translate_messages

from models.passthrough import PassthroughTranslator
from tests.conftest import InThread
from tests.fakes import FakeTranslator
from tests.test_acp import is_thought, paced, thinktrans_meta, thought_parts
from tests.test_client import Scripted, assert_complete, run_stream
from tests.test_previews import EAGER, LONG

TEXT = LONG + "Then done."
WORDS = [word + " " for word in TEXT.split(" ")[:-1]] + [TEXT.split(" ")[-1]]
PAUSE_S = 0.03  # between words: the open sentence lives long enough to be previewed


@pytest.fixture(scope="module")
def fake() -> FakeTranslator:
    return FakeTranslator(delay_s=0.005)


@pytest.fixture(scope="module")
def url(fake: FakeTranslator) -> Iterator[str]:
    """The app with THINKTRANS_PREVIEWS on: a stream that says nothing is previewed."""
    with InThread({"fake": fake, "passthrough": PassthroughTranslator()}, backend="fake",
                  previews=True, **EAGER) as url:
        yield url


def preview_jobs(fake: FakeTranslator) -> int:
    return sum(job.preview for job in fake.jobs)


def opens(transport: Scripted) -> list[dict[str, Any]]:
    return [transport.bodies[i] for i in transport.paths("POST", "/v1/streams")]


async def test_a_caller_that_asks_gets_previews_before_their_segment(url: str) -> None:
    transport = Scripted()
    async with ThinktransClient(url, transport=transport) as client:
        asked = client.stream("pv:asked", target="zh-CN", previews=True)
        items = await run_stream(asked, WORDS, pause_s=PAUSE_S)
        plain = client.stream("pv:off", target="zh-CN", previews=False)
        plain_items = await run_stream(plain, WORDS, pause_s=PAUSE_S)
    assert [body["previews"] for body in opens(transport)] == [True, False]
    assert (asked.previews, plain.previews) == (True, False)

    previews = [item for item in items if isinstance(item, Preview)]
    assert len(previews) >= 2 and not any(isinstance(i, Preview) for i in plain_items)
    first_segment = next(i for i, item in enumerate(items) if isinstance(item, TranslatedSegment))
    assert all(items.index(p) < first_segment for p in previews), "never after its segment"
    assert {p.index for p in previews} == {0}
    assert [p.revision for p in previews] == list(range(1, len(previews) + 1))
    assert all(0 < p.source_chars <= len(LONG) and p.text.startswith("<zh-CN>")
               for p in previews)
    # Previews change nothing else: the same segments as a stream without them.
    segs, plain_segs = assert_complete(items, TEXT), assert_complete(plain_items, TEXT)
    assert [(s.index, s.original, s.text, s.status) for s in segs] == [
        (s.index, s.original, s.text, s.status) for s in plain_segs]
    assert [s.status for s in segs] == ["translated", "translated"]


async def test_a_caller_that_does_not_ask_never_sees_one(url: str, fake: FakeTranslator
                                                          ) -> None:
    transport = Scripted()
    async with ThinktransClient(url, transport=transport) as client:
        before = preview_jobs(fake)
        silent = client.stream("pv:silent", target="zh-CN")
        items = await run_stream(silent, WORDS, pause_s=PAUSE_S)
    [body] = opens(transport)
    assert "previews" not in body, "the open is what it was before previews"
    assert preview_jobs(fake) > before, "the sidecar's default made previews, sent to it"
    assert not any(isinstance(item, Preview) for item in items)
    assert silent.previews is False
    assert_complete(items, TEXT)


class StalePreviews(Scripted):
    """The real app, but each segment in an events answer is followed by a preview of its
    own index (the event ids doubled to make room): what a sidecar must never send."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/events"):
            return await super().handle_async_request(request)
        after = int(request.url.params["after"])
        answer = await self.inner.handle_async_request(httpx.Request(
            "GET", request.url.copy_set_param("after", after // 2), headers=request.headers))
        data = json.loads(await answer.aread())
        events = []
        for event in data["events"]:
            events.append({**event, "id": event["id"] * 2})
            if event["type"] == "segment":
                stale = {"index": event["data"]["index"], "text": "stale", "source_chars": 1,
                         "revision": 99}
                events.append({"id": event["id"] * 2 + 1, "type": "preview", "data": stale})
        return httpx.Response(answer.status_code, json={**data, "events": events})


async def test_a_preview_after_its_segment_is_dropped(url: str) -> None:
    async with ThinktransClient(url, transport=StalePreviews()) as client:
        stream = client.stream("pv:stale", target="zh-CN", previews=True)
        items = await run_stream(stream, WORDS, pause_s=PAUSE_S)
    previews = [item for item in items if isinstance(item, Preview)]
    assert previews and all(p.text != "stale" for p in previews)
    assert_complete(items, TEXT)


class OldSidecar(Scripted):
    """The real app as a sidecar older than previews answers: an open that names
    ``previews`` goes on with the field renamed to one the app does not know either, and
    its refusal comes back with the name put back (same length: nothing else changes); an
    open without it is answered without ``previews``."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.path != "/v1/streams":
            return await super().handle_async_request(request)
        body = json.loads(await request.aread())
        if "previews" not in body:
            answer = await super().handle_async_request(request)
            data = json.loads(await answer.aread())
            data.pop("previews", None)
            return httpx.Response(answer.status_code, json=data)
        self.requests.append(request)
        self.bodies.append(body)
        renamed = {("previewz" if key == "previews" else key): value
                   for key, value in body.items()}
        answer = await self.inner.handle_async_request(
            httpx.Request("POST", request.url, headers={"content-type": "application/json"},
                          content=json.dumps(renamed).encode()))
        content = (await answer.aread()).replace(b"previewz", b"previews")
        return httpx.Response(answer.status_code, headers=answer.headers, content=content)


async def test_an_older_sidecar_refusing_the_field_is_opened_again_without_it(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    transport = OldSidecar()
    caplog.set_level(logging.WARNING, logger="thinktrans.client")
    async with ThinktransClient(url, transport=transport) as client:
        streams = [client.stream(f"pv:old{n}", target="zh-CN", previews=True) for n in (1, 2)]
        runs = [await run_stream(stream, WORDS, pause_s=PAUSE_S / 3) for stream in streams]
        assert client.unknown_fields == {"previews"}
    assert [("previews" in body) for body in opens(transport)] == [True, False, True, False]
    for stream, items in zip(streams, runs, strict=True):
        assert stream.failure is None and stream.previews is False
        assert not any(isinstance(item, Preview) for item in items)
        assert {s.status for s in assert_complete(items, TEXT)} == {"translated"}
    told = [r for r in caplog.records if "previews" in r.getMessage()]
    assert len(told) == 1, "said once for the client, not once a stream"


async def test_another_refusal_of_the_open_is_not_retried(url: str) -> None:
    transport = Scripted()
    async with ThinktransClient(url, transport=transport) as client:
        stream = client.stream("pv:bad", target="zh-CN", backend="no-such", previews=True)
        items = await run_stream(stream, ["Let me check. "])
    assert len(opens(transport)) == 1
    assert stream.failure is not None and "no such backend" in stream.failure
    assert [s.status for s in assert_complete(items, "Let me check. ")] == ["error"]


def thoughts(words: list[str]) -> list[dict[str, Any]]:
    """One thinking part of one ACP session, a word a chunk; a message chunk ends it."""
    def update(kind: str, text: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "session/update", "params": {
            "sessionId": "sess_pv", "update": {"sessionUpdate": kind,
                                               "content": {"type": "text", "text": text}}}}

    return [*(update("agent_thought_chunk", word) for word in words),
            update("agent_message_chunk", "Done.")]


async def test_acp_never_asks_for_previews_even_when_the_sidecar_defaults_to_them(
        url: str, fake: FakeTranslator) -> None:
    messages = thoughts(WORDS)
    transport = Scripted()
    before = preview_jobs(fake)
    async with ThinktransClient(url, transport=transport) as client:
        out = [m async for m in translate_messages(client, paced(messages, PAUSE_S),
                                                   target="zh-CN")]
    assert [body["previews"] for body in opens(transport)] == [False]
    assert preview_jobs(fake) == before, "the sidecar made no preview for it"
    assert thought_parts(out, output=True) == [TEXT]
    assert [m["status"] for m in thinktrans_meta(out)] == ["translated", "translated"]
    assert sum(map(is_thought, out)) == 2, "a chunk a segment, nothing provisional"


async def test_acp_refuses_to_be_asked_for_previews(url: str) -> None:
    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent")

    async with ThinktransClient(url) as client:
        with pytest.raises(ValueError, match="append-only"):
            ThoughtTranslator(client, send, stream_options={"previews": True})
