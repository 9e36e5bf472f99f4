"""``<think>`` and ``</think>`` in the text translated, and in the reasoning before an answer
(tests/fakes_llm.py, tests/fakes_remote.py, real HTTP on 127.0.0.1): a reasoning block is
taken from the start of an answer only, never from inside the translation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from models.llm import parse_answer
from tests.conftest import Running, app_with
from tests.fakes_llm import REASONING, VLLMChat
from tests.fakes_remote import PLAIN_TAG, FakeChat

# Texts an agent writes when it reasons about reasoning models.
QUOTING = [
    "The model writes <think>draft</think> before the answer, so the parser must skip it.",
    "A reply that holds a stray </think> in its middle broke the parser on the last run.",
]
PLAIN_TEXT = "I should read the revenue table first, then the notes on each region."
# What a model thinks about such a text: it quotes the tags, closes, then answers.
THINKS_OF_TAGS = ("The text quotes </think> and <think>draft</think>; I keep both as "
                  "they are. " + REASONING)


@pytest.fixture(scope="module")
def _vllm() -> Iterator[VLLMChat]:
    server = VLLMChat()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def vllm(_vllm: VLLMChat) -> VLLMChat:
    _vllm.reset()
    return _vllm


@pytest.fixture
def chat(chat_server: FakeChat) -> FakeChat:
    chat_server.reset()
    return chat_server


@asynccontextmanager
async def served(origin: str, model: str, **settings: Any) -> AsyncIterator[Running]:
    """The app on ``llm`` at ``origin``; one failed batch opens the breaker for a minute."""
    async with app_with(backend="llm", llm_base_url=f"{origin}/v1", llm_model=model,
                        check_output_language=False, cache_mb=0, breaker_failures=1,
                        breaker_cooloff_s=60, **settings) as run:
        assert await run.runtime.wait_ready(5.0)
        yield run


async def translate(run: Running, texts: list[str]) -> list[tuple[str, str, str]]:
    """Each segment's status, backend and text, for a one-shot request into German."""
    resp = await run.client.post("/v1/translate", json={"target": "de", "texts": texts})
    assert resp.status_code == 200, resp.text
    return [(s["status"], s["backend"], s["text"])
            for r in resp.json()["results"] for s in r["segments"]]


def translated(texts: list[str], prefix: str = "German: ") -> list[tuple[str, str, str]]:
    return [("translated", "llm", f"{prefix}{text}") for text in texts]


# -- (a) the JSON style: tags inside the translations -------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
async def test_a_batch_quoting_think_tags_is_translated_whole(
        vllm: VLLMChat, order: list[int], streamed: bool) -> None:
    """The answer's JSON holds ``</think>`` and ``<think>draft</think>`` in its strings:
    neither is reasoning, each item comes back whole, and the batch's other text too."""
    texts = [QUOTING[i] for i in order] + [PLAIN_TEXT]
    async with served(vllm.origin, "Qwen/Qwen3-8B", llm_stream=streamed) as run:
        assert await translate(run, texts) == translated(texts)
        # One failed batch would have opened the breaker: the next is still the llm's.
        assert await translate(run, [PLAIN_TEXT]) == translated([PLAIN_TEXT])
    assert len(vllm.sent) == 2  # nothing asked again


def test_a_think_block_inside_a_json_string_is_kept() -> None:
    answer = ('{"translations": [{"id": 1, "text": "A <think>x</think> B"}, '
              '{"id": 2, "text": "C </think> D"}]}')
    assert parse_answer(answer, 2) == {1: "A <think>x</think> B", 2: "C </think> D"}
    # A leading block is reasoning, whatever it quotes; the JSON after it is the answer.
    thought = f"<think>I keep </think> and {{ as they are</think>\n{answer}"
    assert parse_answer(thought, 2) == {1: "A <think>x</think> B", 2: "C </think> D"}


# -- (b) the plain style: a sentence that mentions the tag ---------------------------------


async def test_a_plain_sentence_mentioning_the_tag_keeps_its_start(chat: FakeChat) -> None:
    async with served(chat.origin, "served-mt", llm_prompt_style="plain",
                      llm_plain_template="hunyuan-mt") as run:
        out = await translate(run, QUOTING)
    assert out == translated(QUOTING, PLAIN_TAG)


# -- (c) a leading <think> block is reasoning, in both styles, whole and streamed -----------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("style", ["json", "plain"])
async def test_a_leading_think_block_is_taken_out(
        vllm: VLLMChat, style: str, streamed: bool) -> None:
    """A server without a reasoning parser: ``<think>...</think>`` then the answer. The
    reasoning quotes both tags (the texts do); it is taken out, the translations kept."""
    vllm.parser, vllm.reasoning, vllm.reasoning_tokens = None, THINKS_OF_TAGS, 50
    texts = [*QUOTING, PLAIN_TEXT]
    settings: dict[str, Any] = {"llm_dialect": "none", "llm_stream": streamed}
    if style == "plain":
        settings.update(llm_prompt_style="plain", llm_plain_template="hunyuan-mt")
    async with served(vllm.origin, "Qwen/Qwen3-8B", **settings) as run:
        out = await translate(run, texts)
        facts = run.runtime.backends["llm"].info()
    assert out == translated(texts, PLAIN_TAG if style == "plain" else "German: ")
    assert facts["reasoning_answers"] == len(vllm.sent) and facts["retries"] == 0


# -- (d) DeepSeek-R1's template: only </think> in the answer -------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_bare_close_is_reasoning_where_the_json_follows_it(
        vllm: VLLMChat, streamed: bool) -> None:
    """The template opened the block in the prompt: the reasoning (which quotes the tags
    and an answer of its own) ends at the ``</think>`` after which the JSON parses."""
    vllm.parser, vllm.template, vllm.reasoning = None, "r1", THINKS_OF_TAGS
    async with served(vllm.origin, "deepseek-r1", llm_stream=streamed) as run:
        for texts in ([QUOTING[0]], [*QUOTING, PLAIN_TEXT]):
            assert await translate(run, texts) == translated(texts)
        facts = run.runtime.backends["llm"].info()
    assert facts["reasoning_answers"] == len(vllm.sent) == 2 and facts["retries"] == 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_bare_close_in_the_plain_style(vllm: VLLMChat, streamed: bool) -> None:
    """A text without the tag: the ``</think>`` is not the translation's, the reasoning
    before it is taken out, and the model is known to reason so. A text that quotes it
    then keeps as many ``</think>`` as it has, the reasoning's cut off before them."""
    vllm.parser, vllm.template, vllm.reasoning = None, "r1", THINKS_OF_TAGS
    vllm.reasoning_tokens = 50
    async with served(vllm.origin, "deepseek-r1", llm_prompt_style="plain",
                      llm_plain_template="hunyuan-mt", llm_stream=streamed) as run:
        for texts in ([PLAIN_TEXT], QUOTING):
            assert await translate(run, texts) == translated(texts, PLAIN_TAG)
        facts = run.runtime.backends["llm"].info()
    assert facts["reasoning_answers"] == len(vllm.sent) == 3 and facts["retries"] == 0


async def test_a_bare_close_from_a_model_not_known_to_reason_is_kept(chat: FakeChat) -> None:
    """The plain style: a ``</think>`` the text has, from a model never seen reasoning, is
    the translation's: nothing before it is cut, even with more than one."""
    text = "First </think> then </think> again: the parser saw two closing tags in a row."
    async with served(chat.origin, "served-mt", llm_prompt_style="plain",
                      llm_plain_template="hunyuan-mt") as run:
        assert await translate(run, [text]) == translated([text], PLAIN_TAG)
