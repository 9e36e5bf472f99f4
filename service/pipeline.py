"""The data path: segment -> detect -> decide -> batch -> backend chain -> segment result.

One-shot requests use ``translate_texts``; streams use the same pieces (``decide``,
``submit``, ``result``) one segment at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from models.base import Translator
from service.batcher import Batcher, Translation
from service.detect import Detection, Detector
from service.errors import BackendError, BadOutput, Overloaded, PayloadTooLarge, UnknownBackend
from service.locale import canonicalize, full_script, same_language
from service.metrics import Metrics
from service.segmenter import Kind, Piece, Segmenter, is_translatable
from service.settings import Settings

log = logging.getLogger("thinktrans.pipeline")

Status = Literal["translated", "same_language", "skipped", "deadline", "error", "no_target"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one segment: a final status, or translate from ``source``."""

    status: Status | None  # None: translate
    source_lang: str | None  # what the segment is in, as best known
    send_source: str | None  # the source given to the backend (None: let it detect)


def keep_whitespace(original: str, translated: str) -> str:
    """The translation with the original's leading and trailing whitespace."""
    core = original.strip()
    if not core:
        return original
    start = original.index(core[0])
    end = len(original.rstrip())
    return original[:start] + translated.strip() + original[end:]


def segment_result(
    index: int,
    original: str,
    *,
    target: str | None,
    status: Status,
    source_lang: str | None = None,
    text: str | None = None,
    backend: str | None = None,
    queued_ms: float = 0.0,
    latency_ms: float = 0.0,
    error: str | None = None,
) -> dict[str, Any]:
    """The one output shape (API.md, 'Segment result')."""
    out: dict[str, Any] = {
        "index": index,
        "original": original,
        "text": original if text is None else text,
        "source_lang": source_lang,
        "target": target,
        "status": status,
        "backend": backend,
        "queued_ms": round(queued_ms, 3),
        "latency_ms": round(latency_ms, 3),
    }
    if error is not None:
        out["error"] = error
    return out


