"""thinktrans-client: the agent side of thinktrans (httpx and the standard library only).

``ThinktransClient`` talks to a thinktrans sidecar over its HTTP API: one-shot
``translate``, and ``stream`` for thinking that arrives as deltas, with a fallback to the
originals whenever the sidecar is down, slow or failing. ``ThoughtTranslator`` and
``translate_messages`` translate ACP ``agent_thought_chunk`` updates in place, and
``advertise_locales`` tells an ACP client which locales it may ask for.
"""

from __future__ import annotations

from thinktrans_client.acp import (
    ThoughtTranslator,
    advertise_locales,
    default_lane,
    locale_from_initialize,
    translate_messages,
)
from thinktrans_client.client import (
    Policy,
    Preview,
    SegmentUpdate,
    SidecarError,
    StreamItem,
    ThinkingStream,
    ThinktransClient,
    TranslatedSegment,
    TranslatedText,
    safe_stream_id,
)
from thinktrans_client.locale import InvalidLocale

__all__ = [
    "InvalidLocale",
    "Policy",
    "Preview",
    "SegmentUpdate",
    "SidecarError",
    "StreamItem",
    "ThinkingStream",
    "ThinktransClient",
    "ThoughtTranslator",
    "TranslatedSegment",
    "TranslatedText",
    "advertise_locales",
    "default_lane",
    "locale_from_initialize",
    "safe_stream_id",
    "translate_messages",
]
