"""The LLM backend's translator: batches into chat requests, answers checked and retried."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import httpx

from models.base import Capabilities, Job
from models.errors import BadOutput, PartialOutput, UnsupportedLanguage
from models.languages import canonical
from models.llm.answers import (
    SPAN_PROBLEM,
    MalformedAnswer,
    judge,
    parse_answer,
    rewrap,
    summary,
)
from models.llm.endpoint import ChatEndpoint, ModelList, safe_url
from models.llm.prompt import (
    PROMPT_ID,
    UNNAMED,
    Request,
    chat_body,
    context_fields,
    language_name,
)
from models.remote import RemoteTranslator
from models.spans import Protected

log = logging.getLogger("models.llm")

NOT_CONFIGURED = "set {names} or choose another backend"


@dataclass(frozen=True)
class LLMConfig:
    """Where the chat endpoint is and how to call it; the settings' ``llm_*`` section."""

    base_url: str | None = None  # the part before /chat/completions; None: not ready
    model: str | None = None  # None: not ready
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token
    timeout_s: float = 30.0  # one chat request, end to end
    concurrency: int = 4  # requests in flight, and batches the batcher runs at once
    # Not every server has response_format; on only where a setting asks for it.
    json_mode: bool = False
    # Each item must keep its source's numbers, inline code and URLs, at a plausible
    # length (item_problem). Off: only non-empty items are required, that keep their
    # protected spans (which are checked either way).
    check_items: bool = True
    # Send each segment's preceding stream text as its item's "context" (capabilities.context).
    context: bool = True


