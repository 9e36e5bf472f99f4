"""What the instance reports of itself: its languages, models, limits, backends and
readiness (``GET /v1/languages``, ``/v1/models``, ``/v1/limits``, ``/v1/backends``,
``/readyz`` and the ``thinktrans_backend_ready`` gauge), and the start-up warning of a
chain that cannot translate into the default target.

``StatusReport`` only reads: it is given the runtime's backends, their batchers, the
cache, the settings and the metrics, and changes none of them but the readiness gauge.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from models.base import Translator
from service.chain.batcher import Batcher
from service.chain.cache import TranslationCache
from service.ops.metrics import Metrics
from service.settings import Settings
from service.text.limits import PUBLISHED

# The start-up warning is the runtime's, as it always was.
log = logging.getLogger("thinktrans.runtime")


class StatusReport:
    """The reports of one runtime's parts."""

    def __init__(
        self, settings: Settings, backends: dict[str, Translator],
        batchers: dict[str, Batcher], cache: TranslationCache | None, metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.batchers = batchers
        self.cache = cache
        self.metrics = metrics

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


    async def warn_unserved_default(self) -> None:
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


