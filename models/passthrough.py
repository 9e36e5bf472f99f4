"""The passthrough backend: returns the originals, for dry runs and overhead measurement.

Glossary terms are rendered as given (every other span is its own text already), so that a
stream with a glossary reads the same on a dry run.

It has no model: a model a request names is no concern of its, and nothing it answers is
cached (the original is its own answer).
"""

from __future__ import annotations

from models.base import Capabilities, Job, Translator
from models.spans import rejoin


class PassthroughTranslator(Translator):
    name = "passthrough"
    max_concurrency = 64
    capabilities = Capabilities(checked_output=False)

    async def run(self, job: Job) -> list[str]:
        if job.protected is None:
            return list(job.texts)
        return [text if protected is None else rejoin(protected.runs())
                for text, protected in zip(job.texts, job.protected, strict=True)]

    def model_problem(self, model: str | None) -> str | None:
        return None

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        return None

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        return None
