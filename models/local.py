"""The local backend: NLLB-200, M2M-100 and Marian (opus-mt) checkpoints on CTranslate2 or torch.

A checkpoint comes from a hub id or a directory (``THINKTRANS_LOCAL_MODEL``), loaded with
``AutoTokenizer``/``AutoModelForSeq2SeqLM.from_pretrained``; its family is told from its config
and tokenizer, never from its name:

- NLLB-200 (``model_type`` m2m_100 with the flores-200 tokens, e.g. ``eng_Latn``): the tokenizer's
  ``src_lang`` is set per batch and ``forced_bos_token_id`` is the target's flores token;
- M2M-100 (m2m_100 with ``__en__``-style tokens): ``src_lang`` and ``get_lang_id(target)``;
- Marian: one pair per checkpoint. The pair is, first that applies: a ``src-tgt=`` prefix on the
  setting (``THINKTRANS_LOCAL_MODEL=en-de=/models/opus-mt-en-de``), the tokenizer's saved
  ``source_lang``/``target_lang``, an ``opus-mt-src-tgt`` name. Multi-target checkpoints
  (``>>fra<<`` tokens) serve each target they have a token for. ``THINKTRANS_LOCAL_MARIAN_MODELS``
  adds checkpoints (``en-de=ID,en-ja=DIR``); for its pair a Marian checkpoint is chosen over the
  main model.

Several models: ``THINKTRANS_LOCAL_MODELS`` (``LocalConfig.models``), when set, replaces both
settings with a list in order of preference, each entry as ``THINKTRANS_LOCAL_MODEL`` takes it; a
pair goes to the first model that serves it. A request or stream may name a model: a configured
one serves the batch alone, and any other name is loaded on demand, on a thread of its own so
that batches keep running meanwhile, and kept while it is among the
``THINKTRANS_LOCAL_MAX_EXTRA_MODELS`` most recently used (0: never loaded).

Source languages: NLLB and M2M need one. An unknown source (``None``) or one the model lacks is
read as English, the language most thinking is written in; the encoder copes with a wrong
source tag far better than with none. For Marian an unknown source also means English.

The model runs on one of two engines (models/engines.py, ``THINKTRANS_LOCAL_ENGINE``):
CTranslate2 (``auto`` picks it where ``thinktrans[ct2]`` is installed; int8 on CPU) or
transformers + torch. Everything else, the tokenizer (always the checkpoint's own HF tokenizer),
the family, the language codes, splitting, the output bound per segment, is the same for
both. ``THINKTRANS_LOCAL_MODEL`` may also name a converted CTranslate2 directory
(``thinktrans convert``); a checkpoint is converted once on first load and cached
(models/convert.py). Under ``auto``, a checkpoint that cannot be converted is served by
transformers instead, with a warning.

Loading happens in the backend's own worker thread, after ``start()`` has returned; until it
is done (or when it failed) ``ready`` is False, ``reason`` says why, ``translate`` raises
``BackendUnavailable`` and, since the model's languages are not known yet, ``supports`` answers
True and ``languages`` None. Every batch runs in that same single thread, so the tokenizer's
per-batch ``src_lang`` needs no lock and batches never contend for the CPU or GPU.

A load that failed is tried again, ``load_retry_initial_s`` (5 s) after the first failure,
then doubling up to ``load_retry_max_s`` between tries, until it succeeds or the backend is
closed: a model directory mounted later, or a hub that comes back, is picked up without a
restart. Meanwhile ``reason`` ends in "retrying in N s (attempt K)". ``wait_ready`` waits only
for the attempt in flight: it answers False as soon as one has failed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from models import engines
from models.base import Job, Translator, first_line
from models.engines import ConversionFailed, EngineOptions, Loaded
from models.engines import LoadError as _LoadError
from models.errors import (
    BackendConfigError,
    BackendError,
    BackendUnavailable,
    MissingExtra,
    UnsupportedLanguage,
)
from models.languages import canonical, table_key

log = logging.getLogger(__name__)

# The languages this backend knows: table key (see models.languages), flores-200 code
# (NLLB-200), M2M-100 code. A loaded checkpoint serves those its tokenizer has a token for.
_ROWS: tuple[tuple[str, str, str], ...] = (
    ("af", "afr_Latn", "af"),
    ("ar", "arb_Arab", "ar"),
    ("bg", "bul_Cyrl", "bg"),
    ("bn", "ben_Beng", "bn"),
    ("ca", "cat_Latn", "ca"),
    ("cs", "ces_Latn", "cs"),
    ("cy", "cym_Latn", "cy"),
    ("da", "dan_Latn", "da"),
    ("de", "deu_Latn", "de"),
    ("el", "ell_Grek", "el"),
    ("en", "eng_Latn", "en"),
    ("es", "spa_Latn", "es"),
    ("et", "est_Latn", "et"),
    ("fa", "pes_Arab", "fa"),
    ("fi", "fin_Latn", "fi"),
    ("fr", "fra_Latn", "fr"),
    ("gu", "guj_Gujr", "gu"),
    ("he", "heb_Hebr", "he"),
    ("hi", "hin_Deva", "hi"),
    ("hr", "hrv_Latn", "hr"),
    ("hu", "hun_Latn", "hu"),
    ("id", "ind_Latn", "id"),
    ("it", "ita_Latn", "it"),
    ("ja", "jpn_Jpan", "ja"),
    ("kn", "kan_Knda", "kn"),
    ("ko", "kor_Hang", "ko"),
    ("lt", "lit_Latn", "lt"),
    ("lv", "lvs_Latn", "lv"),
    ("mk", "mkd_Cyrl", "mk"),
    ("ml", "mal_Mlym", "ml"),
    ("mr", "mar_Deva", "mr"),
    ("nb", "nob_Latn", "no"),
    ("ne", "npi_Deva", "ne"),
    ("nl", "nld_Latn", "nl"),
    ("pa", "pan_Guru", "pa"),
    ("pl", "pol_Latn", "pl"),
    ("pt", "por_Latn", "pt"),
    ("ro", "ron_Latn", "ro"),
    ("ru", "rus_Cyrl", "ru"),
    ("sk", "slk_Latn", "sk"),
    ("sl", "slv_Latn", "sl"),
    ("sq", "als_Latn", "sq"),
    ("sv", "swe_Latn", "sv"),
    ("sw", "swh_Latn", "sw"),
    ("ta", "tam_Taml", "ta"),
    ("te", "tel_Telu", "te"),
    ("th", "tha_Thai", "th"),
    ("fil", "tgl_Latn", "tl"),
    ("tr", "tur_Latn", "tr"),
    ("uk", "ukr_Cyrl", "uk"),
    ("ur", "urd_Arab", "ur"),
    ("vi", "vie_Latn", "vi"),
    ("zh-Hans", "zho_Hans", "zh"),
    ("zh-Hant", "zho_Hant", "zh"),
)
NLLB_CODES: dict[str, str] = {key: flores for key, flores, _ in _ROWS}
M2M_CODES: dict[str, str] = {key: m2m for key, _, m2m in _ROWS}

FAMILIES = ("nllb", "m2m100", "marian")
FALLBACK_SOURCE = "en"  # what an unknown source is read as (see the module docstring)
# The default loop guard (local_no_repeat_ngram_size): it rarely touches real text, as a 6-gram
# seldom recurs within one sentence, while a looping model repeats one within a few tokens.
# max_new_tokens bounds the rest.
NO_REPEAT_NGRAM_SIZE = 6
# Padded input tokens per generate call; a larger batch is cut into length-sorted slices.
MAX_BATCH_TOKENS = 8192
# How long a failed on-demand load is remembered: asks meanwhile get its reason at once, so a
# mistyped model name costs one load attempt a minute, not one per segment.
EXTRA_RETRY_S = 60.0
# Models loading on demand at once (queued on the one loader thread), and failed names
# remembered: both are the requests' choice, so both are bounded.
MAX_LOADING_ON_DEMAND = 2
MAX_FAILURES_REMEMBERED = 256
# Targets written without spaces between sentences: split parts are rejoined without one.
_NO_SPACE_TARGETS = frozenset({"zh-Hans", "zh-Hant", "ja"})
_PAIR = re.compile(r"^(?P<src>[A-Za-z]{2,8})-(?P<tgt>[A-Za-z]{2,8}(?:-[A-Za-z0-9]{1,8})*)$")
_OPUS_NAME = re.compile(r"opus-mt-(?P<src>[A-Za-z]{2,8})-(?P<tgt>[A-Za-z]{2,8})$")
_FLORES = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")
_SENTENCE_END = re.compile(r"(?<=[.!?;:…])\s+|(?<=[。！？；])\s*")
_WORD_END = re.compile(r"(?<=\s)(?=\S)")


def _require_packages(engine: str) -> None:
    extra = "ct2" if engine == "ctranslate2" else "local"
    for module in engines.required_packages(engine):
        if find_spec(module) is None:
            raise MissingExtra(
                f"the local backend's {engine} engine needs {module!r}: pip install "
                f"'thinktrans[{extra}]'",
                name=module, extra=extra,
            )


def _key_or_none(tag: str | None) -> str | None:
    """The table key of a tag, or None when it is missing or not a BCP 47 tag."""
    standard = canonical(tag) if tag is not None else None
    return table_key(standard) if standard is not None else None


def parse_pair_spec(value: str) -> tuple[tuple[str, str] | None, str]:
    """Split ``en-de=ID`` into ``(("en", "de"), "ID")``; a value without a pair gives ``None``."""
    left, sep, right = value.partition("=")
    match = _PAIR.match(left.strip()) if sep and "/" not in left else None
    src, tgt = (_key_or_none(match["src"]), _key_or_none(match["tgt"])) if match else (None, None)
    if src is None or tgt is None:
        return None, value.strip()
    return (src, tgt), right.strip()


@dataclass
class _Spec:
    """A checkpoint to load: the main model or one of the extra Marian ones."""

    model_id: str
    pair: tuple[str, str] | None = None
    marian_only: bool = False
    setting: str = "THINKTRANS_LOCAL_MODEL"  # where it was named, for failure reasons
    on_demand: bool = False  # named by a request, not configured


@dataclass
class _Slot:
    """One loaded checkpoint and what it can serve."""

    model_id: str
    family: str
    tokenizer: Any
    loaded: Loaded  # the engine's model
    # NLLB/M2M: table key -> the family's code. Marian: target key -> text prefix ("" or ">>fr<<").
    codes: dict[str, str]
    source: str | None = None  # Marian: the pair's source key
    drop_ids: frozenset[int] = frozenset()  # never decoded: specials and language tokens
    # A directory's files (names, sizes, times), so that a checkpoint replaced in place
    # never shares cached translations with the one before; "" for a hub id.
    version: str = ""
    max_positions: int = 1024
    batches: int = 0  # batches run on it (the worker thread alone writes it)

    @property
    def model(self) -> Any:
        return self.loaded.model


@dataclass(frozen=True)
class _Route:
    """How one (source, target) is served: which checkpoint, which codes."""

    slot: _Slot
    src_code: str | None  # NLLB/M2M source code
    forced_bos: int | None  # NLLB/M2M target token
    prefix: str  # Marian multi-target token
    no_space: bool  # rejoin split parts without spaces


@dataclass
class _Part:
    """A piece of one input text that goes through the model on its own."""

    index: int  # which input text
    text: str
    sep: str  # whitespace that followed it in the source
    n_tokens: int = 0
    out: str = ""


@dataclass
class _Stats:
    batches: int = 0
    segments: int = 0
    generate_calls: int = 0
    split_segments: int = 0
    output_tokens: int = 0  # generated, as kept (before EOS, within the bound)
    last_generate_sizes: list[int] = field(default_factory=list)


def split_text(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Cut ``text`` into pieces of at most ``max_tokens`` tokens; joined, they give ``text``.

    Cuts fall at sentence ends first, then between words, then (for text without spaces) at
    character midpoints. Each piece keeps the whitespace that followed it.
    """
    if count_tokens(text) <= max_tokens:
        return [text]
    atoms: list[str] = []
    for sentence in _cut(text, _SENTENCE_END):
        if count_tokens(sentence) <= max_tokens:
            atoms.append(sentence)
            continue
        for word in _cut(sentence, _WORD_END):
            atoms.extend(_halve(word, count_tokens, max_tokens))
    pieces: list[str] = []
    for atom in atoms:
        # Whitespace-only atoms never stand alone: they belong to the piece before.
        if pieces and (not atom.strip() or count_tokens(pieces[-1] + atom) <= max_tokens):
            pieces[-1] += atom
        else:
            pieces.append(atom)
    return pieces


