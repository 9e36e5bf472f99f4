"""Why the sidecar did not serve a request, in words: the reasons the client records.

A reason goes into logs and into the ``error`` of the segments a fallback gives out
(``sidecar: <reason>``), where an agent's user or operator reads it: it says what happened,
then the status and problem slug for whoever looks further. The problem document's
``detail`` is read to tell cases apart (a closed stream, a shutdown) but never copied in:
it may echo what the request carried.
"""

from __future__ import annotations

__all__ = ["CLOSED_EARLY", "SHUTTING_DOWN", "client_bug", "http_reason", "transport_reason"]

# (status, slug) -> what happened; a slug alone (any status) after that; status alone last.
_BY_SLUG: dict[str, str] = {
    "unauthorized": "the sidecar refused the API token; set THINKTRANS_API_TOKEN to its token",
    "host-not-allowed": ("the sidecar does not answer to the host name in its URL; add the name "
                         "to the sidecar's THINKTRANS_ALLOWED_HOSTS, or use its IP address"),
    "invalid-input": "the sidecar refused the request as invalid",
    "invalid-locale": "the sidecar does not know the target locale",
    "locale-not-allowed": "the target locale is not among the sidecar's allowed locales",
    "unknown-backend": "the sidecar has no such backend",
    "unsupported-language": "the sidecar's backends cannot translate into the target",
    "payload-too-large": "the sidecar refused the request as too large",
    "unsupported-media-type": "the sidecar refused the request's media type",
    "request-timeout": "the sidecar gave up reading the request",
    "not-found": "the sidecar no longer has the stream (it expired or was deleted)",
    "events-gone": "the sidecar no longer holds the stream's events",
    "conflict": "the sidecar refused the request as contradicting the stream's state",
    "overloaded": "the sidecar's queues are full",
    "too-many-streams": "the sidecar has as many streams open as it allows",
    "internal": "the sidecar failed",
    "invalid-config": "the sidecar is misconfigured",
    "backend-error": "the sidecar's backend failed",
    "backend-unavailable": "the sidecar's backend is unavailable",
    "backend-timeout": "the sidecar's backend took too long",
    "expired": "the request's deadline passed on the sidecar",
    "rate-limited": "the sidecar's backend is rate limited",
    "bad-output": "the sidecar's backend gave an unusable answer",
}
_BY_STATUS: dict[int, str] = {
    400: "the sidecar refused the request as malformed",
    401: _BY_SLUG["unauthorized"],
    403: "the sidecar forbids the request",
    404: "the sidecar has no such route or stream (an older sidecar, or the stream expired)",
    405: "the sidecar does not allow the request's method (an older sidecar?)",
    408: _BY_SLUG["request-timeout"],
    409: _BY_SLUG["conflict"],
    410: "the sidecar no longer holds what was asked for",
    413: _BY_SLUG["payload-too-large"],
    415: _BY_SLUG["unsupported-media-type"],
    421: _BY_SLUG["host-not-allowed"],
    422: _BY_SLUG["invalid-input"],
    429: "the sidecar asks for fewer requests",
    500: _BY_SLUG["internal"],
    502: "the sidecar, or a proxy in front of it, failed",
    503: "the sidecar is unavailable",
    504: "the sidecar, or a proxy in front of it, timed out",
}
SHUTTING_DOWN = "the sidecar is shutting down"
CLOSED_EARLY = ("the sidecar closed the stream before all its text was sent: it is shutting "
                "down, or another client closed the stream")


def http_reason(status: int, slug: str | None, detail: str = "") -> str:
    """What an HTTP error answer says happened, e.g. ``the sidecar is shutting down (HTTP
    503 overloaded)``."""
    code = f"HTTP {status}{' ' + slug if slug else ''}"
    detail = detail.lower()
    if "shutting down" in detail or "shut down" in detail:
        return f"{SHUTTING_DOWN} ({code})"
    if status == 409 and "closed" in detail:
        # A stream this client has not closed yet: the sidecar closes its open streams
        # when it shuts down; or another client closed a stream of the same id.
        return f"{CLOSED_EARLY} ({code})"
    words = _BY_SLUG.get(slug or "") or _BY_STATUS.get(status)
    if words is None:
        words = ("the sidecar refused the request" if status < 500
                 else "the sidecar failed")
    return f"{words} ({code})"


_TRANSPORT: dict[str, str] = {
    "ConnectError": "cannot connect to it",
    "ConnectTimeout": "connecting to it timed out",
    "ReadError": "the connection broke while reading its answer",
    "WriteError": "the connection broke while sending the request",
    "RemoteProtocolError": "it closed the connection without a whole answer",
    "LocalProtocolError": "the request could not be sent over HTTP",
    "ProxyError": "the HTTP proxy in between failed",
    "UnsupportedProtocol": "the URL's scheme is not http or https",
}


def transport_reason(exc: BaseException) -> str:
    """Why a request got no answer at all, e.g. ``the sidecar is unreachable: cannot
    connect to it (ConnectError)``."""
    name = type(exc).__name__
    words = _TRANSPORT.get(name, "the request failed on the way")
    return f"the sidecar is unreachable: {words} ({name})"


def client_bug(exc: BaseException) -> str:
    """The reason for an unexpected error inside the client (its log has the traceback)."""
    return (f"the client failed unexpectedly ({type(exc).__name__}); its log "
            "(thinktrans.client) has the details")
