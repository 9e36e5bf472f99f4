"""The batcher against a fake backend whose timing the tests hold with gates."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.base import Capabilities, Job
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    Expired,
    PartialOutput,
    UnsupportedLanguage,
)
from service.chain.batcher import Batcher, Translation
from service.exceptions import Overloaded, kind_of
from service.ops.metrics import Metrics
from tests.configs import batch_limits
from tests.fakes import FakeTranslator, work


@asynccontextmanager
async def running(
    fake: FakeTranslator, grace_s: float = 0.5, **limits: Any
) -> AsyncIterator[Batcher]:
    batcher = Batcher(fake, batch_limits(fake, **limits), Metrics())
    await batcher.start()
    try:
        yield batcher
    finally:
        if fake.gate is not None:
            fake.gate.set()
        await batcher.stop(grace_s=grace_s)


async def wait_until(cond: Callable[[], bool], timeout_s: float = 60) -> None:
    """Poll a condition the event loop makes true; fail after a generous bound."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


# How long a test waits for what must happen before it calls it a hang: never what it measures.
HANG_S = 60


def sizes(fake: FakeTranslator) -> list[int]:
    return [len(call.texts) for call in fake.calls]


async def gather_all(futures: Sequence[asyncio.Future[Translation]]) -> list[object]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), HANG_S)


# -- a batch answered in part --------------------------------------------------------------


async def test_a_partial_answer_answers_the_good_items_and_fails_only_the_bad() -> None:
    def half(texts: Sequence[str], source: str | None, target: str) -> list[str]:
        raise PartialOutput("1 of 3 lost a span",
                            [f"ok {t}" if t != "bad" else None for t in texts])

    fake = FakeTranslator(answers=deque([half]))
    async with running(fake, max_batch_size=3, max_wait_ms=10_000, breaker_failures=1) as b:
        results = await gather_all([b.submit(work(t, None, "de")) for t in ("a", "bad", "c")])
        assert b.available()  # the backend answered: its breaker counts no failure
    good_a, bad, good_c = results
    assert isinstance(good_a, Translation) and good_a.text == "ok a"
    assert isinstance(good_c, Translation) and good_c.text == "ok c"
    assert isinstance(bad, BadOutput) and bad.detail == "1 of 3 lost a span"


async def test_a_partial_answer_of_the_wrong_length_fails_the_batch() -> None:
    def short(texts: Sequence[str], source: str | None, target: str) -> list[str]:
        raise PartialOutput("lost", ["x", None])

    fake = FakeTranslator(answers=deque([short]))
    async with running(fake, max_batch_size=3, max_wait_ms=10_000) as b:
        results = await gather_all([b.submit(work(t, None, "de")) for t in ("a", "b", "c")])
    assert all(isinstance(r, BadOutput) and "2 outputs for 3" in r.detail for r in results)


# -- when a batch goes --------------------------------------------------------------------


