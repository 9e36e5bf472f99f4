"""Which loaded checkpoint serves a pair: the configured models, and the models requests name.

A pair goes to the first configured model that serves it (``Catalog``); any other name a
request gives is loaded on demand (``OnDemand``), within bounds, because names are the
requests' choice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path

from models.base import first_line
from models.errors import BackendUnavailable, UnsupportedLanguage
from models.languages import base_language, canonical, table_keys
from models.local.checkpoint import (
    FALLBACK_SOURCE,
    LoadError,
    Spec,
    cache_only,
    canonical_name,
    key_or_none,
    lang_token_id,
    licence,
    on_demand_refusal,
    parse_pair_spec,
)
from models.local.engines import Engine
from models.local.slot import Route, Slot, load_slot, warm_up

log = logging.getLogger(__name__)

# How long a failed on-demand load is remembered: asks meanwhile get its reason at once, so a
# mistyped model name costs one load attempt a minute, not one per segment.
EXTRA_RETRY_S = 60.0
# Models loading on demand at once (queued on the one loader thread), and failed names
# remembered: both are the requests' choice, so both are bounded.
MAX_LOADING_ON_DEMAND = 2
MAX_FAILURES_REMEMBERED = 256
# Targets written without spaces between sentences: split parts are rejoined without one.
NO_SPACE_TARGETS = frozenset({"zh-Hans", "zh-Hant", "yue", "ja"})


def route_on(slot: Slot, src: str, tgt: str, no_space: bool) -> Route | None:
    """How ``slot`` serves ``src -> tgt`` (table keys), or None: Marian serves its own pairs
    only, NLLB and M2M every target they have, from any source (one in another script read
    as its language, an unknown one as English)."""
    if tgt not in slot.codes:
        return None
    if slot.family == "marian":
        return Route(slot, None, None, slot.codes[tgt], no_space) if slot.source == src else None
    src_code = (slot.codes.get(src) or slot.codes.get(base_language(src))
                or slot.codes.get(FALLBACK_SOURCE))
    if src_code is None:  # a model without English: any code of its own will do
        src_code = next(iter(slot.codes.values()))
    return Route(slot, src_code, lang_token_id(slot.family, slot.tokenizer, slot.codes[tgt]),
                 "", no_space)


def served(slots: Sequence[Slot]) -> str:
    """What ``slots`` serve, for a reason: their targets, and the Marian pairs."""
    targets = sorted({key for slot in slots for key in slot.codes})
    pairs = [f"{s.source}-{t}" for s in slots if s.family == "marian" for t in s.codes]
    shown = ", ".join(targets[:12]) + (", ..." if len(targets) > 12 else "")
    what = f"{len(targets)} targets ({shown})"
    if pairs:
        what += f"; Marian pairs {', '.join(pairs)}"
    return what


def cannot_load(shown: str) -> str:
    """What a client hears of a model that failed or may not load here: the same for every
    cause, so that names tell nothing of the filesystem."""
    return f"model {shown!r} cannot be loaded here"


class OnDemand:
    """The models requests named, loaded on ``executor`` by ``load`` (a thread of its own, so
    that batches go on meanwhile); the ``max_models`` most recently used are kept. A failed
    load is remembered for ``EXTRA_RETRY_S``, and loads queued at once and failures
    remembered are bounded, as names are the requests' choice. A model an open stream names
    is pinned (``pin``): never dropped for another, and a load that would need one dropped is
    refused with a reason instead.

    ``load`` runs on the executor's thread and raises LoadError (its message is the reason)
    or anything else. The dict of loaded models is replaced, never changed in place, so
    readers need no lock; writers (the event loop's thread and the executor's) take it.
    """

    def __init__(self, load: Callable[[str], Slot], executor: Executor, max_models: int,
                 refusal: Callable[[str], str | None] = lambda name: None) -> None:
        self.max_models = max_models
        self._load = load
        self._refusal = refusal  # why a name may not be loaded here (for the log), or None
        self._executor = executor
        self._slots: dict[str, Slot] = {}  # least recently used first
        self._lock = threading.Lock()
        self._loading: set[str] = set()  # under the lock
        self._failed: dict[str, tuple[float, str]] = {}  # name -> (when, reason)
        # Open streams naming each model (under the lock): one named is never dropped.
        self._pins: dict[str, int] = {}
        self._closed = False

    def get(self, name: str) -> Slot | None:
        return self._slots.get(name)

    def slots(self) -> dict[str, Slot]:
        """The loaded models by name, least recently used first."""
        return self._slots

    def refused(self, name: str, shown: str | None = None) -> str | None:
        """The client's reason when ``name`` failed within EXTRA_RETRY_S or may not be loaded
        here (``refusal``; logged once, remembered as a failure); else None. ``shown``: the
        name as the request spelled it."""
        with self._lock:
            return self._refused(name, name if shown is None else shown)

    def _refused(self, name: str, shown: str) -> str | None:
        """Under the lock: see ``refused``. One neutral reason, whatever the cause (a missing
        path, a file, a bad config, an unreadable one, a refusal): the detail is the log's."""
        failed = self._failed.get(name)
        if failed is not None and time.monotonic() - failed[0] < EXTRA_RETRY_S:
            return cannot_load(shown)
        self._failed.pop(name, None)
        refusal = self._refusal(name)
        if refusal is None:
            return None
        self._remember(name, f"model {name!r} may not be loaded on demand: {refusal}")
        return cannot_load(shown)

    def _remember(self, name: str, detail: str) -> None:
        """Under the lock: a failure, logged here once and remembered for EXTRA_RETRY_S."""
        self._failed[name] = (time.monotonic(), detail)
        while len(self._failed) > MAX_FAILURES_REMEMBERED:  # oldest first
            del self._failed[next(iter(self._failed))]
        log.error("local: on demand: %s", detail)

    def problem(self, name: str, shown: str | None = None) -> str | None:
        """Queue ``name``'s load unless it is loading, failed within EXTRA_RETRY_S or may not
        be loaded here; why it cannot serve yet (None: it is loaded). ``shown``: the name as
        the request spelled it, for the reason."""
        shown = name if shown is None else shown
        with self._lock:
            if name in self._slots:
                return None
            refused = self._refused(name, shown)
            if refused is not None:
                return refused
            if name not in self._loading:
                taken = sum(1 for loaded in self._slots if self._pins.get(loaded))
                if taken + len(self._loading) >= self.max_models:
                    # Loading it would evict a model an open stream uses: not done.
                    return (f"model {shown!r} is not loaded: the {self.max_models} model(s) "
                            "loaded on demand at once (THINKTRANS_LOCAL_MAX_EXTRA_MODELS) are "
                            "in use by open streams; it loads once one of them is over")
                if len(self._loading) >= MAX_LOADING_ON_DEMAND:
                    # Names are the requests' choice: never queue loads without bound.
                    return (f"{len(self._loading)} models are loading on demand "
                            f"already; model {shown!r} is not loaded (try again later)")
                try:
                    self._executor.submit(self._run, name)
                except RuntimeError:  # "cannot schedule new futures after shutdown"
                    return "the local backend is closed"
                self._loading.add(name)
        return f"loading model {shown!r} on demand; it serves once loaded"

    def pin(self, name: str) -> Callable[[], None]:
        """An open stream names ``name``: while it is pinned it is never dropped for another
        (and, once loaded, takes its place in the bound). The release, idempotent, unpins."""
        with self._lock:
            self._pins[name] = self._pins.get(name, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                left = self._pins.pop(name) - 1
                if left:
                    self._pins[name] = left

        return release

    def in_use(self) -> list[str]:
        """The loaded models open streams name."""
        return [name for name in self._slots if self._pins.get(name)]

    def touch(self, name: str) -> None:
        """Make a loaded model the most recently used: the dict's order is the LRU order."""
        with self._lock:
            slots = self._slots
            if name in slots and next(reversed(slots)) != name:
                moved = dict(slots)
                moved[name] = moved.pop(name)
                self._slots = moved

    def close(self) -> None:
        """Drop every loaded model; a load finishing later is dropped too."""
        with self._lock:
            self._closed = True
            self._slots = {}

    def _run(self, name: str) -> None:
        """On the executor's thread: load ``name``, then publish it (a new dict), dropping
        the least recently used beyond ``max_models``; a failure is remembered."""
        started = time.perf_counter()
        slot, reason = self._try_load(name)
        with self._lock:
            self._loading.discard(name)
            if slot is None:
                self._remember(name, f"{reason} (tried again after {EXTRA_RETRY_S:g} s)")
                return
            if self._closed:
                return
            # Dropped only once the new one has loaded, so that a mistyped name never costs
            # a loaded model; meanwhile one model more than the bound is in memory.
            slots = {**self._slots, name: slot}
            while len(slots) > self.max_models:
                dropped = next((other for other in slots
                                if other != name and not self._pins.get(other)), None)
                if dropped is None:  # pinned meanwhile, every one: the bound holds, not it
                    log.warning("local: %r loaded on demand but not kept: every model loaded "
                                "on demand is in use by open streams", name)
                    return
                del slots[dropped]
                log.info("local: dropped %r, the least recently used model loaded on demand "
                         "(THINKTRANS_LOCAL_MAX_EXTRA_MODELS=%d)", dropped, self.max_models)
            self._slots = slots
        log.info("local: %r (%s) loaded on demand in %.1fs", name, slot.family,
                 time.perf_counter() - started)

    def _try_load(self, name: str) -> tuple[Slot | None, str]:
        try:
            return self._load(name), ""
        except LoadError as exc:
            return None, str(exc)
        except Exception as exc:  # never let a bad checkpoint take the service down
            log.exception("local: loading %r on demand failed", name)
            return None, f"loading model {name!r} on demand failed: {first_line(exc)}"


class Catalog:
    """The configured models (``specs``, in order of preference; ``slots`` once loaded), the
    models loaded on demand, and routing a pair to one of them.

    The configured models are loaded together and installed once they all have. A pair goes
    to the first of them that serves it: with ``THINKTRANS_LOCAL_MODELS`` in the order
    written, with ``THINKTRANS_LOCAL_MODEL`` and ``THINKTRANS_LOCAL_MARIAN_MODELS`` a Marian
    checkpoint first (configured for its pair on purpose); a named configured model serves
    alone. Any other name is made canonical first (``key``: any spelling of a configured
    model is it), may resolve only where the operator allows (``model_roots``,
    ``hub_models``), and its client hears one neutral reason for every failure
    (``cannot_load``)."""

    def __init__(self, specs: Sequence[Spec], *, ondemand: Executor, max_extra_models: int,
                 max_input_tokens: int, in_order: bool, model_roots: Sequence[str],
                 hub_models: bool) -> None:
        self.specs = list(specs)
        self.slots: list[Slot] = []  # the configured models once all have loaded
        # Where names loaded on demand may resolve: under these directories, or the hub.
        self._roots = [Path(os.path.realpath(os.path.expanduser(root))) for root in model_roots]
        self._hub_models = hub_models
        self.extras = OnDemand(self._load_named, ondemand, max_extra_models, self._refusal)
        # Each configured model by its canonical name: another spelling of it is it.
        self._configured = {canonical_name(spec.model_id): spec.model_id for spec in self.specs}
        self._configured_ids = frozenset(self._configured.values())
        self._max_input_tokens = max_input_tokens  # for the warm-up of a model loaded on demand
        self._in_order = in_order  # THINKTRANS_LOCAL_MODELS: the order written is the preference
        self._engine: Engine | None = None
        self._engine_note = ""  # "transformers float32", for the entries' notes

    def install(self, slots: list[Slot], engine: Engine) -> None:
        """The configured models have loaded on ``engine``: serve them (and load on it)."""
        self._engine = engine
        self._engine_note = f"{engine.name} {engine.compute_type}"
        self.slots = slots

    def close(self) -> None:
        self.slots = []
        self.extras.close()

    def key(self, model: str) -> str:
        """The name ``model`` is known by here, before anything else looks at it: a
        configured model's id as configured, however it is spelled, else the canonical name
        (``canonical_name``): one model, one load, one conversion, one cache identity."""
        if model in self._configured_ids:
            return model
        key = canonical_name(model)
        _, model_id = parse_pair_spec(key)
        return self._configured.get(model_id) or key

    def knows(self, model: str) -> bool:
        """Whether ``model`` is a configured model or one loaded on demand."""
        return model in self._configured_ids or self.extras.get(model) is not None

    def is_configured(self, model: str) -> bool:
        return model in self._configured_ids

    def languages(self) -> list[str]:
        """The targets the configured models serve (table keys)."""
        return sorted({key for slot in self.slots for key in slot.codes})

    def _refusal(self, name: str) -> str | None:
        return on_demand_refusal(name, self._roots, self._hub_models)

    def model_problem(self, model: str | None, not_ready: str | None,
                      shown: str | None = None) -> str | None:
        """None for the default, a configured model or a loaded extra; for any other name, why
        it cannot serve now, starting its load on demand where that is allowed.
        ``not_ready``: why the configured models have not loaded (None: they have);
        ``shown``: the name as the request spelled it (``model`` is its ``key``)."""
        if model is None or self.knows(model):
            return None
        shown = model if shown is None else shown
        if self.extras.max_models == 0:
            return (
                f"model {shown!r} is not configured (THINKTRANS_LOCAL_MODELS) and loading models "
                "on demand is off (THINKTRANS_LOCAL_MAX_EXTRA_MODELS=0)"
            )
        refused = self.extras.refused(model, shown)
        if refused is not None:
            return refused
        if not_ready is not None:
            # The configured models' load sets the engine up; an extra loads after it.
            return f"model {shown!r} loads on demand once the backend is ready ({not_ready})"
        return self.extras.problem(model, shown)

    def route(self, source: str | None, target: str, model: str | None = None) -> Route:
        """How the pair is served: by the named model alone, or by the first configured model
        that serves it; UnsupportedLanguage when none does."""
        tag = canonical(target)
        if tag is None:
            raise UnsupportedLanguage(f"{target!r} is not a valid BCP 47 target")
        keys = table_keys(tag)  # fa-AF: Dari where a model has it apart, else Persian
        src = key_or_none(source) or FALLBACK_SOURCE
        slots = self._candidates(model)
        if model is not None and not slots:  # an extra dropped since it was asked for
            raise BackendUnavailable(f"model {model!r} is not loaded")
        for slot in slots:
            tgt = next((key for key in keys if key in slot.codes), keys[-1])
            route = route_on(slot, src, tgt, tgt in NO_SPACE_TARGETS)
            if route is not None:
                return route
        who = "the local backend" if model is None else f"model {model!r}"
        raise UnsupportedLanguage(
            f"{who} cannot translate {src} -> {tag}: it serves {served(slots)}",
            source=src,
            target=tag,
        )

    def serving(self, model: str | None, source: str | None, target: str) -> Slot | None:
        """The loaded model that serves the pair (``model`` when named); None when none does,
        or the named one is not loaded."""
        if not self.slots or (model is not None and not self.knows(model)):
            return None
        try:
            return self.route(source, target, model).slot
        except (UnsupportedLanguage, BackendUnavailable):
            return None

    def entries(self, not_loaded: str) -> list[dict[str, object]]:
        """For ``GET /v1/models``: the configured models in order of preference, then the
        extras; ``not_loaded`` is why the configured ones are not (while they are not)."""
        loaded = len(self.slots) == len(self.specs)
        default = self._default_index(loaded)
        entries: list[dict[str, object]] = []
        for i, spec in enumerate(self.specs):
            slot = self.slots[i] if loaded else None
            if slot is not None:
                notes = self._notes(slot)
            else:
                weights = licence(None, spec.model_id)
                notes = f"not loaded: {not_loaded}" + (f"; {weights}" if weights else "")
            entries.append({
                "model": spec.model_id,
                "languages": sorted(slot.codes) if slot is not None else None,
                "default": i == default,
                "notes": notes,
            })
        for name, extra in self.extras.slots().items():
            entries.append({"model": name, "languages": sorted(extra.codes), "default": False,
                            "notes": self._notes(extra, on_demand=True)})
        return entries

    def info(self) -> dict[str, object]:
        """For ``GET /v1/backends``: the models, configured and extra, and the main one's
        family and workers (None until loaded)."""
        main = self.slots[0] if self.slots else None
        extras = list(self.extras.slots())
        return {
            "models": [spec.model_id for spec in self.specs] + extras,
            "extra_models": extras,
            "family": main.family if main else None,
            "marian_pairs": [f"{slot.source}-{target}={slot.model_id}"
                             for slot in self.slots if slot.family == "marian"
                             for target in slot.codes],
            "workers": main.loaded.workers if main else None,
        }

    def _candidates(self, model: str | None) -> list[Slot]:
        """The slots that may serve, in order of preference: the named model's (a configured
        one, else a loaded extra), or every configured one."""
        if model is not None:
            named = [slot for slot in self.slots if slot.model_id == model]
            extra = self.extras.get(model)
            return named or ([extra] if extra is not None else [])
        if self._in_order:
            return self.slots
        # THINKTRANS_LOCAL_MARIAN_MODELS: a Marian checkpoint configured for exactly the pair
        # wins over the main model (it was configured for that pair on purpose); stable sort.
        return sorted(self.slots, key=lambda slot: slot.family != "marian")

    def _default_index(self, loaded: bool) -> int:
        """The configured model that serves a pair when none is named and no Marian checkpoint
        is meant for it: the first NLLB/M2M one, else the first."""
        if loaded:
            marian = [slot.family == "marian" for slot in self.slots]
        else:  # the family is not known yet: a pair prefix is only ever written for Marian
            marian = [spec.pair is not None or spec.marian_only for spec in self.specs]
        return next((i for i, is_marian in enumerate(marian) if not is_marian), 0)

    def _notes(self, slot: Slot, *, on_demand: bool = False) -> str:
        """The family and what it serves, the engine, and the weights' licence (a test
        checkpoint's are random)."""
        if slot.family == "marian":
            what = "marian " + ", ".join(f"{slot.source}-{target}" for target in slot.codes)
        else:
            what = f"{slot.family}, {len(slot.codes)} targets"
        notes = f"{what}, {self._engine_note}" + (", loaded on demand" if on_demand else "")
        weights = ("test checkpoint: random weights, its output is noise" if slot.test_checkpoint
                   else licence(slot.family, slot.model_id))
        return f"{notes}; {weights}" if weights else notes

    def _load_named(self, name: str) -> Slot:
        """On the on-demand thread: load and warm up ``name`` as a configured model is."""
        engine = self._engine
        if engine is None:
            raise LoadError("the local backend has not loaded its configured models")
        pair, model_id = parse_pair_spec(name)
        spec = Spec(model_id, pair, setting="the request's `model`", on_demand=True)
        slot = load_slot(engine, spec, cache_only(spec))
        warm_up(engine, slot, self._max_input_tokens)
        return slot
