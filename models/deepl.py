"""The DeepL backend: the official ``deepl`` client, run in worker threads the backend owns.

The client is blocking (requests), so every call runs in this backend's own
ThreadPoolExecutor, one client (one HTTP session) per worker thread. Vendor errors are
mapped to the service's errors in one place, ``_map_error``; auth and quota failures also
mark the backend not ready, and a background probe (GET /v2/usage, not billed) brings it
back once the key or the quota is good again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from typing import Any, TypeVar

try:
    import deepl
    import requests
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        "the deepl backend needs the official DeepL client: pip install 'thinktrans[deepl]'",
        name="deepl",
    ) from exc

from models.base import Translator
from service.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    RateLimited,
    UnsupportedLanguage,
)
from service.locale import LANGUAGES, base_language, deepl_target_code, lang_info
from service.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# DeepL's documented limits for one POST /v2/translate.
MAX_TEXTS_PER_REQUEST = 50
MAX_REQUEST_BYTES = 128 * 1024
# Room for target_lang, model_type, formality and the JSON frame around the texts.
_BODY_HEADROOM_BYTES = 1024

NO_KEY_REASON = "set THINKTRANS_DEEPL_API_KEY or choose another backend"
# Tags whose DeepL target code differs from their bare language's (see deepl_target_code).
_VARIANT_TAGS = ("en-GB", "en-US", "pt-BR", "pt-PT")


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


class DeepLTranslator(Translator):
    """DeepL through the official client; bills the characters sent."""

    name = "deepl"
    billed = True
    # The pipeline skips a backend that is not ready, so a background probe brings it
    # back: slowly after an auth or quota failure (a person must act), quickly after an outage.
    recheck_after_s: float = 60.0
    outage_recheck_s: float = 5.0
    # Seconds between usage refreshes (GET /v2/usage) triggered by translations.
    usage_refresh_s: float = 300.0

    def __init__(
        self,
        api_key: str | None,
        *,
        server_url: str | None = None,
        threads: int = 4,
        model_type: str | None = "latency_optimized",
        formality: str | None = None,
        context: bool = False,
        english_variant: str = "EN-US",
        max_retries: int = 2,
        request_timeout_s: float = 10.0,
    ) -> None:
        super().__init__()
        self._api_key = api_key or None
        # urljoin drops the last path segment unless the base ends in "/": keep proxy paths.
        self._server_url = server_url.rstrip("/") + "/" if server_url else None
        self._model_type = model_type or None
        self._formality = formality or None
        self._context = context
        self._english_variant = english_variant
        self._request_timeout_s = request_timeout_s
        self.max_concurrency = threads
        # The client's retry knobs are module globals: one DeepL backend per process.
        # Retries back off 1 s, 1.6 s, 2.6 s...; the batcher's backend_timeout_s cuts a
        # batch off whatever the client is still doing.
        deepl.http_client.max_network_retries = max_retries
        deepl.http_client.min_connection_timeout = request_timeout_s
        logging.getLogger("deepl").addFilter(_drop_debug_records)

        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="thinktrans-deepl")
        self._local = threading.local()
        self._clients: list[deepl.DeepLClient] = []
        self._lock = threading.Lock()  # guards _clients and the counters below
        self._billed_characters = 0
        self._requests = 0

        self._usage: dict[str, int | None] | None = None
        self._usage_checked_at: float | None = None  # time.monotonic()
        self._server_targets: set[str] | None = None  # refined at start from the server
        self._formality_targets: set[str] = set()
        self._fail_fast = False  # auth or quota: refuse at once until the probe succeeds
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._prober: asyncio.Task[None] | None = None
        self._start_task: asyncio.Task[None] | None = None

        if self._api_key is None:
            self.ready = False
            self.reason = NO_KEY_REASON
        if context:
            log.warning("deepl_context is set, but the contract passes no context yet; ignored")

    @classmethod
    def from_settings(cls, settings: Settings) -> DeepLTranslator:
        """Build the backend from ``deepl_*`` settings."""
        key = settings.deepl_api_key.get_secret_value() if settings.deepl_api_key else None
        return cls(
            key,
            server_url=settings.deepl_server_url,
            threads=settings.deepl_threads,
            model_type=settings.deepl_model_type,
            formality=settings.deepl_formality,
            context=settings.deepl_context,
            english_variant=settings.deepl_english_variant,
            # One attempt may not outlast the batch it serves.
            request_timeout_s=min(10.0, settings.backend_timeout_s),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the key and fetch the target list in the background; startup does not wait."""
        if self._api_key is None:
            return
        self._start_task = self._spawn(self._start_check())

    async def settled(self) -> None:
        """Wait for the start-time check (tests and the CLI; the service never waits)."""
        if self._start_task is not None:
            await asyncio.shield(self._start_task)

    async def aclose(self) -> None:
        """Stop background work, the worker threads and the clients' sessions."""
        self._closed = True
        tasks = [t for t in (*self._tasks, self._prober) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, BackendError):
                await task
        # A request still in flight cannot be interrupted; do not wait for it.
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    # -- languages ---------------------------------------------------------------------------

    def _target_code(self, target: str) -> str | None:
        try:
            code = deepl_target_code(target, english_variant=self._english_variant)
        except ValueError:  # not a tag at all (langcodes.LanguageTagError)
            return None
        if self._server_targets is None:
            return code
        if code is None:
            # A language DeepL added after the service's table (e.g. HE): its plain code.
            plain = base_language(target).upper()
            return plain if plain in self._server_targets else None
        return code if code in self._server_targets else None

    def _source_code(self, source: str | None) -> str | None:
        try:
            info = lang_info(source) if source else None
        except ValueError:
            info = None
        # A source DeepL does not know goes unsent: DeepL detects it.
        return info.deepl_source if info else None

    def supports(self, source: str | None, target: str) -> bool:
        """Whether DeepL has a code for ``target``; any source works (DeepL detects it)."""
        return self._target_code(target) is not None

    def languages(self) -> list[str]:
        """Targets with a DeepL code, refined by the server's own list once fetched."""
        candidates = {key for key, info in LANGUAGES.items() if info.deepl_target}
        candidates.update(_VARIANT_TAGS)
        table_codes = {info.deepl_target for info in LANGUAGES.values() if info.deepl_target}
        for code in self._server_targets or ():
            if "-" not in code and code not in table_codes:
                candidates.add(code.lower())
        return sorted(tag for tag in candidates if self._target_code(tag) is not None)

    # -- translation -------------------------------------------------------------------------

    async def translate(
        self, texts: Sequence[str], *, source: str | None, target: str
    ) -> list[str]:
        """Translate in requests of at most 50 texts and 128 KiB, one after another."""
        if self._api_key is None:
            raise BackendUnavailable(NO_KEY_REASON)
        if self._closed:
            raise BackendUnavailable("the DeepL backend is closed")
        if not self.ready and self._fail_fast:
            raise BackendUnavailable(self.reason or "DeepL is not available")
        code = self._target_code(target)
        if code is None:
            raise UnsupportedLanguage(f"DeepL cannot translate into {target!r}")
        source_code = self._source_code(source)

        out = list(texts)
        # Blank texts are not sent: DeepL would bill nothing useful for them.
        todo = [i for i, text in enumerate(texts) if text.strip()]
        for group in split_requests([texts[i] for i in todo]):
            batch = [texts[todo[j]] for j in group]
            translated = await self._call(self._translate_blocking, batch, code, source_code)
            for j, text in zip(group, translated, strict=True):
                out[todo[j]] = text
        self._mark_up()
        self._maybe_refresh_usage()
        return out

    def _client(self) -> deepl.DeepLClient:
        client: deepl.DeepLClient | None = getattr(self._local, "client", None)
        if client is None:
            assert self._api_key is not None
            client = deepl.DeepLClient(
                self._api_key, server_url=self._server_url, send_platform_info=False
            )
            client.set_app_info("thinktrans", _app_version())
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _translate_blocking(
        self, texts: list[str], target_code: str, source_code: str | None
    ) -> list[str]:
        """One POST /v2/translate, in a worker thread."""
        formality = self._formality
        if formality in {"less", "more"} and self._server_targets is not None:
            # Strict formality is an error for targets without it; prefer_* never is.
            if target_code not in self._formality_targets:
                formality = None
        started = time.monotonic()
        with self._lock:
            self._requests += 1
        results = self._client().translate_text(
            texts,
            source_lang=source_code,
            target_lang=target_code,
            formality=formality,
            model_type=self._model_type,
        )
        if not isinstance(results, list) or len(results) != len(texts):
            raise BadOutput(
                f"DeepL answered {len(results) if isinstance(results, list) else 1} "
                f"translations for {len(texts)} texts"
            )
        billed = sum(
            r.billed_characters if r.billed_characters is not None else len(t)
            for r, t in zip(results, texts, strict=True)
        )
        # Counted here, in the thread: a batch the caller gave up on is billed all the same.
        with self._lock:
            self._billed_characters += billed
        log.debug(
            "deepl translated %d texts (%d chars billed) into %s in %.0f ms",
            len(texts), billed, target_code, (time.monotonic() - started) * 1000,
        )  # fmt: skip
        return [r.text for r in results]

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking client work in the backend's threads; map every failure."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except BackendError:
            raise
        except Exception as exc:
            raise self._map_error(exc) from exc

    def _map_error(self, exc: Exception) -> BackendError:
        """The one place DeepL's and the client's errors become the service's."""
        if isinstance(exc, deepl.AuthorizationException):
            reason = (
                "DeepL rejected the API key (HTTP 403); check THINKTRANS_DEEPL_API_KEY "
                "or choose another backend"
            )
            self._mark_down(reason, fail_fast=True)
            return BackendUnavailable(reason)
        if isinstance(exc, deepl.QuotaExceededException):
            self._mark_down(self._quota_reason(), fail_fast=True)
            return BackendUnavailable(self._quota_reason())
        if isinstance(exc, deepl.TooManyRequestsException):
            return RateLimited("DeepL is rate limiting requests (HTTP 429) after retries")
        if isinstance(exc, deepl.ConnectionException):
            if _is_read_timeout(exc):
                return BackendTimeout(f"DeepL did not answer within {self._request_timeout_s:g} s")
            reason = f"cannot reach DeepL at {self._server_label()}"
            self._mark_down(reason, fail_fast=False)
            return BackendUnavailable(reason)
        if isinstance(exc, deepl.DeepLException):
            status = exc.http_status_code
            if status is None or status >= 500:
                reason = f"DeepL is failing (HTTP {status or 'error'}); try again later"
                self._mark_down(reason, fail_fast=False)
                return BackendUnavailable(reason)
            return BackendError(f"DeepL refused the request (HTTP {status})")
        if isinstance(exc, RuntimeError) and self._closed:
            return BackendUnavailable("the DeepL backend is closed")
        # The client chokes on an answer it cannot read (missing fields, not JSON).
        return BadOutput(f"DeepL answered something the client cannot read ({type(exc).__name__})")

    # -- readiness ---------------------------------------------------------------------------

    def _quota_reason(self) -> str:
        return (
            "DeepL character quota for this billing period is used up (HTTP 456); "
            "raise the limit or choose another backend"
        )

    def _server_label(self) -> str:
        if self._server_url:
            return self._server_url.rstrip("/")
        assert self._api_key is not None
        free = deepl.auth_key_is_free_account(self._api_key)
        return "https://api-free.deepl.com" if free else "https://api.deepl.com"

    def _mark_down(self, reason: str, *, fail_fast: bool) -> None:
        if self.ready or self.reason != reason:
            log.warning("deepl backend not ready: %s", reason)
        self.ready = False
        self.reason = reason
        self._fail_fast = fail_fast
        if self._closed or (self._prober is not None and not self._prober.done()):
            return
        try:
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_up())
        except RuntimeError:  # no loop (a sync caller): the next translate probes instead
            pass

    def _mark_up(self) -> None:
        if not self.ready and self._api_key is not None:
            log.info("deepl backend ready again")
            self.ready = True
            self.reason = None
            self._fail_fast = False

    async def _probe_until_up(self) -> None:
        while not self.ready and not self._closed:
            await asyncio.sleep(self.recheck_after_s if self._fail_fast else self.outage_recheck_s)
            with contextlib.suppress(BackendError):  # _call marked it down again
                await self._check()

    async def _start_check(self) -> None:
        try:
            await self._check()
        except BackendError as exc:
            log.warning("deepl start check failed: %s", exc.detail)

    async def _check(self) -> None:
        """Check the key and quota (GET /v2/usage); fetch the target list once."""
        await self._refresh_usage()
        if self._server_targets is None:
            targets = await self._call(self._fetch_targets)
            self._formality_targets = {code for code, formal in targets if formal}
            self._server_targets = {code for code, _ in targets}

    def _fetch_targets(self) -> list[tuple[str, bool]]:
        return [
            (lang.code.upper(), bool(lang.supports_formality))
            for lang in self._client().get_target_languages()
        ]

    def _fetch_usage(self) -> deepl.Usage:
        return self._client().get_usage()

    async def _refresh_usage(self) -> None:
        usage = await self._call(self._fetch_usage)
        self._usage_checked_at = time.monotonic()
        chars = usage.character
        self._usage = {"character_count": chars.count, "character_limit": chars.limit}
        if chars.limit_reached:
            self._mark_down(self._quota_reason(), fail_fast=True)
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

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            detail = exc.detail if isinstance(exc, BackendError) else type(exc).__name__
            log.warning("deepl background check failed: %s", detail)

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
            # deepl_context is future work: the contract passes no context to backends yet.
            "context_passed": False,
        }


def _is_read_timeout(exc: BaseException) -> bool:
    """Whether a ConnectionException came from a request that got no answer in time."""
    cause = exc.__cause__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return False  # nothing accepted the connection: unreachable, not slow
    if isinstance(cause, requests.exceptions.Timeout):
        return True
    # A body that stalls after the headers surfaces as ConnectionError(ReadTimeoutError).
    inner = cause.args[0] if cause is not None and cause.args else None
    return type(inner).__name__ == "ReadTimeoutError"
