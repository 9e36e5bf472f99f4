"""The batchers' parts alone (service/chain/batching.py): the grouped queue, the cut-off, the
output check. No event loop, no backend: items are plain records with a clock of their own."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.errors import BadOutput
from service.chain.batching import COMPACT_AFTER, Cutoff, GroupedQueue, Pair, check_outputs

EN_DE: Pair = ("en", "de", None)
EN_FR: Pair = ("en", "fr", None)
EN_DE_BIG: Pair = ("en", "de", "big")


@dataclass(eq=False)
class Item:
    name: str
    pair: Pair = EN_DE
    enqueued: float = 0.0
    weight: int = 1
    due: float | None = None
    given_up: bool = False
    text: str = ""
    queued: bool = False

    @property
    def chars(self) -> int:
        return len(self.text)

    def gone(self) -> bool:
        return self.given_up


def queue_of(*items: Item) -> GroupedQueue[Item]:
    queue: GroupedQueue[Item] = GroupedQueue()
    for item in items:
        queue.push(item)
    return queue


def names(items: list[Item]) -> list[str]:
    return [item.name for item in items]


# -- grouping and order ------------------------------------------------------------------------


def test_a_batch_from_one_group_keeps_its_order_and_leaves_the_others() -> None:
    queue = queue_of(Item("a"), Item("x", EN_FR), Item("b"), Item("y", EN_DE_BIG), Item("c"))
    assert names(queue.take(10, pair=EN_DE)) == ["a", "b", "c"]
    assert len(queue) == 2
    assert names(queue.take(10, pair=EN_FR)) == ["x"]
    assert names(queue.take(10, pair=EN_DE_BIG)) == ["y"]  # another model: another group
    assert len(queue) == 0 and queue.take(10) == []


def test_across_groups_the_oldest_items_go_first() -> None:
    queue = queue_of(Item("fr1", EN_FR, enqueued=1), Item("de2", enqueued=2),
                     Item("fr3", EN_FR, enqueued=3), Item("de4", enqueued=4))
    assert names(queue.take(3)) == ["fr1", "de2", "fr3"]
    assert names(queue.take(3)) == ["de4"]


def test_the_next_group_is_the_oldest_unless_one_is_full() -> None:
    queue = queue_of(Item("de", enqueued=1), Item("fr", EN_FR, enqueued=2))
    assert queue.next_group(2, 100) == (EN_DE, 1, False)
    queue.push(Item("fr+", EN_FR, enqueued=3))
    assert queue.next_group(2, 100) == (EN_FR, 2, True)  # two places: full, goes first
    assert queue.next_group(5, 3) == (EN_DE, 1, False)
    queue.push(Item("long", EN_FR, enqueued=4, text="xyz"))
    assert queue.next_group(5, 3) == (EN_FR, 2, True)  # three characters: full
    assert GroupedQueue[Item]().next_group(1, 1) is None


def test_a_group_taken_goes_behind_the_others() -> None:
    queue = queue_of(Item("d1"), Item("f1", EN_FR), Item("d2"))
    assert queue.next_group(1, 100) == (EN_DE, 0.0, True)  # both full: the first goes
    assert names(queue.take(1, pair=EN_DE)) == ["d1"]
    assert queue.next_group(1, 100) == (EN_FR, 0.0, True)  # then the other, before d2


# -- budgets -----------------------------------------------------------------------------------


def test_a_batch_takes_up_to_its_places_counting_each_items_weight() -> None:
    queue = queue_of(Item("a", weight=2), Item("b", weight=1), Item("c", weight=2),
                     Item("d", weight=1))
    assert names(queue.take(3)) == ["a", "b"]  # c would make 5: it waits, d does not jump it
    assert names(queue.take(3)) == ["c", "d"]


def test_the_first_item_goes_whatever_its_size() -> None:
    queue = queue_of(Item("big", weight=9, text="x" * 50), Item("next"))
    assert names(queue.take(3, 10)) == ["big"]
    assert names(queue.take(3, 10)) == ["next"]


def test_a_batch_takes_up_to_its_characters() -> None:
    queue = queue_of(*(Item(c, text=c * 4) for c in "abc"))
    assert names(queue.take(10, 8)) == ["a", "b"]
    assert names(queue.take(10, 8)) == ["c"]


@given(weights=st.lists(st.integers(1, 5), max_size=30), budget=st.integers(1, 8))
def test_batches_take_every_item_once_in_order_within_budget(weights: list[int],
                                                              budget: int) -> None:
    queue = queue_of(*(Item(str(i), weight=w, enqueued=i) for i, w in enumerate(weights)))
    taken: list[str] = []
    while batch := queue.take(budget):
        assert len(batch) == 1 or sum(item.weight for item in batch) <= budget
        taken += names(batch)
    assert taken == [str(i) for i in range(len(weights))]
    assert len(queue) == 0


# -- given up, past due --------------------------------------------------------------------------


def test_items_given_up_take_no_room_and_are_never_taken() -> None:
    gone = Item("gone", given_up=True)
    queue = queue_of(Item("a"), gone, Item("b"), Item("c"))
    assert len(queue) == 4  # not counted out: nobody said so (no discard)
    assert names(queue.take(2)) == ["a", "b"]
    assert names(queue.take(2)) == ["c"]
    assert len(queue) == 0 and not gone.queued


def test_a_discarded_item_frees_its_place_at_once() -> None:
    a, b = Item("a"), Item("b")
    queue = queue_of(a, b)
    a.given_up = True
    assert queue.discard(a) and len(queue) == 1
    assert not queue.discard(a)  # counted out once
    assert names(queue.take(5)) == ["b"]
    assert not queue.discard(b)  # taken: no longer waiting
    assert len(queue) == 0


def test_given_up_heads_are_pruned_before_the_next_group_is_chosen() -> None:
    old = Item("old", EN_FR, enqueued=0, given_up=True)
    queue = queue_of(old, Item("de", enqueued=1), Item("fr", EN_FR, enqueued=2))
    assert queue.next_group(5, 100) == (EN_DE, 1, False)
    assert len(queue) == 2 and not old.queued
    dead = queue_of(Item("x", given_up=True))
    assert dead.next_group(5, 100) is None and len(dead) == 0


def test_compaction_removes_the_discarded_once_they_outnumber_the_live() -> None:
    live = Item("live")
    dead = [Item(str(i)) for i in range(COMPACT_AFTER + 1)]
    queue = queue_of(live, *dead)
    for item in dead[:-1]:
        item.given_up = True
        queue.discard(item)
    assert sum(map(len, queue._groups.values())) == len(dead) + 1  # not yet
    dead[-1].given_up = True
    queue.discard(dead[-1])
    assert [names(list(group)) for group in queue._groups.values()] == [["live"]]
    assert names(queue.take(5)) == ["live"] and len(queue) == 0


def test_drain_empties_the_queue_and_counts_everything_out() -> None:
    items = [Item("a"), Item("b", EN_FR), Item("c")]
    queue = queue_of(*items)
    queue.discard(items[2])
    assert names(queue.drain()) == ["a", "c", "b"]
    assert len(queue) == 0 and queue.take(5) == [] and not any(i.queued for i in items)


def test_a_cutoff_answers_the_given_up_and_the_late_and_keeps_the_rest() -> None:
    expired: list[str] = []
    gone: list[str] = []
    cutoff = Cutoff(10.0, expired=lambda i: expired.append(i.name),
                    gone=lambda i: gone.append(i.name))
    items = [Item("late", due=10.0), Item("live", due=10.5), Item("no-deadline"),
             Item("given-up", due=99.0, given_up=True)]
    assert names(cutoff.sift(items)) == ["live", "no-deadline"]
    assert (expired, gone) == (["late"], ["given-up"])


def test_without_a_time_a_cutoff_drops_only_the_given_up() -> None:
    items = [Item("late", due=-1.0), Item("given-up", given_up=True)]
    assert names(Cutoff[Item]().sift(items)) == ["late"]
    with pytest.raises(ValueError, match="expired"):
        Cutoff[Item](1.0)


def test_items_a_cutoff_drops_while_taken_take_no_room() -> None:
    expired: list[str] = []
    queue = queue_of(Item("late", due=1.0, weight=3), Item("a", due=9.0), Item("b"),
                     Item("c"))
    batch = queue.take(2, cutoff=Cutoff(5.0, expired=lambda i: expired.append(i.name)))
    assert names(batch) == ["a", "b"] and expired == ["late"]
    assert names(queue.take(2)) == ["c"]


# -- the output check ------------------------------------------------------------------------------


def test_the_output_check_takes_as_many_strings_as_texts() -> None:
    check_outputs("x", ["a", "b"], ["A", "B"])
    for outputs, words in ((["A"], "1 outputs for 2 inputs"), ("AB", "str outputs"),
                           (["A", 2], "non-string"), (None, "NoneType")):
        with pytest.raises(BadOutput, match=words):
            check_outputs("x", ["a", "b"], outputs)
