"""Settings: ``THINKTRANS_*`` variables over an optional YAML file over defaults.

This is the only module that reads the environment. ``docs/configuration.md`` lists
every field below; keep each field's description true, it is the documentation.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from models.deepl import DeepLConfig
from models.llm import LLMConfig
from models.llm.dialects import extra_body_problem
from models.llm.templates import template_problem
from models.local import LocalConfig
from models.pooled import CLIENT_ID, CLIENT_ID_RULE, PoolConfig, client_id
from models.spans import KINDS, SpanFinder
from service.exceptions import ConfigError, InvalidLocale, ThinktransError
from service.text.tags import base_language, canonicalize, check_allowed

log = logging.getLogger("thinktrans.settings")


def _list_value(value: Any) -> Any:
    """A list setting from a string (a variable, or a string in the YAML file): a JSON array
    is read as one (``["a", "b"]``), any other string is split at commas (``a,b``)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, list):
            return parsed
    return [part.strip() for part in text.split(",") if part.strip()]


# Every list setting's type: its variable is not decoded as JSON by pydantic-settings (which
# refused ``a,b``) but read by ``_list_value``, the one rule docs/configuration.md states.
ListSetting = Annotated[list[str], NoDecode, BeforeValidator(_list_value)]

# The spellings a boolean setting takes, in a variable or the YAML file (any case).
BOOLEANS = {"true": True, "false": False, "1": True, "0": False}


