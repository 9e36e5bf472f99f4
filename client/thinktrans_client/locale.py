"""BCP 47 tags on the agent side: a well-formedness check and case canonicalisation.

The sidecar is the authority on targets (it knows the registry and the allowed list);
this module only keeps a malformed or unsafe tag from ever being sent, and puts a good
one in canonical case so that it compares equal to the server's form: ``ZH-cn`` ->
``zh-CN``, ``zh-hant-tw`` -> ``zh-Hant-TW``; ``zh_CN`` is not a tag. It does not check
that subtags are registered and does not rewrite deprecated ones beyond a few language
codes, so the sidecar may still refuse a tag (422) or canonicalise it further.

Standard library only. Error messages never contain a tag that failed the shape check.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

__all__ = ["MAX_TAG_LENGTH", "InvalidLocale", "canonicalize", "is_allowed", "language_of"]

MAX_TAG_LENGTH = 64
_SHAPE = re.compile(r"[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*")
_EXAMPLES = "examples: 'zh-CN', 'en', 'pt-BR'"
# Control, format (bidi marks, zero-width), line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Withdrawn ISO 639 codes that clients still send, as the IANA registry maps them.
_DEPRECATED_LANGUAGES = {"in": "id", "iw": "he", "ji": "yi", "jw": "jv", "mo": "ro"}


class InvalidLocale(ValueError):
    """A value that is not a well-formed BCP 47 tag; the message says what to send."""


def _alpha(s: str) -> bool:
    return s.isascii() and s.isalpha()


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _is_variant(s: str) -> bool:
    return 5 <= len(s) <= 8 or (len(s) == 4 and _digits(s[0]))


def canonicalize(tag: object) -> str:
    """The tag in canonical case (``ZH-cn`` -> ``zh-CN``), or raise InvalidLocale.

    Well-formed per RFC 5646: language (2-3 letters, up to three 3-letter extlangs),
    then optional script (4 letters), region (2 letters or 3 digits), distinct variants,
    extensions (a singleton and 2-8 character subtags) and private use (``x-...``).
    """
    if not isinstance(tag, str) or not tag:
        raise InvalidLocale(f"locale must be a non-empty BCP 47 tag; {_EXAMPLES}")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidLocale(f"locale is {len(tag)} characters long; "
                            f"a BCP 47 tag here is at most {MAX_TAG_LENGTH}")
    if any(unicodedata.category(ch) in _UNSAFE_CATEGORIES for ch in tag):
        raise InvalidLocale("locale contains control or bidi characters; send a plain BCP 47 tag")
    if not _SHAPE.fullmatch(tag):
        hint = " (use '-', not '_')" if "_" in tag else ""
        raise InvalidLocale(f"locale is not a BCP 47 tag{hint}; {_EXAMPLES}")
    # From here on the tag is only ASCII letters, digits and '-': safe to quote.
    subtags = tag.lower().split("-")
    bad = InvalidLocale(f"{tag!r} is not a well-formed BCP 47 tag; {_EXAMPLES}")
    language = subtags[0]
    # 4 letters are reserved and no 5-8 letter language is registered: neither is usable.
    if len(language) > 3 or language == "und":
        raise bad
    out = [_DEPRECATED_LANGUAGES.get(language, language)]
    i = 1
    while i < len(subtags) and i <= 3 and len(subtags[i]) == 3 and _alpha(subtags[i]):
        out.append(subtags[i])  # extlang
        i += 1
    if i < len(subtags) and len(subtags[i]) == 4 and _alpha(subtags[i]):
        out.append(subtags[i].title())  # script
        i += 1
    if i < len(subtags) and ((len(subtags[i]) == 2 and _alpha(subtags[i]))
                             or (len(subtags[i]) == 3 and _digits(subtags[i]))):
        out.append(subtags[i].upper())  # region
        i += 1
    variants: set[str] = set()
    while i < len(subtags) and _is_variant(subtags[i]):
        if subtags[i] in variants:
            raise bad
        variants.add(subtags[i])
        out.append(subtags[i])
        i += 1
    singletons: set[str] = set()
    while i < len(subtags):
        singleton = subtags[i]
        if len(singleton) != 1 or singleton in singletons:
            raise bad
        singletons.add(singleton)
        out.append(singleton)
        i += 1
        start = i
        if singleton == "x":  # private use: everything after it, 1-8 characters each
            out.extend(subtags[i:])
            i = len(subtags)
        else:
            while i < len(subtags) and len(subtags[i]) >= 2:
                out.append(subtags[i])
                i += 1
        if i == start:
            raise bad  # a singleton with nothing after it
    return "-".join(out)


def language_of(tag: str) -> str:
    """The language subtag of a canonical tag: ``zh-Hant-TW`` -> ``zh``."""
    return tag.split("-", 1)[0]


def _is_bare(tag: str) -> bool:
    """Whether a canonical tag names neither a script nor a region (``zh``, ``de-1996``)."""
    for subtag in tag.split("-")[1:]:
        if len(subtag) == 1:
            break  # extensions and private use say nothing about script or region
        if (len(subtag) == 4 and _alpha(subtag)) or (
                len(subtag) in (2, 3) and (subtag.isupper() or _digits(subtag))):
            return False
    return True


def is_allowed(tag: str, allowed: Iterable[str]) -> bool:
    """Whether canonical ``tag`` is admitted by ``allowed`` (empty: everything is).

    An entry admits itself; an entry without script or region admits every variant of its
    language (``zh`` admits ``zh-CN`` and ``zh-Hant-TW``; ``zh-CN`` admits only itself).
    Entries are canonicalised first; a malformed entry admits nothing.
    """
    entries = [allowed] if isinstance(allowed, str) else list(allowed)
    if not entries:
        return True
    for raw in entries:
        try:
            entry = canonicalize(raw)
        except InvalidLocale:
            continue
        if entry == tag or (_is_bare(entry) and language_of(entry) == language_of(tag)):
            return True
    return False
