"""Admission: whether the backend queues have room for more text, before it is taken.

Text is refused at the door (503, or 413 for a one-shot request too big for any queue),
never once it is accepted: a segment cut from accepted text always enters its queue, so
no segment waits on a retry timer. Each accepted character not cut yet may still become a
segment, so it takes a place in the chain's room until it is cut.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from service.exceptions import Overloaded, PayloadTooLarge


class Queues(Protocol):
    """What admission asks of the backend queues (the dispatcher answers)."""

    def room(self, chain: Sequence[str]) -> int:
        """How many more segments the chain's queues take now."""
        ...

    def queue_bound(self, chain: Sequence[str]) -> int | None:
        """The most the chain's first queue ever holds (None: no such queue)."""
        ...


class Admission:
    """The room of the backend queues, less the text accepted anywhere and not cut yet."""

    __slots__ = ("_queues", "_uncut")

    def __init__(self, queues: Queues) -> None:
        self._queues = queues
        self._uncut = 0  # characters accepted by streams, not cut into segments yet

    @property
    def uncut(self) -> int:
        """Characters accepted and not cut yet: a place each in every chain's room."""
        return self._uncut

    def accepted(self, chars: int) -> None:
        """Text was accepted: it takes a place per character until it is cut."""
        self._uncut += chars

    def cut(self, chars: int) -> None:
        """Accepted text was cut (its segments are queued or decided, or it waits in a
        segmenter, counted by its stream): its places are given back."""
        self._uncut -= chars

    def free(self, chain: Sequence[str]) -> int:
        """The chain's room now, less the uncut text (may be negative)."""
        return self._queues.room(chain) - self._uncut

    def check_room(self, chain: Sequence[str], wanted: int) -> None:
        """Refuse, before anything is queued, a request whose segments cannot all be queued.

        More than the whole queue holds is 413 (no retry can help); more than the chain's
        queues hold now is 503 with Retry-After.
        """
        limit = self._queues.queue_bound(chain)
        if limit is None or wanted <= 0:
            return
        if wanted > limit:
            raise PayloadTooLarge(
                f"this request needs {wanted} segments translated; a backend queue holds at "
                f"most THINKTRANS_MAX_QUEUE_SIZE={limit}: send fewer or shorter texts per "
                "request"
            )
        room = max(0, self.free(chain))
        if wanted > room:
            raise Overloaded(
                f"the {','.join(chain)!r} queue has room for {room} segments, this request "
                f"needs {wanted}; nothing was queued, retry later",
                retry_after_s=1,
            )

    def stream(self, chain: Sequence[str], pending: Callable[[], int],
               cut_first: Callable[[], Awaitable[None]]) -> StreamAdmission:
        """Admission for one stream on ``chain``: see ``StreamAdmission``."""
        return StreamAdmission(self, chain, pending, cut_first)


class StreamAdmission:
    """One stream's way in: the places its current request may still fill before the room
    is looked up again (its slack).

    While the slack covers a chunk it costs no lookup (one per request). Near the bound the
    stream's waiting text is cut first and the room counted exactly, and a chunk is taken
    while any room is left: the queues overshoot by at most one chunk's segments, whatever
    the number of streams.

    ``pending``: the characters its segmenter holds uncut (not in ``uncut``: counted by
    the stream); ``cut_first``: cuts the stream's accepted text now, near the bound, so
    that its segments take their places before the room is counted again.
    """

    __slots__ = ("_admission", "_chain", "_cut_first", "_pending", "_slack")

    def __init__(self, admission: Admission, chain: Sequence[str], pending: Callable[[], int],
                 cut_first: Callable[[], Awaitable[None]]) -> None:
        self._admission = admission
        self._chain = chain
        self._pending = pending
        self._cut_first = cut_first
        self._slack = 0

    def look_again(self) -> None:
        """The next chunk looks the room up (a new request; or others may have taken
        places meanwhile)."""
        self._slack = -1

    def take(self, chars: int) -> bool:
        """Take ``chars`` places from the slack: True while the slack covers them (no
        lookup); else ``make_room`` must be awaited before the chunk is taken."""
        self._slack -= chars
        return self._slack >= 0

    async def make_room(self, chars: int, next_seq: int) -> None:
        """After ``take`` said no: look the room up, less this stream's uncut text; near
        the bound cut that text first and count exactly. The chunk (seq ``next_seq``) is
        taken while any room is left; none: ``Overloaded``, naming the seqs accepted."""
        admission = self._admission
        free = admission.free(self._chain) - self._pending()
        self._slack = free - chars
        if self._slack >= 0:
            return
        await self._cut_first()  # its segments take their places now
        if admission.free(self._chain) <= 0:
            raise Overloaded(
                f"the queue of backend {','.join(self._chain)!r} is full; the chunks through "
                f"seq {next_seq - 1} were accepted, resend from seq {next_seq} "
                "after Retry-After", retry_after_s=1,
            )
        self._slack = -1  # the next chunk looks again
