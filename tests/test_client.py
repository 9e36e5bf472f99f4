"""thinktrans_client.client against real sidecars (`thinktrans serve` processes) and broken ones."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from thinktrans_client.client import (
    SegmentUpdate,
    SidecarError,
    StreamItem,
    ThinkingStream,
    ThinktransClient,
    TranslatedSegment,
    safe_stream_id,
)
from thinktrans_client.locale import InvalidLocale, canonicalize
from thinktrans_client.reasons import CLOSED_EARLY

from tests.conftest import Server, app_with, served
from tests.fakes import FakeTranslator
from tests.fakes_remote import FakeChat, closed_port_url

THINKING = (
    "The user asks why the build fails on CI. Let me check `setup.cfg` first, "
    "then the workflow file.\n```yaml\nruns-on: ubuntu-latest\n```\n"
    "Hmm, Zanzibar is not the cause. 我们再看看日志。 The cache key looks stale, "
    "so the fix is to bump it"
)
STATUSES = {"translated", "same_language", "skipped", "deadline", "error", "no_target",
            "hidden"}
MIXED = "Let me check the parser. 我们再看看日志。 The cache key looks stale. 好的。"


# -- sidecars ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Server]:
    """Passthrough, no default locale: the target is whatever the client resolves."""
    with served() as server:
        yield server


@pytest.fixture(scope="module")
def allowed_sidecar() -> Iterator[Server]:
    """Passthrough (any target) narrowed by THINKTRANS_ALLOWED_LOCALES."""
    with served(THINKTRANS_ALLOWED_LOCALES="zh-CN,de") as server:
        yield server


@pytest.fixture(scope="module")
def chat(chat_server: FakeChat) -> FakeChat:
    return chat_server


def llm_server(chat: FakeChat, **env: str) -> AbstractContextManager[Server]:
    """The llm backend on FakeChat, which answers "<language name>: <text>": visible."""
    return served(**{
        "THINKTRANS_BACKEND": "llm", "THINKTRANS_LLM_BASE_URL": f"{chat.origin}/v1",
        "THINKTRANS_LLM_MODEL": "fake-model", "THINKTRANS_CHECK_OUTPUT_LANGUAGE": "false",
        "THINKTRANS_DEADLINE_MS": "700", **env,
    })


@pytest.fixture(scope="module")
def llm_sidecar(chat: FakeChat) -> Iterator[Server]:
    with llm_server(chat) as server:
        yield server


@pytest.fixture
def fake_chat(chat: FakeChat) -> FakeChat:
    chat.reset()
    return chat


class RawServer:
    """A TCP server on 127.0.0.1 with a handler per connection: for sidecars that misbehave."""

    def __init__(self, handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]):
        self._handle = handle
        self.server: asyncio.Server | None = None
        self.connections = 0
        self._handlers: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> str:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            task = asyncio.current_task()
            assert task is not None
            self._handlers.add(task)
            try:
                await self._handle(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
                self._handlers.discard(task)

        self.server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.sleep(0)


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Accept, read, and never answer: a hung sidecar."""
    await reader.read(65536)
    await asyncio.sleep(3600)


