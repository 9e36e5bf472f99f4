"""What the sidecar answers (API.md, 'Segment result'): segments, late updates, previews,
whole texts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Preview", "SegmentUpdate", "StreamItem", "TranslatedSegment", "TranslatedText",
           "optional_str"]


@dataclass(frozen=True, slots=True)
class TranslatedSegment:
    """One segment result (API.md, 'Segment result'); ``text`` is what to show."""

    index: int
    original: str
    text: str
    # translated, same_language, skipped, deadline, error, no_target, or hidden (the
    # stream asked ``policy="hide"``: ``text`` is empty, ``original`` still holds the text)
    status: str
    source_lang: str | None = None
    target: str | None = None
    backend: str | None = None
    error: str | None = None
    queued_ms: float = 0.0
    latency_ms: float = 0.0
    model: str | None = None  # the model that translated it, where the backend has one
    cached: bool = False  # True: it came from the sidecar's translation cache

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TranslatedSegment:
        return cls(
            index=int(data["index"]), original=str(data["original"]), text=str(data["text"]),
            status=str(data["status"]), source_lang=data.get("source_lang"),
            target=data.get("target"), backend=data.get("backend"), error=data.get("error"),
            queued_ms=float(data.get("queued_ms") or 0.0),
            latency_ms=float(data.get("latency_ms") or 0.0),
            model=optional_str(data.get("model")), cached=data.get("cached") is True,
        )


@dataclass(frozen=True, slots=True)
class SegmentUpdate:
    """A late translation of segment ``index``, which went out earlier as ``deadline``."""

    index: int
    text: str
    status: str  # translated, or error when the late translation failed
    backend: str | None = None
    error: str | None = None
    model: str | None = None
    cached: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SegmentUpdate:
        return cls(
            index=int(data["index"]), text=str(data["text"]), status=str(data["status"]),
            backend=data.get("backend"), error=data.get("error"),
            model=optional_str(data.get("model")), cached=data.get("cached") is True,
        )


@dataclass(frozen=True, slots=True)
class Preview:
    """A provisional translation of segment ``index`` while its sentence still streams.

    ``text`` translates the first ``source_chars`` characters of that sentence; each
    preview of an index replaces the one before (``revision`` rises from 1), and the
    segment of the same index replaces them all. Only a stream opened with
    ``previews=True`` yields them, never after their segment.
    """

    index: int
    text: str
    source_chars: int
    revision: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Preview:
        return cls(index=int(data["index"]), text=str(data["text"]),
                   source_chars=int(data["source_chars"]), revision=int(data["revision"]))


@dataclass(frozen=True, slots=True)
class TranslatedText:
    """One text of a one-shot request: the whole text to show and its segments."""

    text: str
    segments: tuple[TranslatedSegment, ...]


# What ``ThinkingStream.results`` yields; a Preview only to a stream that asked for them.
StreamItem = TranslatedSegment | SegmentUpdate | Preview


def optional_str(value: object) -> str | None:
    """A field that is a string or absent; None for anything else (an answer is not trusted)."""
    return value if isinstance(value, str) else None
