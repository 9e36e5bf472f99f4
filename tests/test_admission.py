"""Admission on its own, against fake queues: the room, the uncut text, 413/503."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from service.exceptions import Overloaded, PayloadTooLarge
from service.stream.admission import Admission, StreamAdmission


class FakeQueues:
    """A chain's queues: ``free`` places now, at most ``bound`` ever; counts lookups."""

    def __init__(self, free: int, bound: int | None = 1000) -> None:
        self.free = free
        self.bound = bound
        self.lookups = 0

    def room(self, chain: Sequence[str]) -> int:
        self.lookups += 1
        return self.free

    def queue_bound(self, chain: Sequence[str]) -> int | None:
        return self.bound


class Stream:
    """What a stream gives its admission: pending text, and a cut that queues it."""

    def __init__(self, queues: FakeQueues, admission: Admission, unfed: int = 0) -> None:
        self.queues, self.admission = queues, admission
        self.pending = 0
        self.unfed = unfed  # accepted and counted uncut, not cut yet
        self.cuts = 0
        self.way_in: StreamAdmission = admission.stream(["fake"], lambda: self.pending,
                                                         self.cut)

    async def cut(self) -> None:
        """Each uncut character becomes one segment in the queue (the worst case)."""
        self.cuts += 1
        self.admission.cut(self.unfed)
        self.queues.free -= self.unfed
        self.unfed = 0

    async def offer(self, chars: int, seq: int) -> None:
        """As a stream offers one chunk: the slack first, the lookup only past it."""
        if not self.way_in.take(chars):
            await self.way_in.make_room(chars, seq)
        self.admission.accepted(chars)
        self.unfed += chars


def test_uncut_text_takes_a_place_per_character_until_cut() -> None:
    queues = FakeQueues(free=100)
    admission = Admission(queues)
    admission.accepted(30)
    assert admission.uncut == 30 and admission.free(["fake"]) == 70
    admission.cut(25)
    assert admission.uncut == 5 and admission.free(["fake"]) == 95


def test_check_room_refuses_a_one_shot_request_before_anything_is_queued() -> None:
    queues = FakeQueues(free=10, bound=50)
    admission = Admission(queues)
    admission.check_room(["fake"], 10)
    with pytest.raises(PayloadTooLarge, match="THINKTRANS_MAX_QUEUE_SIZE=50"):
        admission.check_room(["fake"], 51)  # more than a queue ever holds: 413
    admission.accepted(4)  # text a stream accepted and has not cut counts too
    with pytest.raises(Overloaded, match="room for 6 segments") as exc:
        admission.check_room(["fake"], 7)
    assert exc.value.retry_after_s == 1
    admission.check_room(["fake"], 0)  # nothing to queue: never refused
    Admission(FakeQueues(free=0, bound=None)).check_room(["gone"], 5)  # no such queue


async def test_one_lookup_per_request_while_the_room_covers_it() -> None:
    queues = FakeQueues(free=1000)
    stream = Stream(queues, Admission(queues))
    stream.way_in.look_again()  # a new request
    for seq in range(10):
        await stream.offer(50, seq)
    assert queues.lookups == 1
    assert stream.cuts == 0
    stream.way_in.look_again()  # the next request looks again
    await stream.offer(50, 10)
    assert queues.lookups == 2


async def test_near_the_bound_the_waiting_text_is_cut_first_and_counted_exactly() -> None:
    queues = FakeQueues(free=100)
    admission = Admission(queues)
    stream = Stream(queues, admission)
    stream.way_in.look_again()
    for seq in range(4):
        await stream.offer(20, seq)  # 80 of the 100 places, uncut
    assert stream.cuts == 0
    await stream.offer(30, 4)  # past the slack: its waiting text is cut first; 20 left
    assert stream.cuts == 1 and admission.uncut == 30 and queues.free == 20
    with pytest.raises(Overloaded) as exc:
        await stream.offer(1, 5)  # counted exactly: its 30 uncut are cut, no room is left
    assert stream.cuts == 2 and admission.uncut == 0
    assert queues.free == -10  # past the bound by less than one chunk's segments
    assert "through seq 4 were accepted, resend from seq 5" in exc.value.detail
    assert exc.value.retry_after_s == 1


async def test_pending_text_of_the_stream_counts_against_its_room() -> None:
    queues = FakeQueues(free=100)
    stream = Stream(queues, Admission(queues))
    stream.pending = 95  # in its segmenter: may still become segments
    stream.way_in.look_again()
    await stream.offer(10, 0)  # 100 - 95 - 10 < 0: cut first (then any room takes it)
    assert stream.cuts == 1


async def test_text_uncut_in_other_streams_counts_against_everyone() -> None:
    queues = FakeQueues(free=100)
    admission = Admission(queues)
    one, other = Stream(queues, admission), Stream(queues, admission)
    one.way_in.look_again()
    await one.offer(100, 0)  # all the room, uncut
    other.way_in.look_again()
    with pytest.raises(Overloaded):
        await other.offer(1, 0)  # cutting its own text (none) leaves no room
    assert other.cuts == 1 and one.cuts == 0