async def answer_500(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request with a problem+json 500, keeping the connection alive."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode("latin-1").split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        if length:
            await reader.readexactly(length)
        body = b'{"type":"urn:thinktrans:problem:internal","title":"Internal error","status":500}'
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/"
                     b"problem+json\r\ncontent-length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        await writer.drain()


class Scripted(httpx.AsyncBaseTransport):
    """A real transport with a hook before each request: forward, fake an answer, or fail."""

    def __init__(self, hook: Callable[[httpx.Request, int], httpx.Response | None] | None = None
                 ) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.hook = hook
        self.requests: list[httpx.Request] = []
        self.bodies: list[Any] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        body = await request.aread()
        self.bodies.append(json.loads(body) if body else None)
        if self.hook is not None:
            answer = self.hook(request, len(self.requests) - 1)
            if answer is not None:
                return answer
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def paths(self, method: str, suffix: str) -> list[int]:
        return [i for i, r in enumerate(self.requests)
                if r.method == method and r.url.path.endswith(suffix)]


def deltas(text: str, sizes: list[int] | None = None) -> list[str]:
    """``text`` cut into pieces of 1-6 characters (or the given sizes, cycled)."""
    sizes = sizes or [1, 4, 2, 6, 3, 5]
    out, i, k = [], 0, 0
    while i < len(text):
        n = sizes[k % len(sizes)]
        out.append(text[i: i + n])
        i += n
        k += 1
    return out


def push_at_once(stream: ThinkingStream, piece: str) -> None:
    """``await stream.push(piece)``, which must return without ever suspending: it waits on
    nothing (no network, no lock), whatever the sidecar's state."""
    step = stream.push(piece)
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    raise AssertionError("push suspended: it waited on something")


async def until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``check`` holds, looking every 10 ms (generously bounded)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


async def run_stream(stream: ThinkingStream, pieces: list[str], *, pause_s: float = 0.0,
                     updates: bool = True, close: bool = True) -> list[StreamItem]:
    """Push ``pieces`` (pausing between them) while reading results; all that came back."""

    async def feed() -> None:
        for piece in pieces:
            push_at_once(stream, piece)
            if pause_s:
                await asyncio.sleep(pause_s)
        if close:
            await stream.close()

    feeder = asyncio.create_task(feed())
    items = [item async for item in stream.results(updates=updates)]
    await feeder
    return items


def segments(items: list[StreamItem]) -> list[TranslatedSegment]:
    return [item for item in items if isinstance(item, TranslatedSegment)]


def assert_complete(items: list[StreamItem], text: str) -> list[TranslatedSegment]:
    """Nothing lost, duplicated or reordered; indexes run 0, 1, 2...; statuses known."""
    segs = segments(items)
    assert "".join(s.original for s in segs) == text
    assert [s.index for s in segs] == list(range(len(segs)))
    assert {s.status for s in segs} <= STATUSES
    return segs


# -- stream ids ----------------------------------------------------------------------------


def test_safe_stream_id() -> None:
    assert safe_stream_id("sess_1", "ab.0") == "sess_1:ab.0"
    odd = [safe_stream_id(s, "0") for s in ("a b", "a_b", "a/b", "x" * 300, "x" * 301, "é")]
    assert len(set(odd)) == len(odd)
    assert all(len(i) <= 128 and all(c.isascii() and (c.isalnum() or c in "._:-") for c in i)
               for i in odd)


# -- one-shot ------------------------------------------------------------------------------


async def test_translate_real_server(sidecar: Server) -> None:
    text = "Hmm, the user said hello. 我们来看看。\n```python\nx = 1\n```\n"
    async with ThinktransClient(sidecar.url) as client:
        [result] = await client.translate([text], target="ZH-cn")
    assert result.text == text
    assert "".join(s.original for s in result.segments) == text
    assert [s.status for s in result.segments] == ["translated", "same_language", "skipped"]
    assert {s.target for s in result.segments} == {"zh-CN"}
    assert result.segments[0].backend == "passthrough"


async def test_locale_canonical_form_is_the_sidecars(sidecar: Server) -> None:
    """The client's own canonical case is the sidecar's, and what it refuses, the sidecar
    refuses too (422): checking locally never drops a target the sidecar would take."""
    accepted = ["ZH-cn", "zh-hant-tw", "EN", "pt-br", "ja-JP", "sr-latn-rs", "es-419",
                "de-DE-1996", "iw", "zh-Hans-CN-u-co-pinyin", "en-US-x-Foo"]
    refused = ["zh_CN", "und", "en-", "en-US-US", "de-1996-1996", "abcde", "en-a-b", "en-u",
               "en-abcd-efgh", "x-private"]
    async with ThinktransClient(sidecar.url) as client:
        for tag in accepted:
            [result] = await client.translate(["Hello."], target=tag, fallback=False)
            assert result.segments[0].target == canonicalize(tag), tag
        for tag in refused:
            with pytest.raises(InvalidLocale):
                canonicalize(tag)
            with pytest.raises(SidecarError) as caught:
                await client.translate(["Hello."], target=tag, fallback=False)
            assert caught.value.status == 422, tag


async def test_translate_falls_back_when_down() -> None:
    """A refused connection falls back at once, not after the (here long) ``timeout_s``."""
    async with ThinktransClient(closed_port_url(), timeout_s=600) as client:
        async with asyncio.timeout(120):
            [a, b] = await client.translate(["One.", "Two."], target="de")
        assert (a.text, b.text) == ("One.", "Two.")
        assert a.segments[0].status == "error"
        assert a.segments[0].error is not None and "unreachable" in a.segments[0].error
        with pytest.raises(SidecarError):
            await client.translate(["One."], target="de", fallback=False)


async def test_translate_error_is_not_an_outage(sidecar: Server) -> None:
    """A 422 (bad target) falls back for that call, but the sidecar is not skipped after."""
    async with ThinktransClient(sidecar.url) as client:
        [bad] = await client.translate(["Hello there."], target="zh_CN")
        assert bad.segments[0].status == "error" and "invalid-locale" in str(bad.segments[0].error)
        assert client.available
        [good] = await client.translate(["Hello there."], target="zh-CN")
        assert good.segments[0].status == "translated"


# -- model, policy and what the sidecar offers -------------------------------------------


def test_segment_and_update_read_model_and_cached() -> None:
    base = {"index": 2, "original": "Hi. ", "text": "你好。 ", "status": "translated",
            "source_lang": "en", "target": "zh-CN", "backend": "llm", "queued_ms": 1.5,
            "latency_ms": 20.0}
    seg = TranslatedSegment.from_json({**base, "model": "fake-model", "cached": True})
    assert (seg.model, seg.cached, seg.backend, seg.latency_ms) == ("fake-model", True, "llm",
                                                                    20.0)
    bare = TranslatedSegment.from_json(base)  # both absent when unset, as the server sends
    assert (bare.model, bare.cached) == (None, False)
    odd = TranslatedSegment.from_json({**base, "model": 7, "cached": "yes"})
    assert (odd.model, odd.cached) == (None, False)  # only a true true is a cache hit
    hidden = TranslatedSegment.from_json({**base, "status": "hidden", "text": ""})
    assert (hidden.status, hidden.text, hidden.original) == ("hidden", "", "Hi. ")
    update = SegmentUpdate.from_json({"index": 2, "text": "你好。", "status": "translated",
                                      "backend": "llm", "model": "m", "cached": True})
    assert (update.model, update.cached, update.error) == ("m", True, None)


async def test_model_and_policy_are_sent_only_when_set(sidecar: Server) -> None:
    transport = Scripted()
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        plain = client.stream("t:plain", target="zh-CN")
        plain_items = await run_stream(plain, [MIXED])
        chosen = client.stream("t:chosen", target="zh-CN", model="m-1", policy="hide")
        chosen_items = await run_stream(chosen, [MIXED])
        [one] = await client.translate([MIXED], target="zh-CN", fallback=False)
        [hid] = await client.translate([MIXED], target="zh-CN", policy="hide", model="m-2",
                                       fallback=False)
    opens = [transport.bodies[i] for i in transport.paths("POST", "/v1/streams")]
    assert [sorted(body) for body in opens] == [
        ["backend", "stream_id", "target", "user_text"],
        ["backend", "model", "policy", "stream_id", "target", "user_text"]]
    assert (opens[1]["model"], opens[1]["policy"]) == ("m-1", "hide")
    posts = [transport.bodies[i] for i in transport.paths("POST", "/v1/translate")]
    assert "model" not in posts[0] and "policy" not in posts[0]
    assert (posts[1]["model"], posts[1]["policy"]) == ("m-2", "hide")
    # What the server took: its answers to open, and the segments it hid.
    assert (plain.model, plain.policy) == (None, "translate")
    assert (chosen.model, chosen.policy) == ("m-1", "hide")
    assert "hidden" not in {s.status for s in segments(plain_items)} | {
        s.status for s in one.segments}
    assert "hidden" in {s.status for s in segments(chosen_items)}
    assert "hidden" in {s.status for s in hid.segments}


async def test_a_glossary_is_sent_only_when_set_and_rendered(sidecar: Server) -> None:
    transport = Scripted()
    glossary = {"terms": {"user": "用户"}, "keep": ["hello"]}
    text = "Hmm, the user said hello. "
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        items = await run_stream(client.stream("t:glossary", target="zh-CN",
                                               glossary=glossary), [text])
        [one] = await client.translate([text], target="zh-CN", glossary=glossary,
                                       fallback=False)
        [plain] = await client.translate([text], target="zh-CN", fallback=False)
        with pytest.raises(ValueError, match="glossary must be"):
            client.stream("t:bad", glossary={"term": {}})
    [opened] = [transport.bodies[i] for i in transport.paths("POST", "/v1/streams")]
    assert opened["glossary"] == glossary
    posts = [transport.bodies[i] for i in transport.paths("POST", "/v1/translate")]
    assert posts[0]["glossary"] == glossary and "glossary" not in posts[1]
    # The sidecar serves passthrough: the terms rendered, the rest as it was.
    assert [s.text for s in segments(items)] == ["Hmm, the 用户 said hello. "]
    assert one.text == "Hmm, the 用户 said hello. " and plain.text == text


async def test_hide_policy_on_a_mixed_stream(sidecar: Server) -> None:
    async with ThinktransClient(sidecar.url) as client:
        stream = client.stream("t:hide", target="zh-CN", policy="hide")
        items = await run_stream(stream, deltas(MIXED), pause_s=0.001)
        await stream.aclose()
    segs = assert_complete(items, MIXED)
    assert stream.failure is None
    assert [(s.status, s.text) for s in segs] == [
        ("hidden", ""), ("same_language", "我们再看看日志。 "), ("hidden", ""),
        ("same_language", "好的。")]
    assert [s.source_lang for s in segs if s.status == "hidden"] == ["en", "en"]


async def test_hide_falls_back_to_the_originals_shown() -> None:
    """A failing sidecar under hide shows the thinking: hiding it all would lose it."""
    async with ThinktransClient(closed_port_url()) as client:
        stream = client.stream("t:hide-down", target="zh-CN", policy="hide")
        items = await run_stream(stream, deltas(MIXED))
        [one] = await client.translate([MIXED], target="zh-CN", policy="hide")
    segs = assert_complete(items, MIXED)
    assert {s.status for s in segs} == {"error"} and all(s.text == s.original for s in segs)
    assert one.text == MIXED and [s.status for s in one.segments] == ["error"]


async def test_a_named_model_reaches_the_backend(llm_sidecar: Server, fake_chat: FakeChat
                                                 ) -> None:
    text = "The named model answers this sentence. "
    async with ThinktransClient(llm_sidecar.url) as client:
        stream = client.stream("t:model", target="zh-CN", model="other-model")
        items = await run_stream(stream, [text])
        [again] = await client.translate([text], target="zh-CN", model="other-model",
                                         fallback=False)
    [seg] = segments(items)
    assert (seg.status, seg.model, seg.cached) == ("translated", "other-model", False)
    assert {(r.json or {}).get("model") for r in fake_chat.chat_requests} == {"other-model"}
    # The same text for the same model again: the sidecar's cache answers, and says so.
    assert [(s.model, s.cached) for s in again.segments] == [("other-model", True)]


async def test_supported_targets_and_models(sidecar: Server, allowed_sidecar: Server,
                                            llm_sidecar: Server) -> None:
    async with ThinktransClient(allowed_sidecar.url) as client:
        languages = await client.languages()
        assert await client.supported_targets() == ["zh-CN", "de"] == languages["targets"]
        assert languages["allowed_locales"] == ["zh-CN", "de"]
        assert languages["backends"]["passthrough"]["ready"] is True
    async with ThinktransClient(sidecar.url) as client:
        assert await client.supported_targets() is None  # passthrough takes any target
    async with ThinktransClient(llm_sidecar.url) as client:
        models = await client.models()
    served_list = httpx.get(f"{llm_sidecar.url}/v1/models").json()["models"]
    assert models == served_list
    assert {"backend": "llm", "model": "fake-model", "default": True}.items() <= next(
        m for m in models if m["model"] == "fake-model").items()


async def test_offers_raise_when_the_sidecar_does_not_say() -> None:
    async with ThinktransClient(closed_port_url(), cooloff_s=0) as client:
        for call in (client.languages, client.supported_targets, client.models):
            with pytest.raises(SidecarError, match="unreachable"):
                await call()

    def older(request: httpx.Request) -> httpx.Response:  # /v1/languages before `targets`
        return httpx.Response(200, json={"default_target": None, "allowed_locales": None,
                                         "backends": {}, "models": "none"})

    async with ThinktransClient("http://sidecar", transport=httpx.MockTransport(older)
                                ) as client:
        with pytest.raises(SidecarError, match="no targets"):
            await client.supported_targets()
        with pytest.raises(SidecarError, match="malformed"):
            await client.models()


async def test_bad_model_or_policy_is_the_callers_bug() -> None:
    async with ThinktransClient(closed_port_url()) as client:
        for kwargs in ({"policy": "drop"}, {"model": ""}):
            with pytest.raises(ValueError):
                client.stream("t:bad", target="de", **kwargs)
            with pytest.raises(ValueError):
                await client.translate(["Hi."], target="de", **kwargs)


# -- streams against real sidecars ---------------------------------------------------------


async def test_stream_translates_in_order(llm_sidecar: Server, fake_chat: FakeChat) -> None:
    async with ThinktransClient(llm_sidecar.url) as client:
        stream = client.stream("t:order", target="zh-CN")
        items = await run_stream(stream, deltas(THINKING), pause_s=0.001)
        await stream.aclose()
    segs = assert_complete(items, THINKING)
    assert stream.failure is None
    assert (stream.target, stream.target_source) == ("zh-CN", "request")
    by_status = {s.status for s in segs}
    assert {"translated", "skipped", "same_language"} <= by_status
    for seg in segs:
        if seg.status == "translated":
            assert seg.text.strip() == f"Simplified Chinese: {seg.original.strip()}"
            assert seg.backend == "llm" and seg.source_lang == "en"
        else:
            assert seg.text == seg.original
    assert [r for r in fake_chat.requests if r.path.endswith("/chat/completions")]


async def test_chunks_are_batched_with_fixed_seqs(sidecar: Server) -> None:
    transport = Scripted()
    pieces = deltas(THINKING)
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        stream = client.stream("t:batch", target="de", flush_interval_s=0.05)
        items = await run_stream(stream, pieces, pause_s=0.002)
        await stream.aclose()
    assert_complete(items, THINKING)
    posts = [transport.bodies[i] for i in transport.paths("POST", "/chunks")]
    seqs = [c["seq"] for body in posts for c in body["chunks"]]
    assert seqs == list(range(len(seqs)))
    assert len(seqs) < len(pieces) / 3
    assert "".join(c["text"] for body in posts for c in body["chunks"]) == THINKING
    assert transport.paths("POST", "/close") and transport.paths("DELETE", "/t:batch")


async def test_a_huge_delta_is_posted_in_bounded_requests(sidecar: Server) -> None:
    transport = Scripted()
    text = "这段思考很长没有句号" * 38_000  # 1.1 MB as UTF-8: over the 1 MiB request limit
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        stream = client.stream("t:huge", target="de")
        items = await run_stream(stream, [text[:10], text[10:], "并且结束。"])
        await stream.aclose()
    assert stream.failure is None
    assert_complete(items, text + "并且结束。")
    posts = [transport.bodies[i] for i in transport.paths("POST", "/chunks")]
    assert len(posts) >= 3
    assert all(sum(len(c["text"]) for c in body["chunks"]) <= 65536 for body in posts)
    assert all(len(c["text"]) <= 8192 for body in posts for c in body["chunks"])


async def test_target_from_user_text_and_none(sidecar: Server) -> None:
    async with ThinktransClient(sidecar.url) as client:
        guessed = client.stream("t:user", user_text="Pourquoi le test échoue-t-il sur la CI ?")
        items = await run_stream(guessed, ["Let me check ", "the logs."])
        none = client.stream("t:none")
        bare = await run_stream(none, ["Let me check the logs."])
    assert guessed.target == "fr" and guessed.target_source == "user_text"
    assert {s.target for s in segments(items)} == {"fr"}
    assert none.target is None and [s.status for s in segments(bare)] == ["no_target"]


async def test_late_update_follows_deadline(llm_sidecar: Server, fake_chat: FakeChat) -> None:
    fake_chat.slow_s = 1.2
    fake_chat.script.append("timeout")  # one answer past the server's 700 ms deadline
    async with ThinktransClient(llm_sidecar.url) as client:
        stream = client.stream("t:late", target="zh-CN")
        items = await run_stream(stream, ["Let me look at ", "the failing test."])
    segs = assert_complete(items, "Let me look at the failing test.")
    assert [s.status for s in segs] == ["deadline"] and segs[0].text == segs[0].original
    [update] = [item for item in items if isinstance(item, SegmentUpdate)]
    assert (update.index, update.status) == (0, "translated")
    assert update.text == "Simplified Chinese: Let me look at the failing test."


async def test_empty_stream_needs_no_server() -> None:
    transport = Scripted()
    async with ThinktransClient(closed_port_url(), transport=transport) as client:
        stream = client.stream("t:empty")
        await stream.push("")
        await stream.close()
        assert [item async for item in stream.results()] == []
    assert transport.requests == []


# -- falling back --------------------------------------------------------------------------


async def test_down_sidecar_passes_originals_through() -> None:
    """At once: neither the (here long) request budget nor the stall budget is waited for."""
    async with ThinktransClient(closed_port_url(), timeout_s=600, stall_s=1200) as client:
        stream = client.stream("t:down", target="zh-CN")
        async with asyncio.timeout(120):
            items = await run_stream(stream, deltas(THINKING), pause_s=0.001)
    segs = assert_complete(items, THINKING)
    assert {s.status for s in segs} == {"error"}
    assert all(s.text == s.original for s in segs)
    assert stream.failure is not None and "unreachable" in stream.failure


async def test_hung_sidecar_passes_through_within_budget() -> None:
    """After ``timeout_s``: not sooner, and not after the (here long) stall budget."""
    async with RawServer(never_answer) as url, ThinktransClient(url, timeout_s=1.0,
                                                                stall_s=120) as client:
        stream = client.stream("t:hung", target="zh-CN")
        started = time.monotonic()
        pieces = deltas(THINKING)
        items = await run_stream(stream, pieces[:10])
        first_out = time.monotonic() - started
        assert first_out > 0.9  # not before timeout_s (the stall budget's end: its failure)
        # Once fallen back, each push comes straight out.
        more = client.stream("t:hung2", target="zh-CN")
        rest = await run_stream(more, pieces[10:])
    assert_complete(items, "".join(pieces[:10]))
    assert stream.failure is not None and "did not answer within 1 s" in stream.failure
    assert_complete(rest, "".join(pieces[10:]))
    assert more.failure is not None and "skipped" in more.failure


async def test_500_sidecar_passes_originals_through() -> None:
    raw = RawServer(answer_500)
    async with raw as url, ThinktransClient(url) as client:
        stream = client.stream("t:500", target="zh-CN")
        items = await run_stream(stream, deltas(THINKING))
    segs = assert_complete(items, THINKING)
    assert {s.status for s in segs} == {"error"}
    assert stream.failure == "the sidecar failed (HTTP 500 internal)"
    assert raw.connections >= 1


@pytest.mark.parametrize("how", ["kill", "terminate"])
async def test_sidecar_killed_mid_stream(how: str) -> None:
    """SIGKILL (a crash) or SIGTERM (a deploy: the sidecar closes its streams and exits)."""
    with served() as server:
        # A loaded machine's sidecar may answer slowly: the fallback must come from the
        # kill, not from timeout_s.
        async with ThinktransClient(server.url, timeout_s=30) as client:
            stream = client.stream("t:killed", target="de")
            pieces = deltas(THINKING)
            half = len(pieces) // 2
            got: list[StreamItem] = []
            reader_done = asyncio.Event()

            async def read() -> None:
                async for item in stream.results():
                    got.append(item)
                reader_done.set()

            reader = asyncio.create_task(read())
            for piece in pieces[:half]:
                await stream.push(piece)
            await until(lambda: bool(got))  # the first sentences are back: well under way
            if how == "kill":
                server.proc.kill()
            else:
                server.proc.terminate()
            for piece in pieces[half:]:
                await stream.push(piece)
                await asyncio.sleep(0.002)
            await stream.close()
            await asyncio.wait_for(reader_done.wait(), 120)
            await reader
    segs = assert_complete(got, THINKING)
    statuses = [s.status for s in segs]
    assert statuses[0] == "translated" and statuses[-1] == "error"
    first_error = statuses.index("error")
    assert set(statuses[first_error:]) == {"error"}  # never a server segment after fallback


async def test_stream_ended_by_the_sidecar(sidecar: Server) -> None:
    """A draining sidecar closes open streams itself: the rest passes through, no busy loop."""
    transport = Scripted()
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        stream = client.stream("t:ended", target="de")
        got: list[StreamItem] = []

        async def read() -> None:
            async for item in stream.results():
                got.append(item)

        reader = asyncio.create_task(read())
        await stream.push("First sentence. Second")
        await until(lambda: bool(got))
        async with httpx.AsyncClient() as other:
            await other.post(f"{sidecar.url}/v1/streams/t:ended/close")
        # The reader sees the end and falls back, rather than polling the ended stream on.
        await until(lambda: stream.failure is not None)
        asked = len(transport.requests)
        assert asked < 10
        await stream.push(" sentence. Third one.")
        await stream.close()
        await asyncio.wait_for(reader, 10)
        assert len(transport.requests) == asked  # nothing asked of the sidecar since
    # but the DELETE of the stream its owner left, when the client closes
    assert [r.method for r in transport.requests[asked:]] == ["DELETE"]
    assert_complete(got, "First sentence. Second sentence. Third one.")
    assert stream.failure == CLOSED_EARLY
    assert [s.status for s in segments(got)] == ["translated", "translated", "error"]


async def test_lost_answer_is_retried_with_the_same_seq(sidecar: Server) -> None:
    """The server took the chunks but the answer was lost: re-posting them is harmless."""
    lost: list[int] = []

    class LoseFirstAnswer(Scripted):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await super().handle_async_request(request)
            if request.url.path.endswith("/chunks") and not lost:
                await response.aread()
                lost.append(len(self.requests) - 1)
                raise httpx.RemoteProtocolError("connection closed before the answer")
            return response

    transport = LoseFirstAnswer()
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        stream = client.stream("t:retry", target="de")
        items = await run_stream(stream, deltas(THINKING), pause_s=0.001)
    assert stream.failure is None
    assert_complete(items, THINKING)
    posts = transport.paths("POST", "/chunks")
    assert transport.bodies[posts[0]] == transport.bodies[posts[1]]  # same seqs, same text


async def test_full_queue_503_is_retried(sidecar: Server) -> None:
    def hook(request: httpx.Request, n: int) -> httpx.Response | None:
        if request.url.path.endswith("/chunks") and n < 4:
            return httpx.Response(503, headers={"Retry-After": "0"},
                                  json={"type": "urn:thinktrans:problem:overloaded"})
        return None

    transport = Scripted(hook)
    async with ThinktransClient(sidecar.url, transport=transport) as client:
        stream = client.stream("t:503", target="de")
        items = await run_stream(stream, deltas(THINKING))
    assert stream.failure is None
    assert_complete(items, THINKING)
    assert len(transport.paths("POST", "/chunks")) >= 2


async def test_shutting_down_503_falls_back_at_once(sidecar: Server) -> None:
    """A draining sidecar asks to come back after more than ``timeout_s``; the thoughts do
    not wait for that, nor for ``timeout_s`` (both long here)."""

    def hook(request: httpx.Request, n: int) -> httpx.Response | None:
        if request.url.path == "/v1/streams":
            return httpx.Response(503, headers={"Retry-After": "600"},
                                  json={"type": "urn:thinktrans:problem:overloaded"})
        return None

    async with ThinktransClient(sidecar.url, transport=Scripted(hook), timeout_s=600) as client:
        stream = client.stream("t:draining", target="de")
        async with asyncio.timeout(120):
            items = await run_stream(stream, ["Let me see."])
        assert not client.available  # and the next streams skip it for a while
    assert [s.status for s in segments(items)] == ["error"]
    assert stream.failure is not None and "(HTTP 503 overloaded)" in stream.failure


async def test_stall_budget(sidecar: Server) -> None:
    """The sidecar answers every poll, but never with a result: the budget ends the wait."""

    def hook(request: httpx.Request, n: int) -> httpx.Response | None:
        if request.url.path.endswith("/events"):
            return httpx.Response(200, json={"events": []})
        return None

    async with ThinktransClient(sidecar.url, transport=Scripted(hook), stall_s=0.6,
                                poll_wait_s=0.1) as client:
        stream = client.stream("t:stall", target="de")
        items = await run_stream(stream, ["All done here. ", "Next step"])
    assert_complete(items, "All done here. Next step")
    assert stream.failure is not None and "no translation came back within 0.6 s" in stream.failure


async def test_outage_is_skipped_then_retried() -> None:
    transport = Scripted()
    async with ThinktransClient(closed_port_url(), transport=transport, cooloff_s=2.0) as client:
        started = time.monotonic()
        first = client.stream("t:a", target="de")
        await run_stream(first, ["Hello."])
        tried = len(transport.requests)
        second = client.stream("t:b", target="de")
        items = await run_stream(second, ["Hello again."])
        assert len(transport.requests) == tried  # skipped: no request at all
        assert [s.status for s in segments(items)] == ["error"]
        await until(lambda: client.available)
        assert time.monotonic() - started >= 2.0  # the skip lasted cooloff_s
        third = client.stream("t:c", target="de")
        await run_stream(third, ["Hello once more."])
        assert len(transport.requests) > tried


async def test_token_is_sent() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"results": [{"text": "x", "segments": []}]})

    async with ThinktransClient("http://sidecar", token="s3cret",
                                transport=httpx.MockTransport(handler)) as client:
        await client.translate(["x"], target="de")
    assert seen == ["Bearer s3cret"]


