"""Per-session choices through the app: the translation cache, the hide policy, a model
per request or stream with the advisory catalog, and the languages a client may offer."""

from __future__ import annotations

import asyncio
from collections import deque
from pathlib import Path
from typing import Any

from models.base import Capabilities
from models.errors import BackendUnavailable
from models.passthrough import PassthroughTranslator
from tests.conftest import (
    app_with,
    check_stream,
    deltas,
    post_chunks,
    read_until,
    segments,
)
from tests.fakes import FakeTranslator, work

ENGLISH = "Let me add the three legs of the hike together. "
CHINESE = "所以总时间是五个小时。"
MIXED = f"{ENGLISH}{CHINESE}Then I check the answer once more."


def _texts(fake: FakeTranslator) -> list[str]:
    return [text for call in fake.calls for text in call.texts]


async def _one(app: Any, text: str, **body: Any) -> list[dict[str, Any]]:
    r = await app.client.post("/v1/translate", json={"target": "de", "texts": [text], **body})
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["results"][0]["segments"]
    return found


async def _stream(app: Any, sid: str, text: str, **body: Any) -> list[dict[str, Any]]:
    r = await app.client.post("/v1/streams", json={"stream_id": sid, **body})
    assert r.status_code == 201, r.text
    assert (await post_chunks(app.client, sid, deltas(text))).status_code == 200
    assert (await app.client.post(f"/v1/streams/{sid}/close")).status_code == 200
    events = await read_until(app.client, sid)
    check_stream(events, text)
    return segments(events)


# -- the cache --------------------------------------------------------------------------------


async def test_a_sentence_seen_before_comes_from_the_cache_without_the_backend() -> None:
    fake = FakeTranslator()
    async with app_with(fake) as app:
        [first] = await _one(app, ENGLISH)
        [again] = await _one(app, ENGLISH)
        streamed = await _stream(app, "s1", ENGLISH, target="de")
        assert (first["status"], first.get("cached")) == ("translated", None)
        assert again["cached"] is True and again["text"] == first["text"]
        assert [s.get("cached") for s in streamed] == [True]
        assert _texts(fake) == [ENGLISH.strip()]  # the backend saw it once
        assert await app.metric("thinktrans_cache_hits_total") == 2
        assert await app.metric("thinktrans_cache_misses_total") == 1
        cache = (await app.client.get("/v1/backends")).json()["cache"]
        assert cache["entries"] == 1 and 0 < cache["bytes"] <= cache["max_bytes"]


async def test_identical_segments_in_flight_are_translated_once() -> None:
    fake = FakeTranslator(gate=asyncio.Event())
    async with app_with(fake, max_wait_ms=0) as app:
        both = asyncio.gather(_one(app, ENGLISH), _one(app, ENGLISH))
        await fake.started.wait()
        await asyncio.sleep(0.05)
        fake.gate.set()  # type: ignore[union-attr]
        a, b = await both
        assert a[0]["text"] == b[0]["text"] == f"<de>{ENGLISH.strip()} "
        assert _texts(fake) == [ENGLISH.strip()]


async def test_failures_and_wrong_language_answers_are_not_cached() -> None:
    fake = FakeTranslator(answers=deque([BackendUnavailable("down")]))
    async with app_with(fake, backend="fake,passthrough") as app:
        [failed] = await _one(app, ENGLISH)
        assert failed["backend"] == "passthrough"
        [second] = await _one(app, ENGLISH)
        assert second["backend"] == "fake" and not second.get("cached")
        assert len(fake.calls) == 2
    wrong = FakeTranslator(answers=deque([lambda texts, s, t: list(texts)] * 2))
    wrong.capabilities = Capabilities()  # English handed back for German: bad output
    async with app_with(wrong, backend="fake,passthrough") as app:
        for _ in range(2):
            [seg] = await _one(app, ENGLISH)
            assert seg["backend"] == "passthrough" and not seg.get("cached")
        assert len(wrong.calls) == 2


