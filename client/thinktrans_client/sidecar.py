"""The sidecar as a stream's parts see it: the calls they make of the client, and its errors.

The parts (``posting``, ``reading``, ``fallback``) take a ``Sidecar``, which
``ThinktransClient`` is, rather than the client itself: they need only these few calls,
and the client's module, which composes them, is then the only one that imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["ClientClosing", "PastCloseWait", "Sidecar", "SidecarError", "Skipped"]


class SidecarError(Exception):
    """The sidecar did not serve a request; ``reason`` says why, without thinking text."""

    def __init__(self, reason: str, *, status: int | None = None,
                 retry_after_s: float | None = None, slug: str | None = None,
                 unknown_fields: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s
        self.slug = slug  # the problem type's slug, e.g. ``invalid-locale``
        # The body's fields a 422 refused as not known (a sidecar older than they are).
        self.unknown_fields = unknown_fields

    @property
    def transient(self) -> bool:
        """Worth retrying with the same request: the server asked us to come back later."""
        return self.status in (429, 503)

    @property
    def sidecar_failed(self) -> bool:
        """The sidecar itself failed (unreachable, slow, 5xx), not the request."""
        return self.status is None or self.status >= 500


class Skipped(SidecarError):
    """The sidecar is being skipped; not itself a failure (noting it would never end the skip)."""

    def __init__(self) -> None:
        super().__init__("the sidecar is skipped for a few seconds (the client's cooloff_s) "
                         "after it failed")


class PastCloseWait(SidecarError):
    """A closed stream's results did not all come within its ``close_wait_s``: not a failure
    of the sidecar (no cool-off), only the end of the wait for it."""

    def __init__(self, close_wait_s: float) -> None:
        super().__init__(f"the translation did not come within {close_wait_s * 1000:g} ms of "
                         "the end of the thinking part (the stream's close_wait_s)")

    @property
    def sidecar_failed(self) -> bool:
        return False


class ClientClosing(SidecarError):
    """The client is closing (``ThinktransClient.aclose``) with the stream still open: what
    it has not given out goes out as pushed. Not a failure of the sidecar (no cool-off)."""

    def __init__(self) -> None:
        super().__init__("the client was closed before the stream's results came")

    @property
    def sidecar_failed(self) -> bool:
        return False


class Sidecar(Protocol):
    """What a stream uses of ``ThinktransClient``: one call within the budget, and the budgets."""

    timeout_s: float  # longest one request may take beyond its planned wait
    stall_s: float  # how long pushed text may go without a result
    poll_wait_s: float  # how long one long-poll of events may wait on the server

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, Any] | None = None, wait_s: float = 0.0) -> Any:
        """The JSON answer, or SidecarError."""
        ...

    def note_failure(self, exc: SidecarError) -> None:
        """Record a failed call (a failure of the sidecar itself starts the cool-off)."""
        ...
