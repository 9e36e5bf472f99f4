"""The pool's clients (``Clients``): who calls (tokens), how much each may have waiting, and
what each got, so that a replica can tell its sidecars apart, cap them and count their work.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pool.fair import Unit
from service.exceptions import Forbidden, OverCap
from service.settings import PoolClient, Settings

# A call's queue waits kept per client, for its p50/p99 in /v1/stats.
RECENT_WAITS = 256
UNNAMED = "unnamed"  # the id of calls that name none (sidecars before client ids)
# The metrics' label of the ids past ``metrics_max_clients``: no client id starts with "_".
OTHERS = "_other"


@dataclass(frozen=True)
class ClientPolicy:
    """What the pool's config says of one client."""

    token_sha256: str | None
    weight: float
    max_waiting: int | None  # None: the pool's ``pool_client_max_waiting``

    @classmethod
    def of(cls, client: PoolClient) -> ClientPolicy:
        """One entry of ``pool_clients``."""
        return cls(token_sha256=client.digest(), weight=client.weight,
                   max_waiting=client.max_waiting)


@dataclass(frozen=True)
class Sharing:
    """How a replica shares its engine between clients: the config's clients (tokens,
    weights, caps), the default cap, the other clients it keeps counts for and those with
    metrics series of their own, and the turn rule."""

    policies: dict[str, ClientPolicy]
    max_waiting: int
    max_clients: int
    metrics_max_clients: int
    fair: bool
    unit: Unit

    @classmethod
    def from_settings(cls, s: Settings) -> Sharing:
        """``pool_clients``, ``pool_client_max_waiting``, ``pool_max_clients``,
        ``pool_metrics_max_clients``, ``pool_fair`` and ``pool_fair_unit``."""
        return cls(policies={name: ClientPolicy.of(c) for name, c in s.pool_clients.items()},
                   max_waiting=s.pool_client_max_waiting, max_clients=s.pool_max_clients,
                   metrics_max_clients=s.pool_metrics_max_clients,
                   fair=s.pool_fair, unit=s.pool_fair_unit)


class Unauthorized(Exception):
    """No token the pool knows."""


@dataclass
class ClientCounts:
    """One client's work in this replica."""

    calls: int = 0
    segments: int = 0  # accepted
    translated_segments: int = 0
    expired_segments: int = 0
    cancelled_segments: int = 0
    failed_segments: int = 0
    stopped_segments: int = 0  # of previews stopped for segment work
    refused_calls: int = 0  # over its cap
    refused_segments: int = 0
    waiting_segments: int = 0  # now: accepted, not yet answered
    waits_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_WAITS))

    def view(self) -> dict[str, Any]:
        body = {k: v for k, v in vars(self).items() if k != "waits_ms"}
        waits = sorted(self.waits_ms)
        body["queue_wait_ms"] = ({"p50": round(statistics.median(waits), 1),
                                  "p99": round(waits[min(len(waits) - 1,
                                                         int(0.99 * len(waits)))], 1)}
                                 if waits else None)
        return body


class _Metrics:
    """Ray's metrics of the per-client counts (exported by Ray's metrics agent)."""

    def __init__(self) -> None:
        from ray.util import metrics

        self.segments = metrics.Counter(
            "thinktrans_pool_segments", "Segments per pool client and outcome (accepted, "
            "translated, expired, cancelled, failed, stopped, refused).",
            tag_keys=("client", "outcome"))
        self.waiting = metrics.Gauge(
            "thinktrans_pool_waiting_segments", "Segments a pool client has waiting or "
            "running in this replica.", tag_keys=("client",))


