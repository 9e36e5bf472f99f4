"""The local backend: NLLB-200, M2M-100 and Marian (opus-mt) checkpoints on CTranslate2 or torch.

A translation model run in the sidecar's own process, for deployments that send no text out.
Its modules are built bottom up, each importing only those it builds on (docs/ARCHITECTURE.md
lists them in that order); docs/local-backend.md tells the whole story.
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
