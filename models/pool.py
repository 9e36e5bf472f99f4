"""The pool backend: batches sent to a shared pool of local-engine replicas (``thinktrans pool``).

Many sidecars share one pool on Ray Serve (``service/pool.py``). Each batch this sidecar's
batcher forms goes out as one call, ``POST {url}/v1/batch``, with its pair, the model a
stream named and the time left until its last segment is due (``deadline_ms``); the pool
merges calls from every sidecar into its own batches and drops a call whose deadline passed
before it ran (504 ``expired``: ``Expired``, which the circuit breaker does not count).
A batch whose deadline passed here is not sent at all. A call cancelled here (the batch
timed out, the service stops) closes its connection, and the pool drops it if still queued.

Readiness follows the pool's ``GET /v1/info``: not ready until it answers ready (the model
loaded), and probed again every ``outage_recheck_s`` while it is down or unreachable
(``models.remote``); the catalog, languages and batch limit come from the same answer.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, Field

from models.base import first_line
from models.remote import RemoteTranslator
from service.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    BadOutput,
    Expired,
    UnsupportedLanguage,
)

NO_URL_REASON = "set THINKTRANS_POOL_URL to the pool's address, e.g. http://pool:8000"
# Texts in one call when the pool has not said its own limit yet.
DEFAULT_CALL_TEXTS = 32
# Characters of a call's text in all; a larger batch is sent as several calls.
MAX_CALL_CHARS = 64_000


class PoolCall(BaseModel):
    """One call to the pool: a batch a sidecar formed, for one pair and model."""

    texts: list[str] = Field(min_length=1, description="The segments, in order.")
    source: str | None = Field(None, max_length=64, description="Source tag; null: unknown.")
    target: str = Field(min_length=1, max_length=64, description="Target BCP 47 tag.")
    model: str | None = Field(None, max_length=512, description="A model a stream named.")
    deadline_ms: float | None = Field(
        None, description="Milliseconds left until the last segment is due; the pool drops "
        "the call unrun once they have passed. Null: no deadline.")
    sidecar: str = Field("", max_length=256, description="Who sent it (host:pid), for stats.")


def sidecar_id() -> str:
    """This process, as the pool's stats name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class PoolConfig:
    url: str | None
    token: str | None = None
    timeout_s: float = 60.0  # one call's longest wait (the batch timeout bounds it too)
    concurrency: int = 8  # calls in flight at once from this sidecar
    sidecar: str = field(default_factory=sidecar_id)


