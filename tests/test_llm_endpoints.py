"""The llm backend against reasoning-model servers as they answer (tests/fakes_llm.py, real
HTTP on 127.0.0.1): the dialect's switch sent, every answer shape read, the failures said."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from models.llm import SYSTEM_PROMPT, LLMTranslator
from models.registry import build_backend
from service.exceptions import ConfigError
from service.settings import load_settings
from tests.conftest import Running, app_with, check_stream, post_chunks, read_until, segments
from tests.fakes_llm import REASONING, DeepSeekChat, OpenAIChat, ReasoningChat, SGLangChat, VLLMChat

CORES = ["The user asked for a summary of the quarterly report.",
         "I should read the revenue table first, then the notes."]
TEXT = " ".join(CORES) + " "
LOCALE, TARGET = "zh-Hant-TW", "Traditional Chinese"
GOOD = [f"{TARGET}: {core}" for core in CORES]
SWITCHES = ("reasoning_effort", "chat_template_kwargs", "thinking")
OFF = {"chat_template_kwargs": {"enable_thinking": False}}

# A shape: the server, its settings, the model asked for.
SHAPES: dict[str, tuple[str, dict[str, Any], str]] = {
    "vllm": ("vllm", {}, "Qwen/Qwen3-8B"),  # reasoning (current vLLM)
    "vllm-old": ("vllm", {"parser": "reasoning_content"}, "Qwen/Qwen3-8B"),
    "vllm-raw": ("vllm", {"parser": None}, "Qwen/Qwen3-8B"),  # <think> in the content
    "vllm-r1": ("vllm", {"parser": None, "template": "r1"}, "deepseek-r1"),  # </think> only
    "sglang": ("sglang", {}, "Qwen/Qwen3-8B"),
    "deepseek": ("deepseek", {}, "deepseek-chat"),
    "openai": ("openai", {}, "o4-mini"),  # hidden reasoning, counted in usage
}
REPORTS_TOKENS = {"deepseek", "openai"}


@pytest.fixture(scope="module")
def _servers() -> Iterator[dict[str, ReasoningChat]]:
    servers: dict[str, ReasoningChat] = {"vllm": VLLMChat(), "sglang": SGLangChat(),
                                         "deepseek": DeepSeekChat(), "openai": OpenAIChat()}
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def servers(_servers: dict[str, ReasoningChat]) -> dict[str, ReasoningChat]:
    for server in _servers.values():
        server.reset()
    return _servers


def shape(servers: dict[str, ReasoningChat], name: str) -> tuple[ReasoningChat, str]:
    kind, settings, model = SHAPES[name]
    fake = servers[kind]
    for key, value in settings.items():
        setattr(fake, key, value)
    return fake, model


def answered(fake: ReasoningChat) -> list[dict[str, Any]]:
    """The requests the server answered (not refused)."""
    return [body for body in fake.sent if fake.refusal(body) is None]


def check_prompts(fake: ReasoningChat) -> None:
    """The system prompt is the service's own text; the locale tag is sent nowhere."""
    for body in fake.sent:
        system, user = body["messages"]
        assert system == {"role": "system", "content": SYSTEM_PROMPT}
        assert not any(core in system["content"] for core in CORES)
        assert json.loads(user["content"])["target_language"] == TARGET
        assert LOCALE not in json.dumps(body) and "zh-Hant" not in json.dumps(body)


@asynccontextmanager
async def served(fake: ReasoningChat, model: str, **settings: Any) -> AsyncIterator[Running]:
    settings.setdefault("backend", "llm")
    async with app_with(llm_base_url=f"{fake.origin}/v1", llm_model=model,
                        check_output_language=False, default_locale=LOCALE,
                        flush_idle_ms=50, breaker_failures=100, **settings) as run:
        assert await run.runtime.wait_ready(5.0)
        yield run


