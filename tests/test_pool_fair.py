"""One pool, many sidecars: client ids, per-client tokens, caps and fair engine turns, with a
real `thinktrans pool` (one per module, on a local Ray instance on 127.0.0.1) and real
`thinktrans serve` sidecars over HTTP.

The rules themselves (deficit round robin, caps, eviction) are checked without Ray in
tests/test_fair.py; here they are seen from outside, as operators and sidecars see them.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.tools.testmodel import make_test_model
from tests.conftest import Server, free_port, served

SHARED = "fair-shared-token"
ALICE = "alice-own-token"
# Segments "tiny" may have waiting in the pool; "alice" counts double in a turn.
CLIENTS = {"alice": {"token": ALICE, "weight": 2}, "tiny": {"max_waiting": 2},
           "flood": {"max_waiting": 1000}}
MAX_BATCH = 8
# Long enough that a second call comes while the first still waits for its turn.
BATCH_WAIT_MS = 300
SENTENCE = "The test number {} checks the parser and then runs the loop again."
# A pool's start (Ray, Serve, the one-time conversion) takes minutes on a loaded
# machine: this only stops a hang.
POOL_READY_S = 600.0


def _ray() -> Any:
    return pytest.importorskip(
        "ray.serve", reason="Ray Serve is not installed: pip install 'thinktrans[pool]'")


class Pool:
    def __init__(self, server: Server, model: Path, metrics_port: int) -> None:
        self.server, self.model, self.metrics_port = server, model, metrics_port

    @property
    def url(self) -> str:
        return self.server.url

    def stats(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/v1/stats", timeout=10,
                                         headers={"Authorization": f"Bearer {SHARED}"}).json()
        return body

    def client(self, name: str) -> dict[str, Any]:
        counts: dict[str, Any] = self.stats()["clients"].get(name, {})
        return counts


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    _ray()
    metrics_port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_test_model("marian", Path(tmp) / "marian-en-de")
        with served("pool", ready_s=POOL_READY_S, THINKTRANS_LOCAL_MODEL=str(model),
                    THINKTRANS_LOCAL_CT2_CACHE=str(Path(tmp) / "ct2"),
                    THINKTRANS_POOL_BATCH_WAIT_MS=str(BATCH_WAIT_MS),
                    THINKTRANS_POOL_MAX_BATCH_SIZE=str(MAX_BATCH),
                    THINKTRANS_POOL_TOKEN=SHARED, THINKTRANS_POOL_CLIENTS=json.dumps(CLIENTS),
                    THINKTRANS_POOL_METRICS_PORT=str(metrics_port),
                    HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0") as server:
            yield Pool(server, model, metrics_port)


def _sidecar(pool: Pool, client_id: str | None, *, token: str = SHARED, chain: str = "pool",
             **extra: str) -> dict[str, str]:
    env = {"THINKTRANS_BACKEND": chain, "THINKTRANS_POOL_URL": pool.url,
           "THINKTRANS_POOL_TOKEN": token, "THINKTRANS_DEFAULT_LOCALE": "de",
           # Random weights write noise in no language: the output check would refuse it.
           "THINKTRANS_CHECK_OUTPUT_LANGUAGE": "false",
           # Far past what the pool takes on a loaded machine: these tests check what the
           # pool translated, and the default (3 s) let a busy machine's segments out as they
           # came.
           "THINKTRANS_DEADLINE_MS": "120000", **extra}
    if client_id is not None:
        env["THINKTRANS_POOL_CLIENT_ID"] = client_id
    if "local" in chain:  # the same checkpoint, in the sidecar's own process
        env["THINKTRANS_LOCAL_MODEL"] = str(pool.model)
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _sentences(start: int, count: int) -> str:
    return " ".join(SENTENCE.format(i) for i in range(start, start + count))


async def _translate(url: str, texts: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        resp = await client.post("/v1/translate", json={"texts": texts, "target": "de"})
        assert resp.status_code == 200, resp.text
        return [seg for result in resp.json()["results"] for seg in result["segments"]]


def _pool_info(sidecar: Server) -> dict[str, Any]:
    body = httpx.get(f"{sidecar.url}/v1/backends", timeout=10).json()
    [pool] = [b for b in body["backends"] if b["name"] == "pool"]
    info: dict[str, Any] = pool["info"]
    return info


async def _call(pool: Pool, token: str, sidecar: str, texts: list[str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=pool.url, timeout=60) as client:
        return await client.post("/v1/batch", headers={"Authorization": f"Bearer {token}"},
                                 json={"texts": texts, "target": "de", "sidecar": sidecar})


async def test_each_sidecar_is_counted_under_its_client_id(pool: Pool) -> None:
    """Two sidecars on one host: the default ids differ (host:port), a set id is used as
    given, and the pool's stats count each one's segments apart."""
    with served(**_sidecar(pool, None)) as unnamed, served(**_sidecar(pool, "bob")) as bob:
        first, second = await asyncio.gather(_translate(unnamed.url, [_sentences(0, 3)]),
                                             _translate(bob.url, [_sentences(3, 2)]))
        default_id = _pool_info(unnamed)["client_id"]
        assert _pool_info(bob)["client_id"] == "bob"
    assert [s["backend"] for s in first + second] == ["pool"] * 5
    assert re.fullmatch(r".+:\d+", default_id) and default_id.endswith(
        f":{unnamed.url.rsplit(':', 1)[1]}"), default_id
    clients = pool.stats()["clients"]
    assert clients["bob"]["translated_segments"] == 2, clients
    assert clients[default_id]["translated_segments"] == 3, clients
    assert clients["bob"]["waiting_segments"] == 0
    assert clients["bob"]["queue_wait_ms"]["p99"] >= 0
    assert (clients["alice"] if "alice" in clients else {"weight": 2})["weight"] == 2


async def test_a_client_with_its_own_token_cannot_be_posed_as(pool: Pool) -> None:
    """Only alice's token calls as alice; with it, a call counts as alice's whatever it
    names; a token the pool does not know is refused."""
    posed = await _call(pool, SHARED, "alice", ["Hello there."])
    assert posed.status_code == 403, posed.text
    assert posed.headers["content-type"].startswith("application/problem+json")
    assert posed.json()["type"].endswith(":forbidden") and "alice" in posed.json()["detail"]
    own = await _call(pool, ALICE, "mallory", ["Hello there."])
    assert own.status_code == 200, own.text
    assert own.json()["client"] == "alice"
    assert (await _call(pool, "no-such-token", "x", ["Hi."])).status_code == 401
    counts = pool.client("alice")
    assert counts["translated_segments"] >= 1 and counts["weight"] == 2
    assert "mallory" not in pool.stats()["clients"]
    # A sidecar with alice's token is counted as alice, and names itself so.
    before = pool.client("alice")["translated_segments"]
    with served(**_sidecar(pool, "alice", token=ALICE)) as sidecar:
        segs = await _translate(sidecar.url, [_sentences(0, 2)])
    assert [s["backend"] for s in segs] == ["pool", "pool"]
    assert pool.client("alice")["translated_segments"] == before + 2


async def test_a_clients_own_token_reads_its_own_stats_alone(pool: Pool) -> None:
    """With alice's token /v1/stats has alice's counts and no other client's; the shared
    token reads every client's."""
    assert (await _call(pool, SHARED, "bystander", ["Hello there."])).status_code == 200
    assert (await _call(pool, ALICE, "alice", ["Hello there."])).status_code == 200
    own = httpx.get(f"{pool.url}/v1/stats", timeout=10,
                    headers={"Authorization": f"Bearer {ALICE}"})
    assert own.status_code == 200, own.text
    assert list(own.json()["clients"]) == ["alice"], own.json()["clients"]
    assert own.json()["clients"]["alice"]["translated_segments"] >= 1
    assert {"alice", "bystander"} <= set(pool.stats()["clients"])


