"""The pool's fair engine turns (``pool.fair``), its clients' identity, caps and counts
(``pool.clients``), the pool backend's hold on a 429 over its cap (``models.pooled``)
and the chain serving past it (``service.chain.batcher``): no Ray, no network, no sleeps."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import models.pooled
from models.errors import BackendUnavailable, RateLimited, Throttled
from models.passthrough import PassthroughTranslator
from models.pooled import MAX_HOLD_S, PoolTranslator
from pool.clients import Unauthorized
from pool.fair import FairQueue, Slice, Unit, shares
from pool.lanes import Lanes
from service.chain.batching import Cutoff, Pair
from service.exceptions import Forbidden, OverCap
from tests.configs import clients as make_clients
from tests.configs import fair_queue, pool_config
from tests.conftest import Running, make_settings, start_app
from tests.fakes import FakeTranslator

# -- fair turns: a call as the queue holds it ---------------------------------------------------


@dataclass(eq=False)  # compared by identity, as the queue compares its items
class Call:
    """One call waiting for engine turns: whose it is, its texts' characters, when queued."""

    client: str
    sizes: list[int]
    enqueued: float
    due: float | None = None
    pair: Pair = (None, "de", None)
    given_up: bool = False
    queued: bool = False
    taken: int = 0

    def gone(self) -> bool:
        return self.given_up


class Sender:
    """Pushes calls into a queue, each queued after the one before (``enqueued`` 0, 1, ...)."""

    def __init__(self, queue: FairQueue[Call]) -> None:
        self.queue = queue
        self.clock = 0.0

    def push(self, client: str, sizes: Sequence[int], *, due: float | None = None,
             given_up: bool = False) -> Call:
        call = Call(client, list(sizes), self.clock, due=due, given_up=given_up)
        self.clock += 1.0
        self.queue.push(call)
        return call

    def flood(self, client: str, calls: int, sizes: Sequence[int]) -> list[Call]:
        return [self.push(client, sizes) for _ in range(calls)]


def pieces(turn: Sequence[Slice[Call]]) -> list[tuple[Call, int, int]]:
    return [(piece.item, piece.start, piece.end) for piece in turn]