class LLMTranslator(RemoteTranslator):
    """An OpenAI-compatible chat endpoint as a translator; bills the characters sent."""

    name = "llm"
    capabilities = Capabilities(context=True, billed=True)
    # Smaller requests keep answers short, so a malformed one costs less to retry.
    max_segments_per_request: int = 16
    max_chars_per_request: int = 6000
    # Seconds a fetched GET /models list serves the catalog before it is fetched again.
    models_refresh_s: float = 300.0

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        self.config = config
        base_url = config.base_url.rstrip("/") if config.base_url else None
        # In each cache identity (asked once a segment): two endpoints may give one model
        # name to different weights.
        self._endpoint_id = hashlib.sha256((base_url or "").encode()).hexdigest()[:12]
        self._model = config.model or None
        self._check_items = config.check_items
        self.capabilities = replace(self.capabilities, context=config.context)
        self.max_concurrency = config.concurrency
        self._endpoint = ChatEndpoint(
            base_url, model=self._model, api_key=config.api_key, timeout_s=config.timeout_s,
            concurrency=config.concurrency, json_mode=config.json_mode,
            on_down=lambda reason, fail_fast: self._mark_down(reason, fail_fast=fail_fast),
        )
        self._models = ModelList()
        self._listing: asyncio.Task[None] | None = None
        missing = [env for env, value in (("THINKTRANS_LLM_BASE_URL", base_url),
                                          ("THINKTRANS_LLM_MODEL", self._model)) if not value]
        if missing:
            self._not_configured(NOT_CONFIGURED.format(names=" and ".join(missing)))

    async def aclose(self) -> None:
        """Stop background probes and close the HTTP client."""
        await super().aclose()
        await self._endpoint.aclose()

    # -- languages ---------------------------------------------------------------------------

    def _language_name(self, tag: str) -> str:
        """The table's name for ``tag``: the only form of a locale that reaches the prompt."""
        standard = canonical(tag)
        if standard is None:
            raise UnsupportedLanguage("the llm backend needs a valid BCP 47 target")
        name = language_name(standard)
        if "Unknown" in name or name == UNNAMED:
            raise UnsupportedLanguage(f"no language name is known for {standard!r}")
        return name

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Any target the service can name; a chat model handles most languages."""
        try:
            self._language_name(target)
        except UnsupportedLanguage:
            return False
        return True

    # -- models ------------------------------------------------------------------------------

    def model_problem(self, model: str | None) -> str | None:
        """None: any name is tried, and the endpoint says whether it has that model."""
        return None

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The named model, else THINKTRANS_LLM_MODEL."""
        return model or self._model

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model, the prompt and the options that change answers; None without a model."""
        resolved = self.resolve_model(model, source, target)
        if resolved is None:
            return None
        return (
            f"llm|{resolved}|at={self._endpoint_id}|{PROMPT_ID}|json={self.config.json_mode}"
            f"|check={self._check_items}|ctx={self.capabilities.context}"
        )

    def catalog(self) -> list[dict[str, object]]:
        """The configured model first, then what the endpoint's GET /models lists; a list
        older than ``models_refresh_s`` is fetched again in the background."""
        self._maybe_refresh_models()
        return [] if self._model is None else self._models.catalog(self._model)

    def _maybe_refresh_models(self) -> None:
        """Fetch GET /models in the background when the list is stale and no start check,
        probe or fetch is at it already; never waits for it."""
        if not self._configured or self._closed or not self._models.stale(self.models_refresh_s):
            return
        busy = (self._listing, self._start_task, self._prober)
        if any(task is not None and not task.done() for task in busy):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called outside the loop: the next call in it fetches
            return
        self._listing = self._spawn(self._refresh_models())

    async def _refresh_models(self) -> None:
        response: httpx.Response | None = None
        with contextlib.suppress(httpx.HTTPError, TimeoutError):
            response = await self._endpoint.models()
        self._models.note(response)

    # -- translation -------------------------------------------------------------------------

    async def run(self, job: Job) -> list[str]:
        """Translate in requests of a few segments each, run concurrently, with the job's
        model (None: THINKTRANS_LLM_MODEL) and, with ``context`` on, its contexts."""
        self._refuse_if_unusable()
        texts, contexts, protected = job.texts, job.contexts, job.protected
        if contexts is not None and len(contexts) != len(texts):
            raise ValueError(f"{len(contexts)} contexts for {len(texts)} texts")
        if protected is not None and len(protected) != len(texts):
            raise ValueError(f"{len(protected)} protected for {len(texts)} texts")
        request = self._request(job.source, job.target, job.model)
        out = list(texts)
        todo = [i for i, text in enumerate(texts) if text.strip()]
        wanted = contexts if contexts is not None and self.capabilities.context else None
        groups = self._groups([texts[i] for i in todo])
        tasks = [
            asyncio.ensure_future(self._translate_group(
                request, [texts[todo[j]] for j in group],
                [wanted[todo[j]] if wanted is not None else None for j in group],
                [protected[todo[j]] if protected is not None else None for j in group]))
            for group in groups
        ]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # one group failed: the batch fails, stop the others
                task.cancel()
        answered: list[str | None] = list(out)
        reasons: list[str] = []
        for group, (translated, problems) in zip(groups, results, strict=True):
            for j, text in zip(group, translated, strict=True):
                answered[todo[j]] = text
            reasons += problems
        self._mark_up()
        self._maybe_refresh_models()
        if reasons:  # the good ones are answered; the bad ones go down the chain
            bad = sum(text is None for text in answered)
            raise PartialOutput(f"the LLM did not translate {bad} of {len(texts)} segments "
                                f"({summary(reasons)}) after a retry", answered)
        return [text for text in answered if text is not None]

    def _request(self, source: str | None, target: str, model: str | None) -> Request:
        """The names the prompt uses and the model asked for; the source may go unnamed."""
        target_name = self._language_name(target)
        source_name: str | None = None
        if source:
            with contextlib.suppress(UnsupportedLanguage):
                source_name = self._language_name(source)
        resolved = model or self._model
        assert resolved is not None  # a backend without a model refuses before this
        return Request(target_name, source_name, resolved)

    def _groups(self, texts: Sequence[str]) -> list[list[int]]:
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

    async def _complete(self, request: Request, cores: list[str], contexts: list[str | None],
                        protected: list[Protected | None]) -> str | None:
        body = chat_body(request, cores, contexts, json_mode=self.config.json_mode,
                         protected=protected)
        return await self._endpoint.complete(
            body, chars=sum(map(len, cores)),
            context_chars=sum(len(c) for c in contexts if c is not None))

    async def _translate_group(
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
            answer = parse_answer(await self._complete(request, cores, sent, protected),
                                  len(cores))
        except MalformedAnswer as first:
            log.info("llm answer unusable (%s); retrying once", first)
            self._endpoint.usage.retries += 1
            retried = True
            try:
                answer = parse_answer(await self._complete(request, cores, sent, protected),
                                      len(cores))
            except MalformedAnswer as second:
                how = f"{first}, twice" if str(first) == str(second) else f"{first}, then {second}"
                raise BadOutput(f"the LLM {how}") from None
        ids = list(range(1, len(cores) + 1))
        results, bad = judge(cores, sent, ids, answer, checks=self._check_items,
                             protected=protected)
        if bad and not retried:
            self._endpoint.usage.span_retries += _lost_spans(bad)
            fixed, bad = await self._retry_items(request, cores, contexts, sent, protected, bad)
            results.update(fixed)
        if bad:
            self._endpoint.usage.span_failures += _lost_spans(bad)
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
        self._endpoint.usage.retries += 1
        ids = list(bad)
        again_cores = [cores[k - 1] for k in ids]
        # Alone, an item no longer follows the one before it: it carries its own context.
        again_sent = context_fields(again_cores, [contexts[k - 1] for k in ids])
        again_protected = [protected[k - 1] for k in ids]
        try:
            again = parse_answer(
                await self._complete(request, again_cores, again_sent, again_protected),
                len(ids))
        except MalformedAnswer as exc:
            return {}, dict.fromkeys(ids, f"retry {exc}")
        retry_sent = list(sent)
        for k, context in zip(ids, again_sent, strict=True):
            retry_sent[k - 1] = context
        # The retry numbers its segments 1..n; map them back to this group's ids.
        answer = {ids[n - 1]: v for n, v in again.items()}
        return judge(cores, retry_sent, ids, answer, checks=self._check_items,
                     protected=protected)

    # -- readiness ---------------------------------------------------------------------------

    async def _check(self) -> None:
        """GET /models: auth and reachability, and the catalog's list. A server without
        that route is fine."""
        try:
            response = await self._endpoint.models()
            if response.status_code in (401, 403) or response.status_code >= 500:
                response.raise_for_status()
        except (httpx.HTTPError, TimeoutError) as exc:
            self._models.note(None)
            raise self._endpoint.map_error(exc) from exc
        self._models.note(response)
        self._mark_up()

    # -- facts -------------------------------------------------------------------------------

    def info(self) -> dict[str, object]:
        """Where requests go, the model, and what was sent (characters, requests, tokens)."""
        base_url = self._endpoint.base_url
        usage = self._endpoint.usage
        return {
            "base_url": safe_url(base_url) if base_url else None,
            "model": self._model,
            "billed_characters": usage.billed_characters,
            "context_characters": usage.context_characters,
            "requests": usage.requests,
            "retries": usage.retries,
            "span_retries": usage.span_retries,
            "span_failures": usage.span_failures,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "json_mode": self.config.json_mode,
            "check_items": self._check_items,
            "context": self.capabilities.context,
        }


def _lost_spans(bad: dict[int, str]) -> int:
    """How many of the ``bad`` items were bad for a protected span missing."""
    return sum(problem.startswith(SPAN_PROBLEM) for problem in bad.values())
