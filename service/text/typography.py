"""A target's typography: the whitespace a translation keeps around it, and the targets
written without spaces between sentences (Chinese, Japanese)."""

from __future__ import annotations

import re
import unicodedata

# Targets written without spaces between sentences (nor, mostly, between words).
TIGHT_LANGUAGES = frozenset({"zh", "ja", "yue", "wuu", "lzh"})
# Spaces after a full-width sentence end, before more text: "。 然后" is "。然后" there.
_SPACE_AFTER_WIDE_END = re.compile(r"(?<=[。！？．…」』）】])[ \t\u3000]+(?=\S)")


def is_tight(target: str | None) -> bool:
    """Whether ``target`` puts no space between sentences (Chinese, Japanese)."""
    return target is not None and target.split("-", 1)[0].lower() in TIGHT_LANGUAGES


def keep_whitespace(original: str, translated: str, *, tight: bool = False) -> str:
    """The translation with the original's leading and trailing whitespace; for a
    ``tight`` target (``is_tight``) without the spaces between sentences: spaces after a
    full-width sentence end go, and so do the original's trailing spaces (not its line
    breaks) after a translation that ends in a wide character ("。", "的"); after Latin
    text ("config.yaml") they stay."""
    core = original.strip()
    if not core:
        return original
    start = original.index(core[0])
    end = len(original.rstrip())
    body, trail = translated.strip(), original[end:]
    if tight:
        body = _SPACE_AFTER_WIDE_END.sub("", body)
        if body and unicodedata.east_asian_width(body[-1]) in "WF":
            trail = trail.lstrip(" \t\u3000")  # "。 " before the next sentence: "。"
    return original[:start] + body + trail
