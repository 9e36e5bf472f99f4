"""Test doubles: a fake backend with gates, scripted answers and a record of calls."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from models.base import Capabilities, Job, Translator
from models.spans import Protected
from service.chain.work import SegmentWork
from service.text.decide import Decision


@dataclass
class Call:
    texts: list[str]
    source: str | None
    target: str
    contexts: list[str | None] | None = None
    model: str | None = None


@dataclass
class FakeTranslator(Translator):
    """Translates to ``<target>:<text>`` unless told otherwise.

    ``gate``: when set, each call waits for it (tests open it to let batches run).
    ``answers``: a queue of callables or exceptions used, in order, for the next calls.
    """

    name_: str = "fake"
    gate: asyncio.Event | None = None
    delay_s: float = 0.0
    answers: deque[Callable[[Sequence[str], str | None, str], list[str]] | BaseException] = field(
        default_factory=deque
    )
    calls: list[Call] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)  # every job as the batcher handed it
    concurrency: int | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    uses_context: bool = False  # when True, the batcher passes each text's preceding text
    models: tuple[str, ...] = ()  # models it takes by name (answers tagged with the model)

    def __post_init__(self) -> None:
        Translator.__init__(self)
        self.max_concurrency = self.concurrency
        # Its answers are tagged originals, not translations: no output-language check.
        self.capabilities = Capabilities(context=self.uses_context, checked_output=False)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.name_

    async def run(self, job: Job) -> list[str]:
        texts, source, target, contexts, model = (job.texts, job.source, job.target,
                                                  job.contexts, job.model)
        self.calls.append(Call(list(texts), source, target,
                               None if contexts is None else list(contexts), model))
        self.jobs.append(job)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.answers:
            answer = self.answers.popleft()
            if isinstance(answer, BaseException):
                raise answer
            return answer(texts, source, target)
        tag = target if model is None else f"{target}|{model}"
        return [f"<{tag}>{t}" for t in texts]

    def model_problem(self, model: str | None) -> str | None:
        if model is None or model in self.models:
            return None
        return f"{self.name} has no model {model!r}"

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        return model if model is not None else (self.models[0] if self.models else None)

    def catalog(self) -> list[dict[str, object]]:
        return [{"model": m, "languages": None, "default": i == 0, "notes": "fake"}
                for i, m in enumerate(self.models)]


def work(text: str, source: str | None, target: str, *, model: str | None = None,
         context: str | None = None, due: float | None = None,
         protected: Protected | None = None, preview: bool = False,
         previous: str | None = None) -> SegmentWork:
    """One segment's work as a cutter makes it, for tests that drive a batcher or the
    chain without a stream (``source``: the one sent)."""
    return SegmentWork(0, text, Decision(None, source, source), 0.0, target, text=text,
                       model=model, context=context, protected=protected, due=due,
                       preview=preview, previous=previous)
