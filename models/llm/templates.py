"""Translation models' own prompts (``THINKTRANS_LLM_PROMPT_STYLE=plain``): one source text
under a fixed instruction that names the target language, as each model card gives it.

Each family (``FAMILIES``) keeps its card's wording, since these models follow their own
instruction far better than a generic one; ``auto`` picks the family from the model's name,
and a template of one's own holds ``{text}`` and ``{target}``. docs/backends.md has the table.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from models.languages import table_key

# Hunyuan-MT's and HY-MT1.5's languages with the Chinese names of their cards' table.
HUNYUAN_NAMES: dict[str, str] = {
    "zh-Hans": "中文", "en": "英语", "fr": "法语", "pt": "葡萄牙语", "es": "西班牙语",
    "ja": "日语", "tr": "土耳其语", "ru": "俄语", "ar": "阿拉伯语", "ko": "韩语", "th": "泰语",
    "it": "意大利语", "de": "德语", "vi": "越南语", "ms": "马来语", "id": "印尼语",
    "fil": "菲律宾语", "hi": "印地语", "zh-Hant": "繁体中文", "pl": "波兰语", "cs": "捷克语",
    "nl": "荷兰语", "km": "高棉语", "my": "缅甸语", "fa": "波斯语", "gu": "古吉拉特语",
    "ur": "乌尔都语", "te": "泰卢固语", "mr": "马拉地语", "he": "希伯来语", "bn": "孟加拉语",
    "ta": "泰米尔语", "uk": "乌克兰语", "bo": "藏语", "kk": "哈萨克语", "mn": "蒙古语",
    "ug": "维吾尔语", "yue": "粤语",
}  # fmt: skip
# The English names the cards use where ours differ or are missing.
HUNYUAN_ENGLISH: dict[str, str] = {
    "zh-Hans": "Chinese", "zh-Hant": "Traditional Chinese", "ms": "Malay", "km": "Khmer",
    "my": "Burmese", "bo": "Tibetan", "kk": "Kazakh", "mn": "Mongolian", "ug": "Uyghur",
    "yue": "Cantonese",
}  # fmt: skip
# Seed-X's 28 languages: the tag its prompt ends with, and the English name.
SEED_X: dict[str, tuple[str, str]] = {
    "ar": ("ar", "Arabic"), "cs": ("cs", "Czech"), "da": ("da", "Danish"),
    "de": ("de", "German"), "en": ("en", "English"), "es": ("es", "Spanish"),
    "fi": ("fi", "Finnish"), "fr": ("fr", "French"), "hr": ("hr", "Croatian"),
    "hu": ("hu", "Hungarian"), "id": ("id", "Indonesian"), "it": ("it", "Italian"),
    "ja": ("ja", "Japanese"), "ko": ("ko", "Korean"), "ms": ("ms", "Malay"),
    "nb": ("nb", "Norwegian Bokmal"), "nl": ("nl", "Dutch"), "pl": ("pl", "Polish"),
    "pt": ("pt", "Portuguese"), "ro": ("ro", "Romanian"), "ru": ("ru", "Russian"),
    "sv": ("sv", "Swedish"), "th": ("th", "Thai"), "tr": ("tr", "Turkish"),
    "uk": ("uk", "Ukrainian"), "vi": ("vi", "Vietnamese"), "zh-Hans": ("zh", "Chinese"),
}  # fmt: skip
CHINESE = frozenset({"zh-Hans", "zh-Hant", "yue"})

_PLACEHOLDER = re.compile(r"\{(target|source|text|context|terms|tag)\}")


@dataclass(frozen=True)
class Family:
    """One family's prompt forms; ``{target}``, ``{source}``, ``{text}`` (and ``{context}``,
    ``{terms}``, ``{tag}`` where a form has them) are filled per segment."""

    name: str
    match: tuple[str, ...]  # lower-case parts of a model id that name the family
    instruction: str
    # The form for a source of unknown language, where ``instruction`` names it.
    unnamed_source: str | None = None
    chinese: str | None = None  # when Chinese is the source or target: Chinese names
    context: str | None = None  # the text before, for consistent terms (Chinese names)
    terms: str | None = None  # glossary renderings, one ``term_line`` each (Chinese names)
    term_line: str = "{source} 翻译成 {target}"
    languages: frozenset[str] | None = None  # table keys; None: any the service names
    completion: bool = False  # no chat template: POST /completions with a prompt

    @property
    def prompt_id(self) -> str:
        forms = "\n".join(str(part) for part in (
            self.instruction, self.unnamed_source, self.chinese, self.context, self.terms,
            self.term_line, self.completion))
        return hashlib.sha256(f"plain|{self.name}|{forms}".encode()).hexdigest()[:12]


# Each form as its card gives it: github.com/Tencent-Hunyuan/Hunyuan-MT and /HY-MT (README),
# huggingface.co/ByteDance-Seed/Seed-X-PPO-7B, huggingface.co/Unbabel/Tower-Plus-2B.
_HUNYUAN_EN = ("Translate the following segment into {target}, without additional "
               "explanation.\n\n{text}")
FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("hunyuan-mt", ("hunyuan-mt",), _HUNYUAN_EN,
               chinese="把下面的文本翻译成{target}，不要额外解释。\n\n{text}",
               languages=frozenset(HUNYUAN_NAMES)),
        Family("hy-mt1.5", ("hy-mt1.5", "hy-mt-1.5", "hunyuan-mt-1.5", "hunyuan-mt1.5"),
               _HUNYUAN_EN,
               chinese="将以下文本翻译为{target}，注意只需要输出翻译后的结果，不要额外解释：\n\n{text}",
               context=("{context}\n参考上面的信息，把下面的文本翻译成{target}，"
                        "注意不需要翻译上文，也不要额外解释：\n{text}"),
               terms=("参考下面的翻译：\n{terms}\n\n将以下文本翻译为{target}，"
                      "注意只需要输出翻译后的结果，不要额外解释：\n{text}"),
               languages=frozenset(HUNYUAN_NAMES)),
        Family("seed-x", ("seed-x",),
               "Translate the following {source} sentence into {target}:\n{text} <{tag}>",
               unnamed_source="Translate the following sentence into {target}:\n{text} <{tag}>",
               languages=frozenset(SEED_X), completion=True),
        Family("tower", ("tower",),
               "Translate the following {source} source text to {target}:\n"
               "{source}: {text}\n{target}: ",
               unnamed_source=("Translate the following source text to {target}:\n"
                               "{text}\n{target}: ")),
        Family("generic", (),
               "Translate the following text into {target}. Answer with the translation only, "
               "without any explanation.\n\n{text}"),
    )
}  # fmt: skip
# The families' order when matching a model id: the most specific first.
_MATCH_ORDER = ("hy-mt1.5", "hunyuan-mt", "seed-x", "tower")


def template_problem(template: str) -> str | None:
    """Why ``template`` (a setting's value) is neither a family, ``auto``, nor a template."""
    if template in FAMILIES or template == "auto":
        return None
    missing = [name for name in ("{text}", "{target}") if name not in template]
    if missing:
        return (f"must be auto, one of {', '.join(FAMILIES)}, or a template holding {{text}} "
                f"and {{target}} (missing {', '.join(missing)})")
    return None


def family_for(setting: str, model: str | None) -> Family:
    """The family a setting names, or for ``auto`` the one the model's name matches; a
    template of one's own is a family of its own (``custom``)."""
    if setting in FAMILIES:
        return FAMILIES[setting]
    if setting != "auto":
        unnamed = setting.replace("{source}", "the source language")
        return Family("custom", (), setting, unnamed_source=unnamed)
    ident = (model or "").lower()
    for name in _MATCH_ORDER:
        if any(part in ident for part in FAMILIES[name].match):
            return FAMILIES[name]
    return FAMILIES["generic"]


@dataclass(frozen=True)
class Names:
    """The names a prompt of one family uses for a pair; ``source`` None: unknown."""

    target: str
    source: str | None
    chinese: bool  # Chinese is the source or target: the Chinese forms apply
    tag: str = ""  # Seed-X's language tag
    target_zh: str | None = None  # the target's Chinese name, for the Chinese-only forms


def names_for(family: Family, target: str | None, source: str | None, target_name: str,
              source_name: str | None) -> Names:
    """A family's names for the pair (canonical tags; the service's English names as the
    fallback), or KeyError when the family does not translate into ``target``. Every name
    comes from a table, by the tag's table key: a prompt never holds the client's tag."""
    target_key = table_key(target) if target else ""
    source_key = table_key(source) if source else None
    if family.languages is not None and target_key not in family.languages:
        raise KeyError(target_key)
    if family.name in ("hunyuan-mt", "hy-mt1.5"):
        target_zh = HUNYUAN_NAMES[target_key]
        if target_key in CHINESE or source_key in CHINESE:
            source_zh = HUNYUAN_NAMES.get(source_key or "")
            return Names(target_zh, source_zh, chinese=True, target_zh=target_zh)
        english = HUNYUAN_ENGLISH.get(target_key, target_name)
        return Names(english, HUNYUAN_ENGLISH.get(source_key or "", source_name), False,
                     target_zh=target_zh)
    if family.name == "seed-x":
        tag, name = SEED_X[target_key]
        source_entry = SEED_X.get(source_key or "")
        return Names(name, source_entry[1] if source_entry else source_name, False, tag)
    return Names(target_name, source_name, False)


def render(family: Family, names: Names, text: str, *, context: str | None = None,
           terms: Mapping[str, str] | None = None) -> str:
    """The prompt for one text: the terminology form when ``terms`` and the family has one,
    else the context form when ``context`` and it has one, else its instruction (the
    Chinese one for a Chinese pair, the unnamed-source one without a source)."""
    values = {"target": names.target, "source": names.source or "", "text": text,
              "context": context or "", "tag": names.tag, "terms": ""}
    if terms and family.terms is not None:
        template = family.terms
        values["terms"] = "\n".join(
            _fill(family.term_line, {"source": term, "target": rendering})
            for term, rendering in terms.items())
        values["target"] = names.target_zh or names.target
    elif context and family.context is not None:
        template = family.context
        values["target"] = names.target_zh or names.target
    elif names.chinese and family.chinese is not None:
        template = family.chinese
    elif names.source is None and family.unnamed_source is not None:
        template = family.unnamed_source
    else:
        template = family.instruction
    return _fill(template, values)


def _fill(template: str, values: Mapping[str, str]) -> str:
    # One pass over the template's placeholders: braces in the text are text.
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group()), template)
