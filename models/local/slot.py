"""One checkpoint loaded on an engine (a ``Slot``), and running texts through it.

``load_slot`` turns a checkpoint into a slot the engine has loaded; ``translate_batch`` runs
a batch of texts on one pair of a slot: cut to fit the model, sorted by length into padded
slices, each output bounded, put back in order and rejoined, protected spans kept. It is
the one place the engines' errors become the backend's. Everything here runs on the
backend's threads, never on the event loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from models.base import first_line
from models.errors import BackendError, BackendUnavailable
from models.local.checkpoint import (
    FALLBACK_SOURCE,
    LoadError,
    Spec,
    detect_family,
    lang_token_id,
    language_codes,
    not_found_reason,
    version,
)
from models.local.convert import is_converted, read_meta
from models.local.engines import Biasing, Engine, Loaded, check_stopped
from models.local.masking import FALLBACK, MASKED, SpanBatch, form_for
from models.local.pieces import Keep, cut_texts, rejoin
from models.spans import Protected

log = logging.getLogger(__name__)

# Padded input tokens per generate call; a larger batch is cut into length-sorted slices.
MAX_BATCH_TOKENS = 8192


@dataclass
class Slot:
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
    specials: int = 2  # tokens the tokenizer adds to an input (NLLB: its language and </s>)
    test_checkpoint: bool = False  # `thinktrans make-test-model` output: its text is noise
    batches: int = 0  # batches run on it (the worker thread alone writes it)

    @property
    def model(self) -> Any:
        return self.loaded.model

    def input_bound(self, max_input_tokens: int) -> int:
        """The most tokens a part of a text may have here: ``max_input_tokens`` (the
        setting), within the model's positions less the special tokens added to it. A part
        past the positions fails its whole batch (CTranslate2: "no position encodings")."""
        return max(1, min(max_input_tokens, self.max_positions - self.specials))


@dataclass(frozen=True)
class Route:
    """How one (source, target) is served: which checkpoint, which codes."""

    slot: Slot
    src_code: str | None  # NLLB/M2M source code
    forced_bos: int | None  # NLLB/M2M target token
    prefix: str  # Marian multi-target token
    no_space: bool  # rejoin split parts without spaces


@dataclass
class Stats:
    batches: int = 0
    segments: int = 0
    generate_calls: int = 0
    split_segments: int = 0
    output_tokens: int = 0  # generated, as kept (before EOS, within the bound)
    biased_rows: int = 0  # preview rows sent to be decoded towards their previous preview
    last_generate_sizes: list[int] = field(default_factory=list)
    # Texts with protected spans: kept by their placeholders, or by translating their runs.
    spans_masked: int = 0
    spans_fallback: int = 0


# -- loading -----------------------------------------------------------------------------------


def load_slot(engine: Engine, spec: Spec, offline: bool) -> Slot:
    """Load ``spec``'s checkpoint on ``engine`` (prepared), from the local cache only when
    ``offline`` (``cache_only``: the hub client's own retries take half a minute to give up
    on a hub that cannot serve); LoadError says why it cannot."""
    log.info("local: loading %s", spec.model_id)
    converted = is_converted(spec.model_id)
    config, tokenizer = _config_and_tokenizer(spec, converted, offline)
    family = detect_family(config, tokenizer)
    if family is None:
        raise LoadError(
            f"model {spec.model_id!r} is a {getattr(config, 'model_type', None)!r} checkpoint; "
            "the local backend runs NLLB-200, M2M-100 and Marian checkpoints "
            "(THINKTRANS_LOCAL_MODEL)"
        )
    if spec.marian_only and family != "marian":
        raise LoadError(
            f"{spec.model_id!r} in THINKTRANS_LOCAL_MARIAN_MODELS is a {family} checkpoint, "
            "not a Marian one; name it in THINKTRANS_LOCAL_MODEL instead"
        )
    d_model = getattr(config, "d_model", None)
    if not isinstance(d_model, int):  # a directory converted by other tools
        d_model = 512 if family == "marian" else None  # opus-mt's; big ones say so
    loaded = engine.load(spec.model_id, tokenizer, offline=offline, converted=converted,
                         d_model=d_model)
    test_checkpoint = bool(getattr(config, "thinktrans_test_checkpoint", False))
    if test_checkpoint:
        log.warning("local: %r is a random-weight test checkpoint; its output is noise",
                    spec.model_id)
    source, codes, drop_ids = language_codes(family, spec, tokenizer)
    if not codes:
        raise LoadError(
            f"model {spec.model_id!r} ({family}) has none of the languages in the local "
            "backend's table; choose another checkpoint (THINKTRANS_LOCAL_MODEL)"
        )
    return Slot(
        model_id=spec.model_id, family=family, tokenizer=tokenizer, loaded=loaded,
        codes=codes, source=source, drop_ids=drop_ids, version=version(spec.model_id),
        max_positions=int(getattr(config, "max_position_embeddings", 1024) or 1024),
        specials=_specials(tokenizer), test_checkpoint=test_checkpoint,
    )


def _specials(tokenizer: Any) -> int:
    """How many special tokens the tokenizer adds to one input (2 if it cannot say)."""
    try:
        return int(tokenizer.num_special_tokens_to_add())
    except Exception:  # a tokenizer without the method, or one that fails on it
        return 2


def _config_and_tokenizer(spec: Spec, converted: bool, offline: bool) -> tuple[Any, Any]:
    try:
        from transformers import AutoConfig, AutoTokenizer

        # A converted directory's config.json is CTranslate2's; thinktrans-ct2.json keeps
        # what the checkpoint's said (absent: the tokenizer alone tells the family).
        config: Any = (SimpleNamespace(**read_meta(spec.model_id)) if converted
                       else AutoConfig.from_pretrained(spec.model_id, local_files_only=offline))
        tokenizer = AutoTokenizer.from_pretrained(spec.model_id, local_files_only=offline)
    except ImportError as exc:  # e.g. a tokenizer that needs sentencepiece or protobuf
        raise LoadError(
            f"loading {spec.model_id!r} needs {exc.name or 'a missing package'!r}: "
            "pip install 'thinktrans[local]'"
        ) from exc
    except Exception as exc:  # OSError, HFValidationError, hub HTTP errors, bad files
        if converted:
            raise LoadError(
                f"the CTranslate2 model {spec.model_id!r} lacks its tokenizer files "
                f"({first_line(exc)}): convert it with `thinktrans convert`, which copies "
                "them, or copy the checkpoint's tokenizer files beside model.bin"
            ) from exc
        raise LoadError(not_found_reason(spec.model_id, exc, spec.setting)) from exc
    return config, tokenizer


def warm_up(engine: Engine, slot: Slot, max_input_tokens: int) -> None:
    """One tiny generate, so that the first real batch does not pay for lazy setup."""
    target = next((k for k in slot.codes if k != FALLBACK_SOURCE), next(iter(slot.codes)))
    source = slot.source or FALLBACK_SOURCE
    src_code = None
    forced = None
    if slot.family != "marian":
        src_code = slot.codes.get(source) or next(iter(slot.codes.values()))
        forced = lang_token_id(slot.family, slot.tokenizer, slot.codes[target])
    prefix = slot.codes[target] if slot.family == "marian" else ""
    if src_code is not None:
        slot.tokenizer.src_lang = src_code
    # Its own stats: it may run on the on-demand thread beside a batch.
    generate(engine, Route(slot, src_code, forced, prefix, False), ["Hello."],
             max_input_tokens, Stats())


# -- a batch -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bias:
    """A preview's decoding towards its sentence's previous previews: per text the one
    shown (or None), and ``prefix_bias_beta``; ``of`` answers None for an index outside."""

    previous: Sequence[str | None]
    beta: float

    def of(self, indices: Sequence[int]) -> list[str | None]:
        """The previous preview of each text at ``indices`` (None past the list)."""
        return [self.previous[i] if 0 <= i < len(self.previous) else None for i in indices]


def translate_batch(engine: Engine, route: Route, texts: list[str], max_input_tokens: int,
                    stats: Stats, protected: Sequence[Protected | None] | None = None,
                    strategy: str = "mask", bias: Bias | None = None) -> list[str]:
    """Split, sort by length, generate in slices, restore the order, rejoin; texts with
    ``protected`` spans masked (``strategy`` "mask") or sent as their runs ("runs"); a
    preview's whole texts biased towards their previous previews (``bias``)."""
    return translate_kept(engine, route, texts, max_input_tokens, stats, protected,
                          strategy, bias)[0]


