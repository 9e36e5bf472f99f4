"""One call to the pool, as its route takes it: the call's limits, its body read within them
and parsed into a ``PoolCall`` with its spans and previous previews checked, and the
problems a refused call is answered with. What a replica queues has passed all of these.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from models.pooled import PoolCall
from service.exceptions import InputError, PayloadTooLarge, kind_of
from service.http.problems import problem
from service.settings import Settings


@dataclass(frozen=True)
class CallLimits:
    """What one call may carry, each refused past it with a 413 that names its setting; the
    call characters bound an engine turn too. Sidecars read them from ``/v1/info``."""

    max_text_chars: int
    max_call_chars: int
    max_call_bytes: int

    @classmethod
    def from_settings(cls, s: Settings) -> CallLimits:
        """``pool_max_text_chars``, ``pool_max_call_chars`` and ``pool_max_call_bytes``."""
        return cls(max_text_chars=s.pool_max_text_chars, max_call_chars=s.pool_max_call_chars,
                   max_call_bytes=s.pool_max_call_bytes)


async def read_within(request: Request, max_bytes: int) -> bytes | None:
    """The body, or None as soon as it is over ``max_bytes`` (declared or read so far):
    a body sent in chunks, with no ``Content-Length``, is read no further than that."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)


# What a field holds, said with the problem when it holds something else.
_HINTS = {"deadline_ms": "the milliseconds left until the call's last segment is due, a "
                         "finite number, or null for none"}


def parse_call(body: bytes, max_batch_size: int, limits: CallLimits) -> PoolCall:
    """A call's body, checked against the pool's bounds (its batch size, characters per
    text and per call, spans, previous context): InputError (a 422) or PayloadTooLarge (a
    413) says what is wrong."""
    try:
        call = PoolCall.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        hint = _HINTS.get(where)
        raise InputError(f"{where}: {first['msg']}" + (f" ({hint})" if hint else "")) from None
    if len(call.texts) > max_batch_size:
        raise PayloadTooLarge(f"{len(call.texts)} texts in one call; this pool takes at "
                              f"most {max_batch_size} (its max_batch_size)")
    longest = max(len(text) for text in call.texts)
    if longest > limits.max_text_chars:
        raise PayloadTooLarge(
            f"a text of {longest} characters; this pool takes at most "
            f"{limits.max_text_chars} per text (pool_max_text_chars, "
            "THINKTRANS_POOL_MAX_TEXT_CHARS): cut it at sentence ends")
    chars = sum(len(text) for text in call.texts)
    if chars > limits.max_call_chars:
        raise PayloadTooLarge(
            f"{chars} characters in one call; this pool takes at most "
            f"{limits.max_call_chars} (pool_max_call_chars, THINKTRANS_POOL_MAX_CALL_CHARS): "
            "send them as several calls")
    _check_spans(call)
    _check_previous(call, limits)
    return call


def _check_spans(call: PoolCall) -> None:
    """A call's spans, if any: one list per text, each span inside its text, in order and not
    overlapping (its types pydantic has checked); InputError (a 422) says which is not."""
    if call.spans is None:
        return
    if len(call.spans) != len(call.texts):
        raise InputError(f"spans: {len(call.spans)} lists for {len(call.texts)} texts; "
                         "send one per text, an empty one for a text without spans")
    for i, (text, spans) in enumerate(zip(call.texts, call.spans, strict=True)):
        at = 0
        for j, (start, end, _, _) in enumerate(spans):
            if not at <= start < end <= len(text):
                raise InputError(
                    f"spans.{i}.{j}: [{start}, {end}] is not a span of text {i} "
                    f"({len(text)} characters) after the one before it (ending at {at}): "
                    "spans are offsets into their text, in order, not empty, not overlapping")
            at = end


def _check_previous(call: PoolCall, limits: CallLimits) -> None:
    """A preview call's previous previews: one per text (InputError: a 422), within the
    call's character limits (PayloadTooLarge: a 413)."""
    if call.previous is None:
        return
    if len(call.previous) != len(call.texts):
        raise InputError(f"previous: {len(call.previous)} for {len(call.texts)} texts; send "
                         "one per text, null for a text without a previous preview")
    sizes = [len(text or "") for text in call.previous]
    if max(sizes) > limits.max_text_chars or sum(sizes) > limits.max_call_chars:
        raise PayloadTooLarge(
            f"previous: at most {limits.max_text_chars} characters each and "
            f"{limits.max_call_chars} in all (pool_max_text_chars, pool_max_call_chars)")


def too_large(max_bytes: int) -> JSONResponse:
    """The 413 for a body over ``max_bytes``, not read to its end: the connection closes
    after it."""
    kind = kind_of(PayloadTooLarge)
    detail = (f"a call's body is at most {max_bytes} bytes "
              "(pool_max_call_bytes, THINKTRANS_POOL_MAX_CALL_BYTES)")
    return problem(kind.status, kind.title, detail, kind.slug, headers={"Connection": "close"})


def unauthorized() -> JSONResponse:
    """The 401 for a call with no token the pool knows."""
    return problem(401, "Unauthorized", "send 'Authorization: Bearer <THINKTRANS_POOL_TOKEN>', "
                   "the pool's token or this sidecar's own", "unauthorized",
                   headers={"WWW-Authenticate": "Bearer"})
