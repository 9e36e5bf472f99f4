"""The stream manager: every stream of one runtime, behind one facade for the routes and
the runtime.

The routes and the runtime ask one object for streams; keeping, retaining, counting and
expiring them are each a part of their own that the manager is composed of.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from models.spans import Glossary, SpanFinder
from service.chain.dispatch import Dispatcher
from service.exceptions import Conflict, Overloaded
from service.ops.metrics import Metrics
from service.schemas import Policy
from service.settings import Settings
from service.stream.admission import Admission
from service.stream.counters import StreamCounters
from service.stream.pipeline import Stream, StreamConfig
from service.stream.preview import PreviewConfig
from service.stream.retention import Retention
from service.stream.roster import StreamRoster
from service.stream.sweeper import Sweeper
from service.stream.tally import StreamTally
from service.stream.tally import summaries as stream_summaries
from service.text.detect import Detector
from service.text.glossary import GlossaryBook
from service.text.limits import check_chunks, check_encodable
from service.text.tags import ResolvedTarget, resolve_target


class StreamManager:
    """Every stream of one runtime: opens and feeds them; its parts keep, count, retain,
    expire and drain them."""

    def __init__(
        self, settings: Settings, detector: Detector, dispatcher: Dispatcher,
        admission: Admission, metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.config = StreamConfig.from_settings(settings)
        self.preview_config = PreviewConfig.from_settings(settings)
        # Protected spans are found once per segment, before its chain (models/spans.py).
        self.finder = (SpanFinder(settings.span_patterns, settings.span_kinds or None)
                       if settings.protect_spans else SpanFinder(kinds=()))
        self.glossaries = GlossaryBook(settings)
        self.detector = detector
        self.dispatcher = dispatcher
        self.admission = admission
        self.counters = StreamCounters(metrics)  # what every stream's parts count
        self.tally = StreamTally(metrics)
        self.retention = Retention(max_streams=settings.max_ended_streams,
                                   max_bytes=settings.max_ended_bytes)
        self.roster = StreamRoster(self.retention, self.tally, max_streams=settings.max_streams)
        self.sweeper = Sweeper(self.roster, idle_expire_s=settings.stream_idle_expire_s)

    @property
    def streams(self) -> dict[str, Stream]:
        """The named streams by id (ended ones still kept among them)."""
        return self.roster.streams

    @property
    def draining(self) -> bool:
        """Shutting down: new streams are refused."""
        return self.sweeper.draining

    async def start(self) -> None:
        await self.sweeper.start()

    async def stop(self) -> None:
        await self.sweeper.stop()
        self.roster.clear()

    # -- what every stream shares ------------------------------------------------------------

    def resolve(self, requested: str | None, user_text: str | None = None) -> ResolvedTarget:
        """The target, in the contract's order: request, user_text, default, none."""
        settings = self.settings
        detect: Callable[[str], str | None] = lambda text: self.detector.detect(text).lang  # noqa: E731
        return resolve_target(requested, user_text=user_text,
                              default_locale=settings.default_locale,
                              allowed=settings.allowed_locales, detect=detect)

    def active(self) -> int:
        """Streams not yet ended; an ended one is kept only for late readers."""
        return self.roster.active()

    # -- one-shot ------------------------------------------------------------------------

    def _new(self, stream_id: str, target: ResolvedTarget, chain: list[str], *,
             policy: Policy, model: str | None, backend_name: str | None = None,
             source: str | None = None, max_events: int | None = None,
             deferred: bool = False, glossary: Glossary | None = None,
             previews: bool) -> Stream:
        """A stream on this manager's parts: its settings, detector, dispatcher and
        admission, counted by the tally and, once ended, kept by the roster; its segments'
        spans found with ``glossary``; with ``previews``, its open sentence previewed
        (``service/stream/preview.py``)."""
        protect = (None if not self.settings.protect_spans and not glossary
                   else functools.partial(self.finder.find, glossary=glossary))
        previewing = None
        if previews and target.target is not None:
            start = functools.partial(self.dispatcher.preview, chain=chain,
                                      billed=self.preview_config.billed)
            previewing = (self.preview_config, start)
        stream = Stream(
            stream_id, self.config, target=target, chain=chain, detector=self.detector,
            submit=self.dispatcher.submit, admission=self.admission, counters=self.counters,
            on_end=self.roster.ended, backend_name=backend_name,
            source=source, model=model, policy=policy,
            uses_context=self.dispatcher.uses_context(chain), max_events=max_events,
            deferred=deferred, release=self.dispatcher.use_model(chain, model),
            glossary=glossary, protect=protect, previews=previewing,
        )
        stream.previews = previews  # asked for (a stream without a target has none to show)
        return stream

    def oneshot(self, target: ResolvedTarget, chain: list[str], source: str | None, *,
                model: str | None = None, policy: Policy | None = None,
                glossary: Glossary | None = None) -> Stream:
        """An unnamed stream for one text of a one-shot request: fed once, then closed;
        ``glossary`` as ``glossary_for`` resolved it."""
        return self._new("-", target, chain, source=source, model=model,
                         policy=policy or self.settings.policy, deferred=True,
                         glossary=glossary, previews=False)

    def glossary_for(self, target: ResolvedTarget,
                     own: Mapping[str, Any] | None) -> Glossary | None:
        """The glossary a stream or request with ``target`` runs with: the glossary file's
        for it, then ``own`` (as the request gave it; 422 when it is bad)."""
        return self.glossaries.resolve(target.target, own)

    # -- named streams -----------------------------------------------------------------------

    def open(self, stream_id: str, target: str | None, backend: str | None,
             user_text: str | None = None, *, model: str | None = None,
             policy: Policy | None = None, glossary: Mapping[str, Any] | None = None,
             previews: bool | None = None) -> tuple[Stream, bool]:
        """Open a stream, or return the one already open with the same choices."""
        if user_text is not None:
            check_encodable(user_text, "user_text")
        resolved = self.resolve(target, user_text)
        policy = policy or self.settings.policy
        previews = self.settings.previews if previews is None else previews
        glossed = self.glossary_for(resolved, glossary)
        existing = self.roster.find(stream_id)
        if existing is not None:
            if (existing.target, existing.backend_name, existing.model, existing.policy) != (
                    resolved.target, backend, model, policy):
                had = _choices(existing.target, existing.backend_name, existing.chain,
                               existing.model, existing.policy)
                asked = _choices(resolved.target, backend, self.dispatcher.default_chain,
                                 model, policy)
                raise Conflict(
                    f"stream {stream_id!r} is already open with {_listed(had)}; this request "
                    f"asks for {_listed([a for h, a in zip(had, asked, strict=True) if h != a])}"
                    ": open it with the same choices, or use another stream id"
                )
            if existing.glossary != glossed:
                raise Conflict(f"stream {stream_id!r} is already open with another glossary; "
                               "open it with the same, or use another stream id")
            if existing.previews != previews:
                raise Conflict(f"stream {stream_id!r} is already open with previews "
                               f"{'on' if existing.previews else 'off'}; open it with the "
                               "same, or use another stream id")
            existing.touch()
            return existing, False
        if self.draining:
            raise Overloaded("the service is shutting down; open the stream on another "
                             "instance", retry_after_s=5)
        self.roster.check_room()
        chain = self.dispatcher.chain(backend)
        stream = self._new(stream_id, resolved, chain, backend_name=backend, model=model,
                           policy=policy, max_events=self.settings.max_events_retained,
                           glossary=glossed, previews=previews)
        self.roster.add(stream)
        return stream, True

    async def add_chunks(self, stream_id: str, chunks: Sequence[tuple[int, str]]) -> int:
        """Accept chunks for a stream (opened with the default target if it is new)."""
        check_chunks(self.settings, [text for _, text in chunks])
        stream = self.roster.find(stream_id)
        if stream is None:
            self.retention.check(stream_id)  # ended: its chunks must not open a new one
            stream, _ = self.open(stream_id, None, None)
        elif self.draining and stream.closed:
            # Closed by the drain, not by a client: say so, so that the client can too.
            raise Conflict(f"stream {stream_id!r} was closed because the service is shutting "
                           "down; open the stream on another instance")
        return await stream.add_chunks(chunks)

    def summaries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The open streams and the ended ones still kept, newest first (the ``limit``
        newest), each a ``StreamSummary``'s fields."""
        return stream_summaries(self.roster.streams.values(), limit)

    def get(self, stream_id: str) -> Stream:
        return self.roster.get(stream_id)

    def delete(self, stream_id: str) -> None:
        self.roster.delete(stream_id)

    # -- expiry and shutdown -------------------------------------------------------------------

    def expire(self) -> int:
        """Drop streams idle past stream_idle_expire_s; return how many."""
        return self.sweeper.expire()

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new streams, close open ones (flushing their text), and give
        their translations ``grace_s`` to come out; then drop what is left."""
        await self.sweeper.drain(grace_s)


def _choices(target: str | None, backend: str | None, chain: Sequence[str],
             model: str | None, policy: str) -> list[str]:
    """A stream's choices in words: an unnamed backend or model is the default one."""
    return [
        f"target {target!r}" if target else "no target",
        f"backend {backend!r}" if backend is not None
        else f"the server's default backend ({','.join(chain)!r})",
        f"model {model!r}" if model is not None else "the backend's default model",
        f"policy {policy!r}",
    ]


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
