"""What the remote backends read of an answer: never more than their bound.

Against ``EndlessServer`` on 127.0.0.1, whose answers never end: an LLM endpoint's error, its
``/models`` list, one line of a streamed answer, a whole answer, and the pool's answers and
``/v1/info``. Each ends with an error that names the setting, and the server counts what it
sent before the client closed the connection: the bound, and what the sockets hold, at most.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from models.base import Job
from models.errors import BackendError, BackendUnavailable, BadOutput
from models.llm import LLMTranslator
from models.pooled import PoolTranslator
from models.registry import build_backend
from models.remote import AnswerBound
from service.settings import load_settings
from tests.configs import pool_config
from tests.conftest import make_settings, start_app
from tests.fakes_endless import CAP, IN_FLIGHT, Answer, EndlessServer

BOUND = 65_536  # the smallest either setting takes
GUARD_S = 120  # a regression fails at this, rather than hanging
CHAT = "/v1/chat/completions"
LLM_SETTING = "THINKTRANS_LLM_MAX_RESPONSE_BYTES"
POOL_SETTING = "THINKTRANS_POOL_MAX_RESPONSE_BYTES"


def _event(delta: dict[str, Any]) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk",
             "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


# A first piece of content as it should come, then a line that never ends.
ENDLESS_LINE = Answer(200, _event({"role": "assistant", "content": '{"translations": '})
                      + b'data: {"choices": [{"index": 0, "delta": {"content": "',
                      content_type="text/event-stream", endless=True)
LISTED = Answer(200, json.dumps({"object": "list", "data": [{"id": "m"}]}).encode())


async def _read_no_further(server: EndlessServer) -> None:
    """The server's endless answers ended with the client gone, before the cap, having
    sent the bound and what the sockets between them hold, at most."""
    sent = await server.finished(GUARD_S)
    assert sent < CAP, "the client read the endless answer to its end"
    assert sent <= BOUND + IN_FLIGHT, f"{sent} bytes sent for a bound of {BOUND}"


class Chunks(httpx.AsyncByteStream):
    """A body that comes in these chunks."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def _lines(bound: int, *chunks: bytes) -> list[str]:
    response = httpx.Response(200, stream=Chunks(*chunks))
    return [line async for line in AnswerBound(bound, "THE_SETTING").lines(response, "a line")]


async def test_lines_end_at_any_line_end_wherever_the_chunks_are_cut() -> None:
    assert await _lines(8, b"data: a\r", b"\ndata: b\rdata: c\n", b"12345", b"678\n\n",
                        b"\r\nlast") == ["data: a", "data: b", "data: c", "12345678", "", "",
                                          "last"]
    assert await _lines(8, "é€\n".encode()[:3], "é€\n".encode()[3:]) == ["é€"]


@pytest.mark.parametrize("chunks", [(b"123456789\n",), (b"1234", b"56789"), (b"ok\n123456789",)])
async def test_a_line_past_the_bound_fails_whatever_came_before(chunks: tuple[bytes, ...]
                                                                ) -> None:
    with pytest.raises(BadOutput) as caught:
        await _lines(8, *chunks)
    assert caught.value.detail == "a line exceeded 8 bytes (THE_SETTING); read no further"


@pytest.fixture
async def llm() -> AsyncIterator[list[LLMTranslator]]:
    made: list[LLMTranslator] = []
    yield made
    for backend in made:
        await backend.aclose()


def _llm(made: list[LLMTranslator], server: EndlessServer, **overrides: Any) -> LLMTranslator:
    settings = load_settings(backend="llm", llm_base_url=f"{server.origin}/v1", llm_model="m",
                             llm_timeout_s=GUARD_S, llm_max_response_bytes=BOUND,
                             **overrides)  # fmt: skip
    backend = build_backend("llm", settings)
    assert isinstance(backend, LLMTranslator)
    backend.recheck_after_s = backend.outage_recheck_s = 3600.0  # no probe meanwhile
    made.append(backend)
    return backend


@pytest.mark.parametrize(("status", "error", "reason"), [
    (500, BackendUnavailable, "is failing (HTTP 500)"),
    (400, BackendError, "refused the request (HTTP 400)"),
])  # fmt: skip
async def test_an_endless_error_answer_is_read_for_its_first_bytes_only(
        llm: list[LLMTranslator], status: int, error: type[BackendError], reason: str) -> None:
    async with EndlessServer({
        CHAT: Answer(status, b'{"error": {"message": "', endless=True),
        "/v1/models": LISTED,
    }) as server:
        backend = _llm(llm, server)
        with pytest.raises(error, match=re.escape(reason)):
            async with asyncio.timeout(GUARD_S):
                await backend.translate(["Hello there."], source="en", target="de")
        await _read_no_further(server)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_endless_line_of_a_streamed_answer_fails_the_batch(
        llm: list[LLMTranslator], stream: bool) -> None:
    async with EndlessServer({CHAT: ENDLESS_LINE, "/v1/models": LISTED}) as server:
        backend = _llm(llm, server, llm_stream=stream)  # streamed whether asked or not
        with pytest.raises(BadOutput) as caught:
            async with asyncio.timeout(GUARD_S):
                await backend.translate(["Hello there."], source="en", target="de")
        assert caught.value.detail == (
            f"a line of the LLM endpoint's streamed answer exceeded {BOUND} bytes "
            f"({LLM_SETTING}); read no further")
        await _read_no_further(server)
        assert server.asked.count(CHAT) == 1  # not asked again: the same would come
        assert backend.ready  # one answer's trouble: the chain serves the batch