async def test_full_batch_goes_at_once_without_waiting() -> None:
    fake = FakeTranslator()
    # A batch that waited for max_wait_ms (an hour) would trip the hang guard.
    async with running(fake, max_batch_size=4, max_wait_ms=3_600_000) as b:
        futures = [b.submit(work(f"text {i}", None, "zh-CN")) for i in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
    assert sizes(fake) == [4]
    assert [r.text for r in results] == [f"<zh-CN>text {i}" for i in range(4)]
    assert all(r.backend == "fake" and r.queued_ms >= 0 for r in results)


async def test_partial_batch_goes_after_max_wait_as_one_batch() -> None:
    fake = FakeTranslator()
    async with running(fake, max_batch_size=10, max_wait_ms=100) as b:
        futures = [b.submit(work(f"t{i}", "en", "ja")) for i in range(3)]
        await asyncio.sleep(0.02)
        assert fake.calls == []  # still waiting for more items
        results = await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
    assert sizes(fake) == [3]  # one batch: it waited for max_wait_ms, not item by item
    assert [r.text for r in results] == ["<ja>t0", "<ja>t1", "<ja>t2"]
    assert min(r.queued_ms for r in results) >= 90


async def test_char_budget_splits_batches() -> None:
    fake = FakeTranslator()
    async with running(fake, max_batch_size=100, max_batch_chars=10, max_wait_ms=20) as b:
        futures = [b.submit(work(c * 4, None, "de")) for c in "abcde"]
        futures.append(b.submit(work("x" * 25, None, "de")))  # over the budget alone: goes alone
        results = await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
    assert [r.text for r in results] == [f"<de>{c * 4}" for c in "abcde"] + ["<de>" + "x" * 25]
    for call in fake.calls:
        assert len(call.texts) == 1 or sum(map(len, call.texts)) <= 10
    assert sorted(sizes(fake)) == [1, 1, 2, 2]
    assert [t for call in fake.calls for t in call.texts] == [
        *(c * 4 for c in "abcde"), "x" * 25
    ]


async def test_pairs_never_share_a_call() -> None:
    fake = FakeTranslator()
    pairs = [(None, "zh-CN"), ("en", "zh-CN"), (None, "ja"), ("en", "ja")]
    async with running(fake, max_batch_size=32, max_wait_ms=20) as b:
        futures = {}
        for i in range(12):
            source, target = pairs[i % len(pairs)]
            text = f"{source}>{target}#{i}"
            futures[text] = b.submit(work(text, source, target))
        results = await asyncio.wait_for(asyncio.gather(*futures.values()), HANG_S)
    assert len(fake.calls) == len(pairs)
    for call in fake.calls:
        assert {t.split("#")[0] for t in call.texts} == {f"{call.source}>{call.target}"}
        assert len(call.texts) == 3
    for (text, _), result in zip(futures.items(), results, strict=True):
        target = text.split("#")[0].split(">")[1]
        assert result.text == f"<{target}>{text}"


async def test_items_pile_up_while_the_backend_is_busy() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with running(fake, max_batch_size=8, max_wait_ms=0, max_concurrency=1) as b:
        first = b.submit(work("first", None, "fr"))
        await asyncio.wait_for(fake.started.wait(), HANG_S)
        rest = [b.submit(work(f"next {i}", None, "fr")) for i in range(10)]
        await asyncio.sleep(0.05)
        assert sizes(fake) == [1]  # the only slot is busy: nothing else has gone
        assert b.queue_size == 10
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), HANG_S)
    assert sizes(fake) == [1, 8, 2]


# -- cancellation and errors ---------------------------------------------------------------


async def test_cancelled_item_is_dropped_before_it_runs() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with running(fake, max_batch_size=8, max_wait_ms=0) as b:
        first = b.submit(work("first", None, "fr"))
        await asyncio.wait_for(fake.started.wait(), HANG_S)
        dropped = b.submit(work("dropped", None, "fr"))
        kept = b.submit(work("kept", None, "fr"))
        dropped.cancel()
        gate.set()
        assert (await asyncio.wait_for(kept, HANG_S)).text == "<fr>kept"
        await first
    assert [call.texts for call in fake.calls] == [["first"], ["kept"]]
    assert dropped.cancelled()
    assert b.queue_size == 0


async def test_cancelled_items_take_no_place_in_a_batch() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with running(fake, max_batch_size=2, max_wait_ms=0) as b:
        first = b.submit(work("first", None, "fr"))
        await asyncio.wait_for(fake.started.wait(), HANG_S)
        kept = [b.submit(work("b", None, "fr"))]
        b.submit(work("c", None, "fr")).cancel()
        kept.append(b.submit(work("d", None, "fr")))
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *kept), HANG_S)
    assert [call.texts for call in fake.calls] == [["first"], ["b", "d"]]


