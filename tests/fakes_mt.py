"""A translation model on 127.0.0.1, served as vLLM serves one (``FakeMT``): it answers a
translation only to the prompt forms its model card gives, read exactly as the card writes
them, and otherwise what such a model says to a prompt it was not trained on.

The forms and the language tables are copied from the cards, not from the service:

- Hunyuan-MT-7B: https://github.com/Tencent-Hunyuan/Hunyuan-MT (README) and
  https://huggingface.co/tencent/Hunyuan-MT-7B: a Chinese instruction for ZH<=>XX, an
  English one for XX<=>XX; the 38-row table of languages, abbreviations and Chinese names.
- HY-MT1.5 (1.8B, 7B): https://github.com/Tencent-Hunyuan/HY-MT (README) and
  https://huggingface.co/tencent/HY-MT1.5-7B: the same two forms (its own Chinese wording),
  plus its terminology and contextual forms; the same table.
- Seed-X: https://huggingface.co/ByteDance-Seed/Seed-X-PPO-7B: "Translate the following
  English sentence into Chinese:\\nMay the force be with you <zh>", a raw prompt (no chat
  template: POST /v1/completions; vLLM refuses a chat request for it), the target's tag at
  the end; 28 languages.
- Tower+: https://huggingface.co/Unbabel/Tower-Plus-2B: one user message, "Translate the
  following English source text to Portuguese (Portugal):\\nEnglish: Hello world!\\n
  Portuguese (Portugal): ".

Where a card shows the source named and the service may not know it, the same form less
the name is taken (Seed-X, Tower+). A prompt in none of the family's forms, a system
message, more than one message, or a name the card's table lacks gets ``CHATTER``'s kind of
answer: the text explained at length, which no length check takes for a translation.

A translation is "<target name as the prompt says it>: <text>", the terminology form's
terms rendered (each source term written as its target term), unless ``PHRASEBOOK`` has
a real one (for the service's output-language check). ``parsed`` records, per request in
arrival order, the ``Prompt`` read (None: not the card's), ``in_flight`` and
``max_in_flight`` the requests being answered at once.

Modes (``mode``, one-shot ``script``, or ``per_text``: a substring of the text -> the mode
for its requests): ``good``; ``drop_number`` drops the translation's first number;
``other_language`` answers the text untranslated; ``loop`` repeats the translation up to
``max_tokens`` (finish_reason ``length``); ``slow`` answers after ``slow_s``.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes_remote import _Fake, _record

# Hunyuan-MT's and HY-MT1.5's table: Languages | Abbr. | Chinese Names.
HUNYUAN_TABLE: list[tuple[str, str, str]] = [
    ("Chinese", "zh", "中文"), ("English", "en", "英语"), ("French", "fr", "法语"),
    ("Portuguese", "pt", "葡萄牙语"), ("Spanish", "es", "西班牙语"), ("Japanese", "ja", "日语"),
    ("Turkish", "tr", "土耳其语"), ("Russian", "ru", "俄语"), ("Arabic", "ar", "阿拉伯语"),
    ("Korean", "ko", "韩语"), ("Thai", "th", "泰语"), ("Italian", "it", "意大利语"),
    ("German", "de", "德语"), ("Vietnamese", "vi", "越南语"), ("Malay", "ms", "马来语"),
    ("Indonesian", "id", "印尼语"), ("Filipino", "tl", "菲律宾语"), ("Hindi", "hi", "印地语"),
    ("Traditional Chinese", "zh-Hant", "繁体中文"), ("Polish", "pl", "波兰语"),
    ("Czech", "cs", "捷克语"), ("Dutch", "nl", "荷兰语"), ("Khmer", "km", "高棉语"),
    ("Burmese", "my", "缅甸语"), ("Persian", "fa", "波斯语"), ("Gujarati", "gu", "古吉拉特语"),
    ("Urdu", "ur", "乌尔都语"), ("Telugu", "te", "泰卢固语"), ("Marathi", "mr", "马拉地语"),
    ("Hebrew", "he", "希伯来语"), ("Bengali", "bn", "孟加拉语"), ("Tamil", "ta", "泰米尔语"),
    ("Ukrainian", "uk", "乌克兰语"), ("Tibetan", "bo", "藏语"), ("Kazakh", "kk", "哈萨克语"),
    ("Mongolian", "mn", "蒙古语"), ("Uyghur", "ug", "维吾尔语"), ("Cantonese", "yue", "粤语"),
]  # fmt: skip
HUNYUAN_CHINESE = {"中文", "繁体中文", "粤语"}
# Seed-X's tags and the English names its prompts use.
SEED_X_TAGS: dict[str, str] = {
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "en": "English",
    "es": "Spanish", "fi": "Finnish", "fr": "French", "hr": "Croatian", "hu": "Hungarian",
    "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "ms": "Malay",
    "nb": "Norwegian Bokmal", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
    "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "th": "Thai",
    "tr": "Turkish", "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip
MODEL_IDS = {"hunyuan-mt": "tencent/Hunyuan-MT-7B", "hy-mt1.5": "tencent/HY-MT1.5-7B",
             "seed-x": "ByteDance-Seed/Seed-X-PPO-7B", "tower": "Unbabel/Tower-Plus-9B"}
# Real translations, by (target name, text), where a test needs the output-language check.
PHRASEBOOK: dict[tuple[str, str], str] = {
    ("German", "The quarterly report lists twelve regions and their sales."):
        "Der Quartalsbericht nennt zwölf Regionen und ihre Umsätze.",
    ("German", "I should check the revenue table first, then the notes below it."):
        "Ich sollte zuerst die Umsatztabelle prüfen und dann die Notizen darunter.",
}
CHATTER = ("Sure! It looks like you shared a passage; here is what it says, explained step "
           "by step, with some background on each of its points:")
VLLM_NO_TEMPLATE = ("As of transformers v4.44, default chat template is no longer allowed, so "
                    "you must provide a chat template if the tokenizer does not define one.")

_TARGET = r"(?P<target>[^,，:：\n]+?)"
_HUNYUAN_EN = (rf"Translate the following segment into {_TARGET}, without additional "
               r"explanation\.\n\n(?P<text>.+)")
_HY_ZH = rf"将以下文本翻译为{_TARGET}，注意只需要输出翻译后的结果，不要额外解释："


@dataclass(frozen=True)
class Prompt:
    """What a prompt in one of the card's forms asks."""

    form: str  # "en", "zh", "terms", "context" (HY-MT1.5), "card" (Seed-X, Tower+, custom)
    target: str  # the target's name, as the prompt has it
    text: str
    source: str | None = None
    terms: dict[str, str] = field(default_factory=dict)
    context: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Card:
    """A family's forms, by name (the regexes match a whole prompt), and the names it takes."""

    name: str
    forms: dict[str, str]
    completion: bool = False  # a raw prompt on /v1/completions, no chat template

    def read(self, prompt: str) -> Prompt | None:
        for form, pattern in self.forms.items():
            match = re.fullmatch(pattern, prompt, re.DOTALL)
            if match is None:
                continue
            got = {k: v for k, v in match.groupdict().items() if v is not None}
            terms = dict(re.findall(r"^(.+) 翻译成 (.+)$", got.pop("terms", ""), re.MULTILINE))
            read = Prompt(form, terms=terms, **got)
            return read if self._named(read) else None
        return None

    def _named(self, p: Prompt) -> bool:
        """Whether the names are the card's, in the form the card gives for the pair."""
        if self.name in ("hunyuan-mt", "hy-mt1.5"):
            english = {row[0] for row in HUNYUAN_TABLE}
            chinese_pair = p.target in HUNYUAN_CHINESE or _mostly_han(p.text)
            if p.form == "en":
                return p.target in english and not chinese_pair
            return p.target in {row[2] for row in HUNYUAN_TABLE} and (
                chinese_pair or p.form != "zh")
        if self.name == "seed-x":
            names = set(SEED_X_TAGS.values())
            return SEED_X_TAGS.get(p.tag or "") == p.target and p.source in (None, *names)
        return True


