"""One OpenAI-compatible chat endpoint: its HTTP client, the requests in flight, what was
sent, what it lists, and the one place its failures become the backends' errors."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    RateLimited,
)
from models.llm.dialects import Refusals
from models.llm.replies import Reply, read_reply
from models.llm.replies import short_int as _short_int
from models.remote import AnswerBound

log = logging.getLogger("models.llm")

# Far above any real request's tokens; a bigger "count" is not one.
MAX_USAGE_TOKENS = 10**12


def usage_count(value: object) -> int | None:
    """A token count from a vendor's ``usage``, or None when it is not a sane one.

    Bookkeeping never fails a translation: an infinite, NaN, negative, fractional,
    huge or non-numeric count is ignored, not raised.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float):
        if not value.is_integer():  # also NaN and the infinities
            return None
        value = int(value)
    return value if 0 <= value <= MAX_USAGE_TOKENS else None


# What servers say when a chat request names a model they do not have: OpenAI answers 404
# with code "model_not_found"; vLLM, Ollama, LiteLLM and OpenRouter say it in words.
_MODEL_MISSING = re.compile(
    r"\bmodel\b.*\b(?:does not exist|not found|no such|unknown)\b"
    r"|\b(?:unknown|invalid|no such|not a valid)\s+model\b",
    re.IGNORECASE | re.DOTALL,
)


def model_missing(response: httpx.Response) -> bool:
    """Whether an error answer (400 or 404) says that the model asked for does not exist."""
    if response.status_code not in (400, 404):
        return False
    try:
        data = response.json(parse_int=_short_int)
    except ValueError:
        return False
    error = data.get("error", data) if isinstance(data, dict) else None
    message: object
    code: object
    if isinstance(error, str):
        message, code = error, None
    elif isinstance(error, dict):
        message, code = error.get("message"), error.get("code")
    else:
        return False
    if code == "model_not_found":
        return True
    return isinstance(message, str) and _MODEL_MISSING.search(message[:500]) is not None


# A listing is for people to read; a bigger or odder one is cut, not trusted.
MAX_LISTED_MODELS = 1000
MAX_MODEL_ID_CHARS = 200


def listed_models(response: httpx.Response) -> tuple[str, ...] | None:
    """The model ids of a ``GET /models`` answer (OpenAI: ``{"data": [{"id": ...}]}``), in
    its order and once each; None when the answer is not such a list."""
    if response.status_code != 200:
        return None
    try:
        data = response.json(parse_int=_short_int)
    except ValueError:
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    ids = (item.get("id") for item in items if isinstance(item, dict))
    kept = (i for i in ids if isinstance(i, str) and 0 < len(i) <= MAX_MODEL_ID_CHARS)
    return tuple(dict.fromkeys(kept))[:MAX_LISTED_MODELS]


def safe_url(url: str) -> str:
    """The URL without credentials or query (keys sometimes travel there)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))


@dataclass
class Usage:
    """What was sent to the endpoint and what it says it used, for ``info``."""

    billed_characters: int = 0
    context_characters: int = 0
    requests: int = 0
    retries: int = 0
    # Items asked again for a protected span missing, and those still missing it after.
    span_retries: int = 0
    span_failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Answers that came with reasoning (the switch missing or ignored), and its tokens.
    reasoning_answers: int = 0
    reasoning_tokens: int = 0
    out_of_tokens: int = 0  # empty answers cut off by the token limit

    def count_tokens(self, usage: object) -> None:
        """Add an answer's token counts; what is not a sane count is skipped."""
        if usage is None:
            return
        if not isinstance(usage, dict):
            log.debug("llm usage ignored: a %s, not an object", type(usage).__name__)
            return
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            self.reasoning_tokens += usage_count(details.get("reasoning_tokens")) or 0
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            count = usage_count(value)
            if count is None:
                if value is not None:
                    log.debug("llm usage %s ignored: not a sane count (%s)",
                              key, type(value).__name__)  # fmt: skip
                continue
            if key == "prompt_tokens":
                self.prompt_tokens += count
            else:
                self.completion_tokens += count