async def stream(run: Running, sid: str = "s") -> list[dict[str, Any]]:
    """TEXT through a stream: its segments' results, checked against the contract."""
    pieces = [(seq, TEXT[i:i + 11]) for seq, i in enumerate(range(0, len(TEXT), 11))]
    assert (await post_chunks(run.client, sid, pieces)).status_code == 200
    await run.client.post(f"/v1/streams/{sid}/close")
    events = await read_until(run.client, sid)
    check_stream(events, TEXT)
    return segments(events)


def texts(segs: list[dict[str, Any]]) -> list[str]:
    return [seg["text"].strip() for seg in segs]


def info(run: Running) -> dict[str, Any]:
    return dict(run.runtime.backends["llm"].info())


# -- every answer shape, reasoning left on -----------------------------------------------------


@pytest.mark.parametrize("how", ["whole", "streamed", "streamed unasked"])
@pytest.mark.parametrize("name", list(SHAPES))
async def test_every_shape_is_read_with_reasoning_left_on(
        servers: dict[str, ReasoningChat], name: str, how: str) -> None:
    fake, model = shape(servers, name)
    fake.stream_unasked = how == "streamed unasked"
    async with served(fake, model, llm_dialect="none", llm_stream=how == "streamed") as run:
        segs = await stream(run)
        facts = info(run)
    assert texts(segs) == GOOD and {s["backend"] for s in segs} == {"llm"}
    assert REASONING not in json.dumps(segs) and "PWNED" not in json.dumps(segs)
    for body in fake.sent:  # dialect none: no switch at all
        assert not set(SWITCHES) & set(body)
        assert body["stream"] is (how == "streamed")
        assert ("stream_options" in body) is (how == "streamed")
    check_prompts(fake)
    done = answered(fake)
    assert facts["dialect"] == "none" and facts["stream"] is (how == "streamed")
    assert done
    # Usage comes whole, or streamed when asked for (stream_options.include_usage); it is
    # all that tells of OpenAI's hidden reasoning.
    usage = how != "streamed unasked"
    assert facts["reasoning_answers"] == (len(done) if usage or name != "openai" else 0)
    counted = name in REPORTS_TOKENS and usage
    assert facts["reasoning_tokens"] == (fake.reasoning_tokens * len(done) if counted else 0)
    assert facts["out_of_tokens"] == 0


@pytest.mark.parametrize(("name", "dialect", "model", "fields"), [
    ("vllm", "auto", None, OFF),  # auto: vllm for 127.0.0.1
    ("vllm-old", "vllm", None, OFF),
    ("sglang", "sglang", None, OFF),
    ("deepseek", "deepseek", None, {"thinking": {"type": "disabled"}}),
    ("openai", "openai", "gpt-5.1", {"reasoning_effort": "none"}),
    ("openai", "openai", "gpt-5", {"reasoning_effort": "minimal"}),
])  # fmt: skip
@pytest.mark.parametrize("streamed", [False, True])
async def test_the_dialect_switches_reasoning_off(
        servers: dict[str, ReasoningChat], name: str, dialect: str, model: str | None,
        fields: dict[str, Any], streamed: bool) -> None:
    fake, default_model = shape(servers, name)
    async with served(fake, model or default_model, llm_dialect=dialect,
                      llm_stream=streamed) as run:
        segs = await stream(run)
        facts = info(run)
    assert texts(segs) == GOOD
    assert answered(fake) and all(body.items() >= fields.items() for body in answered(fake))
    assert facts["dialect"] == ("vllm" if dialect == "auto" else dialect)
    assert facts["reasoning_answers"] == facts["reasoning_tokens"] == 0
    check_prompts(fake)


