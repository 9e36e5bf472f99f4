"""Build a backend from its name: the one place that turns settings into backend configs.

Heavy imports (torch, transformers, deepl) happen inside each branch, so a missing extra
is a BackendConfigError that names it, and only for a backend that is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from models.base import Translator
from models.errors import BackendConfigError, MissingExtra

if TYPE_CHECKING:
    from models.local import LocalConfig


class Secret(Protocol):
    """A value kept out of reprs and logs (pydantic's ``SecretStr``)."""

    def get_secret_value(self) -> str: ...


class BackendSettings(Protocol):
    """What the registry reads from the service's settings (``service.settings.Settings``)."""

    def all_backends(self) -> Sequence[str]: ...

    @property
    def backend_timeout_s(self) -> float: ...

    @property
    def local_model(self) -> str: ...
    @property
    def local_marian_models(self) -> Sequence[str]: ...
    @property
    def local_models(self) -> Sequence[str]: ...
    @property
    def local_max_extra_models(self) -> int: ...
    @property
    def local_engine(self) -> str: ...
    @property
    def local_device(self) -> str: ...
    @property
    def local_compute_type(self) -> str: ...
    @property
    def local_ct2_cache(self) -> str | None: ...
    @property
    def local_no_repeat_ngram_size(self) -> int: ...
    @property
    def local_ct2_workers(self) -> int | None: ...
    @property
    def local_dtype(self) -> str: ...
    @property
    def local_num_beams(self) -> int: ...
    @property
    def local_max_input_tokens(self) -> int: ...
    @property
    def local_threads(self) -> int | None: ...
    @property
    def load_retry_max_s(self) -> float: ...

    @property
    def deepl_api_key(self) -> Secret | None: ...
    @property
    def deepl_server_url(self) -> str | None: ...
    @property
    def deepl_threads(self) -> int: ...
    @property
    def deepl_model_type(self) -> str: ...
    @property
    def deepl_formality(self) -> str | None: ...
    @property
    def deepl_context(self) -> bool: ...
    @property
    def deepl_english_variant(self) -> str: ...

    @property
    def llm_base_url(self) -> str | None: ...
    @property
    def llm_model(self) -> str | None: ...
    @property
    def llm_api_key(self) -> Secret | None: ...
    @property
    def llm_timeout_s(self) -> float: ...
    @property
    def llm_concurrency(self) -> int: ...
    @property
    def llm_json_mode(self) -> bool: ...
    @property
    def llm_check_items(self) -> bool: ...
    @property
    def llm_context(self) -> bool: ...

    @property
    def pool_url(self) -> str | None: ...
    @property
    def pool_token(self) -> Secret | None: ...
    @property
    def pool_concurrency(self) -> int: ...


def _secret(value: Secret | None) -> str | None:
    return value.get_secret_value() if value is not None else None


def _passthrough(settings: BackendSettings) -> Translator:
    from models.passthrough import PassthroughTranslator

    return PassthroughTranslator()


def local_config(settings: BackendSettings) -> LocalConfig:
    """The local engine's config from the ``local_*`` settings (the local backend's, and the
    pool's replicas')."""
    from models.local import LocalConfig

    return LocalConfig(
        model=settings.local_model,
        marian_models=tuple(settings.local_marian_models),
        models=tuple(settings.local_models),
        max_extra_models=settings.local_max_extra_models,
        engine=settings.local_engine,
        device=settings.local_device,
        dtype=settings.local_dtype,
        compute_type=settings.local_compute_type,
        ct2_cache=settings.local_ct2_cache,
        ct2_workers=settings.local_ct2_workers,
        num_beams=settings.local_num_beams,
        no_repeat_ngram_size=settings.local_no_repeat_ngram_size,
        max_input_tokens=settings.local_max_input_tokens,
        threads=settings.local_threads,
        load_retry_max_s=settings.load_retry_max_s,
    )


def _local(settings: BackendSettings) -> Translator:
    from models.local import LocalTranslator

    return LocalTranslator(local_config(settings))


def _pool(settings: BackendSettings) -> Translator:
    from models.pool import PoolConfig, PoolTranslator

    return PoolTranslator(
        PoolConfig(
            url=settings.pool_url,
            token=_secret(settings.pool_token),
            timeout_s=settings.backend_timeout_s,
            concurrency=settings.pool_concurrency,
        )
    )


def _deepl(settings: BackendSettings) -> Translator:
    from models.deepl import DeepLConfig, DeepLTranslator

    return DeepLTranslator(
        DeepLConfig(
            api_key=_secret(settings.deepl_api_key),
            server_url=settings.deepl_server_url,
            threads=settings.deepl_threads,
            model_type=settings.deepl_model_type,
            formality=settings.deepl_formality,
            context=settings.deepl_context,
            english_variant=settings.deepl_english_variant,
            # One attempt may not outlast the batch it serves.
            request_timeout_s=min(10.0, settings.backend_timeout_s),
        )
    )


def _llm(settings: BackendSettings) -> Translator:
    from models.llm import LLMConfig, LLMTranslator

    return LLMTranslator(
        LLMConfig(
            base_url=settings.llm_base_url,
            model=settings.llm_model,
            api_key=_secret(settings.llm_api_key),
            timeout_s=settings.llm_timeout_s,
            concurrency=settings.llm_concurrency,
            json_mode=settings.llm_json_mode,
            check_items=settings.llm_check_items,
            context=settings.llm_context,
        )
    )


FACTORIES: dict[str, Callable[[BackendSettings], Translator]] = {
    "passthrough": _passthrough,
    "local": _local,
    "deepl": _deepl,
    "llm": _llm,
    "pool": _pool,
}


def build_backend(name: str, settings: BackendSettings) -> Translator:
    """Build one backend by name, or raise BackendConfigError naming what to install or set."""
    factory = FACTORIES.get(name)
    if factory is None:
        raise BackendConfigError(
            f"unknown backend {name!r}; choose from {', '.join(sorted(FACTORIES))}")
    try:
        return factory(settings)
    except ModuleNotFoundError as exc:
        # The extra is the backend's name unless the backend says otherwise (the local
        # backend's engines: `local` or `ct2`).
        extra = exc.extra if isinstance(exc, MissingExtra) else name
        raise BackendConfigError(
            f"backend {name!r} needs {exc.name!r}: pip install 'thinktrans[{extra}]'"
        ) from exc


def build_backends(settings: BackendSettings) -> dict[str, Translator]:
    """Every backend the settings name (the chain, the extras and passthrough)."""
    return {name: build_backend(name, settings) for name in settings.all_backends()}
