"""``LocalTranslator``: the local backend as the service sees it, and its ``LocalConfig``.

It composes the package's parts (the catalog of models, the loader and the retry of its
load) and runs each job off the event loop, in a worker thread it owns: texts cut to the
model's bound, protected spans kept, previews biased and stopped. docs/local-backend.md
describes start-up, readiness and previews as operators see them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from models.base import Job, Translator
from models.errors import BackendConfigError, BackendUnavailable, UnsupportedLanguage
from models.languages import canonical, table_key
from models.local import engines
from models.local.catalog import Catalog
from models.local.checkpoint import model_specs
from models.local.engines import EngineOptions, stopping
from models.local.load_retry import LoadRetry
from models.local.loader import Loader
from models.local.masking import STRATEGIES
from models.local.slot import Bias, Route, Stats, translate_kept

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
    """Seq2seq translation checkpoints run in a worker thread this backend owns.

    Its parts: the threads, the ``Catalog`` (what is loaded and which model serves a pair),
    the ``Loader`` (the configured models on their engine) and the ``LoadRetry`` (that load
    tried until it succeeds, and the readiness it reports); the backend runs jobs on them.
    """

    name = "local"
    # One worker thread: more batches in flight would only queue behind it. It is also why
    # the tokenizer's per-batch ``src_lang`` needs no lock, and why batches never contend for
    # the CPU or GPU.
    max_concurrency = 1

    def __init__(self, config: LocalConfig) -> None:
        engine_name = _checked_engine(config)
        self.config = config
        # The configured loads and every batch run on this thread.
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
        self._models = Loader(engine_name, config.engine, config.engine_options(),
                              self._catalog.specs, config.max_input_tokens, log)
        self._load = LoadRetry(self._executor, self._serve_configured, model_id=model_id,
                               initial_s=config.load_retry_initial_s,
                               max_s=config.load_retry_max_s, log=log)
        self.stats = Stats()
        ready, reason = self._load.ready, self._load.reason
        super().__init__()  # its defaults land on the load (the properties below)...
        self.ready, self.reason = ready, reason  # ...where the load's own, not started, stand

    # -- readiness: the load's ---------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._load.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self._load.ready = value

    @property
    def reason(self) -> str | None:
        return self._load.reason

    @reason.setter
    def reason(self, value: str | None) -> None:
        self._load.reason = value

    @property
    def retrying(self) -> str | None:
        return self._load.retrying

    @retrying.setter
    def retrying(self, value: str | None) -> None:
        self._load.retrying = value

    @property
    def load_attempts(self) -> int:
        return self._load.attempts

    @property
    def load_failures(self) -> int:
        return self._load.failures

    @property
    def _engine(self) -> engines.Engine:
        """The engine the configured models run on: the loader's, which a load under auto
        may replace (the tests spy on it here)."""
        return self._models.engine

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin loading in the worker thread and return at once; retry while it fails."""
        await self._load.start()

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait for the load attempt in flight, ``timeout_s`` at most, starting loading if need
        be; return ``ready``. Between retries (an attempt has failed) it answers False at once:
        it never waits through the backoff."""
        return await self._load.wait_ready(timeout_s)

    async def aclose(self) -> None:
        """Stop retrying and stop both threads; a batch or load already running finishes,
        queued ones are dropped."""
        self._load.close()
        self._catalog.close()  # an on-demand load finishing now is dropped
        # No wait: a running generate or load cannot be interrupted and must not block the loop.
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._ondemand.shutdown(wait=False, cancel_futures=True)
        await self._load.aclose()

    def _serve_configured(self, closed: Callable[[], bool]) -> bool:
        """On the worker, for the load: the configured models loaded and served; False when
        ``closed`` turned true meanwhile."""
        slots = self._models.load(closed)
        if closed():
            return False
        if any(slot.test_checkpoint for slot in slots):
            # Random weights, text in no language: the batcher's output check is off. (Not
            # for a test checkpoint a request named: it is on for the configured ones.)
            self.capabilities = replace(self.capabilities, checked_output=False)
        models = self._models
        self._catalog.install(slots, models.engine)
        log.info(
            "local: ready in %.1fs: %s (%s) on %s, %s/%s, %d languages",
            models.load_s, self.model_id, slots[0].family, models.engine_name, models.device,
            models.dtype, len(self._catalog.languages()),
        )
        return True

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
        config, models = self.config, self._models
        return (f"local|{slot.model_id}|v={slot.version}|{models.engine_name}|{models.dtype}"
                f"|beams={config.num_beams}|ngram={config.no_repeat_ngram_size}"
                f"|maxin={config.max_input_tokens}|device={models.device}{_spans_key(config)}")

    def catalog(self) -> list[dict[str, object]]:
        """The configured models in order of preference, then the extras loaded on demand."""
        return self._catalog.entries(self.reason or "the backend has not been started")

    def info(self) -> dict[str, object]:
        """Model, family, device, dtype and language count, for ``GET /v1/backends``."""
        languages = self.languages()
        models = self._models
        return {
            "model": self.model_id,
            **self._catalog.info(),  # models, extra_models, family, marian_pairs, workers
            "engine": models.engine_name,
            "compute_type": models.dtype,
            "device": models.device,
            "dtype": models.dtype,
            "languages": len(languages) if languages is not None else None,
            "num_beams": self.config.num_beams,
            "no_repeat_ngram_size": self.config.no_repeat_ngram_size,
            "threads": models.engine.threads if self.ready else self.config.threads,
            "engine_note": models.engine_note,
            "output_tokens": self.stats.output_tokens,  # generated since start, for benchmarks
            "preview_biased": self.stats.biased_rows,  # preview texts decoded towards the last
            "spans": {"masked": self.stats.spans_masked, "fallback": self.stats.spans_fallback},
            "load_s": models.load_s,
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
                translate_kept, self._models.engine, route, list(job.texts),
                self.config.max_input_tokens, self.stats, job.protected,
                self.config.span_strategy, _bias(job, self.config, self._models.engine_name)))
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise BackendUnavailable("the local backend is closed") from exc
        try:
            return await future
        except asyncio.CancelledError:
            # aclose() dropped the queued batch: that is an outage, not our caller's cancel.
            task = asyncio.current_task()
            if self._load.closed and not (task is not None and task.cancelling()):
                raise BackendUnavailable("the local backend closed before the batch ran") from None
            raise


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