async def test_a_template_without_the_switch_still_reasons_and_is_read(
        servers: dict[str, ReasoningChat], caplog: pytest.LogCaptureFixture) -> None:
    fake, model = shape(servers, "vllm-r1")  # a DeepSeek-R1 template ignores enable_thinking
    caplog.set_level(logging.DEBUG)
    async with served(fake, model) as run:
        segs = await stream(run)
        facts = info(run)
    assert texts(segs) == GOOD
    assert all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in fake.sent)
    assert facts["reasoning_answers"] == len(fake.sent)
    warned = [r for r in caplog.records if "reasoned before answering" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING  # once per model
    assert "THINKTRANS_LLM_DIALECT" in warned[0].getMessage()
    assert "PWNED" not in caplog.text and "Okay, the user" not in caplog.text


# -- failures go down the chain, with a reason in one line ---------------------------------


@pytest.mark.parametrize(("name", "settings", "budget", "reason"), [
    ("vllm", {}, 50, "ran out of tokens while reasoning"),  # content null
    ("vllm", {"llm_stream": True}, 50, "ran out of tokens while reasoning"),
    ("vllm", {"llm_extra_body": {"max_tokens": 50}}, None, "ran out of tokens while reasoning"),
    ("vllm-raw", {}, 50, "ran out of tokens while reasoning"),  # <think> never closed
    ("sglang", {"llm_stream": True}, 50, "ran out of tokens while reasoning"),
    ("deepseek", {}, 50, "ran out of tokens while reasoning"),  # content ""
    ("openai", {"llm_extra_body": {"max_completion_tokens": 50}}, None,
     "ran out of tokens while reasoning"),  # hidden: only usage says it reasoned
    ("openai", {"llm_stream": True}, 50, "ran out of tokens while reasoning"),
    ("vllm", {"llm_stream": True, "mode": "stream_error"}, None,
     "the LLM endpoint answered an error (400)"),
    ("openai", {"llm_stream": True, "mode": "stream_error"}, None,
     "the LLM endpoint answered an error (server_error)"),
])  # fmt: skip
async def test_a_failed_answer_goes_down_the_chain_with_one_line_saying_why(
        servers: dict[str, ReasoningChat], name: str, settings: dict[str, Any],
        budget: int | None, reason: str) -> None:
    fake, model = shape(servers, name)
    fake.budget = budget
    settings = dict(settings)
    fake.mode = settings.pop("mode", "good")
    async with served(fake, model, backend="llm,passthrough", llm_dialect="none",
                      **settings) as run:
        segs = await stream(run)
        alone = await run.client.post("/v1/translate", json={
            "target": LOCALE, "texts": [CORES[0]], "backend": "llm"})  # fmt: skip
        facts = info(run)
    assert {seg["backend"] for seg in segs} == {"passthrough"}
    [seg] = alone.json()["results"][0]["segments"]
    assert seg["status"] == "error" and seg["text"] == CORES[0]
    error = seg["error"]
    assert error.startswith("llm: ") and reason in error and "\n" not in error
    assert "PWNED" not in error and "Okay, the user" not in error
    if "tokens" in reason:
        assert "THINKTRANS_LLM_DIALECT is 'none'" in error
        assert facts["out_of_tokens"] == len(answered(fake))
    # At most 3 batches (the stream's 2 segments, the one-shot), one answer each: a model
    # out of tokens is not asked again for the same failure.
    assert len(answered(fake)) <= 3


# -- THINKTRANS_LLM_EXTRA_BODY --------------------------------------------------------------


@pytest.mark.parametrize(("extra", "present", "absent", "reasons"), [
    ({"chat_template_kwargs": {"thinking": False}, "top_k": 20, "temperature": None},
     {"chat_template_kwargs": {"enable_thinking": False, "thinking": False}, "top_k": 20},
     ["temperature"], False),
    ({"chat_template_kwargs": None}, {}, ["chat_template_kwargs"], True),  # null: no switch
    ({"chat_template_kwargs": {"enable_thinking": True}, "separate_reasoning": False},
     {"chat_template_kwargs": {"enable_thinking": True}}, [], True),  # <think> in content
])  # fmt: skip
async def test_the_extra_body_is_merged_over_the_switch(
        servers: dict[str, ReasoningChat], monkeypatch: pytest.MonkeyPatch,
        extra: dict[str, Any], present: dict[str, Any], absent: list[str],
        reasons: bool) -> None:
    fake, model = shape(servers, "sglang")
    monkeypatch.setenv("THINKTRANS_LLM_EXTRA_BODY", json.dumps(extra))
    async with served(fake, model) as run:
        segs = await stream(run)
        facts = info(run)
    assert texts(segs) == GOOD
    for body in fake.sent:
        assert body.items() >= present.items()
        assert not set(absent) & set(body)
    assert facts["extra_body_keys"] == sorted(extra)
    assert (facts["reasoning_answers"] > 0) is reasons


@pytest.mark.parametrize(("value", "says"), [
    ('{"model": "other"}', "may not set 'model'"),
    ('{"messages": [], "top_k": 1}', "may not set 'messages'"),
    ('{"stream": true}', "may not set 'stream'"),
    ('["top_k"]', "llm_extra_body"),
    ("{top_k: 1}", "THINKTRANS_LLM_EXTRA_BODY"),
])  # fmt: skip
def test_the_settings_refuse_an_extra_body_they_cannot_send(
        monkeypatch: pytest.MonkeyPatch, value: str, says: str) -> None:
    monkeypatch.setenv("THINKTRANS_LLM_EXTRA_BODY", value)
    with pytest.raises(ConfigError) as failed:
        load_settings(backend="llm")
    message = str(failed.value)
    assert says in message and "\n" not in message


# -- OpenAI's refusals: the next reasoning_effort, a field dropped and remembered ----------


@asynccontextmanager
async def backend(fake: ReasoningChat, model: str, **settings: Any
                  ) -> AsyncIterator[LLMTranslator]:
    made = build_backend("llm", load_settings(
        backend="llm", llm_base_url=f"{fake.origin}/v1", llm_model=model, **settings))
    assert isinstance(made, LLMTranslator)
    try:
        yield made
    finally:
        await made.aclose()


ABSENT = "-"


def sent_fields(bodies: list[dict[str, Any]]) -> list[tuple[object, object]]:
    return [(body.get("reasoning_effort", ABSENT), body.get("temperature", ABSENT))
            for body in bodies]


@pytest.mark.parametrize(("model", "first", "then", "dropped"), [
    ("gpt-5.1", [("none", 0), ("none", ABSENT)], ("none", ABSENT), ["temperature"]),
    ("gpt-5", [("none", 0), ("minimal", 0), ("minimal", ABSENT)], ("minimal", ABSENT),
     ["temperature"]),
    ("o4-mini", [("none", 0), ("minimal", 0), ("low", 0), ("low", ABSENT)], ("low", ABSENT),
     ["temperature"]),
    # Not a reasoning model: the field is refused by name, not its value: dropped at once.
    ("gpt-4o", [("none", 0), (ABSENT, 0)], (ABSENT, 0), ["reasoning_effort"]),
])  # fmt: skip
async def test_openai_refusals_walk_the_ladder_and_are_remembered(
        servers: dict[str, ReasoningChat], model: str, first: list[tuple[object, object]],
        then: tuple[object, object], dropped: list[str]) -> None:
    fake = servers["openai"]
    async with backend(fake, model, llm_dialect="openai") as llm:
        assert await llm.translate(CORES, source="en", target=LOCALE) == GOOD
        assert sent_fields(fake.sent) == first
        fake.requests.clear()
        assert await llm.translate(CORES[:1], source="en", target=LOCALE) == GOOD[:1]
        assert sent_fields(fake.sent) == [then]  # the next batch: one request
        facts = llm.info()
    assert facts["dropped_fields"] == {model: dropped}
    assert facts["requests"] == len(first) + 1


async def test_an_operator_field_is_never_dropped(servers: dict[str, ReasoningChat]) -> None:
    fake = servers["openai"]
    async with backend(fake, "o4-mini", llm_dialect="openai",
                       llm_extra_body={"temperature": 0.5}) as llm:
        with pytest.raises(Exception, match="HTTP 400"):
            await llm.translate(CORES, source="en", target=LOCALE)
        facts = llm.info()
    assert [body["temperature"] for body in fake.sent] == [0.5, 0.5, 0.5]  # the ladder only
    assert facts["dropped_fields"] == {}
