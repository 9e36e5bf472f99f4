"""The two engines the local backend runs a checkpoint on: transformers + torch, or CTranslate2.

An engine only loads the weights and turns a batch of token ids into generated ids; the rest
of the backend owns everything around the model (tokenizer, languages, splitting, bounds,
decoding to text), so that both engines behave alike and either can be chosen per
deployment. ``auto`` prefers CTranslate2: on CPU its int8 model is several times faster than
torch in float32 and takes less than half the memory (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from models.errors import MissingExtra, Stopped
from models.local.checkpoint import LoadError, not_found_reason
from models.local.convert import (
    ConversionError,
    cached_conversion,
    default_cache_dir,
    sweep_debris,
)

log = logging.getLogger(__name__)

ENGINES = ("auto", "ctranslate2", "transformers")
# Models this narrow (Marian) run a batch's parts on single-threaded workers; see CT2Engine.
SMALL_D_MODEL = 512
COMPUTE_TYPES = (
    "auto", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
    "float16", "bfloat16", "float32",
)


class ConversionFailed(LoadError):
    """Converting a checkpoint for CTranslate2 failed; under ``auto`` the backend then falls
    back to transformers."""


@dataclass(frozen=True)
class EngineOptions:
    """What the engines read from the local backend's settings (``LocalConfig.engine_options``;
    the defaults are the settings')."""

    device: str  # auto, cpu, cuda, cuda:N
    dtype: str  # transformers: auto, float32, float16, bfloat16
    compute_type: str  # ctranslate2: auto (int8 on CPU, int8_float16 on CUDA), ...
    threads: int | None  # CPU threads; None: the library's default
    ct2_workers: int | None  # ctranslate2: parts of a batch run at once; None: by size
    num_beams: int
    no_repeat_ngram_size: int  # 0: off
    ct2_cache: Path | None  # where checkpoints are converted to; None: beside the HF cache
    ct2_cache_bytes: int | None  # the conversion cache's bound; None: unbounded


@dataclass
class Loaded:
    """One loaded checkpoint as an engine holds it."""

    model: Any
    eos_ids: frozenset[int]
    suppress: list[list[str]] | None = None  # ctranslate2: token sequences never generated
    min_length: int = 0  # ctranslate2: the checkpoint's min_new_tokens
    workers: int = 1  # ctranslate2: a batch is cut into this many parts, run at once
    path: Path | None = None  # ctranslate2: the converted directory it was loaded from


class Engine(Protocol):
    """What the backend asks of an engine. Both honour the checkpoint's generation config
    (banned tokens, a minimum length), the beam width and ``no_repeat_ngram_size``, so that
    in float32 they give the same greedy output; both run in the backend's worker thread."""

    name: str
    device: str | None
    compute_type: str | None
    threads: int | None  # CPU threads in all, once prepared

    def prepare(self) -> None:
        """Resolve the device and the compute type, and import the engine."""

    def load(self, model_id: str, tokenizer: Any, *, offline: bool, converted: bool,
             d_model: int | None = None) -> Loaded:
        """Load one checkpoint."""

    def generate(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                 forced: int | None, max_new: int) -> list[list[int]]:
        """Per row, the generated ids after the decoder start token, the ``forced`` language
        token first when there is one, at most ``max_new`` of them."""


@runtime_checkable
class Biasing(Protocol):
    """An engine that decodes rows towards a prefix of their own (``CT2Engine``)."""

    def generate_biased(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                        forced: int | None, max_new: int,
                        previous: Sequence[Sequence[int] | None], bias: float
                        ) -> list[list[int]]: ...


# The stop signal of the preview job this thread decodes (``stopping``); None: no preview.
_STOP = threading.local()


@contextmanager
def stopping(event: threading.Event | None) -> Iterator[None]:
    """While it holds, this thread's decodes end early once ``event`` is set, raising
    ``Stopped`` (a preview job: segments came to wait for the worker); None: they run to
    their end. transformers stops any decode (a stopping criterion); CTranslate2 greedy ones
    only, as its step callback is called with one beam alone, so a biased preview (beams)
    runs to its end."""
    _STOP.event = event
    try:
        yield
    finally:
        _STOP.event = None


