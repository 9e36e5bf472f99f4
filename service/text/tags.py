"""Locales: BCP 47 canonicalisation with messages, allowed locales, target resolution.

The canonical form is ``models.languages.standardize``'s, the one the backends use too; this
module adds what the client is told and which locales are allowed. Vendor codes and language
names live with the backends that use them (``models.local``, ``models.deepl``,
``models.llm``); a locale here is only ever a canonical BCP 47 tag.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

import langcodes

from models.languages import MAX_TAG_LENGTH, TagFault, base_language, language_key, standardize
from service.exceptions import InvalidLocale, LocaleNotAllowed

__all__ = [
    "MAX_TAG_LENGTH", "ResolvedTarget", "TargetSource", "base_language", "canonicalize",
    "check_allowed", "full_script", "names_script", "resolve_target", "same_language",
]

_EXAMPLES = "examples: 'zh-CN', 'en', 'pt-BR'"


def canonicalize(tag: str) -> str:
    """Return the canonical form of a BCP 47 tag (``ZH-cn`` -> ``zh-CN``) or raise InvalidLocale.

    The form is ``models.languages.standardize``'s (``tl`` -> ``fil``, ``en-Latn-US`` ->
    ``en-US``); this adds the message that tells the client what to send instead.
    """
    standard = standardize(tag)
    if isinstance(standard, str):
        return standard
    if standard is TagFault.EMPTY:
        message = "locale must be a non-empty BCP 47 tag such as 'zh-CN' or 'en'"
    elif standard is TagFault.TOO_LONG:
        message = (f"locale is {len(tag)} characters long; "
                   f"a BCP 47 tag here is at most {MAX_TAG_LENGTH}")
    elif standard is TagFault.UNSAFE:
        message = "locale contains control or bidi characters; send a plain BCP 47 tag"
    elif standard is TagFault.SHAPE:
        hint = " (use '-', not '_')" if "_" in tag else ""
        message = f"{tag!r} is not a BCP 47 tag{hint}; {_EXAMPLES}"
    else:
        message = f"{tag!r} is not a valid BCP 47 tag; {_EXAMPLES}"
    raise InvalidLocale(message)


def _parse(tag: str) -> langcodes.Language:
    return langcodes.Language.get(tag)


def full_script(tag: str) -> str | None:
    """The script a tag names or implies: ``zh-TW`` -> ``Hant``, ``zh`` -> ``Hans``."""
    return _parse(tag).maximize().script


def names_script(tag: str) -> bool:
    """Whether a tag pins a script, explicitly (zh-Hant) or through its region (zh-TW)."""
    lang = _parse(tag)
    return bool(lang.script or lang.territory)


def same_language(detected: str, target: str) -> bool:
    """Whether text detected as ``detected`` already reads as ``target``.

    The languages must match (``nb`` reads as ``no``); where the target pins a script
    (``zh-Hant-TW``, ``zh-CN``, ``sr-Latn``) the detected script must match it too.
    """
    if language_key(detected) != language_key(target):
        return False
    if not names_script(target):
        return True
    return full_script(detected) == full_script(target)


def check_allowed(tag: str, allowed: Sequence[str]) -> None:
    """Raise LocaleNotAllowed unless ``tag`` (canonical) is permitted by ``allowed``.

    An allowed entry without a region or script admits every variant of its language:
    ``zh`` admits ``zh-CN`` and ``zh-Hant-TW``; ``zh-CN`` admits only itself. Codes that
    name one language match each other (``nb`` admits ``no``; ``tl`` is already ``fil``).
    """
    if not allowed:
        return
    for entry in allowed:
        if entry == tag or _keyed(entry) == _keyed(tag):
            return
        if not names_script(entry) and language_key(entry) == language_key(tag):
            return
    raise LocaleNotAllowed(
        f"locale {tag!r} is not allowed here; allowed: {', '.join(allowed)}",
        allowed=list(allowed),
    )


def _keyed(tag: str) -> str:
    """A canonical tag with its language written as its key: ``no-NO`` -> ``nb-NO``."""
    _, _, rest = tag.partition("-")
    return f"{language_key(tag)}-{rest}" if rest else language_key(tag)


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
