"""The plain prompt style: one segment a request, in a translation model's own prompt
(``templates``), requests run concurrently instead of batched.

Translation-specialised models are trained on one text under a fixed instruction and do
not follow a JSON batch; this style asks them as their cards do, and holds their answers
to the same checks as the JSON style's. A bad answer is asked again once; still bad, that
segment alone goes down the chain.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from models.llm.answers import context_problem, item_problem, rewrap, text_weight
from models.llm.endpoint import ChatEndpoint
from models.llm.prompt import Request
from models.llm.replies import CLOSE, Reply, opens_thinking, thinking_ends
from models.llm.templates import Family, family_for, names_for, render
from models.spans import Protected

log = logging.getLogger("models.llm")

# A context is sent whole with every segment here (no batch shares it): its end only.
MAX_PLAIN_CONTEXT_CHARS = 600
# The answer's token budget: a translation is rarely longer in tokens than its source in
# characters; this bounds what a model that will not stop can cost.
ANSWER_TOKENS_PER_CHAR = 3
ANSWER_TOKENS_MIN = 64
CUT_OFF = "cut off by the token limit"


class PlainStyle:
    """One segment a request in its family's prompt (``THINKTRANS_LLM_PROMPT_STYLE=plain``)."""

    name = "plain"

    def __init__(self, endpoint: ChatEndpoint, *, checks: bool, template: str) -> None:
        self.endpoint = endpoint
        self.checks = checks
        self.template = template  # a family, "auto", or a template of one's own

    def family(self, model: str | None) -> Family:
        return family_for(self.template, model)

    def supports(self, target: str | None, model: str | None) -> bool:
        """Whether the model's family translates into ``target``."""
        languages = self.family(model).languages
        if languages is None or target is None:
            return languages is None
        try:
            names_for(self.family(model), target, None, "", None)
        except (KeyError, ValueError):
            return False
        return True

    def prompt_id(self, model: str | None) -> str:
        return self.family(model).prompt_id

    def languages(self, model: str | None) -> list[str] | None:
        languages = self.family(model).languages
        return sorted(languages) if languages is not None else None

    def describe(self, model: str | None) -> str:
        family = self.family(model).name
        return f"plain prompt, {family} template (THINKTRANS_LLM_PROMPT_STYLE=plain)"

    def info(self, model: str | None) -> dict[str, object]:
        return {"plain_template": self.family(model).name}

    def groups(self, texts: Sequence[str]) -> list[list[int]]:
        """Each segment alone: its own request."""
        return [[i] for i in range(len(texts))]

    async def translate_group(
        self, request: Request, texts: list[str], contexts: list[str | None],
        protected: list[Protected | None],
    ) -> tuple[list[str | None], list[str]]:
        """Each text in a request of its own, concurrently (``groups`` gives one): the
        translations, None for each still bad after one retry, and why."""
        out: list[str | None] = []
        reasons: list[str] = []
        for text, context, spans in zip(texts, contexts, protected, strict=True):
            translated, problem = await self._one(request, text, context, spans)
            out.append(translated)
            if problem is not None:
                reasons.append(problem)
        return out, reasons

    async def _one(self, request: Request, text: str, context: str | None,
                   protected: Protected | None) -> tuple[str | None, str | None]:
        family = self.family(request.model)
        core = text.strip()
        source = request.source
        if source is None and family.chinese is not None and _written_in_chinese(core):
            source = "zh-Hans"  # the card's ZH<=>XX form for a text it can see is Chinese
        names = names_for(family, request.target, source, request.target_name,
                          request.source_name)
        sent, terms = self._with_terms(family, core, protected)
        if context is not None and family.context is not None and not terms:
            context = _tail(context)
        else:  # the terminology form holds no context: none is sent, counted or judged
            context = None
        prompt = render(family, names, sent, context=context, terms=terms)
        answer, problem = await self._ask(family, request.model, prompt, core, context,
                                          protected)
        if problem is not None and problem != CUT_OFF:  # the same budget cuts it again
            self.endpoint.usage.retries += 1
            log.info("llm plain answer bad (%s); asking once more", problem)
            answer, problem = await self._ask(family, request.model, prompt, core, context,
                                              protected)
        if problem is not None:
            return None, problem
        return rewrap(text, answer), None

    async def _ask(self, family: Family, model: str, prompt: str, core: str,
                   context: str | None, protected: Protected | None,
                   ) -> tuple[str, str | None]:
        """One request: the answer and what is wrong with it (None: nothing)."""
        budget = max(ANSWER_TOKENS_MIN, ANSWER_TOKENS_PER_CHAR * len(core))
        body: dict[str, Any] = {"model": model, "temperature": 0, "max_tokens": budget,
                                "stream": False}
        if family.completion:
            body["prompt"] = prompt
        else:  # no system prompt: the families' cards have none
            body["messages"] = [{"role": "user", "content": prompt}]
        reply = await self.endpoint.complete(
            body, chars=len(core), context_chars=len(context or ""),
            path="completions" if family.completion else "chat/completions")
        answer = self._translation(reply, core, model).strip()
        if answer and reply.finish_reason == "length":
            return answer, CUT_OFF
        problem = item_problem(core, answer, checks=self.checks, protected=protected)
        if problem is None:
            problem = context_problem(context, core, answer)
        return answer, problem

    def _translation(self, reply: Reply, core: str, model: str) -> str:
        """The answer less a reasoning block at its start, cut at the ``</think>`` that leaves
        it as many as ``core`` has (the text may quote the tag; the translation keeps it).
        With no ``<think>`` opening it, a ``</think>`` closes reasoning only for a model seen
        reasoning, or where ``core`` has none (then none is the translation's); else the
        answer is kept whole, for the checks to judge."""
        content = reply.content or ""
        ends = thinking_ends(content)
        quoted = core.count(CLOSE)
        if len(ends) <= quoted:
            return content
        if not opens_thinking(content):
            if quoted and not self.endpoint.reasons(model):
                return content
            if not reply.reasoned:
                self.endpoint.note_reasoning(model)
        return content[ends[len(ends) - quoted - 1]:]

    def _with_terms(self, family: Family, core: str, protected: Protected | None,
                    ) -> tuple[str, dict[str, str] | None]:
        """The text to send and the terms for the family's terminology form: with no such
        form, each glossary term of the text replaced by its rendering instead, which
        translation models copy as it is."""
        if protected is None or protected.text.strip() != core:
            return core, None
        spans = [span for span in protected.spans if span.kind == "term"]
        if not spans:
            return core, None
        if family.terms is not None:
            terms: dict[str, str] = {}
            for span in spans:
                terms.setdefault(protected.text[span.start:span.end], span.out)
            return core, terms
        text = protected.text
        for span in sorted(spans, key=lambda s: s.start, reverse=True):
            text = text[:span.start] + span.out + text[span.end:]
        return text.strip(), None


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA_HANGUL = re.compile(r"[\u3040-\u30ff\uac00-\ud7af]")
_LETTER = re.compile(r"[^\W\d_]")


def _written_in_chinese(text: str) -> bool:
    """Whether ``text`` (of a source not named) is Chinese: Han characters, no kana or
    hangul, and more of its weight than any other letters' (a Han character weighs 3)."""
    han = len(_HAN.findall(text))
    if not han or _KANA_HANGUL.search(text):
        return False
    return 3 * han > len(_LETTER.findall(text)) - han


def _tail(context: str) -> str | None:
    """The end of a context, from a word's start; None for a blank one."""
    body = context.strip()
    if text_weight(body) == 0:
        return None
    if len(body) <= MAX_PLAIN_CONTEXT_CHARS:
        return body
    cut = body[-MAX_PLAIN_CONTEXT_CHARS:]
    space = cut.find(" ")
    return cut[space + 1:] if 0 <= space < 60 else cut
