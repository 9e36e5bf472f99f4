"""The DeepL backend: the official ``deepl`` client, run in worker threads the backend owns.

The client is blocking (requests), so every call runs in this backend's own
ThreadPoolExecutor, one client (one HTTP session) per worker thread. Vendor errors are
mapped to the service's errors in one place, ``_map_error``; auth and quota failures also
mark the backend not ready, and a background probe (GET /v2/usage, not billed) brings it
back once the key or the quota is good again (``models.remote``).

With ``context`` on, each text goes with the text before it in its stream as DeepL's
``context`` parameter (not billed). DeepL takes one context per request, so a batch is sent
in one request group per distinct context, the groups concurrently.

DeepL's "models" are its model types (``MODEL_TYPES``): a request or stream may name one
for its segments, sent as that call's ``model_type``; ``DeepLConfig.model_type`` otherwise.

A text with protected spans (``Job.protected``) goes in requests of its own, as XML with
each span in an element DeepL leaves alone (``models.deepl_spans``); texts without go as
plain text, as before. Glossary terms are rendered by a DeepL glossary, one per (terms,
source, target), created once, shared and deleted when evicted or at close
(``DeepLConfig.max_glossaries``); where none can be had (an unknown source, a pair DeepL
has no glossaries for), or the glossary did not render a term as given, the target term
goes in an element instead. A text whose elements did not come back once each is
translated piece by piece: its prose runs alone, the spans put back between them.
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
from models.deepl_spans import (
    TAG,
    Glossaries,
    GlossaryKey,
    GlossaryLease,
    glossary_terms,
    unwrap,
    wrap,
    xml_safe,
)
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
from models.spans import Protected, needs_words, rejoin

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


def deepl_target_code(tag: str, *, english_variant: str = "EN-US") -> str | None:
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
    """How the DeepL backend talks to DeepL; the registry fills it from ``deepl_*`` settings."""

    api_key: str | None = field(default=None, repr=False)  # None: the backend is not ready
    server_url: str | None = None  # None: by the key (":fx" keys go to the free API)
    threads: int = 4  # worker threads, and batches the batcher runs at once
    model_type: str | None = "latency_optimized"
    formality: str | None = None
    context: bool = False  # send the text before each one as DeepL's (unbilled) context
    english_variant: str = "EN-US"  # the target for a bare ``en``
    max_retries: int = 2
    request_timeout_s: float = 10.0
    # DeepL glossaries kept for glossary terms, the least recently used deleted first (all
    # at close); 0: never create one, put each target term in the text instead.
    max_glossaries: int = 16


@dataclass(frozen=True)
class _Call:
    """What every request of one ``translate`` call shares."""

    target_code: str
    source_code: str | None
    model_type: str | None  # None: not sent, DeepL's default


@dataclass(frozen=True)
class _Markup:
    """A request of texts with protected spans: sent as XML, with a glossary or none."""

    glossary_id: str | None = None


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

        self._executor = ThreadPoolExecutor(config.threads, thread_name_prefix="thinktrans-deepl")
        self._local = threading.local()
        self._clients: list[deepl.DeepLClient] = []
        self._lock = threading.Lock()  # guards _clients and the counters below
        self._billed_characters = 0
        self._requests = 0

        self._usage: dict[str, int | None] | None = None
        self._usage_checked_at: float | None = None  # time.monotonic()
        self._server_targets: set[str] | None = None  # refined at start from the server
        self._formality_targets: set[str] = set()
        self._glossaries = (
            Glossaries(config.max_glossaries, self._create_glossary, self._delete_glossary)
            if config.max_glossaries > 0 else None
        )
        self._fallbacks = 0  # texts whose spans came back only piece by piece

        if self._api_key is None:
            self._not_configured(NO_KEY_REASON)

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Delete the glossaries created; stop background work, the worker threads and the
        clients' sessions."""
        if self._glossaries is not None and not self._closed:
            await self._glossaries.aclose(timeout_s=self.config.request_timeout_s)
        await super().aclose()
        # A request still in flight cannot be interrupted; do not wait for it.
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()

    # -- languages ---------------------------------------------------------------------------

    def _target_code(self, target: str) -> str | None:
        code = deepl_target_code(target, english_variant=self.config.english_variant)
        if self._server_targets is None:
            return code
        if code is None:
            # A language DeepL added after this table (e.g. HE): its plain code.
            standard = canonical(target)
            plain = base_language(standard).upper() if standard else None
            return plain if plain in self._server_targets else None
        return code if code in self._server_targets else None

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Whether DeepL has a code for ``target``; any source works (DeepL detects it)."""
        return self._target_code(target) is not None

    def languages(self) -> list[str]:
        """Targets with a DeepL code, refined by the server's own list once fetched."""
        candidates = set(TARGET_CODES)
        candidates.update(_VARIANT_TAGS)
        table_codes = set(TARGET_CODES.values())
        for code in self._server_targets or ():
            if "-" not in code and code not in table_codes:
                candidates.add(code.lower())
        return sorted(tag for tag in candidates if self._target_code(tag) is not None)

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
        """Translate in requests of at most 50 texts and 128 KiB, one context per request,
        with the model type ``model`` (None: ``DeepLConfig.model_type``)."""
        texts, source, target = job.texts, job.source, job.target
        contexts, model = job.contexts, job.model
        self._refuse_if_unusable()
        problem = self.model_problem(model)
        if problem is not None:
            raise BackendError(problem, model=model)
        code = self._target_code(target)
        if code is None:
            raise UnsupportedLanguage(f"DeepL cannot translate into {target!r}")
        call = _Call(code, deepl_source_code(source), model or self._model_type)
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
                self._translate_marked(call, [(p, c) for _, p, c in marked])))
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

    # -- protected spans and glossaries ------------------------------------------------------

    async def _translate_marked(
        self, call: _Call, items: list[tuple[Protected, str | None]]
    ) -> list[str]:
        """Texts with protected spans, each with its context: as XML with each span in an
        ignored element, glossary terms rendered by a DeepL glossary where one can be had.
        A text whose glossary term did not come out as given is sent again with the term
        in an element; one whose elements did not come back once each is translated piece
        by piece (its prose runs alone, the spans put back between them)."""
        out: list[str | None] = [None] * len(items)
        for j, (protected, _) in enumerate(items):
            runs = protected.runs()
            if not any(isinstance(run, str) and needs_words(run) for run in runs):
                out[j] = rejoin(runs)  # only spans and punctuation: nothing to send
        # A text XML cannot carry (a control character) goes piece by piece.
        todo = [j for j, text in enumerate(out) if text is None and xml_safe(items[j][0].text)]
        if todo:
            sent = await self._translate_wrapped(call, [items[j] for j in todo])
            for j, text in zip(todo, sent, strict=True):
                out[j] = text
        lost = [j for j, text in enumerate(out) if text is None]
        if lost:
            pieces = await self._translate_runs(call, [items[j] for j in lost])
            for j, text in zip(lost, pieces, strict=True):
                out[j] = text
            with self._lock:
                self._fallbacks += len(lost)
        return [text if text is not None else "" for text in out]

    async def _translate_wrapped(
        self, call: _Call, items: list[tuple[Protected, str | None]]
    ) -> list[str | None]:
        """The XML passes: with the glossaries where there are some, then, for a text whose
        term did not come out as given, with its terms substituted; None where a span did
        not come back."""
        leases = self._lease_glossaries(call, [p for p, _ in items])
        try:
            ids: dict[GlossaryKey, str | None] = {}
            if leases:
                assert self._glossaries is not None
                found = await asyncio.gather(*(self._glossaries.glossary_id(lease)
                                               for lease in leases.values()))
                ids = dict(zip(leases, found, strict=True))
            first = [ids.get(key) if key is not None else None
                     for key in (self._glossary_key(call, p) for p, _ in items)]
            out = await self._send_marked(call, items, first)
            again = [j for j, text in enumerate(out) if text is None and first[j] is not None]
            if again:  # the glossary did not render a term as given: substitute it
                retried = await self._send_marked(call, [items[j] for j in again],
                                                  [None] * len(again))
                for j, text in zip(again, retried, strict=True):
                    out[j] = text
        finally:
            if self._glossaries is not None:
                for lease in leases.values():
                    self._glossaries.release(lease)
        return out

    async def _send_marked(
        self, call: _Call, items: list[tuple[Protected, str | None]],
        glossary_ids: list[str | None],
    ) -> list[str | None]:
        """One pass: each text as XML, with its glossary (None: terms substituted); each
        answer read back, or None where a span or a term did not come back."""
        groups: dict[tuple[str | None, str | None], list[int]] = {}
        for j, ((_, context), glossary_id) in enumerate(zip(items, glossary_ids, strict=True)):
            groups.setdefault((context, glossary_id), []).append(j)
        tasks = [
            asyncio.ensure_future(self._translate_group(
                call,
                [wrap(items[j][0], glossary_renders_terms=glossary_id is not None)
                 for j in indexes],
                context, _Markup(glossary_id)))
            for (context, glossary_id), indexes in groups.items()
        ]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
        out: list[str | None] = [None] * len(items)
        for ((_, glossary_id), indexes), answers in zip(groups.items(), results, strict=True):
            if isinstance(answers, BaseException):
                status = getattr(answers.__cause__, "http_status_code", None)
                if status not in (400, 404):
                    raise answers
                # DeepL refused the request for what it held: a glossary it no longer has
                # (deleted elsewhere: forget it), or markup it would not parse. The texts go
                # again, with their terms substituted, else piece by piece.
                log.warning("deepl: request with%s refused (HTTP %s); its texts go again",
                            " a glossary" if glossary_id else " tags", status)
                if glossary_id is not None and self._glossaries is not None:
                    self._glossaries.forget(glossary_id)
                continue
            for j, answer in zip(indexes, answers, strict=True):
                protected = items[j][0]
                text = unwrap(answer, protected, glossary_renders_terms=glossary_id is not None)
                if text is not None and not protected.missing(text):
                    out[j] = text
        return out

    async def _translate_runs(
        self, call: _Call, items: list[tuple[Protected, str | None]]
    ) -> list[str]:
        """Texts whose spans DeepL would not keep: their prose runs translated alone (plain
        text, with the text's context), each span's ``out`` put back between them."""
        parts = [protected.runs() for protected, _ in items]
        groups: dict[str | None, list[tuple[int, int]]] = {}  # context -> (item, part)
        for j, ((_, context), runs) in enumerate(zip(items, parts, strict=True)):
            for k, run in enumerate(runs):
                if isinstance(run, str) and needs_words(run):
                    groups.setdefault(context, []).append((j, k))
        tasks = [
            asyncio.ensure_future(self._translate_group(
                call, [str(parts[j][k]).strip() for j, k in places], context))
            for context, places in groups.items()
        ]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        for places, translated in zip(groups.values(), results, strict=True):
            for (j, k), text in zip(places, translated, strict=True):
                run = str(parts[j][k])
                lead = run[: len(run) - len(run.lstrip())]
                tail = run[len(run.rstrip()):]
                parts[j][k] = f"{lead}{text}{tail}"
        return [rejoin(runs) for runs in parts]

    def _glossary_key(self, call: _Call, protected: Protected) -> GlossaryKey | None:
        """Which DeepL glossary would render this text's terms; None: substitute them
        (no term, no glossary API, or an unknown source: DeepL's glossaries need one)."""
        if self._glossaries is None or call.source_code is None:
            return None
        terms = glossary_terms(protected)
        if terms is None:
            return None
        return (terms.digest, call.source_code, call.target_code.split("-")[0])

    def _lease_glossaries(
        self, call: _Call, protected: list[Protected]
    ) -> dict[GlossaryKey, GlossaryLease]:
        """The glossaries these texts need, each acquired once for the batch."""
        leases: dict[GlossaryKey, GlossaryLease] = {}
        if self._glossaries is None:
            return leases
        for p in protected:
            key = self._glossary_key(call, p)
            if key is not None and key not in leases:
                assert p.glossary is not None
                leases[key] = self._glossaries.acquire(key, dict(p.glossary.terms))
        return leases

    async def _create_glossary(self, key: GlossaryKey, entries: dict[str, str]) -> str | None:
        """A DeepL glossary of ``entries`` for the key's pair: its id, or None where DeepL
        will not have it (the pair, the entries); other failures raise."""
        digest, source_code, target_code = key
        try:
            return await self._call(self._create_glossary_blocking, f"thinktrans-{digest}",
                                    source_code, target_code, entries)
        except BackendError as exc:
            status = getattr(exc.__cause__, "http_status_code", None)
            if status in (400, 404, 413, 415):  # refused for what it is: never ask again
                log.info("deepl: no glossary for %s->%s (HTTP %s): terms substituted",
                         source_code, target_code, status)
                return None
            log.warning("deepl: glossary for %s->%s not created: %s", source_code,
                        target_code, exc.detail)
            raise

    def _create_glossary_blocking(
        self, name: str, source_code: str, target_code: str, entries: dict[str, str]
    ) -> str | None:
        try:
            info = self._client().create_glossary(name, source_code, target_code, entries)
        except ValueError as exc:  # the client's own check of the entries
            log.info("deepl: glossary entries refused by the client (%s): terms substituted",
                     type(exc).__name__)
            return None
        log.debug("deepl created glossary %s (%d entries) for %s->%s",
                  info.glossary_id, len(entries), source_code, target_code)
        return str(info.glossary_id)

    async def _delete_glossary(self, glossary_id: str) -> None:
        await self._call(lambda: self._client().delete_glossary(glossary_id))

    def _context(self, context: str | None) -> str | None:
        """What goes as DeepL's ``context`` with a text: its tail, or None for none."""
        if not self.capabilities.context or context is None or not context.strip():
            return None
        return context[-MAX_CONTEXT_CHARS:]

    async def _translate_group(
        self, call: _Call, texts: list[str], context: str | None,
        markup: _Markup | None = None,
    ) -> list[str]:
        """Texts that share one context (and markup: None, plain text), in as many requests
        as DeepL's limits need, in order."""
        budget = MAX_REQUEST_BYTES - (_encoded_size(context) if context else 0)
        out: list[str] = []
        for group in split_requests(texts, max_bytes=budget):
            batch = [texts[j] for j in group]
            out += await self._call(self._translate_blocking, call, batch, context, markup)
        return out

    def _client(self) -> deepl.DeepLClient:
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

    def _translate_blocking(
        self, call: _Call, texts: list[str], context: str | None, markup: _Markup | None = None
    ) -> list[str]:
        """One POST /v2/translate, in a worker thread."""
        target_code = call.target_code
        formality = self._formality
        if formality in {"less", "more"} and self._server_targets is not None:
            # Strict formality is an error for targets without it; prefer_* never is.
            if target_code not in self._formality_targets:
                formality = None
        started = time.monotonic()
        with self._lock:
            self._requests += 1
        tags: dict[str, Any] = {}
        if markup is not None:
            tags = {"tag_handling": "xml", "ignore_tags": [TAG], "non_splitting_tags": [TAG]}
            if markup.glossary_id is not None:
                tags["glossary"] = markup.glossary_id
        results = self._client().translate_text(
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
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
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

    async def _refresh_usage(self) -> None:
        usage = await self._call(lambda: self._client().get_usage())
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
            fallbacks = self._fallbacks
        return {
            "billed_characters": billed,
            "requests": requests_sent,
            "usage": dict(self._usage) if self._usage is not None else None,
            "server_url": self._server_label() if self._api_key else self._server_url,
            "model_type": self._model_type,
            "formality": self._formality,
            "context": self.capabilities.context,
            "glossaries": None if self._glossaries is None else {
                "kept": len(self._glossaries),
                "created": self._glossaries.created,
                "deleted": self._glossaries.deleted,
            },
            "span_fallbacks": fallbacks,
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
