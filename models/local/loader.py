"""``Loader``: the local backend's configured models loaded on their engine, and what they run on.

One load puts every configured checkpoint on the engine, then warms each up. Under
``local_engine=auto`` a checkpoint CTranslate2 cannot take is loaded on transformers instead,
so the engine, its device and its compute type are known only once a load has run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from importlib.util import find_spec

from models.local import engines
from models.local.checkpoint import LoadError, Spec, cache_only
from models.local.engines import ConversionFailed, EngineOptions
from models.local.slot import Slot, load_slot, warm_up


class Loader:
    """Loads the configured models (``load``, on the worker) and keeps the engine they run on,
    with the facts the backend reports: engine, device, compute type, load time."""

    def __init__(self, engine_name: str, asked: str, options: EngineOptions,
                 specs: Sequence[Spec], max_input_tokens: int, log: logging.Logger) -> None:
        self.engine_name = engine_name
        self.engine = engines.build(engine_name, options)
        self.engine_note: str | None = None  # why the engine is not the one asked for
        self.device: str | None = None
        self.dtype: str | None = None  # the compute type: torch dtype or CTranslate2's type
        self.load_s: float | None = None
        self._asked = asked  # the engine setting: only "auto" falls back
        self._options = options
        self._specs = list(specs)
        self._max_input_tokens = max_input_tokens
        self._log = log  # the backend's: its messages are the backend's

    def load(self, closed: Callable[[], bool]) -> list[Slot]:
        """On the worker: every configured model loaded and warmed up; LoadError (or anything
        a checkpoint raises) when one cannot be, or when ``closed`` says the backend was
        closed meanwhile."""
        started = time.perf_counter()
        # Where each checkpoint comes from, before the engine's imports (seconds of torch):
        # a hub id that neither the hub nor the cache can give fails at once.
        offline = {spec: cache_only(spec) for spec in self._specs}
        try:
            slots = self._load_on(self.engine, offline, closed)
        except ConversionFailed as exc:
            # Under auto, a checkpoint CTranslate2 cannot take is still served, by torch.
            if self._asked != "auto" or find_spec("torch") is None:
                raise
            self.engine_note = f"ctranslate2 could not take the model ({exc}); using transformers"
            self._log.warning("local: %s", self.engine_note)
            self.engine_name = "transformers"
            self.engine = engines.build(self.engine_name, self._options)
            slots = self._load_on(self.engine, offline, closed)
        self.load_s = round(time.perf_counter() - started, 2)
        return slots

    def _load_on(self, engine: engines.Engine, offline: Mapping[Spec, bool],
                 closed: Callable[[], bool]) -> list[Slot]:
        engine.prepare()
        self.device, self.dtype = engine.device, engine.compute_type
        return load_specs(engine, self._specs, offline, self._max_input_tokens, closed)


def load_specs(engine: engines.Engine, specs: list[Spec], offline: Mapping[Spec, bool],
               max_input_tokens: int, closed: Callable[[], bool]) -> list[Slot]:
    """On the worker: load every configured checkpoint on ``engine`` (prepared), each from
    the local cache only where ``offline`` says so, then warm each up; LoadError when
    ``closed`` says the backend was closed meanwhile."""
    slots = []
    for spec in specs:
        if closed():
            raise LoadError("the local backend was closed while loading")
        slots.append(load_slot(engine, spec, offline[spec]))
    for slot in slots:
        warm_up(engine, slot, max_input_tokens)
    return slots
