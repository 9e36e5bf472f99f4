"""Configs for tests that build a backend, a batcher, a segmenter or a part of the pool by
hand: each goes through the settings, where every default is, so that a test names only
what it changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import httpx

from models.base import Translator
from models.deepl import DeepLConfig
from models.llm import LLMConfig
from models.local import LocalConfig
from models.pooled import PoolConfig
from pool.calls import CallLimits
from pool.clients import Clients, Sharing
from pool.fair import FairQueue
from pool.lanes import Lanes
from service.chain.batcher import BatchLimits
from service.settings import Settings, load_settings
from service.text.segmenter import Piece, Segmenter


def local_config(**settings: Any) -> LocalConfig:
    """``local_*`` settings (``local_model="x"``) as the local backend's config."""
    return load_settings(**settings).local_config()


def deepl_config(**settings: Any) -> DeepLConfig:
    """``deepl_*`` settings as the DeepL backend's config."""
    s = load_settings(**settings)
    return s.deepl_config(batch_timeout_s=s.backend_timeout_s)


def llm_config(**settings: Any) -> LLMConfig:
    """``llm_*`` settings as the LLM backend's config."""
    return load_settings(**settings).llm_config()


def pool_config(transport: httpx.AsyncBaseTransport | None = None,
                **settings: Any) -> PoolConfig:
    """``pool_*`` settings as the `pool` backend's config, calling through ``transport``
    (a ``httpx.MockTransport``) where one is given."""
    s = load_settings(**settings)
    config = s.pool_config(batch_timeout_s=s.backend_timeout_s, port=s.port)
    return dataclasses.replace(config, transport=transport)


def batch_limits(translator: Translator, **limits: Any) -> BatchLimits:
    """The settings' batch limits for ``translator``, with ``limits`` (by their names in
    ``BatchLimits``) put over them."""
    return dataclasses.replace(BatchLimits.from_settings(load_settings(), translator), **limits)


def segmenter(max_chars: int | None = None, *, max_fence_chars: int | None = None) -> Segmenter:
    """A segmenter of the settings' default ``max_segment_chars`` and ``max_fence_chars``,
    or of those given."""
    fields = Settings.model_fields
    return Segmenter(fields["max_segment_chars"].default if max_chars is None else max_chars,
                     max_fence_chars=(fields["max_fence_chars"].default
                                      if max_fence_chars is None else max_fence_chars))


def segment(text: str, max_chars: int | None = None, *,
            max_fence_chars: int | None = None) -> list[Piece]:
    """``text`` cut whole by ``segmenter(max_chars, max_fence_chars=...)``."""
    seg = segmenter(max_chars, max_fence_chars=max_fence_chars)
    return [*seg.feed(text), *seg.flush()]


def call_limits(**settings: Any) -> CallLimits:
    """``pool_max_*`` settings as what one call to the pool may carry."""
    return CallLimits.from_settings(load_settings(**settings))


def sharing(**settings: Any) -> Sharing:
    """``pool_clients``, ``pool_client_max_waiting``, ``pool_max_clients``,
    ``pool_metrics_max_clients``, ``pool_fair`` and ``pool_fair_unit`` as how a replica shares
    its engine."""
    return Sharing.from_settings(load_settings(**settings))


def clients(*, shared_sha256: str | None = None, **settings: Any) -> Clients:
    """A replica's clients from the settings (``pool_clients={"alice": {"token": ...}}``);
    ``shared_sha256``: the hash of ``pool_token``, as the deployment hands it over."""
    share = sharing(**settings)
    return Clients(share.policies, shared_sha256=shared_sha256, max_waiting=share.max_waiting,
                   max_clients=share.max_clients,
                   metrics_max_clients=share.metrics_max_clients)


def fair_queue(weight: Callable[[str], float] | None = None, **settings: Any) -> FairQueue[Any]:
    """A replica's fair queue from ``pool_fair`` and ``pool_fair_unit``, each client's share
    by ``weight`` where one is given."""
    share = sharing(**settings)
    if weight is None:
        return FairQueue(fair=share.fair, unit=share.unit)
    return FairQueue(fair=share.fair, unit=share.unit, weight=weight)


def lanes(weight: Callable[[str], float], **settings: Any) -> Lanes[Any]:
    """A replica's lanes (segments, previews) from ``pool_fair`` and ``pool_fair_unit``,
    each client's share by ``weight``."""
    share = sharing(**settings)
    return Lanes(fair=share.fair, unit=share.unit, weight=weight)
