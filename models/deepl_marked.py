"""How the DeepL backend sends texts with protected spans, and the glossaries it keeps for them.

DeepL has no notion of a span to keep, so a text with spans goes in requests of its own, as
XML whose elements DeepL leaves alone, and glossary terms go through DeepL glossaries where
one can be had; whatever did not come back as sent is translated piece by piece, so a span
is never lost. ``MarkedRequests`` does this through the calls its backend hands it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import deepl

from models.deepl_spans import (
    TAG,
    Glossaries,
    GlossaryKey,
    GlossaryLease,
    glossary_terms,
    unwrap,
    wrap,
    xml_safe,
)
from models.errors import BackendError
from models.spans import Protected, needs_words, rejoin

log = logging.getLogger("models.deepl")  # the backend's logger: these are its messages

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """What every request of one ``translate`` call shares."""

    target_code: str
    source_code: str | None
    model_type: str | None  # None: not sent, DeepL's default


@dataclass(frozen=True)
class Markup:
    """A request of texts with protected spans: sent as XML, with a glossary or none."""

    glossary_id: str | None = None

    def options(self) -> dict[str, Any]:
        """The request's options: XML, each span's element left alone and no sentence split
        at one; the glossary, if any."""
        options: dict[str, Any] = {"tag_handling": "xml", "ignore_tags": [TAG],
                                   "non_splitting_tags": [TAG]}
        if self.glossary_id is not None:
            options["glossary"] = self.glossary_id
        return options


# Texts sharing one context (and markup: None, plain text) translated, in order.
Send = Callable[[Call, list[str], str | None, Markup | None], Awaitable[list[str]]]


class RunBlocking(Protocol):
    """Blocking client work run in the backend's threads, every failure mapped."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


