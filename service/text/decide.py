"""What to do with one segment: skip it, keep it, or translate it, and from which language."""

from __future__ import annotations

from dataclasses import dataclass

from service.schemas import Policy, Status
from service.text.detect import Detection
from service.text.segmenter import Kind, is_translatable
from service.text.tags import full_script, same_language


@dataclass(frozen=True, slots=True)
class Decision:
    """A final status, or ``status=None``: translate, from ``send_source`` (None: detect)."""

    status: Status | None
    source_lang: str | None  # what the segment is in, as best known
    send_source: str | None  # the source given to the backend


SKIP = Decision("skipped", None, None)


def wants_detection(text: str, kind: Kind) -> bool:
    """Whether a segment is prose worth detecting (code, numbers and blanks are not)."""
    return kind == "text" and is_translatable(text)


def leans_on_memory(detection: Detection | None, fallback_lang: str | None) -> bool:
    """Whether ``decide`` would read a segment as ``fallback_lang`` (the stream's recent
    language) against what its own detection says: an unreliable detection in the same
    script as the fallback, of another language or of none. A clear script signal (Han in
    a German stream) never leans on memory."""
    if fallback_lang is None or detection is None or detection.reliable:
        return False
    if detection.lang is None:
        return True
    return (full_script(detection.lang) == full_script(fallback_lang)
            and not same_language(detection.lang, fallback_lang))


def settled_memory(memory: str | None, next_lang: str | None) -> str | None:
    """The memory a held segment is decided with, once the next segment is known: the
    stream's recent language between two of it, or with no clear next language (none
    came in time, or it was unclear too); none before a segment reliably in another
    language (a switch: the held segment keeps its own detection)."""
    if next_lang is not None and memory is not None and not same_language(next_lang, memory):
        return None
    return memory


def decide(
    prose: bool,
    *,
    target: str | None,
    detection: Detection | None,
    fallback_lang: str | None,
    source: str | None = None,
    policy: Policy,
) -> Decision:
    """Skip, keep, or translate one segment.

    ``prose`` is ``wants_detection`` of the segment: anything else is skipped. ``source``
    (the request's own) wins over ``detection``. ``fallback_lang`` (a stream's
    recent reliable language) stands in for an unreliable detection of a short segment
    such as "OK." or "Hmm,", when it shares the segment's script. Under ``policy``
    "hide", a segment that would be translated is ``hidden`` instead.
    """
    if not prose:
        return SKIP
    lang: str | None
    send: str | None
    if source is not None:
        lang = send = source
    elif detection is not None and detection.reliable:
        lang = send = detection.lang
    elif fallback_lang is not None and (
        detection is None or detection.lang is None
        or full_script(detection.lang) == full_script(fallback_lang)
    ):
        # "OK." in a German stream is German; but Latin text in a Chinese stream is not
        # Chinese, so the fallback must share the script.
        lang = send = fallback_lang
    else:
        lang, send = (detection.lang if detection else None), None
    if target is None:
        return Decision("no_target", lang, None)
    if lang is not None and same_language(lang, target):
        return Decision("same_language", lang, None)
    if policy == "hide":
        return Decision("hidden", lang, None)
    return Decision(None, lang, send)