async def test_a_call_past_a_clients_cap_gets_429_with_retry_after(pool: Pool) -> None:
    """tiny may have 2 segments waiting: a call of 3 with nothing waiting goes, a second one
    while it waits is refused with a 429 problem and a Retry-After in seconds."""
    first = asyncio.create_task(_call(pool, SHARED, "tiny", ["One.", "Two.", "Three."]))
    await asyncio.sleep(BATCH_WAIT_MS / 3000)  # the first waits its batch_wait_ms there
    second = await _call(pool, SHARED, "tiny", ["Four."])
    assert (await first).status_code == 200
    assert second.status_code == 429, second.text
    assert second.json()["type"].endswith(":over-cap"), second.json()
    assert int(second.headers["retry-after"]) >= 1
    assert "tiny" in second.json()["detail"] and "max_waiting" in second.json()["detail"]
    counts = pool.client("tiny")
    assert counts["refused_calls"] >= 1 and counts["refused_segments"] >= 1
    assert counts["cap"] == 2 and counts["waiting_segments"] == 0


async def test_a_sidecar_over_its_cap_has_its_chain_serve_and_stays_up(pool: Pool) -> None:
    """tiny's sidecar sends calls of 2 segments, several at once: those past its cap come
    back 429, and its next backend (local) serves them; every segment is translated and the
    pool backend stays ready (overload, not an outage)."""
    env = _sidecar(pool, "tiny", chain="pool,local", THINKTRANS_MAX_BATCH_SIZE="2")
    with served(ready_s=120, **env) as sidecar:
        give_up = time.monotonic() + 300
        while not all(b["ready"] for b in httpx.get(f"{sidecar.url}/v1/backends",
                                                    timeout=10).json()["backends"]):
            assert time.monotonic() < give_up, "the sidecar's local model did not load"
            await asyncio.sleep(0.2)
        texts = [_sentences(10 * i, 4) for i in range(4)]
        results = await asyncio.gather(*(_translate(sidecar.url, [t]) for t in texts))
        segs = [s for r in results for s in r]
        info = _pool_info(sidecar)
        ready = httpx.get(f"{sidecar.url}/v1/backends", timeout=10).json()
    assert [s["status"] for s in segs] == ["translated"] * 16, segs
    backends = {s["backend"] for s in segs}
    assert "local" in backends, backends
    assert info["throttled"] >= 1, info
    [pool_backend] = [b for b in ready["backends"] if b["name"] == "pool"]
    assert pool_backend["ready"] and not pool_backend["reason"], pool_backend
    assert pool.client("tiny")["refused_calls"] >= info["throttled"]