def _cut(text: str, pattern: re.Pattern[str]) -> list[str]:
    """Split after each match of ``pattern``, keeping the matched whitespace on the left piece."""
    out, start = [], 0
    for match in pattern.finditer(text):
        if match.end() > start and match.end() < len(text):
            out.append(text[start : match.end()])
            start = match.end()
    out.append(text[start:])
    return [piece for piece in out if piece]


def _halve(text: str, count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    if len(text) <= 1 or count_tokens(text) <= max_tokens:
        return [text]
    mid = len(text) // 2
    return _halve(text[:mid], count_tokens, max_tokens) + _halve(
        text[mid:], count_tokens, max_tokens
    )


def _hub_unreachable(model_id: str, timeout_s: float = 3.0) -> bool:
    """Whether ``model_id`` names a hub repository while the hub cannot be reached (its
    name does not resolve, or no connection within ``timeout_s``)."""
    if model_id.startswith(("/", "./", "../", "~")) or Path(model_id).expanduser().exists():
        return False  # a local directory
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False  # already offline: the hub client does not try the network
    endpoint = urlsplit(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=timeout_s).close()
    except OSError:
        log.warning("local: the model hub %s is unreachable; loading %r from the local cache "
                    "only", constants.ENDPOINT, model_id)
        return True
    return False


def not_found_reason(model_id: str, exc: BaseException,
                     setting: str = "THINKTRANS_LOCAL_MODEL") -> str:
    """Why ``model_id`` could not be loaded, and what to set (``setting``: where it was
    named) to fix it."""
    looks_local = model_id.startswith(("/", "./", "../", "~")) or Path(model_id).exists()
    path = Path(model_id).expanduser()
    unreadable = sorted(p.name for p in path.iterdir()
                        if p.is_file() and not os.access(p, os.R_OK)) if path.is_dir() else []
    if unreadable:
        # save_pretrained writes model.safetensors as 0600; a non-root container cannot read it
        return (
            f"cannot read {', '.join(unreadable)} in {model_id!r} as uid {os.getuid()}: make "
            f"the checkpoint readable (chmod -R a+rX {model_id})"
        )
    if looks_local and not path.exists():
        return (
            f"model directory {model_id!r} does not exist: set {setting} to a "
            "checkpoint directory or a hub id (HF_HUB_OFFLINE=1 keeps hub ids to the local cache)"
        )
    if path.is_dir():
        return (
            f"{model_id!r} is not a loadable checkpoint directory ({first_line(exc)}): set "
            f"{setting} to a directory written by save_pretrained, or to a hub id "
            "(HF_HUB_OFFLINE=1 keeps hub ids to the local cache)"
        )
    return (
        f"model {model_id!r} not found locally and the hub is unreachable or does not have it "
        f"({first_line(exc)}): set {setting} to a local directory or pre-seed HF_HOME "
        "with it; HF_HUB_OFFLINE=1 skips the network"
    )


@dataclass(frozen=True)
class LocalConfig:
    """What the local backend runs and how; the registry fills it from ``local_*`` settings."""

    # Hub id or directory; a Marian one may name its pair first: ``en-de=DIR``.
    model: str = "facebook/nllb-200-distilled-600M"
    # Extra Marian checkpoints, one per pair, each ``src-tgt=ID_OR_DIR``.
    marian_models: tuple[str, ...] = ()
    # Several models in order of preference, each as ``model`` takes it; when set, it replaces
    # ``model`` and ``marian_models``.
    models: tuple[str, ...] = ()
    # Models not configured but named by requests, kept loaded at once (LRU); 0: never loaded.
    max_extra_models: int = 1
    engine: str = "auto"  # auto (ctranslate2 where installed), ctranslate2, transformers
    device: str = "auto"  # auto (CUDA when present), cpu, cuda:0
    dtype: str = "auto"  # transformers: auto, float32, float16, bfloat16
    compute_type: str = "auto"  # ctranslate2: auto (int8 on CPU, int8_float16 on CUDA), ...
    num_beams: int = 1
    no_repeat_ngram_size: int = NO_REPEAT_NGRAM_SIZE  # the loop guard; 0: off
    max_input_tokens: int = 256  # longer segments are split and rejoined
    threads: int | None = None  # CPU threads; None: the engine's default
    ct2_cache: str | None = None  # where checkpoints are converted to; None: beside the HF cache
    ct2_workers: int | None = None  # parts of a batch run at once; None: by the model's size
    # A failed load is tried again after this long, doubling up to load_retry_max_s.
    load_retry_initial_s: float = 5.0
    load_retry_max_s: float = 300.0


def _specs_from(config: LocalConfig) -> list[_Spec]:
    """The configured checkpoints, the main one first: ``models`` when set, else ``model``
    and ``marian_models``; BackendConfigError for a malformed entry."""
    if config.models:
        specs = [_Spec(model_id, pair, setting="THINKTRANS_LOCAL_MODELS")
                 for pair, model_id in map(parse_pair_spec, config.models)]
        if not all(spec.model_id for spec in specs):
            raise BackendConfigError("local_models (THINKTRANS_LOCAL_MODELS) has an empty entry: "
                              f"{', '.join(config.models)!r}")
        return specs
    pair, model_id = parse_pair_spec(config.model)
    if not model_id:
        raise BackendConfigError("local_model (THINKTRANS_LOCAL_MODEL) is empty; name a checkpoint")
    specs = [_Spec(model_id, pair)]
    for entry in config.marian_models:
        extra_pair, extra_id = parse_pair_spec(entry)
        if extra_pair is None or not extra_id:
            raise BackendConfigError(
                "local_marian_models (THINKTRANS_LOCAL_MARIAN_MODELS) entries must read "
                f"'src-tgt=ID_OR_DIR', e.g. 'en-de=Helsinki-NLP/opus-mt-en-de'; got {entry!r}"
            )
        specs.append(_Spec(extra_id, extra_pair, marian_only=True))
    return specs


class LocalTranslator(Translator):
    """Seq2seq translation checkpoints run in a worker thread this backend owns."""

    name = "local"
    # One worker thread: more batches in flight would only queue behind it.
    max_concurrency = 1

    def __init__(self, config: LocalConfig | None = None) -> None:
        super().__init__()
        config = config or LocalConfig()
        if config.engine not in engines.ENGINES:
            raise BackendConfigError(f"local_engine must be one of {', '.join(engines.ENGINES)}, "
                              f"got {config.engine!r}")
        self.engine_name = engines.resolve(config.engine)
        _require_packages(self.engine_name)
        self.config = config
        self._engine = self._make_engine(self.engine_name)
        if config.max_extra_models < 0:
            raise BackendConfigError(
                f"local_max_extra_models must be >= 0, got {config.max_extra_models}")
        self._specs = _specs_from(config)
        self._configured = frozenset(spec.model_id for spec in self._specs)
        self.model_id = model_id = self._specs[0].model_id
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="thinktrans-local")
        # On-demand loads get a thread of their own: a big model loading never holds up the
        # batches of the streams that did not ask for it.
        self._ondemand = ThreadPoolExecutor(max_workers=1,
                                            thread_name_prefix="thinktrans-local-ondemand")
        # Loaded extras, least recently used first. The dict is replaced, never changed in
        # place, so readers need no lock; writers (two threads) take the lock.
        self._extras: dict[str, _Slot] = {}
        self._extras_lock = threading.Lock()
        self._extras_loading: set[str] = set()  # under the lock
        self._extras_failed: dict[str, tuple[float, str]] = {}  # name -> (when, reason)
        # The load attempt in flight (None between attempts) and the task that retries.
        self._attempt: asyncio.Future[bool] | None = None
        self._loader: asyncio.Task[None] | None = None
        self.load_attempts = 0
        self.load_failures = 0
        self._slots: list[_Slot] = []
        self._closed = False
        self.device: str | None = None
        self.dtype: str | None = None  # the compute type: torch dtype or CTranslate2's type
        self.engine_note: str | None = None  # why the engine is not the one asked for
        self.load_s: float | None = None
        self.stats = _Stats()
        self.ready = False
        self.reason = f"model {model_id!r} not loaded: the backend has not been started"

    def _make_engine(self, name: str) -> engines.Engine:
        config = self.config
        options = EngineOptions(
            device=config.device, dtype=config.dtype, compute_type=config.compute_type,
            threads=config.threads, ct2_workers=config.ct2_workers, num_beams=config.num_beams,
            no_repeat_ngram_size=config.no_repeat_ngram_size,
            ct2_cache=Path(config.ct2_cache).expanduser() if config.ct2_cache else None,
        )
        return engines.build(name, options)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Begin loading in the worker thread and return at once; retry while it fails."""
        if self._loader is not None or self._closed:
            return
        self.reason = f"loading model {self.model_id!r}"
        loop = asyncio.get_running_loop()
        first = self._begin_attempt(loop)
        self._loader = loop.create_task(self._load_until_ready(first),
                                        name="thinktrans-local-load")

    def _begin_attempt(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[bool]:
        self.load_attempts += 1
        attempt = loop.run_in_executor(self._executor, self._load)
        self._attempt = attempt
        return attempt

    async def _load_until_ready(self, attempt: asyncio.Future[bool]) -> None:
        """Await each load attempt; after a failure, wait (5 s, doubling, capped) and retry."""
        loop = asyncio.get_running_loop()
        delay = self.config.load_retry_initial_s
        while not await attempt and not self._closed:
            self.load_failures += 1
            self._attempt = None
            failure = self.reason
            wait = min(delay, self.config.load_retry_max_s)
            delay = wait * 2
            self.reason = f"{failure}; retrying in {wait:g} s (attempt {self.load_attempts + 1})"
            log.error("local: %s", self.reason)
            await asyncio.sleep(wait)
            if self._closed:
                return
            self.reason = f"{failure}; trying again now (attempt {self.load_attempts + 1})"
            try:
                attempt = self._begin_attempt(loop)
            except RuntimeError:  # the executor is shut down: closed meanwhile
                return

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait for the load attempt in flight, ``timeout_s`` at most, starting loading if need
        be; return ``ready``. Between retries (an attempt has failed) it answers False at once:
        it never waits through the backoff."""
        if self._loader is None:
            await self.start()
        future = self._attempt
        if future is None:  # closed before it started, or waiting to retry
            return self.ready
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            # The load itself was dropped by aclose(); only our own cancellation propagates.
            task = asyncio.current_task()
            if not future.cancelled() or (task is not None and task.cancelling()):
                raise
        return self.ready

    async def aclose(self) -> None:
        """Stop retrying and stop the worker thread; a batch or load already running finishes,
        queued ones are dropped."""
        self._closed = True
        self.ready = False
        self.reason = "the local backend is closed"
        self._slots = []
        with self._extras_lock:  # an on-demand load finishing now sees _closed and drops it
            self._extras = {}
        # No wait: a running generate or load cannot be interrupted and must not block the loop.
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._ondemand.shutdown(wait=False, cancel_futures=True)
        loader = self._loader
        if loader is not None and not loader.done():
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)

    # -- what it serves ----------------------------------------------------------------------

    def languages(self) -> list[str] | None:
        """Table keys (BCP 47) of the targets the loaded checkpoints serve; None until loaded."""
        if not self.ready:
            return None
        keys: set[str] = set()
        for slot in self._slots:
            keys.update(slot.codes)
        return sorted(keys)

    def serves_target(self, target: str) -> bool | None:
        """Whether a loaded checkpoint translates into ``target`` (from any source); None
        until loaded."""
        if not self.ready:
            return None
        tag = canonical(target)
        return tag is not None and table_key(tag) in (self.languages() or [])

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        """Whether the pair is servable (by ``model`` when named: a configured model or one
        loaded on demand); True until loaded, as the languages are not known yet."""
        if not self.ready:
            return True
        try:
            self._route(source, target, model)
        except UnsupportedLanguage:
            return False
        except BackendUnavailable:
            return True  # a model dropped since it was asked for: translate says why
        return True

    def info(self) -> dict[str, object]:
        """Model, family, device, dtype and language count, for ``GET /v1/backends``."""
        main = self._slots[0] if self._slots else None
        languages = self.languages()
        extras = list(self._extras)
        return {
            "model": self.model_id,
            "models": [spec.model_id for spec in self._specs] + extras,
            "extra_models": extras,
            "family": main.family if main else None,
            "engine": self.engine_name,
            "compute_type": self.dtype,
            "device": self.device,
            "dtype": self.dtype,
            "languages": len(languages) if languages is not None else None,
            "marian_pairs": [
                f"{slot.source}-{target}={slot.model_id}"
                for slot in self._slots
                if slot.family == "marian"
                for target in slot.codes
            ],
            "num_beams": self.config.num_beams,
            "no_repeat_ngram_size": self.config.no_repeat_ngram_size,
            "threads": self._engine.threads if self.ready else self.config.threads,
            "workers": main.loaded.workers if main else None,
            "engine_note": self.engine_note,
            "output_tokens": self.stats.output_tokens,  # generated since start, for benchmarks
            "load_s": self.load_s,
            "load_attempts": self.load_attempts,
            "load_failures": self.load_failures,
            "ready": self.ready,
            "reason": self.reason,
        }

    def _route(self, source: str | None, target: str, model: str | None = None) -> _Route:
        """How the pair is served: by the named model alone, or by the first configured model
        that serves it; UnsupportedLanguage when none does."""
        tag = canonical(target)
        if tag is None:
            raise UnsupportedLanguage(f"{target!r} is not a valid BCP 47 target")
        tgt = table_key(tag)
        src = _key_or_none(source) or FALLBACK_SOURCE
        slots = self._candidates(model)
        if model is not None and not slots:  # an extra dropped since it was asked for
            raise BackendUnavailable(f"model {model!r} is not loaded")
        for slot in slots:
            route = _route_on(slot, src, tgt, tgt in _NO_SPACE_TARGETS)
            if route is not None:
                return route
        who = "the local backend" if model is None else f"model {model!r}"
        raise UnsupportedLanguage(
            f"{who} cannot translate {src} -> {tag}: it serves {_served(slots)}",
            source=src,
            target=tag,
        )

    def _candidates(self, model: str | None) -> list[_Slot]:
        """The slots that may serve, in order of preference: the named model's (a configured
        one, else a loaded extra), or every configured one."""
        if model is not None:
            named = [slot for slot in self._slots if slot.model_id == model]
            extra = self._extras.get(model)
            return named or ([extra] if extra is not None else [])
        if self.config.models:
            return self._slots
        # THINKTRANS_LOCAL_MARIAN_MODELS: a Marian checkpoint configured for exactly the pair
        # wins over the main model (it was configured for that pair on purpose); stable sort.
        return sorted(self._slots, key=lambda slot: slot.family != "marian")

    # -- models a request or stream may name --------------------------------------------------

    def model_problem(self, model: str | None) -> str | None:
        """None for the default, a configured model or a loaded extra; for any other name, why
        it cannot serve now, starting its load on demand where that is allowed."""
        if model is None or model in self._configured or model in self._extras:
            return None
        if self.config.max_extra_models == 0:
            return (
                f"model {model!r} is not configured (THINKTRANS_LOCAL_MODELS) and loading models "
                "on demand is off (THINKTRANS_LOCAL_MAX_EXTRA_MODELS=0)"
            )
        if not self.ready:
            # The configured models' load sets the engine up; an extra loads after it.
            return f"model {model!r} loads on demand once the backend is ready ({self.reason})"
        return self._load_on_demand(model)

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        """The model that serves the pair (see ``translate``); a named extra not loaded yet is
        its own name; None when not ready or when nothing serves the pair."""
        if not self.ready:
            return None
        if model is not None and not self._loaded(model):
            return model
        try:
            route = self._route(source, target, model)
        except (UnsupportedLanguage, BackendUnavailable):
            return None
        return model or route.slot.model_id

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        """Everything but the text that decides the output: the model serving the pair, the
        engine, its compute type and device, the decoding options; None when nothing loaded
        serves the pair."""
        if not self.ready or (model is not None and not self._loaded(model)):
            return None
        try:
            slot = self._route(source, target, model).slot
        except (UnsupportedLanguage, BackendUnavailable):
            return None
        config = self.config
        return (
            f"local|{slot.model_id}|v={slot.version}|{self.engine_name}|{self.dtype}"
            f"|beams={config.num_beams}"
            f"|ngram={config.no_repeat_ngram_size}|maxin={config.max_input_tokens}"
            f"|device={self.device}"
        )

    def catalog(self) -> list[dict[str, object]]:
        """The configured models in order of preference, then the extras loaded on demand."""
        loaded = self.ready and len(self._slots) == len(self._specs)
        default = self._default_index(loaded)
        entries: list[dict[str, object]] = []
        for i, spec in enumerate(self._specs):
            slot = self._slots[i] if loaded else None
            entries.append({
                "model": spec.model_id,
                "languages": sorted(slot.codes) if slot is not None else None,
                "default": i == default,
                "notes": self._notes(slot) if slot is not None
                else f"not loaded: {self.reason or 'the backend has not been started'}",
            })
        for name, extra in self._extras.items():
            entries.append({"model": name, "languages": sorted(extra.codes), "default": False,
                            "notes": f"{self._notes(extra)}, loaded on demand"})
        return entries

    def _default_index(self, loaded: bool) -> int:
        """The configured model that serves a pair when none is named and no Marian checkpoint
        is meant for it: the first NLLB/M2M one, else the first."""
        if loaded:
            marian = [slot.family == "marian" for slot in self._slots]
        else:  # the family is not known yet: a pair prefix is only ever written for Marian
            marian = [spec.pair is not None or spec.marian_only for spec in self._specs]
        return next((i for i, is_marian in enumerate(marian) if not is_marian), 0)

    def _notes(self, slot: _Slot) -> str:
        if slot.family == "marian":
            what = "marian " + ", ".join(f"{slot.source}-{target}" for target in slot.codes)
        else:
            what = f"{slot.family}, {len(slot.codes)} targets"
        return f"{what}, {self.engine_name} {self.dtype}"

    def _loaded(self, model: str) -> bool:
        return model in self._configured or model in self._extras

    # -- on-demand loading (extras) -------------------------------------------------------------

    def _load_on_demand(self, model: str) -> str | None:
        """Queue ``model``'s load unless it is loading or failed within EXTRA_RETRY_S; why it
        cannot serve yet (None: it was published meanwhile)."""
        with self._extras_lock:
            if model in self._extras:
                return None
            failed = self._extras_failed.get(model)
            if failed is not None and time.monotonic() - failed[0] < EXTRA_RETRY_S:
                return failed[1]
            self._extras_failed.pop(model, None)
            if model not in self._extras_loading:
                if len(self._extras_loading) >= MAX_LOADING_ON_DEMAND:
                    # Names are the requests' choice: never queue loads without bound.
                    return (f"{len(self._extras_loading)} models are loading on demand "
                            f"already; model {model!r} is not loaded (try again later)")
                try:
                    self._ondemand.submit(self._load_extra, model)
                except RuntimeError:  # "cannot schedule new futures after shutdown"
                    return "the local backend is closed"
                self._extras_loading.add(model)
        return f"loading model {model!r} on demand; it serves once loaded"

    def _load_extra(self, name: str) -> None:
        """Runs on the on-demand thread: load and warm up ``name`` as a configured model is,
        then publish it (a new dict), dropping the least recently used extras beyond
        max_extra_models; a failure is remembered for EXTRA_RETRY_S."""
        started = time.perf_counter()
        slot, reason = self._try_load_extra(name)
        with self._extras_lock:
            self._extras_loading.discard(name)
            if slot is None:
                reason = f"{reason} (tried again after {EXTRA_RETRY_S:g} s)"
                self._extras_failed[name] = (time.monotonic(), reason)
                while len(self._extras_failed) > MAX_FAILURES_REMEMBERED:  # oldest first
                    del self._extras_failed[next(iter(self._extras_failed))]
                log.error("local: on demand: %s", reason)
                return
            if self._closed:
                return
            # Dropped only once the new one has loaded, so that a mistyped name never costs
            # a loaded model; meanwhile one model more than the bound is in memory.
            extras = {**self._extras, name: slot}
            while len(extras) > self.config.max_extra_models:
                dropped = next(iter(extras))
                del extras[dropped]
                log.info("local: dropped %r, the least recently used model loaded on demand "
                         "(THINKTRANS_LOCAL_MAX_EXTRA_MODELS=%d)", dropped,
                         self.config.max_extra_models)
            self._extras = extras
        log.info("local: %r (%s) loaded on demand in %.1fs", name, slot.family,
                 time.perf_counter() - started)

    def _try_load_extra(self, name: str) -> tuple[_Slot | None, str]:
        pair, model_id = parse_pair_spec(name)
        try:
            slot = self._load_slot(_Spec(model_id, pair, setting="the request's `model`",
                                         on_demand=True))
            self._warm_up(slot)
        except _LoadError as exc:
            return None, str(exc)
        except Exception as exc:  # never let a bad checkpoint take the service down
            log.exception("local: loading %r on demand failed", name)
            return None, f"loading model {name!r} on demand failed: {first_line(exc)}"
        return slot, ""

    def _touch(self, name: str) -> None:
        """Make a loaded extra the most recently used: the dicts' order is the LRU order."""
        with self._extras_lock:
            extras = self._extras
            if name in extras and next(reversed(extras)) != name:
                moved = dict(extras)
                moved[name] = moved.pop(name)
                self._extras = moved

    # -- translation -------------------------------------------------------------------------

    async def run(self, job: Job) -> list[str]:
        """Translate in the worker thread; the event loop only waits. ``contexts`` is unused.

        ``model`` None: the first configured model that serves the pair. A configured model's
        id: that model alone (UnsupportedLanguage when it cannot serve the pair). Any other
        name: the model loaded on demand, BackendUnavailable until it is.
        """
        texts, source, target, model = job.texts, job.source, job.target, job.model
        if not self.ready:
            raise BackendUnavailable(self.reason or f"model {self.model_id!r} is not loaded")
        if model is not None and model not in self._configured:
            problem = self.model_problem(model)
            if problem is not None:
                raise BackendUnavailable(problem)
            self._touch(model)
        route = self._route(source, target, model)
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, self._translate_sync, route, list(texts))
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise BackendUnavailable("the local backend is closed") from exc
        try:
            return await future
        except asyncio.CancelledError:
            # aclose() dropped the queued batch: that is an outage, not our caller's cancel.
            task = asyncio.current_task()
            if self._closed and not (task is not None and task.cancelling()):
                raise BackendUnavailable("the local backend closed before the batch ran") from None
            raise

    def _translate_sync(self, route: _Route, texts: list[str]) -> list[str]:
        """Runs in the worker: split, sort by length, generate, restore order, rejoin."""
        try:
            return self._translate_parts(route, texts)
        except BackendError:
            raise
        except Exception as exc:  # the one place torch/transformers errors become ours
            if type(exc).__name__ == "OutOfMemoryError":
                raise BackendUnavailable(
                    f"out of memory on {self.device} for a batch of {len(texts)}: lower "
                    "THINKTRANS_MAX_BATCH_SIZE or THINKTRANS_LOCAL_MAX_INPUT_TOKENS"
                ) from exc
            raise BackendError(
                f"the local model failed on a batch of {len(texts)}: {first_line(exc)}"
            ) from exc

    def _translate_parts(self, route: _Route, texts: list[str]) -> list[str]:
        started = time.perf_counter()
        slot = route.slot
        tokenizer = slot.tokenizer
        if route.src_code is not None:
            tokenizer.src_lang = route.src_code  # safe: only this thread touches the tokenizer

        def count(text: str) -> int:
            return len(tokenizer(route.prefix + text, add_special_tokens=False)["input_ids"])

        parts: list[_Part] = []
        leads: list[str] = []
        trails: list[str] = []
        for i, text in enumerate(texts):
            core = text.strip()
            leads.append(text[: len(text) - len(text.lstrip())])
            trails.append(text[len(text.rstrip()) :] if core else "")
            if not core:
                continue
            pieces = split_text(core, count, self.config.max_input_tokens)
            if len(pieces) > 1:
                self.stats.split_segments += 1
            for piece in pieces:
                stripped = piece.rstrip()
                parts.append(_Part(i, stripped, piece[len(stripped) :]))
        for part in parts:
            part.n_tokens = count(part.text)

        # Longest first, so that each slice pads little and the slow one starts early.
        order = sorted(range(len(parts)), key=lambda k: parts[k].n_tokens, reverse=True)
        sizes = []
        start = 0
        while start < len(order):
            longest = parts[order[start]].n_tokens + 4
            size = max(1, min(len(order) - start, MAX_BATCH_TOKENS // max(longest, 1)))
            chunk = [parts[k] for k in order[start : start + size]]
            outputs = self._generate(route, [p.text for p in chunk])
            for part, out in zip(chunk, outputs, strict=True):
                part.out = out
            sizes.append(size)
            start += size

        joined: list[list[str]] = [[] for _ in texts]
        by_text: list[list[_Part]] = [[] for _ in texts]
        for part in parts:
            by_text[part.index].append(part)
        for i, own in enumerate(by_text):
            for j, part in enumerate(own):
                joined[i].append(part.out)
                if j < len(own) - 1:
                    sep = part.sep or " "
                    joined[i].append("" if route.no_space and "\n" not in sep else sep)
        results = [
            lead + "".join(pieces) + trail if pieces else text
            for text, lead, pieces, trail in zip(texts, leads, joined, trails, strict=True)
        ]
        slot.batches += 1
        self.stats.batches += 1
        self.stats.segments += len(texts)
        self.stats.last_generate_sizes = sizes
        log.debug(
            "local: %d segments (%d parts, %d generate calls) in %.0f ms",
            len(texts), len(parts), len(sizes), (time.perf_counter() - started) * 1000,
        )
        return results

    def _generate(self, route: _Route, texts: list[str]) -> list[str]:
        return self._generate_into(self.stats, route, texts)

    def _generate_into(self, stats: _Stats, route: _Route, texts: list[str]) -> list[str]:
        """Run ``texts`` through the route's model, each cut to its own bound, counted into
        ``stats`` (a warm-up's own: it may run on the on-demand thread beside a batch)."""
        slot = route.slot
        tokenizer = slot.tokenizer
        rows = tokenizer(
            [route.prefix + text for text in texts],
            truncation=True,
            max_length=self.config.max_input_tokens + 8,  # a safety net: split_text already bounds
        )["input_ids"]
        # Per segment: 1.5x its input + 10, so a looping segment cannot run to the batch's bound.
        caps = [min(math.ceil(1.5 * len(row)) + 10, slot.max_positions - 2) for row in rows]
        out = self._engine.generate(slot.loaded, tokenizer, rows, route.forced_bos, max(caps))
        stats.generate_calls += 1
        eos_ids = slot.loaded.eos_ids
        texts_out = []
        for row, cap in zip(out, caps, strict=True):
            ids = []
            for token in row[:cap]:
                if token in eos_ids:
                    break
                if token not in slot.drop_ids:
                    ids.append(token)
            stats.output_tokens += len(ids)
            texts_out.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
        return texts_out

    # -- loading -----------------------------------------------------------------------------

    def _load(self) -> bool:
        """Runs in the worker: load every checkpoint, warm up, then flip ``ready``. On failure
        ``reason`` says why (the caller logs it) and the answer is False."""
        started = time.perf_counter()
        try:
            slots = self._load_all()
        except _LoadError as exc:
            self.reason = str(exc)
            return False
        except Exception as exc:  # never let a bad checkpoint take the service down
            self.reason = f"loading model {self.model_id!r} failed: {first_line(exc)}"
            log.exception("local: loading %r failed", self.model_id)
            return False
        if self._closed:
            return False
        self._slots = slots
        self.load_s = round(time.perf_counter() - started, 2)
        self.reason = None
        self.ready = True
        log.info(
            "local: ready in %.1fs: %s (%s) on %s, %s/%s, %d languages",
            self.load_s, self.model_id, slots[0].family, self.engine_name, self.device,
            self.dtype, len(self.languages() or []),
        )
        return True

    def _load_all(self) -> list[_Slot]:
        try:
            return self._load_with(self._engine)
        except ConversionFailed as exc:
            # Under auto, a checkpoint CTranslate2 cannot take is still served, by torch.
            if self.config.engine != "auto" or find_spec("torch") is None:
                raise
            self.engine_note = f"ctranslate2 could not take the model ({exc}); using transformers"
            log.warning("local: %s", self.engine_note)
            self.engine_name = "transformers"
            self._engine = self._make_engine(self.engine_name)
            return self._load_with(self._engine)

    def _load_with(self, engine: engines.Engine) -> list[_Slot]:
        engine.prepare()
        self.device = engine.device
        self.dtype = engine.compute_type
        slots = []
        for spec in self._specs:
            if self._closed:
                raise _LoadError("the local backend was closed while loading")
            slots.append(self._load_slot(spec))
        for slot in slots:
            self._warm_up(slot)
        return slots

    def _load_slot(self, spec: _Spec) -> _Slot:
        from models.convert import is_converted, read_meta

        log.info("local: loading %s", spec.model_id)
        converted = is_converted(spec.model_id)
        # Without the hub at hand, load from the local cache only, at once: the hub
        # client's own retries take half a minute to give up on an unreachable hub.
        offline = not converted and _hub_unreachable(spec.model_id)
        try:
            from transformers import AutoConfig, AutoTokenizer

            # A converted directory's config.json is CTranslate2's; thinktrans-ct2.json keeps
            # what the checkpoint's said (absent: the tokenizer alone tells the family).
            config: Any = (SimpleNamespace(**read_meta(spec.model_id)) if converted
                           else AutoConfig.from_pretrained(spec.model_id,
                                                           local_files_only=offline))
            tokenizer = AutoTokenizer.from_pretrained(spec.model_id, local_files_only=offline)
        except ImportError as exc:  # e.g. a tokenizer that needs sentencepiece or protobuf
            raise _LoadError(
                f"loading {spec.model_id!r} needs {exc.name or 'a missing package'!r}: "
                "pip install 'thinktrans[local]'"
            ) from exc
        except Exception as exc:  # OSError, HFValidationError, hub HTTP errors, bad files
            if converted:
                raise _LoadError(
                    f"the CTranslate2 model {spec.model_id!r} lacks its tokenizer files "
                    f"({first_line(exc)}): convert it with `thinktrans convert`, which copies "
                    "them, or copy the checkpoint's tokenizer files beside model.bin"
                ) from exc
            raise _LoadError(not_found_reason(spec.model_id, exc, spec.setting)) from exc
        family = detect_family(config, tokenizer)
        if family is None:
            raise _LoadError(
                f"model {spec.model_id!r} is a {getattr(config, 'model_type', None)!r} checkpoint; "
                "the local backend runs NLLB-200, M2M-100 and Marian checkpoints "
                "(THINKTRANS_LOCAL_MODEL)"
            )
        if spec.marian_only and family != "marian":
            raise _LoadError(
                f"{spec.model_id!r} in THINKTRANS_LOCAL_MARIAN_MODELS is a {family} checkpoint, "
                "not a Marian one; name it in THINKTRANS_LOCAL_MODEL instead"
            )
        d_model = getattr(config, "d_model", None)
        if not isinstance(d_model, int):  # a directory converted by other tools
            d_model = 512 if family == "marian" else None  # opus-mt's; big ones say so
        loaded = self._engine.load(spec.model_id, tokenizer, offline=offline, converted=converted,
                                   d_model=d_model)
        if getattr(config, "thinktrans_test_checkpoint", False):
            # `thinktrans make-test-model` output: random weights, text in no language. The
            # output check stays on when a request named it: it is on for the configured ones.
            if not spec.on_demand:
                self.capabilities = replace(self.capabilities, checked_output=False)
            log.warning("local: %r is a random-weight test checkpoint; its output is noise",
                        spec.model_id)
        slot = _Slot(
            model_id=spec.model_id,
            family=family,
            tokenizer=tokenizer,
            loaded=loaded,
            codes={},
            max_positions=int(getattr(config, "max_position_embeddings", 1024) or 1024),
            version=_version(spec.model_id),
        )
        drop = set(tokenizer.all_special_ids)
        if family == "nllb":
            vocab = tokenizer.get_vocab()
            slot.codes = {key: code for key, code in NLLB_CODES.items() if code in vocab}
            drop.update(i for token, i in vocab.items() if _FLORES.match(token))
        elif family == "m2m100":
            known = tokenizer.lang_code_to_id
            slot.codes = {key: code for key, code in M2M_CODES.items() if code in known}
            drop.update(known.values())
        else:
            slot.source, slot.codes = _marian_pair(spec, tokenizer)
        slot.drop_ids = frozenset(drop)
        if not slot.codes:
            raise _LoadError(
                f"model {spec.model_id!r} ({family}) has none of the languages in the local "
                "backend's table; choose another checkpoint (THINKTRANS_LOCAL_MODEL)"
            )
        return slot

    def _warm_up(self, slot: _Slot) -> None:
        """One tiny generate, so that the first real batch does not pay for lazy setup."""
        target = next((k for k in slot.codes if k != FALLBACK_SOURCE), next(iter(slot.codes)))
        source = slot.source or FALLBACK_SOURCE
        src_code = None
        forced = None
        if slot.family != "marian":
            src_code = slot.codes.get(source) or next(iter(slot.codes.values()))
            forced = _lang_token_id(slot, slot.codes[target])
        prefix = slot.codes[target] if slot.family == "marian" else ""
        route = _Route(slot, src_code, forced, prefix, False)
        if src_code is not None:
            slot.tokenizer.src_lang = src_code
        self._generate_into(_Stats(), route, ["Hello."])


def _version(model_id: str) -> str:
    """A checkpoint directory's fingerprint (models.convert); "" for a hub id."""
    from models.convert import directory_fingerprint

    path = Path(model_id).expanduser()
    return directory_fingerprint(path) if path.is_dir() else ""


def detect_family(config: Any, tokenizer: Any) -> str | None:
    """``nllb``, ``m2m100`` or ``marian`` from a checkpoint's config and tokenizer, else None."""
    model_type = getattr(config, "model_type", None)
    if model_type == "marian":
        return "marian"
    if model_type is None and type(tokenizer).__name__.startswith("Marian"):
        return "marian"  # a converted model without thinktrans-ct2.json: the tokenizer tells
    if model_type not in ("m2m_100", "nllb-moe", None):
        return None
    # NLLB checkpoints say model_type m2m_100 too; the tokenizer tells them apart.
    name = type(tokenizer).__name__
    if name.startswith("Nllb"):
        return "nllb"
    if hasattr(tokenizer, "lang_code_to_id") and hasattr(tokenizer, "get_lang_id"):
        return "m2m100"
    if "eng_Latn" in tokenizer.get_vocab():  # a generic fast tokenizer with flores tokens
        return "nllb"
    return None


def _lang_token_id(slot: _Slot, code: str) -> int:
    if slot.family == "m2m100":
        return int(slot.tokenizer.get_lang_id(code))
    return int(slot.tokenizer.convert_tokens_to_ids(code))


def _route_on(slot: _Slot, src: str, tgt: str, no_space: bool) -> _Route | None:
    """How ``slot`` serves ``src -> tgt``, or None: Marian serves its own pairs only, NLLB and
    M2M every target they have, from any source (an unknown one read as English)."""
    if tgt not in slot.codes:
        return None
    if slot.family == "marian":
        return _Route(slot, None, None, slot.codes[tgt], no_space) if slot.source == src else None
    src_code = slot.codes.get(src) or slot.codes.get(FALLBACK_SOURCE)
    if src_code is None:  # a model without English: any code of its own will do
        src_code = next(iter(slot.codes.values()))
    return _Route(slot, src_code, _lang_token_id(slot, slot.codes[tgt]), "", no_space)


def _served(slots: Sequence[_Slot]) -> str:
    """What ``slots`` serve, for a reason: their targets, and the Marian pairs."""
    served = sorted({key for slot in slots for key in slot.codes})
    pairs = [f"{s.source}-{t}" for s in slots if s.family == "marian" for t in s.codes]
    shown = ", ".join(served[:12]) + (", ..." if len(served) > 12 else "")
    what = f"{len(served)} targets ({shown})"
    if pairs:
        what += f"; Marian pairs {', '.join(pairs)}"
    return what


def _marian_pair(spec: _Spec, tokenizer: Any) -> tuple[str, dict[str, str]]:
    """The (source key, {target key: prefix}) of a Marian checkpoint; see the module docstring."""
    pair = spec.pair
    if pair is None:
        saved = tokenizer.init_kwargs
        pair = _pair_from(saved.get("source_lang"), saved.get("target_lang"))
    if pair is None:
        match = _OPUS_NAME.search(spec.model_id.rstrip("/"))
        pair = _pair_from(match["src"], match["tgt"]) if match else None
    multi = getattr(tokenizer, "supported_language_codes", None) or []
    if multi:  # ">>fra<<" tokens: one checkpoint, several targets
        targets: dict[str, str] = {}
        for token in multi:
            key = _key_or_none(token[2:-2].replace("_", "-"))
            if key in NLLB_CODES:  # a language of this backend's table
                targets.setdefault(key, token)
        if pair is not None and pair[1] in targets:
            targets = {pair[1]: targets[pair[1]]}
        source = pair[0] if pair is not None else FALLBACK_SOURCE
        return source, targets
    if pair is None:
        raise _LoadError(
            f"cannot tell the language pair of Marian checkpoint {spec.model_id!r}: write it as "
            f"'en-de={spec.model_id}' in THINKTRANS_LOCAL_MODEL or THINKTRANS_LOCAL_MARIAN_MODELS"
        )
    return pair[0], {pair[1]: ""}


def _pair_from(source: object, target: object) -> tuple[str, str] | None:
    if not isinstance(source, str) or not isinstance(target, str):
        return None
    src, tgt = _key_or_none(source), _key_or_none(target)
    if src is None or tgt is None:
        return None
    return src, tgt