def _bool_value(value: Any) -> Any:
    """A boolean setting: ``true`` or ``false`` (``1``, ``0``), nothing else. Pydantic would
    take ``yes``, ``on``, ``t`` and ``n`` too, which the documentation never promised."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in BOOLEANS:
        return BOOLEANS[value.strip().lower()]
    raise ValueError("must be true or false (or 1 or 0)")


# Every boolean setting's type: ``_bool_value``'s spellings, the ones docs/configuration.md states.
BoolSetting = Annotated[bool, BeforeValidator(_bool_value)]


# A name THINKTRANS_ALLOWED_HOSTS takes: DNS labels (underscores too: compose service names
# have them), optionally under ``*.``.
_LABEL = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


class ServingSection(BaseModel):
    """Where and how `thinktrans serve` listens, and what it logs."""

    title: ClassVar[str] = "serving"

    host: str = Field("127.0.0.1", description="Address `thinktrans serve` binds to.")
    port: int = Field(8088, ge=1, le=65535, description="Port `thinktrans serve` listens on.")
    api_token: SecretStr | None = Field(
        None, description="When set, every /v1 route needs `Authorization: Bearer <token>`."
    )
    allowed_hosts: ListSetting = Field(
        default_factory=list,
        description="Names clients reach this server by, besides `localhost`, `*.localhost`, "
        "IP addresses and `host`: a request whose `Host` header names another gets 421, "
        "token or not (a defence against DNS rebinding; `/healthz` excepted). E.g. "
        "`thinktrans`, a container's service name; `*.example.com`: the names under "
        "example.com; `*`: any name (the check off).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level."
    )
    log_text: BoolSetting = Field(
        False, description="Add each batch's text to its debug log line (debugging only; "
        "needs `log_level: debug`); off: lengths and hashes."
    )


class BackendsSection(BaseModel):
    """The chain of backends and how failing ones are skipped."""

    title: ClassVar[str] = "backends"

    backend: ListSetting = Field(
        default_factory=lambda: ["local"],
        description="Backend or fallback chain, e.g. `deepl,local`; the first serves, the next "
        "take what it cannot.",
    )
    extra_backends: ListSetting = Field(
        default_factory=list,
        description="Further backends a request may name in `backend` (passthrough always may).",
    )
    breaker_failures: int = Field(
        3, ge=1, description="Failed batches in a row after which a backend is skipped."
    )
    breaker_cooloff_s: float = Field(
        30.0, ge=0, description="How long a failing backend is skipped before it is tried again."
    )
    backend_timeout_s: float = Field(
        60.0, gt=0, description="Longest one batch may take in a backend before it fails."
    )

    check_output_language: BoolSetting = Field(
        True,
        description="Treat a translation reliably detected in another language than the "
        "target as bad output (the chain's next backend serves it).",
    )


class LocaleSection(BaseModel):
    """Targets, and how languages are detected."""

    title: ClassVar[str] = "locales"

    default_locale: str | None = Field(
        None, description="Target when neither the request nor `user_text` gives one."
    )
    allowed_locales: ListSetting = Field(
        default_factory=list,
        description="When non-empty, the only targets accepted (a bare language admits its "
        "regions and scripts).",
    )
    detector: str = Field(
        "default", description="Language detector: `default`, `lingua` (the `lingua` extra) "
        "or `langdetect`; see docs/benchmarks.md for how they compare."
    )
    detect_languages: ListSetting = Field(
        default_factory=list,
        description="Language subtags detection may answer within a script several "
        "languages share (Latin, Cyrillic, ...), e.g. `en,de,fr,es,ru`; empty: all the "
        "detector knows. Scripts that name their language (Han, Kana, Hangul) are always "
        "answered, and so are a shared script's languages when none of them is listed; text "
        "in a language left out is read as the closest one listed.",
    )
    policy: Literal["translate", "hide"] = Field(
        "translate", description="What becomes of a segment not in the target language when "
        "a request or stream does not say (`policy`): `translate` it, or `hide` it (status "
        "`hidden`, empty `text`, nothing sent to a backend)."
    )


# The most memory the cache may be given, in MiB: a bound on a typo more than on a machine.
CACHE_MB_MAX = 1 << 20


class CacheSection(BaseModel):
    """The translation cache."""

    title: ClassVar[str] = "translation cache"

    cache_mb: float = Field(
        64.0, ge=0, le=CACHE_MB_MAX, allow_inf_nan=False, description="Memory the "
        "translation cache may hold, in MiB (text and keys, estimated); 0 turns the cache "
        "off."
    )
    cache_path: str | None = Field(
        None, description="Opt-in persistent cache: an SQLite file of its own that keeps "
        "translations across restarts (thinking text on disk: keep it in a directory only "
        "the service can write). A symbolic link, a file that is not SQLite's and another "
        "program's database are refused. Unset: memory only."
    )
    cache_ttl_s: float = Field(
        7 * 24 * 3600.0, gt=0, allow_inf_nan=False, description="How long a translation "
        "kept in `cache_path` is served; older ones are dropped."
    )


class BatchingSection(BaseModel):
    """How segments are batched, and the deadline."""

    title: ClassVar[str] = "batching"

    max_batch_size: int = Field(32, ge=1, le=4096, description="Most segments in one batch.")
    max_batch_chars: int = Field(
        16_000, ge=1, description="Most characters in one batch (a token budget by proxy)."
    )
    max_wait_ms: float = Field(
        10.0, ge=0, le=60_000, description="Longest a batch waits for more items after its first."
    )
    deadline_ms: float = Field(
        3000.0,
        gt=0,
        le=600_000,
        description="A segment's result is out by ready + deadline_ms, translated or not.",
    )
    max_queue_size: int = Field(
        4096, ge=1, description="Segments waiting per backend; past it requests get 503."
    )
    max_concurrent_batches: int = Field(
        1, ge=1, le=256, description="Batches one backend runs at once (unless it sets its own)."
    )


class LimitsSection(BaseModel):
    """Bounds on one request."""

    title: ClassVar[str] = "request limits"

    max_request_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body accepted (413 past it)."
    )
    max_texts: int = Field(256, ge=1, description="Most texts in one translate/detect request.")
    max_text_chars: int = Field(
        100_000, ge=1, description="Most characters in one text of a one-shot request."
    )
    max_segment_chars: int = Field(
        400, ge=16, description="Size bound: a segment without a sentence end is cut here."
    )
    max_fence_chars: int = Field(
        20_000, ge=64, description="An opening code fence without its closing fence within "
        "this many characters is taken as prose, and the text after it is cut into sentences "
        "again."
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="A request body not complete this long after its "
        "headers gets 408 and the connection is closed."
    )
    refused_body_drain_bytes: int = Field(
        8_388_608, ge=0, le=1_073_741_824, description="A refused request (413, 401, 415) "
        "whose body is at most this large is read and dropped before the refusal goes out, "
        "within THINKTRANS_BODY_TIMEOUT_S, so that a client which sends its whole body "
        "before reading (Python's urllib) reads the problem, not a connection reset; a "
        "larger body is not read and the connection is closed at once. 0: never read."
    )


class StreamsSection(BaseModel):
    """Bounds and timers of streams."""

    title: ClassVar[str] = "streams"

    flush_idle_ms: float = Field(
        1500.0, gt=0, description="A stream idle this long has its pending text made a segment."
    )
    stream_memory_wait_ms: float = Field(
        300.0, ge=0, le=60_000,
        description="A short segment whose language is unclear (\"OK.\", \"Genau.\") waits "
        "this long (at most half of `deadline_ms`) for the stream's next segment: between "
        "two of the stream's recent language it is read as that language, before one in "
        "another language as its own detection says. Past the wait, or at a flush, the "
        "recent language is used; 0 decides at once from the recent language.",
    )
    stream_idle_expire_s: float = Field(
        600.0, gt=0, description="A stream with no activity this long is dropped."
    )
    max_streams: int = Field(1000, ge=1, description="Most open streams (429 past it).")
    max_stream_buffer_chars: int = Field(
        65_536, ge=64, description="Most unsegmented plus held-back characters per stream."
    )
    max_chunk_chars: int = Field(16_384, ge=1, description="Most characters in one chunk.")
    max_chunks_per_request: int = Field(1024, ge=1, description="Most chunks in one POST.")
    max_gap: int = Field(
        256, ge=0, description="Most chunks held out of order waiting for a missing seq."
    )
    max_events_retained: int = Field(
        4096, ge=16, description="Events kept per stream for SSE resume and long-poll."
    )
    max_ended_streams: int = Field(
        256, ge=0, description="Most ended streams kept for late readers; past it the oldest "
        "ended stream is evicted and reads of it get 410."
    )
    max_ended_bytes: int = Field(
        128 * 1024 * 1024, ge=0, description="Most memory (estimated from the events kept) "
        "held by ended streams; past it the oldest ended stream is evicted and reads of it "
        "get 410."
    )
    shutdown_grace_s: float = Field(
        10.0, ge=0, le=600,
        description="On shutdown, open streams are flushed and given this long to finish.",
    )
    max_wait_poll_ms: int = Field(30_000, ge=0, description="Longest a long-poll read waits.")
    context_max_chars: int = Field(
        1000, ge=0, description="Most characters of a stream's preceding segments passed as "
        "context to backends that use it (`deepl_context`, `llm_context`)."
    )


class SpansSection(BaseModel):
    """Protected spans and glossaries: what every translation keeps byte for byte."""

    title: ClassVar[str] = "protected spans and glossaries"

    protect_spans: BoolSetting = Field(
        True, description="Find protected spans in each prose segment (inline code, "
        "identifiers, paths, URLs, e-mail addresses, versions, numbers with units, integers, "
        "math, expressions, CLI flags, quoted errors) and mark a segment `translated` only when "
        "its translation keeps each of them byte for byte; off: glossaries still apply."
    )
    span_kinds: ListSetting = Field(
        default_factory=list,
        description="The span kinds protected, e.g. `code,url,path`; empty: all of them "
        "(`code`, `math`, `url`, `email`, `error`, `path`, `flag`, `version`, `expr`, "
        "`identifier`, `number`, `integer`; see docs/API.md).",
    )
    span_patterns: ListSetting = Field(
        default_factory=list,
        description="Extra regular expressions whose matches are protected too (kind "
        "`pattern`), e.g. `JIRA-\\d+`; a pattern that holds a comma is given in a JSON "
        "array (`[\"\\\\d{1,3}%\"]`) or a YAML list. A pattern that can backtrack "
        "exponentially on text it almost matches is refused at start: a nested quantifier "
        "(`([A-Z]+-?)+\\d`), or a repeated group whose alternatives or optional parts can "
        "match the same text (`(a|ab)+`, `(ab?|b)+`); write it without the outer repetition "
        "(`[A-Z][A-Z-]*\\d`) or make that repetition possessive (`(?:[A-Z]+-?)++\\d`) or "
        "atomic (`(?>(?:[A-Z]+-?)+)\\d`).",
    )
    glossary_file: str | None = Field(
        None, description="A YAML file of glossaries every stream shares, per target "
        "language (`*`, a language such as `zh`, or a tag such as `zh-TW`), each "
        "`{terms: {source: target}, keep: [term, ...]}`; see docs/API.md. A regular file, "
        "each target named once (`zh-cn` and `zh-CN` are one); anything else stops the start."
    )
    max_glossary_file_bytes: int = Field(
        1_048_576, ge=1024, le=1 << 30,
        description="Largest `glossary_file`, in bytes; a larger one stops the start (it is "
        "read no further).",
    )
    max_glossary_terms: int = Field(
        256, ge=1, le=100_000,
        description="Most entries (`terms` and `keep` together) in one glossary, a request's "
        "or the file's for one target; 422 past it.",
    )
    max_glossary_term_chars: int = Field(
        200, ge=1, le=10_000, description="Most characters in one glossary term or rendering.",
    )


class PreviewsSection(BaseModel):
    """Provisional translations of a sentence still streaming (a stream's `previews`)."""

    title: ClassVar[str] = "previews"

    previews: BoolSetting = Field(
        False, description="The default of `POST /v1/streams`' `previews`: a sentence still "
        "open gets provisional translations (`preview` events) as it grows, each superseded "
        "by its `segment`; see docs/API.md.",
    )
    preview_min_words: int = Field(
        8, ge=1, le=1000, description="An open sentence of at least this many words gets its "
        "first preview (a sentence mostly in Chinese, Japanese or Korean characters: "
        "`preview_min_chars`).",
    )
    preview_min_chars: int = Field(
        16, ge=1, le=10_000, description="`preview_min_words` for a sentence mostly in "
        "Chinese, Japanese or Korean characters, in those characters.",
    )
    preview_after_ms: float = Field(
        1500.0, ge=0, le=600_000, description="An open sentence shorter than that gets its "
        "first preview once it has been open this long, if it has at least "
        "`preview_step_words` words (`preview_step_chars` characters).",
    )
    preview_step_words: int = Field(
        4, ge=1, le=1000, description="A sentence is previewed again once it has grown by at "
        "least this many words since its last preview.",
    )
    preview_step_chars: int = Field(
        8, ge=1, le=10_000, description="`preview_step_words` for a sentence mostly in "
        "Chinese, Japanese or Korean characters.",
    )
    preview_interval_ms: float = Field(
        500.0, ge=0, le=600_000, description="Least time between two previews of one "
        "sentence (one preview of a stream runs at a time in any case).",
    )
    preview_max_decodes: int = Field(
        4, ge=1, le=100, description="Most preview translations run for one sentence: the "
        "bound on what previews cost, at most this many decodes of its prefixes.",
    )
    preview_mask_k: int = Field(
        2, ge=0, le=100, description="Words (characters, for a Chinese or Japanese target) "
        "left off the end of each preview, where a prefix's translation changes most "
        "(mask-k); 0: the whole provisional translation.",
    )
    preview_billed: BoolSetting = Field(
        False, description="Run previews on billed backends (DeepL) too; off: a chain's "
        "billed backends are passed over for previews, and with no other there are none.",
    )
    preview_max_queue: int = Field(
        256, ge=1, le=100_000, description="Most previews waiting for one backend; past it a "
        "new preview is not made (final segments have their own queue, "
        "`max_queue_size`).",
    )


class LocalSection(BaseModel):
    """The local backend (and the pool's replicas): `local_*`."""

    title: ClassVar[str] = "local backend"

    local_model: str = Field(
        "facebook/nllb-200-distilled-600M",
        description="Hub id or local directory of an NLLB-200, M2M-100 or Marian checkpoint, "
        "or a converted CTranslate2 directory (`thinktrans convert`); a Marian one may name its "
        "pair first: `en-de=DIR_OR_ID`.",
    )
    local_marian_models: ListSetting = Field(
        default_factory=list,
        description="Extra Marian checkpoints, one per pair: `en-de=Helsinki-NLP/opus-mt-en-de`.",
    )
    local_models: ListSetting = Field(
        default_factory=list,
        description="Several local models, in order of preference, each as `local_model` "
        "takes it (`en-de=opus-mt-en-de,facebook/nllb-200-distilled-600M`): a pair is served "
        "by the first that has it, unless a stream names one (`model`). When set it replaces "
        "`local_model` and `local_marian_models`.",
    )
    local_max_extra_models: int = Field(
        1, ge=0, le=16, description="Models that are not configured but that streams name "
        "(`model`) kept loaded at once, least recently used dropped first; 0: a model that "
        "is not configured is never loaded."
    )
    local_model_roots: ListSetting = Field(
        default_factory=list, description="Directories under which a model a stream names "
        "(`model`) and that is not configured may be loaded on demand, checked on the resolved "
        "path (symlinks followed); none (the default): no directory is. A configured model is "
        "served by any spelling of its path."
    )
    local_hub_models: BoolSetting = Field(
        True, description="Whether a model a stream names that is not configured may be a "
        "hub id, loaded on demand (from `HF_HOME`, or downloaded); off where clients are not "
        "trusted."
    )
    local_engine: Literal["auto", "ctranslate2", "transformers"] = Field(
        "auto", description="What runs the model: `ctranslate2` (int8 on CPU, several times "
        "faster), `transformers` (torch), or `auto`: ctranslate2 where `thinktrans[ct2]` is "
        "installed, else transformers."
    )
    local_device: str = Field("auto", description="`auto` (CUDA when present), `cpu`, `cuda:0`.")
    local_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="`auto`: bfloat16 on GPU (float16 where unsupported), float32 on CPU."
    )
    local_compute_type: Literal[
        "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
        "bfloat16", "float32",
    ] = Field(
        "auto", description="CTranslate2 engine: `auto` is int8 on CPU, int8_float16 on CUDA. "
        "A checkpoint is converted at this type (`local_dtype` is the transformers engine's)."
    )
    local_ct2_cache: str | None = Field(
        None, description="Where the CTranslate2 engine keeps checkpoints it converted on first "
        "load (default: `$HF_HOME/thinktrans-ct2`); must be writable unless the model is "
        "converted ahead (`thinktrans convert`)."
    )
    local_ct2_cache_mb: float = Field(
        8192, gt=0, le=1 << 30, description="The most megabytes the CTranslate2 conversion "
        "cache (`local_ct2_cache`) keeps: past it, converted models are removed, the least "
        "recently used first; never one loaded (the bound is exceeded while they all are)."
    )
    local_ct2_workers: int | None = Field(
        None, ge=1, le=64, description="CTranslate2 on CPU: parts of a batch translated at "
        "once, each on `local_threads / local_ct2_workers` threads (default: one part per "
        "thread for small models such as Marian, one part on all threads for larger ones)."
    )
    local_num_beams: int = Field(1, ge=1, le=16, description="Beam width; 1 is greedy.")
    local_preview_bias: float = Field(
        0.5, ge=0, lt=1, description="CTranslate2: how strongly a preview's decoding keeps to "
        "the previous preview of its sentence (`prefix_bias_beta`; a biased preview decodes "
        "with at least 2 beams); 0: previews decode like any segment.",
    )
    # The loop guard rarely touches real text, as a 6-gram seldom recurs within one sentence,
    # while a looping model repeats one within a few tokens; max_new_tokens bounds the rest.
    local_no_repeat_ngram_size: int = Field(
        6, ge=0, le=64, description="Loop guard: no n-gram of this size is generated twice in "
        "one segment; 0 turns it off."
    )
    local_max_input_tokens: int = Field(
        256, ge=8, description="Longer segments are split at sentence or word bounds, rejoined. "
        "A model with fewer positions (`max_position_embeddings`, less its special tokens) "
        "bounds its own parts lower."
    )
    local_threads: int | None = Field(
        None, ge=1, description="CPU threads of the local engine in all (default: torch's; "
        "for CTranslate2 the cores this process may use, at most 4)."
    )
    load_retry_max_s: float = Field(
        300.0, gt=0, description="A model that failed to load is tried again after 5 s, "
        "doubling up to this long between tries."
    )
    local_span_strategy: Literal["mask", "runs"] = Field(
        "mask", description="How protected spans are kept: `mask` puts each family's "
        "placeholders in their place and, where the model loses one, translates the prose "
        "between the spans on its own; `runs` always does the latter.",
    )

    def local_config(self) -> LocalConfig:
        """The local engine's config (the local backend's, and the pool's replicas')."""
        return LocalConfig(
            model=self.local_model,
            marian_models=tuple(self.local_marian_models),
            models=tuple(self.local_models),
            max_extra_models=self.local_max_extra_models,
            model_roots=tuple(self.local_model_roots),
            hub_models=self.local_hub_models,
            engine=self.local_engine,
            device=self.local_device,
            dtype=self.local_dtype,
            compute_type=self.local_compute_type,
            ct2_cache=self.local_ct2_cache,
            ct2_cache_mb=self.local_ct2_cache_mb,
            ct2_workers=self.local_ct2_workers,
            num_beams=self.local_num_beams,
            preview_bias=self.local_preview_bias,
            no_repeat_ngram_size=self.local_no_repeat_ngram_size,
            max_input_tokens=self.local_max_input_tokens,
            threads=self.local_threads,
            load_retry_max_s=self.load_retry_max_s,
            span_strategy=self.local_span_strategy,
        )


