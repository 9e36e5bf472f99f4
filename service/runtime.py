"""The runtime: everything the service runs on, opened and closed as one async context.

The app's lifespan, the CLI's ``translate`` and ``compare`` open the same runtime, so none
of them needs an HTTP app to translate, and a one-shot request is a stream fed once and
closed: the same code cuts, detects, decides, batches and emits whatever brought the text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

from models import registry
from models.base import Translator
from models.errors import BackendConfigError
from service.chain.batcher import Batcher, BatchLimits
from service.chain.cache import TranslationCache
from service.chain.dispatch import Dispatcher
from service.exceptions import ConfigError, ThinktransError
from service.ops.metrics import Metrics
from service.ops.status import StatusReport
from service.schemas import Policy, TextResult
from service.settings import Settings
from service.stream.admission import Admission
from service.stream.cutting import Pacer
from service.stream.manager import StreamManager
from service.stream.pipeline import Stream
from service.text.detect import Detection, Detector, get_detector
from service.text.limits import check_texts
from service.text.tags import canonicalize

log = logging.getLogger("thinktrans.runtime")


def build_backends(settings: Settings) -> dict[str, Translator]:
    """Every backend the settings name; a backend that cannot be built is a ConfigError."""
    try:
        return registry.build_backends(settings)
    except BackendConfigError as exc:
        raise ConfigError(str(exc)) from exc


class Runtime:
    """Settings -> backends -> batchers -> detector -> dispatcher -> admission -> streams."""

    def __init__(
        self,
        settings: Settings,
        *,
        backends: dict[str, Translator] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self._given_backends = backends
        self._stack: AsyncExitStack | None = None
        self.backends: dict[str, Translator] = {}
        self.batchers: dict[str, Batcher] = {}
        self.detector: Detector = get_detector(settings.detector, settings.detect_languages)
        self._dispatcher: Dispatcher | None = None
        self._admission: Admission | None = None
        self.cache: TranslationCache | None = None
        self._streams: StreamManager | None = None
        self._status: StatusReport | None = None

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("the runtime is not open; use 'async with Runtime(...)'")
        return self._dispatcher

    @property
    def admission(self) -> Admission:
        if self._admission is None:
            raise RuntimeError("the runtime is not open; use 'async with Runtime(...)'")
        return self._admission

    @property
    def streams(self) -> StreamManager:
        if self._streams is None:
            raise RuntimeError("the runtime is not open; use 'async with Runtime(...)'")
        return self._streams

    @property
    def status(self) -> StatusReport:
        """What the instance reports of itself (``service/ops/status.py``)."""
        if self._status is None:
            raise RuntimeError("the runtime is not open; use 'async with Runtime(...)'")
        return self._status

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Runtime:
        async with AsyncExitStack() as stack:
            self.backends = self._build_backends()
            self.detector.warm_up()
            for translator in self.backends.values():
                await translator.start()
                stack.push_async_callback(translator.aclose)
            for name, translator in self.backends.items():
                batcher = Batcher(translator, BatchLimits.from_settings(self.settings, translator),
                                  self.metrics)
                await batcher.start()
                stack.push_async_callback(batcher.stop)
                self.batchers[name] = batcher
            self.cache = self._cache()
            await self.cache.start()
            stack.push_async_callback(self.cache.aclose)
            self._status = StatusReport(self.settings, self.backends, self.batchers,
                                        self.cache, self.metrics)
            self._dispatcher = Dispatcher(
                self.backends, self.batchers, self.detector,
                default_chain=self.settings.backend,
                check_output_language=self.settings.check_output_language,
                cache=self.cache, metrics=self.metrics,
            )
            self._admission = Admission(self._dispatcher)
            streams = StreamManager(self.settings, self.detector, self._dispatcher,
                                    self._admission, self.metrics)
            await streams.start()
            stack.push_async_callback(self._close_streams, streams)
            self._streams = streams
            log.info("started", extra={"backends": list(self.backends),
                                       "chain": self.settings.backend})
            if self.settings.default_locale is not None:
                # Warns once each chain backend's languages are known (a model: once loaded).
                watch = asyncio.get_running_loop().create_task(
                    self._status.warn_unserved_default())
                stack.push_async_callback(_cancel, watch)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def _build_backends(self) -> dict[str, Translator]:
        built = (dict(self._given_backends) if self._given_backends is not None
                 else build_backends(self.settings))
        for name in self.settings.all_backends():
            if name not in built:
                raise ThinktransError(f"backend {name!r} was configured but not built")
        return built

    def _cache(self) -> TranslationCache:
        s = self.settings
        return TranslationCache(int(s.cache_mb * 1024 * 1024), path=s.cache_path,
                                ttl_s=s.cache_ttl_s, metrics=self.metrics)

    async def _close_streams(self, streams: StreamManager) -> None:
        if not streams.draining:
            await streams.drain(self.settings.shutdown_grace_s)
        await streams.stop()

    async def wait_ready(self, timeout_s: float, chain: Sequence[str] | None = None) -> bool:
        """Wait, ``timeout_s`` at most in all, for the chain's start-up work (model loads,
        credential checks) to finish; whether one of them is ready. A model whose load
        failed answers at once (it retries in the background; see ``readiness``)."""
        names = list(chain) if chain is not None else self.settings.backend
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        for name in names:
            await self.backends[name].wait_ready(max(0.0, until - loop.time()))
        return any(self.backends[name].ready for name in names)

    # -- what routes and commands call ---------------------------------------------------------

    async def detect_texts(self, texts: Sequence[str]) -> list[Detection]:
        """Each text's language (the texts checked against the request limits first),
        giving the event loop back as it goes."""
        check_texts(self.settings, texts)
        found = []
        pacer = Pacer()
        for text in texts:
            found.append(self.detector.detect(text))
            await pacer.breathe()
        return found

    async def translate(
        self,
        texts: Sequence[str],
        *,
        target: str | None,
        source: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        policy: Policy | None = None,
        glossary: Mapping[str, Any] | None = None,
    ) -> list[TextResult]:
        """Translate whole texts: one result (text and segments) per input, in order.

        Each text goes through its own stream, fed once and closed. Every segment that
        needs a translation is cut first, so that a request that cannot be queued whole is
        refused before anything starts; the answer is out by the deadline.
        """
        check_texts(self.settings, texts)
        resolved = self.streams.resolve(target)
        chain = self.dispatcher.chain(backend)
        src = canonicalize(source) if source else None
        glossed = self.streams.glossary_for(resolved, glossary)
        streams = [self.streams.oneshot(resolved, chain, src, model=model, policy=policy,
                                        glossary=glossed) for _ in texts]
        try:
            pacer = Pacer()
            for stream, text in zip(streams, texts, strict=True):
                await _feed_all(stream, text, pacer)
            self.admission.check_room(chain, sum(s.unstarted for s in streams))
            for stream in streams:
                stream.start_deferred()
            for stream in streams:
                await stream.wait_emitted()
            return [stream.text_result() for stream in streams]
        finally:
            for stream in streams:
                stream.drop()  # nobody reads a late one-shot answer: drop it unrun


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _feed_all(stream: Stream, text: str, pacer: Pacer) -> None:
    await stream.feed(text, pacer)  # gives the loop back while it cuts: other streams' timers run
    await stream.close()
