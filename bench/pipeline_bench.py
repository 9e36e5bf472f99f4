"""The service's own cost per segment with the passthrough backend.

Runs one-shot translations in-process, N at a time, and reports wall time and CPU time
per segment: ``--via app`` (the default) posts them to the app over ASGI (routing,
validation, the response: no network), ``--via runtime`` calls ``Runtime.translate``
directly. max_wait_ms is 0 so that batching waits do not hide the CPU cost.

    .venv/bin/python bench/pipeline_bench.py --concurrency 1 --concurrency 64 [--via runtime]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx

from service.http.app import create_app
from service.runtime import Runtime
from service.settings import Settings, load_settings

TEXT = (
    "Hmm, the user asked how long the hike takes. Let me add the segments first. "
    "The first part is 3.5 km at 4 km/h, so that is about 52 minutes. "
    "我们再检查一下总时间。 Then the climb: 600 m up, roughly an hour more. "
    "So the total is close to two hours, e.g. 1 h 55 min. Wait, did I include the breaks? "
)


async def run(concurrency: int, requests: int, via: str) -> tuple[float, float, int]:
    """Wall and CPU seconds for ``requests`` one-shot texts, and the segments they held."""
    os.environ.setdefault("THINKTRANS_LOG_LEVEL", "warning")
    settings = load_settings(backend="passthrough", max_wait_ms=0, default_locale="zh-CN")
    if via == "app":
        return await _through_app(settings, concurrency, requests)
    async with Runtime(settings) as runtime:
        await runtime.wait_ready(timeout_s=60.0)
        [first] = await runtime.translate([TEXT], target="zh-CN")
        per_request = len(first.segments)
        sem = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with sem:
                [result] = await runtime.translate([TEXT], target="zh-CN")
                assert len(result.segments) == per_request

        wall0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall, cpu, per_request * requests


async def _through_app(settings: Settings, concurrency: int, requests: int
                       ) -> tuple[float, float, int]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            body = {"target": "zh-CN", "texts": [TEXT]}
            r = await client.post("/v1/translate", json=body)
            per_request = len(r.json()["results"][0]["segments"])
            sem = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with sem:
                    resp = await client.post("/v1/translate", json=body)
                    assert resp.status_code == 200

            wall0, cpu0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(one() for _ in range(requests)))
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall, cpu, per_request * requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--via", choices=("app", "runtime"), default="app")
    args = parser.parse_args()
    print("| concurrent requests | segments | wall µs/segment | CPU µs/segment | segments/s |")
    print("| --- | --- | --- | --- | --- |")
    for c in args.concurrency or [1, 64]:
        wall, cpu, segments = asyncio.run(run(c, args.requests, args.via))
        print(f"| {c} | {segments} | {wall / segments * 1e6:.0f} | {cpu / segments * 1e6:.0f} "
              f"| {segments / wall:.0f} |")


if __name__ == "__main__":
    main()
