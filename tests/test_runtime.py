"""The runtime on its own (no HTTP app), and the one data path behind one-shot and streams."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.passthrough import PassthroughTranslator
from service.runtime import Runtime
from service.schemas import SegmentResult
from tests.conftest import make_settings
from tests.fakes import FakeTranslator

MIXED = [
    "Hmm, the user said hello. ", "我们来看看。", "OK. ", "Let me check the logs again.\n",
    "```python\nprint(1)\n```\n", "42 + 17 = 59 ", "これは日本語です。", "Das ist gut. ",
    "首先，确定整个 hiking旅程所用的总时间。", "Hmm,", " well", "\n\n", "e.g. this one. ",
]
TEXTS = st.lists(st.sampled_from(MIXED), min_size=1, max_size=12).map("".join)


def runtime_with(fake: FakeTranslator, **overrides: Any) -> Runtime:
    overrides.setdefault("backend", fake.name)
    backends = {fake.name: fake, "passthrough": PassthroughTranslator()}
    return Runtime(make_settings(**overrides), backends=backends)


async def as_stream(runtime: Runtime, sid: str, text: str, cuts: list[int]) -> list[SegmentResult]:
    """``text`` posted as chunks cut at ``cuts``, then closed; its segments once all are out."""
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    stream, _ = runtime.streams.open(sid, "zh-CN", None)
    for seq, chunk in enumerate(chunks):
        await runtime.streams.add_chunks(sid, [(seq, chunk)])
    await stream.close()
    await asyncio.wait_for(stream.wait_emitted(), 60)  # a hang guard
    return [SegmentResult.model_validate_json(data)
            for _, kind, data in stream.log.events if kind == "segment"]


def shape(results: list[SegmentResult]) -> list[tuple[Any, ...]]:
    return [(r.index, r.original, r.status, r.source_lang, r.text, r.backend) for r in results]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_the_same_text_one_shot_and_as_a_stream_gives_the_same_segments(
    text: str, cuts: list[int]
) -> None:
    async def run() -> None:
        # Each half on its own runtime: the stream is not served from the cache (or the
        # work in flight) that the one-shot request left, so both real paths are compared.
        one_fake, stream_fake = FakeTranslator(), FakeTranslator()
        async with runtime_with(one_fake) as runtime:
            [one_shot] = await runtime.translate([text], target="zh-CN")
        async with runtime_with(stream_fake) as runtime:
            streamed = await as_stream(runtime, "s", text, cuts)
        assert shape(one_shot.segments) == shape(streamed)
        translated = any(s.status == "translated" for s in streamed)
        assert bool(one_fake.calls) == bool(stream_fake.calls) == translated
        assert "".join(s.original for s in one_shot.segments) == text
        assert one_shot.text == "".join(s.text for s in one_shot.segments)

    asyncio.run(run())


async def test_a_runtime_serves_without_an_app_and_closes_what_it_opened() -> None:
    fake = FakeTranslator()
    closed: list[str] = []

    async def aclose() -> None:
        closed.append(fake.name)

    fake.aclose = aclose  # type: ignore[method-assign]
    async with runtime_with(fake, default_locale="de") as runtime:
        [result] = await runtime.translate(["Das ist gut. Let me check it."], target=None)
        statuses = [s.status for s in result.segments]
        assert statuses == ["same_language", "translated"]
        assert result.segments[1].text == "<de>Let me check it."
        assert runtime.status.readiness()["status"] == "ready"
        batcher = runtime.batchers[fake.name]
    assert closed == [fake.name]
    assert batcher._closed  # stopped with the runtime


async def test_a_backend_that_uses_context_gets_the_preceding_text_others_do_not() -> None:
    wants = FakeTranslator(name_="ctx", uses_context=True)
    text = "The first sentence. The second sentence. The third one."
    async with runtime_with(wants, context_max_chars=30) as runtime:
        await runtime.translate([text], target="de")
        await as_stream(runtime, "s:ctx", text, [5, 23, 40])
    sent = [(t, c) for call in wants.calls for t, c in zip(call.texts, call.contexts or [],
                                                          strict=True)]
    expected = [("The first sentence.", None),
                ("The second sentence.", "The first sentence. "),
                # at most context_max_chars, cut at a segment: the latest ones are kept
                ("The third one.", "The second sentence. ")]
    assert sorted(sent) == sorted(expected * 2)

    plain = FakeTranslator()
    async with runtime_with(plain) as runtime:
        await runtime.translate([text], target="de")
    assert plain.calls and all(call.contexts is None for call in plain.calls)
