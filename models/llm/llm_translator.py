"""The LLM backend's translator: segments into chat requests in the configured prompt
style (``batches.JsonStyle`` or ``plain.PlainStyle``), answers checked and retried."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from models.base import Capabilities, Job
from models.errors import BadOutput, PartialOutput, UnsupportedLanguage
from models.languages import canonical
from models.llm.answers import summary
from models.llm.batches import JsonStyle
from models.llm.dialects import Refusals, resolve_dialect
from models.llm.endpoint import ChatEndpoint, ModelList, safe_url
from models.llm.plain import PlainStyle
from models.llm.prompt import UNNAMED, Request, language_name
from models.remote import AnswerBound, RemoteTranslator

log = logging.getLogger("models.llm")

NOT_CONFIGURED = "set {names} or choose another backend"
MAX_RESPONSE_SETTING = "THINKTRANS_LLM_MAX_RESPONSE_BYTES"


@dataclass(frozen=True)
class LLMConfig:
    """Where the chat endpoint is and how to call it. Its values come from the ``llm_*``
    settings (``Settings.llm_config()``), where each default is."""

    base_url: str | None  # the part before /chat/completions; None: not ready
    model: str | None  # None: not ready
    api_key: str | None = field(repr=False)  # sent as a Bearer token
    timeout_s: float  # one chat request, end to end
    # The most bytes read of one answer: a whole one, one line of a streamed one, the
    # /models list, an error's first bytes (its reason).
    max_response_bytes: int
    concurrency: int  # requests in flight, and batches the batcher runs at once
    # Not every server has response_format; on only where a setting asks for it.
    json_mode: bool
    # Each item must keep its source's numbers, inline code and URLs, at a plausible
    # length (item_problem). Off: only non-empty items are required, that keep their
    # protected spans (which are checked either way).
    check_items: bool
    # Send each segment's preceding stream text as its item's "context" (capabilities.context).
    context: bool
    # How reasoning is switched off (models.llm.dialects), and what every request adds.
    dialect: str
    extra_body: Mapping[str, Any]
    stream: bool  # ask for server-sent events (answers are read either way)
    # "json": numbered batches; "plain": one segment a request in a translation model's
    # own prompt, ``plain_template`` (a family of models.llm.plain, "auto", or a template).
    prompt_style: str
    plain_template: str


class LLMTranslator(RemoteTranslator):
    """An OpenAI-compatible chat endpoint as a translator; bills the characters sent."""

    name = "llm"
    capabilities = Capabilities(context=True, billed=True)
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
        self.max_concurrency = config.concurrency
        self.dialect = resolve_dialect(config.dialect, base_url)
        self._extra_id = hashlib.sha256(json.dumps(
            config.extra_body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]
        self._endpoint = ChatEndpoint(
            base_url, model=self._model, api_key=config.api_key, timeout_s=config.timeout_s,
            concurrency=config.concurrency, json_mode=config.json_mode,
            on_down=lambda reason, fail_fast: self._mark_down(reason, fail_fast=fail_fast),
            refusals=Refusals(self.dialect, config.extra_body), stream=config.stream,
            bound=AnswerBound(config.max_response_bytes, MAX_RESPONSE_SETTING),
        )
        self._style: JsonStyle | PlainStyle
        if config.prompt_style == "plain":
            self._style = PlainStyle(self._endpoint, checks=config.check_items,
                                     template=config.plain_template)
            # One segment a request: each goes as soon as a slot is free, none waits for
            # batch mates; the concurrency is the batching.
            self.max_batch_size = 1
        else:
            self._style = JsonStyle(self._endpoint, checks=config.check_items)
        self.capabilities = replace(self.capabilities, context=config.context)
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
        """Any target the service can name; a chat model handles most languages, a
        translation model's template those its family lists."""
        try:
            self._language_name(target)
        except UnsupportedLanguage:
            return False
        return self._style.supports(canonical(target), self.resolve_model(model, source, target))

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
            f"llm|{resolved}|at={self._endpoint_id}|{self._style.prompt_id(resolved)}"
            f"|json={self.config.json_mode}|check={self._check_items}"
            f"|ctx={self.capabilities.context}|dialect={self.dialect}|extra={self._extra_id}"
        )

    def catalog(self) -> list[dict[str, object]]:
        """The configured model first, then what the endpoint's GET /models lists; a list
        older than ``models_refresh_s`` is fetched again in the background."""
        self._maybe_refresh_models()
        if self._model is None:
            return []
        entries = self._models.catalog(self._model)
        for entry in entries:
            model = str(entry["model"])
            entry["languages"] = self._style.languages(model)
            entry["notes"] = f"{entry['notes']}; {self._style.describe(model)}"
        return entries

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
        try:
            response = await self._endpoint.models()
        except (httpx.HTTPError, TimeoutError):
            pass
        except BadOutput as exc:
            self._unlisted(exc)
        self._models.note(response)

    def _unlisted(self, exc: BadOutput) -> None:
        """A /models list too long to read: the catalog goes without it; chat requests are
        what tell whether the endpoint serves."""
        log.warning("llm endpoint's model list not read: %s", exc.detail)

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
        groups = self._style.groups([texts[i] for i in todo])
        tasks = [
            asyncio.ensure_future(self._style.translate_group(
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
        return Request(target_name, source_name, resolved, target=canonical(target),
                       source=canonical(source) if source_name else None)

    # -- readiness ---------------------------------------------------------------------------

    async def _check(self) -> None:
        """GET /models: auth and reachability, and the catalog's list. A server without
        that route, or with a list too long to read, is fine."""
        response: httpx.Response | None = None
        try:
            response = await self._endpoint.models()
            if response.status_code in (401, 403) or response.status_code >= 500:
                response.raise_for_status()
        except (httpx.HTTPError, TimeoutError) as exc:
            self._models.note(None)
            raise self._endpoint.map_error(exc) from exc
        except BadOutput as exc:
            self._unlisted(exc)
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
            "prompt_style": self._style.name,
            **self._style.info(self._model),
            "dialect": self.dialect,
            "extra_body_keys": sorted(self.config.extra_body),
            "stream": self.config.stream,
            "dropped_fields": self._endpoint.refusals.dropped(),
            "reasoning_answers": usage.reasoning_answers,
            "reasoning_tokens": usage.reasoning_tokens,
            "out_of_tokens": usage.out_of_tokens,
        }