def _mostly_han(text: str) -> bool:
    han = len(re.findall(r"[\u4e00-\u9fff]", text))
    return han * 2 > len(re.findall(r"\w", text))


CARDS: dict[str, Card] = {
    "hunyuan-mt": Card("hunyuan-mt", {
        "en": _HUNYUAN_EN,
        "zh": rf"把下面的文本翻译成{_TARGET}，不要额外解释。\n\n(?P<text>.+)",
    }),
    "hy-mt1.5": Card("hy-mt1.5", {
        "en": _HUNYUAN_EN,
        "zh": rf"{_HY_ZH}\n\n(?P<text>.+)",
        "terms": (r"参考下面的翻译：\n(?P<terms>(?:[^\n]+ 翻译成 [^\n]+\n)+)\n"
                  rf"{_HY_ZH}\n(?P<text>.+)"),
        "context": (rf"(?P<context>.+)\n参考上面的信息，把下面的文本翻译成{_TARGET}，"
                    r"注意不需要翻译上文，也不要额外解释：\n(?P<text>.+)"),
    }),
    "seed-x": Card("seed-x", {
        "card": (r"Translate the following (?:(?P<source>[A-Z][A-Za-z ]*?) )?sentence into "
                 r"(?P<target>[A-Z][A-Za-z ]*):\n(?P<text>.+) <(?P<tag>[a-z]{2})>"),
    }, completion=True),
    "tower": Card("tower", {
        "card": (r"Translate the following (?P<source>[^\n]+?) source text to "
                 r"(?P<target>[^\n]+?):\n(?P=source): (?P<text>.+)\n(?P=target): "),
        "unnamed": (r"Translate the following source text to (?P<target>[^\n]+?):\n"
                    r"(?P<text>.+)\n(?P=target): "),
    }),
}  # fmt: skip


