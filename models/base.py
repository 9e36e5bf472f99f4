"""The backend contract: an async translator, batch in and batch out.

Errors a backend may raise live in ``service.errors`` (the one hierarchy); each backend
maps its vendor's errors to them in one place, ``raise BackendUnavailable(...) from exc``.
The batcher, not each backend, checks that the output has as many texts as the input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from service.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    RateLimited,
    UnsupportedLanguage,
)

__all__ = [
    "BackendError",
    "BackendTimeout",
    "BackendUnavailable",
    "BadOutput",
    "MissingExtra",
    "RateLimited",
    "Translator",
    "UnsupportedLanguage",
    "first_line",
]


class MissingExtra(ModuleNotFoundError):
    """A backend needs a package that the ``extra`` of thinktrans installs; the registry
    turns it into a ConfigError naming ``pip install 'thinktrans[extra]'``."""

    def __init__(self, message: str, *, name: str, extra: str) -> None:
        super().__init__(message, name=name)
        self.extra = extra


def first_line(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters: a reason fit for one log line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first if len(first) <= 200 else first[:197] + "..."


class Translator(ABC):
    """A translation backend. Subclasses set ``name`` and implement ``translate``."""

    name: ClassVar[str]
    # Batches the batcher may run at once on this backend; None: the service setting.
    max_concurrency: int | None = None
    # Whether the vendor bills the characters sent (counted in metrics and /v1/backends).
    billed: ClassVar[bool] = False
    # Whether outputs are checked to be in the target language (passthrough's are not).
    check_output_language: bool = True
    # Whether translate() wants ``contexts``; the batcher passes them only where it does.
    uses_context: bool = False
    # Whether translate() wants ``deadline_s``, the seconds until the last of the batch's
    # segments is due (ready + deadline_ms; None: one has no deadline); only where it does.
    uses_deadline: bool = False

    def __init__(self) -> None:
        self.ready = True
        self.reason: str | None = None  # why the backend is not ready, for /readyz

    async def start(self) -> None:  # noqa: B027 - an optional hook
        """Load models or check credentials; called once by the app's lifespan.

        Long work belongs in a background task that flips ``ready`` when done, so that
        the service answers ``/healthz`` at once.
        """

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Return once start-up work (model load, credentials check, probe) has finished,
        ready or not, or ``timeout_s`` has passed; return ``self.ready``.

        The CLI and ``compare`` wait on it; the service never does. The default: no
        start-up work, so ``ready`` at once.
        """
        return self.ready

    @abstractmethod
    async def translate(
        self,
        texts: Sequence[str],
        *,
        source: str | None,
        target: str,
        contexts: Sequence[str | None] | None = None,
        model: str | None = None,
    ) -> list[str]:
        """Translate ``texts`` from ``source`` (None: unknown) into ``target`` (a BCP 47 tag).

        ``contexts``, one per text (the text before it in its stream, or None), comes only
        to a backend whose ``uses_context`` is true; the output never includes it.
        ``model`` is the model a request or stream named (None: the backend's own choice);
        it comes only when one was named. A model the backend cannot serve raises a
        ``BackendError`` (the chain's next backend takes the segment). A backend whose
        ``uses_deadline`` is true also takes ``deadline_s``; work it drops for being past
        it raises ``service.errors.Expired``.
        """

    # -- models: a request or stream may name one; the catalog is advice, not a whitelist --

    def model_problem(self, model: str | None) -> str | None:
        """None when ``model`` (None: the default) can be tried now; else one line saying
        why not, and the dispatcher passes this backend over with it. A model the backend
        does not list is tried, never refused for not being listed; the default: only a
        backend's own choice, as it has no models to choose from."""
        if model is None:
            return None
        return f"backend {self.name!r} has no models to choose from (model {model!r})"

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model that serves ``source -> target`` when ``model`` is named (None: the
        backend's own choice); each segment's result names it. None: the backend has none."""
        return model

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        """Everything but the text that decides this backend's output for the pair when
        ``model`` is named: the resolved model, engine, quantisation, decoding options. The
        translation cache keys on it; None: never cache (passthrough, nothing loaded). The
        default: the backend's name and the resolved model."""
        return f"{self.name}|{self.resolve_model(model, source, target)}"

    def catalog(self) -> list[dict[str, object]]:
        """What this backend can serve, for ``GET /v1/models``: one entry per model,
        ``{"model", "languages" (BCP 47 targets or None: any), "default", "notes"}``."""
        return []

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Whether this backend can serve the pair (with ``model`` when one is named; it
        comes only then); the default: every pair."""
        return True

    def languages(self) -> list[str] | None:
        """The targets this backend can serve, as BCP 47 tags; None: any."""
        return None

    def serves_target(self, target: str) -> bool | None:
        """Whether some source can be translated into ``target``; None: not known yet (a
        model not loaded). Readiness judges the default target with it; the default asks
        ``supports`` with an unknown source."""
        return self.supports(None, target)

    def info(self) -> dict[str, object]:
        """Backend-specific facts for ``GET /v1/backends`` (model, device, usage...)."""
        return {}

    async def aclose(self) -> None:  # noqa: B027 - an optional hook
        """Release models, threads and connections."""
