"""The client that agent servers use: one-shot translation and streamed thinking.

Light to import (httpx and the standard library only), so an agent server can import it on
its hot path; it knows the sidecar only through the HTTP contract (docs/API.md). The
agent's output is never blocked and nothing is lost: whenever the sidecar is down, slow or
failing, a stream gives out the originals (status ``error``), so the ``original`` fields of
everything it yields, joined, equal the pushed deltas. client/README.md shows its use.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, get_args

import httpx

from thinktrans_client.fallback import Fallback, StallClock
from thinktrans_client.pending import PendingText
from thinktrans_client.posting import ChunkPoster
from thinktrans_client.reading import EventReader
from thinktrans_client.reasons import CLOSED_EARLY, client_bug, http_reason, transport_reason
from thinktrans_client.releasing import StreamReleases
from thinktrans_client.results import (
    Preview,
    SegmentUpdate,
    StreamItem,
    TranslatedSegment,
    TranslatedText,
    optional_str,
)
from thinktrans_client.sidecar import ClientClosing, PastCloseWait, SidecarError, Skipped

__all__ = [
    "Policy",
    "Preview",
    "SegmentUpdate",
    "SidecarError",
    "StreamItem",
    "ThinkingStream",
    "ThinktransClient",
    "TranslatedSegment",
    "TranslatedText",
    "safe_stream_id",
]

# Logs hold stream ids, lengths and reasons, never thinking text.
log = logging.getLogger("thinktrans.client")

STREAM_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

# What becomes of segments not in the target language (API.md): translated, or hidden
# (status ``hidden``, empty text). None leaves it to the server's THINKTRANS_POLICY.
Policy = Literal["translate", "hide"]
POLICIES: tuple[str, ...] = get_args(Policy)


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


def _glossary(glossary: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request field for a glossary (``{"terms": {source: target}, "keep": [term]}``),
    only when set: a sidecar that predates it refuses the field. The sidecar checks it."""
    if glossary is None:
        return {}
    if not isinstance(glossary, Mapping) or set(glossary) - {"terms", "keep"}:
        raise ValueError('glossary must be {"terms": {source: target}, "keep": [term, ...]}')
    return {"glossary": {"terms": dict(glossary.get("terms") or {}),
                         "keep": list(glossary.get("keep") or [])}}


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _problem(response: httpx.Response) -> tuple[str, str, tuple[str, ...]]:
    """The problem type's slug (e.g. ``invalid-locale``), its detail ("" where absent) and
    the body's fields its ``errors`` refuse as not known (``extra_forbidden``).

    The detail only tells cases apart (``reasons.http_reason``); it is never logged or
    recorded, as it may echo what the request carried.
    """
    try:
        body = response.json()
    except ValueError:
        return "", "", ()
    if not isinstance(body, dict):
        return "", "", ()
    kind, detail, errors = body.get("type"), body.get("detail"), body.get("errors")
    slug = kind.rsplit(":", 1)[-1][:64] if isinstance(kind, str) else ""
    unknown = tuple(
        str(error["loc"][1]) for error in (errors if isinstance(errors, list) else ())
        if isinstance(error, dict) and error.get("type") == "extra_forbidden"
        and isinstance(error.get("loc"), list) and len(error["loc"]) == 2
        and error["loc"][0] == "body")
    return slug, detail[:1000] if isinstance(detail, str) else "", unknown


# -- the client ----------------------------------------------------------------------------


