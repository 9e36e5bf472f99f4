"""The client that agent servers use: one-shot translation and streamed thinking.

Light to import: httpx and the standard library only (no torch, transformers, fastapi
or server modules), so an agent server can import it on its hot path. It knows the
sidecar only through the HTTP contract (API.md).

::

    async with ThinktransClient("http://127.0.0.1:8088", timeout_s=2.0) as tt:
        [result] = await tt.translate(["Let me check the logs."], target="zh-CN")

        stream = tt.stream("sess-1:0", target="zh-CN")
        await stream.push("Let me")        # returns at once; posted in the background
        await stream.push(" check.")
        await stream.close()               # no more deltas; returns at once too
        async for item in stream.results():
            if isinstance(item, TranslatedSegment):
                show(item.text)            # in order; item.original is what was pushed
            else:                          # SegmentUpdate: a late translation of a
                replace(item.index, item.text)  # segment that went out as `deadline`
        await stream.aclose()

Choosing. ``translate`` and ``stream`` take ``model`` (a model for the backends to use;
``models()`` lists the sidecar's catalog, which is advice: a name not listed is tried) and
``policy`` (``"hide"``: segments not in the target language come back ``hidden``, with
empty text and the original kept). Each is sent only when set, so a sidecar that predates
them keeps serving everyone else. ``supported_targets()`` says which targets the sidecar
can translate into now (None: any), for a client to offer only those.

Sending. ``push`` only appends to a buffer; a background task posts the buffer as one
chunk every ``flush_interval_s`` (or sooner once ``flush_chars`` are waiting). Each chunk
gets the next seq when it is formed and never changes after, so a retry re-posts the same
seq and text, which the server ignores: retries are safe. A connection dropped mid-request
is retried once; 429 and 503 (a full queue) are retried after ``Retry-After``.

Reading. ``results`` long-polls ``GET /v1/streams/{id}/events?after=N``; ``after`` is the
last event id seen, so a failed poll resumes where it stopped. Long-poll rather than SSE
because every poll then has a bounded duration (``poll_wait_s`` + ``timeout_s``): a hung
sidecar is noticed within that, where SSE would only show it after its 15 s keep-alive.

Falling back. The agent's output is never blocked and nothing is lost. The stream falls
back to the originals when the sidecar

- is unreachable (connection refused, reset);
- takes longer than ``timeout_s`` (beyond the planned long-poll wait) to answer a request;
- answers an error (any 4xx or 5xx; 429 and 503 are retried as ``Retry-After`` asks,
  as long as that keeps the wait within ``timeout_s``);
- returns no result for pushed text within ``stall_s`` of the later of the last push and
  the last result (it must exceed the server's ``flush_idle_ms`` + ``deadline_ms``).

From then on ``results`` yields the pushed text that no received segment covered, once, as
one segment with status ``error`` (``error`` says why, ``backend`` is None), then every
later push the same way. So, whatever happens, the ``original`` fields of everything
``results`` yields, joined, equal the pushed deltas, joined. After a failure of the
sidecar itself (not a 4xx), new streams and translations skip it for ``cooloff_s``.

The fallback is the same under ``policy="hide"``: the originals, shown, as ``error``. Only
the sidecar can tell which segments are foreign; hiding all the text instead would turn a
failing sidecar into thinking that silently disappears, which no user could tell apart
from an agent that did not think.

What streams use of the client, all public: ``request`` (one call within the budget),
``note_failure`` (starts the skip), ``release_stream`` (a background DELETE that
``aclose`` waits for) and the budgets ``timeout_s``, ``stall_s`` and ``poll_wait_s``.

Logs hold stream ids, lengths and reasons, never thinking text.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar, get_args

import httpx

__all__ = [
    "Policy",
    "SegmentUpdate",
    "SidecarError",
    "StreamItem",
    "ThinkingStream",
    "ThinktransClient",
    "TranslatedSegment",
    "TranslatedText",
    "safe_stream_id",
]

log = logging.getLogger("thinktrans.client")

T = TypeVar("T")

STREAM_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Below the server's defaults (max_chunk_chars 16384, max_chunks_per_request 1024, and
# max_request_bytes 1 MiB: 65536 characters are at most 6 bytes each as JSON).
MAX_CHUNK_CHARS = 8192
MAX_CHUNKS_PER_POST = 256
MAX_CHARS_PER_POST = 65536

# What becomes of segments not in the target language (API.md): translated, or hidden
# (status ``hidden``, empty text). None leaves it to the server's THINKTRANS_POLICY.
Policy = Literal["translate", "hide"]
POLICIES: tuple[str, ...] = get_args(Policy)


# -- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TranslatedSegment:
    """One segment result (API.md, 'Segment result'); ``text`` is what to show."""

    index: int
    original: str
    text: str
    # translated, same_language, skipped, deadline, error, no_target, or hidden (the
    # stream asked ``policy="hide"``: ``text`` is empty, ``original`` still holds the text)
    status: str
    source_lang: str | None = None
    target: str | None = None
    backend: str | None = None
    error: str | None = None
    queued_ms: float = 0.0
    latency_ms: float = 0.0
    model: str | None = None  # the model that translated it, where the backend has one
    cached: bool = False  # True: it came from the sidecar's translation cache

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TranslatedSegment:
        return cls(
            index=int(data["index"]), original=str(data["original"]), text=str(data["text"]),
            status=str(data["status"]), source_lang=data.get("source_lang"),
            target=data.get("target"), backend=data.get("backend"), error=data.get("error"),
            queued_ms=float(data.get("queued_ms") or 0.0),
            latency_ms=float(data.get("latency_ms") or 0.0),
            model=_optional_str(data.get("model")), cached=data.get("cached") is True,
        )


@dataclass(frozen=True, slots=True)
class SegmentUpdate:
    """A late translation of segment ``index``, which went out earlier as ``deadline``."""

    index: int
    text: str
    status: str  # translated, or error when the late translation failed
    backend: str | None = None
    error: str | None = None
    model: str | None = None
    cached: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SegmentUpdate:
        return cls(
            index=int(data["index"]), text=str(data["text"]), status=str(data["status"]),
            backend=data.get("backend"), error=data.get("error"),
            model=_optional_str(data.get("model")), cached=data.get("cached") is True,
        )


@dataclass(frozen=True, slots=True)
class TranslatedText:
    """One text of a one-shot request: the whole text to show and its segments."""

    text: str
    segments: tuple[TranslatedSegment, ...]


StreamItem = TranslatedSegment | SegmentUpdate


class SidecarError(Exception):
    """The sidecar did not serve a request; ``reason`` says why, without thinking text."""

    def __init__(self, reason: str, *, status: int | None = None,
                 retry_after_s: float | None = None, slug: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after_s = retry_after_s
        self.slug = slug  # the problem type's slug, e.g. ``invalid-locale``

    @property
    def transient(self) -> bool:
        """Worth retrying with the same request: the server asked us to come back later."""
        return self.status in (429, 503)

    @property
    def sidecar_failed(self) -> bool:
        """The sidecar itself failed (unreachable, slow, 5xx), not the request."""
        return self.status is None or self.status >= 500


class _Skipped(SidecarError):
    """The sidecar is being skipped; not itself a failure (noting it would never end the skip)."""

    def __init__(self) -> None:
        super().__init__("skipped after a recent failure")


def safe_stream_id(*parts: str) -> str:
    """A stream id (1-128 of ``A-Za-z0-9._:-``) from parts joined by ``:``.

    A part with other characters, or too long to fit, is cut down and given a hash of
    the whole part, so distinct parts stay distinct.
    """
    if not parts:
        raise ValueError("safe_stream_id needs at least one part")
    room = max(16, (128 - (len(parts) - 1)) // len(parts))
    out = []
    for part in parts:
        clean = _UNSAFE.sub("_", part) or "_"
        if clean != part or len(clean) > room:
            digest = hashlib.blake2s(part.encode("utf-8", "surrogatepass"),
                                     digest_size=6).hexdigest()
            clean = f"{clean[: room - len(digest) - 1]}.{digest}"
        out.append(clean)
    return ":".join(out)[:128]


def _optional_str(value: object) -> str | None:
    """A field that is a string or absent; None for anything else (an answer is not trusted)."""
    return value if isinstance(value, str) else None


def _choices(model: str | None, policy: str | None) -> dict[str, str]:
    """The request fields for ``model`` and ``policy``, only those set.

    Left out when unset, not sent as null: a sidecar that predates them refuses a body with
    fields it does not know (422), and would then serve nobody who did not ask for them.
    """
    if model is not None and (not isinstance(model, str) or not model):
        raise ValueError("model must be a non-empty string, or None for the backend's own")
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, or None for the "
                         "server's THINKTRANS_POLICY")
    fields = {"model": model, "policy": policy}
    return {name: value for name, value in fields.items() if value is not None}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _problem_slug(response: httpx.Response) -> str:
    """The problem type's slug, e.g. ``invalid-locale``; never the detail, which may echo input."""
    try:
        kind = response.json().get("type", "")
    except (ValueError, AttributeError):
        return ""
    return str(kind).rsplit(":", 1)[-1][:64] if isinstance(kind, str) else ""


