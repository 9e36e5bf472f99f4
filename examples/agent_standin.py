"""A stand-in for an agent server: streams a recorded thinking trace through thinktrans.

For each thinking part in the trace (one JSON line: ``{"part": 1, "deltas": ["Hmm", ",", ...]}``)
it opens a stream, posts the deltas with their seqs in small batches as a model would emit
them, reads the stream's Server-Sent Events, and prints each translated segment as it comes.
At the end it checks the contract's invariant: the segments' originals, joined, give back the
deltas byte for byte. Needs only httpx and the standard library.

    python examples/agent_standin.py --url http://127.0.0.1:8088 --target zh-CN

Open ``<url>/viewer`` beside it to watch the parts translate (``--keep`` leaves them there;
``--previews`` asks for provisional translations of long sentences while they stream).

Exit status: 0 when every part came back whole, 1 when one did not, 2 when the service
could not be reached or refused a request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

TRACE = Path(__file__).with_name("thinking_trace.jsonl")


def load_trace(path: Path) -> list[list[str]]:
    """The trace's parts, each a list of deltas."""
    parts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            record = json.loads(line)
            deltas = record.get("deltas")
            if not isinstance(deltas, list) or not all(isinstance(d, str) for d in deltas):
                raise ValueError(f"{path}:{number}: expected {{\"deltas\": [str, ...]}}")
            parts.append(deltas)
    return parts


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(event, data) pairs from a text/event-stream response; comments are heartbeats."""
    event = "message"
    data: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


def _shown(text: str) -> str:
    return text.strip().replace("\n", "\n      ")


async def wait_ready(client: httpx.AsyncClient, timeout_s: float) -> None:
    """Wait for /readyz (a model may still be loading); go on with a warning at the timeout."""
    until = time.monotonic() + timeout_s
    said = ""
    while True:
        try:
            response = await client.get("/readyz")
            if response.status_code == 200:
                return
            reasons = [f"{name}: {state.get('reason')}"
                       for name, state in response.json().get("backends", {}).items()
                       if not state.get("ready")]
            now = "; ".join(reasons) or response.json().get("status", "not ready")
        except httpx.TransportError as exc:
            now = f"not reachable ({exc.__class__.__name__})"
        if now != said:
            print(f"waiting for thinktrans: {now}", file=sys.stderr)
            said = now
        if time.monotonic() >= until:
            print("thinktrans is not ready; streaming anyway (segments may come back "
                  "untranslated)", file=sys.stderr)
            return
        await asyncio.sleep(1.0)


async def stream_part(client: httpx.AsyncClient, stream_id: str, deltas: list[str], *,
                      target: str, batch: int, interval_s: float, keep: bool = False,
                      previews: bool = False) -> bool:
    """Send one thinking part through a stream, print its segments (and, with ``previews``,
    the provisional translations of sentences still open); True if it came back whole."""
    body: dict[str, object] = {"stream_id": stream_id, "target": target}
    if previews:
        body["previews"] = True
    response = await client.post("/v1/streams", json=body)
    response.raise_for_status()
    print(f"== {stream_id} -> {response.json()['target']}")
    originals: dict[int, str] = {}

    async def read() -> None:
        headers = {"Accept": "text/event-stream"}
        async with client.stream("GET", f"/v1/streams/{stream_id}/events", headers=headers,
                                 timeout=httpx.Timeout(10.0, read=None)) as events:
            events.raise_for_status()
            async for kind, data in sse_events(events):
                if kind == "segment":
                    originals[data["index"]] = data["original"]
                    if data["text"].strip():
                        tag = data["status"] + (f"/{data['backend']}"
                                                if data["status"] == "translated" else "")
                        print(f"  [{data['index']:>2} {tag}] {_shown(data['text'])}")
                elif kind == "preview":
                    print(f"  [{data['index']:>2} preview {data['revision']}] "
                          f"{_shown(data['text'])} ...")
                elif kind == "update":
                    tag = data["status"] + (f"/{data['backend']}" if data.get("backend") else "")
                    print(f"  [{data['index']:>2} update {tag}] {_shown(data['text'])}")
                elif kind == "end":
                    return

    reader = asyncio.create_task(read())
    try:
        for start in range(0, len(deltas), batch):
            chunks = [{"seq": seq, "text": deltas[seq]}
                      for seq in range(start, min(start + batch, len(deltas)))]
            posted = await client.post(f"/v1/streams/{stream_id}/chunks",
                                       json={"chunks": chunks})
            posted.raise_for_status()
            await asyncio.sleep(interval_s)
        closed = await client.post(f"/v1/streams/{stream_id}/close")
        closed.raise_for_status()
        await asyncio.wait_for(reader, timeout=120.0)
    finally:
        reader.cancel()
    if not keep:
        # Read to the end: drop it now rather than let it count against max_streams until
        # it expires (with --keep it stays for the viewer, /viewer#stream=<id>).
        await client.delete(f"/v1/streams/{stream_id}")
    whole = "".join(originals[i] for i in sorted(originals)) == "".join(deltas)
    if not whole or sorted(originals) != list(range(len(originals))):
        print(f"  !! {stream_id}: the segments do not give back the deltas", file=sys.stderr)
        return False
    return True


async def run(args: argparse.Namespace) -> int:
    parts = load_trace(args.trace)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), headers=headers,
                                 timeout=30.0) as client:
        await wait_ready(client, args.ready_timeout)
        whole = True
        for number, deltas in enumerate(parts, 1):
            stream_id = f"standin-{os.getpid()}:{number}"
            whole &= await stream_part(client, stream_id, deltas, target=args.target,
                                       batch=args.batch, interval_s=args.interval_ms / 1000,
                                       keep=args.keep, previews=args.previews)
    print(f"{len(parts)} parts streamed; " + ("all came back whole" if whole else "NOT whole"))
    return 0 if whole else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("THINKTRANS_URL", "http://127.0.0.1:8088"),
                        help="thinktrans base URL (default: $THINKTRANS_URL or %(default)s)")
    parser.add_argument("--target", default="zh-CN", help="target locale (default: %(default)s)")
    parser.add_argument("--trace", type=Path, default=TRACE, help="JSON lines of deltas")
    parser.add_argument("--batch", type=int, default=4, help="deltas per POST (default: 4)")
    parser.add_argument("--interval-ms", type=float, default=50.0,
                        help="pause between POSTs, as a model emits (default: 50)")
    parser.add_argument("--ready-timeout", type=float, default=600.0,
                        help="seconds to wait for /readyz (default: 600)")
    parser.add_argument("--previews", action="store_true",
                        help="ask for previews: provisional translations of long sentences "
                             "while they stream, printed as `preview` lines")
    parser.add_argument("--keep", action="store_true",
                        help="leave each stream on the sidecar when done, to look at it in "
                             "the viewer (<url>/viewer)")
    parser.add_argument("--token", default=os.environ.get("THINKTRANS_API_TOKEN"),
                        help="bearer token (default: $THINKTRANS_API_TOKEN)")
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error("--batch must be >= 1")
    try:
        return asyncio.run(run(args))
    except httpx.HTTPStatusError as exc:
        print(f"agent_standin: {exc.request.method} {exc.request.url.path} answered "
              f"{exc.response.status_code}: {exc.response.text[:300]}", file=sys.stderr)
    except httpx.TransportError as exc:
        print(f"agent_standin: cannot reach {args.url}: {exc!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