async def test_an_endless_answer_fails_the_batch(llm: list[LLMTranslator]) -> None:
    async with EndlessServer({
        CHAT: Answer(200, b'{"choices": [{"message": {"content": "', endless=True),
        "/v1/models": LISTED,
    }) as server:
        backend = _llm(llm, server)
        with pytest.raises(BadOutput, match=rf"answer exceeded {BOUND} bytes \({LLM_SETTING}\)"):
            async with asyncio.timeout(GUARD_S):
                await backend.translate(["Hello there."], source="en", target="de")
        await _read_no_further(server)


async def test_an_endless_model_list_is_left_unread(
        llm: list[LLMTranslator], caplog: pytest.LogCaptureFixture) -> None:
    async with EndlessServer({
        "/v1/models": Answer(200, b'{"object": "list", "data": [{"id": "', endless=True),
    }) as server:
        backend = _llm(llm, server)
        with caplog.at_level(logging.WARNING, logger="models.llm"):
            await backend.start()
            assert await backend.wait_ready(GUARD_S)  # the chat requests tell, not the list
        await _read_no_further(server)
        assert f"/models list exceeded {BOUND} bytes ({LLM_SETTING})" in caplog.text
        [entry] = backend.catalog()
        assert entry["model"] == "m" and "does not list its models" in str(entry["notes"])


async def test_a_segment_whose_answer_was_cut_goes_down_the_chain() -> None:
    async with EndlessServer({CHAT: ENDLESS_LINE, "/v1/models": LISTED}) as server:
        settings = make_settings(
            backend="llm,passthrough", llm_base_url=f"{server.origin}/v1", llm_model="m",
            llm_max_response_bytes=BOUND, check_output_language=False,
            deadline_ms=GUARD_S * 1000 / 2)  # fmt: skip
        async for app in start_app(settings):
            async with asyncio.timeout(GUARD_S):
                r = await app.client.post("/v1/translate",
                                          json={"target": "de", "texts": ["Hello there."]})
            assert r.status_code == 200
            [seg] = r.json()["results"][0]["segments"]
            assert (seg["backend"], seg["text"]) == ("passthrough", "Hello there.")
        await _read_no_further(server)


# -- the pool ----------------------------------------------------------------------------------

INFO = json.dumps({
    "ready": True, "reason": None, "max_batch_size": 8, "max_text_chars": 500,
    "max_call_chars": 4000, "max_call_bytes": 65536, "engine": "ctranslate2",
    "default_model": "nllb", "models": [], "languages": ["de"], "identity": "abc",
    "checked_output": True}).encode()


@pytest.fixture
async def pool() -> AsyncIterator[list[PoolTranslator]]:
    made: list[PoolTranslator] = []
    yield made
    for backend in made:
        await backend.aclose()


async def _pool(made: list[PoolTranslator], server: EndlessServer) -> PoolTranslator:
    backend = PoolTranslator(pool_config(pool_url=server.origin,
                                         pool_max_response_bytes=BOUND))
    backend.recheck_after_s = backend.outage_recheck_s = 3600.0  # no probe meanwhile
    made.append(backend)
    await backend.start()
    await backend.wait_ready(GUARD_S)
    return backend


async def test_an_endless_pool_answer_fails_the_call(pool: list[PoolTranslator]) -> None:
    async with EndlessServer({
        "/v1/info": Answer(200, INFO),
        "/v1/batch": Answer(200, b'{"translations": ["', endless=True),
    }) as server:
        backend = await _pool(pool, server)
        assert backend.ready
        with pytest.raises(BadOutput) as caught:
            async with asyncio.timeout(GUARD_S):
                await backend.run(Job(["Hello there."], "en", "de"))
        assert caught.value.detail == (
            f"the pool's answer exceeded {BOUND} bytes ({POOL_SETTING}); read no further")
        await _read_no_further(server)


async def test_an_endless_pool_error_is_read_for_its_first_bytes_only(
        pool: list[PoolTranslator]) -> None:
    async with EndlessServer({
        "/v1/info": Answer(200, INFO),
        "/v1/batch": Answer(500, b'{"detail": "', endless=True),
    }) as server:
        backend = await _pool(pool, server)
        with pytest.raises(BackendError, match="pool answered 500"):
            async with asyncio.timeout(GUARD_S):
                await backend.run(Job(["Hello there."], "en", "de"))
        await _read_no_further(server)


async def test_an_endless_pool_info_keeps_the_backend_down(pool: list[PoolTranslator]) -> None:
    async with EndlessServer({
        "/v1/info": Answer(200, b'{"ready": true, "models": ["', endless=True),
    }) as server:
        backend = await _pool(pool, server)
        await _read_no_further(server)
        assert not backend.ready
        assert backend.reason == (f"pool: the pool's /v1/info exceeded {BOUND} bytes "
                                  f"({POOL_SETTING}); read no further")