async def test_cancelled_items_alone_make_no_call() -> None:
    fake = FakeTranslator()
    async with running(fake, max_batch_size=8, max_wait_ms=30) as b:
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(3)]
        for f in futures:
            f.cancel()
        await asyncio.sleep(0.1)
        after = b.submit(work("after", None, "fr"))
        assert (await asyncio.wait_for(after, HANG_S)).text == "<fr>after"
    assert [call.texts for call in fake.calls] == [["after"]]


@pytest.mark.parametrize(
    ("answer", "expected", "words"),
    [
        (BackendUnavailable("vendor is down"), BackendUnavailable, "vendor is down"),
        (RuntimeError("oops"), BackendError, "RuntimeError"),
        (lambda texts, s, t: ["only one"], BadOutput, "1 outputs for 3 inputs"),
        (lambda texts, s, t: [1, 2, 3], BadOutput, "non-string"),
        (lambda texts, s, t: "not a list", BadOutput, "str"),
    ],
    ids=["backend-error", "plain-exception", "wrong-count", "non-string", "not-a-list"],
)
async def test_an_error_reaches_every_caller_of_the_batch(
    answer: object, expected: type[BackendError], words: str
) -> None:
    fake = FakeTranslator(answers=deque([answer]))  # type: ignore[list-item]
    async with running(fake, max_batch_size=3, max_wait_ms=10_000) as b:
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(3)]
        outcomes = await gather_all(futures)
        errors_counted = b.metrics.registry.get_sample_value(
            "thinktrans_backend_errors_total", {"backend": "fake", "kind": kind_of(expected).slug}
        )
        # The batcher survives: the next batch is served.
        later = [b.submit(work(f"u{i}", None, "fr")) for i in range(3)]
        assert [r.text for r in await gather_all(later)] == ["<fr>u0", "<fr>u1", "<fr>u2"]
    assert sizes(fake) == [3, 3]
    for outcome in outcomes:
        assert isinstance(outcome, expected)
        assert words in str(outcome)
    assert errors_counted == 1.0


async def test_a_hung_backend_times_out_for_every_caller() -> None:
    fake = FakeTranslator(gate=asyncio.Event())  # never opened by the test
    async with running(fake, max_batch_size=2, max_wait_ms=10_000, timeout_s=0.1) as b:
        outcomes = await gather_all([b.submit(work("a", None, "fr")),
                                     b.submit(work("b", None, "fr"))])
    assert all(isinstance(o, BackendTimeout) for o in outcomes)
    assert "0.1 s" in str(outcomes[0])


# -- overload and shutdown -----------------------------------------------------------------


async def test_submit_past_the_queue_bound_raises_overloaded() -> None:
    fake = FakeTranslator()
    async with running(fake, max_queue_size=3, max_batch_size=10, max_wait_ms=10_000) as b:
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(3)]
        assert b.free() == 0
        with pytest.raises(Overloaded) as info:
            b.submit(work("one too many", None, "fr"))
        assert kind_of(info.value).status == 503
        assert info.value.retry_after_s >= 1
        assert "MAX_QUEUE_SIZE" in info.value.detail
    assert all(isinstance(o, BackendUnavailable) for o in await gather_all(futures))
    assert fake.calls == []


async def test_stop_fails_queued_and_running_items_and_leaves_none_pending() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    b = Batcher(fake, batch_limits(fake, max_batch_size=2, max_wait_ms=0), Metrics())
    await b.start()
    try:
        running_items = [b.submit(work("r0", None, "fr")), b.submit(work("r1", None, "fr"))]
        await asyncio.wait_for(fake.started.wait(), HANG_S)
        queued = [b.submit(work(f"q{i}", "en", "ja")) for i in range(5)]
    finally:
        await asyncio.wait_for(b.stop(grace_s=0.1), HANG_S)
    everything = running_items + queued
    assert all(f.done() for f in everything)
    outcomes = await gather_all(everything)
    assert all(isinstance(o, BackendUnavailable) for o in outcomes)
    assert b.queue_size == 0
    with pytest.raises(BackendUnavailable):
        b.submit(work("late", None, "fr"))


