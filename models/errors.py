"""The backends' errors: what a translation backend raises, knowing nothing of HTTP.

::

    BackendError             a translation backend failed
    ├── BackendUnavailable   not loaded, not configured, auth, quota, outage
    ├── BackendTimeout       no answer in time
    ├── Expired              dropped unrun: every segment of it was past its deadline
    ├── Stopped              a preview's decode stopped: segments came to wait for it
    ├── RateLimited          the vendor asked us to slow down
    │   └── Throttled        a shared backend holds this client's share: wait, chain serves
    ├── UnsupportedLanguage  the backend cannot serve this language pair
    └── BadOutput            wrong count, empty text, wrong language
        └── PartialOutput    some texts of a batch answered, the others bad
    BackendConfigError       a backend cannot be built: unknown name, invalid config
    MissingExtra             a backend needs a package its extra installs (ModuleNotFoundError)
"""

from __future__ import annotations

from typing import Any


class BackendError(Exception):
    """A translation backend failed; ``detail`` says why in one line."""

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class BackendUnavailable(BackendError):
    """Not loaded, not configured, refused credentials, quota, outage."""


class BackendTimeout(BackendError):
    """No answer in time."""


class Expired(BackendError):
    """Work a backend dropped unrun because every segment in it was past its deadline (the
    pool sheds it so fresh work goes first). Not the backend's fault: the circuit breaker
    does not count it."""


class Stopped(BackendError):
    """A preview job's decode stopped before its end because segments came to wait for the
    backend it held (``Job.stop``). Not a failure: its answer is simply not shown."""


class RateLimited(BackendError):
    """The vendor asked us to slow down."""


class Throttled(RateLimited):
    """A shared backend holds as much of this client's work as it lets one client have
    waiting (the pool's per-client cap), and asked it to wait ``retry_after_s``: the chain
    serves the batch. Overload, not an outage: the circuit breaker does not count it."""

    def __init__(self, detail: str, *, retry_after_s: int = 1, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after_s = retry_after_s


class UnsupportedLanguage(BackendError):
    """The backend cannot serve this language pair (or model)."""


class BadOutput(BackendError):
    """Wrong count, empty text, or the wrong language."""


class PartialOutput(BadOutput):
    """A batch answered in part: ``outputs`` holds one entry per text, its translation or
    None where it was bad (``detail`` says why). The batcher gives each good text its
    answer and sends only the bad ones down the chain; the backend did answer, so its
    circuit breaker does not count it."""

    def __init__(self, detail: str, outputs: list[str | None]) -> None:
        super().__init__(detail)
        self.outputs = outputs


class BackendConfigError(Exception):
    """A backend cannot be built from its configuration; the message says what to set."""


class MissingExtra(ModuleNotFoundError):
    """A backend needs a package that the ``extra`` of thinktrans installs; the registry
    turns it into a BackendConfigError naming ``pip install 'thinktrans[extra]'``."""

    def __init__(self, message: str, *, name: str, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra
