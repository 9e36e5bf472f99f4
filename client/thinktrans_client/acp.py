"""Agent Client Protocol (ACP) helpers: the client's locale, and thoughts translated in place.

``ThoughtTranslator`` sits on an agent's outgoing ACP messages and sends them on with their
``agent_thought_chunk`` updates translated, everything else unchanged and in order, so an
agent's thinking reaches the user in their language with no change to the agent or the
editor. ACP chunks are append-only: what went out cannot be replaced, so previews and late
updates are never forwarded. ``locale_from_initialize`` and ``advertise_locales`` read and
answer the client's locale. docs/integration.md tells how to use them.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from thinktrans_client.client import (
    SidecarError,
    ThinkingStream,
    ThinktransClient,
    TranslatedSegment,
    safe_stream_id,
)
from thinktrans_client.locale import InvalidLocale, canonicalize, is_allowed, language_of

__all__ = [
    "ThoughtTranslator",
    "advertise_locales",
    "default_lane",
    "locale_from_initialize",
    "translate_messages",
]

log = logging.getLogger("thinktrans.acp")

Send = Callable[[Any], Awaitable[None]]
Lane = Callable[[Mapping[str, Any]], str]

THOUGHT = "agent_thought_chunk"
_NO_ID: Any = object()  # no initialize request awaits its answer
MAX_USER_TEXT_CHARS = 2000  # enough to detect a language; the service takes up to 100k
# Requests awaiting their answer, and sessions' locales, remembered (oldest forgotten first).
MAX_TRACKED = 1024
# The sidecar's answers that refuse a stream's target: the next choice is used after them.
TARGET_REFUSED = frozenset({"invalid-locale", "locale-not-allowed"})
# Messages waiting to go out (messages, and translated chunks) before ``feed`` waits for
# room: a client that stops reading then stops the agent's output, not memory.
MAX_PENDING_MESSAGES = 256
# Requests whose answer names a new session, and those that reopen the one they name.
_NEW_SESSION = frozenset({"session/new", "session/fork"})
# What a client asks an agent: in what ``feed`` gets (an agent's messages, or a recording of
# both directions) only these are the client's; the ids of the agent's own requests
# (``session/request_permission``, ``fs/...``, extensions) say nothing of the client's.
_FROM_THE_CLIENT = frozenset({
    "initialize", "authenticate", "session/new", "session/load", "session/prompt",
    "session/cancel", "session/fork", "session/resume", "session/set_mode",
    "session/set_config_option", "session/list", "session/close"})
_REOPEN_SESSION = frozenset({"session/load", "session/resume"})


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


def advertise_locales(result: Mapping[str, Any], locales: Sequence[str] | None
                      ) -> dict[str, Any]:
    """A copy of an ``initialize`` result with ``_meta.thinktrans.locales`` = ``locales``.

    The locales a client may send in ``_meta.locale`` and get thoughts in. Other ``_meta``
    keys stay; ``result`` is not modified. ``locales`` None (any target) writes nothing:
    absent already means "no restriction" to a client, which must handle agents without
    thinktrans anyway, and a null would be a third case for every client to learn. A
    ``_meta`` (or ``_meta.thinktrans``) that is not an object is left as it is, unchanged.
    """
    out = dict(result)
    if locales is None:
        return out
    meta = result.get("_meta", {})
    ours = meta.get("thinktrans", {}) if isinstance(meta, Mapping) else None
    if not isinstance(meta, Mapping) or not isinstance(ours, Mapping):
        return out  # not ours to repair: what the agent wrote goes out as it wrote it
    listed = [locales] if isinstance(locales, str) else list(locales)
    out["_meta"] = {**meta, "thinktrans": {**ours, "locales": listed}}
    return out


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
    """(session id, update, text) when ``message`` is a text ``agent_thought_chunk``
    notification.

    One sent as a request (with an ``id``) is not: it awaits one answer, to that message,
    so it goes out once, as it came, like any other message of its session. Translated,
    it would be cut into sentences that cannot all carry its ``id``, nor any of them
    without making a notification of the same part a request.
    """
    if (not isinstance(message, Mapping) or message.get("method") != "session/update"
            or "id" in message):
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


RequestKey = tuple[str, str | int]


def _request_key(message: Mapping[str, Any]) -> RequestKey | None:
    """A JSON-RPC id as a dict key (``1`` and ``"1"`` differ); None when it has no usable id."""
    value = message.get("id")
    if isinstance(value, str | int) and not isinstance(value, bool):
        return type(value).__name__, value
    return None


def _remember(table: dict[Any, Any], key: Any, value: Any) -> None:
    """Set ``table[key]``, forgetting the oldest entries past ``MAX_TRACKED``."""
    table.pop(key, None)
    table[key] = value
    while len(table) > MAX_TRACKED:
        del table[next(iter(table))]


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
    message_id: object = None  # the chunks' ``messageId``: a new one starts a new part
    chosen: str | None = None  # the session's or client's locale it asked for, if any
    ready: deque[dict[str, Any]] = field(default_factory=deque)
    finished: bool = False


@dataclass(eq=False)
class _Slot:
    """A place in the output order: one message, or every chunk of one thinking part."""

    session: str | None  # None: waits for, and holds back, every session
    message: Any = None
    thoughts: _Thoughts | None = None
    done: bool = False
    held: bool = False  # the message is not final yet (an initialize answer being completed)


def _same_id(a: object, b: object) -> bool:
    """JSON-RPC ids are numbers or strings: ``1``, ``"1"`` and ``true`` are three ids."""
    return type(a) is type(b) and a == b


class _Sessions:
    """What the client's messages tell (see ``ThoughtTranslator.observe``): its locale, each
    session's, the user's text of each prompt, which session a request is of, and the
    ``initialize`` request whose answer gets the locales."""

    def __init__(self, allowed: Sequence[str], *, advertise: bool) -> None:
        self.client_locale: str | None = None
        self.locales: dict[str, str] = {}  # session -> its own locale
        self.user_text: dict[str, str] = {}  # session -> its last prompt's text
        self._allowed = allowed
        self._advertise = advertise
        self._initialize_id: Any = _NO_ID
        self._new: dict[RequestKey, str | None] = {}  # request -> locale it asked for
        self._requests: dict[RequestKey, str] = {}  # request -> the session it is of

    def note(self, message: Any) -> None:
        """Learn from a client's request; never raises, never sends."""
        if not isinstance(message, Mapping) or not isinstance(message.get("method"), str):
            return
        method, params, key = message["method"], message.get("params"), _request_key(message)
        if method == "initialize":
            self.client_locale = locale_from_initialize(params, allowed=self._allowed)
            if self._advertise and "id" in message:
                self._initialize_id = message["id"]
            return
        if not isinstance(params, Mapping):
            return
        session = params.get("sessionId")
        session = session if isinstance(session, str) else None
        if method in _NEW_SESSION or method in _REOPEN_SESSION:
            meta = params.get("_meta")
            locale = (locale_from_initialize(params, allowed=self._allowed)
                      if isinstance(meta, Mapping) and "locale" in meta else None)
            if method in _NEW_SESSION:
                if key is not None:  # a fork keeps its source's locale unless it names one
                    inherited = self.locales.get(session) if session else None
                    _remember(self._new, key, locale or inherited)
                return
            if session is not None and locale is not None:
                _remember(self.locales, session, locale)
        if session is not None and key is not None:
            _remember(self._requests, key, session)
        prompt = _prompt_text(message)
        if prompt is not None:
            _remember(self.user_text, prompt[0], prompt[1])

    def answered(self, response: Mapping[str, Any]) -> str | None:
        """The session an answer from the agent is of (None: unknown, or of none)."""
        key = _request_key(response)
        if key is None:
            return None
        if key in self._new:
            locale = self._new.pop(key)
            result = response.get("result")
            session = result.get("sessionId") if isinstance(result, Mapping) else None
            if not isinstance(session, str):
                return None
            if locale is not None:
                _remember(self.locales, session, locale)
            return session  # a new session: no one else's thinking waits on it
        return self._requests.pop(key, None)

    def answers_initialize(self, message: Any) -> bool:
        """Whether ``message`` is the successful answer to the ``initialize`` seen earlier."""
        if (self._initialize_id is _NO_ID or not isinstance(message, Mapping)
                or "method" in message or not _same_id(message.get("id"), self._initialize_id)):
            return False
        self._initialize_id = _NO_ID  # answered (or refused): later ids may be reused
        return isinstance(message.get("result"), Mapping)


