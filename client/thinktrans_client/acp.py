"""Agent Client Protocol (ACP) helpers: the client's locale, and thoughts translated in place.

``locale_from_initialize`` reads the locale an ACP client sends in ``initialize``
``_meta.locale``: a well-formed BCP 47 tag in canonical case (``thinktrans_client.locale``),
admitted by ``allowed``; it never raises. The sidecar stays the authority on targets.

``ThoughtTranslator`` sits on an agent's outgoing ACP messages. The ``agent_thought_chunk``
updates of one session (and one sub-agent) go, as deltas, through one thinktrans stream;
what comes back goes out as ``agent_thought_chunk`` updates whose text is the translation,
with ``_meta.thinktrans`` = ``{"original", "status", "source_lang", "target", "backend"}``
(and ``error`` when there was one). Every other message passes through unchanged, in order:

- any other ``session/update`` of a session (a tool call, a message chunk, a plan...)
  first closes that session's open thought streams, and goes out after all they emit;
- a message of no session (a JSON-RPC response, ``initialize``...) does the same for every
  session;
- sessions do not wait for one another, and sub-agent thoughts (an update whose ``_meta``
  names a sub-agent or a parent tool call, see ``default_lane``) keep streams of their own.

The target is, first that applies: ``target`` given to the translator; the client's
locale from ``initialize``; none, in which case the service detects the language of the
session's last ``session/prompt`` and then uses its own default (API.md's order).

ACP chunks are append-only, so a late ``update`` of a segment that went out as
``deadline`` cannot replace it; the translator leaves it out (a UI that can replace text
can read ``ThinkingStream.results`` itself). With the sidecar down, slow or failing, the
thoughts pass through with status ``error``: ``thinktrans_client.client`` never blocks
and never loses text.

Stream ids are ``<sessionId>:<nonce>.<n>``: the nonce keeps a restarted agent, whose
session ids may repeat, out of streams the sidecar still holds from before.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from thinktrans_client.client import (
    ThinkingStream,
    ThinktransClient,
    TranslatedSegment,
    safe_stream_id,
)
from thinktrans_client.locale import InvalidLocale, canonicalize, is_allowed

__all__ = [
    "ThoughtTranslator",
    "default_lane",
    "locale_from_initialize",
    "translate_messages",
]

log = logging.getLogger("thinktrans.acp")

Send = Callable[[Any], Awaitable[None]]
Lane = Callable[[Mapping[str, Any]], str]

THOUGHT = "agent_thought_chunk"
MAX_USER_TEXT_CHARS = 2000  # enough to detect a language; the service takes up to 100k


# -- the client's locale -------------------------------------------------------------------


def _usable_locale(tag: object, allowed: Sequence[str]) -> str | None:
    """The canonical tag, or None when malformed or not allowed (never raises)."""
    # Whatever a client sends, the agent carries on: a bad locale is only not used.
    try:
        canonical = canonicalize(tag)
    except InvalidLocale:
        return None
    return canonical if is_allowed(canonical, allowed) else None


def locale_from_initialize(
    params: Any, *, allowed: Sequence[str] = (), default: str | None = None
) -> str | None:
    """The canonical locale from ``initialize`` ``_meta.locale``; else ``default``; never raises.

    ``_meta.locale`` is one BCP 47 tag (or a list, most preferred first). A malformed tag,
    or one outside ``allowed`` (``zh`` admits ``zh-CN``), is passed over. Leave ``default``
    None to let the service choose next (the user's message, then its own default).
    """
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    raw = meta.get("locale") if isinstance(meta, Mapping) else None
    candidates = raw[:8] if isinstance(raw, list) else [raw]
    for candidate in candidates:
        tag = _usable_locale(candidate, allowed)
        if tag is not None:
            return tag
    if raw is not None:
        log.info("client locale not usable (malformed or not allowed); using the fallback")
    return _usable_locale(default, allowed)


# -- lanes ---------------------------------------------------------------------------------

_LANE_KEYS = frozenset({
    "parenttoolcallid", "parenttooluseid", "subagent", "subagentid", "subagentname",
    "agentid", "agentname", "taskid", "parentsessionid",
})


def default_lane(update: Mapping[str, Any]) -> str:
    """Which agent of a session a thought is from: "" for the main one.

    Keys in the update's ``_meta`` (two levels deep) that name a sub-agent or a parent
    tool call, e.g. ``{"_meta": {"claudeCode": {"parentToolUseId": "toolu_1"}}}``, with
    case, ``_`` and ``-`` ignored. Other ``_meta`` keys may change chunk by chunk and do
    not split a stream.
    """
    found: list[str] = []

    def walk(node: Any, depth: int) -> None:
        if not isinstance(node, Mapping) or depth > 2:
            return
        for key, value in node.items():
            if key == "thinktrans":
                continue
            name = re.sub(r"[^a-z]", "", str(key).lower())
            if name in _LANE_KEYS and isinstance(value, str | int):
                found.append(f"{name}={value}")
            else:
                walk(value, depth + 1)

    walk(update.get("_meta"), 0)
    return ";".join(sorted(found))


# -- the translator ------------------------------------------------------------------------


def _thought_text(message: Any) -> tuple[str, Mapping[str, Any], str] | None:
    """(session id, update, text) when ``message`` is a text ``agent_thought_chunk``."""
    if not isinstance(message, Mapping) or message.get("method") != "session/update":
        return None
    params = message.get("params")
    if not isinstance(params, Mapping):
        return None
    update = params.get("update")
    session = params.get("sessionId")
    if not isinstance(update, Mapping) or not isinstance(session, str):
        return None
    content = update.get("content")
    if (update.get("sessionUpdate") != THOUGHT or not isinstance(content, Mapping)
            or content.get("type") != "text" or not isinstance(content.get("text"), str)):
        return None
    return session, update, content["text"]


def _session_of(message: Any) -> str | None:
    """The session a message belongs to, or None for one that concerns every session."""
    if isinstance(message, Mapping) and "method" in message:
        params = message.get("params")
        if isinstance(params, Mapping) and isinstance(params.get("sessionId"), str):
            return str(params["sessionId"])
    return None


def _prompt_text(message: Any) -> tuple[str, str] | None:
    """(session id, the user's text) of a ``session/prompt`` request."""
    if not isinstance(message, Mapping) or message.get("method") != "session/prompt":
        return None
    params = message.get("params")
    if not isinstance(params, Mapping) or not isinstance(params.get("sessionId"), str):
        return None
    blocks = params.get("prompt")
    if not isinstance(blocks, list):
        return None
    text = " ".join(b["text"] for b in blocks
                    if isinstance(b, Mapping) and b.get("type") == "text"
                    and isinstance(b.get("text"), str))
    return (params["sessionId"], text[:MAX_USER_TEXT_CHARS]) if text.strip() else None


@dataclass(eq=False)
class _Thoughts:
    """One thinking part: its stream, the first chunk (the shape of those emitted), output."""

    stream: ThinkingStream
    template: Mapping[str, Any]
    ready: deque[dict[str, Any]] = field(default_factory=deque)
    finished: bool = False


@dataclass(eq=False)
class _Slot:
    """A place in the output order: one message, or every chunk of one thinking part."""

    session: str | None  # None: waits for, and holds back, every session
    message: Any = None
    thoughts: _Thoughts | None = None
    done: bool = False


class ThoughtTranslator:
    """Feeds ACP messages in, sends them out with thoughts translated and the order kept.

    ``feed`` never waits on the network; ``send`` is called from a task of the translator,
    one message at a time. Call ``drain`` when a turn ends (thoughts still open are flushed)
    and ``aclose`` at the end. ``stream_options`` go to ``ThinktransClient.stream``.
    """

    def __init__(
        self,
        client: ThinktransClient,
        send: Send,
        *,
        target: str | None = None,
        allowed: Sequence[str] = (),
        lane: Lane = default_lane,
        stream_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        allowed = (allowed,) if isinstance(allowed, str) else tuple(allowed)
        self.target = _usable_locale(target, allowed) if target is not None else None
        if target is not None and self.target is None:
            # The value is left out: it may hold anything, control characters included.
            raise ValueError("target is not a well-formed BCP 47 tag, or not allowed")
        unusable = sum(_usable_locale(entry, ()) is None for entry in allowed)
        if unusable:
            log.warning("%d of %d allowed locales are not BCP 47 tags; they admit nothing",
                        unusable, len(allowed))
        self.client_locale: str | None = None
        self._send = send
        self._allowed = allowed
        self._lane = lane
        self._stream_options = dict(stream_options or {})
        self._nonce = secrets.token_hex(3)
        self._count = 0
        self._open: dict[tuple[str, str], _Thoughts] = {}
        self._user_text: dict[str, str] = {}
        self._slots: list[_Slot] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._emitter: asyncio.Task[None] | None = None
        self._readers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ThoughtTranslator:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- input -------------------------------------------------------------------------------

    async def feed(self, message: Any) -> None:
        """Take the next outgoing message (a parsed JSON-RPC object, or anything to pass on)."""
        if self._closing:
            raise RuntimeError("the translator is closed")
        self._check_emitter()
        thought = _thought_text(message)
        if thought is not None:
            session, update, text = thought
            key = (session, self._lane(update))
            current = self._open.get(key)
            if current is None:
                current = self._start(session, message)
                self._open[key] = current
                self._append(_Slot(session, thoughts=current))
            await current.stream.push(text)
            return
        if isinstance(message, Mapping) and message.get("method") == "initialize":
            self.client_locale = locale_from_initialize(message.get("params"),
                                                        allowed=self._allowed)
        prompt = _prompt_text(message)
        if prompt is not None:
            self._user_text[prompt[0]] = prompt[1]
        scope = _session_of(message)
        await self.flush(scope)
        self._append(_Slot(scope, message=message))

    async def flush(self, session: str | None = None) -> None:
        """Close the open thought streams of ``session`` (of every session when None)."""
        for key in [k for k in self._open if session is None or k[0] == session]:
            await self._open.pop(key).stream.close()

    async def drain(self) -> None:
        """Flush every open thought stream and wait until all fed so far is sent."""
        await self.flush()
        self._check_emitter()
        await self._idle.wait()
        self._check_emitter()

    async def aclose(self) -> None:
        """Drain, then stop; a ``send`` that failed raises here."""
        if not self._closing:
            await self.flush()
            self._closing = True
            self._wake.set()
        try:
            if self._emitter is not None:
                await self._emitter
        finally:
            if self._readers:  # only releasing their server streams by now
                await asyncio.wait(set(self._readers), timeout=self.client.timeout_s * 2)
            for reader in self._readers:
                reader.cancel()

    # -- thinking parts ----------------------------------------------------------------------

    def _start(self, session: str, message: Mapping[str, Any]) -> _Thoughts:
        target = self.target or self.client_locale
        stream = self.client.stream(
            safe_stream_id(session, f"{self._nonce}.{self._count}"), target=target,
            user_text=None if target else self._user_text.get(session), **self._stream_options)
        self._count += 1
        thoughts = _Thoughts(stream, message)
        reader = asyncio.create_task(self._read(thoughts),
                                     name=f"thinktrans-acp:{stream.stream_id}")
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return thoughts

    async def _read(self, thoughts: _Thoughts) -> None:
        try:
            async for item in thoughts.stream.results(updates=False):
                if isinstance(item, TranslatedSegment):
                    thoughts.ready.append(self._chunk(thoughts.template, item))
                    self._wake.set()
        finally:
            thoughts.finished = True
            self._wake.set()
            await thoughts.stream.aclose()

    @staticmethod
    def _chunk(template: Mapping[str, Any], seg: TranslatedSegment) -> dict[str, Any]:
        """An ``agent_thought_chunk`` like ``template`` carrying one segment."""
        params = dict(template["params"])
        update = dict(params["update"])
        update["content"] = {**update["content"], "text": seg.text}
        info: dict[str, Any] = {"original": seg.original, "status": seg.status,
                                "source_lang": seg.source_lang, "target": seg.target,
                                "backend": seg.backend}
        if seg.error is not None:
            info["error"] = seg.error
        meta = update.get("_meta")
        update["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), "thinktrans": info}
        params["update"] = update
        return {**template, "params": params}

    # -- output ------------------------------------------------------------------------------

    def _append(self, slot: _Slot) -> None:
        self._slots.append(slot)
        self._idle.clear()
        if self._emitter is None:
            self._emitter = asyncio.create_task(self._emit(), name="thinktrans-acp:emit")
        self._wake.set()

    def _check_emitter(self) -> None:
        if self._emitter is not None and self._emitter.done():
            self._emitter.result()  # re-raise what send raised
            if not self._closing:
                raise RuntimeError("the translator's output has stopped")

    async def _emit(self) -> None:
        """Send every slot that nothing before it holds back, in order; repeat on change."""
        while True:
            self._wake.clear()  # before the scan: a change during it triggers another
            held_sessions: set[str | None] = set()
            held_all = False  # an unfinished slot of no session holds everything after it
            pending_before = False
            for slot in list(self._slots):
                blocked = held_all or slot.session in held_sessions or (
                    slot.session is None and pending_before)
                if not blocked:
                    await self._emit_slot(slot)
                if not slot.done:
                    pending_before = True
                    if slot.session is None:
                        held_all = True
                    held_sessions.add(slot.session)
            self._slots = [slot for slot in self._slots if not slot.done]
            if not self._slots:
                self._idle.set()
                if self._closing:
                    return
            if not self._wake.is_set():
                await self._wake.wait()

    async def _emit_slot(self, slot: _Slot) -> None:
        thoughts = slot.thoughts
        if thoughts is None:
            await self._send(slot.message)
            slot.done = True
            return
        while thoughts.ready:
            await self._send(thoughts.ready.popleft())
        if thoughts.finished and not thoughts.ready:
            slot.done = True


async def translate_messages(
    client: ThinktransClient, messages: AsyncIterable[Any], **options: Any
) -> AsyncIterator[Any]:
    """The ``messages`` with thoughts translated, in order (``options`` as ThoughtTranslator's)."""
    out: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue()

    async def send(message: Any) -> None:
        await out.put((False, message))

    async def pump() -> None:
        try:
            async with ThoughtTranslator(client, send, **options) as translator:
                async for message in messages:
                    await translator.feed(message)
        finally:
            await out.put((True, None))

    task = asyncio.create_task(pump())
    try:
        while True:
            last, message = await out.get()
            if last:
                break
            yield message
        await task  # re-raise a failure of the input or of the translator
    finally:
        if not task.done():
            task.cancel()