class MarkedRequests:
    """The texts with protected spans of one DeepL backend, and the glossaries it keeps;
    ``max_glossaries`` 0: never create one, put each target term in the text instead."""

    def __init__(
        self, *, send: Send, run: RunBlocking, client: Callable[[], deepl.DeepLClient],
        max_glossaries: int,
    ) -> None:
        self._send = send
        self._run = run
        self._client = client
        self.glossaries = (
            Glossaries(max_glossaries, self._create_glossary, self._delete_glossary)
            if max_glossaries > 0 else None
        )
        self.fallbacks = 0  # texts whose spans came back only piece by piece

    async def aclose(self, *, timeout_s: float) -> None:
        """Delete the glossaries created, waiting ``timeout_s`` at most."""
        if self.glossaries is not None:
            await self.glossaries.aclose(timeout_s=timeout_s)

    def facts(self) -> dict[str, object]:
        """The glossaries kept, created and deleted, and the texts sent piece by piece."""
        return {
            "glossaries": None if self.glossaries is None else {
                "kept": len(self.glossaries),
                "created": self.glossaries.created,
                "deleted": self.glossaries.deleted,
            },
            "span_fallbacks": self.fallbacks,
        }

    async def translate(
        self, call: Call, items: list[tuple[Protected, str | None]]
    ) -> list[str]:
        """Texts with protected spans, each with its context: as XML with each span in an
        ignored element, glossary terms rendered by a DeepL glossary where one can be had.
        A text whose glossary term did not come out as given is sent again with the term
        in an element; one whose elements did not come back once each is translated piece
        by piece (its prose runs alone, the spans put back between them)."""
        out: list[str | None] = [None] * len(items)
        for j, (protected, _) in enumerate(items):
            if not protected.has_words():  # only spans and punctuation: nothing to send
                out[j] = rejoin(protected.runs())
        # A text XML cannot carry (a control character) goes piece by piece.
        todo = [j for j, text in enumerate(out) if text is None and xml_safe(items[j][0].text)]
        if todo:
            sent = await self._translate_wrapped(call, [items[j] for j in todo])
            for j, text in zip(todo, sent, strict=True):
                out[j] = text
        lost = [j for j, text in enumerate(out) if text is None]
        if lost:
            pieces = await self._translate_runs(call, [items[j] for j in lost])
            for j, text in zip(lost, pieces, strict=True):
                out[j] = text
            self.fallbacks += len(lost)
        return [text if text is not None else "" for text in out]

    async def _translate_wrapped(
        self, call: Call, items: list[tuple[Protected, str | None]]
    ) -> list[str | None]:
        """The XML passes: with the glossaries where there are some, then, for a text whose
        term did not come out as given, with its terms substituted; None where a span did
        not come back."""
        leases = self._lease_glossaries(call, [p for p, _ in items])
        try:
            ids: dict[GlossaryKey, str | None] = {}
            if leases:
                assert self.glossaries is not None
                found = await asyncio.gather(*(self.glossaries.glossary_id(lease)
                                               for lease in leases.values()))
                ids = dict(zip(leases, found, strict=True))
            first = [ids.get(key) if key is not None else None
                     for key in (self._glossary_key(call, p) for p, _ in items)]
            out = await self._send_marked(call, items, first)
            again = [j for j, text in enumerate(out) if text is None and first[j] is not None]
            if again:  # the glossary did not render a term as given: substitute it
                retried = await self._send_marked(call, [items[j] for j in again],
                                                  [None] * len(again))
                for j, text in zip(again, retried, strict=True):
                    out[j] = text
        finally:
            if self.glossaries is not None:
                for lease in leases.values():
                    self.glossaries.release(lease)
        return out

    async def _send_marked(
        self, call: Call, items: list[tuple[Protected, str | None]],
        glossary_ids: list[str | None],
    ) -> list[str | None]:
        """One pass: each text as XML, with its glossary (None: terms substituted); each
        answer read back, or None where a span or a term did not come back."""
        groups: dict[tuple[str | None, str | None], list[int]] = {}
        for j, ((_, context), glossary_id) in enumerate(zip(items, glossary_ids, strict=True)):
            groups.setdefault((context, glossary_id), []).append(j)
        tasks = [
            asyncio.ensure_future(self._send(
                call,
                [wrap(items[j][0], glossary_renders_terms=glossary_id is not None)
                 for j in indexes],
                context, Markup(glossary_id)))
            for (context, glossary_id), indexes in groups.items()
        ]
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for task in tasks:
                task.cancel()
        out: list[str | None] = [None] * len(items)
        for ((_, glossary_id), indexes), answers in zip(groups.items(), results, strict=True):
            if isinstance(answers, BaseException):
                status = getattr(answers.__cause__, "http_status_code", None)
                if status not in (400, 404):
                    raise answers
                # DeepL refused the request for what it held: a glossary it no longer has
                # (deleted elsewhere: forget it), or markup it would not parse. The texts go
                # again, with their terms substituted, else piece by piece.
                log.warning("deepl: request with%s refused (HTTP %s); its texts go again",
                            " a glossary" if glossary_id else " tags", status)
                if glossary_id is not None and self.glossaries is not None:
                    self.glossaries.forget(glossary_id)
                continue
            for j, answer in zip(indexes, answers, strict=True):
                protected = items[j][0]
                text = unwrap(answer, protected, glossary_renders_terms=glossary_id is not None)
                if text is not None and not protected.missing(text):
                    out[j] = text
        return out

    async def _translate_runs(
        self, call: Call, items: list[tuple[Protected, str | None]]
    ) -> list[str]:
        """Texts whose spans DeepL would not keep: their prose runs translated alone (plain
        text, with the text's context), each span's ``out`` put back between them."""
        parts = [protected.runs() for protected, _ in items]
        groups: dict[str | None, list[tuple[int, int]]] = {}  # context -> (item, part)
        for j, ((_, context), runs) in enumerate(zip(items, parts, strict=True)):
            for k, run in enumerate(runs):
                if isinstance(run, str) and needs_words(run):
                    groups.setdefault(context, []).append((j, k))
        tasks = [
            asyncio.ensure_future(self._send(
                call, [str(parts[j][k]).strip() for j, k in places], context, None))
            for context, places in groups.items()
        ]
        try:
            results = await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        for places, translated in zip(groups.values(), results, strict=True):
            for (j, k), text in zip(places, translated, strict=True):
                run = str(parts[j][k])
                lead = run[: len(run) - len(run.lstrip())]
                tail = run[len(run.rstrip()):]
                parts[j][k] = f"{lead}{text}{tail}"
        return [rejoin(runs) for runs in parts]

    def _glossary_key(self, call: Call, protected: Protected) -> GlossaryKey | None:
        """Which DeepL glossary would render this text's terms; None: substitute them
        (no term, no glossary API, or an unknown source: DeepL's glossaries need one)."""
        if self.glossaries is None or call.source_code is None:
            return None
        terms = glossary_terms(protected)
        if terms is None:
            return None
        return (terms.digest, call.source_code, call.target_code.split("-")[0])

    def _lease_glossaries(
        self, call: Call, protected: list[Protected]
    ) -> dict[GlossaryKey, GlossaryLease]:
        """The glossaries these texts need, each acquired once for the batch."""
        leases: dict[GlossaryKey, GlossaryLease] = {}
        if self.glossaries is None:
            return leases
        for p in protected:
            key = self._glossary_key(call, p)
            if key is not None and key not in leases:
                assert p.glossary is not None
                leases[key] = self.glossaries.acquire(key, dict(p.glossary.terms))
        return leases

    async def _create_glossary(self, key: GlossaryKey, entries: dict[str, str]) -> str | None:
        """A DeepL glossary of ``entries`` for the key's pair: its id, or None where DeepL
        will not have it (the pair, the entries); other failures raise."""
        digest, source_code, target_code = key
        try:
            return await self._run(self._create_glossary_blocking, f"thinktrans-{digest}",
                                   source_code, target_code, entries)
        except BackendError as exc:
            status = getattr(exc.__cause__, "http_status_code", None)
            if status in (400, 404, 413, 415):  # refused for what it is: never ask again
                log.info("deepl: no glossary for %s->%s (HTTP %s): terms substituted",
                         source_code, target_code, status)
                return None
            log.warning("deepl: glossary for %s->%s not created: %s", source_code,
                        target_code, exc.detail)
            raise

    def _create_glossary_blocking(
        self, name: str, source_code: str, target_code: str, entries: dict[str, str]
    ) -> str | None:
        try:
            info = self._client().create_glossary(name, source_code, target_code, entries)
        except ValueError as exc:  # the client's own check of the entries
            log.info("deepl: glossary entries refused by the client (%s): terms substituted",
                     type(exc).__name__)
            return None
        log.debug("deepl created glossary %s (%d entries) for %s->%s",
                  info.glossary_id, len(entries), source_code, target_code)
        return str(info.glossary_id)

    async def _delete_glossary(self, glossary_id: str) -> None:
        await self._run(lambda: self._client().delete_glossary(glossary_id))