def stop_signal() -> threading.Event | None:
    """The stop signal of the job this thread decodes (``stopping``), or None."""
    event: threading.Event | None = getattr(_STOP, "event", None)
    return event


def check_stopped() -> None:
    """Stopped when this thread's preview has been told to stop."""
    event = stop_signal()
    if event is not None and event.is_set():
        raise Stopped("the preview's decode stopped: segments came to wait for the backend")


# The CTranslate2 models loaded in this process and not yet freed (a slot the catalog drops
# is freed): the conversion cache's bound never removes their directories.
_LOADED: weakref.WeakValueDictionary[int, Loaded] = weakref.WeakValueDictionary()


def resolve(engine: str) -> str:
    """``auto`` -> ``ctranslate2`` where it is installed, else ``transformers``."""
    if engine == "auto":
        return "ctranslate2" if find_spec("ctranslate2") is not None else "transformers"
    return engine


def required_packages(engine: str) -> tuple[str, ...]:
    """What serving needs; converting a checkpoint for CTranslate2 also needs torch."""
    if engine == "ctranslate2":
        return ("ctranslate2", "transformers", "sentencepiece")
    return ("torch", "transformers", "sentencepiece")


def require_packages(engine: str) -> None:
    """MissingExtra naming the extra to install when a package ``engine`` needs is missing;
    checked with ``find_spec``, so that nothing is imported."""
    extra = "ct2" if engine == "ctranslate2" else "local"
    for module in required_packages(engine):
        if find_spec(module) is None:
            raise MissingExtra(
                f"the local backend's {engine} engine needs {module!r}: pip install "
                f"'thinktrans[{extra}]'",
                name=module, extra=extra,
            )


def build(engine: str, options: EngineOptions) -> Engine:
    return CT2Engine(options) if engine == "ctranslate2" else TransformersEngine(options)


def _eos_ids(value: object, fallback: int | None) -> frozenset[int]:
    ids = value if isinstance(value, list) else [value]
    found = frozenset(int(i) for i in ids if isinstance(i, int))
    return found or frozenset({fallback} if fallback is not None else ())


class TransformersEngine:
    """``AutoModelForSeq2SeqLM`` on torch, on CPU (float32) or CUDA (bfloat16/float16)."""

    name = "transformers"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.device: str | None = None
        self.compute_type: str | None = None
        self.threads: int | None = None
        self._dtype: Any = None

    def prepare(self) -> None:
        try:
            import torch
            import transformers  # noqa: F401
        except ImportError as exc:
            raise LoadError(
                f"the local backend cannot import {exc.name!r}: pip install 'thinktrans[local]'"
            ) from exc
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        self.threads = torch.get_num_threads()
        setting = self.options.device.strip().lower()
        if setting == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        elif setting.startswith("cuda") and not torch.cuda.is_available():
            raise LoadError(
                f"local_device {self.options.device!r} asks for CUDA, which this machine lacks: "
                "set THINKTRANS_LOCAL_DEVICE=auto or cpu"
            )
        else:
            self.device = setting
        if self.options.dtype == "auto":
            if self.device.startswith("cuda"):
                bf16 = torch.cuda.is_bf16_supported()
                self._dtype = torch.bfloat16 if bf16 else torch.float16
            else:
                self._dtype = torch.float32
        else:
            if self.options.dtype == "float16" and self.device == "cpu":
                log.warning("local: float16 on CPU is slow and lossy; float32 is the CPU default")
            self._dtype = getattr(torch, self.options.dtype)
        self.compute_type = str(self._dtype).removeprefix("torch.")

    def load(self, model_id: str, tokenizer: Any, *, offline: bool, converted: bool,
             d_model: int | None = None) -> Loaded:
        from transformers import AutoModelForSeq2SeqLM

        if converted:
            raise LoadError(
                f"{model_id!r} is a CTranslate2 model directory; set THINKTRANS_LOCAL_ENGINE="
                "ctranslate2 (or auto, with 'thinktrans[ct2]' installed) to serve it, or name "
                "the original checkpoint"
            )
        try:
            model = AutoModelForSeq2SeqLM.from_pretrained(model_id, dtype=self._dtype,
                                                          local_files_only=offline)
        except (OSError, ValueError) as exc:  # weights missing or not a seq2seq model
            raise LoadError(not_found_reason(model_id, exc)) from exc
        model = model.to(self.device).eval()
        eos = _eos_ids(model.generation_config.eos_token_id, tokenizer.eos_token_id)
        return Loaded(model=model, eos_ids=eos)

    def generate(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                 forced: int | None, max_new: int) -> list[list[int]]:
        import torch

        batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "num_beams": self.options.num_beams,
            "do_sample": False,
            "no_repeat_ngram_size": self.options.no_repeat_ngram_size,
        }
        if forced is not None:
            kwargs["forced_bos_token_id"] = forced
        if (stop := stop_signal()) is not None:
            kwargs["stopping_criteria"] = _stopping_criteria(stop)
        batch = batch.to(loaded.model.device)
        with torch.inference_mode():
            out = loaded.model.generate(**batch, **kwargs)
        check_stopped()
        return [row[1:] for row in out.tolist()]  # row[0] is the decoder start token