async def test_logs_hold_no_thinking_text(sidecar: Server, caplog: pytest.LogCaptureFixture
                                          ) -> None:
    caplog.set_level(logging.DEBUG)
    async with ThinktransClient(sidecar.url) as client:
        ok = client.stream("t:logs", target="de")
        await run_stream(ok, deltas(THINKING))
        await ok.aclose()
    async with RawServer(answer_500) as url, ThinktransClient(url) as client:
        await run_stream(client.stream("t:logs2", target="de"), deltas(THINKING))
        await client.translate([THINKING], target="de")
    async with ThinktransClient(closed_port_url()) as client:
        await run_stream(client.stream("t:logs3", target="de"), deltas(THINKING))
    messages = [r.getMessage() for r in caplog.records]
    assert any("falls back" in m for m in messages)
    assert not [m for m in messages if "Zanzibar" in m or "cache key" in m]


# -- the invariant, under faults -----------------------------------------------------------

FAULTS = ["none", "refuse", "500", "hang", "lose_answer", "garbage"]


def faulty(fault: str, after: int) -> Scripted:
    """A transport that breaks in the way named, from its ``after``-th request on."""

    def hook(request: httpx.Request, n: int) -> httpx.Response | None:
        if fault == "none" or n < after:
            return None
        if fault == "refuse":
            raise httpx.ConnectError("connection refused")
        if fault == "500":
            return httpx.Response(500, json={"type": "urn:thinktrans:problem:internal"})
        if fault == "hang":
            raise httpx.ReadTimeout("timed out")
        if fault == "garbage":
            return httpx.Response(200, content=b"<html>proxy error</html>")
        return None

    class Faulty(Scripted):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await super().handle_async_request(request)
            if fault == "lose_answer" and len(self.requests) > after:
                await response.aread()
                raise httpx.RemoteProtocolError("connection dropped")
            return response

    return Faulty(hook)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.sampled_from([THINKING, "Short one.", "第一句。 Then English. x = 1 + 2\n\nEnd"]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    fault=st.sampled_from(FAULTS),
    after=st.integers(0, 8),
    pause=st.sampled_from([0.0, 0.003]),
)
def test_originals_join_back_whatever_fails(sidecar: Server, text: str, sizes: list[int],
                                            fault: str, after: int, pause: float) -> None:
    async def scenario() -> tuple[list[StreamItem], str | None]:
        # The faults come from the transport ("hang" is its timeout): the client's own
        # timeout only stops a hang, as a loaded machine's sidecar may answer slowly.
        async with ThinktransClient(sidecar.url, transport=faulty(fault, after),
                                    timeout_s=60, stall_s=120) as client:
            stream = client.stream(f"p:{time.monotonic_ns()}", target="de",
                                   flush_interval_s=0.01)
            items = await run_stream(stream, deltas(text, sizes), pause_s=pause)
            return items, stream.failure

    items, failure = asyncio.run(scenario())
    segs = assert_complete(items, text)
    fallback = [i for i, s in enumerate(segs) if (s.error or "").startswith("sidecar:")]
    if fallback:
        assert failure is not None
        assert fallback == list(range(fallback[0], len(segs)))  # the tail, and only the tail
    if fault == "none":
        assert failure is None and not fallback


