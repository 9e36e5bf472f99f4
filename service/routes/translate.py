"""One-shot requests: translate and detect whole texts."""

from __future__ import annotations

from fastapi import APIRouter

from service.deps import RuntimeDep
from service.problems import problem_responses
from service.schemas import (
    DetectRequest,
    DetectResponse,
    DetectResult,
    TranslateRequest,
    TranslateResponse,
)

router = APIRouter(prefix="/v1", responses=problem_responses(401, 413, 422))


@router.post("/translate", response_model=TranslateResponse, response_model_exclude_defaults=True,
             responses=problem_responses(503))
async def translate(body: TranslateRequest, runtime: RuntimeDep) -> TranslateResponse:
    """Translate whole texts; segments not in the target language go to the backend."""
    results = await runtime.translate(body.texts, target=body.target, source=body.source,
                                      backend=body.backend)
    return TranslateResponse(results=results)


@router.post("/detect", response_model=DetectResponse)
async def detect(body: DetectRequest, runtime: RuntimeDep) -> DetectResponse:
    """Detect each text's language."""
    return DetectResponse(results=[
        DetectResult(lang=det.lang, confidence=det.confidence, reliable=det.reliable)
        for det in runtime.detect_texts(body.texts)
    ])
