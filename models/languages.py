"""BCP 47 tags as the backends see them: a usable tag or none, and the key into a vendor table.

Each backend keeps its vendor's codes in a table keyed by language, or ``language-Script``
where the script changes the code (``zh-Hans``, ``zh-Hant``). This module maps a tag to that
key; the tables themselves live with their backends (``models.local``, ``models.deepl``,
``models.llm``).
"""

from __future__ import annotations

import re

import langcodes

MAX_TAG_LENGTH = 64
_TAG_SHAPE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*")
# Codes that detectors or clients use for a language kept under another key.
ALIASES = {"no": "nb", "tl": "fil", "iw": "he", "in": "id"}
# Languages whose script changes the key, and the scripts that have a key of their own.
_SCRIPT_KEYED = {"zh": frozenset({"Hans", "Hant"})}


def canonical(tag: object) -> str | None:
    """The canonical form of a BCP 47 tag (``ZH-cn`` -> ``zh-CN``), or None when it is not one.

    The service canonicalises targets before they reach a backend, with messages for the
    client (``service.text.tags``); a backend called directly only needs to refuse what is not
    a tag, so that nothing else reaches a vendor or a prompt.
    """
    if not isinstance(tag, str) or len(tag) > MAX_TAG_LENGTH or not _TAG_SHAPE.fullmatch(tag):
        return None
    try:
        if not langcodes.tag_is_valid(tag):
            return None
        standard = langcodes.standardize_tag(tag)
    except (ValueError, langcodes.LanguageTagError):
        return None
    if langcodes.Language.get(standard).language in (None, "und"):
        return None
    return standard


def base_language(tag: str) -> str:
    """The language subtag of a tag: ``zh-Hant-TW`` -> ``zh``."""
    return langcodes.Language.get(tag).language or tag.split("-")[0].lower()


def region(tag: str) -> str | None:
    """The region subtag of a tag, if it has one: ``pt-BR`` -> ``BR``."""
    return langcodes.Language.get(tag).territory


def table_key(tag: str) -> str:
    """The tables' key for a tag: ``zh-TW`` -> ``zh-Hant``, ``no`` -> ``nb``, ``de-AT`` -> ``de``.

    Raises ValueError (``langcodes.LanguageTagError``) when ``tag`` cannot be parsed.
    """
    base = base_language(tag)
    scripts = _SCRIPT_KEYED.get(base)
    if scripts is not None:
        # The script a tag names or implies: zh-TW and zh-HK are Traditional, zh Simplified.
        script = langcodes.Language.get(tag).maximize().script
        return f"{base}-{script}" if script in scripts else base
    return ALIASES.get(base, base)
