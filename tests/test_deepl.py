"""The DeepL backend through the real client, against a DeepL v2 double on 127.0.0.1 and,
where the test asks ``api``, against DeepL's own mock server as well (tests/deepl_mock.py)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepl", reason="needs the deepl extra: pip install 'thinktrans[deepl]'")

import deepl

from models.deepl import (
    MAX_CONTEXT_CHARS,
    MAX_REQUEST_BYTES,
    MODEL_TYPES,
    NO_KEY_REASON,
    SOURCE_CODES,
    TARGET_CODES,
    DeepLTranslator,
    deepl_target_code,
)
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    RateLimited,
    UnsupportedLanguage,
)
from models.languages import table_key
from models.registry import build_backend
from service.settings import load_settings
from service.text.tags import canonicalize
from tests.configs import deepl_config
from tests.conftest import app_with, check_stream, deltas, post_chunks, read_until, segments
from tests.deepl_mock import DeepLMock
from tests.fakes_remote import FakeDeepL, closed_port_url

Make = Callable[..., DeepLTranslator]


@pytest.fixture
def fake(deepl_server: FakeDeepL) -> FakeDeepL:
    # A request an earlier test gave up on (slow mode) may still be in the server: let it
    # finish first, so that it is not counted as this test's.
    give_up = time.monotonic() + 10
    while deepl_server.in_flight and time.monotonic() < give_up:
        time.sleep(0.02)
    deepl_server.reset()
    return deepl_server


@pytest.fixture
async def make(fake: FakeDeepL, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Make]:
    """Build backends from settings, through the registry; no client retries unless asked."""
    made: list[DeepLTranslator] = []

    def _make(*, retries: int = 0, **overrides: Any) -> DeepLTranslator:
        fields: dict[str, Any] = {
            "backend": "deepl",
            "deepl_api_key": "k",
            "deepl_server_url": fake.origin,
            "backend_timeout_s": 1.0,
            **overrides,
        }
        backend = build_backend("deepl", load_settings(**fields))
        assert isinstance(backend, DeepLTranslator)
        backend.recheck_after_s = backend.outage_recheck_s = 0.1
        # The client's retry count is a module global; monkeypatch restores it.
        monkeypatch.setattr(deepl.http_client, "max_network_retries", retries)
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        await backend.aclose()


@dataclass
class Api:
    """The DeepL API a test runs on: the double (``double``), or DeepL's mock (``mock``),
    whose translations are fixed phrases (tests check shapes and statuses on it) and whose
    behaviour a session sets (``headers``, sent by every client the backend makes)."""

    double: FakeDeepL | None
    mock: DeepLMock | None
    key: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        if self.double is not None:
            return self.double.origin
        assert self.mock is not None
        return self.mock.url

    def spend_quota(self) -> None:
        """The account's characters are used up: translations get 456."""
        if self.double is not None:
            self.double.mode = "456"
            return
        assert self.mock is not None
        self.headers = self.mock.session(**{"init-character-limit": 1})
        assert self.mock.post("/v2/translate", self.key, self.headers, text=["x"],
                              target_lang="DE").status_code == 200

    def refuse_key(self) -> None:
        """The key is not one DeepL knows: 403."""
        if self.double is not None:
            self.double.mode = "403"
        else:
            self.key = "invalid"  # the mock's refused key

    def answer(self, *statuses: int) -> None:
        """The next requests answer these statuses (429, 5xx), then as usual."""
        if self.double is not None:
            self.double.script.extend(str(status) for status in statuses)
            return
        assert self.mock is not None and len(set(statuses)) == 1
        kind = "429" if statuses[0] == 429 else "5xx"
        self.headers = self.mock.session(**{f"{kind}-count": len(statuses),
                                            **({"5xx-status": statuses[0]} if kind == "5xx"
                                               else {})})

    def check(self, out: list[str], texts: list[str], code: str) -> None:
        """``out`` answers ``texts`` in ``code``: the double's "[CODE] text", or, from the
        mock, a text for each (its fixed phrase), blanks kept as they are."""
        assert len(out) == len(texts) and all(isinstance(text, str) for text in out)
        if self.double is not None:
            assert out == [f"[{code}] {t}" if t.strip() else t for t in texts]
        else:
            assert all(bool(o.strip()) == bool(t.strip()) for o, t in zip(out, texts,
                                                                          strict=True))


