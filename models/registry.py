"""Build a backend from its name and its config: the one place that knows every backend.

Each backend takes its own config object (``LocalConfig``, ``DeepLConfig``, ...); the
service's settings build them (``Settings.backend_config``), so no setting is declared
here again. A missing extra (torch, deepl, ...) is a BackendConfigError that names it, and
only for a backend that is asked for: the vendor packages are imported inside the backends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from models.base import Translator
from models.deepl import DeepLTranslator
from models.errors import BackendConfigError, MissingExtra
from models.llm import LLMTranslator
from models.local import LocalTranslator
from models.passthrough import PassthroughTranslator
from models.pooled import PoolTranslator


class ConfigSource(Protocol):
    """Where the registry gets each backend's config (``service.settings.Settings``)."""

    def all_backends(self) -> Sequence[str]: ...

    def backend_config(self, name: str) -> object | None: ...


FACTORIES: dict[str, Callable[[Any], Translator]] = {
    "passthrough": lambda _config: PassthroughTranslator(),
    "local": LocalTranslator,
    "deepl": DeepLTranslator,
    "llm": LLMTranslator,
    "pool": PoolTranslator,
}


def build_backend(name: str, source: ConfigSource) -> Translator:
    """Build one backend by name, or raise BackendConfigError naming what to install or set."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise BackendConfigError(
            f"unknown backend {name!r}; choose from {', '.join(sorted(FACTORIES))}")
    try:
        return factory(source.backend_config(name))
    except ModuleNotFoundError as exc:
        # The extra is the backend's name unless the backend says otherwise (the local
        # backend's engines: `local` or `ct2`).
        extra = exc.extra if isinstance(exc, MissingExtra) else name
        raise BackendConfigError(
            f"backend {name!r} needs {exc.name!r}: pip install 'thinktrans[{extra}]'"
        ) from exc


def build_backends(source: ConfigSource) -> dict[str, Translator]:
    """Every backend the settings name (the chain, the extras and passthrough)."""
    return {name: build_backend(name, source) for name in source.all_backends()}
