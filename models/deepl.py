"""The DeepL backend: the official ``deepl`` client, run in worker threads the backend owns.

The client is blocking (requests), so every call runs in this backend's own threads, one
client (one HTTP session) each; DeepL's errors become the backends' in one place
(``_map_error``), and its language codes live here. Texts with protected spans go through
``models.deepl_marked``; readiness follows DeepL's answers (``models.remote``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import deepl

from models.base import Capabilities, Job
from models.deepl_marked import Call, MarkedRequests, Markup
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    MissingExtra,
    RateLimited,
    UnsupportedLanguage,
)
from models.languages import base_language, canonical, region, table_key
from models.remote import RemoteTranslator
from models.spans import Protected

log = logging.getLogger(__name__)

T = TypeVar("T")

# DeepL's documented limits for one POST /v2/translate.
MAX_TEXTS_PER_REQUEST = 50
MAX_REQUEST_BYTES = 128 * 1024
# Room for target_lang, model_type, formality and the JSON frame around the texts.
_BODY_HEADROOM_BYTES = 1024

# The nearest text matters most, and a context shares the request's 128 KiB with the texts.
MAX_CONTEXT_CHARS = 2000

NO_KEY_REASON = "set THINKTRANS_DEEPL_API_KEY or choose another backend"

# DeepL's model types (the ``model_type`` of POST /v2/translate), as the catalog shows them.
MODEL_TYPE_NOTES: dict[str, str] = {
    "latency_optimized": "aims for the lowest latency; DeepL's default",
    "quality_optimized": "aims for the highest quality, at some latency",
    "prefer_quality_optimized": "legacy name; DeepL now serves it as quality_optimized",
}
MODEL_TYPES = tuple(sorted(MODEL_TYPE_NOTES))

# DeepL's codes by table key (see models.languages). Targets newer than this table are taken
# from the server's own list at start; English, Portuguese and Chinese targets have variants.
SOURCE_CODES: dict[str, str] = {
    "ar": "AR", "bg": "BG", "cs": "CS", "da": "DA", "de": "DE", "el": "EL", "en": "EN",
    "es": "ES", "et": "ET", "fi": "FI", "fr": "FR", "hu": "HU", "id": "ID", "it": "IT",
    "ja": "JA", "ko": "KO", "lt": "LT", "lv": "LV", "nb": "NB", "nl": "NL", "pl": "PL",
    "pt": "PT", "ro": "RO", "ru": "RU", "sk": "SK", "sl": "SL", "sv": "SV", "tr": "TR",
    "uk": "UK", "zh-Hans": "ZH", "zh-Hant": "ZH",
}  # fmt: skip
TARGET_CODES: dict[str, str] = {
    **SOURCE_CODES,
    "en": "EN-US",
    "pt": "PT-BR",
    "zh-Hans": "ZH-HANS",
    "zh-Hant": "ZH-HANT",
}
# Regions whose English is British; other regions get the english_variant setting.
_BRITISH_ENGLISH = frozenset({"GB", "IE", "AU", "NZ", "IN", "ZA"})
# Tags whose DeepL target code differs from their bare language's (see deepl_target_code).
_VARIANT_TAGS = ("en-GB", "en-US", "pt-BR", "pt-PT")


def deepl_target_code(tag: str, *, english_variant: str) -> str | None:
    """DeepL's target code: region picks EN-GB/EN-US and PT-PT/PT-BR; script picks ZH-HANS/HANT."""
    standard = canonical(tag)
    if standard is None:
        return None
    key = table_key(standard)
    code = TARGET_CODES.get(key)
    if code is None:
        return None
    if key == "en":
        territory = region(standard)
        if territory in _BRITISH_ENGLISH:
            return "EN-GB"
        return "EN-US" if territory == "US" else english_variant
    if key == "pt":
        return "PT-PT" if region(standard) not in (None, "BR") else "PT-BR"
    return code


def deepl_source_code(tag: str | None) -> str | None:
    """DeepL's source code for a tag, or None (then not sent: DeepL detects the source)."""
    standard = canonical(tag) if tag else None
    return SOURCE_CODES.get(table_key(standard)) if standard else None


