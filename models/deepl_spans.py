"""How the DeepL backend keeps protected spans: ignored XML tags, and the glossaries it keeps.

The XML side (``wrap``, ``unwrap``) and the bookkeeping of glossaries (``Glossaries``), with
no I/O, so that both are tested without DeepL; ``models.deepl_marked`` does the requests.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from models.spans import Glossary, Protected

log = logging.getLogger(__name__)

TAG = "x"  # short: DeepL bills the markup too
TERM = "term"  # the kind models.spans gives a glossary term's span

_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESCAPE = re.compile("[&<>]")
_ENTITY = re.compile(r"&(?:(lt|gt|amp|quot|apos)|#([0-9]{1,7})|#[xX]([0-9a-fA-F]{1,6}));")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
# One element as sent (<x i="3">...</x>), or emptied by the server (<x i="3"/>); the
# number may come back in single quotes or with spaces.
_ELEMENT = re.compile(
    rf"<{TAG}\s+i\s*=\s*[\"'](\d+)[\"']\s*(?:/>|>(?s:.*?)</{TAG}\s*>)"
)
_STRAY = re.compile(rf"</?{TAG}(?=[\s/>])")


# What XML 1.0 allows in no form, not even as a character reference (a terminal's escape
# character, \x1b, among them): a text holding one cannot go as XML.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> bool:
    """Whether ``text`` can go as XML character data once escaped."""
    return _NOT_XML.search(text) is None


def escape(text: str) -> str:
    """Text as XML character data."""
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group()], text)


def unescape(text: str) -> str:
    """XML character data as text: the five entities and character references; anything
    else (a bare ``&`` a server let through) as it is."""

    def one(match: re.Match[str]) -> str:
        name, dec, hexa = match.groups()
        if name:
            return _NAMED[name]
        code = int(dec) if dec else int(hexa, 16)
        return chr(code) if 0 < code <= 0x10FFFF else match.group()

    return _ENTITY.sub(one, text)


def wrap(protected: Protected, *, glossary_renders_terms: bool) -> str:
    """``protected.text`` as DeepL XML: each span an ignored element holding its ``out``;
    with ``glossary_renders_terms``, a ``term`` span stays prose, for DeepL's glossary."""
    text = protected.text
    parts: list[str] = []
    at = 0
    for i, span in enumerate(protected.spans):
        parts.append(escape(text[at:span.start]))
        if glossary_renders_terms and span.kind == TERM:
            parts.append(escape(text[span.start:span.end]))
        else:
            parts.append(f'<{TAG} i="{i}">{escape(span.out)}</{TAG}>')
        at = span.end
    parts.append(escape(text[at:]))
    return "".join(parts)


def wrapped(protected: Protected, *, glossary_renders_terms: bool) -> set[int]:
    """The numbers of the spans ``wrap`` puts in elements."""
    return {
        i for i, span in enumerate(protected.spans)
        if not (glossary_renders_terms and span.kind == TERM)
    }


def unwrap(answer: str, protected: Protected, *, glossary_renders_terms: bool) -> str | None:
    """DeepL's answer to ``wrap`` as text, each element replaced by its span's ``out`` byte
    for byte, read by its number whatever order DeepL put the elements in; None when an
    element is missing, repeated or unknown, or a tag of ours is left over."""
    expected = wrapped(protected, glossary_renders_terms=glossary_renders_terms)
    order: list[int] = []  # span numbers, in the answer's order
    prose: list[str] = []  # the runs around them
    at = 0
    for match in _ELEMENT.finditer(answer):
        i = int(match.group(1))
        if i not in expected or i in order:
            return None
        order.append(i)
        prose.append(answer[at:match.start()])
        at = match.end()
    prose.append(answer[at:])
    if len(order) != len(expected) or any(_STRAY.search(run) for run in prose):
        return None
    out = [unescape(prose[0])]
    for i, run in zip(order, prose[1:], strict=True):
        out.append(protected.spans[i].out)
        out.append(unescape(run))
    return "".join(out)


def glossary_terms(protected: Protected | None) -> Glossary | None:
    """The glossary whose terms DeepL would render for this text: None unless the text
    has a ``term`` span and its glossary has terms. Kept terms are spans, not entries."""
    if protected is None or protected.glossary is None or not protected.glossary.terms:
        return None
    if not any(span.kind == TERM for span in protected.spans):
        return None
    return Glossary(terms=protected.glossary.terms)


# (digest of the terms, DeepL source code, DeepL target code without its variant)
GlossaryKey = tuple[str, str, str]


@dataclass(eq=False)
class GlossaryLease:
    """One glossary as the batches using it see it: its creation, and how many use it."""

    key: GlossaryKey
    created: asyncio.Future[str | None]  # DeepL's glossary id; None: DeepL will not have it
    users: int = 0
    evicted: bool = False
    deleting: bool = field(default=False, repr=False)


