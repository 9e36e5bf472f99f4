"""The pool backend: batches sent to a shared pool of local-engine replicas (``thinktrans pool``).

Many sidecars share one pool's model on Ray Serve; each batch this sidecar's batcher forms
goes out as one call, ``POST {url}/v1/batch``, with what the pool needs to merge, share and
drop it (its deadline, this sidecar's client id, its spans and previous previews). What the
backend serves, and its limits, follow the pool's ``GET /v1/info``, kept by a ``PoolInfo``
(``models.pool_info``); docs/deploy.md has the wire format and the pool's side.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
from pydantic import BaseModel, Field, StrictInt, StrictStr

from models.base import Capabilities, Job, first_line
from models.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    Expired,
    RateLimited,
    Stopped,
    Throttled,
    UnsupportedLanguage,
)
from models.languages import canonical, table_key
from models.local.catalog import NO_SPACE_TARGETS
from models.local.pieces import Part, cut_texts, rejoin
from models.pool_info import DEFAULT_CALL_TEXTS, PoolInfo, PoolLimits
from models.remote import AnswerBound, RemoteTranslator
from models.spans import Protected, Span

NO_URL_REASON = "set THINKTRANS_POOL_URL to the pool's address, e.g. http://pool:8000"
MAX_RESPONSE_SETTING = "THINKTRANS_POOL_MAX_RESPONSE_BYTES"
# How long past a batch's deadline the backend still waits for the pool.
GRACE_S = 0.1
# The longest this sidecar holds its calls back when the pool asks it to wait (Retry-After).
MAX_HOLD_S = 30.0
# A probe of /v1/info may wait behind a busy replica's batches.
PROBE_TIMEOUT_S = 10.0
# How often a preview's calls in flight look whether their job was told to stop.
STOP_POLL_S = 0.02


# A client id (THINKTRANS_POOL_CLIENT_ID): what the pool's stats, metrics and config name.
CLIENT_ID = r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$"
CLIENT_ID_RULE = ("1 to 128 characters: letters, digits and . _ : @ / + -, starting with a "
                  "letter or digit")


# One protected span on the wire: start, end (offsets into its text), kind, out.
WireSpan = tuple[StrictInt, StrictInt, StrictStr, StrictStr]


class PoolCall(BaseModel):
    """One call to the pool: a batch a sidecar formed, for one pair and model."""

    texts: list[str] = Field(min_length=1, description="The segments, in order.")
    source: str | None = Field(None, max_length=64, description="Source tag; null: unknown.")
    target: str = Field(min_length=1, max_length=64, description="Target BCP 47 tag.")
    model: str | None = Field(None, max_length=512, description="A model a stream named.")
    deadline_ms: float | None = Field(
        None, allow_inf_nan=False, strict=True, description="Milliseconds left until the "
        "last segment is due, a finite number (0 or less: passed already); the pool drops the "
        "call unrun once they have passed. Null: no deadline.")
    sidecar: str = Field(
        "", pattern=f"^$|{CLIENT_ID}", description="The client id of the sidecar that sent it "
        "(THINKTRANS_POOL_CLIENT_ID): who the pool shares its turns between, counts and caps. "
        "Empty: unnamed. With a client's own token the pool counts the call as that client's, "
        "whatever this says.")
    spans: list[list[WireSpan]] | None = Field(
        None, description="Per text, its protected spans as [start, end, kind, out]: offsets "
        "into the text, in order, not overlapping; out is what its translation holds in the "
        "span's place. Null: no text has any.")
    preview: bool = Field(False, description="A preview batch: provisional translations of "
                          "sentences still streaming, never cached; the replica's low-priority "
                          "lane, run only while no other call waits, and stopped (409 "
                          "preview-stopped) when one comes.")
    previous: list[str | None] | None = Field(
        None, description="A preview's, per text: its sentence's previous preview as shown "
        "(null: none), which a CTranslate2 replica decodes towards (local_preview_bias). Each "
        "at most max_text_chars, at most max_call_chars in all. Ignored unless preview.")

    def protected(self) -> list[Protected | None] | None:
        """The spans as the local engine takes them (``Job.protected``); None: none."""
        if self.spans is None:
            return None
        return [Protected(text, tuple(Span(*span) for span in spans)) if spans else None
                for text, spans in zip(self.texts, self.spans, strict=False)]


def wire_spans(protected: Sequence[Protected | None] | None, count: int
               ) -> list[list[WireSpan]] | None:
    """``Job.protected`` as a call carries it: per text its spans (an empty list: none)."""
    if protected is None or not any(p is not None and p.spans for p in protected):
        return None
    out: list[list[WireSpan]] = [[] for _ in range(count)]
    for i, p in enumerate(protected[:count]):
        if p is not None:
            out[i] = [(s.start, s.end, s.kind, s.out) for s in p.spans]
    return out


def _retry_after(resp: httpx.Response) -> float:
    """The seconds a 429's ``Retry-After`` asks for, within ``[0, MAX_HOLD_S]`` (1 s unread)."""
    try:
        return min(MAX_HOLD_S, max(0.0, float(resp.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def client_id(port: int) -> str:
    """A sidecar's default client id: ``host:port``, the host's name and the port it serves
    on, stable over restarts and different for two sidecars on one host (a host name that is
    no valid id is reduced to one)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-._")[:100]
    return f"{host or 'host'}:{port}"


@dataclass(frozen=True)
class PoolConfig:
    """Where the pool is and how to call it. Its values come from the ``pool_*`` settings
    (``Settings.pool_config()``), where each default is."""

    url: str | None
    token: str | None = field(repr=False)
    timeout_s: float  # one call's longest wait (the batch timeout bounds it too)
    concurrency: int  # calls in flight at once from this sidecar
    sidecar: str  # the client id
    # The pool's limits until its /v1/info says its own: characters of one text and of a
    # call's texts in all, and a call's body in bytes. A larger batch is sent as several
    # calls, a longer text cut at sentence ends and its translated parts joined again.
    max_text_chars: int
    max_call_chars: int
    max_call_bytes: int
    # The most bytes read of one answer of the pool (an error's: its first bytes).
    max_response_bytes: int
    transport: httpx.AsyncBaseTransport | None = None  # httpx's default: TCP


class PoolTranslator(RemoteTranslator):
    """Sends each batch to the pool's HTTP route; one call per batch (split only past the
    pool's limits). What the pool serves, and its limits, are its ``PoolInfo``'s."""

    name = "pool"
    capabilities = Capabilities(deadline=True)
    outage_recheck_s = 2.0  # a pool restarts in seconds; come back soon after

    def __init__(self, config: PoolConfig) -> None:
        super().__init__()
        self.config = config
        self.max_concurrency = config.concurrency
        self.pool = PoolInfo(PoolLimits(DEFAULT_CALL_TEXTS, config.max_text_chars,
                                        config.max_call_chars, config.max_call_bytes),
                             check=self._check, up=lambda: self.ready)
        self._client: httpx.AsyncClient | None = None
        # Texts with spans the pool kept by their placeholders, or by translating their runs.
        self.spans_kept = {"masked": 0, "fallback": 0}
        self.throttled = 0  # calls the pool refused over this sidecar's cap
        self._hold_until = 0.0  # monotonic: no call before it (the pool's Retry-After)
        self._bound = AnswerBound(config.max_response_bytes, MAX_RESPONSE_SETTING)
        self.url: str | None = None
        if not config.url:
            self._not_configured(NO_URL_REASON)
            return
        self.url = config.url.rstrip("/")
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers, transport=config.transport,
            timeout=httpx.Timeout(config.timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=4 * config.concurrency,
                                max_keepalive_connections=config.concurrency),
        )
        # Not ready before the pool says so: a pool still loading its model gets nothing.
        self.ready = False
        self.reason = "waiting for the pool's first answer"

    async def start(self) -> None:
        """The start check, then the pool's ``/v1/info`` read again while it is up."""
        await super().start()
        if self._configured:
            self.pool.start()

    async def aclose(self) -> None:
        await super().aclose()
        await self.pool.aclose()
        if self._client is not None:
            await self._client.aclose()

    # -- readiness ---------------------------------------------------------------------------

    async def _check(self) -> None:
        """Read ``GET /v1/info``: up with what the pool serves, else down (and probed)."""
        assert self._client is not None
        try:
            resp = await self._ask(self._client.build_request(
                "GET", "/v1/info", timeout=PROBE_TIMEOUT_S), "the pool's /v1/info")
        except BadOutput as exc:  # no pool's answer: down, until one is
            self._mark_down(f"pool: {exc.detail}", fail_fast=False)
            raise
        except httpx.TimeoutException as exc:
            if self.ready:  # waiting behind a busy pool's batches: the batches tell
                raise BackendTimeout(f"pool: /v1/info took over {PROBE_TIMEOUT_S:g} s") from exc
            raise self._unreachable(exc) from exc
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        body = _json(resp)
        if resp.status_code == 200 and body.get("ready") is True:
            self.pool.take(body)
            self.capabilities = replace(type(self).capabilities,
                                        checked_output=self.pool.checked_output)
            self._mark_up()
            return
        error = self._refused(resp, body)
        if self.ready:  # an answer that is no pool's: down all the same, until one is
            self._mark_down(f"pool not ready: {error.detail}", fail_fast=False)
        raise error

    async def _ask(self, request: httpx.Request, what: str) -> httpx.Response:
        """``request`` sent, and its answer read within THINKTRANS_POOL_MAX_RESPONSE_BYTES
        (BadOutput past it; of an error, its first bytes)."""
        assert self._client is not None
        response = await self._client.send(request, stream=True)
        try:
            return await self._bound.read(response, what)
        finally:
            await response.aclose()

    def _unreachable(self, exc: httpx.HTTPError) -> BackendUnavailable:
        reason = f"pool at {self.url} unreachable: {first_line(exc)}"
        self._mark_down(reason, fail_fast=False)
        return BackendUnavailable(reason)

    def _refused(self, resp: httpx.Response, body: dict[str, Any]) -> BackendError:
        """The error for an answer other than 200. The pool's own problems are mapped by
        their type, and only ``pool-not-ready`` marks the backend down: one call's trouble
        (a model a stream named, an engine error) is that call's. Answers that are no pool
        problem come from Serve's proxy or something in between."""
        status = resp.status_code
        detail = str(body.get("detail") or body.get("reason") or f"HTTP {status}")[:300]
        kind = str(body.get("type", ""))
        if status in (401, 403):
            reason = f"the pool refused the token (THINKTRANS_POOL_TOKEN): {detail}"
            self._mark_down(reason, fail_fast=True)
            return BackendUnavailable(reason)
        if kind.startswith(PROBLEM):
            slug = kind.removeprefix(PROBLEM)
            if slug == "pool-not-ready":
                self._mark_down(f"pool not ready: {detail}", fail_fast=False)
                return BackendUnavailable(f"pool not ready: {detail}")
            if slug == "over-cap":  # this sidecar's share waits there already: not down
                return self._throttled(resp, detail)
            if slug == "payload-too-large":
                self.pool.refresh_soon()  # its limit changed: the next batches are cut to it
            return _BY_SLUG.get(slug, BackendError)(detail)
        if status in (429, 503) and ("retry-after" in resp.headers
                                     or "backpressure" in resp.text):
            return RateLimited(f"pool busy ({status}, Serve's backpressure)")
        if status in (408, 504):
            return BackendTimeout(f"pool answered {status}")
        if status in (404, 502, 503):  # no application at this route, or no replica
            self._mark_down(f"pool not serving: HTTP {status}", fail_fast=False)
            return BackendUnavailable(f"pool not serving: HTTP {status}")
        return BackendError(f"pool answered {status}: {detail}")

    def _throttled(self, resp: httpx.Response, detail: str) -> Throttled:
        """The pool's 429 over this sidecar's cap: no call for its ``Retry-After`` (at most
        ``MAX_HOLD_S``); the batch goes down the chain, and the backend stays up."""
        wait = _retry_after(resp)
        self.throttled += 1
        self._hold_until = max(self._hold_until, time.monotonic() + wait)
        return Throttled(detail, retry_after_s=max(1, math.ceil(wait)))

    # -- what the pool serves: its PoolInfo's word ----------------------------------------------

    def languages(self) -> list[str] | None:
        return self.pool.languages()

    def supports(self, source: str | None, target: str, model: str | None = None) -> bool:
        return self.pool.supports(target, model)

    def catalog(self) -> list[dict[str, object]]:
        return self.pool.catalog()

    def model_problem(self, model: str | None) -> str | None:
        return None  # the pool's local engine decides; one it cannot serve answers 422

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        return self.pool.resolve_model(model, source, target)

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        identity = self.pool.identity
        if not identity:
            return None  # not known yet: what the pool serves decides the output
        return f"pool|{identity}|{model}"

    def info(self) -> dict[str, object]:
        return {"url": self.url, "client_id": self.config.sidecar, "throttled": self.throttled,
                "engine": self.pool.engine, "max_batch_size": self.pool.limits().max_batch_size,
                "identity": self.pool.identity, "spans": dict(self.spans_kept)}

    # -- translating ---------------------------------------------------------------------------

    async def run(self, job: Job) -> list[str]:
        """One call per batch (several only past the pool's limits). Past ``deadline_s``
        the batch is given up (``BackendTimeout``): its connection closes, and the pool
        drops it if it has not run it yet."""
        texts = job.texts
        deadline_s = job.seconds_left()
        self._refuse_if_unusable()
        if deadline_s is not None and deadline_s <= 0:
            raise Expired("every segment of the batch was past its deadline; not sent")
        wait = self._hold_until - time.monotonic()
        if wait > 0:  # the pool asked this sidecar to wait: the chain serves the batch
            raise Throttled(f"the pool holds this sidecar's share of its queue (client id "
                            f"{self.config.sidecar!r}); it asked to wait {wait:.1f} s more",
                            retry_after_s=math.ceil(wait))
        limits = self.pool.limits()
        if any(len(text) > limits.max_text_chars for text in texts):  # cut to it, rejoined
            keep = _stretches(job.protected, len(texts))
            pieces = cut_texts(texts, len, limits.max_text_chars, keep)  # never inside a span
            sent = [part.text for part in pieces.parts]
            protected = None if job.protected is None else [
                _part_spans(job.protected[part.index], part) for part in pieces.parts]
            # Sent as they are: a part holding a span longer than the bound is refused.
            outputs = await self._send(replace(job, texts=sent, contexts=None,
                                               protected=protected,
                                               previous=_whole_previous(job, pieces.parts)),
                                       limits, deadline_s)
            if len(outputs) != len(sent):
                raise BadOutput(f"pool returned {len(outputs)} translations for {len(sent)}")
            for part, out in zip(pieces.parts, outputs, strict=True):
                part.out = out
            tag = canonical(job.target)
            return rejoin(pieces, tag is not None and table_key(tag) in NO_SPACE_TARGETS)
        return await self._send(job, limits, deadline_s)

    async def _send(self, job: Job, limits: PoolLimits, deadline_s: float | None
                    ) -> list[str]:
        """The job's texts as calls within ``limits``, all at once; their answers."""
        texts, source, target, model = job.texts, job.source, job.target, job.model
        spans = wire_spans(job.protected, len(texts))
        max_chars = limits.max_call_chars
        previous = _wire_previous(job, limits.max_text_chars)
        room = limits.max_call_bytes - _envelope(job, self.config.sidecar)
        parts = _parts(list(texts), limits.max_batch_size, max_chars,
                       _sizes(texts, spans, previous), room)
        calls, at = [], 0
        for batch in parts:
            own = None if spans is None else spans[at:at + len(batch)]
            shown = None if previous is None else _within(previous[at:at + len(batch)],
                                                          max_chars)
            calls.append((batch, own if own and any(own) else None, shown))
            at += len(batch)
        try:
            # A hair past it: the stream's own timer sends the originals out first.
            async with asyncio.timeout(None if deadline_s is None else deadline_s + GRACE_S):
                due = None if deadline_s is None else time.monotonic() + deadline_s
                sent = _all([self._call(PoolCall(
                    texts=batch, source=source, target=target, model=model, deadline_ms=None,
                    sidecar=self.config.sidecar, spans=own, preview=job.preview,
                    previous=shown), due) for batch, own, shown in calls])
                answers = await (sent if job.stop is None else _unless_stopped(sent, job.stop))
        except TimeoutError:
            # The pool kept it past its deadline: slow or stuck, the breaker counts it.
            raise BackendTimeout("no answer from the pool by the batch's deadline") from None
        return [text for answer in answers for text in answer]

    async def _call(self, call: PoolCall, due: float | None) -> list[str]:
        """``call`` sent, its deadline as it stands now; its translations."""
        assert self._client is not None
        source, target, model = call.source, call.target, call.model
        call.deadline_ms = None if due is None else (due - time.monotonic()) * 1000.0
        unsaid = {name for name, none in (("spans", call.spans is None),
                                          ("preview", not call.preview),
                                          ("previous", not call.preview)) if none}
        payload = _dumps(call.model_dump(exclude=unsaid))
        try:
            resp = await self._ask(self._client.build_request(
                "POST", "/v1/batch", content=payload,
                headers={"Content-Type": "application/json"}), "the pool's answer")
        except httpx.ConnectError as exc:  # nothing listens there (any more)
            raise self._unreachable(exc) from exc
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"pool: no answer in {self.config.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:  # a connection dropped mid-call: this call's trouble
            raise BackendUnavailable(f"pool: {first_line(exc)}") from exc
        body = _json(resp)
        if resp.status_code != 200:
            raise self._refused(resp, body)
        out = body.get("translations")
        if not isinstance(out, list):  # its length is the batcher's to check
            raise BadOutput(f"pool returned {type(out).__name__}, not a list of translations")
        self.pool.heard(model, source, target, body)
        kept = body.get("spans")
        if isinstance(kept, dict):
            for name in self.spans_kept:
                count = kept.get(name)
                self.spans_kept[name] += count if isinstance(count, int) else 0
        self._mark_up()
        return out


# The pool's problem types, and the errors they are here.
PROBLEM = "urn:thinktrans:problem:"
_BY_SLUG: dict[str, type[BackendError]] = {
    "expired": Expired,
    "preview-stopped": Stopped,
    "unsupported-language": UnsupportedLanguage,
    "backend-timeout": BackendTimeout,
    "backend-unavailable": BackendUnavailable,
    "rate-limited": RateLimited,
    "bad-output": BadOutput,
}


async def _all(calls: list[Coroutine[Any, Any, list[str]]]) -> list[list[str]]:
    """Every call's answer, in order; the first failure cancels the others."""
    if len(calls) == 1:
        return [await calls[0]]
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _unless_stopped(sent: Coroutine[Any, Any, list[list[str]]], stop: threading.Event
                          ) -> list[list[str]]:
    """``sent``'s answers, unless ``stop`` is set first (a preview's ``Job.stop``: segments
    came to wait for this backend's slots): then its calls are given up (their connections
    close; the pool drops or stops them) and ``Stopped`` raised."""
    task = asyncio.ensure_future(sent)
    try:
        while not stop.is_set():
            done, _ = await asyncio.wait([task], timeout=STOP_POLL_S)
            if done:
                return task.result()
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise Stopped("segments came to wait for the pool backend: the preview stopped")


def _parts(texts: list[str], max_texts: int, max_chars: int, sizes: Sequence[int] = (),
           max_bytes: int | None = None) -> list[list[str]]:
    """``texts`` in order, cut into calls of at most ``max_texts`` texts, ``max_chars``
    characters and, with each text's ``sizes`` in the body, ``max_bytes`` (a longer text goes
    alone)."""
    parts: list[list[str]] = [[]]
    chars = size = 0
    for i, text in enumerate(texts):
        grows = sizes[i] if sizes else 0
        if parts[-1] and (len(parts[-1]) >= max_texts or chars + len(text) > max_chars
                          or (max_bytes is not None and size + grows > max_bytes)):
            parts.append([])
            chars = size = 0
        parts[-1].append(text)
        chars += len(text)
        size += grows
    return parts


def _dumps(body: Any) -> bytes:
    """A call's body as it is sent: compact JSON in UTF-8."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _sizes(texts: Sequence[str], spans: list[list[WireSpan]] | None,
           previous: Sequence[str | None] | None = None) -> list[int]:
    """What each text adds to a call's body, its spans and previous preview included (and
    their commas)."""
    return [len(_dumps(text)) + 1 + (len(_dumps(spans[i])) + 1 if spans else 0)
            + (len(_dumps(previous[i])) + 1 if previous is not None else 0)
            for i, text in enumerate(texts)]


def _envelope(job: Job, sidecar: str) -> int:
    """A call's body without its texts, spans and previous previews: a bound, the deadline
    at its longest."""
    return len(_dumps({"texts": [], "source": job.source, "target": job.target,
                       "model": job.model, "deadline_ms": -1.7976931348623157e308,
                       "sidecar": sidecar, "spans": [], "preview": True, "previous": []}))


def _wire_previous(job: Job, max_text: int) -> list[str | None] | None:
    """A preview's previous previews as a call carries them, one per text, each cut to
    ``max_text`` characters (a prefix of a preview is still one); None for a job that is
    not a preview, or has none."""
    if not job.preview or not job.previous or not any(job.previous):
        return None
    given = list(job.previous)[:len(job.texts)]
    given += [None] * (len(job.texts) - len(given))
    return [None if text is None else text[:max_text] for text in given]


def _within(previous: list[str | None], max_chars: int) -> list[str | None] | None:
    """One call's previous previews, in order while they fit ``max_chars`` in all (the rest
    null: those texts decode unbiased); None when none is left."""
    out: list[str | None] = []
    chars = 0
    for text in previous:
        chars += len(text or "")
        out.append(text if chars <= max_chars else None)
    return out if any(out) else None


def _whole_previous(job: Job, parts: Sequence[Part]) -> list[str | None] | None:
    """Per part of a job's cut texts, its text's previous preview where the text went whole;
    a part of a text cut in several goes unbiased (its share of the preview is unknown)."""
    if not job.preview or not job.previous:
        return None
    count = [0] * len(job.texts)
    for part in parts:
        count[part.index] += 1
    previous = list(job.previous)
    return [previous[part.index] if count[part.index] == 1 and part.index < len(previous)
            else None for part in parts]


def _stretches(protected: Sequence[Protected | None] | None, count: int
               ) -> list[list[tuple[int, int]]] | None:
    """Each text's spans, as stretches no cut may fall inside."""
    if protected is None:
        return None
    return [[(s.start, s.end) for s in p.spans] if p is not None else []
            for p in (list(protected) + [None] * count)[:count]]


def _part_spans(protected: Protected | None, part: Part) -> Protected | None:
    """The spans of one part of a cut text, their offsets into the part."""
    if protected is None:
        return None
    end = part.start + len(part.text)
    spans = tuple(Span(s.start - part.start, s.end - part.start, s.kind, s.out)
                  for s in protected.spans if part.start <= s.start and s.end <= end)
    return Protected(part.text, spans, protected.glossary) if spans else None


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
