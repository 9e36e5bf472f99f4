"""The passthrough backend: returns the originals, for dry runs and overhead measurement.

It has no model: a model a request names is no concern of its, and nothing it answers is
cached (the original is its own answer).
"""

from __future__ import annotations

from collections.abc import Sequence

from models.base import Translator


class PassthroughTranslator(Translator):
    name = "passthrough"
    max_concurrency = 64
    check_output_language = False

    async def translate(
        self,
        texts: Sequence[str],
        *,
        source: str | None,
        target: str,
        contexts: Sequence[str | None] | None = None,
        model: str | None = None,
    ) -> list[str]:
        return list(texts)

    def model_problem(self, model: str | None) -> str | None:
        return None

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        return None

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        return None
