"""One-shot requests: translate and detect whole texts."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from service.http.deps import RuntimeDep
from service.http.problems import problem_responses
from service.schemas import (
    DetectRequest,
    DetectResponse,
    DetectResult,
    GlossaryIn,
    TranslateRequest,
    TranslateResponse,
)


def _glossary(glossary: GlossaryIn | None) -> dict[str, Any] | None:
    return None if glossary is None else glossary.model_dump()


router = APIRouter(prefix="/v1", responses=problem_responses(401, 408, 413, 415, 421, 422))


@router.post("/translate", response_model=TranslateResponse, responses=problem_responses(503))
async def translate(body: TranslateRequest, runtime: RuntimeDep) -> Response:
    """Translate whole texts; segments not in the target language go to the backend."""
    results = await runtime.translate(body.texts, target=body.target, source=body.source,
                                      backend=body.backend, model=body.model,
                                      policy=body.policy,
                                      glossary=_glossary(body.glossary))
    # Serialised here: the results are built as the response model already, and FastAPI
    # would validate them again on the way out.
    answer = TranslateResponse(results=results).model_dump_json(exclude_defaults=True)
    return Response(answer, media_type="application/json")


@router.post("/detect", response_model=DetectResponse)
async def detect(body: DetectRequest, runtime: RuntimeDep) -> DetectResponse:
    """Detect each text's language."""
    return DetectResponse(results=[
        DetectResult(lang=det.lang, confidence=det.confidence, reliable=det.reliable)
        for det in await runtime.detect_texts(body.texts)
    ])