# -- streams given up are deleted ----------------------------------------------------------


def open_streams(metrics: str) -> float:
    """The sidecar's ``thinktrans_open_streams`` gauge, from its /metrics text."""
    for line in metrics.splitlines():
        if line.startswith("thinktrans_open_streams "):
            return float(line.split()[1])
    raise AssertionError("no thinktrans_open_streams in /metrics")


def test_streams_given_up_are_deleted(chat: FakeChat) -> None:
    """A burst of sessions on a backend too slow for them: the first streams' segments wait
    past the stall budget, the others' chunk POSTs find the queue full and give up within
    ``timeout_s``. Every stream falls back to the originals, and every one the sidecar had
    opened is deleted once its reader is done, so the sidecar's count goes back down (and
    later clients do not get 429 past ``max_streams``) rather than waiting for the expiry."""
    chat.reset()
    chat.mode, chat.slow_s = "timeout", 30.0
    try:
        with llm_server(chat, THINKTRANS_DEADLINE_MS="20000", THINKTRANS_MAX_QUEUE_SIZE="2",
                        THINKTRANS_FLUSH_IDLE_MS="50",
                        THINKTRANS_STREAM_IDLE_EXPIRE_S="600") as server:

            async def burst() -> None:
                async with ThinktransClient(server.url, timeout_s=0.8, stall_s=1.5,
                                            cooloff_s=0) as client:
                    streams = [client.stream(f"t:burst.{n}", target="de") for n in range(8)]

                    async def one(stream: ThinkingStream) -> None:
                        items = await run_stream(stream, ["First step done. ", "Then more."])
                        assert_complete(items, "First step done. Then more.")
                        await stream.aclose()

                    async with asyncio.timeout(60):
                        await asyncio.gather(*(one(s) for s in streams))
                    assert all(s.failure is not None for s in streams)
                    async with httpx.AsyncClient(base_url=server.url) as other:
                        # The deletes run in the background: the count goes down soon.
                        give_up = time.monotonic() + 60
                        while (left := open_streams((await other.get("/metrics")).text)) and (
                                time.monotonic() < give_up):
                            await asyncio.sleep(0.05)
                    assert left == 0, f"{left:g} streams given up are still open"

            asyncio.run(burst())
            assert not open_streams(httpx.get(f"{server.url}/metrics", timeout=10).text)
    finally:
        chat.reset()