class DeepLSection(BaseModel):
    """The DeepL backend: `deepl_*`."""

    title: ClassVar[str] = "deepl backend"

    deepl_api_key: SecretStr | None = Field(
        None, description="DeepL key (also read from DEEPL_AUTH_KEY); `:fx` keys use the free API.",
        validation_alias=AliasChoices("THINKTRANS_DEEPL_API_KEY", "DEEPL_AUTH_KEY"),
    )
    deepl_server_url: str | None = Field(None, description="DeepL server URL (proxies, tests).")
    deepl_model_type: str = Field("latency_optimized", description="DeepL `model_type`.")
    deepl_formality: str | None = Field(None, description="DeepL formality, e.g. `prefer_less`.")
    deepl_context: BoolSetting = Field(
        False, description="Pass a stream's preceding segments as DeepL's `context` (not billed; "
        "helps short sentences; one DeepL request per distinct context)."
    )
    deepl_threads: int = Field(4, ge=1, le=64, description="Threads running the blocking client.")
    deepl_english_variant: Literal["EN-US", "EN-GB"] = Field(
        "EN-US", description="DeepL target for a bare `en`."
    )
    deepl_max_glossaries: int = Field(
        16, ge=0, le=1000,
        description="DeepL glossaries kept for the glossary terms in use, one per glossary "
        "content and language pair, created on first use; the least recently used is "
        "deleted past it, and all at shutdown. 0: none (the target term is put in the text "
        "as a protected span instead).",
    )

    def deepl_config(self, *, batch_timeout_s: float) -> DeepLConfig:
        """The DeepL backend's config; one attempt may not outlast the batch it serves."""
        return DeepLConfig(
            api_key=_secret(self.deepl_api_key),
            server_url=self.deepl_server_url,
            threads=self.deepl_threads,
            model_type=self.deepl_model_type,
            formality=self.deepl_formality,
            context=self.deepl_context,
            english_variant=self.deepl_english_variant,
            max_glossaries=self.deepl_max_glossaries,
            request_timeout_s=min(10.0, batch_timeout_s),
        )


