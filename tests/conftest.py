from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from models.base import Translator
from service.app import create_app
from service.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings read THINKTRANS_* variables; a test sees only the ones it sets."""
    for name in list(os.environ):
        if name.startswith("THINKTRANS_") or name == "DEEPL_AUTH_KEY":
            monkeypatch.delenv(name)
    yield


def make_settings(**overrides: Any) -> Settings:
    overrides.setdefault("backend", "passthrough")
    return load_settings(**overrides)


class Running:
    """An app with its lifespan running and an in-process HTTP client."""

    def __init__(self, app: FastAPI, client: httpx.AsyncClient) -> None:
        self.app = app
        self.client = client

    @property
    def pipeline(self) -> Any:
        return self.app.state.pipeline

    async def metric(self, name: str, **labels: str) -> float:
        value = self.app.state.metrics.registry.get_sample_value(name, labels or None)
        return float(value or 0.0)


async def start_app(
    settings: Settings, backends: dict[str, Translator] | None = None
) -> AsyncIterator[Running]:
    app = create_app(settings, backends=backends)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield Running(app, client)


@pytest.fixture
async def passthrough_app() -> AsyncIterator[Running]:
    async for running in start_app(make_settings(default_locale="zh-CN")):
        yield running