def custom_card(template: str) -> Card:
    """A model whose one form is ``template`` ({target}, {text}, optionally {source})."""
    pattern = re.escape(template)
    for name, group in (("target", r"[^\n]+?"), ("source", r"[^\n]+?"), ("text", ".+")):
        first, *rest = pattern.split(re.escape(f"{{{name}}}"))
        if rest:  # the first one read, the others the same again
            pattern = first + f"(?P<{name}>{group})" + f"(?P={name})".join(rest)
    return Card("custom", {"card": pattern})


class FakeMT(_Fake):
    """POST /v1/chat/completions, /v1/completions and GET /v1/models of a translation
    model of ``card`` (``serve``); see the module for what it reads and answers."""

    def __init__(self) -> None:
        super().__init__()
        self.card = CARDS["hunyuan-mt"]
        self.per_text: dict[str, str] = {}
        self.parsed: list[Prompt | None] = []
        self.in_flight = self.max_in_flight = 0

    def serve(self, card: str | Card) -> FakeMT:
        """Forget what came before and serve ``card`` (a family's name, or a Card)."""
        self.reset()
        self.mode = "good"
        self.slow_s = 0.3
        self.card = CARDS[card] if isinstance(card, str) else card
        self.per_text = {}
        self.parsed = []
        self.in_flight = self.max_in_flight = 0
        return self

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.path != "/v1/models"]

    def _mode(self, text: str) -> str:
        for part, mode in self.per_text.items():
            if part in text:
                return mode
        return self.next_mode()

    def _prompt(self, body: dict[str, Any], completion: bool) -> Prompt | None:
        if completion:
            prompt = body.get("prompt")
            return self.card.read(prompt) if isinstance(prompt, str) else None
        messages = body.get("messages") or []
        if len(messages) != 1 or messages[0].get("role") != "user":
            return None  # no system prompt, no conversation: the cards give none
        return self.card.read(str(messages[0].get("content")))

    async def _serve(self, request: Request, completion: bool) -> Response:
        rec = await _record(request, self.requests)
        body = rec.json
        if self.card.completion and not completion:
            return JSONResponse({"object": "error", "message": VLLM_NO_TEMPLATE,
                                 "type": "BadRequestError", "param": None, "code": 400},
                                status_code=400)
        prompt = self._prompt(body, completion)
        self.parsed.append(prompt)
        self.in_flight += 1  # one event loop: no lock needed
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if prompt is None:
                return self._answer(body, completion, _chatter(body), "stop")
            mode = self._mode(prompt.text)
            if mode == "slow":
                await asyncio.sleep(self.slow_s)
            content, finish = self._translate(prompt, mode, int(body.get("max_tokens") or 16))
            return self._answer(body, completion, content, finish)
        finally:
            self.in_flight -= 1

    @staticmethod
    def _translate(prompt: Prompt, mode: str, max_tokens: int) -> tuple[str, str]:
        text = prompt.text
        for term, rendering in sorted(prompt.terms.items(), key=lambda t: -len(t[0])):
            text = text.replace(term, rendering)
        out = PHRASEBOOK.get((prompt.target, text), f"{prompt.target}: {text}")
        if mode == "drop_number":
            out = re.sub(r"\s?\d+(?:[.,]\d+)*", "", out, count=1)
        elif mode == "other_language":
            out = prompt.text
        elif mode == "loop":  # about four characters a token, until the budget is spent
            return ((out + " ") * (max_tokens * 4 // (len(out) + 1) + 1))[:max_tokens * 4], "length"
        return out, "stop"

    @staticmethod
    def _answer(body: dict[str, Any], completion: bool, content: str, finish: str) -> Response:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if completion:
            choice["text"] = content
        else:
            choice["message"] = {"role": "assistant", "content": content}
        return JSONResponse({
            "id": "cmpl-fake", "object": "text_completion" if completion else "chat.completion",
            "model": body.get("model"), "choices": [choice],
            "usage": {"prompt_tokens": len(json.dumps(body)) // 4,
                      "completion_tokens": len(content) // 4},
        })

    async def _models(self, request: Request) -> Response:
        await _record(request, self.requests)
        ident = MODEL_IDS.get(self.card.name, "custom-mt")
        return JSONResponse({"object": "list", "data": [
            {"id": ident, "object": "model", "owned_by": "vllm"}]})

    def _app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            return await self._serve(request, completion=False)

        async def completions(request: Request) -> Response:
            return await self._serve(request, completion=True)

        return Starlette(routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])


def _chatter(body: dict[str, Any]) -> str:
    """What a translation model says to a prompt it was not trained on: the whole prompt
    explained, far longer than any translation of its text."""
    said = body.get("prompt") or " ".join(
        str(m.get("content")) for m in body.get("messages") or [])
    out = f"{CHATTER}\n\n{said}\n"
    while len(out) <= 5 * len(said) + 100:
        out += "\nIn other words, the passage above restates the same point once more."
    return out
