"""The JSON prompt style: several segments a request, a numbered JSON list, an answer of
the same ids; malformed answers retried whole once, bad items alone once."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from models.errors import BadOutput
from models.llm.answers import SPAN_PROBLEM, MalformedAnswer, judge, read_answer, rewrap, summary
from models.llm.endpoint import ChatEndpoint
from models.llm.prompt import PROMPT_ID, Request, chat_body, context_fields
from models.spans import Protected

log = logging.getLogger("models.llm")


class JsonStyle:
    """Batches of segments as one JSON request each (``THINKTRANS_LLM_PROMPT_STYLE=json``)."""

    name = "json"
    # Smaller requests keep answers short, so a malformed one costs less to retry.
    max_segments_per_request: int = 16
    max_chars_per_request: int = 6000

    def __init__(self, endpoint: ChatEndpoint, *, checks: bool) -> None:
        self.endpoint = endpoint
        self.checks = checks

    def supports(self, target: str | None, model: str | None) -> bool:
        """A chat model is asked for any target the service can name."""
        return True

    def prompt_id(self, model: str | None) -> str:
        return PROMPT_ID

    def languages(self, model: str | None) -> list[str] | None:
        return None

    def describe(self, model: str | None) -> str:
        return "JSON batches (THINKTRANS_LLM_PROMPT_STYLE=json)"

    def info(self, model: str | None) -> dict[str, object]:
        return {}

    def groups(self, texts: Sequence[str]) -> list[list[int]]:
        # Contexts are not counted: the limit keeps answers short, and no answer holds one.
        groups: list[list[int]] = []
        current: list[int] = []
        size = 0
        for i, text in enumerate(texts):
            full = len(current) >= self.max_segments_per_request
            if current and (full or size + len(text) > self.max_chars_per_request):
                groups.append(current)
                current, size = [], 0
            current.append(i)
            size += len(text)
        if current:
            groups.append(current)
        return groups

    async def _answer(self, request: Request, cores: list[str], contexts: list[str | None],
                      protected: list[Protected | None]) -> dict[int, object]:
        """Ask for ``cores``: the answer by id, MalformedAnswer when it is none."""
        body = chat_body(request, cores, contexts, json_mode=self.endpoint.json_mode,
                         protected=protected)
        reply = await self.endpoint.complete(
            body, chars=sum(map(len, cores)),
            context_chars=sum(len(c) for c in contexts if c is not None))
        answer, after_reasoning = read_answer(reply.content, len(cores))
        if after_reasoning and not reply.reasoned:  # a bare </think> closed reasoning
            self.endpoint.note_reasoning(request.model)
        return answer

    async def translate_group(
        self, request: Request, texts: list[str], contexts: list[str | None],
        protected: list[Protected | None],
    ) -> tuple[list[str | None], list[str]]:
        """One request for ``texts``, and at most one retry of what came back bad: the
        translations, None for each item still bad after the retry (no item comes back
        without each of its protected spans), and why each of those was bad. An answer
        unusable as a whole, twice, fails the batch."""
        cores = [text.strip() for text in texts]
        sent = context_fields(cores, contexts)
        retried = False
        try:
            answer = await self._answer(request, cores, sent, protected)
        except MalformedAnswer as first:
            log.info("llm answer unusable (%s); retrying once", first)
            self.endpoint.usage.retries += 1
            retried = True
            try:
                answer = await self._answer(request, cores, sent, protected)
            except MalformedAnswer as second:
                how = f"{first}, twice" if str(first) == str(second) else f"{first}, then {second}"
                raise BadOutput(f"the LLM {how}") from None
        ids = list(range(1, len(cores) + 1))
        results, bad = judge(cores, sent, ids, answer, checks=self.checks,
                             protected=protected)
        if bad and not retried:
            self.endpoint.usage.span_retries += _lost_spans(bad)
            fixed, bad = await self._retry_items(request, cores, contexts, sent, protected, bad)
            results.update(fixed)
        if bad:
            self.endpoint.usage.span_failures += _lost_spans(bad)
        # The source's own leading and trailing whitespace, around the model's text.
        return [None if k in bad else rewrap(text, results[k].strip())
                for k, text in enumerate(texts, start=1)], list(bad.values())

    async def _retry_items(
        self, request: Request, cores: list[str], contexts: list[str | None],
        sent: list[str | None], protected: list[Protected | None], bad: dict[int, str],
    ) -> tuple[dict[int, str], dict[int, str]]:
        """Ask once more for the ``bad`` items alone: the accepted translations and what is
        still wrong, by this group's ids."""
        log.info("llm answer: %d of %d segments bad (%s); retrying those once",
                 len(bad), len(cores), summary(bad.values()))  # fmt: skip
        self.endpoint.usage.retries += 1
        ids = list(bad)
        again_cores = [cores[k - 1] for k in ids]
        # Alone, an item no longer follows the one before it: it carries its own context.
        again_sent = context_fields(again_cores, [contexts[k - 1] for k in ids])
        again_protected = [protected[k - 1] for k in ids]
        try:
            again = await self._answer(request, again_cores, again_sent, again_protected)
        except MalformedAnswer as exc:
            return {}, dict.fromkeys(ids, f"retry {exc}")
        retry_sent = list(sent)
        for k, context in zip(ids, again_sent, strict=True):
            retry_sent[k - 1] = context
        # The retry numbers its segments 1..n; map them back to this group's ids.
        answer = {ids[n - 1]: v for n, v in again.items()}
        return judge(cores, retry_sent, ids, answer, checks=self.checks,
                     protected=protected)



def _lost_spans(bad: dict[int, str]) -> int:
    """How many of the ``bad`` items were bad for a protected span missing."""
    return sum(problem.startswith(SPAN_PROBLEM) for problem in bad.values())
