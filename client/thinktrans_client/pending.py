"""The text a stream was pushed and has not yet given out, and the index it gives out next.

Both the sidecar's segments (``reading``) and the originals of a fallback (``fallback``) are
taken from the front of it, each as the next index: what ``results`` yields then joins back
to the pushed text, whichever of them gave it out.
"""

from __future__ import annotations

from collections import deque

__all__ = ["PendingText"]


class PendingText:
    """Text pushed and not yet given out: appended at the end, taken from the front."""

    def __init__(self) -> None:
        self._parts: deque[str] = deque()
        self._len = 0
        self.next_index = 0  # the index of the next segment given out

    def __len__(self) -> int:
        return self._len

    def append(self, text: str) -> None:
        self._parts.append(text)
        self._len += len(text)

    def startswith(self, text: str) -> bool:
        if len(text) > self._len:
            return False
        pos = 0
        for part in self._parts:
            if pos >= len(text):
                break
            piece = text[pos: pos + len(part)]
            if not part.startswith(piece):
                return False
            pos += len(piece)
        return True

    def take(self, n: int) -> str:
        """The first ``n`` characters (fewer if fewer are pending), removed."""
        out: list[str] = []
        while n > 0 and self._parts:
            part = self._parts.popleft()
            if len(part) > n:
                self._parts.appendleft(part[n:])
                part = part[:n]
            out.append(part)
            n -= len(part)
            self._len -= len(part)
        return "".join(out)

    def continues(self, index: int, original: str) -> bool:
        """Whether a segment ``index`` of ``original`` is the next one of this text."""
        return index == self.next_index and self.startswith(original)

    def give_out(self, n: int) -> tuple[int, str]:
        """The next segment's index and its text, the first ``n`` characters, removed."""
        index = self.next_index
        self.next_index += 1
        return index, self.take(n)