class _Targets:
    """The targets DeepL serves: this module's table, refined by the server's own list once
    fetched (``learn``), which also says which targets take a formality."""

    def __init__(self, english_variant: str) -> None:
        self.english_variant = english_variant  # the target for a bare ``en``
        self.server: set[str] | None = None  # the server's target codes; None: not fetched
        self._formal: set[str] = set()

    def learn(self, targets: list[tuple[str, bool]]) -> None:
        """The server's target codes, each with whether it takes a formality."""
        self._formal = {code for code, formal in targets if formal}
        self.server = {code for code, _ in targets}

    def code(self, target: str) -> str | None:
        """DeepL's code for ``target``, or None where DeepL cannot translate into it."""
        code = deepl_target_code(target, english_variant=self.english_variant)
        if self.server is None:
            return code
        if code is None:
            # A language DeepL added after this table (e.g. HE): its plain code.
            standard = canonical(target)
            plain = base_language(standard).upper() if standard else None
            return plain if plain in self.server else None
        return code if code in self.server else None

    def tags(self) -> list[str]:
        """The tags with a DeepL code: the table's, its variants' and, once fetched, the
        server's newer targets."""
        candidates = set(TARGET_CODES)
        candidates.update(_VARIANT_TAGS)
        table_codes = set(TARGET_CODES.values())
        for code in self.server or ():
            if "-" not in code and code not in table_codes:
                candidates.add(code.lower())
        return sorted(tag for tag in candidates if self.code(tag) is not None)

    def formality(self, code: str, formality: str | None) -> str | None:
        """The formality to send into the target ``code``: none for a strict one (``less``,
        ``more``, an error there) where the server says the target has no formality;
        ``prefer_*`` never is an error. Until the server's list is fetched, as given."""
        if formality in {"less", "more"} and self.server is not None and code not in self._formal:
            return None
        return formality


def _drop_debug_records(record: logging.LogRecord) -> bool:
    # The client logs whole request and response bodies (the thinking text) at DEBUG.
    return record.levelno > logging.DEBUG


def _encoded_size(text: str) -> int:
    """Bytes ``text`` takes in the client's JSON body (ASCII-escaped, as requests sends it)."""
    return len(json.dumps(text)) + 2  # the separator ", " between list items


def split_requests(texts: Sequence[str], *, max_bytes: int = MAX_REQUEST_BYTES) -> list[list[int]]:
    """Indexes of ``texts`` grouped into requests within DeepL's count and size limits.

    A single text over the size limit goes alone; DeepL then refuses it (HTTP 413).
    """
    budget = max_bytes - _BODY_HEADROOM_BYTES
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, text in enumerate(texts):
        n = _encoded_size(text)
        if current and (len(current) >= MAX_TEXTS_PER_REQUEST or size + n > budget):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    if current:
        groups.append(current)
    return groups


def _app_version() -> str:
    try:
        return metadata.version("thinktrans")
    except metadata.PackageNotFoundError:
        return "dev"


@dataclass(frozen=True)
class DeepLConfig:
    """How the DeepL backend talks to DeepL. Its values come from the ``deepl_*`` settings
    (``Settings.deepl_config()``), where each default is."""

    api_key: str | None = field(repr=False)  # None: the backend is not ready
    server_url: str | None  # None: by the key (":fx" keys go to the free API)
    threads: int  # worker threads, and batches the batcher runs at once
    model_type: str | None
    formality: str | None
    context: bool  # send the text before each one as DeepL's (unbilled) context
    english_variant: str  # the target for a bare ``en``
    # DeepL glossaries kept for glossary terms, the least recently used deleted first (all
    # at close); 0: never create one, put each target term in the text instead.
    max_glossaries: int
    request_timeout_s: float  # one attempt (the batch timeout bounds it too)
    max_retries: int = 2  # the client's own retries of one request; no setting


