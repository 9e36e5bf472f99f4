"""The wire shapes of the HTTP API (API.md): request bodies, results and stream events.

These models are used at run time, not only for the OpenAPI document: a segment's result
is built as a ``SegmentResult`` wherever it comes from (one-shot or stream), and events
carry the same objects. Optional fields (``error``) are left out of the JSON when they
hold their default: serialise with ``exclude_defaults=True``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

Status = Literal["translated", "same_language", "skipped", "deadline", "error", "no_target",
                 "hidden"]
Policy = Literal["translate", "hide"]
UpdateStatus = Literal["translated", "error"]
TargetSource = Literal["request", "user_text", "default", "none"]

STREAM_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
_DOT_SEGMENTS = frozenset({".", ".."})


def check_stream_id(value: str) -> str:
    """Refuse the ids that no client can address: curl, httpx and browsers remove ``.``
    and ``..`` path segments, so ``/v1/streams/../events`` never reaches the stream."""
    if value in _DOT_SEGMENTS:
        raise PydanticCustomError(
            "stream_id_unreachable",
            "'{value}' cannot be a stream id: HTTP clients remove '.' and '..' from URL paths, "
            "so the stream could never be reached; choose another id", {"value": value})
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- results -------------------------------------------------------------------------------


class SegmentResult(BaseModel):
    """One segment's result: the one output shape, for one-shot requests and streams."""

    index: int
    original: str
    text: str = Field(description="What to show: the translation, or the original.")
    source_lang: str | None
    target: str | None
    status: Status
    backend: str | None
    queued_ms: float
    latency_ms: float
    error: str | None = Field(None, description="Why a segment is `error` (absent otherwise).")
    model: str | None = Field(None, description="The model that translated it (absent when "
                              "the backend has none, or nothing translated it).")
    cached: bool = Field(False, description="True when it came from the translation cache "
                         "(absent otherwise).")


class SegmentUpdate(BaseModel):
    """A late translation of a segment that went out as `deadline` (an `update` event)."""

    index: int
    text: str
    status: UpdateStatus
    backend: str | None
    error: str | None = None
    model: str | None = None
    cached: bool = False


class StreamEnd(BaseModel):
    """The last event of a stream: every segment and every owed update is out."""

    segments: int


class TextResult(BaseModel):
    text: str = Field(description="The whole text, translated where needed.")
    segments: list[SegmentResult]


# -- stream events -------------------------------------------------------------------------


class SegmentEvent(BaseModel):
    id: int
    type: Literal["segment"]
    data: SegmentResult


class PreviewResult(BaseModel):
    """A provisional translation of the sentence still open, which will be segment ``index``;
    that segment supersedes it. No ``original``: the join invariant is the segments'."""

    index: int = Field(description="The index the sentence's segment will have.")
    text: str = Field(description="The provisional translation (its last words masked).")
    source_chars: int = Field(description="How many characters of the open sentence it "
                                          "covers, from the sentence's start.")
    revision: int = Field(description="1 for the sentence's first preview, rising.")


class PreviewEvent(BaseModel):
    id: int
    type: Literal["preview"]
    data: PreviewResult


class UpdateEvent(BaseModel):
    id: int
    type: Literal["update"]
    data: SegmentUpdate


class EndEvent(BaseModel):
    id: int
    type: Literal["end"]
    data: StreamEnd


StreamEvent = Annotated[SegmentEvent | PreviewEvent | UpdateEvent | EndEvent,
                        Field(discriminator="type")]


class EventsResponse(BaseModel):
    events: list[StreamEvent]


# -- requests and responses ----------------------------------------------------------------

_MODEL = ("A model for the chain's backends to use (GET /v1/models lists what each serves; "
          "advice, not a whitelist: another name is tried, and a backend that cannot serve "
          "it passes the segment down the chain); null: each backend's own choice.")
_POLICY = ("What becomes of segments not in the target language: `translate`, or `hide` "
           "(status `hidden`, empty text, nothing sent to a backend); null: the server's "
           "THINKTRANS_POLICY.")


class GlossaryIn(_Strict):
    """A request's or stream's glossary; the server's (THINKTRANS_GLOSSARY_FILE) applies too,
    and this one wins a source term both name."""

    terms: dict[str, str] = Field(
        default_factory=dict,
        description="Source term -> target term: each occurrence (any case, a whole word) is "
        "rendered as given.")
    keep: list[str] = Field(
        default_factory=list, description="Terms kept as they are (protected spans).")


_GLOSSARY = ("Terms rendered as given and terms kept as they are; limits at GET /v1/limits "
             "(max_glossary_terms, max_glossary_term_chars).")


class TranslateRequest(_Strict):
    target: str | None = Field(None, description="BCP 47 target, e.g. 'zh-CN'.", max_length=256)
    source: str | None = Field(
        None, description="BCP 47 source; null: detected per segment.", max_length=256
    )
    backend: str | None = Field(
        None, description="A configured backend or chain; null: the default.", max_length=256
    )
    model: str | None = Field(None, min_length=1, max_length=256, description=_MODEL)
    policy: Policy | None = Field(None, description=_POLICY)
    glossary: GlossaryIn | None = Field(None, description=_GLOSSARY)
    texts: list[str] = Field(..., description="Texts to translate, each whole.")


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


class OpenStreamRequest(_Strict):
    stream_id: Annotated[str, AfterValidator(check_stream_id)] = Field(
                           ..., pattern=STREAM_ID_PATTERN,
                           description="1-128 of A-Za-z0-9._:- e.g. '<session>:<message>'.")
    target: str | None = Field(None, max_length=256, description="BCP 47 target.")
    backend: str | None = Field(None, max_length=256, description="Backend or chain.")
    model: str | None = Field(None, min_length=1, max_length=256, description=_MODEL)
    policy: Policy | None = Field(None, description=_POLICY)
    glossary: GlossaryIn | None = Field(None, description=_GLOSSARY)
    previews: bool | None = Field(
        None, description="Provisional translations (`preview` events) of a sentence while "
        "it streams, each superseded by its `segment`; null: the server's THINKTRANS_PREVIEWS.")
    user_text: str | None = Field(
        None, max_length=100_000,
        description="The user's own message; its language is the target when none is given.",
    )


class OpenStreamResponse(BaseModel):
    stream_id: str
    target: str | None
    target_source: TargetSource
    model: str | None = None
    policy: Policy = "translate"
    previews: bool = Field(False, description="Whether the stream's open sentence is "
                                              "previewed (`preview` events).")


class Chunk(_Strict):
    seq: int = Field(..., ge=0, le=2**53, strict=True, description="0, 1, 2, ... without gaps.")
    text: str


class ChunksRequest(_Strict):
    chunks: list[Chunk]


class ChunksResponse(BaseModel):
    accepted_through: int


class CloseResponse(BaseModel):
    segments: int


class StreamSummary(BaseModel):
    """One stream of ``GET /v1/streams``: its id and target, no text."""

    stream_id: str
    target: str | None
    state: Literal["open", "ended"] = Field(
        description="`open` until its `end` event is out; `ended` streams are kept for late "
                    "readers within THINKTRANS_MAX_ENDED_STREAMS and _BYTES.")
    segments: int = Field(description="Segments cut so far.")
    started: str = Field(description="When it was opened: RFC 3339, UTC.")
    last_active: str = Field(description="Its last chunk, close or open: RFC 3339, UTC.")


class StreamsResponse(BaseModel):
    streams: list[StreamSummary] = Field(description="Newest first.")