class ModelList:
    """The endpoint's ``GET /models`` ids, and when they were fetched."""

    def __init__(self) -> None:
        self.ids: tuple[str, ...] | None = None  # None: not fetched, or none listed
        self.fetched_at: float | None = None  # time.monotonic() of the last fetch

    def note(self, response: httpx.Response | None) -> None:
        """Keep what a GET /models answer lists. An outage or a refused key (None, 401,
        403, 5xx) keeps the last list: readiness, not the catalog, reports those."""
        self.fetched_at = time.monotonic()
        if response is None or response.status_code in (401, 403) or response.status_code >= 500:
            return
        self.ids = listed_models(response)

    def stale(self, max_age_s: float) -> bool:
        fetched = self.fetched_at
        return fetched is None or time.monotonic() - fetched >= max_age_s

    def catalog(self, configured: str) -> list[dict[str, object]]:
        """The configured model first (with what the list says of it), then the rest."""
        listed = self.ids
        if self.fetched_at is None or (listed is not None and configured in listed):
            notes = "configured (THINKTRANS_LLM_MODEL)"
        elif listed is None:
            notes = "configured (THINKTRANS_LLM_MODEL); the endpoint does not list its models"
        else:
            notes = "configured; not in the endpoint's /models list"
        entries = [_entry(configured, default=True, notes=notes)]
        entries += [_entry(ident, default=False, notes="listed by the endpoint")
                    for ident in listed or () if ident != configured]
        return entries


def _entry(model: str, *, default: bool, notes: str) -> dict[str, object]:
    """One catalog entry; a chat model serves any target the prompt can name."""
    return {"model": model, "languages": None, "default": default, "notes": notes}