async def test_stop_lets_a_running_batch_finish_within_grace() -> None:
    fake = FakeTranslator(delay_s=0.05)
    b = Batcher(fake, batch_limits(fake, max_batch_size=1, max_wait_ms=0), Metrics())
    await b.start()
    future = b.submit(work("in flight", None, "fr"))
    await asyncio.wait_for(fake.started.wait(), HANG_S)
    await b.stop(grace_s=2.0)
    assert future.result().text == "<fr>in flight"


# -- limits, concurrency, metrics ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_batch_size", 0, "max_batch_size must be >= 1, got 0"),
        ("max_batch_chars", -5, "max_batch_chars must be >= 1, got -5"),
        ("max_queue_size", 0, "max_queue_size must be >= 1, got 0"),
        ("max_concurrency", 0, "max_concurrency must be >= 1, got 0"),
        ("max_wait_ms", -1.0, "max_wait_ms must be >= 0, got -1.0"),
        ("timeout_s", 0, "timeout_s must be > 0, got 0"),
    ],
)
def test_limits_reject_bad_values_naming_them(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError) as info:
        batch_limits(FakeTranslator(), **{field: value})
    assert str(info.value) == message


async def test_at_most_max_concurrency_batches_run_at_once() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with running(fake, max_batch_size=1, max_wait_ms=0, max_concurrency=2) as b:
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(5)]
        await wait_until(lambda: len(fake.calls) == 2)
        await asyncio.sleep(0.05)
        assert len(fake.calls) == 2  # two in flight, held by the gate; three wait
        assert b.queue_size == 3
        gate.set()
        await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
    assert sizes(fake) == [1] * 5


async def test_backend_concurrency_is_also_bounded_at_one() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    async with running(fake, max_batch_size=1, max_wait_ms=0, max_concurrency=1) as b:
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(3)]
        await wait_until(lambda: len(fake.calls) == 1)
        await asyncio.sleep(0.05)
        assert len(fake.calls) == 1
        gate.set()
        await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
    assert len(fake.calls) == 3


async def test_metrics_count_batches_and_queue_depth() -> None:
    fake = FakeTranslator()
    async with running(fake, max_batch_size=3, max_wait_ms=10_000) as b:
        registry = b.metrics.registry
        futures = [b.submit(work(f"t{i}", None, "fr")) for i in range(2)]
        assert registry.get_sample_value("thinktrans_queue_depth", {"backend": "fake"}) == 2
        futures.append(b.submit(work("t2", None, "fr")))
        await asyncio.wait_for(asyncio.gather(*futures), HANG_S)
        assert registry.get_sample_value("thinktrans_batch_size_count", {"backend": "fake"}) == 1
        assert registry.get_sample_value("thinktrans_batch_size_sum", {"backend": "fake"}) == 3
        assert registry.get_sample_value("thinktrans_queue_depth", {"backend": "fake"}) == 0
        assert registry.get_sample_value(
            "thinktrans_batch_duration_seconds_count", {"backend": "fake"}
        ) == 1


# -- a property: whatever is submitted, each caller gets its own answer ------------------------