class _Output:
    """The output order, sent by one task one message at a time: a slot goes out once no
    unfinished slot of its session is before it (a slot of no session waits for every one
    before it, and holds back every one after it). ``full`` counts the slots and the
    translated chunks waiting, against ``max_pending``."""

    def __init__(self, send: Send, max_pending: int) -> None:
        self._send = send
        self.max_pending = max_pending
        self.slots: list[_Slot] = []
        self._ready_count = 0  # translated chunks waiting in parts' ``ready``
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()
        self.room = asyncio.Event()  # set as messages go out, or when the output stops
        self.closing = False
        self._emitter: asyncio.Task[None] | None = None

    def full(self) -> bool:
        return len(self.slots) + self._ready_count >= self.max_pending

    def append(self, slot: _Slot) -> None:
        self.slots.append(slot)
        self.idle.clear()
        if self._emitter is None:
            self._emitter = asyncio.create_task(self._emit(), name="thinktrans-acp:emit")
            # A feed waiting for room learns that no more will come.
            self._emitter.add_done_callback(lambda _: self.room.set())
        self._wake.set()

    def add_ready(self, thoughts: _Thoughts, chunk: dict[str, Any]) -> None:
        """A translated chunk of a thinking part, to go out in its slot."""
        thoughts.ready.append(chunk)
        self._ready_count += 1
        self._wake.set()

    def changed(self) -> None:
        self._wake.set()

    def check(self) -> None:
        """Raise what ``send`` raised, or that the output has stopped."""
        if self._emitter is not None and self._emitter.done():
            self._emitter.result()
            if not self.closing:
                raise RuntimeError("the translator's output has stopped")

    def close(self) -> None:
        """No more slots: the task ends once every slot is out."""
        self.closing = True
        self._wake.set()

    async def finished(self) -> None:
        if self._emitter is not None:
            await self._emitter

    async def _emit(self) -> None:
        """Send every slot that nothing before it holds back, in order; repeat on change."""
        while True:
            self._wake.clear()  # before the scan: a change during it triggers another
            held_sessions: set[str | None] = set()
            held_all = False  # an unfinished slot of no session holds everything after it
            pending_before = False
            for slot in list(self.slots):
                blocked = held_all or slot.session in held_sessions or (
                    slot.session is None and pending_before)
                if not blocked:
                    await self._emit_slot(slot)
                if not slot.done:
                    pending_before = True
                    if slot.session is None:
                        held_all = True
                    held_sessions.add(slot.session)
            self.slots = [slot for slot in self.slots if not slot.done]
            self.room.set()
            if not self.slots:
                self.idle.set()
                if self.closing:
                    return
            if not self._wake.is_set():
                await self._wake.wait()

    async def _emit_slot(self, slot: _Slot) -> None:
        thoughts = slot.thoughts
        if thoughts is None:
            if slot.held:
                return
            await self._send(slot.message)
            slot.done = True
            return
        while thoughts.ready:
            await self._send(thoughts.ready.popleft())
            self._ready_count -= 1
            self.room.set()
        if thoughts.finished and not thoughts.ready:
            slot.done = True


