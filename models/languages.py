"""BCP 47 tags: the one canonicaliser, the language a tag names, and the key into a vendor table.

One canonical form everywhere (``standardize``: langcodes' standardisation), so that a tag
the client wrote, a setting and a backend's table compare equal. Each backend keeps its
vendor's codes in a table keyed by language, or ``language-Script`` where the script changes
the code (``zh-Hans``, ``zh-Hant``, ``ks-Deva``); ``table_key`` maps a tag to that key.
"""

from __future__ import annotations

import enum
import re
import unicodedata

import langcodes

MAX_TAG_LENGTH = 64
_TAG_SHAPE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*")
# Control, format (bidi marks, zero-width), line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Codes that stay distinct in canonical form but name one language to every backend and to
# allowed-locale matching: ``no`` (the macrolanguage) is written as Bokmal. Withdrawn codes
# (``tl``, ``iw``, ``in``) never get here: standardisation has already replaced them.
ALIASES = {"no": "nb"}
# Individual languages the tables write as their macrolanguage, where the macrolanguage's tag
# means that member (a user who writes ``ar`` wants Standard Arabic, ``arb``).
_MACROLANGUAGES = {
    "arb": "ar", "ayr": "ay", "azj": "az", "dik": "din", "pes": "fa", "knc": "kr", "kmr": "ku",
    "lvs": "lv", "plt": "mg", "khk": "mn", "zsm": "ms", "npi": "ne", "gaz": "om", "ory": "or",
    "pbt": "ps", "quy": "qu", "als": "sq", "swh": "sw", "uzn": "uz", "ydd": "yi",
}  # fmt: skip
# Languages whose script changes the key, and the scripts that have a key of their own: the
# others, and a tag that names none, go to the plain key (``ks`` and ``ks-Arab`` are ``ks``;
# ``ks-Deva`` is ``ks-Deva``). Chinese has no plain key: ``zh`` is ``zh-Hans``. ``sr-Latn`` is a
# key of its own, so that Latin Serbian is never served by a table's Cyrillic one.
_SCRIPT_KEYED = {
    "zh": frozenset({"Hans", "Hant"}), "ks": frozenset({"Deva"}), "ace": frozenset({"Arab"}),
    "bjn": frozenset({"Arab"}), "kr": frozenset({"Arab"}), "taq": frozenset({"Tfng"}),
    "sr": frozenset({"Latn"}),
}


class TagFault(enum.Enum):
    """Why a value is not a usable tag; the service turns each into its own message."""

    EMPTY = "not a string, or empty"
    TOO_LONG = "longer than MAX_TAG_LENGTH"
    UNSAFE = "control, bidi or separator characters"
    SHAPE = "not the shape of a BCP 47 tag"
    INVALID = "unregistered subtags, or no language"


def standardize(tag: object) -> str | TagFault:
    """The canonical form of a BCP 47 tag (``ZH-cn`` -> ``zh-CN``, ``tl`` -> ``fil``), or why not.

    Never raises; the shape is checked before langcodes sees the value.
    """
    if not isinstance(tag, str) or not tag:
        return TagFault.EMPTY
    if len(tag) > MAX_TAG_LENGTH:
        return TagFault.TOO_LONG
    if any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in tag):
        return TagFault.UNSAFE
    if not _TAG_SHAPE.fullmatch(tag):
        return TagFault.SHAPE
    try:
        if not langcodes.tag_is_valid(tag):
            return TagFault.INVALID
        standard = langcodes.standardize_tag(tag)
    except (ValueError, langcodes.LanguageTagError):
        return TagFault.INVALID
    if langcodes.Language.get(standard).language in (None, "und"):
        return TagFault.INVALID
    return standard


def canonical(tag: object) -> str | None:
    """The canonical form of a BCP 47 tag (``ZH-cn`` -> ``zh-CN``), or None when it is not one.

    The service canonicalises targets before they reach a backend, with messages for the
    client (``service.text.tags``); a backend called directly only needs to refuse what is not
    a tag, so that nothing else reaches a vendor or a prompt.
    """
    standard = standardize(tag)
    return standard if isinstance(standard, str) else None


def base_language(tag: str) -> str:
    """The language subtag of a tag: ``zh-Hant-TW`` -> ``zh``."""
    return langcodes.Language.get(tag).language or tag.split("-")[0].lower()


def language_key(tag: str) -> str:
    """The language a tag names, with codes for one language made one: ``no-NO`` -> ``nb``."""
    base = base_language(tag)
    return ALIASES.get(base, base)


def region(tag: str) -> str | None:
    """The region subtag of a tag, if it has one: ``pt-BR`` -> ``BR``."""
    return langcodes.Language.get(tag).territory


def table_key(tag: str) -> str:
    """The tables' key for a tag: ``zh-TW`` -> ``zh-Hant``, ``no`` -> ``nb``, ``de-AT`` -> ``de``,
    ``arb`` -> ``ar``, ``ks-Deva`` -> ``ks-Deva``.

    Raises ValueError (``langcodes.LanguageTagError``) when ``tag`` cannot be parsed.
    """
    base = language_key(tag)
    base = _MACROLANGUAGES.get(base, base)
    scripts = _SCRIPT_KEYED.get(base)
    if scripts is not None:
        # The script a tag names or implies: zh-TW and zh-HK are Traditional, zh Simplified.
        script = langcodes.Language.get(tag).maximize().script
        if script in scripts:
            return f"{base}-{script}"
    return base


def table_keys(tag: str) -> tuple[str, ...]:
    """The keys to look a tag up by, the most specific first: with its region where it has
    one (``fa-AF`` -> ``fa-AF``, ``fa``), for a table that keeps a region's variety apart
    (NLLB-200's Dari); else ``table_key`` alone.

    Raises ValueError (``langcodes.LanguageTagError``) when ``tag`` cannot be parsed.
    """
    key = table_key(tag)
    territory = region(tag)
    return (f"{key}-{territory}", key) if territory else (key,)