# -- reasons in words ----------------------------------------------------------------------


async def test_a_sidecar_shutting_down_mid_stream_is_said_in_words() -> None:
    """The sidecar drains (a SIGTERM): it closes the open streams and refuses new ones. The
    next chunk POST of a stream is answered 409 and the next open 503; each stream falls
    back with a reason that says the sidecar is shutting down, not "HTTP 409 conflict"."""
    fake = FakeTranslator(gate=asyncio.Event())  # the first sentence waits: drain waits
    async with app_with(fake) as running, ThinktransClient(
            "http://127.0.0.1", transport=httpx.ASGITransport(app=running.app),
            timeout_s=2.0) as client:
        stream = client.stream("t:drain", target="de")
        got: list[StreamItem] = []

        async def read() -> None:
            async for item in stream.results():
                got.append(item)

        reader = asyncio.create_task(read())
        await stream.push("First sentence. ")
        await asyncio.wait_for(fake.started.wait(), 10)
        drain = asyncio.create_task(running.runtime.streams.drain(30.0))
        await until(lambda: running.runtime.streams.draining)
        await asyncio.sleep(0.05)  # the drain closes the open streams first
        await stream.push("Then more.")
        await until(lambda: stream.failure is not None)
        later = client.stream("t:after", target="de")
        after = await run_stream(later, ["Hello."])
        fake.gate.set()  # type: ignore[union-attr]
        await stream.close()
        await asyncio.wait_for(reader, 10)
        await drain
    # The sidecar's 409 says the drain closed the stream (not another client): the reason
    # says just that.
    assert stream.failure is not None and stream.failure.startswith(
        "the sidecar is shutting down (HTTP 409 conflict)")
    assert "HTTP 409 conflict" in stream.failure  # for whoever looks further
    assert got and segments(got)[-1].error == f"sidecar: {stream.failure}"
    assert later.failure is not None and later.failure.startswith(
        "the sidecar is shutting down (HTTP 503 overloaded), and it asks to retry after 5 s")
    assert segments(after)[0].error == f"sidecar: {later.failure}"