@pytest.fixture(params=["double", "mock"])
def api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Api:
    if request.param == "double":
        return Api(request.getfixturevalue("fake"), None, "k")
    mock: DeepLMock = request.getfixturevalue("deepl_mock")
    chosen = Api(None, mock, mock.new_key())

    class SessionClient(deepl.DeepLClient):  # type: ignore[misc]
        """The backend's clients, with the test's session headers on every request."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.headers.update(chosen.headers)

    monkeypatch.setattr(deepl, "DeepLClient", SessionClient)
    return chosen


@pytest.fixture
async def make_on(api: Api, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Make]:
    """``make`` on ``api``: its URL and key, read when the backend is made."""
    made: list[DeepLTranslator] = []

    def _make(*, retries: int = 0, **overrides: Any) -> DeepLTranslator:
        fields: dict[str, Any] = {"backend": "deepl", "deepl_api_key": api.key,
                                  "deepl_server_url": api.origin, "backend_timeout_s": 10.0,
                                  **overrides}
        backend = build_backend("deepl", load_settings(**fields))
        assert isinstance(backend, DeepLTranslator)
        backend.recheck_after_s = backend.outage_recheck_s = 30  # no probe unless asked
        monkeypatch.setattr(deepl.http_client, "max_network_retries", retries)
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        await backend.aclose()


async def test_registry_builds_it() -> None:
    backend = build_backend("deepl", load_settings(backend="deepl", deepl_api_key="s3cret"))
    try:
        assert isinstance(backend, DeepLTranslator)
        assert backend.name == "deepl" and backend.capabilities.billed
        assert backend.max_concurrency == 4  # deepl_threads
        assert backend.config.api_key == "s3cret" and "s3cret" not in repr(backend.config)
        assert backend.capabilities.context is False and backend.info()["context"] is False
    finally:
        await backend.aclose()


# -- the language table ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "code"),
    [("en", "EN-US"), ("en-GB", "EN-GB"), ("en-US", "EN-US"), ("pt-BR", "PT-BR"),
     ("pt-PT", "PT-PT"), ("pt", "PT-BR"), ("zh-CN", "ZH-HANS"), ("zh", "ZH-HANS"),
     ("zh-Hant-TW", "ZH-HANT"), ("zh-TW", "ZH-HANT"), ("zh-HK", "ZH-HANT"), ("de-AT", "DE"),
     ("hi", None)],
)
def test_deepl_codes(tag: str, code: str | None) -> None:
    assert deepl_target_code(tag, english_variant="EN-US") == code


def test_deepl_english_variant() -> None:
    assert deepl_target_code("en", english_variant="EN-GB") == "EN-GB"
    assert deepl_target_code("en-AU", english_variant="EN-US") == "EN-GB"
    assert deepl_target_code("en-CA", english_variant="EN-US") == "EN-US"


def test_table_is_consistent() -> None:
    assert set(SOURCE_CODES) == set(TARGET_CODES)
    assert len(TARGET_CODES) == 31
    for key in TARGET_CODES:
        assert canonicalize(key) == key and table_key(key) == key


async def test_translates_in_batches_of_50(api: Api, make_on: Make) -> None:
    backend = make_on()
    texts = [f"Sentence number {i}." for i in range(60)]
    out = await backend.translate(texts, source="en", target="de")
    api.check(out, texts, "DE")
    assert backend.info()["requests"] == 2
    if api.double is not None:
        sent = [r.json["text"] for r in api.double.translate_requests]
        assert [len(s) for s in sent] == [50, 10]
        assert sent[0] + sent[1] == texts
        assert api.double.translate_requests[0].headers["authorization"] == "DeepL-Auth-Key k"


async def test_splits_requests_over_128_kib(api: Api, make_on: Make) -> None:
    """DeepL documents 128 KiB a request; its mock server refuses JSON past 100 KB (413),
    and the request then goes again in halves."""
    backend = make_on()
    # 9,000 CJK characters are 27 KB of UTF-8 but 54 KB in the client's ASCII-escaped
    # JSON: three of them only fit DeepL's limit in two requests.
    texts = [chr(0x4E00 + i) * 9_000 for i in range(3)]
    out = await backend.translate(texts, source="zh-CN", target="en")
    api.check(out, texts, "EN-US")
    if api.double is not None:
        requests = api.double.translate_requests
        assert len(requests) >= 2
        assert all(len(r.body) <= MAX_REQUEST_BYTES for r in requests)
        assert [t for r in requests for t in r.json["text"]] == texts
    else:  # two, the first refused (413) and sent again as two
        assert backend.info()["requests"] == 4


@pytest.mark.parametrize(
    ("target", "code"),
    [
        ("zh-CN", "ZH-HANS"),
        ("zh", "ZH-HANS"),
        ("en", "EN-US"),
        ("en-GB", "EN-GB"),
        ("pt-BR", "PT-BR"),
        ("pt-PT", "PT-PT"),
        ("zh-Hant-TW", "ZH-HANT"),
        ("zh-HK", "ZH-HANT"),
    ],
)
async def test_target_codes(api: Api, make_on: Make, target: str, code: str) -> None:
    backend = make_on()
    api.check(await backend.translate(["Hallo."], source="de", target=target), ["Hallo."], code)
    if api.double is not None:
        assert api.double.translate_requests[0].json["target_lang"] == code


async def test_every_code_of_the_table_is_one_deepl_takes(api: Api, make_on: Make) -> None:
    """Each target and source code the backend sends is valid: the mock refuses (400) a
    code DeepL does not list."""
    backend = make_on()
    for target in TARGET_CODES:
        api.check(await backend.translate(["Hello."], source=None, target=target),
                  ["Hello."], deepl_target_code(target, english_variant="EN-US") or "")
    for source in SOURCE_CODES:
        target = "en" if source == "de" else "de"
        out = await backend.translate(["Hello."], source=source, target=target)
        api.check(out, ["Hello."], "EN-US" if target == "en" else "DE")


async def test_english_variant_setting(fake: FakeDeepL, make: Make) -> None:
    backend = make(deepl_english_variant="EN-GB")
    assert await backend.translate(["Hallo."], source=None, target="en") == ["[EN-GB] Hallo."]
    assert await backend.translate(["Hallo."], source=None, target="en-US") == ["[EN-US] Hallo."]


async def test_source_sent_only_when_given(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    await backend.translate(["Hallo."], source="de", target="fr")
    await backend.translate(["Hallo."], source=None, target="fr")
    await backend.translate(["Habari."], source="sw", target="fr")  # not a DeepL source
    bodies = [r.json for r in fake.translate_requests]
    assert bodies[0]["source_lang"] == "DE"
    assert "source_lang" not in bodies[1]
    assert "source_lang" not in bodies[2]


async def test_model_type_and_formality(fake: FakeDeepL, make: Make) -> None:
    await make().translate(["Hi."], source=None, target="de")
    await make(deepl_formality="prefer_less", deepl_model_type="quality_optimized").translate(
        ["Hi."], source=None, target="de"
    )
    first, second = (r.json for r in fake.translate_requests)
    assert first["model_type"] == "latency_optimized" and "formality" not in first
    assert second["model_type"] == "quality_optimized" and second["formality"] == "prefer_less"


async def test_strict_formality_dropped_where_unsupported(api: Api, make_on: Make) -> None:
    """The mock refuses (400) a formality for a target that has none."""
    backend = make_on(deepl_formality="less")
    await backend.start()
    await backend.wait_ready()
    de = await backend.translate(["Hi."], source=None, target="de")  # DE supports formality
    ar = await backend.translate(["Hi."], source=None, target="ar")  # AR does not
    api.check(de, ["Hi."], "DE")
    api.check(ar, ["Hi."], "AR")
    if api.double is not None:
        sent_de, sent_ar = (r.json for r in api.double.translate_requests)
        assert sent_de["formality"] == "less"
        assert "formality" not in sent_ar


async def test_unsupported_target_sends_nothing(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    assert not backend.supports(None, "sw")
    assert not backend.supports(None, "not a tag")
    with pytest.raises(UnsupportedLanguage):
        await backend.translate(["Hello."], source="en", target="sw")
    assert fake.translate_requests == []


@pytest.mark.parametrize(("failure", "words"), [("quota", "quota"), ("key", "API key")])
async def test_auth_and_quota_mark_not_ready(
    api: Api, make_on: Make, failure: str, words: str
) -> None:
    api.spend_quota() if failure == "quota" else api.refuse_key()
    backend = make_on()  # no probe while we look
    with pytest.raises(BackendUnavailable, match=words):
        await backend.translate(["Hello."], source="en", target="de")
    assert backend.ready is False
    assert backend.reason is not None and words in backend.reason
    # Until the probe says otherwise, no request is spent on a known-bad key or quota.
    with pytest.raises(BackendUnavailable, match=words):
        await backend.translate(["Hello."], source="en", target="de")
    assert backend.info()["requests"] == 1


async def test_probe_brings_backend_back(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    fake.mode = "456"
    with pytest.raises(BackendUnavailable):
        await backend.translate(["Hello."], source="en", target="de")
    assert not backend.ready
    fake.mode = "ok"  # the quota was raised
    for _ in range(50):
        if backend.ready:
            break
        await asyncio.sleep(0.05)
    assert backend.ready and backend.reason is None
    assert await backend.translate(["Hello."], source="en", target="de") == ["[DE] Hello."]


async def test_429_is_rate_limited_after_client_retry(api: Api, make_on: Make) -> None:
    api.answer(429, 429)
    backend = make_on(retries=1)
    with pytest.raises(RateLimited):
        await backend.translate(["Hello."], source="en", target="de")
    if api.double is not None:
        assert len(api.double.translate_requests) == 2  # the client's own retry ran
    assert backend.ready  # slowing down is not an outage


async def test_429_then_ok_is_served_by_client_retry(api: Api, make_on: Make) -> None:
    api.answer(429)
    backend = make_on(retries=1)
    api.check(await backend.translate(["Hello."], source="en", target="de"), ["Hello."], "DE")
    if api.double is not None:
        assert len(api.double.translate_requests) == 2


async def test_500_is_unavailable_until_it_answers(api: Api, make_on: Make) -> None:
    api.answer(500)
    backend = make_on()
    with pytest.raises(BackendUnavailable, match="HTTP 500"):
        await backend.translate(["Hello."], source="en", target="de")
    assert not backend.ready and backend.reason is not None
    # An outage does not fail fast: the next batch tries, and heals it.
    api.check(await backend.translate(["Hello."], source="en", target="de"), ["Hello."], "DE")
    assert backend.ready and backend.reason is None


async def test_outage_is_probed_quickly(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    backend.recheck_after_s = 30  # only the outage interval may bring it back this fast
    fake.mode = "500"
    with pytest.raises(BackendUnavailable):
        await backend.translate(["Hello."], source="en", target="de")
    assert not backend.ready
    fake.mode = "ok"
    for _ in range(50):
        if backend.ready:
            break
        await asyncio.sleep(0.05)
    assert backend.ready  # no translate call needed: the pipeline skips a not-ready backend
    assert "/v2/usage" in [r.path for r in fake.requests[1:]]


async def test_slow_server_times_out(fake: FakeDeepL, make: Make) -> None:
    backend = make(backend_timeout_s=0.5)
    # An answer far past the timeout: a backend that waited for it would get it (no
    # BackendTimeout), or be stopped by the guard.
    fake.mode, fake.slow_s = "slow", 600.0
    with pytest.raises(BackendTimeout):
        async with asyncio.timeout(120):
            await backend.translate(["Hello."], source="en", target="de")
    assert backend.ready


async def test_callers_wait_for_cuts_it_off(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    fake.mode = "slow"
    fake.slow_s = 600.0  # the worker thread stays stuck far longer than the guard below
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(backend.translate(["Hello."], source="en", target="de"), 0.2)
    await asyncio.wait_for(backend.aclose(), 120)  # does not wait for the stuck worker thread
    with pytest.raises(BackendUnavailable, match="closed"):
        await backend.translate(["Hello."], source="en", target="de")


async def test_unreachable_server(make: Make) -> None:
    backend = make(deepl_server_url=closed_port_url())
    with pytest.raises(BackendUnavailable, match="cannot reach DeepL"):
        await backend.translate(["Hello."], source="en", target="de")
    assert not backend.ready


async def test_billed_characters_counted(api: Api, make_on: Make) -> None:
    backend = make_on()
    texts = ["Hello there.", "  ", "How are you?", ""]
    out = await backend.translate(texts, source="en", target="de")
    api.check(out, texts, "DE")
    assert out[1::2] == ["  ", ""]  # blanks are not sent
    if api.double is not None:
        assert api.double.translate_requests[0].json["text"] == ["Hello there.", "How are you?"]
    info = backend.info()
    assert info["billed_characters"] == len("Hello there.") + len("How are you?")
    assert info["requests"] == 1
    assert info["server_url"] == api.origin


async def test_start_reads_usage_and_the_server_languages(api: Api, make_on: Make) -> None:
    """The start check reads the account's usage and the server's targets (their shapes as
    the server answers them), and the languages follow the server's list."""
    backend = make_on()
    await backend.start()
    assert await backend.wait_ready() is True
    usage = backend.info()["usage"]
    assert isinstance(usage, dict) and set(usage) == {"character_count", "character_limit"}
    assert all(isinstance(value, int) for value in usage.values())
    langs = backend.languages()
    assert {"de", "en-GB", "en-US", "pt-BR", "pt-PT", "zh-Hans", "zh-Hant", "he"} <= set(langs)
    api.check(await backend.translate(["Hi."], source=None, target="he"), ["Hi."], "HE")