class PoolTranslator(RemoteTranslator):
    """Sends each batch to the pool's HTTP route; one call per batch (split only past the
    pool's limits)."""

    name = "pool"
    uses_deadline = True
    outage_recheck_s = 2.0  # a pool restarts in seconds; come back soon after

    def __init__(self, config: PoolConfig) -> None:
        super().__init__()
        self.config = config
        self.max_concurrency = config.concurrency
        self._info: dict[str, Any] = {}  # the pool's last /v1/info answer that was ready
        self._client: httpx.AsyncClient | None = None
        if not config.url:
            self._not_configured(NO_URL_REASON)
            return
        self.url = config.url.rstrip("/")
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        self._client = httpx.AsyncClient(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=4 * config.concurrency,
                                max_keepalive_connections=config.concurrency),
        )
        # Not ready before the pool says so: a pool still loading its model gets nothing.
        self.ready = False
        self.reason = "waiting for the pool's first answer"

    async def aclose(self) -> None:
        await super().aclose()
        if self._client is not None:
            await self._client.aclose()

    # -- readiness ---------------------------------------------------------------------------

    async def _check(self) -> None:
        assert self._client is not None
        try:
            resp = await self._client.get("/v1/info", timeout=5.0)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        body = _json(resp)
        if resp.status_code == 200 and body.get("ready") is True:
            self._info = body
            self._mark_up()
            return
        raise self._refused(resp.status_code, body)

    def _unreachable(self, exc: httpx.HTTPError) -> BackendUnavailable:
        reason = f"pool at {self.url} unreachable: {first_line(exc)}"
        self._mark_down(reason, fail_fast=False)
        return BackendUnavailable(reason)

    def _refused(self, status: int, body: dict[str, Any]) -> BackendError:
        """The error for a pool's answer other than 200, marking the backend down where the
        pool is not serving (not ready, gone, or refusing this sidecar's token)."""
        detail = str(body.get("detail") or body.get("reason") or f"HTTP {status}")[:300]
        slug = str(body.get("type", "")).rsplit(":", 1)[-1]
        if status in (401, 403):
            reason = f"the pool refused the token (THINKTRANS_POOL_TOKEN): {detail}"
            self._mark_down(reason, fail_fast=True)
            return BackendUnavailable(reason)
        if slug == "expired":
            return Expired(detail)
        if slug == "unsupported-language":
            return UnsupportedLanguage(detail)
        if status in (404, 502, 503):  # not ready, or no pool route at this address (yet)
            reason = f"pool not ready: {detail}"
            self._mark_down(reason, fail_fast=False)
            return BackendUnavailable(reason)
        if status == 504:
            return BackendTimeout(detail)
        return BackendError(f"pool answered {status}: {detail}")

    # -- what the pool serves ------------------------------------------------------------------

    def languages(self) -> list[str] | None:
        langs = self._info.get("languages")
        return list(langs) if isinstance(langs, list) else None

    def catalog(self) -> list[dict[str, object]]:
        models = self._info.get("models")
        return list(models) if isinstance(models, list) else []

    def model_problem(self, model: str | None) -> str | None:
        return None  # the pool's local engine decides; one it cannot serve answers 422

    def resolve_model(self, model: str | None, source: str | None, target: str) -> str | None:
        default = self._info.get("default_model")
        return model if model is not None else (str(default) if default else None)

    def cache_identity(self, model: str | None, source: str | None, target: str) -> str | None:
        identity = self._info.get("identity")
        if not identity:
            return None  # not known yet: what the pool serves decides the output
        return f"pool|{identity}|{model}"

    def info(self) -> dict[str, object]:
        return {"url": getattr(self, "url", None), "sidecar": self.config.sidecar,
                "engine": self._info.get("engine"), "max_batch_size": self._call_texts()}

    def _call_texts(self) -> int:
        limit = self._info.get("max_batch_size")
        return limit if isinstance(limit, int) and limit > 0 else DEFAULT_CALL_TEXTS

    # -- translating ---------------------------------------------------------------------------

    async def translate(
        self,
        texts: Sequence[str],
        *,
        source: str | None,
        target: str,
        contexts: Sequence[str | None] | None = None,
        model: str | None = None,
        deadline_s: float | None = None,
    ) -> list[str]:
        self._refuse_if_unusable()
        if deadline_s is not None and deadline_s <= 0:
            raise Expired("every segment of the batch was past its deadline; not sent")
        parts = _parts(list(texts), self._call_texts(), MAX_CALL_CHARS)
        due = None if deadline_s is None else asyncio.get_running_loop().time() + deadline_s
        answers = await asyncio.gather(
            *(self._call(part, source, target, model, due) for part in parts))
        return [text for answer in answers for text in answer]

    async def _call(self, texts: list[str], source: str | None, target: str,
                    model: str | None, due: float | None) -> list[str]:
        assert self._client is not None
        left_ms = None if due is None else (due - asyncio.get_running_loop().time()) * 1000.0
        call = PoolCall(texts=texts, source=source, target=target, model=model,
                        deadline_ms=left_ms, sidecar=self.config.sidecar)
        try:
            resp = await self._client.post("/v1/batch", json=call.model_dump())
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"pool: no answer in {self.config.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from exc
        body = _json(resp)
        if resp.status_code != 200:
            raise self._refused(resp.status_code, body)
        out = body.get("translations")
        if not isinstance(out, list) or len(out) != len(texts):
            raise BadOutput(f"pool returned {type(out).__name__} for {len(texts)} texts")
        self._mark_up()
        return out


def _parts(texts: list[str], max_texts: int, max_chars: int) -> list[list[str]]:
    """``texts`` in order, cut into calls of at most ``max_texts`` texts and ``max_chars``
    characters (a longer text goes alone)."""
    parts: list[list[str]] = [[]]
    chars = 0
    for text in texts:
        if parts[-1] and (len(parts[-1]) >= max_texts or chars + len(text) > max_chars):
            parts.append([])
            chars = 0
        parts[-1].append(text)
        chars += len(text)
    return parts


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
