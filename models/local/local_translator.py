"""``LocalTranslator``: the local backend as the service sees it, and its ``LocalConfig``.

It keeps the model off the event loop, in threads of its own, and keeps the service up
while a model cannot load: it starts at once, answers not ready with the reason, and tries
the load again with backoff, so a directory mounted later or a hub that comes back is
picked up without a restart. docs/local-backend.md describes start-up, readiness and
previews as operators see them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import TypeVar

from models.base import Job, Translator, first_line
from models.errors import BackendConfigError, BackendUnavailable, UnsupportedLanguage
from models.languages import canonical, table_key
from models.local import engines
from models.local.catalog import Catalog
from models.local.checkpoint import LoadError, Spec, model_specs
from models.local.engines import ConversionFailed, EngineOptions, stopping
from models.local.masking import STRATEGIES
from models.local.slot import Bias, Route, Slot, Stats, load_slot, translate_kept, warm_up

_T = TypeVar("_T")

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LocalConfig:
    """What the local backend runs and how. Its values come from the ``local_*`` settings
    (``Settings.local_config()``), where each default is; so nothing here has one but the
    retry's first delay, which is no setting."""

    # Hub id or directory; a Marian one may name its pair first: ``en-de=DIR``.
    model: str
    # Extra Marian checkpoints, one per pair, each ``src-tgt=ID_OR_DIR``.
    marian_models: tuple[str, ...]
    # Several models in order of preference, each as ``model`` takes it; when set, it replaces
    # ``model`` and ``marian_models``.
    models: tuple[str, ...]
    # Models not configured but named by requests, kept loaded at once (LRU); 0: never loaded.
    max_extra_models: int
    # Where those may resolve: directories under these roots (none: no directory), and hub
    # ids when ``hub_models``; a configured model, however spelled, is always served.
    model_roots: tuple[str, ...]
    hub_models: bool
    engine: str  # auto (ctranslate2 where installed), ctranslate2, transformers
    device: str  # auto (CUDA when present), cpu, cuda:0
    dtype: str  # transformers: auto, float32, float16, bfloat16
    compute_type: str  # ctranslate2: auto (int8 on CPU, int8_float16 on CUDA), ...
    num_beams: int
    # CTranslate2: a preview's decoding biased towards its sentence's previous preview
    # (``prefix_bias_beta``, in [0, 1), with at least 2 beams); 0: off.
    preview_bias: float
    no_repeat_ngram_size: int  # the loop guard; 0: off
    max_input_tokens: int  # longer segments are split and rejoined
    threads: int | None  # CPU threads; None: the engine's default
    ct2_cache: str | None  # where checkpoints are converted to; None: beside the HF cache
    ct2_workers: int | None  # parts of a batch run at once; None: by the model's size
    ct2_cache_mb: float | None  # the conversion cache's bound; None: unbounded
    # A failed load is tried again after load_retry_initial_s, doubling up to this long.
    load_retry_max_s: float
    # How protected spans are kept: "mask" (the family's placeholders; the prose runs between
    # the spans, translated on their own, where one is lost) or "runs" (the runs always).
    span_strategy: str
    load_retry_initial_s: float = 5.0

    def engine_options(self) -> EngineOptions:
        return EngineOptions(
            device=self.device, dtype=self.dtype, compute_type=self.compute_type,
            threads=self.threads, ct2_workers=self.ct2_workers, num_beams=self.num_beams,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
            ct2_cache=Path(self.ct2_cache).expanduser() if self.ct2_cache else None,
            ct2_cache_bytes=(int(self.ct2_cache_mb * (1 << 20)) if self.ct2_cache_mb is not None
                             else None),
        )


