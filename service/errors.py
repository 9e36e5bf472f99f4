"""The service's own errors: bad requests, overload, invalid settings.

::

    ThinktransError
    ├── ConfigError              invalid settings: the service does not start
    ├── InputError               the client's request is wrong (4xx)
    │   ├── InvalidLocale        malformed BCP 47 tag (422)
    │   ├── LocaleNotAllowed     valid tag outside allowed_locales (422)
    │   ├── UnknownBackend       backend name not configured (422)
    │   ├── PayloadTooLarge      a named size or count limit was passed (413)
    │   ├── UnsupportedMediaType a request body that is not JSON (415)
    │   ├── RequestTimeout       a request body not complete in time (408)
    │   ├── NotFound             no such stream (404)
    │   ├── EventsGone           a stream's events were no longer retained (410)
    │   ├── Conflict             the request contradicts accepted state (409)
    │   └── Forbidden            a pool call names a client whose token it lacks (403)
    ├── Overloaded               a bounded queue is full (503 + Retry-After)
    ├── TooManyStreams           max_streams are open (429 + Retry-After)
    └── OverCap                  a pool client has its cap waiting (429 + Retry-After)

The backends' own errors (``BackendError`` and its kind) live with the backends, in
``models.errors``. No error here carries an HTTP status: ``service.problems`` maps every
type, these and the backends', to its status, slug and title in one table, and
``service.cli`` maps them to exit codes.
"""

from __future__ import annotations

from typing import Any


class ThinktransError(Exception):
    """Base of every error the service raises on purpose."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class ConfigError(ThinktransError):
    """Invalid settings: the service does not start."""

class InputError(ThinktransError):
    """The client's request is wrong."""

class InvalidLocale(InputError):
    """A malformed BCP 47 tag."""

class LocaleNotAllowed(InputError):
    """A valid tag outside allowed_locales."""

class UnknownBackend(InputError):
    """A backend name that is not configured."""

class PayloadTooLarge(InputError):
    """A named size or count limit was passed."""

class UnsupportedMediaType(InputError):
    """A request body that is not JSON."""

class RequestTimeout(InputError):
    """A request body not complete in time."""

class NotFound(InputError):
    """No such stream."""

class EventsGone(InputError):
    """A stream's events are no longer retained."""

class Conflict(InputError):
    """The request contradicts accepted state."""

class Forbidden(InputError):
    """A pool call names a client that has a token of its own, without that token."""

class Overloaded(ThinktransError):
    """A bounded queue is full; retry after ``retry_after_s``."""

    def __init__(self, detail: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


class TooManyStreams(ThinktransError):
    """max_streams are open; retry after ``retry_after_s``."""

    def __init__(self, detail: str, *, retry_after_s: int = 5, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


class OverCap(ThinktransError):
    """A pool client has as much waiting as the pool lets one client have (or the pool
    tracks as many clients as it may); retry after ``retry_after_s``."""

    def __init__(self, detail: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s