def texts_of(turn: Sequence[Slice[Call]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for piece in turn:
        out[piece.item.client] += piece.end - piece.start
    return out


def chars_of(turn: Sequence[Slice[Call]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for piece in turn:
        out[piece.item.client] += sum(piece.item.sizes[piece.start:piece.end])
    return out


def turns(queue: FairQueue[Call], count: int, max_texts: int, max_chars: int = sys.maxsize
          ) -> tuple[Counter[str], Counter[str], list[int]]:
    """``count`` turns: the texts and characters each client got, and each turn's texts."""
    texts: Counter[str] = Counter()
    chars: Counter[str] = Counter()
    sizes = []
    for _ in range(count):
        turn = queue.take(max_texts, max_chars)
        texts.update(texts_of(turn))
        chars.update(chars_of(turn))
        sizes.append(sum(piece.end - piece.start for piece in turn))
    return texts, chars, sizes


# -- fair turns: one client ----------------------------------------------------------------------


def test_a_client_alone_gets_whole_turns_and_a_call_too_big_for_one_is_split() -> None:
    """A client alone takes all a turn has room for (its text bound, its character bound,
    across its calls); a call that does not fit runs in several turns, ``taken`` counting its
    texts so far and ``Slice.last`` set only on the slice that ends it."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    assert queue.take(8) == []  # nothing waits: an empty turn
    first = send.push("a", [10] * 5)
    turn = queue.take(3)
    assert pieces(turn) == [(first, 0, 3)]
    assert not turn[0].last
    assert first.taken == 3 and first.queued and len(queue) == 1
    turn = queue.take(3)
    assert pieces(turn) == [(first, 3, 5)]
    assert turn[0].last
    assert first.taken == 5 and not first.queued and len(queue) == 0
    assert queue.clients() == [] and queue.deficit("a") == 0.0

    calls = send.flood("a", 3, [10] * 3)  # the text bound, across calls
    turn = queue.take(8)
    assert pieces(turn) == [(calls[0], 0, 3), (calls[1], 0, 3), (calls[2], 0, 2)]
    assert [piece.last for piece in turn] == [True, True, False]
    assert len(queue) == 1
    assert pieces(queue.take(8)) == [(calls[2], 2, 3)]

    mixed = send.push("a", [5, 50] * 5)  # of sizes that differ: still the whole text bound
    assert pieces(queue.take(8)) == [(mixed, 0, 8)]
    assert pieces(queue.take(8)) == [(mixed, 8, 10)]

    by_chars = send.push("a", [10] * 5)  # the character bound: 20 of 25, a third is 30
    assert pieces(queue.take(10, 25)) == [(by_chars, 0, 2)]
    assert by_chars.taken == 2
    assert pieces(queue.take(10, 25)) == [(by_chars, 2, 4)]

    huge = send.push("a", [100, 10])  # a turn's first text goes whatever its size, alone
    queue.take(10, 25)  # the rest of by_chars
    assert pieces(queue.take(10, 25)) == [(huge, 0, 1)]
    assert pieces(queue.take(10, 25)) == [(huge, 1, 2)]
    assert len(queue) == 0


def test_a_call_taken_in_two_steps_of_one_turn_comes_as_one_slice() -> None:
    """A call whose texts a turn takes first within its client's share, then from the room
    left over, is one slice ``start:end``, not two."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    small = send.push("a", [100, 100, 100])
    big = send.push("b", [300])  # more than its share (200): not in this turn
    turn = queue.take(100, 400)
    assert pieces(turn) == [(small, 0, 3)]
    assert turn[0].last
    assert pieces(queue.take(100, 400)) == [(big, 0, 1)]


# -- fair turns: shared between clients -------------------------------------------------------


@pytest.mark.parametrize("unit", ["characters", "segments"])
def test_a_light_client_runs_in_the_first_turn_beside_a_flood(unit: Unit) -> None:
    """A client with one one-text call waiting behind a flood of another's calls gets its
    text into the very next turn, and the flood fills the rest: no room left empty while work
    waits."""
    queue: FairQueue[Call] = fair_queue(pool_fair_unit=unit)
    send = Sender(queue)
    flood = send.flood("flood", 10, [10] * 4)
    light = send.push("light", [10])
    turn = queue.take(8)
    assert texts_of(turn) == {"light": 1, "flood": 7}
    assert pieces(turn) == [(flood[0], 0, 4), (flood[1], 0, 3), (light, 0, 1)]
    assert not light.queued and queue.clients() == ["flood"]


def test_a_turns_slices_are_ordered_oldest_first_whatever_order_they_were_taken_in() -> None:
    """A turn serves the client wanting least first, but hands its slices back oldest call
    first (by ``enqueued``)."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    older = send.flood("flood", 3, [10, 10])
    newest = send.push("light", [10])  # served first: it wants least
    turn = queue.take(4)
    assert [piece.item for piece in turn] == [older[0], older[1], newest]
    assert [piece.item.enqueued for piece in turn] == [0.0, 1.0, 3.0]


def test_ties_take_turns() -> None:
    """Clients wanting as much as each other, each owed enough for a text, take turns at
    turns with room for one of them (two texts, but one text's characters): the first of
    them goes last in the next turn."""
    queue: FairQueue[Call] = fair_queue(pool_fair_unit="segments")
    send = Sender(queue)
    for _ in range(10):  # both want a whole turn throughout
        send.push("a", [10])
        send.push("b", [10])
    order = [[piece.item.client for piece in queue.take(2, 10)] for _ in range(8)]
    assert order == [["a"], ["b"], ["a"], ["b"], ["a"], ["b"], ["a"], ["b"]]


@pytest.mark.parametrize("unit", ["characters", "segments"])
def test_two_floods_of_equal_weight_get_half_the_texts_each(unit: Unit) -> None:
    """Two clients each with a flood of like calls share the turns evenly: over 20 turns
    each gets half their texts, within one turn's worth, and every turn is full."""
    queue: FairQueue[Call] = fair_queue(pool_fair_unit=unit)
    send = Sender(queue)
    for _ in range(100):
        send.push("a", [10] * 4)
        send.push("b", [10] * 4)
    texts, _, sizes = turns(queue, 20, max_texts=8)
    assert sizes == [8] * 20
    assert abs(texts["a"] - 80) <= 8 and abs(texts["b"] - 80) <= 8


@pytest.mark.parametrize("unit", ["characters", "segments"])
def test_weights_three_to_one_get_three_to_one(unit: Unit) -> None:
    """With weights 3 and 1, two floods get three quarters and one quarter of the texts."""
    weights = {"heavy": 3.0, "light": 1.0}
    queue: FairQueue[Call] = fair_queue(weights.__getitem__, pool_fair_unit=unit)
    send = Sender(queue)
    for _ in range(100):
        send.push("heavy", [10] * 4)
        send.push("light", [10] * 4)
    texts, _, sizes = turns(queue, 20, max_texts=8)
    assert sizes == [8] * 20
    assert abs(texts["heavy"] - 120) <= 8 and abs(texts["light"] - 40) <= 8


def test_characters_share_characters_not_texts() -> None:
    """In characters, a client with long texts (40) and one with short ones (20, still over
    a text's place in the turn, 240 / 16 = 15) get about equal characters when the turn's
    character bound binds: two short texts to a long one, every turn full."""
    queue: FairQueue[Call] = fair_queue(pool_fair_unit="characters")
    send = Sender(queue)
    for _ in range(100):
        send.push("long", [40] * 4)
        send.push("short", [20] * 4)
    texts, chars, _ = turns(queue, 20, max_texts=16, max_chars=240)
    assert sum(chars.values()) == 20 * 240  # every turn full
    assert abs(chars["long"] - chars["short"]) <= 240
    assert texts["short"] >= 1.8 * texts["long"]


def test_texts_under_their_place_in_the_turn_cost_their_place() -> None:
    """With the pool's own kind of limits (32 texts, 32000 characters a turn) the text bound
    binds first: a text of 40 or of 10 characters takes one of the 32 places all the same
    (it costs 1000, the turn's characters over its texts), so two floods of short and of
    shorter texts get equal texts, and every turn is full."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    for _ in range(200):
        send.push("long", [40] * 8)
        send.push("short", [10] * 8)
    texts, _, sizes = turns(queue, 40, max_texts=32, max_chars=32_000)
    assert sizes == [32] * 40
    assert abs(texts["long"] - texts["short"]) <= 32, texts


def test_a_client_with_long_texts_is_not_starved_by_one_with_many_short_ones() -> None:
    """A client with one call of long texts waiting beside a client that keeps 200 short
    texts waiting (topped up after each turn, in calls of 32) gets some of its texts run
    within 20 turns of 32 texts and 32000 characters."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    long = send.push("long", [2000] * 10)
    shorts: list[Call] = []

    def top_up() -> None:
        while sum(len(c.sizes) - c.taken for c in shorts if c.queued) < 200:
            shorts.append(send.push("short", [20] * 32))

    top_up()
    for _ in range(20):
        queue.take(32, 32_000)
        top_up()
    assert long.taken > 0


def test_a_text_larger_than_a_share_runs_once_its_deficit_has_grown_to_it() -> None:
    """A text larger than its client's share of one turn waits while its deficit grows
    (carried from turn to turn), then runs: no starvation. Once its client's queue is empty
    its deficit is cleared and it leaves ``clients()``."""
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    big = send.push("big", [300])  # its share of a 400-character turn is 200
    flood = send.flood("flood", 20, [100, 100])
    turn = queue.take(100, 400)
    assert pieces(turn) == [(flood[0], 0, 2), (flood[1], 0, 2)]  # the turn is full all the same
    assert queue.deficit("big") == 200.0  # owed, carried
    assert queue.deficit("flood") == -200.0  # the room left over, charged to it
    assert sorted(queue.clients()) == ["big", "flood"]
    turn = queue.take(100, 400)
    assert pieces(turn) == [(big, 0, 1), (flood[2], 0, 1)]
    assert queue.deficit("big") == 0.0  # it had 400 - 300 = 100 left: cleared with its queue
    assert queue.clients() == ["flood"]


def test_the_deficit_never_exceeds_one_turns_room() -> None:
    """A client kept from its share turn after turn (in segments: eight texts a turn, but
    only two of its 50-character texts fit the 100-character bound) banks at most one turn's
    room (8) of credit, and reaches that cap."""
    queue: FairQueue[Call] = fair_queue(pool_fair_unit="segments")
    send = Sender(queue)
    for _ in range(100):
        send.push("long", [50, 50])
        send.push("short", [5, 5])
    seen: list[float] = []
    for _ in range(20):
        queue.take(8, 100)
        seen += [queue.deficit("long"), queue.deficit("short")]
        assert queue.deficit("long") <= 8.0 and queue.deficit("short") <= 8.0
    assert max(seen) == 8.0  # the cap binds: without it the credit would keep growing
    assert min(seen) >= -8.0  # and the debt is at most one turn too


def test_without_fairness_the_oldest_calls_go_first_whoever_sent_them() -> None:
    """``fair=False``: a turn takes calls oldest first by ``enqueued``, across clients, and
    splits the call that does not fit whole, its rest going first in the next turn."""
    queue: FairQueue[Call] = fair_queue(pool_fair=False)
    send = Sender(queue)
    a0 = send.push("a", [10, 10])
    b1 = send.push("b", [10])
    a2 = send.push("a", [10, 10, 10])
    b3 = send.push("b", [10])
    turn = queue.take(4)
    assert pieces(turn) == [(a0, 0, 2), (b1, 0, 1), (a2, 0, 1)]
    assert [piece.last for piece in turn] == [True, True, False]
    assert pieces(queue.take(4)) == [(a2, 1, 3), (b3, 0, 1)]
    flood = send.flood("flood", 3, [10] * 4)  # a flood first: it is oldest, it all goes
    light = send.push("light", [10])
    assert pieces(queue.take(8)) == [(flood[0], 0, 4), (flood[1], 0, 4)]
    assert pieces(queue.take(8)) == [(flood[2], 0, 4), (light, 0, 1)]


def test_given_up_and_late_calls_are_dropped_answered_and_never_run() -> None:
    """Calls given up (``gone()``) or past due at the cutoff's ``now`` leave the queue unrun,
    each handed to its handler (``gone``, ``expired``), take no room, and ``len()`` counts
    them out; without a cutoff only the given-up ones are dropped."""
    expired: list[Call] = []
    given_up: list[Call] = []
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    quit_ = send.push("a", [10], given_up=True)
    late = send.push("b", [10], due=5.0)  # due by now: late
    on_time = send.push("c", [10], due=6.0)
    no_deadline = send.push("d", [10])
    assert len(queue) == 4
    turn = queue.take(2, cutoff=Cutoff(5.0, expired=expired.append, gone=given_up.append))
    assert pieces(turn) == [(on_time, 0, 1), (no_deadline, 0, 1)]  # both fit: no room lost
    assert expired == [late] and given_up == [quit_]
    assert len(queue) == 0 and queue.clients() == []
    assert not quit_.queued and not late.queued and late.taken == 0 and quit_.taken == 0

    unanswered = send.push("a", [10], given_up=True)
    overdue = send.push("b", [10], due=1.0)
    assert len(queue) == 2
    assert pieces(queue.take(4)) == [(overdue, 0, 1)]  # no cutoff: past due still runs
    assert len(queue) == 0 and not unanswered.queued and unanswered.taken == 0

    undated = send.push("a", [10], due=1.0)  # past due, but this cutoff has no time
    dropped = send.push("b", [10])
    dropped.given_up = True  # given up while it waited
    handed: list[Call] = []
    assert pieces(queue.take(4, cutoff=Cutoff(gone=handed.append))) == [(undated, 0, 1)]
    assert handed == [dropped] and len(queue) == 0


def test_a_late_call_behind_another_of_its_client_is_dropped() -> None:
    """A call past due queued behind another call of the same client, met by the same turn,
    is dropped and handed to ``expired``, not taken."""
    expired: list[Call] = []
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    first = send.push("a", [10])
    late = send.push("a", [10], due=1.0)
    turn = queue.take(4, cutoff=Cutoff(5.0, expired=expired.append))
    assert pieces(turn) == [(first, 0, 1)]
    assert expired == [late]


def test_a_given_up_call_behind_another_of_its_client_is_handed_to_gone() -> None:
    """A call given up behind another call of the same client, met by the same turn, is
    handed to the cutoff's ``gone``."""
    given_up: list[Call] = []
    expired: list[Call] = []
    queue: FairQueue[Call] = fair_queue()
    send = Sender(queue)
    first = send.push("a", [10])
    quit_ = send.push("a", [10], given_up=True)
    turn = queue.take(4, cutoff=Cutoff(5.0, expired=expired.append, gone=given_up.append))
    assert pieces(turn) == [(first, 0, 1)]
    assert given_up == [quit_]


def test_without_fairness_a_given_up_call_behind_another_is_not_taken() -> None:
    """``fair=False``: a call given up behind another call of the same client is dropped,
    not run."""
    queue: FairQueue[Call] = fair_queue(pool_fair=False)
    send = Sender(queue)
    first = send.push("a", [10])
    send.push("a", [10], given_up=True)
    assert pieces(queue.take(4)) == [(first, 0, 1)]


def test_shares_meet_small_demands_and_split_the_rest_by_weight() -> None:
    """``shares``: a client wanting less than its weighted share gets what it wants, the
    others split what is left by weight, never more than they want, and the total never
    passes the capacity."""
    even = shares(10, {"small": 2, "a": 10, "b": 10}, lambda c: 1.0)
    assert even == pytest.approx({"small": 2.0, "a": 4.0, "b": 4.0})
    weights = {"small": 1.0, "heavy": 2.0, "light": 1.0}
    weighted = shares(12, {"small": 1, "heavy": 100, "light": 100}, weights.__getitem__)
    assert weighted == pytest.approx({"small": 1.0, "heavy": 22 / 3, "light": 11 / 3})
    # The heavy one wants less than its two thirds: the light one gets the rest.
    capped = shares(12, {"heavy": 5, "light": 100}, weights.__getitem__)
    assert capped == pytest.approx({"heavy": 5.0, "light": 7.0})
    under = shares(100, {"a": 10, "b": 20, "idle": 0}, lambda c: 1.0)
    assert under == {"a": 10.0, "b": 20.0, "idle": 0.0}  # all met, capacity to spare
    assert shares(10, {}, lambda c: 1.0) == {}
    for capacity, demand in ((7, {"a": 3, "b": 9, "c": 1}), (5, {"a": 100, "b": 100}),
                             (1, {"a": 0.5, "b": 0.7, "c": 0.9})):
        out = shares(capacity, demand, lambda c: weights.get(c, 1.0))
        assert sum(out.values()) <= capacity + 1e-9
        assert all(out[c] <= demand[c] + 1e-9 for c in demand)


# -- the lanes: segment calls, then previews ---------------------------------------------------


def test_previews_run_only_while_no_segment_call_waits_or_is_on_its_way() -> None:
    """A turn takes the segment calls while any wait, whenever they came; preview calls only
    once none waits, and not while one the route admitted is still on its way."""
    lanes: Lanes[Call] = Lanes(fair=True, unit="characters", weight=lambda client: 1.0)
    preview, segment = Call("a", [10], 0.0), Call("b", [10], 1.0)
    lanes.push(preview, preview=True)
    lanes.push(segment, preview=False)
    assert len(lanes) == 2 and lanes.ready()
    taken, stop = lanes.take(8)
    assert pieces(taken) == [(segment, 0, 1)] and stop is None
    lanes.expect()  # admitted, in Serve's batch wait
    assert not lanes.ready()
    assert lanes.take(8) == ([], None)
    lanes.arrived()  # never came (given up): the preview may run
    assert lanes.ready()
    taken, stop = lanes.take(8)
    assert pieces(taken) == [(preview, 0, 1)] and stop is not None and not stop.is_set()
    assert lanes.preview_running and not lanes.ready() and not lanes
    lanes.finished(stop)
    assert not lanes.preview_running


@pytest.mark.parametrize("how", ["expected", "queued", "given up"])
def test_a_running_preview_turn_is_told_to_stop(how: str) -> None:
    """A preview turn's stop signal is set when a segment call is expected or queued, or
    when every call it took has been given up; not by another preview."""
    lanes: Lanes[Call] = Lanes(fair=False, unit="segments", weight=lambda client: 1.0)
    first, second = Call("a", [5], 0.0), Call("b", [5], 1.0)
    lanes.push(first, preview=True)
    lanes.push(second, preview=True)
    taken, stop = lanes.take(8)
    assert len(taken) == 2 and stop is not None
    lanes.push(Call("c", [5], 2.0), preview=True)
    first.given_up = True
    lanes.given_up()
    assert not stop.is_set()  # the second is still wanted
    if how == "expected":
        lanes.expect()
    elif how == "queued":
        lanes.push(Call("d", [5], 3.0), preview=False)
    else:
        second.given_up = True
        lanes.given_up()
    assert stop.is_set()
    lanes.finished(stop)
    lanes.expect()  # no turn runs: nothing to stop
    assert not lanes.preview_running


# -- the pool's clients ---------------------------------------------------------------------


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_without_tokens_any_caller_is_let_in_under_the_name_it_gives() -> None:
    """No shared token, no client tokens: ``owner`` is None whatever the header, and a call
    counts as the client it names ("unnamed" for none)."""
    clients = make_clients()
    assert not clients.auth_required
    for header in ("", "Bearer whatever", "Basic x"):
        assert clients.owner(header) is None
    assert clients.identify(None, "sidecar-1") == "sidecar-1"
    assert clients.identify(None, "") == "unnamed"


def test_tokens_decide_who_a_call_counts_as() -> None:
    """A client's own token makes a call that client's whatever it names; the shared token
    lets a call use any name but one with a token of its own (403); any other token, or
    none, is refused."""
    clients = make_clients(pool_clients={"alice": {"token": "alice-token"},
                                         "carol": {"weight": 2.0}}, shared_sha256=sha("shared"))
    assert clients.auth_required
    assert clients.owner("Bearer alice-token") == "alice"
    assert clients.owner("bearer  alice-token ") == "alice"  # the scheme in any case
    assert clients.identify("alice", "bob") == "alice"
    assert clients.identify("alice", "") == "alice"
    assert clients.owner("Bearer shared") is None
    with pytest.raises(Forbidden, match="alice"):
        clients.identify(None, "alice")
    assert clients.identify(None, "bob") == "bob"
    assert clients.identify(None, "carol") == "carol"  # named in the config, no token
    assert clients.identify(None, "") == "unnamed"
    for header in ("Bearer wrong", "", "Bearer ", "Basic shared", "shared"):
        with pytest.raises(Unauthorized):
            clients.owner(header)
    assert clients.weight("carol") == 2.0 and clients.weight("bob") == 1.0


def test_with_client_tokens_only_their_holders_may_call() -> None:
    """With client tokens and no shared token, a call without one of them is refused."""
    clients = make_clients(pool_clients={"alice": {"token": "alice-token"}})
    assert clients.auth_required
    assert clients.owner("Bearer alice-token") == "alice"
    for header in ("Bearer shared", ""):
        with pytest.raises(Unauthorized):
            clients.owner(header)


def test_admission_counts_waiting_segments_up_to_the_cap() -> None:
    """A client may have its cap of segments waiting; a call past it is refused with
    ``OverCap``, retry after ``max(1, ceil(waiting * pace))`` s, and counted refused; an
    answered call frees its room; a client's own ``max_waiting`` overrides the default."""
    clients = make_clients(pool_clients={"big": {"max_waiting": 20}}, pool_client_max_waiting=10)
    assert clients.cap("a") == 10 and clients.cap("big") == 20
    clients.admit("a", 6, 0.5)
    assert clients.counts["a"].waiting_segments == 6
    with pytest.raises(OverCap) as refused:
        clients.admit("a", 5, 0.5)
    assert refused.value.retry_after_s == 3  # ceil(6 * 0.5)
    with pytest.raises(OverCap) as refused:
        clients.admit("a", 5, 0.01)
    assert refused.value.retry_after_s == 1  # ceil(0.06)
    clients.admit("empty", 11, 0.5)  # more than its cap, with none waiting: one call goes
    with pytest.raises(OverCap) as refused:
        clients.admit("empty", 1, 0.0)
    assert refused.value.retry_after_s == 1  # ceil(0) = 0, but never under 1
    counts = clients.counts["a"]
    assert (counts.refused_calls, counts.refused_segments, counts.waiting_segments) == (2, 10, 6)
    clients.admit("a", 4, 0.5)  # exactly to the cap
    assert counts.waiting_segments == 10 and counts.calls == 2 and counts.segments == 10
    clients.release("a", 6)
    assert counts.waiting_segments == 4
    clients.admit("a", 6, 0.5)
    assert counts.waiting_segments == 10
    clients.release("a", 100)  # never below none
    assert counts.waiting_segments == 0
    clients.admit("big", 15, 0.5)  # its own cap
    clients.admit("other", 5, 0.5)
    with pytest.raises(OverCap):
        clients.admit("other", 6, 0.5)
    with pytest.raises(OverCap) as refused:
        clients.admit("big", 6, 2.0)
    assert refused.value.retry_after_s == 30  # 15 waiting at 2 s each


def test_past_max_clients_the_least_recently_seen_idle_id_is_forgotten() -> None:
    """Past ``max_clients`` ids besides the config's, a new id takes the place of the id
    seen least recently with nothing waiting (``forgotten`` counts them); ids the config
    names are never forgotten and take no place, and while every other id has work waiting a
    new one is refused (``OverCap``)."""
    clients = make_clients(pool_clients={"named": {}}, pool_max_clients=2)
    for client in ("named", "x", "y"):
        clients.admit(client, 1, 0.1)
        clients.release(client, 1)
    clients.admit("x", 1, 0.1)  # seen again: y is now the least recent of the others
    clients.release("x", 1)
    clients.admit("z", 1, 0.1)
    assert list(clients.counts) == ["named", "x", "z"] and clients.forgotten == 1
    clients.admit("w", 1, 0.1)  # named is least recent, but never forgotten: x goes
    assert list(clients.counts) == ["named", "z", "w"] and clients.forgotten == 2
    with pytest.raises(OverCap) as refused:  # z and w have work waiting
        clients.admit("v", 1, 0.1)
    assert refused.value.retry_after_s == 1 and "pool_max_clients" in str(refused.value)
    assert "v" not in clients.counts and clients.forgotten == 2
    clients.release("z", 1)
    clients.admit("v", 1, 0.1)
    assert list(clients.counts) == ["named", "w", "v"] and clients.forgotten == 3


def test_a_configured_client_always_has_its_place() -> None:
    """Callers with the shared token naming many ids, each with work waiting, fill the
    places of ``max_clients``: a new id of theirs is refused, but a client the config names,
    with its own token or without, is admitted, and forgets none of theirs."""
    clients = make_clients(pool_clients={"alice": {"token": "alice-token"}, "carol": {}},
                           pool_max_clients=3, shared_sha256=sha("shared"))
    for i in range(3):
        clients.admit(clients.identify(clients.owner("Bearer shared"), f"spam-{i}"), 1, 0.1)
    with pytest.raises(OverCap, match="pool_max_clients"):
        clients.admit("spam-3", 1, 0.1)
    clients.admit(clients.identify(clients.owner("Bearer alice-token"), "any"), 5, 0.1)
    clients.admit(clients.identify(clients.owner("Bearer shared"), "carol"), 2, 0.1)
    assert list(clients.counts) == ["spam-0", "spam-1", "spam-2", "alice", "carol"]
    assert clients.counts["alice"].waiting_segments == 5 and clients.forgotten == 0
    for i in range(3):
        clients.release(f"spam-{i}", 1)
    clients.admit("spam-3", 1, 0.1)  # an idle one of theirs makes room, never the config's
    assert list(clients.counts) == ["spam-1", "spam-2", "alice", "carol", "spam-3"]


def test_a_client_sees_its_own_counts_and_the_shared_token_every_ones() -> None:
    """``view(owner)``: every client's counts for the shared token (None), a client's own
    token its own entry alone (zeroes before its first call)."""
    clients = make_clients(pool_clients={"alice": {"token": "alice-token"},
                                         "dave": {"token": "dave-token"}},
                           shared_sha256=sha("shared"))
    clients.admit("alice", 3, 0.1)
    clients.admit("bob", 2, 0.1)
    assert list(clients.view(clients.owner("Bearer shared"))) == ["alice", "bob"]
    own = clients.view(clients.owner("Bearer alice-token"))
    assert list(own) == ["alice"] and own["alice"]["waiting_segments"] == 3
    fresh = clients.view(clients.owner("Bearer dave-token"))
    assert list(fresh) == ["dave"] and fresh["dave"]["calls"] == 0


class Series:
    """Ray's metrics as ``Clients`` records them: every series set or counted, by tags."""

    def __init__(self) -> None:
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def inc(self, value: float, tags: dict[str, str]) -> None:
        key = tuple(sorted(tags.items()))
        self.values[key] = self.values.get(key, 0.0) + value

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.values[tuple(sorted(tags.items()))] = value

    def clients(self) -> set[str]:
        return {dict(key)["client"] for key in self.values}


def test_the_metrics_series_stay_bounded_however_many_ids_call() -> None:
    """2,000 ids, each seen once: the config's ids and the first ``metrics_max_clients``
    others have series of their own, the rest are summed under ``_other`` (their waiting
    segments too), and an id keeps its label when it comes back after being forgotten."""
    clients = make_clients(pool_clients={"alice": {"token": "alice-token"}},
                           pool_max_clients=16, pool_metrics_max_clients=3)
    segments, waiting = Series(), Series()
    clients.metrics = SimpleNamespace(segments=segments, waiting=waiting)  # type: ignore[assignment]
    clients.admit("alice", 1, 0.1)
    for i in range(2000):
        clients.admit(f"id-{i}", 2, 0.1)
        clients.outcome(f"id-{i}", "translated", 2)
        clients.release(f"id-{i}", 2)
    clients.admit("id-1999", 4, 0.1)
    clients.admit("id-1998", 1, 0.1)
    clients.admit("id-0", 1, 0.1)  # forgotten long ago, back with its own series
    assert segments.clients() == waiting.clients() == {"alice", "id-0", "id-1", "id-2",
                                                       "_other"}
    assert len(segments.values) == 1 + 4 * 2  # alice accepted; the rest also translated
    other = (("client", "_other"),)
    assert waiting.values[other] == 5  # id-1999's 4 and id-1998's 1
    assert segments.values[(("client", "_other"), ("outcome", "translated"))] == 2 * 1997
    assert waiting.values[(("client", "id-0"),)] == 1
    clients.release("id-1999", 4)
    assert waiting.values[other] == 1


def test_outcomes_and_waits_show_in_the_view() -> None:
    """``view()`` shows each client's counts, its queue waits' p50 and p99 (None before
    any), weight and cap; outcomes of none, or of ids not tracked, count nothing."""
    clients = make_clients(pool_clients={"heavy": {"weight": 3.0, "max_waiting": 50}},
                           pool_client_max_waiting=10)
    clients.admit("heavy", 8, 0.1)
    clients.outcome("heavy", "translated", 5)
    clients.outcome("heavy", "expired", 1)
    clients.outcome("heavy", "cancelled", 1)
    clients.outcome("heavy", "failed", 1)
    clients.outcome("heavy", "stopped", 1)
    clients.outcome("heavy", "translated", 0)
    clients.outcome("stranger", "translated", 3)
    clients.waited("stranger", 1.0)
    for ms in range(1, 201):  # 1 .. 200 ms
        clients.waited("heavy", ms / 1000)
    clients.admit("plain", 2, 0.1)
    assert clients.view() == {
        "heavy": {"calls": 1, "segments": 8, "translated_segments": 5, "expired_segments": 1,
                  "cancelled_segments": 1, "failed_segments": 1, "stopped_segments": 1,
                  "refused_calls": 0, "refused_segments": 0, "waiting_segments": 8,
                  "queue_wait_ms": {"p50": 100.5, "p99": 199.0}, "weight": 3.0, "cap": 50},
        "plain": {"calls": 1, "segments": 2, "translated_segments": 0, "expired_segments": 0,
                  "cancelled_segments": 0, "failed_segments": 0, "stopped_segments": 0,
                  "refused_calls": 0, "refused_segments": 0, "waiting_segments": 2,
                  "queue_wait_ms": None,
                  "weight": 1.0, "cap": 10},
    }


# -- the pool backend on a 429 over its cap -----------------------------------------------------

INFO = {"ready": True, "reason": None, "max_batch_size": 8, "engine": "ctranslate2",
        "default_model": "nllb", "models": [], "languages": ["de"], "identity": "abc"}


def over_cap(retry_after: str) -> httpx.Response:
    return httpx.Response(
        429, json={"type": "urn:thinktrans:problem:over-cap", "title": "Over cap",
                   "status": 429, "detail": "client 'me' has 256 segments waiting"},
        headers={"content-type": "application/problem+json", "retry-after": retry_after})


class ScriptedPool:
    """A pool's answers to /v1/batch, one per call, in order (then translations); /v1/info
    answers INFO."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json=INFO)
        body = json.loads(request.content)
        self.calls.append(body)
        if self.answers:
            return self.answers.pop(0)
        return httpx.Response(200, json={"translations": [f"de:{t}" for t in body["texts"]],
                                         "identity": "abc", "model": "nllb"})


class ShiftedTime:
    """``time`` as ``models.pooled`` sees it: the real monotonic clock, ``ahead`` seconds on."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead


async def pool_backend(pool: ScriptedPool) -> PoolTranslator:
    backend = PoolTranslator(pool_config(httpx.MockTransport(pool), pool_url="http://pool",
                                         pool_token="t", pool_client_id="me"))
    await backend.start()
    assert await backend.wait_ready(5)
    return backend


async def test_a_429_over_cap_holds_calls_for_its_retry_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's 429 ``over-cap`` raises ``Throttled`` (a ``RateLimited``) with its
    ``Retry-After``, counts ``throttled``, leaves the backend ready, and until the
    Retry-After has passed every batch raises ``Throttled`` unsent."""
    clock = ShiftedTime()
    monkeypatch.setattr(models.pooled, "time", clock)
    pool = ScriptedPool(over_cap("10"))
    backend = await pool_backend(pool)
    try:
        with pytest.raises(Throttled) as held:
            await backend.translate(["Hi."], source="en", target="de")
        assert isinstance(held.value, RateLimited) and held.value.retry_after_s == 10
        assert backend.ready and backend.info()["throttled"] == 1
        assert len(pool.calls) == 1
        clock.ahead = 5.0  # half of it has passed
        with pytest.raises(Throttled) as held:
            await backend.translate(["Hi."], source="en", target="de")
        assert held.value.retry_after_s == 5  # what is left of it
        assert len(pool.calls) == 1  # held: not sent
        assert backend.info()["throttled"] == 1  # a hold is no new refusal
        assert backend.ready
        clock.ahead = 10.5
        assert await backend.translate(["Hi."], source="en", target="de") == ["de:Hi."]
        assert len(pool.calls) == 2 and backend.ready
    finally:
        await backend.aclose()


async def test_a_retry_after_of_zero_holds_nothing_and_a_long_one_is_bounded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Retry-After of 0 lets the next batch go at once (``retry_after_s`` at least 1); one
    longer than ``MAX_HOLD_S`` holds the calls that long only."""
    clock = ShiftedTime()
    monkeypatch.setattr(models.pooled, "time", clock)
    pool = ScriptedPool(over_cap("0"), over_cap("3600"))
    backend = await pool_backend(pool)
    try:
        with pytest.raises(Throttled) as held:
            await backend.translate(["Hi."], source="en", target="de")
        assert held.value.retry_after_s == 1
        with pytest.raises(Throttled) as held:  # sent: the second answer refuses it
            await backend.translate(["Hi."], source="en", target="de")
        assert held.value.retry_after_s == MAX_HOLD_S == 30
        assert len(pool.calls) == 2 and backend.info()["throttled"] == 2
        clock.ahead = MAX_HOLD_S - 1
        with pytest.raises(Throttled):
            await backend.translate(["Hi."], source="en", target="de")
        assert len(pool.calls) == 2
        clock.ahead = MAX_HOLD_S + 0.5
        assert await backend.translate(["Hi."], source="en", target="de") == ["de:Hi."]
        assert len(pool.calls) == 3 and backend.ready
    finally:
        await backend.aclose()


ENGLISH = "Let me check the total time of the whole hike once more."


async def test_a_throttled_backend_lets_the_chain_serve_and_keeps_its_breaker_closed() -> None:
    """A backend raising ``Throttled`` fails no fault of its own: the next backend in the
    chain serves the segments, and the breaker (opened here by one counted failure) stays
    closed, so the backend is tried again on the next request."""
    fake = FakeTranslator(name_="fake")
    fake.answers.extend(Throttled("held", retry_after_s=1) for _ in range(3))
    backends = {"fake": fake, "passthrough": PassthroughTranslator()}
    settings = make_settings(backend="fake,passthrough", breaker_failures=1,
                             breaker_cooloff_s=60, default_locale="de", max_wait_ms=0)

    async def served_by(app: Running) -> str:
        r = await app.client.post("/v1/translate", json={"texts": [ENGLISH]})
        return str(r.json()["results"][0]["segments"][0]["backend"])

    async for app in start_app(settings, backends):
        for tries in range(1, 4):
            assert await served_by(app) == "passthrough"
            assert len(fake.calls) == tries  # tried each time: its breaker is closed
        fake.answers.append(BackendUnavailable("down"))  # a counted failure opens it
        assert await served_by(app) == "passthrough"
        assert len(fake.calls) == 4
        assert await served_by(app) == "passthrough"
        assert len(fake.calls) == 4  # skipped now