class LocalTranslator(Translator):
    """Seq2seq translation checkpoints run in a worker thread this backend owns."""

    name = "local"
    # One worker thread: more batches in flight would only queue behind it. It is also why
    # the tokenizer's per-batch ``src_lang`` needs no lock, and why batches never contend for
    # the CPU or GPU.
    max_concurrency = 1

    def __init__(self, config: LocalConfig) -> None:
        super().__init__()
        self.engine_name = _checked_engine(config)
        self.config = config
        self._engine = engines.build(self.engine_name, config.engine_options())
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thinktrans-local")
        # On-demand loads get a thread of their own: a big model loading never holds up the
        # batches of the streams that did not ask for it.
        self._ondemand = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="thinktrans-local-ondemand")
        self._catalog = Catalog(
            model_specs(config.model, config.marian_models, config.models),
            ondemand=self._ondemand, max_extra_models=config.max_extra_models,
            max_input_tokens=config.max_input_tokens, in_order=bool(config.models),
            model_roots=config.model_roots, hub_models=config.hub_models,
        )
        self.model_id = model_id = self._catalog.specs[0].model_id
        # The load attempt in flight (None between attempts) and the task that retries.
        self._attempt: asyncio.Future[bool] | None = None
        self._loader: asyncio.Task[None] | None = None
        self.load_attempts = 0
        self.load_failures = 0
        self._closed = False
        self.device: str | None = None
        self.dtype: str | None = None  # the compute type: torch dtype or CTranslate2's type
        self.engine_note: str | None = None  # why the engine is not the one asked for
        self.load_s: float | None = None
        self.stats = Stats()
        self.ready = False
        self.reason = f"model {model_id!r} not loaded: the backend has not been started"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin loading in the worker thread and return at once; retry while it fails."""
        if self._loader is not None or self._closed:
            return
        self.reason = f"loading model {self.model_id!r}"
        loop = asyncio.get_running_loop()
        first = self._begin_attempt(loop)
        self._loader = loop.create_task(self._load_until_ready(first),
                                        name="thinktrans-local-load")

    def _begin_attempt(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[bool]:
        self.load_attempts += 1
        attempt = loop.run_in_executor(self._executor, self._load)
        self._attempt = attempt
        return attempt

    async def _load_until_ready(self, attempt: asyncio.Future[bool]) -> None:
        """Await each load attempt; after a failure, wait (5 s, doubling, capped) and retry."""
        loop = asyncio.get_running_loop()
        delay = self.config.load_retry_initial_s
        while not await attempt and not self._closed:
            self.load_failures += 1
            self._attempt = None
            wait = min(delay, self.config.load_retry_max_s)
            delay = wait * 2
            # The reason stays as the attempt left it (every segment carries it); the
            # schedule is /readyz's and the log's.
            failed = self.load_attempts
            self.retrying = f"{_attempt_name(failed)} failed; trying again in {wait:g} s"
            log.error("local: %s; %s", self.reason, self.retrying)
            await asyncio.sleep(wait)
            if self._closed:
                return
            self.retrying = f"trying again now (attempt {failed + 1})"
            try:
                attempt = self._begin_attempt(loop)
            except RuntimeError:  # the executor is shut down: closed meanwhile
                return
        self.retrying = None

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait for the load attempt in flight, ``timeout_s`` at most, starting loading if need
        be; return ``ready``. Between retries (an attempt has failed) it answers False at once:
        it never waits through the backoff."""
        if self._loader is None:
            await self.start()
        future = self._attempt
        if future is None:  # closed before it started, or waiting to retry
            return self.ready
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            # The load itself was dropped by aclose(); only our own cancellation propagates.
            task = asyncio.current_task()
            if not future.cancelled() or (task is not None and task.cancelling()):
                raise
        return self.ready

    async def aclose(self) -> None:
        """Stop retrying and stop both threads; a batch or load already running finishes,
        queued ones are dropped."""
        self._closed = True
        self.ready = False
        self.reason = "the local backend is closed"
        self.retrying = None
        self._catalog.close()  # an on-demand load finishing now is dropped
        # No wait: a running generate or load cannot be interrupted and must not block the loop.
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._ondemand.shutdown(wait=False, cancel_futures=True)
        loader = self._loader
        if loader is not None and not loader.done():
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)

    # -- what it serves ----------------------------------------------------------------------

    def languages(self) -> list[str] | None:
        """Table keys (BCP 47) of the targets the configured models serve; None until loaded."""
        return self._catalog.languages() if self.ready else None

    def serves_target(self, target: str) -> bool | None:
        """Whether a loaded checkpoint translates into ``target`` (from any source); None
        until loaded."""
        if not self.ready:
            return None
        tag = canonical(target)
        return tag is not None and table_key(tag) in self._catalog.languages()

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Whether the pair is servable (by ``model`` when named: a configured model or one
        loaded on demand); True until loaded, as the languages are not known yet."""
        if not self.ready:
            return True
        try:
            self._catalog.route(source, target, self._key(model))
        except UnsupportedLanguage:
            return False
        except BackendUnavailable:
            return True  # a model dropped since it was asked for: translate says why
        return True

    def _key(self, model: str | None) -> str | None:
        """The name a request's ``model`` is known by here (``Catalog.key``)."""
        return None if model is None else self._catalog.key(model)

    def use_model(self, model: str) -> Callable[[], None]:
        """An open stream names ``model``: loaded on demand, it stays (``OnDemand.pin``)."""
        key = self._catalog.key(model)
        if self._catalog.is_configured(key):
            return super().use_model(model)
        return self._catalog.extras.pin(key)

    def model_problem(self, model: str | None) -> str | None:
        """None for the default, a configured model or a loaded extra; for any other name, why
        it cannot serve now, starting its load on demand where that is allowed."""
        return self._catalog.model_problem(self._key(model),
                                           None if self.ready else str(self.reason), model)

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model that serves the pair (see ``run``); a named extra not loaded yet is its
        own name; None when not ready or when nothing serves the pair."""
        if not self.ready:
            return None
        model = self._key(model)
        if model is not None and not self._catalog.knows(model):
            return model
        slot = self._catalog.serving(model, source, target)
        return None if slot is None else model or slot.model_id

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        """Everything but the text that decides the output: the model serving the pair, the
        engine, its compute type and device, the decoding options; None when nothing loaded
        serves the pair."""
        slot = self._catalog.serving(self._key(model), source, target) if self.ready else None
        if slot is None:
            return None
        config = self.config
        return (f"local|{slot.model_id}|v={slot.version}|{self.engine_name}|{self.dtype}"
                f"|beams={config.num_beams}|ngram={config.no_repeat_ngram_size}"
                f"|maxin={config.max_input_tokens}|device={self.device}{_spans_key(config)}")

    def catalog(self) -> list[dict[str, object]]:
        """The configured models in order of preference, then the extras loaded on demand."""
        return self._catalog.entries(self.reason or "the backend has not been started")

    def info(self) -> dict[str, object]:
        """Model, family, device, dtype and language count, for ``GET /v1/backends``."""
        languages = self.languages()
        return {
            "model": self.model_id,
            **self._catalog.info(),  # models, extra_models, family, marian_pairs, workers
            "engine": self.engine_name,
            "compute_type": self.dtype,
            "device": self.device,
            "dtype": self.dtype,
            "languages": len(languages) if languages is not None else None,
            "num_beams": self.config.num_beams,
            "no_repeat_ngram_size": self.config.no_repeat_ngram_size,
            "threads": self._engine.threads if self.ready else self.config.threads,
            "engine_note": self.engine_note,
            "output_tokens": self.stats.output_tokens,  # generated since start, for benchmarks
            "preview_biased": self.stats.biased_rows,  # preview texts decoded towards the last
            "spans": {"masked": self.stats.spans_masked, "fallback": self.stats.spans_fallback},
            "load_s": self.load_s,
            "load_attempts": self.load_attempts,
            "load_failures": self.load_failures,
            "ready": self.ready,
            "reason": self.reason,
        }

    # -- translation -------------------------------------------------------------------------

    async def run(self, job: Job) -> list[str]:
        """Translate in the worker thread; the event loop only waits. ``contexts`` is unused.

        ``model`` None: the first configured model that serves the pair. A configured model's
        id: that model alone (UnsupportedLanguage when it cannot serve the pair). Any other
        name: the model loaded on demand, BackendUnavailable until it is.
        """
        return (await self.run_kept(job))[0]

    async def run_kept(self, job: Job) -> tuple[list[str], list[str | None]]:
        """``run``, and per text how its spans were kept: "masked", "fallback" or None."""
        if not self.ready:
            raise BackendUnavailable(self.reason or f"model {self.model_id!r} is not loaded")
        route = _route(self._catalog, job)
        if not job.texts:
            return [], []
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, _stoppable, job.stop, functools.partial(
                translate_kept, self._engine, route, list(job.texts),
                self.config.max_input_tokens, self.stats, job.protected,
                self.config.span_strategy, _bias(job, self.config, self.engine_name)))
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise BackendUnavailable("the local backend is closed") from exc
        try:
            return await future
        except asyncio.CancelledError:
            # aclose() dropped the queued batch: that is an outage, not our caller's cancel.
            task = asyncio.current_task()
            if self._closed and not (task is not None and task.cancelling()):
                raise BackendUnavailable("the local backend closed before the batch ran") from None
            raise

    # -- loading the configured models -------------------------------------------------------

    def _load(self) -> bool:
        """Runs in the worker: load every configured model, warm up, then flip ``ready``. On
        failure ``reason`` says why (the caller logs it) and the answer is False."""
        started = time.perf_counter()
        try:
            slots = self._load_all()
        except LoadError as exc:
            self.reason = str(exc)
            return False
        except Exception as exc:  # never let a bad checkpoint take the service down
            self.reason = f"loading model {self.model_id!r} failed: {first_line(exc)}"
            log.exception("local: loading %r failed", self.model_id)
            return False
        if self._closed:
            return False
        if any(slot.test_checkpoint for slot in slots):
            # Random weights, text in no language: the batcher's output check is off. (Not
            # for a test checkpoint a request named: it is on for the configured ones.)
            self.capabilities = replace(self.capabilities, checked_output=False)
        self._catalog.install(slots, self._engine)
        self.load_s = round(time.perf_counter() - started, 2)
        self.reason = None
        self.ready = True
        log.info(
            "local: ready in %.1fs: %s (%s) on %s, %s/%s, %d languages",
            self.load_s, self.model_id, slots[0].family, self.engine_name, self.device,
            self.dtype, len(self._catalog.languages()),
        )
        return True

    def _load_all(self) -> list[Slot]:
        try:
            return self._load_with(self._engine)
        except ConversionFailed as exc:
            # Under auto, a checkpoint CTranslate2 cannot take is still served, by torch.
            if self.config.engine != "auto" or find_spec("torch") is None:
                raise
            self.engine_note = f"ctranslate2 could not take the model ({exc}); using transformers"
            log.warning("local: %s", self.engine_note)
            self.engine_name = "transformers"
            self._engine = engines.build(self.engine_name, self.config.engine_options())
            return self._load_with(self._engine)

    def _load_with(self, engine: engines.Engine) -> list[Slot]:
        engine.prepare()
        self.device, self.dtype = engine.device, engine.compute_type
        return load_specs(engine, self._catalog.specs, self.config.max_input_tokens,
                          lambda: self._closed)


def load_specs(engine: engines.Engine, specs: list[Spec], max_input_tokens: int,
               closed: Callable[[], bool]) -> list[Slot]:
    """On the worker: load every configured checkpoint on ``engine`` (prepared), then warm
    each up; LoadError when ``closed`` says the backend was closed meanwhile."""
    slots = []
    for spec in specs:
        if closed():
            raise LoadError("the local backend was closed while loading")
        slots.append(load_slot(engine, spec))
    for slot in slots:
        warm_up(engine, slot, max_input_tokens)
    return slots


def _route(catalog: Catalog, job: Job) -> Route:
    """The route that serves ``job``: its pair on the model it names (a model loaded on
    demand touched, BackendUnavailable while it is not loaded), else on the first that
    serves the pair."""
    model = None if job.model is None else catalog.key(job.model)
    if model is not None and not catalog.is_configured(model):
        problem = catalog.model_problem(model, None, job.model)
        if problem is not None:
            raise BackendUnavailable(problem)
        catalog.extras.touch(model)
    return catalog.route(job.source, job.target, model)


def _stoppable(stop: threading.Event | None, call: Callable[[], _T]) -> _T:
    """``call()`` in the worker thread, its decodes stopped once ``stop`` is set (a preview
    job's ``Job.stop``: models/local/engines.py)."""
    with stopping(stop):
        return call()


def _bias(job: Job, config: LocalConfig, engine: str) -> Bias | None:
    """How ``job`` is biased: towards each text's previous preview for a preview job on
    CTranslate2 with ``preview_bias`` > 0; None (plain decoding) for any other.

    The bias moves a preview's output towards what was shown, never a final segment's
    (``job.preview`` is False for those, whatever ``previous`` holds)."""
    if not job.preview or not job.previous or config.preview_bias <= 0 or engine != "ctranslate2":
        return None
    return Bias(list(job.previous), config.preview_bias)


def _spans_key(config: LocalConfig) -> str:
    """The span strategy in a cache identity: named unless the default, so that keys made
    before it still hold (it decides only the output of texts with spans, whose keys hold
    the spans)."""
    return "" if config.span_strategy == "mask" else f"|spans={config.span_strategy}"


def _checked_engine(config: LocalConfig) -> str:
    """The engine ``config`` asks for, resolved; BackendConfigError for a bad config, and
    MissingExtra when a package it needs is not installed."""
    if config.engine not in engines.ENGINES:
        raise BackendConfigError(f"local_engine must be one of {', '.join(engines.ENGINES)}, "
                                 f"got {config.engine!r}")
    engine = engines.resolve(config.engine)
    engines.require_packages(engine)
    if config.max_extra_models < 0:
        raise BackendConfigError(
            f"local_max_extra_models must be >= 0, got {config.max_extra_models}")
    if not 0 <= config.preview_bias < 1:
        raise BackendConfigError(f"local_preview_bias must be in [0, 1), got "
                                 f"{config.preview_bias!r}")
    if config.span_strategy not in STRATEGIES:
        raise BackendConfigError(f"local_span_strategy must be one of {', '.join(STRATEGIES)}, "
                                 f"got {config.span_strategy!r}")
    return engine


def _attempt_name(number: int) -> str:
    return "the first attempt" if number == 1 else f"attempt {number}"