class LLMSection(BaseModel):
    """The LLM backend: `llm_*`."""

    title: ClassVar[str] = "llm backend"

    llm_base_url: str | None = Field(None, description="OpenAI-compatible base URL, e.g. .../v1.")
    llm_model: str | None = Field(None, description="Model name sent in chat requests.")
    llm_api_key: SecretStr | None = Field(None, description="Bearer key for the endpoint.")
    llm_timeout_s: float = Field(30.0, gt=0, description="Timeout of one chat request.")
    llm_concurrency: int = Field(4, ge=1, le=256, description="Chat requests in flight at once.")
    llm_max_response_bytes: int = Field(
        4_194_304, ge=65_536, le=1 << 30, description="Most bytes read of one answer of the "
        "endpoint: a whole answer, one line of a streamed one, the `/models` list; past it the "
        "connection is closed and the batch fails (the chain's next backend serves it). Of an "
        "error answer only this many bytes are read, for its reason."
    )
    llm_json_mode: BoolSetting = Field(
        False, description="Send `response_format: json_object` (only servers that support it)."
    )
    llm_context: BoolSetting = Field(
        True, description="Pass a stream's preceding segments to the model, in a delimited "
        "context field of the user message (never the system prompt), for consistent terms."
    )
    llm_check_items: BoolSetting = Field(
        True, description="Refuse an answer item that drops its source's numbers, inline code "
        "or URLs, or whose length is far from its source's (the chain's next backend serves "
        "it); see docs/backends.md."
    )
    llm_dialect: Literal["auto", "openai", "vllm", "sglang", "deepseek", "none"] = Field(
        "auto", description="How each request switches reasoning off: `openai` "
        "(`reasoning_effort`), `vllm`/`sglang` (`chat_template_kwargs: {\"enable_thinking\": "
        "false}`), `deepseek` (`thinking: {\"type\": \"disabled\"}`), `none`; `auto` reads the "
        "endpoint's host (docs/backends.md)."
    )
    llm_extra_body: dict[str, Any] = Field(
        default_factory=dict, description="A JSON object merged into every request, over what "
        "the dialect sends (objects key by key; `null` removes a key), e.g. "
        "`{\"top_k\": 20, \"repetition_penalty\": 1.05}`; not `model`, `messages` or `stream`."
    )
    llm_stream: BoolSetting = Field(
        False, description="Ask for streamed answers (`stream: true`); streamed and whole "
        "answers are read either way."
    )
    llm_prompt_style: Literal["json", "plain"] = Field(
        "json", description="`json`: numbered segments in one request, for chat models; "
        "`plain`: one segment a request in a translation model's own prompt "
        "(`llm_plain_template`), requests run concurrently."
    )
    llm_plain_template: str = Field(
        "auto", description="The plain style's prompt: `auto` (from the model's name), "
        "`hunyuan-mt`, `hy-mt1.5`, `seed-x`, `tower`, `generic`, or a template holding "
        "`{text}` and `{target}` (and optionally `{source}`)."
    )

    def llm_config(self) -> LLMConfig:
        """The LLM backend's config."""
        return LLMConfig(
            base_url=self.llm_base_url,
            model=self.llm_model,
            api_key=_secret(self.llm_api_key),
            timeout_s=self.llm_timeout_s,
            max_response_bytes=self.llm_max_response_bytes,
            concurrency=self.llm_concurrency,
            json_mode=self.llm_json_mode,
            check_items=self.llm_check_items,
            context=self.llm_context,
            dialect=self.llm_dialect,
            extra_body=self.llm_extra_body,
            stream=self.llm_stream,
            prompt_style=self.llm_prompt_style,
            plain_template=self.llm_plain_template,
        )