class Clients:
    """The clients of one replica: their identity, caps and counts.

    A sidecar names itself in each call (``sidecar``: its ``THINKTRANS_POOL_CLIENT_ID``). The
    pool's config may name clients (``pool_clients``), each with its own token, weight and cap:

    - a call carrying a client's own token counts as that client's, whatever it names;
    - a call naming a client that has a token of its own must carry that token (403 otherwise);
    - the shared ``pool_token`` (or none, when neither it nor any client token is set) lets a
      sidecar call under any other name.

    A client may have at most its cap (``max_waiting``, else ``pool_client_max_waiting``) of
    segments waiting or running in a replica (one with nothing waiting may send one call of any
    size the pool's limits allow); a call past it is refused with ``OverCap`` (429,
    ``Retry-After``: about how long the replica takes to run that much), and its sidecar's chain
    serves it. Counts are kept per client (``/v1/stats``, and Ray's metrics when Ray runs):
    ids the config names always have their place, and besides them at most ``max_clients``
    ids: past that a new id takes the place of the one seen least recently with nothing
    waiting, and is refused while every one of them has work waiting. In Ray's metrics, whose
    series are never dropped, the config's ids and the first ``metrics_max_clients`` others
    have series of their own, and the rest are counted together under ``OTHERS``.
    """

    def __init__(self, policies: Mapping[str, ClientPolicy], *, shared_sha256: str | None,
                 max_waiting: int, max_clients: int, metrics_max_clients: int,
                 metrics: bool = False) -> None:
        self.policies = dict(policies)
        self.shared_sha256 = shared_sha256
        self.max_waiting = max_waiting
        self.max_clients = max_clients
        self.metrics_max_clients = metrics_max_clients
        self._owners = {p.token_sha256: name for name, p in self.policies.items()
                        if p.token_sha256}
        self.counts: OrderedDict[str, ClientCounts] = OrderedDict()  # least recent first
        self._others = 0  # ids in the counts that the config does not name
        self.metrics = _Metrics() if metrics else None
        self._labelled: set[str] = set()  # ids the config does not name, with series
        self._others_waiting = 0  # segments waiting of the ids counted under OTHERS
        self.forgotten = 0  # ids dropped from the counts to make room for new ones

    @property
    def auth_required(self) -> bool:
        return self.shared_sha256 is not None or bool(self._owners)

    def owner(self, authorization: str) -> str | None:
        """Whose token an ``Authorization`` header carries: a client's id, or None for the
        shared token (or none needed). Raises ``Unauthorized``."""
        if not self.auth_required:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        if self.shared_sha256 is not None and hmac.compare_digest(digest, self.shared_sha256):
            return None
        for known, name in self._owners.items():
            if hmac.compare_digest(digest, known):
                return name
        raise Unauthorized

    def identify(self, owner: str | None, named: str) -> str:
        """The client a call counts as: its token's owner, else the name it gives, unless
        that name has a token of its own (``Forbidden``)."""
        if owner is not None:
            return owner
        policy = self.policies.get(named)
        if policy is not None and policy.token_sha256:
            raise Forbidden(f"client {named!r} has a token of its own in the pool's config "
                            "(pool_clients): send it as THINKTRANS_POOL_TOKEN")
        return named or UNNAMED

    def weight(self, client: str) -> float:
        policy = self.policies.get(client)
        return policy.weight if policy is not None else 1.0

    def cap(self, client: str) -> int:
        policy = self.policies.get(client)
        return policy.max_waiting if policy and policy.max_waiting else self.max_waiting

    # -- admission -----------------------------------------------------------------------------

    def admit(self, client: str, segments: int, seconds_per_segment: float) -> None:
        """Count a call's segments as waiting, or raise ``OverCap`` (429): past the client's
        cap (a client with nothing waiting may send one call whatever its size), or a new id
        while every id tracked has work waiting."""
        counts = self._counts(client)
        cap = self.cap(client)
        if counts.waiting_segments and counts.waiting_segments + segments > cap:
            counts.refused_calls += 1
            counts.refused_segments += segments
            self._count(client, "refused", segments)
            # About when its waiting work has run, at the replica's recent pace.
            wait = max(1, math.ceil(counts.waiting_segments * seconds_per_segment))
            raise OverCap(f"client {client!r} has {counts.waiting_segments} segments waiting "
                          f"in this pool replica, and {segments} more would pass its cap of "
                          f"{cap} (pool_client_max_waiting, pool_clients.{client}.max_waiting)"
                          f": retry after {wait} s, or let the next backend serve them",
                          retry_after_s=wait)
        counts.calls += 1
        counts.segments += segments
        counts.waiting_segments += segments
        self._count(client, "accepted", segments)
        self._gauge(client, counts, segments)

    def release(self, client: str, segments: int) -> None:
        """A call answered: its segments wait no more."""
        counts = self.counts.get(client)
        if counts is not None:
            freed = min(segments, counts.waiting_segments)
            counts.waiting_segments -= freed
            self._gauge(client, counts, -freed)

    def outcome(self, client: str, outcome: str, segments: int) -> None:
        """Segments of a client translated, expired, cancelled, failed or stopped."""
        counts = self.counts.get(client)
        if counts is None or segments <= 0:
            return
        name = f"{outcome}_segments"
        setattr(counts, name, getattr(counts, name) + segments)
        self._count(client, outcome, segments)

    def waited(self, client: str, seconds: float) -> None:
        """How long a call waited for its first engine turn."""
        counts = self.counts.get(client)
        if counts is not None:
            counts.waits_ms.append(seconds * 1000.0)

    def view(self, owner: str | None = None) -> dict[str, dict[str, Any]]:
        """The counts for ``/v1/stats``, by client id, with each one's weight and cap: every
        client's for the shared token (``owner`` None), a client's own for its token."""
        names = list(self.counts) if owner is None else [owner]
        return {name: {**self.counts.get(name, ClientCounts()).view(),
                       "weight": self.weight(name), "cap": self.cap(name)} for name in names}

    def label(self, client: str) -> str:
        """The ``client`` label of an id in Ray's metrics: its own for the config's ids and
        the first ``metrics_max_clients`` others seen, ``OTHERS`` for the rest."""
        if client in self.policies or client in self._labelled:
            return client
        if len(self._labelled) < self.metrics_max_clients:
            self._labelled.add(client)
            return client
        return OTHERS

    # -- the table -----------------------------------------------------------------------------

    def _counts(self, client: str) -> ClientCounts:
        counts = self.counts.get(client)
        if counts is not None:
            self.counts.move_to_end(client)
            return counts
        if client not in self.policies:  # the config's ids take none of the others' places
            if self._others >= self.max_clients:
                idle = next((name for name, c in self.counts.items()
                             if c.waiting_segments == 0 and name not in self.policies), None)
                if idle is None:
                    raise OverCap(f"this pool replica tracks {self.max_clients} clients "
                                  "besides those in pool_clients, each with work waiting "
                                  "(pool_max_clients): retry shortly", retry_after_s=1)
                del self.counts[idle]
                self.forgotten += 1
            else:
                self._others += 1
        counts = self.counts[client] = ClientCounts()
        return counts

    def _count(self, client: str, outcome: str, segments: int) -> None:
        if self.metrics is not None:
            self.metrics.segments.inc(segments, tags={"client": self.label(client),
                                                      "outcome": outcome})

    def _gauge(self, client: str, counts: ClientCounts, change: int) -> None:
        label = self.label(client)
        if label == OTHERS:  # one series for them all: their sum
            self._others_waiting += change
        if self.metrics is not None:
            waiting = self._others_waiting if label == OTHERS else counts.waiting_segments
            self.metrics.waiting.set(waiting, tags={"client": label})

