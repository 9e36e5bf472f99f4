"""Chains through the whole app: fallback, the circuit breaker, the output-language check."""

from __future__ import annotations

import asyncio
import socket

from models.errors import BackendUnavailable
from models.passthrough import PassthroughTranslator
from tests.conftest import make_settings, start_app
from tests.fakes import FakeTranslator
from tests.fakes_remote import FakeChat, FakeDeepL

ENGLISH = "Let me check the total time of the whole hike once more."


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_unreachable_deepl_falls_through_to_passthrough() -> None:
    # The deadline is not what this tests: under a loaded machine, finding out that DeepL
    # is unreachable (the client's own retries) once ran past the default 3 s.
    settings = make_settings(backend="deepl,passthrough", deepl_api_key="k:fx",
                             deepl_server_url=closed_port_url(), default_locale="de",
                             deadline_ms=30000)
    async for app in start_app(settings):
        for _ in range(2):  # the first finds out, the second skips deepl at once
            r = await app.client.post("/v1/translate", json={"texts": [ENGLISH]})
            [seg] = r.json()["results"][0]["segments"]
            assert (seg["status"], seg["backend"]) == ("translated", "passthrough")
        backends = {b["name"]: b for b in (await app.client.get("/v1/backends")).json()[
            "backends"]}
        assert backends["deepl"]["ready"] is False
        assert backends["deepl"]["reason"]


async def test_sixty_texts_reach_deepl_in_requests_of_fifty(deepl_server: FakeDeepL) -> None:
    deepl_server.reset()
    settings = make_settings(backend="deepl", deepl_api_key="k", max_batch_size=64,
                             deepl_server_url=deepl_server.origin, check_output_language=False)
    texts = [f"Step {i}: we add the next leg of the hike to the total." for i in range(60)]
    async for app in start_app(settings):
        r = await app.client.post("/v1/translate", json={"target": "zh-CN", "texts": texts})
        results = r.json()["results"]
    statuses = {s["status"] for res in results for s in res["segments"]}
    backends = {s["backend"] for res in results for s in res["segments"]}
    assert statuses == {"translated"} and backends == {"deepl"}
    sizes = [len(req.json["text"]) for req in deepl_server.translate_requests]
    assert sorted(sizes) == [10, 50]
    assert all(req.json["target_lang"] == "ZH-HANS" for req in deepl_server.translate_requests)


async def test_llm_garbage_leaves_the_original_with_status_error(chat_server: FakeChat) -> None:
    chat_server.reset()
    chat_server.mode = "malformed"
    settings = make_settings(backend="llm", llm_base_url=f"{chat_server.origin}/v1",
                             llm_model="m")
    async for app in start_app(settings):
        r = await app.client.post("/v1/translate", json={"target": "de", "texts": [ENGLISH]})
    [seg] = r.json()["results"][0]["segments"]
    assert seg["status"] == "error" and seg["text"] == ENGLISH and seg["error"]
    for req in chat_server.chat_requests:
        system = [m for m in req.json["messages"] if m["role"] == "system"]
        assert all(ENGLISH not in m["content"] for m in system)


async def test_an_answer_in_the_wrong_language_goes_down_the_chain(chat_server: FakeChat
                                                                   ) -> None:
    chat_server.reset()  # "good" answers echo the English text: not German
    base = {"llm_base_url": f"{chat_server.origin}/v1", "llm_model": "m"}
    async for app in start_app(make_settings(backend="llm,passthrough", **base)):
        r = await app.client.post("/v1/translate", json={"target": "de", "texts": [ENGLISH]})
        [seg] = r.json()["results"][0]["segments"]
        assert seg["backend"] == "passthrough"
    async for app in start_app(make_settings(backend="llm,passthrough",
                                             check_output_language=False, **base)):
        r = await app.client.post("/v1/translate", json={"target": "de", "texts": [ENGLISH]})
        [seg] = r.json()["results"][0]["segments"]
        assert seg["backend"] == "llm"


async def test_a_failing_backend_is_skipped_then_tried_again() -> None:
    failing = FakeTranslator(name_="fake")
    failing.answers.extend(BackendUnavailable("down") for _ in range(2))
    backends = {"fake": failing, "passthrough": PassthroughTranslator()}
    settings = make_settings(backend="fake,passthrough", breaker_failures=2,
                             breaker_cooloff_s=0.3, default_locale="de", max_wait_ms=0)

    async def served_by() -> str:
        r = await app.client.post("/v1/translate", json={"texts": [ENGLISH]})
        return str(r.json()["results"][0]["segments"][0]["backend"])

    async for app in start_app(settings, backends):
        assert [await served_by(), await served_by()] == ["passthrough", "passthrough"]
        assert len(failing.calls) == 2
        assert await served_by() == "passthrough"
        assert len(failing.calls) == 2  # skipped: the breaker is open
        listed = {b["name"]: b for b in (await app.client.get("/v1/backends")).json()[
            "backends"]}
        assert "skipped" in listed["fake"]["reason"]
        await asyncio.sleep(0.35)
        assert await served_by() == "fake"  # tried again after the cool-off, and it works
        assert len(failing.calls) == 3
