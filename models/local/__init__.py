"""The local backend: NLLB-200, M2M-100 and Marian (opus-mt) checkpoints on CTranslate2 or torch.

Its modules, each importing only those above it in this list:

- ``checkpoint``: what a checkpoint is before it loads: the language table, the family
  (``detect_family``), the model specs from the settings (``parse_pair_spec``,
  ``model_specs``), a Marian checkpoint's pair, one-line reasons for a checkpoint not found
  (``not_found_reason``), the hub probe, a directory's fingerprint;
- ``text``: texts into pieces that fit the model (``split_text``) and back;
- ``masking``: protected spans through the engine: each family's placeholders, and the prose
  runs between the spans when one is lost (``SpanBatch``);
- ``convert``: checkpoints into CTranslate2 models, ``thinktrans convert`` and the cache the
  backend converts into on first load, in a child process (``python -m models.local.convert``);
- ``engines``: CTranslate2 and transformers behind one small interface (``Engine``);
- ``slot``: one checkpoint loaded on an engine, and a batch run through it;
- ``catalog``: the configured models and those loaded on demand (LRU), and which one serves
  a pair;
- ``translator``: ``LocalTranslator`` (its threads, start-up with load retries, readiness,
  ``run``) and ``LocalConfig``.

docs/local-backend.md tells the whole story.
"""

from __future__ import annotations

from models.local.checkpoint import (
    FALLBACK_SOURCE,
    FAMILIES,
    M2M_CODES,
    NLLB_CODES,
    detect_family,
    model_specs,
    not_found_reason,
    parse_pair_spec,
)
from models.local.local_translator import LocalConfig, LocalTranslator
from models.local.pieces import split_text
from models.local.slot import MAX_BATCH_TOKENS

__all__ = [
    "FALLBACK_SOURCE",
    "FAMILIES",
    "M2M_CODES",
    "MAX_BATCH_TOKENS",
    "NLLB_CODES",
    "LocalConfig",
    "LocalTranslator",
    "detect_family",
    "model_specs",
    "not_found_reason",
    "parse_pair_spec",
    "split_text",
]
