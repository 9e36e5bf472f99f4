"""The named size and count limits of a request, checked in one place (each a 4xx that names
the setting to stay under)."""

from __future__ import annotations

from collections.abc import Sequence

from service.exceptions import InputError, PayloadTooLarge
from service.settings import Settings

# The limits a client can read at GET /v1/limits, to stay inside them.
PUBLISHED = (
    "max_request_bytes", "max_texts", "max_text_chars", "max_segment_chars", "max_chunk_chars",
    "max_chunks_per_request", "max_gap", "max_stream_buffer_chars", "max_streams",
    "max_events_retained", "max_queue_size", "max_wait_poll_ms", "deadline_ms",
    "flush_idle_ms", "stream_idle_expire_s", "max_glossary_terms", "max_glossary_term_chars",
)


def check_encodable(text: str, where: str) -> None:
    """Refuse lone surrogates: they cannot be sent back as UTF-8."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where} holds a lone surrogate (invalid UTF-16 escape); "
                         "send valid Unicode text") from None


def check_texts(settings: Settings, texts: Sequence[str]) -> None:
    """The texts of a one-shot translate or detect request."""
    if not texts:
        raise InputError("texts is empty; send at least one text")
    _check_count(len(texts), "texts", settings.max_texts, "MAX_TEXTS")
    _check_each(texts, "texts[{}]", settings.max_text_chars, "MAX_TEXT_CHARS")


def check_chunks(settings: Settings, texts: Sequence[str]) -> None:
    """The chunk texts of one stream POST."""
    _check_count(len(texts), "chunks", settings.max_chunks_per_request,
                 "MAX_CHUNKS_PER_REQUEST")
    _check_each(texts, "chunks[{}].text", settings.max_chunk_chars, "MAX_CHUNK_CHARS")


def _check_count(count: int, what: str, limit: int, setting: str) -> None:
    if count > limit:
        raise PayloadTooLarge(
            f"{count} {what} in one request; at most THINKTRANS_{setting}={limit}"
        )


def _check_each(texts: Sequence[str], where: str, limit: int, setting: str) -> None:
    for i, text in enumerate(texts):
        if len(text) > limit:
            raise PayloadTooLarge(
                f"{where.format(i)} has {len(text)} characters; at most "
                f"THINKTRANS_{setting}={limit}"
            )
        check_encodable(text, where.format(i))