async def test_a_sidecar_reached_by_a_name_it_does_not_allow_is_said_in_words() -> None:
    """The client's URL names the sidecar by a name it does not answer to (421): the
    stream falls back to the originals, and the reason says which setting takes the name.
    With the name allowed, the same stream is served."""
    pieces = ["Hello there. ", "Bye."]
    for allowed in ("", "thinktrans"):
        async with app_with(default_locale="de", allowed_hosts=allowed) as running:
            async with ThinktransClient(
                    "http://thinktrans", transport=httpx.ASGITransport(app=running.app),
                    timeout_s=2.0) as client:
                stream = client.stream("t:host", target="de")
                got = await run_stream(stream, pieces)
        assert "".join(s.original for s in segments(got)) == "".join(pieces)
        if allowed:
            assert stream.failure is None
            assert all(s.error is None for s in segments(got))
            continue
        assert stream.failure is not None and stream.failure.startswith(
            "the sidecar does not answer to the host name in its URL; add the name to the "
            "sidecar's THINKTRANS_ALLOWED_HOSTS")
        assert "(HTTP 421 host-not-allowed)" in stream.failure
        assert all(s.error == f"sidecar: {stream.failure}" for s in segments(got))


# -- close_wait_s: how long a closed stream waits for the rest -----------------------------