async def test_no_key_is_not_ready(fake: FakeDeepL) -> None:
    backend = DeepLTranslator(deepl_config(deepl_server_url=fake.origin))
    before = len(fake.requests)
    try:
        await backend.start()
        assert backend.ready is False and backend.reason == NO_KEY_REASON
        with pytest.raises(BackendUnavailable, match="THINKTRANS_DEEPL_API_KEY"):
            await backend.translate(["Hello."], source="en", target="de")
        # A slow request of an earlier test may still land here; it carries that test's
        # key. Nothing without a key may have been sent.
        assert [r for r in fake.requests[before:] if "authorization" not in r.headers] == []
    finally:
        await backend.aclose()


async def test_start_does_not_block_and_refines_languages(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    assert "nb" in backend.languages() and "he" not in backend.languages()  # the table
    # Every request slow, not just the next one: a late request of an earlier test could
    # otherwise take the one slow answer meant for the start check.
    fake.mode = "slow"
    fake.slow_s = 0.3
    await backend.start()
    # start() returned while its check still waits on the slow server.
    assert backend._start_task is not None and not backend._start_task.done()
    # A timeout returns while the check still runs, and leaves it running.
    assert await backend.wait_ready(timeout_s=0.01) is True  # ready until proven otherwise
    assert backend._start_task is not None and not backend._start_task.done()
    assert await backend.wait_ready() is True
    fake.mode = "ok"
    assert backend.info()["usage"] == {"character_count": 1234, "character_limit": 500_000}
    langs = backend.languages()
    # The double lists HE (newer than the table) and lacks NB: the server's list wins.
    assert "he" in langs and backend.supports(None, "he")
    assert "nb" not in langs and not backend.supports(None, "nb")
    assert {"de", "en-GB", "en-US", "pt-BR", "pt-PT", "zh-Hans", "zh-Hant"} <= set(langs)
    assert await backend.translate(["Hi."], source=None, target="he") == ["[HE] Hi."]


@pytest.mark.parametrize(("failure", "words"), [("key", "API key"), ("quota", "quota")])
async def test_start_check_marks_not_ready(
    api: Api, make_on: Make, failure: str, words: str
) -> None:
    api.spend_quota() if failure == "quota" else api.refuse_key()
    backend = make_on()
    await backend.start()
    await backend.wait_ready()
    assert not backend.ready and backend.reason is not None and words in backend.reason


async def test_logs_never_hold_the_text(
    fake: FakeDeepL, make: Make, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make()
    secret = "The user's password is hunter2."
    with caplog.at_level(logging.DEBUG):
        await backend.translate([secret], source="en", target="de")
        fake.mode = "500"
        with pytest.raises(BackendUnavailable):
            await backend.translate([secret], source="en", target="de")
    assert caplog.records  # something was logged at all
    assert not any("hunter2" in record.getMessage() for record in caplog.records)


# -- context ---------------------------------------------------------------------------------


async def test_contexts_go_with_their_texts(api: Api, make_on: Make) -> None:
    backend = make_on(deepl_context=True)
    assert backend.capabilities.context and backend.info()["context"] is True
    texts = ["Then I check it.", "Hello.", "It works.", "Next, the loop.", "  ", "Done."]
    contexts = ["First the file. ", None, "First the file. ", "The tests pass. ",
                "The tests pass. ", "  "]
    out = await backend.translate(texts, source="en", target="de", contexts=contexts)
    api.check(out, texts, "DE")  # order kept
    # DeepL does not bill the context; neither does the count. One request per context.
    assert backend.info()["billed_characters"] == sum(len(t) for t in texts if t.strip())
    assert backend.info()["requests"] == 3
    if api.double is not None:
        # One request per distinct context, whatever order they arrived in; no blank is
        # sent, and a blank context is no context.
        assert sorted(api.double.received, key=str) == sorted(
            [
                ("First the file. ", ["Then I check it.", "It works."]),
                (None, ["Hello.", "Done."]),
                ("The tests pass. ", ["Next, the loop."]),
            ],
            key=str,
        )


async def test_context_off_sends_none(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    assert not backend.capabilities.context
    out = await backend.translate(["A b.", "C d."], source="en", target="de",
                                  contexts=["Before. ", "Other. "])
    assert out == ["[DE] A b.", "[DE] C d."]
    # One request, no context (a loaded machine may see the client retry it).
    assert fake.received and set(map(repr, fake.received)) == {repr((None, ["A b.", "C d."]))}


async def test_context_groups_run_concurrently(fake: FakeDeepL, make: Make) -> None:
    backend = make(deepl_context=True, backend_timeout_s=10.0)
    fake.mode = "slow"
    fake.slow_s = 0.5
    texts = ["One.", "Two.", "Three."]
    out = await backend.translate(texts, source="en", target="fr",
                                  contexts=["a. ", "b. ", "c. "])
    assert out == [f"[FR] {t}" for t in texts]
    # One request per context (a loaded machine may see the client retry one of them).
    assert {tuple(r.json["text"]) for r in fake.translate_requests} == {(t,) for t in texts}
    assert fake.max_in_flight >= 2


async def test_long_context_is_cut_and_counted_in_the_request_size(
    fake: FakeDeepL, make: Make
) -> None:
    backend = make(deepl_context=True)
    # Two texts of 60 KB (ASCII-escaped CJK) fit one request alone, not with 12 KB of context.
    texts = [chr(0x4E00 + i) * 10_000 for i in range(2)]
    context = "x" * 5_000 + chr(0x4E8C) * MAX_CONTEXT_CHARS
    out = await backend.translate(texts, source="zh-CN", target="en", contexts=[context] * 2)
    assert out == [f"[EN-US] {t}" for t in texts]
    assert [len(t) for _, t in fake.received] == [1, 1]
    assert {c for c, _ in fake.received} == {context[-MAX_CONTEXT_CHARS:]}
    assert all(len(r.body) <= MAX_REQUEST_BYTES for r in fake.translate_requests)


async def test_context_count_must_match(make: Make) -> None:
    backend = make(deepl_context=True)
    with pytest.raises(ValueError, match="1 contexts for 2 texts"):
        await backend.translate(["A.", "B."], source="en", target="de", contexts=["x"])


async def test_a_stream_sends_its_preceding_segments_as_context(fake: FakeDeepL) -> None:
    text = "First I read the file. Then I check the tests. Finally I write the answer."
    async with app_with(backend="deepl", deepl_api_key="k", deepl_server_url=fake.origin,
                        deepl_context=True, check_output_language=False,
                        default_locale="de") as run:
        assert await run.runtime.wait_ready(5.0)
        fake.received.clear()
        assert (await post_chunks(run.client, "s:ctx", deltas(text))).status_code == 200
        await run.client.post("/v1/streams/s:ctx/close")
        events = await read_until(run.client, "s:ctx")
    check_stream(events, text)
    assert [s["status"] for s in segments(events)] == ["translated"] * 3
    sent = sorted((context or "", t) for context, texts in fake.received for t in texts)
    assert sent == [
        ("", "First I read the file."),
        ("First I read the file. ", "Then I check the tests."),
        ("First I read the file. Then I check the tests. ", "Finally I write the answer."),
    ]


# -- models: DeepL's model types -------------------------------------------------------------


async def test_model_type_per_call(api: Api, make_on: Make) -> None:
    """The mock refuses (400) a model type DeepL does not know."""
    backend = make_on()  # latency_optimized, the setting's default
    for model in ("quality_optimized", None, "prefer_quality_optimized"):
        out = await backend.translate(["Hi."], source=None, target="de", model=model)
        api.check(out, ["Hi."], "DE")
    if api.double is not None:
        sent = [r.json["model_type"] for r in api.double.translate_requests]
        assert sent == ["quality_optimized", "latency_optimized", "prefer_quality_optimized"]
    assert backend.resolve_model("quality_optimized", None, "de") == "quality_optimized"
    assert backend.resolve_model(None, None, "de") == "latency_optimized"


async def test_a_model_deepl_lacks_is_refused(fake: FakeDeepL, make: Make) -> None:
    backend = make()
    assert backend.model_problem(None) is None
    assert [backend.model_problem(m) for m in MODEL_TYPES] == [None] * 3
    problem = (
        "deepl serves the model types latency_optimized, prefer_quality_optimized, "
        "quality_optimized; got 'gpt-4o'"
    )
    assert backend.model_problem("gpt-4o") == problem
    with pytest.raises(BackendError) as caught:
        await backend.translate(["Hi."], source=None, target="de", model="gpt-4o")
    assert caught.value.detail == problem
    assert fake.translate_requests == [] and backend.ready


async def test_cache_identity_names_model_type_and_options(make: Make) -> None:
    backend = make()
    assert backend.cache_identity(None, "en", "de") == (
        "deepl|latency_optimized|formality=None|en=EN-US"
    )
    assert backend.cache_identity("quality_optimized", "en", "de") == (
        "deepl|quality_optimized|formality=None|en=EN-US"
    )
    other = make(deepl_formality="prefer_less", deepl_english_variant="EN-GB")
    assert other.cache_identity(None, "de", "en") == (
        "deepl|latency_optimized|formality=prefer_less|en=EN-GB"
    )
    # The context changes no identity: DeepL reads it for terms, and it differs per segment.
    assert make(deepl_context=True).cache_identity(None, "en", "de") == (
        backend.cache_identity(None, "en", "de")
    )


async def test_catalog_lists_the_model_types(make: Make) -> None:
    backend = make(deepl_model_type="quality_optimized")
    catalog = backend.catalog()
    assert [(e["model"], e["default"]) for e in catalog] == [
        ("latency_optimized", False),
        ("quality_optimized", True),
        ("prefer_quality_optimized", False),
    ]
    assert all(e["languages"] == backend.languages() for e in catalog)
    assert all(isinstance(e["notes"], str) and e["notes"] for e in catalog)
    await backend.start()
    await backend.wait_ready()
    # Refined by the server's list: the double lists HE and lacks NB.
    languages = backend.catalog()[0]["languages"]
    assert isinstance(languages, list) and "he" in languages and "nb" not in languages


def test_without_the_extra_the_service_imports_and_the_backend_names_it() -> None:
    # The settings build every backend's config, so the config must import without the
    # vendor package; asking for the backend then names the extra to install.
    script = (
        "import sys; sys.modules['deepl'] = None\n"
        "import service.http.app\n"
        "from models.registry import build_backend\n"
        "from service.settings import Settings\n"
        "try:\n"
        "    build_backend('deepl', Settings())\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "BackendConfigError" in done.stdout
    assert "pip install 'thinktrans[deepl]'" in done.stdout