# -- the client ----------------------------------------------------------------------------


class ThinktransClient:
    """An async client of one thinktrans sidecar; one per agent server, shared by its streams.

    ``timeout_s``: longest one request may take beyond its planned wait. ``stall_s``: how
    long pushed text may go without a result (see the module docstring). ``cooloff_s``:
    how long the sidecar is skipped after it failed.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 2.0,
        stall_s: float = 10.0,
        cooloff_s: float = 5.0,
        poll_wait_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        for name, value in (("timeout_s", timeout_s), ("stall_s", stall_s),
                            ("poll_wait_s", poll_wait_s)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if cooloff_s < 0:
            raise ValueError(f"cooloff_s must be >= 0, got {cooloff_s}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.cooloff_s = cooloff_s
        self.poll_wait_s = poll_wait_s
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # httpx's own timeouts are per phase; the total budget is enforced in request().
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                       timeout=httpx.Timeout(timeout_s + poll_wait_s + 1.0),
                                       transport=transport)
        self._down_until = 0.0
        self._background: set[asyncio.Task[None]] = set()
        self._closing = False
        self._closed = False

    async def __aenter__(self) -> ThinktransClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Let background clean-up finish (bounded by ``timeout_s``), then close connections."""
        self._closing = True  # no new work; what runs may still use the connections
        if self._background:
            _done, pending = await asyncio.wait(set(self._background),
                                                timeout=self.timeout_s * 2)
            for task in pending:
                task.cancel()
        self._closed = True
        await self._http.aclose()

    @property
    def available(self) -> bool:
        """False while a recent failure of the sidecar has it skipped (``cooloff_s``)."""
        return not self._closing and time.monotonic() >= self._down_until

    def note_failure(self, exc: SidecarError) -> None:
        """Record a failed call: a failure of the sidecar itself starts ``cooloff_s``."""
        if not isinstance(exc, _Skipped) and exc.sidecar_failed:
            self._down_until = time.monotonic() + self.cooloff_s

    def release_stream(self, stream_id: str) -> None:
        """Delete the sidecar's stream in the background (``aclose`` waits for it).

        Ended streams hold their events on the sidecar until they expire; this frees them
        sooner. Best effort: a failure is only logged, and nothing is sent once the client
        is closing.
        """
        if self._closing:
            return
        task = asyncio.create_task(self._delete_stream(stream_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_stream(self, stream_id: str) -> None:
        try:
            await self.request("DELETE", f"/v1/streams/{stream_id}")
        except SidecarError as exc:
            log.debug("stream %s delete failed: %s", stream_id, exc.reason)

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, Any] | None = None, wait_s: float = 0.0) -> Any:
        """One call within ``timeout_s`` (+ ``wait_s``); the JSON answer, or SidecarError.

        A dropped kept-alive connection is retried once; nothing else is retried here,
        and the cool-off is neither checked nor started (see ``available``, ``note_failure``).
        """
        if self._closed:
            raise SidecarError("client is closed")
        budget = self.timeout_s + wait_s
        try:
            async with asyncio.timeout(budget):
                try:
                    response = await self._http.request(method, path, json=json, params=params)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    # Often a kept-alive connection the server had closed: once more, fresh.
                    response = await self._http.request(method, path, json=json, params=params)
        except (TimeoutError, httpx.TimeoutException):
            raise SidecarError(f"no answer within {budget:.1f}s") from None
        except httpx.HTTPError as exc:
            raise SidecarError(f"unreachable ({type(exc).__name__})") from None
        status = response.status_code
        if status >= 400:
            slug = _problem_slug(response)
            raise SidecarError(f"HTTP {status}{' ' + slug if slug else ''}", status=status,
                               retry_after_s=_retry_after(response), slug=slug or None)
        if status == 204:
            return None
        try:
            return response.json()
        except ValueError:
            raise SidecarError(f"HTTP {status} answer is not JSON", status=status) from None

    # -- one-shot ----------------------------------------------------------------------------

    async def translate(
        self,
        texts: Sequence[str],
        *,
        target: str | None = None,
        source: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        policy: Policy | None = None,
        fallback: bool = True,
    ) -> list[TranslatedText]:
        """Translate whole texts; on failure, the originals (status ``error``) if ``fallback``.

        ``model``: a model for the backends to use (``models()`` lists what they offer; a
        name not listed is tried too); ``policy``: ``"hide"`` answers segments not in the
        target language with status ``hidden`` and empty text. Both are sent only when set.

        The fallback is the same under ``policy="hide"``: the originals, shown, with status
        ``error``. Only the sidecar knows which segments are foreign, and hiding everything
        instead would make a failing sidecar silently swallow the agent's thinking.
        """
        texts = list(texts)
        if not texts:
            return []
        choices = _choices(model, policy)
        try:
            if not self.available:
                raise _Skipped()
            body = await self.request("POST", "/v1/translate", json={
                "target": target, "source": source, "backend": backend, **choices,
                "texts": texts})
            try:
                results = [
                    TranslatedText(str(r["text"]),
                                   tuple(TranslatedSegment.from_json(s) for s in r["segments"]))
                    for r in body["results"]
                ]
            except (KeyError, TypeError, ValueError):
                raise SidecarError("malformed answer") from None
            if len(results) != len(texts):
                raise SidecarError(f"{len(results)} results for {len(texts)} texts")
            return results
        except SidecarError as exc:
            self.note_failure(exc)
            if not fallback:
                raise
            log.warning("translate falls back to the originals: %s texts=%d chars=%d",
                        exc.reason, len(texts), sum(map(len, texts)))
            reason = f"sidecar: {exc.reason}"
            return [TranslatedText(t, (TranslatedSegment(0, t, t, "error", target=target,
                                                         error=reason),)) for t in texts]

    # -- what the sidecar offers --------------------------------------------------------------

    async def languages(self) -> dict[str, Any]:
        """``GET /v1/languages`` as the sidecar answers it; SidecarError when it does not.

        ``{"default_target", "allowed_locales", "targets", "backends"}``: see
        ``supported_targets`` for ``targets``; ``backends`` gives each backend's readiness,
        targets and models.
        """
        data = await self._info("/v1/languages")
        if not isinstance(data, dict):
            raise SidecarError("malformed answer to languages")
        return data

    async def supported_targets(self) -> list[str] | None:
        """The targets the sidecar's default chain can translate into now; None: any.

        Raises SidecarError when the sidecar does not say (down, failing, or older than
        ``targets``): callers decide what to offer then, as "any" would not be known.
        """
        data = await self.languages()
        if "targets" not in data:
            raise SidecarError("the answer to languages has no targets (an older sidecar)")
        targets = data["targets"]
        if targets is None:
            return None
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise SidecarError("malformed targets in the answer to languages")
        return list(targets)

    async def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: ``{"backend", "model", "languages", "default", "notes"}`` each.

        Advice, not a whitelist: ``translate`` and ``stream`` may name a model not listed.
        Raises SidecarError when the sidecar does not answer.
        """
        data = await self._info("/v1/models")
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
            raise SidecarError("malformed answer to models")
        return models

    async def _info(self, path: str) -> Any:
        """A GET of what the sidecar offers, honouring and starting the cool-off as others do."""
        try:
            if not self.available:
                raise _Skipped()
            return await self.request("GET", path)
        except SidecarError as exc:
            self.note_failure(exc)
            raise

    # -- streams -----------------------------------------------------------------------------

    def stream(
        self,
        stream_id: str,
        *,
        target: str | None = None,
        user_text: str | None = None,
        backend: str | None = None,
        model: str | None = None,
        policy: Policy | None = None,
        flush_interval_s: float = 0.05,
        flush_chars: int = 256,
    ) -> ThinkingStream:
        """A stream for one thinking part; nothing goes over the network before its first push.

        ``model`` and ``policy`` as in ``translate``, sent when the stream opens, only when
        set; the fallback under ``policy="hide"`` shows the originals too (status ``error``).
        """
        if not STREAM_ID.match(stream_id):
            raise ValueError(f"stream_id must be 1-128 of A-Za-z0-9._:- (see safe_stream_id), "
                             f"got {len(stream_id)} characters that are not")
        if flush_interval_s < 0 or flush_chars < 1:
            raise ValueError("flush_interval_s must be >= 0 and flush_chars >= 1")
        _choices(model, policy)  # a bad value is the caller's bug: say so now, not in a log
        return ThinkingStream(self, stream_id, target=target, user_text=user_text,
                              backend=backend, model=model, policy=policy,
                              flush_interval_s=flush_interval_s, flush_chars=flush_chars)


# -- streams -------------------------------------------------------------------------------


class _Text:
    """Text pushed and not yet given out: appended at the end, taken from the front."""

    def __init__(self) -> None:
        self._parts: deque[str] = deque()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, text: str) -> None:
        self._parts.append(text)
        self._len += len(text)

    def startswith(self, text: str) -> bool:
        if len(text) > self._len:
            return False
        pos = 0
        for part in self._parts:
            if pos >= len(text):
                break
            piece = text[pos: pos + len(part)]
            if not part.startswith(piece):
                return False
            pos += len(piece)
        return True

    def take(self, n: int) -> str:
        out: list[str] = []
        while n > 0 and self._parts:
            part = self._parts.popleft()
            if len(part) > n:
                self._parts.appendleft(part[n:])
                part = part[:n]
            out.append(part)
            n -= len(part)
            self._len -= len(part)
        return "".join(out)


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class ThinkingStream:
    """One thinking part on its way through a thinktrans stream; see the module docstring."""

    def __init__(self, client: ThinktransClient, stream_id: str, *, target: str | None,
                 user_text: str | None, backend: str | None, flush_interval_s: float,
                 flush_chars: int, model: str | None = None,
                 policy: Policy | None = None) -> None:
        self.client = client
        self.stream_id = stream_id
        self.target = target  # as asked; the resolved one once the stream is open
        self.target_source: str | None = None
        # As asked; once open, as the sidecar answers (its policy when none was asked).
        self.model = model
        self.policy: str | None = policy
        self.failure: str | None = None  # why the stream fell back to the originals
        self.failure_slug: str | None = None  # the sidecar's problem slug, when it refused
        self._user_text = user_text
        self._backend = backend
        self._flush_interval_s = flush_interval_s
        self._flush_chars = flush_chars
        self._pending = _Text()  # pushed, not yet yielded by results()
        self._unsent: list[str] = []  # pushed, not yet in a chunk
        self._unsent_chars = 0
        self._unsent_since = 0.0
        self._unacked: list[tuple[int, str]] = []  # chunks posted or due, not yet accepted
        self._unacked_since = 0.0
        self._next_seq = 0
        self._next_index = 0
        self._after = -1
        self._last_push = time.monotonic()
        self._last_result = 0.0
        self._closing = False
        self._ended = False
        self._reading = False
        self._sender: asyncio.Task[None] | None = None
        self._opened = asyncio.Event()
        self._failed = asyncio.Event()
        self._wake_sender = asyncio.Event()
        self._wake_reader = asyncio.Event()
        if not client.available:
            self._fail(_Skipped())

    async def __aenter__(self) -> ThinkingStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    # -- the agent's side ----------------------------------------------------------------------

    async def push(self, delta: str) -> None:
        """Add a delta of thinking text; returns at once, whatever the sidecar's state."""
        self.push_nowait(delta)

    def push_nowait(self, delta: str) -> None:
        """``push`` for synchronous code running on the event loop's thread."""
        if self._closing:
            raise RuntimeError(f"stream {self.stream_id!r} is closed; open a new one")
        if not isinstance(delta, str):
            raise TypeError(f"delta must be str, got {type(delta).__name__}")
        if not delta:
            return
        now = time.monotonic()
        self._pending.append(delta)
        self._last_push = now
        self._wake_reader.set()
        if self.failure is not None:
            return
        if not self._unsent:
            self._unsent_since = now
            self._wake_sender.set()  # the sender sleeps without a timer while nothing waits
        self._unsent.append(delta)
        self._unsent_chars += len(delta)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send(), name=f"thinktrans:{self.stream_id}")
        if self._unsent_chars >= self._flush_chars:
            self._wake_sender.set()

    async def close(self) -> None:
        """No more deltas: the rest is posted and the stream closed in the background."""
        self._closing = True
        self._wake_sender.set()
        self._wake_reader.set()

    async def aclose(self) -> None:
        """Close, give the last posts ``timeout_s`` to land, then release the server's stream."""
        await self.close()
        sender = self._sender
        if sender is not None and not sender.done():
            _done, pending = await asyncio.wait({sender}, timeout=self.client.timeout_s)
            if pending:
                sender.cancel()
        if self._sender is not None and self.failure is None:
            self.client.release_stream(self.stream_id)

    # -- failing over --------------------------------------------------------------------------

    def _fail(self, exc: SidecarError) -> None:
        if self.failure is not None:
            return
        self.failure = exc.reason
        self.failure_slug = exc.slug
        self.client.note_failure(exc)
        # A skip follows a failure already logged: one warning per outage, not per stream.
        log.log(logging.INFO if isinstance(exc, _Skipped) else logging.WARNING,
                "stream %s falls back to the originals: %s pending_chars=%d",
                self.stream_id, exc.reason, len(self._pending))
        self._failed.set()
        self._wake_reader.set()
        self._wake_sender.set()
        sender = self._sender
        if sender is not None and not sender.done() and sender is not asyncio.current_task():
            sender.cancel()

    async def _unless_failed(self, coro: Awaitable[T]) -> T | None:
        """``await coro``, or None as soon as the stream fails."""
        task = asyncio.ensure_future(coro)
        failed = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({task, failed}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the reader was cancelled: leave no request behind
            task.cancel()
            raise
        finally:
            failed.cancel()
        if task.done():
            return task.result()
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, SidecarError):
            pass
        return None

    async def _backoff(self, exc: SidecarError, since: float) -> None:
        """Wait as a 429/503 asks, or raise if that would take the wait past ``timeout_s``."""
        delay = exc.retry_after_s if exc.retry_after_s is not None else 0.1
        # A sidecar that is shutting down asks for 5 s: the originals should not wait that.
        if time.monotonic() + delay - since > self.client.timeout_s:
            raise SidecarError(f"{exc.reason} (retry after {delay:g}s is past the budget)",
                               status=exc.status)
        await asyncio.sleep(delay)

    # -- sending -------------------------------------------------------------------------------

    async def _send(self) -> None:
        try:
            await self._open()
            while await self._batch_due():
                self._form_chunks()
                await self._post_chunks()
                if self._closing and not self._unsent and not self._unacked:
                    await self._retrying(lambda: self.client.request(
                        "POST", f"/v1/streams/{self.stream_id}/close"), time.monotonic())
                    return
        except SidecarError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug here must not cost the agent its thoughts
            log.exception("stream %s sender failed", self.stream_id)
            self._fail(SidecarError(f"client error ({type(exc).__name__})"))

    async def _retrying(self, call: Callable[[], Awaitable[Any]], since: float) -> Any:
        while True:
            try:
                return await call()
            except SidecarError as exc:
                if not exc.transient:
                    raise
                await self._backoff(exc, since)

    async def _open(self) -> None:
        body = {"stream_id": self.stream_id, "target": self.target, "backend": self._backend,
                **_choices(self.model, self.policy), "user_text": self._user_text}
        data = await self._retrying(
            lambda: self.client.request("POST", "/v1/streams", json=body), time.monotonic())
        try:
            self.target = data["target"]
            self.target_source = data["target_source"]
            # A sidecar that predates model and policy does not answer them: keep what was asked.
            if "model" in data:
                self.model = _optional_str(data["model"])
            if isinstance(data.get("policy"), str):
                self.policy = data["policy"]
        except (KeyError, TypeError):
            raise SidecarError("malformed answer to open") from None
        self._opened.set()

    async def _batch_due(self) -> bool:
        """Wait until a chunk is due: enough text, ``flush_interval_s`` after its first, close."""
        while self.failure is None:
            if self._unacked or self._closing:
                return True
            timeout: float | None = None
            if self._unsent:
                if self._unsent_chars >= self._flush_chars:
                    return True
                timeout = self._unsent_since + self._flush_interval_s - time.monotonic()
                if timeout <= 0:
                    return True
            self._wake_sender.clear()
            try:
                await asyncio.wait_for(self._wake_sender.wait(), timeout)
            except TimeoutError:
                return True
        return False

    def _form_chunks(self) -> None:
        """Turn unsent text into chunks with fixed seqs (a retry re-posts them unchanged)."""
        if not self._unsent:
            return
        text = "".join(self._unsent)
        self._unsent.clear()
        self._unsent_chars = 0
        if not self._closing and "\ud800" <= text[-1] <= "\udbff":
            # The low half of a surrogate pair may be in the next delta: keep them together.
            self._unsent.append(text[-1])
            self._unsent_chars = 1
            self._unsent_since = time.monotonic()
            text = text[:-1]
        if not text:
            return
        if _lone_surrogate(text):
            raise SidecarError("thinking text holds a lone surrogate, which cannot be sent")
        if not self._unacked:
            self._unacked_since = time.monotonic()
        for start in range(0, len(text), MAX_CHUNK_CHARS):
            self._unacked.append((self._next_seq, text[start: start + MAX_CHUNK_CHARS]))
            self._next_seq += 1

    async def _post_chunks(self) -> None:
        while self._unacked and self.failure is None:
            batch: list[tuple[int, str]] = []
            chars = 0
            for chunk in self._unacked[:MAX_CHUNKS_PER_POST]:
                if batch and chars + len(chunk[1]) > MAX_CHARS_PER_POST:
                    break
                batch.append(chunk)
                chars += len(chunk[1])
            body = {"chunks": [{"seq": seq, "text": text} for seq, text in batch]}
            try:
                data = await self.client.request(
                    "POST", f"/v1/streams/{self.stream_id}/chunks", json=body)
                through = int(data["accepted_through"])
            except SidecarError as exc:
                if not exc.transient:
                    raise
                await self._backoff(exc, self._unacked_since)
                continue
            except (KeyError, TypeError, ValueError):
                raise SidecarError("malformed answer to chunks") from None
            if through < batch[0][0]:
                raise SidecarError(f"chunks not accepted (through seq {through})")
            self._unacked = [chunk for chunk in self._unacked if chunk[0] > through]
            self._unacked_since = time.monotonic()

    # -- reading -------------------------------------------------------------------------------

    async def results(self, *, updates: bool = True) -> AsyncIterator[StreamItem]:
        """Segments in order, and late updates; ends after close once all text is out.

        With ``updates`` False it ends as soon as every pushed character is covered,
        without waiting for the late translations of ``deadline`` segments.
        """
        if self._reading:
            raise RuntimeError(f"results() of stream {self.stream_id!r} is already being read")
        self._reading = True
        while True:
            if self.failure is not None:
                if len(self._pending):
                    text = self._pending.take(len(self._pending))
                    yield TranslatedSegment(self._next_index, text, text, "error",
                                            target=self.target,
                                            error=f"sidecar: {self.failure}")
                    self._next_index += 1
                    continue
                if self._closing:
                    return
                self._wake_reader.clear()
                await self._wake_reader.wait()
                continue
            if self._closing and not len(self._pending) and (
                    self._sender is None or self._ended or not updates):
                return
            if self._sender is None:  # nothing pushed yet
                self._wake_reader.clear()
                await self._wake_reader.wait()
                continue
            try:
                events = await self._poll()
            except SidecarError as exc:
                self._fail(exc)
                continue
            except Exception as exc:  # a bug here must not cost the agent its thoughts
                log.exception("stream %s reader failed", self.stream_id)
                self._fail(SidecarError(f"client error ({type(exc).__name__})"))
                continue
            for event in events:
                try:
                    item = self._take_event(event)
                except SidecarError as exc:
                    self._fail(exc)
                    break
                if item is not None:
                    yield item
            if self._ended and self.failure is None and (len(self._pending) or not self._closing):
                # The sidecar ended the stream on its own (it is shutting down): what is
                # left, and whatever comes later, can only go out as it is.
                self._fail(SidecarError("the sidecar ended the stream early"))

    async def _poll(self) -> list[Any]:
        """The next events, after a stall check; [] when the stream failed meanwhile."""
        if len(self._pending):
            since = max(self._last_push, self._last_result)
            left = since + self.client.stall_s - time.monotonic()
            if left <= 0:
                raise SidecarError(f"no result within {self.client.stall_s:.1f}s")
            wait_s = min(self.client.poll_wait_s, left)
        else:
            wait_s = self.client.poll_wait_s
        if not self._opened.is_set():
            opened = asyncio.ensure_future(self._opened.wait())
            failed = asyncio.ensure_future(self._failed.wait())
            await asyncio.wait({opened, failed}, timeout=wait_s,
                               return_when=asyncio.FIRST_COMPLETED)
            opened.cancel()
            failed.cancel()
            if not self._opened.is_set():
                return []
        params = {"after": self._after, "wait_ms": max(1, int(wait_s * 1000))}
        data = await self._unless_failed(self.client.request(
            "GET", f"/v1/streams/{self.stream_id}/events", params=params, wait_s=wait_s))
        if data is None:
            return []
        try:
            events = list(data["events"])
        except (KeyError, TypeError):
            raise SidecarError("malformed events answer") from None
        return events

    def _take_event(self, event: Any) -> StreamItem | None:
        try:
            kind, data, event_id = event["type"], event["data"], int(event["id"])
            if kind == "segment":
                item: StreamItem | None = TranslatedSegment.from_json(data)
            elif kind == "update":
                item = SegmentUpdate.from_json(data)
            else:
                item = None
        except (KeyError, TypeError, ValueError):
            raise SidecarError("malformed event") from None
        if event_id <= self._after:
            return None  # seen already
        if isinstance(item, TranslatedSegment):
            # The server's invariant, checked: a segment continues exactly where the last
            # ended. Should it not, the originals from here on are the only safe output.
            if item.index != self._next_index or not self._pending.startswith(item.original):
                raise SidecarError(f"segment {item.index} does not continue the pushed text")
            self._pending.take(len(item.original))
            self._next_index += 1
            self._last_result = time.monotonic()
        self._after = event_id
        if kind == "end":
            self._ended = True
        return item