async def test_passthrough_and_a_disabled_cache_never_serve_from_the_cache() -> None:
    async with app_with(backend="passthrough") as app:
        for _ in range(2):
            [seg] = await _one(app, ENGLISH)
            assert seg["backend"] == "passthrough" and "cached" not in seg
    fake = FakeTranslator()
    async with app_with(fake, cache_mb=0) as app:
        await _one(app, ENGLISH)
        [seg] = await _one(app, ENGLISH)
        assert "cached" not in seg and len(fake.calls) == 2
        assert (await app.client.get("/v1/backends")).json()["cache"]["enabled"] is False


async def test_the_persistent_cache_serves_hits_after_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "cache" / "thinktrans.sqlite")
    async with app_with(FakeTranslator(), cache_path=path) as app:
        await _one(app, ENGLISH)
    fake = FakeTranslator()
    async with app_with(fake, cache_path=path) as app:
        [seg] = await _one(app, ENGLISH)
        assert seg["cached"] is True and seg["text"] == f"<de>{ENGLISH.strip()} "
        assert fake.calls == []


# -- the hide policy ----------------------------------------------------------------------------


async def test_hide_policy_hides_foreign_sentences_and_sends_nothing() -> None:
    fake = FakeTranslator()
    async with app_with(fake) as app:
        streamed = await _stream(app, "h1", MIXED, target="zh-CN", policy="hide")
        statuses = [(s["status"], s["text"]) for s in streamed]
        assert ("same_language", CHINESE) in statuses
        hidden = [s for s in streamed if s["status"] == "hidden"]
        assert len(hidden) == 2 and all(s["text"] == "" for s in hidden)
        oneshot = await _one(app, MIXED, target="zh-CN", policy="hide")
        assert [s["status"] for s in oneshot] == [s["status"] for s in streamed]
        assert fake.calls == []
        r = await app.client.post("/v1/translate",
                                  json={"target": "de", "policy": "show", "texts": ["x"]})
        assert r.status_code == 422 and "policy" in r.text


async def test_the_server_policy_is_the_default_and_a_request_overrides_it() -> None:
    fake = FakeTranslator()
    async with app_with(fake, policy="hide") as app:
        assert [s["status"] for s in await _one(app, ENGLISH)] == ["hidden"]
        assert [s["status"] for s in await _one(app, ENGLISH, policy="translate")] == [
            "translated"]
        r = await app.client.post("/v1/streams", json={"stream_id": "p", "target": "de"})
        assert r.json()["policy"] == "hide"


# -- a model per stream ---------------------------------------------------------------------------


async def test_two_streams_with_different_models_each_get_their_own() -> None:
    fake = FakeTranslator(models=("m1", "m2"))
    async with app_with(fake) as app:
        one, two = await asyncio.gather(
            _stream(app, "a", ENGLISH, target="de", model="m1"),
            _stream(app, "b", ENGLISH, target="de", model="m2"))
        assert (one[0]["model"], one[0]["text"]) == ("m1", f"<de|m1>{ENGLISH.strip()} ")
        assert (two[0]["model"], two[0]["text"]) == ("m2", f"<de|m2>{ENGLISH.strip()} ")
        assert sorted(call.model or "" for call in fake.calls) == ["m1", "m2"]
        # No model named: the backend's own choice, m1, whose translation is cached.
        [default] = await _one(app, ENGLISH)
        assert (default["model"], default["cached"]) == ("m1", True)
        r = await app.client.post("/v1/streams", json={"stream_id": "a", "target": "de",
                                                       "model": "m2"})
        assert r.status_code == 409 and "model" in r.json()["detail"]


async def test_an_unlisted_model_is_tried_and_fails_down_the_chain_with_a_reason() -> None:
    fake = FakeTranslator(models=("m1",))
    backends = {"fake": fake, "passthrough": PassthroughTranslator()}
    async with app_with(backends=backends, backend="fake") as app:
        [seg] = await _one(app, ENGLISH, model="nope")
        assert seg["status"] == "error" and "fake has no model 'nope'" in seg["error"]
        [seg] = await _one(app, ENGLISH, model="nope", backend="fake,passthrough")
        assert (seg["status"], seg["backend"]) == ("translated", "passthrough")
        assert fake.calls == []