def translate_kept(engine: Engine, route: Route, texts: list[str], max_input_tokens: int,
                   stats: Stats, protected: Sequence[Protected | None] | None = None,
                   strategy: str = "mask", bias: Bias | None = None
                   ) -> tuple[list[str], list[str | None]]:
    """``translate_batch``'s translations, and per text how its spans were kept
    (``MASKED``, ``FALLBACK``, None: it had none). The one place the engines' errors
    (torch's, transformers', CTranslate2's) become the backend's."""
    if bias is not None and (bias.beta <= 0 or not any(bias.previous)):
        bias = None
    max_input_tokens = route.slot.input_bound(max_input_tokens)
    try:
        return _translate_batch(engine, route, texts, max_input_tokens, stats, protected,
                                strategy, bias)
    except BackendError:
        raise
    except Exception as exc:
        if type(exc).__name__ == "OutOfMemoryError":
            raise BackendUnavailable(
                f"out of memory on {engine.device} for a batch of {len(texts)}: lower "
                "THINKTRANS_MAX_BATCH_SIZE or THINKTRANS_LOCAL_MAX_INPUT_TOKENS"
            ) from exc
        raise BackendError(
            f"the local model failed on a batch of {len(texts)}: {first_line(exc)}"
        ) from exc


def _translate_batch(engine: Engine, route: Route, texts: list[str], max_input_tokens: int,
                     stats: Stats, protected: Sequence[Protected | None] | None,
                     strategy: str, bias: Bias | None) -> tuple[list[str], list[str | None]]:
    started = time.perf_counter()
    sizes: list[int] = []
    if protected is None or not any(p is not None and p.spans for p in protected):
        results = _translate(engine, route, texts, max_input_tokens, stats, sizes, None, bias)
        kept: list[str | None] = [None] * len(texts)
    else:
        batch = SpanBatch(texts, protected,
                          form_for(route.slot.family) if strategy == "mask" else None)
        # Only the texts without spans go biased: they go first, as they are. A placeholder's
        # place in the previous preview is not known, nor is a run's share of it.
        first_bias = None if bias is None else Bias(batch.plain_in_first(bias.previous),
                                                    bias.beta)
        first = _translate(engine, route, batch.first, max_input_tokens, stats, sizes,
                           batch.first_keep, first_bias)
        second = batch.settle(first)
        results = batch.finish(
            _translate(engine, route, second, max_input_tokens, stats, sizes) if second else [])
        kept = batch.outcomes
        stats.spans_masked += batch.count(MASKED)
        stats.spans_fallback += batch.count(FALLBACK)
    route.slot.batches += 1
    stats.batches += 1
    stats.segments += len(texts)
    stats.last_generate_sizes = sizes
    log.debug(
        "local: %d segments (%d generate calls) in %.0f ms",
        len(texts), len(sizes), (time.perf_counter() - started) * 1000,
    )
    return results, kept