async def test_close_wait_gives_out_the_rest_as_it_is(chat: FakeChat) -> None:
    """A translator slower than the reader can wait (5 s; the sidecar's deadline is 10 s):
    once the stream is closed, ``close_wait_s`` bounds the wait, and the text comes out
    as it was pushed, status ``deadline``; that is no outage (the sidecar is not skipped)."""
    chat.reset()
    chat.mode, chat.slow_s = "timeout", 5.0
    try:
        with llm_server(chat, THINKTRANS_DEADLINE_MS="10000") as server:
            async with ThinktransClient(server.url) as client:
                stream = client.stream("t:closewait", target="de", close_wait_s=0.3)
                items = await run_stream(stream, ["Let me look at ", "the failing test."],
                                         updates=False)
                assert client.available
                await stream.aclose()
    finally:
        chat.reset()
    segs = assert_complete(items, "Let me look at the failing test.")
    assert [s.status for s in segs] == ["deadline"]
    assert segs[0].error is not None and "close_wait_s" in segs[0].error
    # close_wait_s gave it out: the translator's 5 s or the sidecar's 10 s would have given
    # it another status or another error.


def test_close_wait_must_be_a_duration() -> None:
    client = ThinktransClient("http://127.0.0.1:9")
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="close_wait_s"):
            client.stream("t:x", close_wait_s=bad)
