"""Locales: BCP 47 parsing and canonicalisation, the language table, target resolution.

The language table is the one place that maps a locale to its display name (used in
LLM prompts, never the client's raw tag) and to each backend's own codes.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import langcodes

from service.errors import InvalidLocale, LocaleNotAllowed

MAX_TAG_LENGTH = 64
_TAG_SHAPE = re.compile(r"^[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*$")


@dataclass(frozen=True)
class LangInfo:
    """One row of the language table."""

    key: str  # language, or language-Script where the script changes the code
    name: str  # English display name, used in prompts
    nllb: str | None  # flores-200 code
    m2m: str | None  # M2M-100 code
    deepl_source: str | None
    deepl_target: str | None  # None where DeepL has no target; pt/en/zh resolved below


_ROWS: tuple[tuple[str, str, str | None, str | None, str | None, str | None], ...] = (
    ("af", "Afrikaans", "afr_Latn", "af", None, None),
    ("ar", "Arabic", "arb_Arab", "ar", "AR", "AR"),
    ("bg", "Bulgarian", "bul_Cyrl", "bg", "BG", "BG"),
    ("bn", "Bengali", "ben_Beng", "bn", None, None),
    ("ca", "Catalan", "cat_Latn", "ca", None, None),
    ("cs", "Czech", "ces_Latn", "cs", "CS", "CS"),
    ("cy", "Welsh", "cym_Latn", "cy", None, None),
    ("da", "Danish", "dan_Latn", "da", "DA", "DA"),
    ("de", "German", "deu_Latn", "de", "DE", "DE"),
    ("el", "Greek", "ell_Grek", "el", "EL", "EL"),
    ("en", "English", "eng_Latn", "en", "EN", "EN-US"),
    ("es", "Spanish", "spa_Latn", "es", "ES", "ES"),
    ("et", "Estonian", "est_Latn", "et", "ET", "ET"),
    ("fa", "Persian", "pes_Arab", "fa", None, None),
    ("fi", "Finnish", "fin_Latn", "fi", "FI", "FI"),
    ("fr", "French", "fra_Latn", "fr", "FR", "FR"),
    ("gu", "Gujarati", "guj_Gujr", "gu", None, None),
    ("he", "Hebrew", "heb_Hebr", "he", None, None),
    ("hi", "Hindi", "hin_Deva", "hi", None, None),
    ("hr", "Croatian", "hrv_Latn", "hr", None, None),
    ("hu", "Hungarian", "hun_Latn", "hu", "HU", "HU"),
    ("id", "Indonesian", "ind_Latn", "id", "ID", "ID"),
    ("it", "Italian", "ita_Latn", "it", "IT", "IT"),
    ("ja", "Japanese", "jpn_Jpan", "ja", "JA", "JA"),
    ("kn", "Kannada", "kan_Knda", "kn", None, None),
    ("ko", "Korean", "kor_Hang", "ko", "KO", "KO"),
    ("lt", "Lithuanian", "lit_Latn", "lt", "LT", "LT"),
    ("lv", "Latvian", "lvs_Latn", "lv", "LV", "LV"),
    ("mk", "Macedonian", "mkd_Cyrl", "mk", None, None),
    ("ml", "Malayalam", "mal_Mlym", "ml", None, None),
    ("mr", "Marathi", "mar_Deva", "mr", None, None),
    ("nb", "Norwegian Bokmål", "nob_Latn", "no", "NB", "NB"),
    ("ne", "Nepali", "npi_Deva", "ne", None, None),
    ("nl", "Dutch", "nld_Latn", "nl", "NL", "NL"),
    ("pa", "Punjabi", "pan_Guru", "pa", None, None),
    ("pl", "Polish", "pol_Latn", "pl", "PL", "PL"),
    ("pt", "Portuguese", "por_Latn", "pt", "PT", "PT-BR"),
    ("ro", "Romanian", "ron_Latn", "ro", "RO", "RO"),
    ("ru", "Russian", "rus_Cyrl", "ru", "RU", "RU"),
    ("sk", "Slovak", "slk_Latn", "sk", "SK", "SK"),
    ("sl", "Slovenian", "slv_Latn", "sl", "SL", "SL"),
    ("sq", "Albanian", "als_Latn", "sq", None, None),
    ("sv", "Swedish", "swe_Latn", "sv", "SV", "SV"),
    ("sw", "Swahili", "swh_Latn", "sw", None, None),
    ("ta", "Tamil", "tam_Taml", "ta", None, None),
    ("te", "Telugu", "tel_Telu", "te", None, None),
    ("th", "Thai", "tha_Thai", "th", None, None),
    ("fil", "Filipino", "tgl_Latn", "tl", None, None),
    ("tr", "Turkish", "tur_Latn", "tr", "TR", "TR"),
    ("uk", "Ukrainian", "ukr_Cyrl", "uk", "UK", "UK"),
    ("ur", "Urdu", "urd_Arab", "ur", None, None),
    ("vi", "Vietnamese", "vie_Latn", "vi", None, None),
    ("zh-Hans", "Simplified Chinese", "zho_Hans", "zh", "ZH", "ZH-HANS"),
    ("zh-Hant", "Traditional Chinese", "zho_Hant", "zh", "ZH", "ZH-HANT"),
)

LANGUAGES: dict[str, LangInfo] = {row[0]: LangInfo(*row) for row in _ROWS}
# Codes that detectors or clients use for a row kept under another key.
_ALIASES = {"no": "nb", "tl": "fil", "iw": "he", "in": "id"}
# Languages whose script changes the table row (and so the backend code).
_SCRIPT_KEYED = {"zh"}


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


def lang_info(tag: str) -> LangInfo | None:
    """The table row for a canonical tag, or None when the language is not in the table."""
    base = base_language(tag)
    if base in _SCRIPT_KEYED:
        return LANGUAGES.get(f"{base}-{full_script(tag)}")
    return LANGUAGES.get(_ALIASES.get(base, base))


def display_name(tag: str) -> str:
    """A language name from the service's own table, safe to put in a prompt."""
    info = lang_info(tag)
    if info is not None:
        return info.name
    return re.sub(r"[^A-Za-z ()\-]", "", _parse(tag).display_name())[:64] or "the target language"


def deepl_target_code(tag: str, *, english_variant: str = "EN-US") -> str | None:
    """DeepL's target code: region picks EN-GB/EN-US and PT-PT/PT-BR; script picks ZH-HANS/HANT."""
    info = lang_info(tag)
    if info is None or info.deepl_target is None:
        return None
    lang = _parse(tag)
    if info.key == "en":
        if lang.territory in {"GB", "IE", "AU", "NZ", "IN", "ZA"}:
            return "EN-GB"
        return "EN-US" if lang.territory == "US" else english_variant
    if info.key == "pt":
        return "PT-PT" if lang.territory not in (None, "BR") else "PT-BR"
    return info.deepl_target


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