class ThoughtTranslator:
    """Feeds ACP messages in, sends them out with thoughts translated and the order kept.

    ``feed`` never waits on the network, only for room: with ``max_pending`` messages and
    translated chunks waiting to be sent (``send`` slow, or thoughts before them not back
    yet, which the client's budgets bound), it waits until one has gone out. ``send`` is
    called from a task of the translator, one message at a time. Call ``drain`` when a turn
    ends (thoughts still open are flushed) and ``aclose`` at the end. ``stream_options`` go
    to ``ThinktransClient.stream`` (``model``, ``policy``, ``backend``,
    ``flush_interval_s``...; ``previews`` is always False). ``advertise_locales``: add the
    locales thoughts can be translated into to the agent's ``initialize`` answer.

    It composes what the client's messages tell (``_Sessions``), the output order
    (``_Output``), and one sidecar stream per open thinking part.
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
        advertise_locales: bool = True,
        max_pending: int = MAX_PENDING_MESSAGES,
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
        self._allowed = allowed
        self._lane = lane
        if (stream_options or {}).get("previews"):
            raise ValueError("ACP chunks are append-only: a preview could never be replaced "
                             "by its segment, so the translator takes no previews")
        # Asked off, not left to the sidecar: its THINKTRANS_PREVIEWS may be on.
        self._stream_options = {**(stream_options or {}), "previews": False}
        self._sessions = _Sessions(allowed, advertise=advertise_locales)
        self._out = _Output(send, max_pending)
        # Stream ids are ``<sessionId>:<nonce>.<n>``: the nonce keeps a restarted agent,
        # whose session ids may repeat, out of streams the sidecar still holds from before.
        self._nonce = secrets.token_hex(3)
        self._count = 0
        self._open: dict[tuple[str, str], _Thoughts] = {}
        self._served: list[str] | None = None  # the sidecar's targets, once it has said
        self._passed_over: set[str] = set()  # locales not served or refused (logged once)
        self._tasks: set[asyncio.Task[None]] = set()  # readers, and the locales look-up

    @property
    def client_locale(self) -> str | None:
        """The locale the client's ``initialize`` named (None: none, or not usable)."""
        return self._sessions.client_locale

    async def __aenter__(self) -> ThoughtTranslator:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- input -------------------------------------------------------------------------------

    async def feed(self, message: Any) -> None:
        """Take the next outgoing message (a parsed JSON-RPC object, or anything to pass on).

        A thinking part is the run of a session's (and lane's) thought chunks between its
        other updates; a new ``messageId`` starts another. Any other message of a session
        (a thought sent as a request, with an ``id``, too: it goes out once, as it came)
        first closes that session's open parts and goes out after all they emit; the
        answer to a request seen counts as its session's; a message of no session does the
        same for every session. Sessions never wait for one another.
        """
        if self._out.closing:
            raise RuntimeError("the translator is closed")
        await self._wait_for_room()
        thought = _thought_text(message)
        if thought is not None and not thought[2]:
            # No text to translate: it goes out as it is, after the part it belongs to.
            self._out.append(_Slot(thought[0], message=message))
            return
        if thought is not None:
            await self._feed_thought(message, *thought)
            return
        if isinstance(message, Mapping) and message.get("method") in _FROM_THE_CLIENT:
            self._sessions.note(message)
        scope = _session_of(message)
        if scope is None and isinstance(message, Mapping) and "method" not in message:
            scope = self._sessions.answered(message)
        await self.flush(scope)
        slot = _Slot(scope, message=message)
        if self._sessions.answers_initialize(message):
            # Held in its place (and everything after it) until the look-up ends, which
            # the client bounds by its timeout_s: feed itself never waits on the network.
            slot.held = True
            self._spawn(self._advertise_into(slot), "thinktrans-acp:locales")
        self._out.append(slot)

    async def _wait_for_room(self) -> None:
        self._out.check()
        while True:
            self._out.room.clear()  # the output sets it as messages go out, or when it stops
            if not self._out.full():
                return
            # An open part holds back what follows it in its session until it is closed,
            # which only a later message would do: close them all, so the wait is bounded
            # by the client's budgets (or by ``send``).
            await self.flush()
            await self._out.room.wait()
            self._out.check()

    async def _feed_thought(self, message: Any, session: str, update: Mapping[str, Any],
                            text: str) -> None:
        key = (session, self._lane(update))
        current = self._open.get(key)
        message_id = update.get("messageId")
        if current is not None and message_id is not None and (
                message_id != current.message_id):
            await self._open.pop(key).stream.close()
            current = None
        if current is None:
            current = self._start(session, message, message_id)
            self._open[key] = current
            self._out.append(_Slot(session, thoughts=current))
        await current.stream.push(text)

    async def observe(self, message: Any) -> None:
        """Take a message from the client to the agent, which the translator does not send.

        What it learns: the client's locale and the ``initialize`` request to answer with
        locales; each session's own locale; the user's text of each prompt; which session a
        request is of, so its answer (the end of a prompt turn) closes only that session's
        thinking parts. ``session/cancel`` closes them at once. Anything else is ignored.
        """
        self._sessions.note(message)
        if isinstance(message, Mapping) and message.get("method") == "session/cancel":
            session = _session_of(message)
            if session is not None:
                await self.flush(session)

    async def flush(self, session: str | None = None) -> None:
        """Close the open thought streams of ``session`` (of every session when None)."""
        for key in [k for k in self._open if session is None or k[0] == session]:
            await self._open.pop(key).stream.close()

    async def drain(self) -> None:
        """Flush every open thought stream and wait until all fed so far is sent."""
        await self.flush()
        self._out.check()
        await self._out.idle.wait()
        self._out.check()

    async def aclose(self) -> None:
        """Drain, then stop; a ``send`` that failed raises here."""
        if not self._out.closing:
            await self.flush()
            self._out.close()
        try:
            await self._out.finished()
        finally:
            if self._tasks:  # readers releasing their server streams (the look-up has ended)
                await asyncio.wait(set(self._tasks), timeout=self.client.timeout_s * 2)
            for task in self._tasks:
                task.cancel()

    # -- thinking parts ----------------------------------------------------------------------

    def _target_for(self, session: str) -> str | None:
        """The fixed target; else the session's locale, else the client's, if served; else
        None, and the sidecar detects the language of the session's last prompt. A locale
        whose language the sidecar does not serve is passed over, so a well-formed but
        unknown tag (``zz``) does not cost a session its translations."""
        if self.target is not None:
            return self.target
        for tag in (self._sessions.locales.get(session), self._sessions.client_locale):
            if tag is None or tag in self._passed_over:
                continue
            # The sidecar resolves script and region (its zh-Hans serves a zh-CN): the
            # language decides. Nothing listed (none ready yet) is no reason to pass over.
            if not self._served or language_of(tag) in {language_of(t) for t in self._served}:
                return tag
            self._pass_over(tag, "is not among the sidecar's targets")
        return None

    def _pass_over(self, tag: str, why: str) -> None:
        if len(self._passed_over) < MAX_TRACKED:
            self._passed_over.add(tag)
            # A canonical tag is letters, digits and '-': safe to log.
            log.warning("locale %s %s; using the next choice", tag, why)

    def _start(self, session: str, message: Mapping[str, Any],
               message_id: object = None) -> _Thoughts:
        target = self._target_for(session)
        stream = self.client.stream(
            safe_stream_id(session, f"{self._nonce}.{self._count}"), target=target,
            user_text=None if target else self._sessions.user_text.get(session),
            **self._stream_options)
        self._count += 1
        thoughts = _Thoughts(stream, message, message_id,
                             chosen=target if target != self.target else None)
        self._spawn(self._read(thoughts), f"thinktrans-acp:{stream.stream_id}")
        return thoughts

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, thoughts: _Thoughts) -> None:
        try:
            # No late updates: a chunk that went out as ``deadline`` cannot be replaced.
            async for item in thoughts.stream.results(updates=False):
                if isinstance(item, TranslatedSegment):
                    self._out.add_ready(thoughts, _chunk(thoughts.template, item))
        finally:
            thoughts.finished = True
            self._out.changed()
            await thoughts.stream.aclose()
            # This part went out untranslated; the session's next ones take the next choice.
            if thoughts.chosen is not None and thoughts.stream.failure_slug in TARGET_REFUSED:
                self._pass_over(thoughts.chosen, "was refused by the sidecar")

    # -- the initialize answer ---------------------------------------------------------------

    async def _advertise_into(self, slot: _Slot) -> None:
        """Add the locales to the held answer; on any failure it goes out unchanged."""
        try:
            offered = await self._locales_to_offer()
            if offered == []:
                # Often backends still loading at start-up: "none" would stick for the session.
                log.warning("initialize answer passed on without locales: the sidecar "
                            "serves no target the translator admits, now")
            else:
                result = advertise_locales(slot.message["result"], offered)
                slot.message = {**slot.message, "result": result}
        except SidecarError as exc:
            log.warning("initialize answer passed on without locales: %s", exc.reason)
        except Exception:  # a bug here must not cost the client the agent's answer
            log.exception("initialize answer passed on without locales")
        finally:
            slot.held = False
            self._out.changed()

    async def _locales_to_offer(self) -> list[str] | None:
        """The locales worth a client's asking: the sidecar's targets now, within ``allowed``;
        with a fixed ``target``, that one alone (the client's locale is not used then).
        None: any. SidecarError when the sidecar does not say."""
        targets = await self.client.supported_targets()
        self._served = targets
        if targets is None:  # the sidecar takes any target; the translator may not
            offered = [self.target] if self.target is not None else [
                tag for entry in self._allowed if (tag := _usable_locale(entry, ())) is not None]
            return offered or None
        if self.target is not None:
            # ``allowed`` semantics on the sidecar's list: its ``zh`` serves a ``zh-CN``.
            return [self.target] if targets and _usable_locale(self.target, targets) else []
        return [tag for tag in targets if _usable_locale(tag, self._allowed) is not None]


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
    if seg.model is not None:
        info["model"] = seg.model
    if seg.cached:
        info["cached"] = True
    meta = update.get("_meta")
    update["_meta"] = {**(meta if isinstance(meta, Mapping) else {}), "thinktrans": info}
    params["update"] = update
    return {**template, "params": params}


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
