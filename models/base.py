"""The backend contract: an async translator, batch in and batch out.

The batcher hands a backend one value, a ``Job`` (texts, pair, model, contexts, when it is
due), and takes a list of as many texts back; it checks that length, once, for every
backend. What a backend can do is declared once on its class, ``capabilities``. Errors a
backend may raise live in ``models.errors``; each backend maps its vendor's errors to them
in one place, ``raise BackendUnavailable(...) from exc``.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from models.spans import Protected

__all__ = ["Capabilities", "Job", "Translator", "first_line"]


def _nothing() -> None:
    """A release with nothing to release."""


def first_line(exc: BaseException) -> str:
    """An exception's first line, at most 200 characters: a reason fit for one log line."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first if len(first) <= 200 else first[:197] + "..."


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend does with a job, declared once on its class; an instance narrows it
    from its config (``dataclasses.replace``), e.g. DeepL with its context turned off."""

    # Translates better with each text's preceding stream text: only then does a job
    # carry ``contexts`` (and the stream keep them).
    context: bool = False
    # Drops work past ``Job.due`` (raising ``Expired``): the pool.
    deadline: bool = False
    # The vendor bills the characters sent (counted in metrics and /v1/backends).
    billed: bool = False
    # Its outputs are checked to be in the target language (passthrough's are not).
    checked_output: bool = True


@dataclass(frozen=True, slots=True)
class Job:
    """One batch as the batcher hands it to a backend: one pair, one model."""

    texts: Sequence[str]
    source: str | None  # None: unknown
    target: str  # a BCP 47 tag
    model: str | None = None  # the model a request or stream named; None: the backend's
    # One per text, the text before it in its stream (or None); only for a backend with
    # ``capabilities.context``; the output never includes it.
    contexts: Sequence[str | None] | None = None
    # When the last of its segments is due out (``time.monotonic()``); None: one of them
    # has no deadline. Read by backends with ``capabilities.deadline``.
    due: float | None = None
    # One per text, its protected spans and glossary (``models.spans``), or None: a text
    # without any; None for the whole job when no text has any. A backend keeps each
    # span's ``out`` in its output (the service checks it).
    protected: Sequence[Protected | None] | None = None
    # A preview job: provisional translations of sentences still streaming (the prefixes so
    # far). Its answers are shown for a moment and replaced; a backend may decode it more
    # cheaply. ``previous``: one per text, the sentence's last preview as shown (or None),
    # which a backend may keep close to (CTranslate2's prefix bias), so previews flicker less.
    preview: bool = False
    previous: Sequence[str | None] | None = None
    # A preview job's: set (from the event loop) once segments wait for the backend while
    # this job holds it; a backend that can stops decoding then and raises ``Stopped``.
    stop: threading.Event | None = field(default=None, compare=False)

    def seconds_left(self) -> float | None:
        """Seconds until ``due`` (negative once past); None without a deadline."""
        return None if self.due is None else self.due - time.monotonic()


class Translator(ABC):
    """A translation backend. Subclasses set ``name`` and implement ``run``."""

    name: ClassVar[str]
    capabilities: Capabilities = Capabilities()
    # Batches the batcher may run at once on this backend; None: the service setting.
    max_concurrency: int | None = None
    # The most segments a batch of this backend holds, under the service setting; None:
    # the setting's (a backend that sends one segment a request says 1).
    max_batch_size: int | None = None

    def __init__(self) -> None:
        self.ready = True
        self.reason: str | None = None  # why the backend is not ready, for /readyz
        # When a failed start is tried again ("attempt 2 failed; trying again in 10 s"):
        # for /readyz and the log, never in a segment's error, which keeps the stable reason.
        self.retrying: str | None = None

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
    async def run(self, job: Job) -> list[str]:
        """Translate ``job.texts``, one output per text, in order.

        A model the backend cannot serve raises a ``BackendError`` (the chain's next
        backend takes the segment); work dropped for being past ``job.due`` raises
        ``Expired``.
        """

    async def translate(
        self, texts: Sequence[str], *, source: str | None, target: str,
        model: str | None = None, contexts: Sequence[str | None] | None = None,
        protected: Sequence[Protected | None] | None = None,
    ) -> list[str]:
        """``run`` on a job of these texts: for callers outside the batcher."""
        return await self.run(Job(list(texts), source, target, model, contexts,
                                  protected=protected))

    # -- models: a request or stream may name one; the catalog is advice, not a whitelist --

    def use_model(self, model: str) -> Callable[[], None]:
        """An open stream names ``model``: a backend that loads models on demand keeps it
        loaded (never evicts it for another) until the returned release is called, when the
        stream is over. The default keeps nothing."""
        return _nothing

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