async def test_a_failing_named_model_does_not_open_the_breaker_for_everyone() -> None:
    fake = FakeTranslator(models=("m1", "bad"),
                          answers=deque([BackendUnavailable("no such model")] * 5))
    async with app_with(fake, breaker_failures=2, max_wait_ms=0) as app:
        for i in range(4):
            [seg] = await _one(app, f"Step {i} adds one more leg to the hike.", model="bad")
            assert seg["status"] == "error"
        fake.answers.clear()
        [seg] = await _one(app, ENGLISH)
        assert (seg["status"], seg["backend"]) == ("translated", "fake")


async def test_models_languages_and_targets_are_listed() -> None:
    fake = FakeTranslator(models=("m1", "m2"))
    async with app_with(fake) as app:
        models = (await app.client.get("/v1/models")).json()["models"]
        assert [(m["backend"], m["model"], m["default"]) for m in models] == [
            ("fake", "m1", True), ("fake", "m2", False)]
        languages = (await app.client.get("/v1/languages")).json()
        assert languages["backends"]["fake"]["models"] == {"m1": None, "m2": None}
        assert languages["targets"] is None  # the fake takes any target
    async with app_with(FakeTranslator(), allowed_locales="de,zh-CN") as app:
        languages = (await app.client.get("/v1/languages")).json()
        assert languages["targets"] == ["de", "zh-CN"]


async def test_the_cache_keys_on_the_model() -> None:
    fake = FakeTranslator(models=("m1", "m2"))
    async with app_with(fake) as app:
        await _one(app, ENGLISH, model="m1")
        [seg] = await _one(app, ENGLISH, model="m2")
        assert "cached" not in seg and seg["model"] == "m2"
        [seg] = await _one(app, ENGLISH, model="m1")
        assert seg["cached"] is True and seg["model"] == "m1"


# -- the dispatcher's sharing, directly ------------------------------------------------------------


async def test_joined_segments_hold_queue_places_until_their_work_is_done() -> None:
    fake = FakeTranslator(gate=asyncio.Event())
    async with app_with(fake, max_wait_ms=0) as app:
        dispatcher = app.runtime.dispatcher
        batcher = dispatcher.batchers["fake"]
        first = dispatcher.submit(work(ENGLISH, "en", "de"), ["fake"])
        await fake.started.wait()  # its batch runs: its item has left the queue
        joined = [dispatcher.submit(work(ENGLISH, "en", "de"), ["fake"]) for _ in range(3)]
        assert batcher.queue_size == 3  # each a waiting segment, though none is queued
        joined[0].cancel()
        await asyncio.sleep(0)
        assert batcher.queue_size == 2
        first.cancel()  # the one that queued it gives up: the others still wait on it
        await asyncio.sleep(0)
        fake.gate.set()  # type: ignore[union-attr]
        answers = await asyncio.gather(*joined[1:])
        assert {a.text for a in answers} == {f"<de>{ENGLISH}"}
        assert batcher.queue_size == 0 and len(fake.calls) == 1
        # Cached by a segment that joined, since the one that queued it was gone.
        again = await dispatcher.submit(work(ENGLISH, "en", "de"), ["fake"])
        assert again.cached and len(fake.calls) == 1


async def test_work_forced_onto_a_full_backend_is_cached_as_that_backends() -> None:
    a = FakeTranslator(name_="a", gate=asyncio.Event())
    b = FakeTranslator(name_="b", gate=asyncio.Event())
    backends = {"a": a, "b": b, "passthrough": PassthroughTranslator()}
    async with app_with(backends=backends, backend="a,b", max_queue_size=1,
                        max_wait_ms=0) as app:
        dispatcher = app.runtime.dispatcher
        for fake in (a, b):  # one batch stuck, one item queued: full
            dispatcher.batchers[fake.name].submit(work("busy one", "en", "de"))
            await fake.started.wait()
            dispatcher.batchers[fake.name].submit(work("busy two", "en", "de"))
        forced = dispatcher.submit(work(ENGLISH, "en", "de"), ["a", "b"])
        a.gate.set()  # type: ignore[union-attr]
        b.gate.set()  # type: ignore[union-attr]
        assert (await forced).backend == "a"
        by_b = await dispatcher.submit(work(ENGLISH, "en", "de"), ["b"])
        assert (by_b.backend, by_b.cached) == ("b", False)
        by_a = await dispatcher.submit(work(ENGLISH, "en", "de"), ["a"])
        assert (by_a.backend, by_a.cached) == ("a", True)