class Pipeline:
    """Shared by every request and stream of one app."""

    def __init__(
        self,
        settings: Settings,
        detector: Detector,
        backends: dict[str, Translator],
        batchers: dict[str, Batcher],
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.detector = detector
        self.backends = backends
        self.batchers = batchers
        self.metrics = metrics

    # -- choosing ------------------------------------------------------------------------

    def chain_for(self, backend: str | None) -> list[str]:
        """The chain a request asked for (a name or ``a,b``), else the configured one."""
        if backend is None:
            return list(self.settings.backend)
        names = [part.strip() for part in backend.split(",") if part.strip()]
        unknown = [n for n in names if n not in self.backends]
        if not names or unknown or len(set(names)) != len(names):
            raise UnknownBackend(
                f"backend {backend!r} is not configured here; choose from "
                f"{', '.join(self.backends)} (or a chain such as 'deepl,local')",
                available=list(self.backends),
            )
        return names

    def detect(self, text: str) -> Detection:
        return self.detector.detect(text)

    def decide(
        self, text: str, kind: Kind, target: str | None, fallback_lang: str | None,
        detection: Detection | None = None, source: str | None = None,
    ) -> Decision:
        """Skip, keep, or translate one segment, and from which language.

        ``fallback_lang`` (a stream's recent language, or a batch's majority) stands in
        for detection on short or unreliable segments such as "OK." or "Hmm,".
        """
        if kind != "text" or not is_translatable(text):
            return Decision("skipped", None, None)
        if source is not None:
            lang: str | None = source
            send: str | None = source
        else:
            det = detection or self.detector.detect(text)
            if det.reliable:
                lang = send = det.lang
            elif fallback_lang is not None and (
                det.lang is None or full_script(det.lang) == full_script(fallback_lang)
            ):
                # "OK." in a German stream is German; but Latin text in a Chinese
                # stream is not Chinese, so the fallback must share the script.
                lang = send = fallback_lang
            else:
                lang, send = det.lang, None
        if target is None:
            return Decision("no_target", lang, None)
        if lang is not None and same_language(lang, target):
            return Decision("same_language", lang, None)
        return Decision(None, lang, send)

    # -- translating ---------------------------------------------------------------------

    def submit(
        self, text: str, source: str | None, target: str, chain: Sequence[str]
    ) -> asyncio.Task[Translation]:
        """Start one segment (stripped of its outer whitespace) down the chain.

        The first usable backend's queue is entered before this returns, so a caller can
        check capacity and submit without another request slipping in between; raises
        Overloaded when that queue is full and no backend follows it.
        """
        errors: list[str] = []
        rest = list(chain)
        first = self._enter(text, source, target, rest, errors, overload_raises=True)
        return asyncio.create_task(self._run_chain(text, source, target, first, rest, errors))

    def _enter(
        self, text: str, source: str | None, target: str, rest: list[str], errors: list[str],
        *, overload_raises: bool = False,
    ) -> tuple[str, asyncio.Future[Translation]] | None:
        """Queue the segment on the next usable backend of ``rest`` (consumed as it goes)."""
        while rest:
            name = rest.pop(0)
            if not self._usable(name, source, target, errors):
                continue
            try:
                return name, self.batchers[name].submit(text, source, target)
            except Overloaded as exc:
                if overload_raises and not rest:
                    raise
                errors.append(f"{name}: {exc.detail}")
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
        return None

    def _usable(self, name: str, source: str | None, target: str, errors: list[str]) -> bool:
        translator = self.backends[name]
        if not translator.ready:
            errors.append(f"{name}: {translator.reason or 'not ready'}")
            return False
        batcher = self.batchers[name]
        if not batcher.available():
            errors.append(f"{name}: {batcher.breaker_reason}")
            return False
        if not translator.supports(source, target):
            errors.append(f"{name}: cannot translate {source or 'auto'} -> {target}")
            return False
        return True

    async def _run_chain(
        self,
        text: str,
        source: str | None,
        target: str,
        entered: tuple[str, asyncio.Future[Translation]] | None,
        rest: list[str],
        errors: list[str],
    ) -> Translation:
        while entered is not None:
            name, future = entered
            try:
                result = await future
                self._check_language(result, target)
                return result
            except BackendError as exc:
                errors.append(f"{name}: {exc.detail}")
            entered = self._enter(text, source, target, rest, errors)
        raise BackendError("; ".join(errors) or "no backend could serve this segment")

    def _check_language(self, result: Translation, target: str) -> None:
        """A translation reliably detected in another language than the target is bad."""
        translator = self.backends[result.backend]
        if not self.settings.check_output_language or not translator.check_output_language:
            return
        det = self.detector.detect(result.text)
        if det.reliable and det.lang is not None and not same_language(det.lang, target):
            raise BadOutput(f"output is in {det.lang}, not {target}")

    # -- one-shot ------------------------------------------------------------------------

    async def translate_texts(
        self,
        texts: Sequence[str],
        *,
        target: str | None,
        source: str | None = None,
        backend: str | None = None,
    ) -> list[dict[str, Any]]:
        """Translate whole texts: one result (text and segments) per input, in order."""
        chain = self.chain_for(backend)
        src = canonicalize(source) if source else None
        max_chars = self.settings.max_segment_chars
        split: list[list[Piece]] = []
        for text in texts:
            seg = Segmenter(max_chars)
            split.append([*seg.feed(text), *seg.flush()])
            await asyncio.sleep(0)  # streams' deadline timers must not wait for this request
        detections: dict[tuple[int, int], Detection] = {}
        langs: Counter[str] = Counter()
        if src is None:
            for t, pieces in enumerate(split):
                for i, piece in enumerate(pieces):
                    if piece.kind == "text" and is_translatable(piece.text):
                        det = self.detector.detect(piece.text)
                        detections[(t, i)] = det
                        if len(detections) % 16 == 0:
                            await asyncio.sleep(0)
                        if det.reliable and det.lang:
                            langs[det.lang] += 1
        majority = langs.most_common(1)[0][0] if langs else None

        decisions: dict[tuple[int, int], Decision] = {}
        wanted = 0
        for t, pieces in enumerate(split):
            for i, piece in enumerate(pieces):
                d = self.decide(piece.text, piece.kind, target, majority,
                                detections.get((t, i)), src)
                decisions[(t, i)] = d
                wanted += d.status is None
        first = self.batchers.get(chain[0])
        if first is not None and wanted > first.limits.max_queue_size:
            # No wait would help: say what to change instead of inviting a retry.
            raise PayloadTooLarge(
                f"this request needs {wanted} segments translated; a backend queue holds at "
                f"most THINKTRANS_MAX_QUEUE_SIZE={first.limits.max_queue_size}: send fewer "
                "or shorter texts per request"
            )
        if first is not None and wanted > first.free() and len(chain) == 1:
            raise Overloaded(
                f"the {chain[0]!r} queue has room for {first.free()} segments, this request "
                f"needs {wanted}; retry later",
                retry_after_s=1,
            )

        started = time.monotonic()
        tasks: dict[tuple[int, int], asyncio.Task[Translation]] = {}
        finished: dict[asyncio.Task[Translation], float] = {}

        def note_finish(task: asyncio.Task[Translation]) -> None:
            finished[task] = time.monotonic()

        try:
            for key, d in decisions.items():
                if d.status is None:
                    assert target is not None
                    piece = split[key[0]][key[1]]
                    task = self.submit(piece.text.strip(), d.send_source, target, chain)
                    task.add_done_callback(note_finish)
                    tasks[key] = task
            if tasks:
                await asyncio.wait(tasks.values(), timeout=self.settings.deadline_ms / 1000.0)
        finally:
            for task in tasks.values():
                if not task.done():
                    task.cancel()  # nobody reads a late one-shot answer: drop it unrun

        results = []
        for t, pieces in enumerate(split):
            segments = []
            for i, piece in enumerate(pieces):
                pending = tasks.get((t, i))
                done_at = finished.get(pending) if pending is not None else started
                segments.append(self.result(i, piece.text, target, decisions[(t, i)], pending,
                                            started, done_at))
            results.append({"text": "".join(s["text"] for s in segments), "segments": segments})
        return results

    def result(
        self,
        index: int,
        original: str,
        target: str | None,
        decision: Decision,
        task: asyncio.Task[Translation] | None,
        ready_at: float,
        done_at: float | None = None,
        unfinished: Status = "deadline",
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Build a segment's result from its decision and (finished or not) translation.

        ``latency_ms`` runs from ready to ``done_at`` (when its answer came), else to now.
        """
        latency_ms = ((done_at or time.monotonic()) - ready_at) * 1000.0
        status: Status
        text = backend = error = None
        queued_ms = 0.0
        if decision.status is not None:
            status = decision.status
        elif task is None or not task.done() or task.cancelled():
            # Not back yet: normally its deadline (an update follows); at shutdown, an error.
            status, error = unfinished, reason
            if status == "deadline":
                self.metrics.deadline_misses.inc()
        elif (exc := task.exception()) is not None:
            status = "error"
            error = exc.detail if isinstance(exc, BackendError) else type(exc).__name__
        else:
            tr = task.result()
            status, backend, queued_ms = "translated", tr.backend, tr.queued_ms
            text = keep_whitespace(original, tr.text)
        out = segment_result(
            index, original, target=target, status=status, source_lang=decision.source_lang,
            text=text, backend=backend, queued_ms=queued_ms, latency_ms=latency_ms, error=error,
        )
        self.metrics.segments.labels(out["status"], out["backend"] or "").inc()
        self.metrics.segment_seconds.labels(out["status"]).observe(latency_ms / 1000.0)
        return out