class _Workers:
    """The backend's worker threads, each with a client of its own (one HTTP session), made
    for the thread's first request."""

    def __init__(self, threads: int, api_key: str | None, server_url: str | None) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="thinktrans-deepl")
        self._api_key = api_key
        self._server_url = server_url
        self._local = threading.local()
        self._clients: list[deepl.DeepLClient] = []
        self._lock = threading.Lock()  # guards _clients

    def client(self) -> deepl.DeepLClient:
        """The calling worker thread's client."""
        import deepl

        client: deepl.DeepLClient | None = getattr(self._local, "client", None)
        if client is None:
            assert self._api_key is not None
            client = deepl.DeepLClient(self._api_key, server_url=self._server_url,
                                       send_platform_info=False)
            client.set_app_info("thinktrans", _app_version())
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        """Stop the threads and close the clients' sessions. A request still in flight
        cannot be interrupted: it is not waited for."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


class DeepLTranslator(RemoteTranslator):
    """DeepL through the official client; bills the characters sent."""

    name = "deepl"
    capabilities = Capabilities(context=True, billed=True)
    # Seconds between usage refreshes (GET /v2/usage) triggered by translations.
    usage_refresh_s: float = 300.0

    def __init__(self, config: DeepLConfig) -> None:
        # The vendor's client is imported by the backend that needs it: the config, and
        # the service, import without it.
        try:
            import deepl
        except ImportError as exc:
            raise MissingExtra("the deepl backend needs the official DeepL client: "
                               "pip install 'thinktrans[deepl]'", name="deepl",
                               extra="deepl") from exc
        super().__init__()
        self.config = config
        self._api_key = config.api_key or None
        # urljoin drops the last path segment unless the base ends in "/": keep proxy paths.
        server_url = config.server_url
        self._server_url = server_url.rstrip("/") + "/" if server_url else None
        self._model_type = config.model_type or None
        self._formality = config.formality or None
        self.capabilities = replace(self.capabilities, context=config.context)
        self.max_concurrency = config.threads
        # The client's retry knobs are module globals: one DeepL backend per process.
        # Retries back off 1 s, 1.6 s, 2.6 s...; the batcher's backend_timeout_s cuts a
        # batch off whatever the client is still doing.
        deepl.http_client.max_network_retries = config.max_retries
        deepl.http_client.min_connection_timeout = config.request_timeout_s
        logging.getLogger("deepl").addFilter(_drop_debug_records)

        self._workers = _Workers(config.threads, self._api_key, self._server_url)
        self._lock = threading.Lock()  # guards the counters below
        self._billed_characters = 0
        self._requests = 0

        self._usage: dict[str, int | None] | None = None
        self._usage_checked_at: float | None = None  # time.monotonic()
        self._targets = _Targets(config.english_variant)  # refined at start from the server
        self._marked = MarkedRequests(send=self._translate_group, run=self._call,
                                      client=self._workers.client,
                                      max_glossaries=config.max_glossaries)

        if self._api_key is None:
            self._not_configured(NO_KEY_REASON)

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Delete the glossaries created; stop background work, the worker threads and the
        clients' sessions."""
        if not self._closed:
            await self._marked.aclose(timeout_s=self.config.request_timeout_s)
        await super().aclose()
        self._workers.close()

    # -- languages ---------------------------------------------------------------------------

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Whether DeepL has a code for ``target``; any source works (DeepL detects it)."""
        return self._targets.code(target) is not None

    def languages(self) -> list[str]:
        """Targets with a DeepL code, refined by the server's own list once fetched."""
        return self._targets.tags()

    # -- models ------------------------------------------------------------------------------

    def model_problem(self, model: str | None) -> str | None:
        """None for DeepL's own model types; any other name cannot be served."""
        if model is None or model in MODEL_TYPES:
            return None
        return f"deepl serves the model types {', '.join(MODEL_TYPES)}; got {model!r}"

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The named model type, else ``DeepLConfig.model_type`` (None: DeepL's default)."""
        return model or self._model_type

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model type and the options that change DeepL's output; not the context, which
        DeepL only reads for terms."""
        return (
            f"deepl|{self.resolve_model(model, source, target)}"
            f"|formality={self._formality}|en={self.config.english_variant}"
        )

    def catalog(self) -> list[dict[str, object]]:
        """The model types, each for every target this backend knows."""
        languages = self.languages()
        return [
            {
                "model": model_type,
                "languages": list(languages),
                "default": model_type == self._model_type,
                "notes": MODEL_TYPE_NOTES[model_type],
            }
            for model_type in MODEL_TYPE_NOTES
        ]

    # -- translation -------------------------------------------------------------------------

    async def run(self, job: Job) -> list[str]:
        """Translate in requests of at most 50 texts and 128 KiB, one context per request
        (DeepL takes one a request, so a batch goes as one group per distinct context, the
        groups at once), with the model type ``model`` (None: ``DeepLConfig.model_type``)."""
        texts, source, target = job.texts, job.source, job.target
        contexts, model = job.contexts, job.model
        self._refuse_if_unusable()
        problem = self.model_problem(model)
        if problem is not None:
            raise BackendError(problem, model=model)
        code = self._targets.code(target)
        if code is None:
            raise UnsupportedLanguage(f"DeepL cannot translate into {target!r}")
        call = Call(code, deepl_source_code(source), model or self._model_type)
        if contexts is not None and len(contexts) != len(texts):
            raise ValueError(f"{len(contexts)} contexts for {len(texts)} texts")

        protected = job.protected
        if protected is not None and len(protected) != len(texts):
            raise ValueError(f"{len(protected)} span lists for {len(texts)} texts")

        # Blank texts are not sent: DeepL would bill nothing useful for them. Texts with
        # protected spans go apart, as XML (separate requests: tag handling is per request).
        groups: dict[str | None, list[int]] = {}
        marked: list[tuple[int, Protected, str | None]] = []
        for i, text in enumerate(texts):
            if text.strip():
                context = self._context(contexts[i]) if contexts is not None else None
                spans = protected[i] if protected is not None else None
                if spans is not None and spans.spans:
                    marked.append((i, spans, context))
                else:
                    groups.setdefault(context, []).append(i)
        tasks = [
            asyncio.ensure_future(self._translate_group(call, [texts[i] for i in indexes], context))
            for context, indexes in groups.items()
        ]
        if marked:
            tasks.append(asyncio.ensure_future(
                self._marked.translate(call, [(p, c) for _, p, c in marked])))
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # one group failed: the batch fails, stop the others
                task.cancel()
        out = list(texts)
        for indexes, translated in zip(groups.values(), results[:len(groups)], strict=True):
            for i, text in zip(indexes, translated, strict=True):
                out[i] = text
        for (i, _, _), text in zip(marked, results[-1] if marked else (), strict=True):
            out[i] = text
        self._mark_up()
        self._maybe_refresh_usage()
        return out

    def _context(self, context: str | None) -> str | None:
        """What goes as DeepL's ``context`` with a text: its tail, or None for none."""
        if not self.capabilities.context or context is None or not context.strip():
            return None
        return context[-MAX_CONTEXT_CHARS:]

    async def _translate_group(
        self, call: Call, texts: list[str], context: str | None,
        markup: Markup | None = None,
    ) -> list[str]:
        """Texts that share one context (and markup: None, plain text), in as many requests
        as DeepL's limits need, in order."""
        budget = MAX_REQUEST_BYTES - (_encoded_size(context) if context else 0)
        out: list[str] = []
        for group in split_requests(texts, max_bytes=budget):
            out += await self._send([texts[j] for j in group], call, context, markup)
        return out

    async def _send(self, texts: list[str], call: Call, context: str | None,
                    markup: Markup | None) -> list[str]:
        """One request; refused as too large (HTTP 413: a server whose limit is below the
        documented 128 KiB, as DeepL's own mock server's 100 KB), again in halves."""
        try:
            return await self._call(self._translate_blocking, call, texts, context, markup)
        except BackendError as exc:
            if len(texts) < 2 or getattr(exc.__cause__, "http_status_code", None) != 413:
                raise
        half = len(texts) // 2
        log.info("deepl refused %d texts as too large (HTTP 413); sending them in halves",
                 len(texts))
        return (await self._send(texts[:half], call, context, markup)
                + await self._send(texts[half:], call, context, markup))

    def _translate_blocking(
        self, call: Call, texts: list[str], context: str | None, markup: Markup | None = None
    ) -> list[str]:
        """One POST /v2/translate, in a worker thread."""
        target_code = call.target_code
        formality = self._targets.formality(target_code, self._formality)
        started = time.monotonic()
        with self._lock:
            self._requests += 1
        tags = markup.options() if markup is not None else {}
        results = self._workers.client().translate_text(
            texts,
            source_lang=call.source_code,
            target_lang=target_code,
            context=context,
            formality=formality,
            model_type=call.model_type,
            **tags,
        )
        if not isinstance(results, list):  # one text in gives one result out
            results = [results]
        billed = sum(
            r.billed_characters if r.billed_characters is not None else len(t)
            for r, t in zip(results, texts, strict=True)
        )
        # Counted here, in the thread: a batch the caller gave up on is billed all the same.
        with self._lock:
            self._billed_characters += billed
        log.debug(
            "deepl translated %d texts (%d chars billed, %d context chars) into %s in %.0f ms",
            len(texts), billed, len(context or ""), target_code,
            (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return [r.text for r in results]

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking client work in the backend's threads; map every failure."""
        try:
            return await self._workers.run(fn, *args)
        except BackendError:
            raise
        except Exception as exc:
            raise self._map_error(exc) from exc

    def _map_error(self, exc: Exception) -> BackendError:
        """The one place DeepL's and the client's errors become the backends' errors; the
        ones that say DeepL is unusable mark the backend down."""
        error, fail_fast = vendor_error(exc, timeout_s=self.config.request_timeout_s,
                                        server=self._server_label, closed=self._closed)
        if fail_fast is not None:
            self._mark_down(error.detail, fail_fast=fail_fast)
        return error

    # -- readiness ---------------------------------------------------------------------------

    def _server_label(self) -> str:
        return server_label(self._server_url, self._api_key)

    async def _check(self) -> None:
        """Check the key and quota (GET /v2/usage, not billed); fetch the target list once."""
        await self._refresh_usage()
        if self._targets.server is None:
            self._targets.learn(await self._call(self._fetch_targets))

    def _fetch_targets(self) -> list[tuple[str, bool]]:
        return [
            (lang.code.upper(), bool(lang.supports_formality))
            for lang in self._workers.client().get_target_languages()
        ]

    async def _refresh_usage(self) -> None:
        usage = await self._call(lambda: self._workers.client().get_usage())
        self._usage_checked_at = time.monotonic()
        chars = usage.character
        self._usage = {"character_count": chars.count, "character_limit": chars.limit}
        if chars.limit_reached:
            self._mark_down(QUOTA_REASON, fail_fast=True)
        else:
            self._mark_up()

    def _maybe_refresh_usage(self) -> None:
        checked = self._usage_checked_at
        if checked is not None and time.monotonic() - checked < self.usage_refresh_s:
            return
        if any(not t.done() for t in self._tasks):
            return
        self._usage_checked_at = time.monotonic()  # one refresh at a time, even if it fails
        self._spawn(self._refresh_usage())

    # -- facts -------------------------------------------------------------------------------

    def info(self) -> dict[str, object]:
        """Billed characters since start, the account's usage, and where requests go."""
        with self._lock:
            billed, requests_sent = self._billed_characters, self._requests
        return {
            "billed_characters": billed,
            "requests": requests_sent,
            "usage": dict(self._usage) if self._usage is not None else None,
            "server_url": self._server_label() if self._api_key else self._server_url,
            "model_type": self._model_type,
            "formality": self._formality,
            "context": self.capabilities.context,
            **self._marked.facts(),
        }


QUOTA_REASON = ("DeepL character quota for this billing period is used up (HTTP 456); "
                "raise the limit or choose another backend")


def vendor_error(exc: Exception, *, timeout_s: float, server: Callable[[], str],
                 closed: bool) -> tuple[BackendError, bool | None]:
    """The backends' error for a DeepL or client failure, and whether it marks the backend
    down: None (no), True (at once, a retry cannot help) or False (until a probe passes)."""
    import deepl

    if isinstance(exc, deepl.AuthorizationException):
        return BackendUnavailable("DeepL rejected the API key (HTTP 403); check "
                                  "THINKTRANS_DEEPL_API_KEY or choose another backend"), True
    if isinstance(exc, deepl.QuotaExceededException):
        return BackendUnavailable(QUOTA_REASON), True
    if isinstance(exc, deepl.TooManyRequestsException):
        return RateLimited("DeepL is rate limiting requests (HTTP 429) after retries"), None
    if isinstance(exc, deepl.ConnectionException):
        if _is_read_timeout(exc):
            return BackendTimeout(f"DeepL did not answer within {timeout_s:g} s"), None
        return BackendUnavailable(f"cannot reach DeepL at {server()}"), False
    if isinstance(exc, deepl.DeepLException):
        status = exc.http_status_code
        if status is None or status >= 500:
            reason = f"DeepL is failing (HTTP {status or 'error'}); try again later"
            return BackendUnavailable(reason), False
        return BackendError(f"DeepL refused the request (HTTP {status})"), None
    if isinstance(exc, RuntimeError) and closed:
        return BackendUnavailable("the DeepL backend is closed"), None
    # The client chokes on an answer it cannot read (missing fields, not JSON).
    return BadOutput(f"DeepL answered something the client cannot read "
                     f"({type(exc).__name__})"), None


def server_label(server_url: str | None, api_key: str | None) -> str:
    """Where requests go: the configured server, else DeepL's API for the key's plan."""
    if server_url:
        return server_url.rstrip("/")
    import deepl

    free = api_key is not None and deepl.auth_key_is_free_account(api_key)
    return "https://api-free.deepl.com" if free else "https://api.deepl.com"


def _is_read_timeout(exc: BaseException) -> bool:
    """Whether a ConnectionException came from a request that got no answer in time."""
    import requests

    cause = exc.__cause__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return False  # nothing accepted the connection: unreachable, not slow
    if isinstance(cause, requests.exceptions.Timeout):
        return True
    # A body that stalls after the headers surfaces as ConnectionError(ReadTimeoutError).
    inner = cause.args[0] if cause is not None and cause.args else None
    return type(inner).__name__ == "ReadTimeoutError"