class CT2Engine:
    """A CTranslate2 ``Translator``: int8 on CPU, int8_float16 on CUDA by default.

    ``load`` takes a converted directory as it is, and converts a checkpoint (directory or hub
    id) once into the cache (models/local/convert.py).

    CPU threads: a large model (NLLB, M2M-100) runs a batch on all ``threads`` at once; a small
    one (``d_model`` <= 512: Marian) gets as many single-threaded workers, each taking a part of
    the batch, as its matrices are too small to share among threads. On 2 cores the Marian shape
    ran a batch of 8 1.5x faster that way, NLLB-600M's at the same speed but its batches of 1
    1.45x slower (docs/benchmarks.md). ``ct2_workers`` overrides the choice.
    """

    name = "ctranslate2"

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.device: str | None = None
        self.device_index = 0
        self.compute_type: str | None = None
        self.threads: int | None = None

    @property
    def cache_dir(self) -> Path:
        return self.options.ct2_cache or default_cache_dir()

    @staticmethod
    def in_use() -> set[Path]:
        """The converted directories of the models loaded in this process, on any engine."""
        return {loaded.path for loaded in list(_LOADED.values()) if loaded.path is not None}

    def prepare(self) -> None:
        if self.cache_dir.is_dir():
            sweep_debris(self.cache_dir)  # what a conversion killed last time left
        try:
            import ctranslate2
        except ImportError as exc:
            raise LoadError(
                "the local backend's ctranslate2 engine cannot import 'ctranslate2': pip install "
                "'thinktrans[ct2]', or set THINKTRANS_LOCAL_ENGINE=transformers"
            ) from exc
        setting = self.options.device.strip().lower()
        gpus = ctranslate2.get_cuda_device_count()
        if setting == "auto":
            self.device = "cuda" if gpus > 0 else "cpu"
        elif setting.startswith("cuda"):
            if gpus == 0:
                raise LoadError(
                    f"local_device {self.options.device!r} asks for CUDA, which this machine (or "
                    "this ctranslate2 build) lacks: set THINKTRANS_LOCAL_DEVICE=auto or cpu"
                )
            self.device = "cuda"
            _, _, index = setting.partition(":")
            self.device_index = int(index) if index.isdigit() else 0
        else:
            self.device = setting
        supported = ctranslate2.get_supported_compute_types(self.device)
        wanted = self.options.compute_type
        if wanted == "auto":
            choices = ("int8_float16", "float16", "int8", "float32") if self.device == "cuda" \
                else ("int8", "int8_float32", "float32")
            wanted = next((c for c in choices if c in supported), "float32")
        elif wanted not in supported:
            raise LoadError(
                f"local_compute_type {wanted!r} is not supported on {self.device} by this "
                f"ctranslate2 build; choose one of {', '.join(sorted(supported))}"
            )
        self.compute_type = wanted
        # CTranslate2's own default: the cores this process may use, at most 4.
        self.threads = self.options.threads or min(4, len(os.sched_getaffinity(0)) or 1)
        if wanted.startswith("int8") and os.environ.get("CT2_USE_MKL", "") in ("1", "ON", "on",
                                                                                "true"):
            if cpuinfo("vendor_id") == "AuthenticAMD":
                log.warning(
                    "local: CT2_USE_MKL=1 on an AMD CPU: int8 runs many times slower with MKL "
                    "there; unset CT2_USE_MKL to use the default backend"
                )

    def load(self, model_id: str, tokenizer: Any, *, offline: bool, converted: bool,
             d_model: int | None = None) -> Loaded:
        import ctranslate2

        if converted:
            path = Path(model_id).expanduser()
        else:
            try:
                path = cached_conversion(
                    model_id, quantization=self.compute_type or "int8",
                    cache_dir=self.cache_dir, offline=offline,
                    max_bytes=self.options.ct2_cache_bytes, in_use=self.in_use(),
                )
            except ConversionError as exc:
                raise ConversionFailed(str(exc)) from exc
        threads = self.threads or 1
        workers = self.options.ct2_workers or (
            threads if d_model is not None and d_model <= SMALL_D_MODEL else 1)
        if self.device != "cpu":
            workers = 1  # one GPU runs one batch at a time best
        workers = min(workers, threads)
        try:
            translator = ctranslate2.Translator(
                str(path), device=self.device or "cpu", device_index=self.device_index,
                compute_type=self.compute_type or "default", inter_threads=workers,
                intra_threads=max(1, threads // workers),
            )
        except (RuntimeError, ValueError, OSError) as exc:
            raise LoadError(f"CTranslate2 cannot load {str(path)!r}: {exc}") from exc
        generation = _generation_config(path)
        banned = generation.get("bad_words_ids") or []
        # Tokens CTranslate2's vocabulary lacks (Marian's <pad>, the decoder start) cannot
        # be generated anyway, and naming them is an error.
        vocabulary = _target_vocabulary(path)
        suppress = []
        for seq in banned:
            tokens = tokenizer.convert_ids_to_tokens(list(seq)) if seq else []
            if tokens and all(token in vocabulary for token in tokens):
                suppress.append(tokens)
        eos = _eos_ids(generation.get("eos_token_id"), tokenizer.eos_token_id)
        loaded = Loaded(
            model=translator, eos_ids=eos, suppress=suppress or None,
            min_length=int(generation.get("min_new_tokens") or 0), workers=workers,
            path=path if not converted else None,
        )
        _LOADED[id(loaded)] = loaded
        return loaded

    def generate(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                 forced: int | None, max_new: int) -> list[list[int]]:
        return self.generate_biased(loaded, tokenizer, rows, forced, max_new, (), 0.0)

    def generate_biased(self, loaded: Loaded, tokenizer: Any, rows: list[list[int]],
                        forced: int | None, max_new: int,
                        previous: Sequence[Sequence[int] | None], bias: float
                        ) -> list[list[int]]:
        """Decode ``rows``; those with a ``previous`` (when ``bias`` > 0) biased towards it.

        A biased row's target prefix is the language token (when ``forced``) and then its
        previous preview's tokens; ``prefix_bias_beta`` = ``bias`` mixes each step's
        distribution with that prefix, ``(1 - bias) * p + bias * prefix``, until a beam leaves
        it, so a preview keeps to the words shown before while its model disagrees little,
        and departs where it disagrees strongly (Arivazhagan et al. 2020, sec. 4.2). Biasing
        needs beam search: such rows decode with ``max(2, num_beams)`` beams. As the prefix
        is then a bias, not forced, the language token is too: a hypothesis that does not
        start with it is passed over, and a row none of whose hypotheses does decodes
        unbiased. The other rows decode as ever (in a call of their own, since the bias is
        per call), so a preview's output equals a segment's decode when it has no previous.
        """
        source = [tokenizer.convert_ids_to_tokens(row) for row in rows]
        lead = [] if forced is None else [tokenizer.convert_ids_to_tokens(forced)]
        # Each previous preview within the bound, with room for one token after it.
        room = max(1, max_new - len(lead) - 1)
        wanted = {i: list(ids[:room]) for i, ids in enumerate(previous) if ids and bias > 0}
        biased = list(wanted)
        out: list[list[str] | None] = [None] * len(rows)
        if biased:
            prefixes = [lead + tokenizer.convert_ids_to_tokens(wanted[i]) for i in biased]
            found = self._decode(loaded, [source[i] for i in biased], prefixes, max_new,
                                 max(2, self.options.num_beams), bias)
            for i, hypotheses in zip(biased, found, strict=True):
                out[i] = next((h for h in hypotheses if h[: len(lead)] == lead), None)
        plain = [i for i, tokens in enumerate(out) if tokens is None]
        if plain:
            found = self._decode(loaded, [source[i] for i in plain],
                                 [lead for _ in plain] if lead else None, max_new,
                                 self.options.num_beams, 0.0)
            for i, hypotheses in zip(plain, found, strict=True):
                out[i] = hypotheses[0]
        return [tokenizer.convert_tokens_to_ids(tokens) for tokens in out]

    def _decode(self, loaded: Loaded, source: list[list[str]],
                prefix: list[list[str]] | None, max_new: int, beams: int,
                bias: float) -> list[list[list[str]]]:
        """One ``translate_batch``: per row its hypotheses, best first (all ``beams`` of
        them when biased, the best alone otherwise)."""
        extra: dict[str, Any] = {}
        if bias > 0:
            extra = {"prefix_bias_beta": bias, "num_hypotheses": beams}
        stop = stop_signal()
        if stop is not None and beams == 1:  # CTranslate2 calls it with one beam alone
            extra["callback"] = lambda _step: stop.is_set()
        check_stopped()
        results = loaded.model.translate_batch(
            source,
            target_prefix=prefix,
            beam_size=beams,
            max_decoding_length=max_new,  # counts the target prefix, like max_new_tokens
            min_decoding_length=min(loaded.min_length, max_new),
            no_repeat_ngram_size=self.options.no_repeat_ngram_size,
            suppress_sequences=loaded.suppress,
            max_input_length=0,  # the backend bounds inputs itself (split_text)
            # Parts of the batch for the workers, run at once, answers in the input order.
            max_batch_size=(math.ceil(len(source) / loaded.workers) if loaded.workers > 1
                            else 0),
            return_scores=False,
            **extra,
        )
        check_stopped()
        return [list(result.hypotheses) for result in results]


def _stopping_criteria(stop: threading.Event) -> Any:
    """transformers' criteria that end a decode once ``stop`` is set."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Stop(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), stop.is_set(), dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([Stop()])


def _generation_config(path: Path) -> dict[str, Any]:
    try:
        value = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _target_vocabulary(path: Path) -> frozenset[str]:
    """The tokens of a converted model's target vocabulary (a JSON list or one per line)."""
    for name in ("target_vocabulary", "shared_vocabulary"):
        for suffix, parse in ((".json", json.loads), (".txt", str.splitlines)):
            file = path / (name + suffix)
            if file.is_file():
                return frozenset(parse(file.read_text(encoding="utf-8")))
    return frozenset()


def cpuinfo(field: str) -> str | None:
    """A field of /proc/cpuinfo's first processor (``vendor_id``, ``model name``); None
    where there is no such file or field."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