_items = st.lists(
    st.tuples(
        st.sampled_from([(None, "zh-CN"), ("en", "zh-CN"), ("de", "ja")]),
        st.text(alphabet="abcxyz ", min_size=0, max_size=12),
        st.booleans(),  # cancel it
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=_items, batch_size=st.integers(1, 6), batch_chars=st.integers(1, 30),
       concurrency=st.integers(1, 3))
def test_every_live_item_gets_its_own_answer_in_well_formed_batches(
    items: list[tuple[tuple[str | None, str], str, bool]],
    batch_size: int,
    batch_chars: int,
    concurrency: int,
) -> None:
    async def scenario() -> None:
        fake = FakeTranslator()
        limits = {"max_batch_size": batch_size, "max_batch_chars": batch_chars,
                  "max_wait_ms": 1, "max_concurrency": concurrency}
        async with running(fake, **limits) as b:
            futures = []
            for i, ((source, target), text, cancel) in enumerate(items):
                future = b.submit(work(f"{i}:{text}", source, target))
                if cancel:
                    future.cancel()
                futures.append(future)
            await asyncio.wait_for(asyncio.wait(futures), HANG_S)
        sent = []
        for call in fake.calls:
            assert 1 <= len(call.texts) <= batch_size
            assert len(call.texts) == 1 or sum(map(len, call.texts)) <= batch_chars
            for text in call.texts:
                i = int(text.split(":")[0])
                assert items[i][0] == (call.source, call.target)
                sent.append(i)
        assert len(sent) == len(set(sent))  # nothing sent twice
        for i, (((_, target), text, cancel), future) in enumerate(
            zip(items, futures, strict=True)
        ):
            if cancel:
                assert future.cancelled()
                assert i not in sent
            else:
                assert future.result().text == f"<{target}>{i}:{text}"

    asyncio.run(scenario())


async def test_cancelled_items_free_their_queue_space() -> None:
    gate = asyncio.Event()
    fake = FakeTranslator(gate=gate)
    b = Batcher(fake, batch_limits(fake, max_queue_size=2, max_wait_ms=0, max_batch_size=1),
                Metrics())
    await b.start()
    try:
        first = b.submit(work("a", "en", "de"))
        await asyncio.wait_for(fake.started.wait(), HANG_S)
        abandoned = [b.submit(work("b", "en", "de")), b.submit(work("c", "en", "de"))]
        for future in abandoned:
            future.cancel()
        await asyncio.sleep(0)  # their done callbacks give the places back
        assert b.queue_size == 0
        third = b.submit(work("d", "en", "de"))  # would be Overloaded if cancelled items held space
        gate.set()
        assert (await first).text == "<de>a"
        assert (await third).text == "<de>d"
        assert all(c.texts != ["b"] and c.texts != ["c"] for c in fake.calls)
    finally:
        await b.stop()


def test_nan_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_wait_ms"):
        batch_limits(FakeTranslator(), max_wait_ms=float("nan"))
    with pytest.raises(ValueError, match="timeout_s"):
        batch_limits(FakeTranslator(), timeout_s=float("nan"))


# -- deadlines, for backends that take them (the pool) ---------------------------------------


@dataclass
class DeadlineFake(FakeTranslator):
    deadlines: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.capabilities = Capabilities(deadline=True, checked_output=False)

    async def run(self, job: Job) -> list[str]:
        self.deadlines.append(job.seconds_left())
        return await super().run(job)


async def test_a_backend_that_takes_deadlines_gets_the_time_until_its_last_item_is_due() -> None:
    fake = DeadlineFake()
    async with running(fake, max_wait_ms=20) as batcher:
        now = time.monotonic()
        await gather_all([batcher.submit(work("a", "en", "de", due=now + 1.0)),
                          batcher.submit(work("b", "en", "de", due=now + 2.0))])
        await gather_all([batcher.submit(work("c", "en", "de", due=now + 1.0)),
                          batcher.submit(work("d", "en", "de"))])  # one without a deadline
    assert sizes(fake) == [2, 2]
    first, second = fake.deadlines
    assert first is not None and 1.5 < first <= 2.0
    assert second is None


async def test_late_work_and_unserved_pairs_do_not_open_the_breaker() -> None:
    fake = FakeTranslator(answers=deque([Expired("late"), UnsupportedLanguage("no pair"),
                                         Expired("late again")]))
    async with running(fake, breaker_failures=1) as batcher:
        for text in ("a", "b", "c"):
            [error] = await gather_all([batcher.submit(work(text, "en", "de"))])
            assert isinstance(error, Expired | UnsupportedLanguage)
        assert batcher.available()
        fake.answers.append(BackendError("a real failure"))
        await gather_all([batcher.submit(work("d", "en", "de"))])
        assert not batcher.available()
