"""Locales: BCP 47 parsing and canonicalisation, allowed locales, target resolution.

Vendor codes and language names live with the backends that use them (``models.local``,
``models.deepl``, ``models.llm``); a locale here is only ever a canonical BCP 47 tag.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import langcodes

from service.exceptions import InvalidLocale, LocaleNotAllowed

MAX_TAG_LENGTH = 64
_TAG_SHAPE = re.compile(r"^[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*$")


def _has_unsafe_chars(tag: str) -> bool:
    return any(unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp"} for ch in tag)


def canonicalize(tag: str) -> str:
    """Return the canonical form of a BCP 47 tag (``ZH-cn`` -> ``zh-CN``) or raise InvalidLocale."""
    if not isinstance(tag, str) or not tag:
        raise InvalidLocale("locale must be a non-empty BCP 47 tag such as 'zh-CN' or 'en'")
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidLocale(
            f"locale is {len(tag)} characters long; a BCP 47 tag here is at most {MAX_TAG_LENGTH}"
        )
    if _has_unsafe_chars(tag):
        raise InvalidLocale("locale contains control or bidi characters; send a plain BCP 47 tag")
    if not _TAG_SHAPE.match(tag):
        hint = " (use '-', not '_')" if "_" in tag else ""
        raise InvalidLocale(f"{tag!r} is not a BCP 47 tag{hint}; examples: 'zh-CN', 'en', 'pt-BR'")
    try:
        valid = langcodes.tag_is_valid(tag)
        canonical = langcodes.standardize_tag(tag) if valid else ""
    except (ValueError, langcodes.LanguageTagError):
        valid = False
    if not valid or _parse(canonical).language in (None, "und"):
        raise InvalidLocale(f"{tag!r} is not a valid BCP 47 tag; examples: 'zh-CN', 'en', 'pt-BR'")
    return canonical


def _parse(tag: str) -> langcodes.Language:
    return langcodes.Language.get(tag)


def base_language(tag: str) -> str:
    """The language subtag of a canonical tag: ``zh-Hant-TW`` -> ``zh``."""
    return _parse(tag).language or tag.split("-")[0].lower()


def full_script(tag: str) -> str | None:
    """The script a tag names or implies: ``zh-TW`` -> ``Hant``, ``zh`` -> ``Hans``."""
    return _parse(tag).maximize().script


def names_script(tag: str) -> bool:
    """Whether a tag pins a script, explicitly (zh-Hant) or through its region (zh-TW)."""
    lang = _parse(tag)
    return bool(lang.script or lang.territory)


def same_language(detected: str, target: str) -> bool:
    """Whether text detected as ``detected`` already reads as ``target``.

    The language subtags must match; where the target pins a script (``zh-Hant-TW``,
    ``zh-CN``, ``sr-Latn``) the detected script must match it too.
    """
    if base_language(detected) != base_language(target):
        return False
    if not names_script(target):
        return True
    return full_script(detected) == full_script(target)


def check_allowed(tag: str, allowed: Sequence[str]) -> None:
    """Raise LocaleNotAllowed unless ``tag`` (canonical) is permitted by ``allowed``.

    An allowed entry without a region or script admits every variant of its language:
    ``zh`` admits ``zh-CN`` and ``zh-Hant-TW``; ``zh-CN`` admits only itself.
    """
    if not allowed:
        return
    for entry in allowed:
        if entry == tag:
            return
        if not names_script(entry) and base_language(entry) == base_language(tag):
            return
    raise LocaleNotAllowed(
        f"locale {tag!r} is not allowed here; allowed: {', '.join(allowed)}",
        allowed=list(allowed),
    )


TargetSource = Literal["request", "user_text", "default", "none"]


class ResolvedTarget(NamedTuple):
    target: str | None
    source: TargetSource


def resolve_target(
    requested: str | None,
    *,
    user_text: str | None,
    default_locale: str | None,
    allowed: Sequence[str],
    detect: Callable[[str], str | None],
) -> ResolvedTarget:
    """Resolve the target in the contract's order: request, user_text, default, none.

    A requested tag that is malformed or not allowed raises; a language detected in
    ``user_text`` that is not allowed is passed over, as a guess should be.
    """
    if requested is not None:
        tag = canonicalize(requested)
        check_allowed(tag, allowed)
        return ResolvedTarget(tag, "request")
    if user_text:
        detected = detect(user_text)
        if detected:
            tag = canonicalize(detected)
            try:
                check_allowed(tag, allowed)
            except LocaleNotAllowed:
                pass
            else:
                return ResolvedTarget(tag, "user_text")
    if default_locale:
        return ResolvedTarget(default_locale, "default")
    return ResolvedTarget(None, "none")