class ThinktransClient:
    """An async client of one thinktrans sidecar; one per agent server, shared by its streams.

    ``timeout_s``: longest one request may take beyond its planned wait. ``stall_s``: how
    long pushed text may go without a result, counted from the later of the last push and
    the last result; it must exceed the sidecar's ``flush_idle_ms`` + ``deadline_ms``, within
    which a healthy sidecar answers. ``cooloff_s``: how long the sidecar is skipped after it
    failed itself (not after a 4xx). ``release_timeout_s``: how long ``aclose`` waits for
    the sidecar to delete the streams still open (None: twice ``timeout_s``, one post in
    flight and the delete).
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
        release_timeout_s: float | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        for name, value in (("timeout_s", timeout_s), ("stall_s", stall_s),
                            ("poll_wait_s", poll_wait_s)):
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if cooloff_s < 0:
            raise ValueError(f"cooloff_s must be >= 0, got {cooloff_s}")
        if release_timeout_s is not None and not 0 <= release_timeout_s < float("inf"):
            raise ValueError(f"release_timeout_s must be >= 0 or None, got {release_timeout_s}")
        self.release_timeout_s = (timeout_s * 2 if release_timeout_s is None
                                  else release_timeout_s)
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
        # Fields of opening a stream that the sidecar refused as unknown (an older one).
        self.unknown_fields: set[str] = set()
        self._releases = StreamReleases(self)  # streams the sidecar may hold, until released
        self._closing = False
        self._closed = False

    async def __aenter__(self) -> ThinktransClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release every stream the sidecar may still hold (one still read gives out the
        rest as pushed), within ``release_timeout_s``; then close the connections."""
        self._closing = True  # no new streams; releases still use the connections
        await self._releases.close(self.release_timeout_s)
        self._closed = True
        await self._http.aclose()

    @property
    def closing(self) -> bool:
        """True once ``aclose`` has begun: streams push nothing more to the sidecar."""
        return self._closing

    @property
    def available(self) -> bool:
        """False while a recent failure of the sidecar has it skipped (``cooloff_s``)."""
        return not self._closing and time.monotonic() >= self._down_until

    def note_failure(self, exc: SidecarError) -> None:
        """Record a failed call: a failure of the sidecar itself starts ``cooloff_s``."""
        if not isinstance(exc, Skipped) and exc.sidecar_failed:
            self._down_until = time.monotonic() + self.cooloff_s

    def note_unknown_field(self, name: str) -> None:
        """The sidecar refused a stream's optional field as unknown: logged once a field."""
        if name not in self.unknown_fields:
            self.unknown_fields.add(name)
            log.warning("the sidecar does not know %r in opening a stream (it is older than "
                        "that field); streams open without it", name)

    def hold_stream(self, stream: ThinkingStream) -> None:
        """``stream`` may be on the sidecar from now on (its first push): ``aclose``
        releases it if nothing else has."""
        self._releases.hold(stream)

    def release_stream(self, stream_id: str) -> None:
        """Delete the sidecar's stream in the background (``aclose`` waits for it).

        Ended streams hold their events on the sidecar until they expire, and streams given
        up (the fallback) stay open, counted against ``max_streams``; this frees them at
        once, once their posts have ended (``thinktrans_client.releasing``). Best effort,
        once per stream; nothing is sent once the client is closed."""
        if not self._closed:
            self._releases.release(stream_id)

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, Any] | None = None, wait_s: float = 0.0) -> Any:
        """One call within ``timeout_s`` (+ ``wait_s``); the JSON answer, or SidecarError.

        A dropped kept-alive connection is retried once; nothing else is retried here,
        and the cool-off is neither checked nor started (see ``available``, ``note_failure``).
        """
        if self._closed:
            raise SidecarError("the client was closed")
        budget = self.timeout_s + wait_s
        try:
            async with asyncio.timeout(budget):
                try:
                    response = await self._http.request(method, path, json=json, params=params)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    # Often a kept-alive connection the server had closed: once more, fresh.
                    response = await self._http.request(method, path, json=json, params=params)
        except (TimeoutError, httpx.TimeoutException):
            raise SidecarError(f"the sidecar did not answer within {budget:g} s") from None
        except httpx.HTTPError as exc:
            raise SidecarError(transport_reason(exc)) from None
        status = response.status_code
        if status >= 400:
            slug, detail, unknown = _problem(response)
            raise SidecarError(http_reason(status, slug or None, detail), status=status,
                               retry_after_s=_retry_after(response), slug=slug or None,
                               unknown_fields=unknown)
        if status == 204:
            return None
        try:
            return response.json()
        except ValueError:
            raise SidecarError(f"the sidecar's answer (HTTP {status}) is not JSON",
                               status=status) from None

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
        glossary: Mapping[str, Any] | None = None,
    ) -> list[TranslatedText]:
        """Translate whole texts; on failure, the originals (status ``error``) if ``fallback``.

        ``model``: a model for the backends to use (``models()`` lists what they offer; a
        name not listed is tried too); ``policy``: ``"hide"`` answers segments not in the
        target language with status ``hidden`` and empty text; ``glossary``: ``{"terms":
        {source: target}, "keep": [term, ...]}``, terms rendered as given and kept as they
        are. Each is sent only when set.

        The fallback is the same under ``policy="hide"``: the originals, shown, with status
        ``error``. Only the sidecar knows which segments are foreign, and hiding everything
        instead would make a failing sidecar silently swallow the agent's thinking.
        """
        texts = list(texts)
        if not texts:
            return []
        choices = {**_choices(model, policy), **_glossary(glossary)}
        try:
            if not self.available:
                raise Skipped()
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
                raise SidecarError("the sidecar's answer to translate is malformed") from None
            if len(results) != len(texts):
                raise SidecarError(f"the sidecar answered {len(results)} results for "
                                   f"{len(texts)} texts")
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
            raise SidecarError("the sidecar's answer to GET /v1/languages is malformed")
        return data

    async def supported_targets(self) -> list[str] | None:
        """The targets the sidecar's default chain can translate into now; None: any.

        Raises SidecarError when the sidecar does not say (down, failing, or older than
        ``targets``): callers decide what to offer then, as "any" would not be known.
        """
        data = await self.languages()
        if "targets" not in data:
            raise SidecarError("the sidecar's answer to GET /v1/languages has no targets "
                               "(an older sidecar)")
        targets = data["targets"]
        if targets is None:
            return None
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise SidecarError("the targets in the sidecar's answer to GET /v1/languages "
                               "are malformed")
        return list(targets)

    async def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: ``{"backend", "model", "languages", "default", "notes"}`` each.

        Advice, not a whitelist: ``translate`` and ``stream`` may name a model not listed.
        Raises SidecarError when the sidecar does not answer.
        """
        data = await self._info("/v1/models")
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list) or not all(isinstance(m, dict) for m in models):
            raise SidecarError("the sidecar's answer to GET /v1/models is malformed")
        return models

    async def _info(self, path: str) -> Any:
        """A GET of what the sidecar offers, honouring and starting the cool-off as others do."""
        try:
            if not self.available:
                raise Skipped()
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
        glossary: Mapping[str, Any] | None = None,
        previews: bool | None = None,
        flush_interval_s: float = 0.05,
        flush_chars: int = 256,
        close_wait_s: float | None = None,
    ) -> ThinkingStream:
        """A stream for one thinking part; nothing goes over the network before its first push.

        ``model``, ``policy`` and ``glossary`` as in ``translate``, sent when the stream
        opens, only when set, so a sidecar that predates them serves everyone else. The
        fallback under ``policy="hide"`` shows the originals too (status ``error``): only
        the sidecar can tell which segments are foreign, and hiding all of them would turn a
        failing sidecar into thinking that silently disappears.
        ``previews``: True asks for ``Preview`` items in ``results``; False asks the sidecar
        to make none; None (the default) sends nothing. A sidecar older than previews
        refuses the field (422): the stream opens again without it, with no previews.
        ``close_wait_s``: once the stream is closed, how long ``results`` waits for the rest;
        then what no result covered comes out as it was pushed, status ``deadline`` (None:
        as long as the sidecar's own deadline and the client's budgets allow). For readers
        that cannot replace a segment later, such as ACP's, so that what follows the part
        does not wait for translations that would come too late to show.
        """
        if not STREAM_ID.match(stream_id):
            raise ValueError(f"stream_id must be 1-128 of A-Za-z0-9._:- (see safe_stream_id), "
                             f"got {len(stream_id)} characters that are not")
        if flush_interval_s < 0 or flush_chars < 1:
            raise ValueError("flush_interval_s must be >= 0 and flush_chars >= 1")
        if close_wait_s is not None and not 0 <= close_wait_s < float("inf"):
            raise ValueError(f"close_wait_s must be >= 0 or None, got {close_wait_s}")
        _choices(model, policy)  # a bad value is the caller's bug: say so now, not in a log
        _glossary(glossary)
        if previews is not None and not isinstance(previews, bool):
            raise ValueError("previews must be True, False or None")
        return ThinkingStream(self, stream_id, target=target, user_text=user_text,
                              backend=backend, model=model, policy=policy, glossary=glossary,
                              flush_interval_s=flush_interval_s, flush_chars=flush_chars,
                              close_wait_s=close_wait_s, previews=previews)



# -- streams -------------------------------------------------------------------------------


class ThinkingStream:
    """One thinking part on its way through a thinktrans stream: deltas in, segments out,
    the originals when the sidecar fails.

    It composes the parts that each own one state: what was pushed and not yet given out
    (``PendingText``), posting it (``ChunkPoster``), reading the events
    (``EventReader``) and falling back (``Fallback``, ``StallClock``).
    """

    def __init__(self, client: ThinktransClient, stream_id: str, *, target: str | None,
                 user_text: str | None, backend: str | None, flush_interval_s: float,
                 flush_chars: int, model: str | None = None,
                 policy: Policy | None = None, close_wait_s: float | None = None,
                 glossary: Mapping[str, Any] | None = None,
                 previews: bool | None = None) -> None:
        self.client = client
        self._glossary = glossary
        self.stream_id = stream_id
        self.target = target  # as asked; the resolved one once the stream is open
        self.target_source: str | None = None
        # As asked; once open, as the sidecar answers (its policy when none was asked).
        self.model = model
        self.policy: str | None = policy
        # As asked; once open, whether ``results`` yields previews: asked, and taken.
        self.previews = previews
        self._asked_previews = previews
        self._user_text = user_text
        self._backend = backend
        self._pending = PendingText()  # pushed, not yet yielded by results()
        self._stall = StallClock(client)
        self._fallback = Fallback(client, stream_id, self._pending)
        self._poster = ChunkPoster(client, stream_id, open_body=self._open_body,
                                   on_open=self._opened_as, on_failure=self._fail,
                                   flush_interval_s=flush_interval_s, flush_chars=flush_chars,
                                   optional=frozenset({"previews"}),
                                   on_unknown=client.note_unknown_field)
        self._reader = EventReader(client, stream_id, pending=self._pending, stall=self._stall,
                                   fallback=self._fallback, opened=self._poster.opened)
        self._closing = False
        self._held = False  # handed to the client's ``hold_stream``, at the first post
        self._close_wait_s = close_wait_s
        self._close_timer: asyncio.TimerHandle | None = None
        self._reading = False
        self._wake_reader = asyncio.Event()
        if not client.available:
            self._fail(Skipped())

    async def __aenter__(self) -> ThinkingStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    @property
    def failure(self) -> str | None:
        """Why the stream fell back to the originals; None while it has not."""
        return self._fallback.reason

    @property
    def failure_slug(self) -> str | None:
        """The sidecar's problem slug, when it refused the stream."""
        return self._fallback.slug

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
        if self.client.closing and not self._poster.started:
            self._fail(ClientClosing())  # nothing new on the sidecar: aclose is releasing
        self._pending.append(delta)
        self._stall.pushed()
        self._wake_reader.set()
        self._poster.add(delta)  # ignored once the stream has fallen back
        if not self._held and self._poster.started:
            self._held = True
            self.client.hold_stream(self)

    async def close(self) -> None:
        """No more deltas: the rest is posted and the stream closed in the background."""
        if not self._closing and self._close_wait_s is not None:
            self._close_timer = asyncio.get_running_loop().call_later(
                self._close_wait_s, self._close_wait_over)
        self._closing = True
        self._poster.close()
        self._wake_reader.set()

    async def aclose(self) -> None:
        """Close, and release the sidecar's stream in the background: the last posts are
        given ``timeout_s`` to land, then the stream is deleted (``client.release_stream``).

        Released whether it ended or was given up (the fallback): a stream the client
        stopped posting to would otherwise stay open on the sidecar, counted against its
        ``max_streams``, until the idle expiry.
        """
        await self.close()
        if self._close_timer is not None:
            self._close_timer.cancel()
        if self._poster.started:
            self.client.release_stream(self.stream_id)

    @property
    def may_exist(self) -> bool:
        """Whether the sidecar may hold this stream: its open went out and was not refused."""
        return self._poster.may_exist

    @property
    def unanswered(self) -> bool:
        """Whether a post of this stream's went out and got no answer (it may still land)."""
        return self._poster.unanswered

    async def settle(self, *, hurry: bool = False) -> None:
        """Return once nothing of this stream's can reach the sidecar any more: its posts
        given ``timeout_s`` to land (none when ``hurry``), then stopped, a post in flight
        let end (see ``ChunkPoster.settle``)."""
        await self._poster.settle(hurry=hurry)

    def abandon(self) -> None:
        """The client is closing: post nothing more; what no segment has covered yet comes
        out as pushed (status ``error``)."""
        if self.failure is None and (len(self._pending) or not self._closing):
            self._fail(ClientClosing())
        self._poster.stop()

    # -- what the parts are given --------------------------------------------------------------

    def _open_body(self) -> dict[str, Any]:
        return {"stream_id": self.stream_id, "target": self.target, "backend": self._backend,
                **_choices(self.model, self.policy), **_glossary(self._glossary),
                **({} if self._asked_previews is None else {"previews": self._asked_previews}),
                "user_text": self._user_text}

    def _opened_as(self, data: Any) -> None:
        """Take the sidecar's answer to open; KeyError or TypeError when it is malformed."""
        self.target = data["target"]
        self.target_source = data["target_source"]
        # A sidecar that predates model and policy does not answer them: keep what was asked.
        if "model" in data:
            self.model = optional_str(data["model"])
        if isinstance(data.get("policy"), str):
            self.policy = data["policy"]
        # An older sidecar, opened again without the field, does not answer it: none.
        self.previews = self._asked_previews is True and data.get("previews") is True
        self._reader.previews = self.previews

    def _close_wait_over(self) -> None:
        """``close_wait_s`` after close: what no segment has covered goes out as it is (a
        poll in flight is cut short). With every segment out, late updates are waited for
        as usual."""
        if len(self._pending) and self._close_wait_s is not None:
            self._fail(PastCloseWait(self._close_wait_s))

    def _fail(self, exc: SidecarError) -> None:
        if self._fallback.fail(exc):
            self._wake_reader.set()
            self._poster.stop()

    # -- reading -------------------------------------------------------------------------------

    async def results(self, *, updates: bool = True) -> AsyncIterator[StreamItem]:
        """Segments in order, and late updates; ends after close once all text is out.

        A stream opened with ``previews=True`` also yields a ``Preview`` of a segment not
        out yet, as it comes; the segment of its index supersedes it.

        With ``updates`` False it ends as soon as every pushed character is covered,
        without waiting for the late translations of ``deadline`` segments.
        """
        if self._reading:
            raise RuntimeError(f"results() of stream {self.stream_id!r} is already being read")
        self._reading = True
        while True:
            if self.failure is not None:
                original = self._fallback.originals(self.target)
                if original is not None:
                    yield original
                    continue
                if self._closing:
                    return
                self._wake_reader.clear()
                await self._wake_reader.wait()
                continue
            if self._closing and not len(self._pending) and (
                    not self._poster.started or self._reader.ended or not updates):
                return
            if not self._poster.started:  # nothing pushed yet
                self._wake_reader.clear()
                await self._wake_reader.wait()
                continue
            try:
                events = await self._reader.poll()
            except SidecarError as exc:
                self._fail(exc)
                continue
            except Exception as exc:  # a bug here must not cost the agent its thoughts
                log.exception("stream %s reader failed", self.stream_id)
                self._fail(SidecarError(client_bug(exc)))
                continue
            for event in events:
                try:
                    item = self._reader.take(event)
                except SidecarError as exc:
                    self._fail(exc)
                    break
                if item is not None:
                    yield item
            if self._reader.ended and self.failure is None and (
                    len(self._pending) or not self._closing):
                # The sidecar ended the stream on its own (it is shutting down): what is
                # left, and whatever comes later, can only go out as it is.
                self._fail(SidecarError(CLOSED_EARLY))