# The longest a pool replica waits for calls to merge, in ms (its user_config is held to it).
POOL_BATCH_WAIT_MS_MAX = 10_000


class PoolClient(BaseModel):
    """One sidecar as a pool's config names it (``pool_clients``)."""

    model_config = ConfigDict(extra="forbid")

    token: SecretStr | None = Field(
        None, description="Its own bearer token: a call with it counts as this client's "
        "whatever it names, and a call naming this client must carry it.")
    token_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="Or the token's SHA-256, hex, to keep "
        "the token itself out of the config.")
    weight: float = Field(1.0, gt=0, le=1000, description="Its share of a busy engine's "
                          "turns against the others' (1: even).")
    max_waiting: int | None = Field(
        None, ge=1, le=1_000_000, description="Its own cap on segments waiting in a replica "
        "(unset: `pool_client_max_waiting`).")

    @model_validator(mode="after")
    def _one_token(self) -> PoolClient:
        if self.token is not None and self.token_sha256 is not None:
            raise ValueError("give token or token_sha256, not both")
        if self.token is not None and not self.token.get_secret_value().strip():
            raise ValueError("token is set but empty")
        return self

    def digest(self) -> str | None:
        """Its token's SHA-256 (hex), if it has one."""
        if self.token is not None:
            return hashlib.sha256(self.token.get_secret_value().strip().encode()).hexdigest()
        return self.token_sha256


