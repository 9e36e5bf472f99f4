"""Chunk intake: a stream's chunks by seq, into text in order.

Clients post chunks concurrently and retry them, so seqs come out of order and twice; the
intake turns them into one text in order, holding what comes past a gap and bounding what
the stream buffers (``max_stream_buffer_chars``: held chunks, text not cut yet, and the
segmenter's pending text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from service.exceptions import Conflict, PayloadTooLarge


class ChunkIntake:
    """One stream's seqs: the next one expected, those held past a gap, and a digest of
    each accepted chunk (retries are told from reused seqs)."""

    __slots__ = ("_accepted", "_pending", "digests", "held", "held_chars", "lock",
                 "max_buffer_chars", "max_gap", "next_seq", "stream_id", "unfed",
                 "unfed_chars")

    def __init__(self, stream_id: str, *, max_gap: int, max_buffer_chars: int,
                 accepted: Callable[[int], None], pending: Callable[[], int]) -> None:
        """``accepted``: told the length of each chunk taken in seq (admission counts it
        until it is cut); ``pending``: the characters the stream's segmenter holds."""
        self.stream_id = stream_id
        self.max_gap = max_gap
        self.max_buffer_chars = max_buffer_chars
        self._accepted = accepted
        self._pending = pending
        self.next_seq = 0
        self.digests: list[int] = []  # hash of each accepted chunk, by seq
        self.held: dict[int, str] = {}
        self.held_chars = 0
        # Accepted, not yet cut: the stream cuts a request (or FEED_BATCH_CHARS) at a time,
        # so that the segmenter is not called once per delta.
        self.unfed: list[str] = []
        self.unfed_chars = 0
        self.lock = asyncio.Lock()  # one request at a time takes chunks and cuts

    @property
    def accepted_through(self) -> int:
        """The highest seq accepted without a gap (-1: none)."""
        return self.next_seq - 1

    def take(self, seq: int, text: str) -> bool:
        """Take one chunk: True when it is the next seq (accepted, with any held chunks it
        lets through), False when held or a retry; raises on a conflict or a full
        buffer."""
        if seq < self.next_seq:
            if self.digests[seq] != hash(text):
                raise Conflict(
                    f"seq {seq} was already accepted with other text; seqs are not reused",
                    seq=seq,
                )
            return False
        held = self.held
        if seq in held:
            if held[seq] != text:
                raise Conflict(f"seq {seq} is held with other text", seq=seq)
            return False
        if seq > self.next_seq:
            if len(held) >= self.max_gap:
                raise Conflict(
                    f"seq {self.next_seq} is missing and {len(held)} later chunks are "
                    f"held (THINKTRANS_MAX_GAP={self.max_gap}); resend from seq "
                    f"{self.next_seq}", missing_seq=self.next_seq,
                )
            self._check_buffer(len(text))
            held[seq] = text
            self.held_chars += len(text)
            return False
        self._check_buffer(len(text))
        self._accept(text)
        while self.next_seq in held:  # held text was admitted already
            later = held.pop(self.next_seq)
            self.held_chars -= len(later)
            self._accept(later)
        return True

    def _check_buffer(self, extra: int) -> None:
        limit = self.max_buffer_chars
        buffered = self._pending() + self.unfed_chars + self.held_chars
        if buffered + extra > limit:
            raise PayloadTooLarge(
                f"stream {self.stream_id!r} would buffer {buffered + extra} characters "
                f"(THINKTRANS_MAX_STREAM_BUFFER_CHARS={limit}); fill the gap at seq "
                f"{self.next_seq} or send smaller chunks", missing_seq=self.next_seq,
            )

    def _accept(self, text: str) -> None:
        self.digests.append(hash(text))
        self.next_seq += 1
        self.unfed.append(text)
        self.unfed_chars += len(text)
        self._accepted(len(text))

    def take_unfed(self) -> str:
        """The text accepted and not yet cut, joined; it is the caller's to cut now."""
        text = "".join(self.unfed)
        self.unfed.clear()
        self.unfed_chars = 0
        return text

    def check_complete(self) -> None:
        """Before closing: no chunk may be held past a gap (409 naming the missing seq)."""
        if self.held:
            raise Conflict(
                f"stream {self.stream_id!r} is missing seq {self.next_seq} before the "
                f"{len(self.held)} held chunks; send it, then close",
                missing_seq=self.next_seq,
            )

    def drop_held(self) -> None:
        """Forget the chunks held past a gap (shutdown: a gap never filled is not cut)."""
        self.held.clear()
        self.held_chars = 0

    def forget(self) -> None:
        """The stream ended: it takes no more chunks, so their digests go."""
        self.digests = []
