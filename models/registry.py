"""Build a backend from its name. Heavy imports happen inside each branch."""

from __future__ import annotations

from collections.abc import Callable

from models.base import Translator
from service.errors import ConfigError
from service.settings import Settings


def _passthrough(settings: Settings) -> Translator:
    from models.passthrough import PassthroughTranslator

    return PassthroughTranslator()


def _local(settings: Settings) -> Translator:
    from models.local import LocalTranslator

    return LocalTranslator.from_settings(settings)


def _deepl(settings: Settings) -> Translator:
    from models.deepl import DeepLTranslator

    return DeepLTranslator.from_settings(settings)


def _llm(settings: Settings) -> Translator:
    from models.llm import LLMTranslator

    return LLMTranslator.from_settings(settings)


FACTORIES: dict[str, Callable[[Settings], Translator]] = {
    "passthrough": _passthrough,
    "local": _local,
    "deepl": _deepl,
    "llm": _llm,
}


def build_backend(name: str, settings: Settings) -> Translator:
    """Build one backend by name, or raise ConfigError naming what to install or set."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown backend {name!r}; choose from {', '.join(sorted(FACTORIES))}"
        )
    try:
        return factory(settings)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"backend {name!r} needs {exc.name!r}: pip install 'thinktrans[{name}]'"
        ) from exc


def build_backends(settings: Settings) -> dict[str, Translator]:
    """Every backend the settings name (the chain, the extras and passthrough)."""
    return {name: build_backend(name, settings) for name in settings.all_backends()}
