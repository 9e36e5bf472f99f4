"""The runtime: everything the service runs on, opened and closed as one async context.

``Runtime`` builds, in order, the backends, one batcher per backend, the detector, the
dispatcher that runs segments down backend chains, admission (the room of their queues)
and the stream manager; on exit it stops them in reverse. The app's lifespan, the CLI's
``translate`` and ``compare`` all open a runtime; none of them needs an HTTP app to
translate.

A one-shot request is a stream fed once and closed: the same code cuts, detects,
decides, batches, waits on the deadline and emits, whatever brought the text.
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
from service.schemas import Policy, TextResult
from service.settings import Settings
from service.stream.admission import Admission
from service.stream.cutting import Pacer
from service.stream.manager import Stream, StreamManager
from service.text.detect import Detection, Detector, get_detector
from service.text.limits import PUBLISHED, check_texts
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
                watch = asyncio.get_running_loop().create_task(self._warn_unserved_default())
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

    def languages(self) -> dict[str, Any]:
        """Supported targets per backend and model, the default target, the allowed ones,
        and ``targets``: what the default chain can translate into now (None: any)."""
        backends = {}
        for name, t in self.backends.items():
            entry: dict[str, Any] = {"ready": t.ready,
                                     "targets": t.languages() if t.ready else None}
            if not t.ready:
                entry["reason"] = t.reason
            models = {str(m["model"]): m.get("languages") for m in t.catalog()}
            if models:
                entry["models"] = models
            backends[name] = entry
        return {
            "default_target": self.settings.default_locale,
            "allowed_locales": self.settings.allowed_locales or None,
            "targets": self.chain_targets(),
            "backends": backends,
        }

    def chain_targets(self) -> list[str] | None:
        """The targets the default chain's ready backends serve, within ``allowed_locales``;
        None when one of them takes any target and no locales are set. A client offers
        only these (the ACP helper puts them in ``initialize``'s ``_meta``)."""
        ready = [t for name in self.settings.backend if (t := self.backends[name]).ready]
        allowed = self.settings.allowed_locales
        if allowed:
            return [tag for tag in allowed if any(t.serves_target(tag) for t in ready)]
        found: set[str] = set()
        for t in ready:
            targets = t.languages()
            if targets is None:
                return None
            found.update(targets)
        return sorted(found)

    def models(self) -> dict[str, Any]:
        """The advisory catalog: what each backend can serve. A request may name any
        model; one not listed is tried."""
        return {"models": [{"backend": name, **entry}
                           for name, t in self.backends.items() for entry in t.catalog()]}

    def limits(self) -> dict[str, Any]:
        """The size and count limits this instance enforces."""
        return {name: getattr(self.settings, name) for name in PUBLISHED}

    def backends_info(self) -> dict[str, Any]:
        """Configured backends, the default chain, readiness, whether each translates into
        the default target (None: not known yet, or no default) and queue depth."""
        chain = self.settings.backend
        target = self.settings.default_locale
        out = []
        for name, t in self.backends.items():
            serves = t.serves_target(target) if t.ready and target is not None else None
            reason = t.reason or self.batchers[name].breaker_reason
            if serves is False and target is not None:
                reason = reason or _unserved(t, target)
            out.append({"name": name, "ready": t.ready, "reason": reason,
                        "serves_default_target": serves, "in_chain": name in chain,
                        "queue_depth": self.batchers[name].queue_size, "info": t.info()})
        cache = self.cache.info() if self.cache is not None else None
        return {"chain": chain, "default_target": target, "backends": out, "cache": cache}

    def readiness(self) -> dict[str, Any]:
        """``ready``: every backend of the chain is ready and, when there is a default
        target, can translate into it. ``degraded``: some backend is ready, but not every
        one can serve (the chain falls through), or none of the ready ones translates into
        the default target (they still serve other targets). ``not_ready``: none is ready.

        Each backend's reason; a ready one that cannot translate into the default target
        says so (a model's languages are judged only once it has loaded). ``reason`` on top
        unless ``ready``."""
        target = self.settings.default_locale
        states: dict[str, dict[str, Any]] = {}
        serving: list[str] = []
        for name in self.settings.backend:
            t = self.backends[name]
            self.metrics.backend_ready.labels(name).set(1 if t.ready else 0)
            reason = t.reason if t.ready or not t.retrying else f"{t.reason}; {t.retrying}"
            if t.ready and (target is None or t.serves_target(target) is not False):
                serving.append(name)
            elif t.ready and target is not None:
                reason = _unserved(t, target)
            states[name] = {"ready": t.ready, "reason": reason}
        out: dict[str, Any] = {"status": "ready", "backends": states}
        others = [name for name in states if name not in serving]
        if not others:
            return out
        if not any(state["ready"] for state in states.values()):
            out["status"] = "not_ready"
            out["reason"] = f"no backend of the chain is ready: {', '.join(others)}"
        elif not serving:
            out["status"] = "degraded"
            out["reason"] = (f"no backend of the chain can translate into the default target "
                             f"{target} (THINKTRANS_DEFAULT_LOCALE): segments for it fail; "
                             "GET /v1/languages lists each backend's targets")
        else:
            out["status"] = "degraded"
            out["reason"] = (f"{', '.join(others)} cannot serve (see its reason); the chain "
                             f"falls through to {', '.join(serving)}")
        return out

    async def _warn_unserved_default(self) -> None:
        """Log a warning, once, for each backend of the chain that cannot translate into the
        default target, as soon as its languages are known (a model's: once it has loaded)."""
        target = self.settings.default_locale
        if target is None:
            return
        pending = list(dict.fromkeys(self.settings.backend))
        pause = 0.05
        while pending:
            for name in list(pending):
                t = self.backends[name]
                verdict = t.serves_target(target) if t.ready else None
                if verdict is None:
                    continue
                pending.remove(name)
                if not verdict:
                    log.warning("backend %r %s", name, _unserved(t, target),
                                extra={"backend": name, "default_target": target,
                                       "targets": t.languages()})
            if pending:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)


def _unserved(translator: Translator, target: str) -> str:
    """Why a ready backend does not count for the default target: the targets it serves."""
    served = translator.languages()
    shown = ("its targets are not listed" if served is None else
             "it serves " + (", ".join(served[:12]) + (", ..." if len(served) > 12 else "")
                             if served else "no target"))
    return (f"cannot translate into the default target {target} (THINKTRANS_DEFAULT_LOCALE): "
            f"{shown}; GET /v1/languages lists them")


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _feed_all(stream: Stream, text: str, pacer: Pacer) -> None:
    await stream.feed(text, pacer)  # gives the loop back while it cuts: other streams' timers run
    await stream.close()
