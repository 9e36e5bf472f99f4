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
    │   ├── Forbidden            a pool call names a client whose token it lacks (403)
    │   └── HostNotAllowed       a Host header that names another server (421)
    ├── Overloaded               a bounded queue is full (503 + Retry-After)
    ├── TooManyStreams           max_streams are open (429 + Retry-After)
    └── OverCap                  a pool client has its cap waiting (429 + Retry-After)

No error carries an HTTP status: ``PROBLEMS`` below is the one table of them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models import errors


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

class HostNotAllowed(InputError):
    """A request whose Host header names another server (THINKTRANS_ALLOWED_HOSTS)."""

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


@dataclass(frozen=True, slots=True)
class Kind:
    """How an error type is answered over HTTP."""

    status: int
    slug: str
    title: str


# Every error type, these and the backends' (``models.errors``), to its status, problem slug
# and title; an error takes its nearest listed ancestor's entry (``kind_of``).
PROBLEMS: dict[type[Exception], Kind] = {
    ThinktransError: Kind(500, "internal", "Internal error"),
    ConfigError: Kind(500, "invalid-config", "Invalid configuration"),
    InputError: Kind(422, "invalid-input", "Invalid input"),
    InvalidLocale: Kind(422, "invalid-locale", "Invalid locale"),
    LocaleNotAllowed: Kind(422, "locale-not-allowed", "Locale not allowed"),
    UnknownBackend: Kind(422, "unknown-backend", "Unknown backend"),
    PayloadTooLarge: Kind(413, "payload-too-large", "Payload too large"),
    UnsupportedMediaType: Kind(415, "unsupported-media-type", "Unsupported media type"),
    RequestTimeout: Kind(408, "request-timeout", "Request timeout"),
    NotFound: Kind(404, "not-found", "Not found"),
    EventsGone: Kind(410, "events-gone", "Events no longer retained"),
    Conflict: Kind(409, "conflict", "Conflict"),
    Forbidden: Kind(403, "forbidden", "Forbidden"),
    HostNotAllowed: Kind(421, "host-not-allowed", "Misdirected request"),
    Overloaded: Kind(503, "overloaded", "Service overloaded"),
    OverCap: Kind(429, "over-cap", "Client over its cap"),
    TooManyStreams: Kind(429, "too-many-streams", "Too many streams"),
    errors.BackendError: Kind(502, "backend-error", "Backend error"),
    errors.BackendUnavailable: Kind(503, "backend-unavailable", "Backend unavailable"),
    errors.BackendTimeout: Kind(504, "backend-timeout", "Backend timeout"),
    errors.Expired: Kind(504, "expired", "Deadline passed"),
    errors.Stopped: Kind(409, "preview-stopped", "Preview stopped"),
    errors.RateLimited: Kind(503, "rate-limited", "Backend rate limited"),
    errors.UnsupportedLanguage: Kind(422, "unsupported-language", "Unsupported language"),
    errors.BadOutput: Kind(502, "bad-output", "Bad backend output"),
}
# Errors the client caused or can retry: answered with their own status. Anything else
# that reaches a route (a backend's failure, a config error) is a 502.
CLIENT_SIDE = InputError | Overloaded | TooManyStreams | OverCap


def kind_of(error: BaseException | type[BaseException]) -> Kind:
    """The table's entry for an error (or error type): its nearest listed ancestor's."""
    cls = error if isinstance(error, type) else type(error)
    for base in cls.__mro__:
        found = PROBLEMS.get(base)
        if found is not None:
            return found
    return PROBLEMS[ThinktransError]