async def test_a_flood_from_one_sidecar_leaves_anothers_work_next_in_line(pool: Pool) -> None:
    """A sidecar with a backlog in the pool (many streams, no pause) and one light call from
    another: the light call waits for at most the turn running and the next, while the
    flood's calls wait behind its own backlog."""
    flood_env = _sidecar(pool, "flood", THINKTRANS_POOL_CONCURRENCY="32")
    with served(**flood_env) as flood, served(**_sidecar(pool, "light")) as light:
        await _translate(light.url, ["A first sentence to warm the sidecar up."])
        backlog = [asyncio.create_task(_translate(flood.url, [_sentences(100 * i, 6)]))
                   for i in range(48)]
        give_up = time.monotonic() + 120
        while pool.client("flood").get("waiting_segments", 0) < 16 * MAX_BATCH:
            assert time.monotonic() < give_up, pool.client("flood")
            await asyncio.sleep(0.05)
        before = pool.client("light")["calls"]
        [seg] = await _translate(light.url, [SENTENCE.format("light")])
        await asyncio.gather(*backlog)
    assert seg["status"] == "translated" and seg["backend"] == "pool", seg
    light_counts, flood_counts = pool.client("light"), pool.client("flood")
    assert light_counts["calls"] == before + 1
    # It waited for no more than the turn it came in, while the flood's calls waited behind
    # the flood's own backlog.
    assert flood_counts["translated_segments"] == 288, flood_counts
    assert light_counts["queue_wait_ms"]["p99"] < flood_counts["queue_wait_ms"]["p50"], (
        light_counts, flood_counts)


async def test_rays_metrics_count_segments_per_client(pool: Pool) -> None:
    """Ray's Prometheus endpoint (pool_metrics_port) has the per-client counter."""
    assert (await _call(pool, SHARED, "metered", ["Count me."])).status_code == 200
    url = f"http://127.0.0.1:{pool.metrics_port}/metrics"
    give_up, text = time.monotonic() + 120, ""
    while time.monotonic() < give_up:  # Ray exports its metrics every few seconds
        try:
            text = httpx.get(url, timeout=5).text
        except httpx.HTTPError:
            text = ""
        if re.search(r'thinktrans_pool_segments[^\n]*client="metered"', text):
            break
        await asyncio.sleep(1)
    lines = [line for line in text.splitlines()
             if line.startswith("ray_thinktrans_pool_segments") and 'client="metered"' in line]
    assert any('outcome="translated"' in line and line.split()[-1] in ("1", "1.0")
               for line in lines), lines