class PoolSection(BaseModel):
    """The `pool` backend of a sidecar, and `thinktrans pool` itself: `pool_*`."""

    title: ClassVar[str] = "pool: the sidecar's backend, and `thinktrans pool`"

    pool_url: str | None = Field(
        None, description="The `pool` backend: base URL of a `thinktrans pool` (its Serve HTTP "
        "route), e.g. `http://thinktrans-pool:8000`."
    )
    pool_token: SecretStr | None = Field(
        None, description="Bearer token between sidecars and the pool: the `pool` backend "
        "sends it, `thinktrans pool` requires it on `/v1` (unset: no token)."
    )
    pool_concurrency: int = Field(
        8, ge=1, le=256, description="The `pool` backend: batches in flight to the pool at "
        "once from this sidecar."
    )
    pool_max_response_bytes: int = Field(
        16_777_216, ge=65_536, le=1 << 30, description="The `pool` backend: most bytes read "
        "of one answer of the pool (a call's translations, `/v1/info`); past it the connection "
        "is closed and the call fails (the chain's next backend serves its batch). Keep it "
        "well above `pool_max_call_bytes`: a call's translations are about its texts' size. Of "
        "an error answer only this many bytes are read, for its reason."
    )
    pool_client_id: str | None = Field(
        None, description="The `pool` backend: this sidecar's name to the pool, which shares "
        "its engine's turns between, counts and caps by it (" + CLIENT_ID_RULE + "). Unset: "
        "`host:port`, this host's name and `port`, stable over restarts and different for two "
        "sidecars on one host."
    )
    pool_clients: dict[str, PoolClient] = Field(
        default_factory=dict, description="`thinktrans pool`: sidecars by client id, each "
        "with its own `token` (or `token_sha256`), `weight` and `max_waiting`, as a YAML "
        "mapping or a JSON object. A client with a token is the only one that may use its id; "
        "with `pool_token` unset, only clients with tokens may call."
    )
    pool_client_max_waiting: int = Field(
        256, ge=1, le=1_000_000, description="`thinktrans pool`: most segments one client "
        "may have waiting or running in a replica (one with nothing waiting may send one "
        "call of any size); a call past it gets 429 with `Retry-After`, and the sidecar's "
        "chain serves it."
    )
    pool_max_clients: int = Field(
        1024, ge=1, le=1_000_000, description="`thinktrans pool`: client ids a replica keeps "
        "counts for besides those in `pool_clients`, which always have their place; past it "
        "a new id takes the place of the one seen least recently with nothing waiting, or "
        "gets 429 when every one has work waiting."
    )
    pool_metrics_max_clients: int = Field(
        64, ge=0, le=100_000, description="`thinktrans pool`: client ids besides those in "
        "`pool_clients` with series of their own in Ray's metrics (`client` label), the "
        "first seen; the ids after them are counted together as `client=\"_other\"`, so the "
        "series stay bounded (Ray never drops one)."
    )
    pool_fair: BoolSetting = Field(
        True, description="`thinktrans pool`: share a busy engine's turns between clients by "
        "deficit round robin (false: oldest calls first, whoever sent them). "
        "`user_config.fair` in a Serve config."
    )
    pool_fair_unit: Literal["characters", "segments"] = Field(
        "characters", description="`thinktrans pool`: what fair turns measure: the texts' "
        "characters (about the engine's tokens) or their segments."
    )
    pool_metrics_port: int | None = Field(
        None, ge=1, le=65535, description="`thinktrans pool`: the port of Ray's Prometheus "
        "metrics (per-client counts among them); unset: Ray's choice."
    )
    pool_max_batch_size: int = Field(
        64, ge=1, le=4096, description="`thinktrans pool`: most segments in one merged batch "
        "on a replica (Serve's `max_batch_size`, counted in segments); a call carries at "
        "most this many. A Serve config sets it as `user_config.max_batch_size`."
    )
    pool_batch_wait_ms: float = Field(
        10.0, ge=0, le=POOL_BATCH_WAIT_MS_MAX, description="`thinktrans pool`: how long a "
        "replica waits after a call for others to merge with it (`user_config.batch_wait_ms`)."
    )
    pool_max_text_chars: int = Field(
        2_000, ge=16, le=1_000_000, description="`thinktrans pool`: most characters in one "
        "text of a call (413 past it); the `pool` backend cuts a longer segment at sentence "
        "ends, then between words, to fit. Bounds how long one text holds a replica's engine."
    )
    pool_max_call_chars: int = Field(
        32_000, ge=16, le=10_000_000, description="`thinktrans pool`: most characters of "
        "text in one call (413 past it), and in one engine turn of a replica; the `pool` "
        "backend sends a larger batch as several calls."
    )
    pool_max_call_bytes: int = Field(
        1_048_576, ge=1024, le=1 << 30, description="`thinktrans pool`: largest body of one "
        "call (413 past it, read no further, with or without a `Content-Length`)."
    )
    pool_max_ongoing_calls: int = Field(
        1024, ge=1, le=1_000_000, description="`thinktrans pool`: calls one replica holds at "
        "once (Serve's `max_ongoing_requests`): those are the calls its fair turns share out; "
        "past it calls wait in Serve's queues, first come first served. Below twice "
        "`pool_max_batch_size` engine turns may run part full."
    )
    pool_replicas: int = Field(
        1, ge=1, le=1024, description="`thinktrans pool`: model replicas (a Serve config "
        "sets `num_replicas` or `autoscaling_config` instead)."
    )
    pool_num_gpus: float = Field(
        0.0, ge=0, le=64, description="`thinktrans pool`: GPUs per replica (`ray_actor_options."
        "num_gpus`); fractions share a GPU between replicas."
    )

    def pool_config(self, *, batch_timeout_s: float, port: int) -> PoolConfig:
        """The sidecar's `pool` backend config (``port``: the one it serves on). The pool's
        own limits, until it says them, are taken to be these settings'."""
        return PoolConfig(url=self.pool_url, token=_secret(self.pool_token),
                          timeout_s=batch_timeout_s, concurrency=self.pool_concurrency,
                          sidecar=self.pool_client_id or client_id(port),
                          max_text_chars=self.pool_max_text_chars,
                          max_call_chars=self.pool_max_call_chars,
                          max_call_bytes=self.pool_max_call_bytes,
                          max_response_bytes=self.pool_max_response_bytes)


class PricesSection(BaseModel):
    """Prices, for `thinktrans compare`."""

    title: ClassVar[str] = "prices (compare)"

    price_per_million_chars: dict[str, float] = Field(
        default_factory=lambda: {"deepl": 25.0},
        description="Estimated cost per million characters, per backend, for `compare`.",
    )

