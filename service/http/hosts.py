"""Which ``Host`` headers this server answers: its own names only, a defence against DNS
rebinding (a web page that points its own name at 127.0.0.1 and then reads the sidecar as
its own origin). Loopback names, IP literals (a rebinding page always comes under a DNS
name), the bound address and the names of ``THINKTRANS_ALLOWED_HOSTS`` pass.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

_CACHE_SIZE = 256  # Host headers whose answer is kept
_CACHED_BYTES = 300  # longer than any name and port: an answer not worth keeping


def host_name(header: str) -> str | None:
    """The name or address ``header`` (a Host value, ``name[:port]`` or ``[v6][:port]``)
    names, lower case, without its port or a trailing dot; None when it is not one."""
    value = header.strip().lower()
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        if not bracket or not _is_port(rest):
            return None
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return None
        return f"[{address}]"
    name, colon, port = value.partition(":")
    if not _is_port(colon + port):
        return None  # a second colon, or a port that is no number
    name = name.removesuffix(".")
    if not name or not all(part and _is_label(part) for part in name.split(".")):
        return None
    return name


def _is_port(suffix: str) -> bool:
    """Whether what follows a host is nothing, ``:`` or ``:`` and a number."""
    port = suffix[1:]
    return not suffix or (suffix[0] == ":" and (not port or (port.isascii() and port.isdecimal())))


def _is_label(part: str) -> bool:
    # A DNS label's characters, underscores too: compose service names have them.
    return part.isascii() and all(c.isalnum() or c in "-_" for c in part)


def _is_ip(name: str) -> bool:
    if name.startswith("["):
        return True  # host_name checked it is an IPv6 literal
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """Whether a request's ``Host`` header names this server: ``localhost`` and
    ``*.localhost``, an IP literal, ``bound`` (the address the server listens on) and the
    ``allowed`` names (``thinktrans``; ``*.example.com`` for the names under example.com;
    ``*`` for any name). A request without the header (HTTP/1.0) passes: no browser sends one."""

    def __init__(self, allowed: Sequence[str], bound: str) -> None:
        self.any = "*" in allowed
        self.names = {"localhost", *(name for name in allowed if not name.startswith("*"))}
        self.domains = (".localhost", *(name[1:] for name in allowed if name.startswith("*.")))
        bound_name = host_name(bound)
        if bound_name is not None:
            self.names.add(bound_name)
        self._seen: dict[bytes, bool] = {}  # a few headers, asked many times a second

    def allows(self, header: bytes | None) -> bool:
        """Whether a request with this Host header (raw, as it came) is answered."""
        if self.any or header is None:
            return True
        known = self._seen.get(header)
        if known is None:
            known = self._allows(header.decode("latin-1"))
            if len(header) <= _CACHED_BYTES:
                if len(self._seen) >= _CACHE_SIZE:
                    self._seen.clear()
                self._seen[header] = known
        return known

    def _allows(self, header: str) -> bool:
        name = host_name(header)
        if name is None:
            return False
        return name in self.names or name.endswith(self.domains) or _is_ip(name)
