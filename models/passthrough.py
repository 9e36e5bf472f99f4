"""The passthrough backend: returns the originals, for dry runs and overhead measurement.

It has no model: a model a request names is no concern of its, and nothing it answers is
cached (the original is its own answer).
"""

from __future__ import annotations

from models.base import Capabilities, Job, Translator


class PassthroughTranslator(Translator):
    name = "passthrough"
    max_concurrency = 64
    capabilities = Capabilities(checked_output=False)

    async def run(self, job: Job) -> list[str]:
        texts = job.texts
        return list(texts)

    def model_problem(self, model: str | None) -> str | None:
        return None

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        return None

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        return None