class Settings(
    BaseSettings, ServingSection, BackendsSection, LocaleSection, CacheSection, BatchingSection,
    LimitsSection, StreamsSection, SpansSection, PreviewsSection, LocalSection, DeepLSection,
    LLMSection, PoolSection, PricesSection,
):
    """Every knob of the service, one section each. Environment variables win over the YAML
    file; a section's fields keep their flat names (``THINKTRANS_LOCAL_MODEL``,
    ``local_model:``)."""

    model_config = SettingsConfigDict(
        env_prefix="THINKTRANS_", extra="forbid", validate_default=True, populate_by_name=True,
        allow_inf_nan=False,
    )

    @field_validator("port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("tcp://"):
            # Kubernetes' service links set THINKTRANS_PORT for a Service named thinktrans.
            raise ValueError("looks like a Kubernetes service link; set enableServiceLinks: "
                             "false in the pod spec, or name the Service otherwise")
        return value

    @field_validator("api_token", "pool_token", mode="before")
    @classmethod
    def _token(cls, value: Any) -> Any:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(raw, str) and not raw.strip():
            # Compose's ${THINKTRANS_API_TOKEN} is empty when the host variable is unset:
            # read as "no token", that would turn authentication off without a word.
            raise ValueError("is set but empty; set a token, or unset the variable to run "
                             "without authentication")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: list[str]) -> list[str]:
        out = []
        for item in value:
            name = item.strip().lower()
            if name != "*" and not _HOST_NAME.fullmatch(name := name.removesuffix(".")):
                raise ValueError(f"{item[:60]!r} is not a host name: give the name alone, "
                                 "without scheme, port or path (e.g. thinktrans, "
                                 "*.example.com, or * for any name)")
            out.append(name)
        return out

    @field_validator("pool_client_id")
    @classmethod
    def _client_id(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(CLIENT_ID, value):
            raise ValueError(f"{value[:40]!r} is not a client id: {CLIENT_ID_RULE}")
        return value

    @field_validator("pool_clients")
    @classmethod
    def _pool_clients(cls, value: dict[str, PoolClient]) -> dict[str, PoolClient]:
        tokens: dict[str, str] = {}
        for name, client in value.items():
            if not re.fullmatch(CLIENT_ID, name):
                raise ValueError(f"{name[:40]!r} is not a client id: {CLIENT_ID_RULE}")
            digest = client.digest()
            if digest is not None and digest in tokens:
                raise ValueError(f"clients {tokens[digest]!r} and {name!r} have one token: "
                                 "give each its own")
            if digest is not None:
                tokens[digest] = name
        return value

    @field_validator("pool_url")
    @classmethod
    def _pool_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, e.g. http://thinktrans-pool:8000")
        return value

    @field_validator("default_locale")
    @classmethod
    def _default_locale(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        try:
            return canonicalize(value)
        except InvalidLocale as exc:
            raise ValueError(exc.detail) from None

    @field_validator("detect_languages")
    @classmethod
    def _detect_languages(cls, value: list[str]) -> list[str]:
        from service.text.detect import KNOWN_LANGUAGES

        out = []
        for tag in value:
            try:  # zh-Hans, en-GB: their language
                out.append(base_language(canonicalize(tag)))
            except InvalidLocale:
                out.append(tag.strip().lower())
        unknown = [tag for tag in out if tag not in KNOWN_LANGUAGES]
        if unknown:
            raise ValueError(f"unknown languages {', '.join(unknown)}; detection knows "
                             f"{', '.join(sorted(KNOWN_LANGUAGES))}")
        return out

    @field_validator("llm_extra_body")
    @classmethod
    def _llm_extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = extra_body_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("llm_plain_template")
    @classmethod
    def _llm_plain_template(cls, value: str) -> str:
        problem = template_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("span_kinds")
    @classmethod
    def _span_kinds(cls, value: list[str]) -> list[str]:
        unknown = [kind for kind in value if kind not in KINDS]
        if unknown:
            raise ValueError(f"unknown span kinds {', '.join(unknown)}; choose from "
                             f"{', '.join(KINDS)}")
        return value

    @field_validator("span_patterns")
    @classmethod
    def _span_patterns(cls, value: list[str]) -> list[str]:
        SpanFinder(value)  # compiles them: ValueError naming the bad one
        return value

    @field_validator("allowed_locales")
    @classmethod
    def _allowed(cls, value: list[str]) -> list[str]:
        out = []
        for tag in value:
            try:
                out.append(canonicalize(tag))
            except InvalidLocale as exc:
                raise ValueError(exc.detail) from None
        return out

    @field_validator("backend")
    @classmethod
    def _chain(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one backend, e.g. 'local' or 'deepl,local'")
        if len(set(value)) != len(value):
            raise ValueError(f"a backend appears twice in the chain {','.join(value)!r}")
        return value

    @model_validator(mode="after")
    def _default_allowed(self) -> Settings:
        if self.default_locale and self.allowed_locales:
            try:
                check_allowed(self.default_locale, self.allowed_locales)
            except ThinktransError as exc:
                raise ValueError(f"default_locale: {exc.detail}") from None
        return self

    # What the YAML file holds, read once and strictly by ``_with_file`` (empty: no file).
    file_values: ClassVar[Mapping[str, Any]] = {}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Explicit arguments first, then the variables, then the YAML file (if any).
        file_settings = InitSettingsSource(settings_cls, dict(cls.file_values))
        return init_settings, env_settings, file_settings

    def with_flags(self, *, backend: str | None = None, host: str | None = None,
                   port: int | None = None) -> Settings:
        """Command-line flags win over variables and the file; checked like them."""
        update: dict[str, Any] = {}
        if backend is not None:
            try:
                update["backend"] = self._chain(_list_value(backend))
            except ValueError as exc:
                raise ConfigError(f"invalid --backend {backend!r}: {exc}") from None
        if host is not None:
            update["host"] = host
        if port is not None:
            if not 1 <= port <= 65535:
                raise ConfigError(f"invalid --port {port}: must be 1..65535")
            update["port"] = port
        return self.model_copy(update=update)

    def backend_config(self, name: str) -> object | None:
        """What the registry builds backend ``name`` from (None: it takes nothing)."""
        if name == "local":
            return self.local_config()
        if name == "deepl":
            return self.deepl_config(batch_timeout_s=self.backend_timeout_s)
        if name == "llm":
            return self.llm_config()
        if name == "pool":
            return self.pool_config(batch_timeout_s=self.backend_timeout_s, port=self.port)
        return None

    def all_backends(self) -> list[str]:
        """Every backend this service builds: the chain, the extras, and passthrough."""
        names = list(self.backend)
        for name in [*self.extra_backends, "passthrough"]:
            if name not in names:
                names.append(name)
        return names



# The sections in the order docs/configuration.md lists them.
SECTIONS: tuple[type[BaseModel], ...] = (
    ServingSection, BackendsSection, LocaleSection, CacheSection, BatchingSection,
    LimitsSection, StreamsSection, SpansSection, PreviewsSection, LocalSection, DeepLSection,
    LLMSection, PoolSection, PricesSection,
)


# THINKTRANS_* variables that are not settings: read by the agent-side tools and the tests.
NOT_SETTINGS = frozenset({
    "THINKTRANS_URL",  # examples/agent_standin.py: where thinktrans is
    "THINKTRANS_FUZZ_EXAMPLES",  # tests/test_fuzz.py: how long the fuzz tests run
})


def variable_names(settings_cls: type[Settings] = Settings) -> set[str]:
    """The environment variables settings read: the prefixed names, the upper-case aliases."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    names = set()
    for name, info in settings_cls.model_fields.items():
        names.add(f"{prefix}{name.upper()}")
        alias = info.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        names.update(c for c in choices if isinstance(c, str) and c.isupper())
    return names


def _suggest(name: str, choices: list[str], prefix: str = "") -> str:
    """The "did you mean" hint: the choice closest to ``name``, compared without ``prefix``
    (which every choice shares, and would make any two names look alike)."""
    close = difflib.get_close_matches(name.removeprefix(prefix),
                                      [c.removeprefix(prefix) for c in choices], n=1)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``THINKTRANS_*`` variable that no setting reads (a typo, most often),
    naming the closest setting. Warned about, not refused: the environment is shared."""
    known = variable_names()
    prefixed = sorted(n for n in known if n.startswith("THINKTRANS_"))
    lines = []
    for name in sorted(environ):
        upper = name.upper()  # the settings read variables case-insensitively
        if upper.startswith("THINKTRANS_") and upper not in known and upper not in NOT_SETTINGS:
            hint = _suggest(upper, prefixed, "THINKTRANS_")
            lines.append(f"unknown setting {name} ignored{hint}")
    return lines


_SECRETS = frozenset(name for name, info in Settings.model_fields.items()
                     if "SecretStr" in str(info.annotation))


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "settings"
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            # A key of the YAML file (or an argument) that is no setting: a typo, most often.
            parts.append(f"unknown setting {field!r}{_suggest(field, list(Settings.model_fields))}")
            continue
        env = f"THINKTRANS_{str(err['loc'][0]).upper()}" if err["loc"] else ""
        given = err.get("input")
        secret = field in _SECRETS
        shown = "" if isinstance(given, dict) or given is None or secret else f", got {given!r}"
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{field} ({env}): {msg}{shown}" if env else f"{field}: {msg}{shown}")
    return "; ".join(parts)


def _unparsed(exc: SettingsError) -> str:
    """``error parsing value for field "x" from source "EnvSettingsSource"``, in the words
    of the other lines: the field, its variable, and what the value should be."""
    found = re.search(r'field "([^"]+)"', str(exc))
    if found is None:
        return str(exc).splitlines()[0]
    field = found.group(1)
    return (f"{field} (THINKTRANS_{field.upper()}): is not valid JSON; give a JSON object, "
            f"such as {{\"llm\": 20.0}}")


_MERGE = "tag:yaml.org,2002:merge"


def _key_twice(loader: yaml.SafeLoader, node: yaml.Node, path: str = "",
               seen: set[int] | None = None) -> str | None:
    """The first key some mapping under ``node`` names twice, as ``"'key' twice (lines a
    and b)"`` with its path from the top; None when there is none. PyYAML keeps the last
    of two without a word, so a second ``backend:`` further down would quietly win. Keys
    are compared as YAML reads them (``1`` and ``01`` alike); a merge key (``<<``) may be
    overridden, which is its use."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        children = [(f"{path}[{i}]", item) for i, item in enumerate(node.value)]
    elif isinstance(node, yaml.MappingNode):
        lines: dict[Any, int] = {}
        children = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                continue
            key = loader.construct_object(key_node, deep=True)
            name = f"{path}.{key}" if path else str(key)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:  # an unhashable key: YAML's own error says so later
                return None
            if first is not None:
                where = f"lines {first} and {line}" if first != line else f"line {line}"
                return f"{name!r} twice ({where})"
            lines[key] = line
            children.append((name, value_node))
    else:
        return None
    for name, child in children:
        found = _key_twice(loader, child, name, seen)
        if found is not None:
            return found
    return None


class YamlProblem(ValueError):
    """What is wrong with a YAML file, in words that follow its name."""


_BOOL = "tag:yaml.org,2002:bool"


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans, ``true`` and ``false`` alone: as YAML 1.1
    it reads ``yes``, ``no``, ``on`` and ``off`` as booleans too, and ``previews: yes`` would
    pass where a variable's ``yes`` is refused; here it stays the string it looks like."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                              list("tTfF"))


def parse_yaml(text: str, name: str) -> Any:
    """The one YAML document of ``text`` (a file named ``name`` in its errors), booleans as
    YAML 1.2 reads them; YamlProblem in one line: not YAML, or a mapping that names a key
    twice (which PyYAML would let pass, the last one winning)."""
    loader = _Loader(text)
    loader.name = name  # its errors' marks name the file, not "<unicode string>"
    try:
        node = loader.get_single_node()
        twice = None if node is None else _key_twice(loader, node)
        if twice is not None:
            raise YamlProblem(f"sets {twice}; keep one")
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlProblem(f"is not valid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def _read_file(path: Path) -> dict[str, Any]:
    """The YAML file's mapping, or ConfigError in one line: unreadable, not UTF-8, not
    YAML, a key twice, or not a mapping."""
    shown = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {shown!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        byte, line = exc.object[exc.start], exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {shown!r} is not UTF-8 (byte {byte:#04x} on line "
                          f"{line}); save it as UTF-8") from None
    try:
        loaded = parse_yaml(text, shown)
    except YamlProblem as exc:
        raise ConfigError(f"config file {shown!r} {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {shown!r} must hold a mapping of setting: value")
    return loaded


def _with_file(path: Path) -> type[Settings]:
    """Settings that also read the YAML file at ``path`` (under the variables)."""
    values = _read_file(path)
    return type("Settings", (Settings,), {"file_values": values, "__module__": __name__})


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``overrides``, the environment and the YAML file (if any), in that order
    of precedence; or ConfigError with one line naming the setting."""
    for line in unknown_variables(os.environ):
        log.warning(line)
    cls = Settings if config_file is None else _with_file(Path(config_file))
    try:
        return cls(**overrides)
    except ValidationError as exc:
        raise ConfigError(f"invalid settings: {_describe(exc)}") from None
    except SettingsError as exc:  # a complex value (a mapping, a list) that is not JSON
        raise ConfigError(f"invalid settings: {_unparsed(exc)}") from None