class ChatEndpoint:
    """Chat completions and the model list at ``base_url``, at most ``concurrency`` in
    flight, each answer read within ``bound``. ``on_down(reason, fail_fast)`` hears of
    failures that make the backend unready (a refused key, an endpoint gone or failing)."""

    def __init__(
        self, base_url: str | None, *, model: str | None, api_key: str | None,
        timeout_s: float, concurrency: int, json_mode: bool,
        on_down: Callable[[str, bool], None], refusals: Refusals, stream: bool,
        bound: AnswerBound,
    ) -> None:
        self.base_url = base_url
        self.model = model  # the configured one: its failures are the backend's
        self.timeout_s = timeout_s
        self.bound = bound
        self.json_mode = json_mode
        self.refusals = refusals
        self.stream = stream
        self.usage = Usage()
        self._reasoners: set[str | None] = set()  # models seen reasoning (logged once)
        self._on_down = on_down
        self._semaphore = asyncio.Semaphore(concurrency)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=(base_url or "http://unconfigured.invalid") + "/",
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=concurrency,
                                max_keepalive_connections=concurrency),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def complete(self, body: dict[str, Any], *, chars: int, context_chars: int,
                       path: str = "chat/completions") -> Reply:
        """One chat completion, with the dialect's switch and the extra body; its answer
        (``Reply.content`` without reasoning, None when it has none). ``chars`` (billed) and
        ``context_chars`` are what it sends, counted in ``usage``. A field of the service's
        own that the endpoint refuses by name is changed or dropped and the request sent
        again; an empty answer cut off by the token limit is BadOutput, saying why."""
        model = body.get("model")
        if self.stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        for _ in range(4):  # the reasoning_effort values, then without it
            sent = self.refusals.shape(body, model, chat="messages" in body)
            try:
                reply = await self._exchange(path, sent, chars=chars,
                                             context_chars=context_chars)
                break
            except httpx.HTTPStatusError as exc:
                change = self.refusals.refused(exc.response, model)
                if change is None:
                    raise self.map_error(exc, model) from exc
                log.info("llm endpoint refused a field for model %s (HTTP %d); sending %s",
                         model, exc.response.status_code, change)  # fmt: skip
            except (httpx.HTTPError, TimeoutError) as exc:
                raise self.map_error(exc, model) from exc
        else:
            raise BackendError("the LLM endpoint refused every form of the request")
        return self._judge(reply, model)

    async def _exchange(self, path: str, sent: dict[str, Any], *, chars: int,
                        context_chars: int) -> Reply:
        started = time.monotonic()
        async with self._semaphore:
            self.usage.requests += 1
            self.usage.billed_characters += chars
            self.usage.context_characters += context_chars
            async with asyncio.timeout(self.timeout_s), self._client.stream(
                    "POST", path, json=sent) as response:
                if response.is_error:  # its first bytes give the reason; never read whole
                    (await self.bound.read(response, "an error answer")).raise_for_status()
                reply = await read_reply(response, self.bound)
        log.debug("llm request: %d chars, HTTP %d in %.0f ms", chars, response.status_code,
                  (time.monotonic() - started) * 1000)  # fmt: skip
        return reply

    def _judge(self, reply: Reply, model: str | None) -> Reply:
        """Count what the answer used; raise for an answer that is an error or empty for
        want of tokens."""
        before = self.usage.reasoning_tokens
        self.usage.count_tokens(reply.usage)
        # OpenAI's reasoning models hide the reasoning: only the usage tells of it.
        reply.reasoned = reply.reasoned or self.usage.reasoning_tokens > before
        if reply.reasoned:
            self.note_reasoning(model)
        if reply.error is not None:
            raise BackendError(f"the LLM endpoint answered an error ({reply.error})")
        if not (reply.content or "").strip() and reply.finish_reason == "length":
            self.usage.out_of_tokens += 1
            while_ = " while reasoning" if reply.reasoned else ""
            raise BadOutput(
                f"the LLM ran out of tokens{while_} before it answered (finish_reason length, "
                f"no content): reasoning is likely left on (THINKTRANS_LLM_DIALECT is "
                f"{self.refusals.dialect!r}) or max_tokens is too small")
        return reply

    def note_reasoning(self, model: str | None) -> None:
        """Count an answer that came with reasoning: one ``_judge`` saw (a reasoning field,
        its tokens, a ``<think>`` block opening the content), or one a prompt style found
        before a bare ``</think>``. The first of a model is logged."""
        self.usage.reasoning_answers += 1
        if model not in self._reasoners and len(self._reasoners) < 100:
            self._reasoners.add(model)
            log.warning("llm model %s reasoned before answering (dialect %s): check "
                        "THINKTRANS_LLM_DIALECT", model, self.refusals.dialect)  # fmt: skip

    def reasons(self, model: str | None) -> bool:
        """Whether ``model`` was seen reasoning here (of the first 100 models that did)."""
        return model in self._reasoners

    async def models(self) -> httpx.Response:
        """GET /models, within the timeout and the bound; HTTP and timeout errors as they
        come, a list past the bound BadOutput."""
        async with asyncio.timeout(self.timeout_s), self._client.stream(
                "GET", "models") as response:
            return await self.bound.read(response, "the LLM endpoint's /models list")

    def map_error(self, exc: Exception, model: str | None = None) -> BackendError:
        """The one place HTTP failures become the backends' errors; ``model``: the one the
        failed request named (None: the configured one)."""
        if isinstance(exc, httpx.HTTPStatusError):
            return self._map_status(exc.response, model or self.model)
        where = safe_url(self.base_url or "")
        if isinstance(exc, httpx.ConnectTimeout) or not isinstance(
            exc, httpx.TimeoutException | TimeoutError
        ):
            reason = f"cannot reach the LLM endpoint at {where} ({type(exc).__name__})"
            self._on_down(reason, False)
            return BackendUnavailable(reason)
        return BackendTimeout(f"the LLM endpoint did not answer within {self.timeout_s:g} s")

    def _map_status(self, response: httpx.Response, model: str | None) -> BackendError:
        status = response.status_code
        if status in (401, 403):
            reason = (
                f"the LLM endpoint rejected the key (HTTP {status}); "
                "check THINKTRANS_LLM_API_KEY or choose another backend"
            )
            self._on_down(reason, True)
            return BackendUnavailable(reason)
        if status == 429:
            retry_after = response.headers.get("retry-after")
            return RateLimited("the LLM endpoint is rate limiting requests (HTTP 429)",
                               retry_after=retry_after)  # fmt: skip
        if model_missing(response):
            return self._no_such_model(model, status)
        if model != self.model and (status == 404 or status >= 500):
            # A model a request named: its failure is its own, never the backend's for
            # every stream (the batcher keeps it out of the breaker for the same reason).
            return BackendError(f"the LLM endpoint answered HTTP {status} for model {model!r}")
        if status == 404:
            reason = (
                f"the LLM endpoint answered 404 for model {model!r}; check "
                "THINKTRANS_LLM_BASE_URL (it ends in /v1) and THINKTRANS_LLM_MODEL"
            )
            self._on_down(reason, False)
            return BackendUnavailable(reason)
        if status >= 500:
            where = safe_url(self.base_url or "")
            reason = f"the LLM endpoint at {where} is failing (HTTP {status})"
            self._on_down(reason, False)
            return BackendUnavailable(reason)
        hint = "; it may not support response_format" if self.json_mode else ""
        return BackendError(f"the LLM endpoint refused the request (HTTP {status}){hint}")

    def _no_such_model(self, model: str | None, status: int) -> BackendError:
        """A model the endpoint does not have. A named one fails its batch alone; the
        configured one leaves the backend not ready, as every request would fail."""
        if model != self.model:
            return BackendError(f"the LLM endpoint has no model {model!r} (HTTP {status})",
                                model=model)  # fmt: skip
        reason = (
            f"the LLM endpoint has no model {model!r} (HTTP {status}); check "
            "THINKTRANS_LLM_MODEL or choose another backend"
        )
        self._on_down(reason, False)
        return BackendUnavailable(reason, model=model)
