"""Request and response bodies of the HTTP API (API.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["translated", "same_language", "skipped", "deadline", "error", "no_target"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TranslateRequest(_Strict):
    target: str | None = Field(None, description="BCP 47 target, e.g. 'zh-CN'.", max_length=256)
    source: str | None = Field(
        None, description="BCP 47 source; null: detected per segment.", max_length=256
    )
    backend: str | None = Field(
        None, description="A configured backend or chain; null: the default.", max_length=256
    )
    texts: list[str] = Field(..., description="Texts to translate, each whole.")


class SegmentResult(BaseModel):
    index: int
    original: str
    text: str
    source_lang: str | None
    target: str | None
    status: Status
    backend: str | None
    queued_ms: float
    latency_ms: float
    error: str | None = None


class TextResult(BaseModel):
    text: str
    segments: list[SegmentResult]


class TranslateResponse(BaseModel):
    results: list[TextResult]


class DetectRequest(_Strict):
    texts: list[str]


class DetectResult(BaseModel):
    lang: str | None
    confidence: float
    reliable: bool


class DetectResponse(BaseModel):
    results: list[DetectResult]


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


STREAM_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"


class OpenStreamRequest(_Strict):
    stream_id: str = Field(..., pattern=STREAM_ID_PATTERN,
                           description="1-128 of A-Za-z0-9._:- e.g. '<session>:<message>'.")
    target: str | None = Field(None, max_length=256, description="BCP 47 target.")
    backend: str | None = Field(None, max_length=256, description="Backend or chain.")
    user_text: str | None = Field(
        None, max_length=100_000,
        description="The user's own message; its language is the target when none is given.",
    )


class OpenStreamResponse(BaseModel):
    stream_id: str
    target: str | None
    target_source: Literal["request", "user_text", "default", "none"]


class Chunk(_Strict):
    seq: int = Field(..., ge=0, le=2**53, strict=True, description="0, 1, 2, ... without gaps.")
    text: str


class ChunksRequest(_Strict):
    chunks: list[Chunk]


class ChunksResponse(BaseModel):
    accepted_through: int


class CloseResponse(BaseModel):
    segments: int


class StreamEvent(BaseModel):
    id: int
    type: Literal["segment", "update", "end"]
    data: dict[str, object]


class EventsResponse(BaseModel):
    events: list[StreamEvent]