def _translate(engine: Engine, route: Route, texts: list[str], max_input_tokens: int,
               stats: Stats, sizes: list[int], keep: Sequence[Keep] | None = None,
               bias: Bias | None = None) -> list[str]:
    """One engine call: the texts cut into parts (never inside a stretch of ``keep``),
    longest first in slices, each slice's size added to ``sizes``; the texts rejoined. A text
    left whole goes biased towards its previous preview (``bias``); a text cut, unbiased, as a
    part's share of the previous preview is not known."""
    slot = route.slot
    tokenizer = slot.tokenizer
    if route.src_code is not None:
        tokenizer.src_lang = route.src_code  # safe: one thread runs the batches

    def count(text: str) -> int:
        return len(tokenizer(route.prefix + text, add_special_tokens=False)["input_ids"])

    pieces = cut_texts(texts, count, max_input_tokens, keep)
    stats.split_segments += pieces.split
    if bias is not None:
        parts_of = Counter(part.index for part in pieces.parts)
        whole = [i if parts_of[i] == 1 else -1 for i in range(len(texts))]
        bias = Bias(bias.of(whole), bias.beta)
    # Longest first, so that each slice pads little and the slow one starts early.
    order = sorted(pieces.parts, key=lambda part: part.n_tokens, reverse=True)
    start = 0
    while start < len(order):
        check_stopped()  # a preview told to stop goes no further
        longest = order[start].n_tokens + 4
        size = max(1, min(len(order) - start, MAX_BATCH_TOKENS // max(longest, 1)))
        chunk = order[start : start + size]
        outputs = generate(engine, route, [part.text for part in chunk], max_input_tokens, stats,
                           None if bias is None else bias.of([part.index for part in chunk]),
                           0.0 if bias is None else bias.beta)
        for part, out in zip(chunk, outputs, strict=True):
            part.out = out
        sizes.append(size)
        start += size
    return rejoin(pieces, route.no_space)


def generate(engine: Engine, route: Route, texts: list[str], max_input_tokens: int,
             stats: Stats, previous: Sequence[str | None] | None = None,
             beta: float = 0.0) -> list[str]:
    """Run ``texts`` through the route's model in one engine call, each output cut to its
    own bound (1.5 x its input + 10 tokens, so that a looping segment cannot run to the
    batch's bound), counted into ``stats``; a text with a ``previous`` preview decoded
    towards it when ``beta`` > 0."""
    slot = route.slot
    tokenizer = slot.tokenizer
    rows = tokenizer(
        [route.prefix + text for text in texts],
        truncation=True,
        # A safety net: split_text already bounds each part, and nothing goes past positions.
        max_length=min(max_input_tokens + 8, slot.max_positions),
    )["input_ids"]
    caps = [min(math.ceil(1.5 * len(row)) + 10, slot.max_positions - 2) for row in rows]
    prefixes = _target_ids(slot, previous) if beta > 0 and previous else None
    if prefixes is not None and any(prefixes) and isinstance(engine, Biasing):
        stats.biased_rows += sum(map(bool, prefixes))
        out = engine.generate_biased(slot.loaded, tokenizer, rows, route.forced_bos,
                                     max(caps), prefixes, beta)
    else:
        out = engine.generate(slot.loaded, tokenizer, rows, route.forced_bos, max(caps))
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


def _target_ids(slot: Slot, previous: Sequence[str | None]) -> list[list[int] | None]:
    """Each previous preview as target-side token ids, no special tokens (the engine puts the
    language token first itself); None for a text without one. Marian has a target
    sentencepiece model of its own; NLLB and M2M-100 share theirs."""
    texts = [(text or "").strip() for text in previous]
    wanted = [text for text in texts if text]
    if not wanted:
        return [None] * len(texts)
    tokenizer = slot.tokenizer
    if slot.family == "marian":
        ids = tokenizer(text_target=wanted, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(wanted, add_special_tokens=False)["input_ids"]
    found = iter(ids)
    out: list[list[int] | None] = []
    for text in texts:
        kept = [int(i) for i in next(found) if i not in slot.drop_ids] if text else []
        out.append(kept or None)
    return out
