"""Chunk intake on its own: seqs, gaps, retries and the buffer bound, with fakes around it."""

from __future__ import annotations

import pytest

from service.exceptions import Conflict, PayloadTooLarge
from service.stream.intake import ChunkIntake


class Counted:
    """Stands in for admission (``accepted``) and the segmenter (``pending``)."""

    def __init__(self) -> None:
        self.accepted: list[int] = []
        self.pending = 0

    def intake(self, *, max_gap: int = 4, max_buffer_chars: int = 1000) -> ChunkIntake:
        return ChunkIntake("s", max_gap=max_gap, max_buffer_chars=max_buffer_chars,
                           accepted=self.accepted.append, pending=lambda: self.pending)


def test_the_next_seq_is_accepted_and_waits_unfed_until_taken() -> None:
    seen = Counted()
    intake = seen.intake()
    assert intake.accepted_through == -1
    assert intake.take(0, "Hello ") and intake.take(1, "world.")
    assert intake.accepted_through == 1
    assert seen.accepted == [6, 6]  # admission counts each accepted chunk
    assert intake.unfed_chars == 12
    assert intake.take_unfed() == "Hello world."
    assert intake.unfed == [] and intake.unfed_chars == 0
    assert intake.take_unfed() == ""


def test_a_later_seq_is_held_until_the_gap_is_filled_then_taken_in_order() -> None:
    seen = Counted()
    intake = seen.intake()
    assert not intake.take(2, "c")
    assert not intake.take(1, "b")
    assert intake.accepted_through == -1 and intake.held_chars == 2
    assert seen.accepted == []  # held text is not accepted yet
    assert intake.take(0, "a")
    assert intake.accepted_through == 2
    assert intake.take_unfed() == "abc"
    assert intake.held == {} and intake.held_chars == 0
    assert seen.accepted == [1, 1, 1]


def test_a_retry_with_the_same_text_is_ignored_and_other_text_is_a_conflict() -> None:
    intake = Counted().intake()
    intake.take(0, "a")
    intake.take(2, "c")
    assert not intake.take(0, "a")
    assert not intake.take(2, "c")
    assert intake.take_unfed() == "a"  # nothing taken twice
    with pytest.raises(Conflict) as accepted:
        intake.take(0, "other")
    assert accepted.value.extra["seq"] == 0
    with pytest.raises(Conflict) as held:
        intake.take(2, "other")
    assert held.value.extra["seq"] == 2


def test_at_most_max_gap_chunks_are_held() -> None:
    intake = Counted().intake(max_gap=2)
    intake.take(1, "b")
    intake.take(2, "c")
    with pytest.raises(Conflict) as exc:
        intake.take(3, "d")
    assert exc.value.extra["missing_seq"] == 0
    assert "THINKTRANS_MAX_GAP=2" in exc.value.detail
    assert intake.take(0, "a")  # the gap filled, the held ones follow
    assert intake.accepted_through == 2


def test_the_buffer_bound_counts_held_unfed_and_pending_text() -> None:
    seen = Counted()
    intake = seen.intake(max_buffer_chars=10)
    intake.take(0, "aaa")  # unfed: 3
    intake.take(2, "ccc")  # held: 3
    seen.pending = 3  # in the segmenter: 3
    with pytest.raises(PayloadTooLarge) as exc:
        intake.take(1, "bb")  # 3 + 3 + 3 + 2 > 10
    assert exc.value.extra["missing_seq"] == 1
    assert intake.accepted_through == 0
    with pytest.raises(PayloadTooLarge):
        intake.take(3, "dd")  # held chunks count too
    intake.take(1, "b")  # exactly 10
    assert intake.accepted_through == 2


def test_closing_needs_every_gap_filled_unless_the_held_chunks_are_dropped() -> None:
    intake = Counted().intake()
    intake.take(0, "a")
    intake.take(2, "c")
    with pytest.raises(Conflict) as exc:
        intake.check_complete()
    assert exc.value.extra["missing_seq"] == 1
    intake.drop_held()
    intake.check_complete()
    assert intake.held_chars == 0


def test_an_ended_stream_forgets_its_digests() -> None:
    intake = Counted().intake()
    intake.take(0, "a")
    assert intake.digests
    intake.forget()
    assert intake.digests == []
