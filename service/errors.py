"""The one error hierarchy of thinktrans.

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
    │   └── Conflict             the request contradicts accepted state (409)
    ├── Overloaded               a bounded queue is full (503 + Retry-After)
    ├── TooManyStreams           max_streams are open (429 + Retry-After)
    └── BackendError             a translation backend failed
        ├── BackendUnavailable   not loaded, not configured, auth, quota, outage
        ├── BackendTimeout       no answer in time
        ├── Expired              dropped unrun: every segment of it was past its deadline
        ├── RateLimited          the vendor asked us to slow down
        ├── UnsupportedLanguage  the backend cannot serve this language pair
        └── BadOutput            wrong count, empty text, wrong language

Every error carries an HTTP status and a short slug; ``service.app`` maps them to
RFC 9457 problem responses and ``service.cli`` to exit codes, each in one place.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ThinktransError(Exception):
    """Base of every error the service raises on purpose."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class ConfigError(ThinktransError):
    slug = "invalid-config"
    title = "Invalid configuration"


class InputError(ThinktransError):
    status = 422
    slug = "invalid-input"
    title = "Invalid input"


class InvalidLocale(InputError):
    slug = "invalid-locale"
    title = "Invalid locale"


class LocaleNotAllowed(InputError):
    slug = "locale-not-allowed"
    title = "Locale not allowed"


class UnknownBackend(InputError):
    slug = "unknown-backend"
    title = "Unknown backend"


class PayloadTooLarge(InputError):
    status = 413
    slug = "payload-too-large"
    title = "Payload too large"


class UnsupportedMediaType(InputError):
    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class RequestTimeout(InputError):
    status = 408
    slug = "request-timeout"
    title = "Request timeout"


class NotFound(InputError):
    status = 404
    slug = "not-found"
    title = "Not found"


class EventsGone(InputError):
    status = 410
    slug = "events-gone"
    title = "Events no longer retained"


class Conflict(InputError):
    status = 409
    slug = "conflict"
    title = "Conflict"


class Overloaded(ThinktransError):
    status = 503
    slug = "overloaded"
    title = "Service overloaded"

    def __init__(self, detail: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


class TooManyStreams(ThinktransError):
    status = 429
    slug = "too-many-streams"
    title = "Too many streams"

    def __init__(self, detail: str, *, retry_after_s: int = 5, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


class BackendError(ThinktransError):
    status = 502
    slug = "backend-error"
    title = "Backend error"


class BackendUnavailable(BackendError):
    status = 503
    slug = "backend-unavailable"
    title = "Backend unavailable"


class BackendTimeout(BackendError):
    status = 504
    slug = "backend-timeout"
    title = "Backend timeout"


class Expired(BackendError):
    """Work a backend dropped unrun because every segment in it was past its deadline (the
    pool sheds it so fresh work goes first). Not the backend's fault: the circuit breaker
    does not count it."""

    status = 504
    slug = "expired"
    title = "Deadline passed"


class RateLimited(BackendError):
    status = 503
    slug = "rate-limited"
    title = "Backend rate limited"


class UnsupportedLanguage(BackendError):
    status = 422
    slug = "unsupported-language"
    title = "Unsupported language"


class BadOutput(BackendError):
    slug = "bad-output"
    title = "Bad backend output"