class Glossaries:
    """The DeepL glossaries one backend created, least recently used first: one per
    (terms, source, target), shared by the batches that need it, at most ``capacity``,
    every one deleted at close. It does no I/O itself.

    ``create(key, entries)`` returns the new glossary's id, or None when DeepL will not
    have this one (an unsupported pair, entries it refuses): that answer is kept, so it is
    not asked again; an exception (DeepL unreachable) is not kept, and the next batch tries
    again. ``delete(id)`` deletes one. A glossary evicted while a batch still uses it is
    deleted when that batch releases it.
    """

    def __init__(
        self,
        capacity: int,
        create: Callable[[GlossaryKey, dict[str, str]], Awaitable[str | None]],
        delete: Callable[[str], Awaitable[None]],
    ) -> None:
        if capacity < 1:
            raise ValueError(f"a glossary cache holds at least 1 glossary, got {capacity}")
        self.capacity = capacity
        self._create = create
        self._delete = delete
        self._leases: OrderedDict[GlossaryKey, GlossaryLease] = OrderedDict()
        self._evicted: set[GlossaryLease] = set()  # evicted, still in use
        self._deletions: set[asyncio.Task[None]] = set()
        self.created = 0  # glossaries created, and deleted, since start
        self.deleted = 0

    def __len__(self) -> int:
        return len(self._leases)

    def acquire(self, key: GlossaryKey, entries: dict[str, str]) -> GlossaryLease:
        """The glossary for ``key``, created now unless it is kept; the caller awaits
        ``glossary_id`` and must ``release`` it."""
        lease = self._leases.get(key)
        if lease is None:
            created = asyncio.ensure_future(self._create_counted(key, entries))
            created.add_done_callback(_retrieved)
            lease = GlossaryLease(key, created)
            self._leases[key] = lease
            self._evict()
        else:
            self._leases.move_to_end(key)
        lease.users += 1
        return lease

    async def glossary_id(self, lease: GlossaryLease) -> str | None:
        """The lease's DeepL glossary id; None: substitute the terms instead."""
        try:
            return await asyncio.shield(lease.created)
        except asyncio.CancelledError:
            raise
        except Exception:  # logged by the creator; the next batch tries again
            if self._leases.get(lease.key) is lease:
                del self._leases[lease.key]
            return None

    def release(self, lease: GlossaryLease) -> None:
        """A batch is done with the glossary; an evicted one is deleted once none uses it."""
        lease.users -= 1
        if lease.evicted and lease.users <= 0:
            self._evicted.discard(lease)
            self._schedule_delete(lease)

    def forget(self, glossary_id: str) -> None:
        """DeepL no longer has this glossary: drop it, deleting nothing; the next batch
        that needs its terms creates it again."""
        for key, lease in list(self._leases.items()):
            if _id_of(lease) == glossary_id:
                del self._leases[key]
                lease.deleting = True  # nothing left to delete

    async def aclose(self, timeout_s: float) -> None:
        """Delete every glossary created, waiting ``timeout_s`` at most."""
        leases = [*self._leases.values(), *self._evicted]
        self._leases.clear()
        self._evicted.clear()
        for lease in leases:
            self._schedule_delete(lease)
        if self._deletions:
            _, pending = await asyncio.wait(self._deletions, timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("deepl: %d glossaries not deleted within %g s at close",
                            len(pending), timeout_s)

    async def _create_counted(self, key: GlossaryKey, entries: dict[str, str]) -> str | None:
        glossary_id = await self._create(key, entries)
        if glossary_id is not None:
            self.created += 1
        return glossary_id

    def _evict(self) -> None:
        while len(self._leases) > self.capacity:
            _, lease = self._leases.popitem(last=False)
            lease.evicted = True
            if lease.users > 0:
                self._evicted.add(lease)
            else:
                self._schedule_delete(lease)

    def _schedule_delete(self, lease: GlossaryLease) -> None:
        if lease.deleting:
            return
        lease.deleting = True
        task = asyncio.ensure_future(self._delete_when_created(lease))
        self._deletions.add(task)
        task.add_done_callback(self._deletions.discard)

    async def _delete_when_created(self, lease: GlossaryLease) -> None:
        try:
            glossary_id = await asyncio.shield(lease.created)
        except Exception:  # never created: nothing to delete
            return
        if glossary_id is None:
            return
        try:
            await self._delete(glossary_id)
        except Exception as exc:  # a glossary left behind is only logged
            log.warning("deepl: could not delete glossary %s: %s", glossary_id,
                        getattr(exc, "detail", type(exc).__name__))
        else:
            self.deleted += 1


def _retrieved(created: asyncio.Future[str | None]) -> None:
    """Mark a creation's failure as seen: the creator logged it, a batch may never ask."""
    if not created.cancelled():
        created.exception()


def _id_of(lease: GlossaryLease) -> str | None:
    created = lease.created
    if not created.done() or created.cancelled() or created.exception() is not None:
        return None
    return created.result()
