"""The passthrough backend: returns the originals, for dry runs and overhead measurement."""

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
    ) -> list[str]:
        return list(texts)
