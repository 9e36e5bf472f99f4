"""What this instance offers: languages, models, limits and backends."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.http.deps import StatusDep
from service.http.problems import problem_responses

router = APIRouter(prefix="/v1", responses=problem_responses(401, 421))


@router.get("/languages")
async def languages(status: StatusDep) -> dict[str, Any]:
    """Supported targets per backend, the default target and the allowed ones."""
    return status.languages()


@router.get("/models")
async def models(status: StatusDep) -> dict[str, Any]:
    """The advisory catalog: the models each backend can serve (a request may name any)."""
    return status.models()


@router.get("/limits")
async def limits(status: StatusDep) -> dict[str, Any]:
    """The size and count limits this instance enforces, so clients can stay inside."""
    return status.limits()


@router.get("/backends")
async def backends(status: StatusDep) -> dict[str, Any]:
    """Configured backends, the default chain, readiness and queue depth."""
    return status.backends_info()
