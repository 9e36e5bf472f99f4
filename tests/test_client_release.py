"""The client leaves no stream of its own open on the sidecar: ``aclose`` releases them all.

Against the app in-process, and against a sidecar under uvicorn on 127.0.0.1 reached
through a forwarder that hands a request its client gave up on to the sidecar late, as a
sidecar slow to read does: such a chunk POST must not open the stream again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import httpx
import pytest
from thinktrans_client.client import StreamItem, ThinkingStream, ThinktransClient

from tests.conftest import InThread, Running, app_with
from tests.fakes import FakeTranslator

THOUGHT = "Still thinking about the dates"  # no sentence end: it stays open on the sidecar


async def until(check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait until ``check()`` holds (a generous bound stops a hang)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def open_ids(running: Running) -> list[str]:
    streams = (await running.client.get("/v1/streams")).json()["streams"]
    return sorted(s["stream_id"] for s in streams if s["state"] == "open")


async def read_all(stream: ThinkingStream) -> list[StreamItem]:
    return [item async for item in stream.results()]


async def test_aclose_releases_the_streams_their_owners_left_open() -> None:
    """One stream still being read, one closed and never released, one neither: the client
    closes, and none is left open on the sidecar. The one being read gives out its text as
    pushed, the originals joined exactly."""
    fake = FakeTranslator(gate=asyncio.Event())  # nothing is translated meanwhile
    async with app_with(fake, default_locale="de") as running:
        client = ThinktransClient("http://127.0.0.1",
                                  transport=httpx.ASGITransport(app=running.app))
        streams = [client.stream(f"t:left.{n}", target="de") for n in range(3)]
        for stream in streams:
            await stream.push(THOUGHT)
        opened: list[str] = []

        async def all_open() -> None:
            while len(opened) < 3:
                opened[:] = await open_ids(running)
                await asyncio.sleep(0.02)

        await asyncio.wait_for(all_open(), 60)
        reader = asyncio.create_task(read_all(streams[0]))
        await streams[1].close()
        await asyncio.wait_for(client.aclose(), 60)
        assert await open_ids(running) == []
        await streams[0].close()  # its owner ends it: the reader gets the rest, and ends
        items = await asyncio.wait_for(reader, 60)
    assert "".join(item.original for item in items) == THOUGHT
    assert {item.status for item in items} <= {"error", "deadline"}


class SlowToRead:
    """A forwarder to a sidecar that answers no chunk POST: it keeps one until its client
    gives up on it (a timeout, or the connection cut), and hands it to the sidecar just after
    the stream's next close or DELETE. ``log``: (what, path, the sidecar's status)."""

    def __init__(self, sidecar_url: str) -> None:
        self.sidecar_url = sidecar_url
        self.late: dict[str, list[tuple[str, bytes]]] = {}
        self.log: list[tuple[str, str, int]] = []
        self.holding = asyncio.Event()  # a chunk POST is kept unanswered
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with httpx.AsyncClient(base_url=self.sidecar_url, timeout=60) as http:
                while await self._one(reader, writer, http):
                    pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   http: httpx.AsyncClient) -> bool:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        length = next((int(line.split(":", 1)[1]) for line in head
                       if line.lower().startswith("content-length:")), 0)
        body = await reader.readexactly(length) if length else b""
        parts = path.split("?", 1)[0].split("/")
        stream_id = parts[3] if len(parts) > 3 else json.loads(body)["stream_id"]
        headers = {"content-type": "application/json"} if body else {}
        if method == "POST" and parts[-1] == "chunks":
            self.holding.set()
            await reader.read()  # until the client gives up on it and closes the connection
            self.late.setdefault(stream_id, []).append((path, body))
            self.log.append(("given up", path, 0))
            return False
        answer = await http.request(method, path, content=body, headers=headers)
        self.log.append((method, path, answer.status_code))
        if method == "DELETE" or parts[-1] == "close":
            for late_path, late_body in self.late.pop(stream_id, []):
                late = await http.post(late_path, content=late_body, headers=headers or {
                    "content-type": "application/json"})
                self.log.append(("late POST", late_path, late.status_code))
        writer.write(f"HTTP/1.1 {answer.status_code} -\r\ncontent-type: "
                     f"{answer.headers.get('content-type', 'application/json')}\r\n"
                     f"content-length: {len(answer.content)}\r\n\r\n".encode() + answer.content)
        await writer.drain()
        return True


@pytest.fixture(scope="module")
def sidecar() -> Iterator[str]:
    with InThread(default_locale="de") as url:
        yield url


async def test_a_chunk_post_given_up_does_not_open_the_stream_again(sidecar: str) -> None:
    """The part's wait ends (``close_wait_s``) while its chunk POST has no answer; the sidecar
    handles that POST only after the stream's release. Cut off and followed by a DELETE, it
    would open the stream again (a stream not yet opened is opened by its first chunk), to
    stay open until its idle expiry; let end and unanswered, the stream is closed instead,
    and the POST is refused (409)."""
    forwarder = SlowToRead(sidecar)
    async with forwarder as url:
        async with ThinktransClient(url, timeout_s=1.0, poll_wait_s=0.2) as client:
            stream = client.stream("late.1", target="de", close_wait_s=0.05)
            await stream.push(THOUGHT)
            await asyncio.wait_for(forwarder.holding.wait(), 60)  # the chunk POST is out
            await stream.close()
            items = await asyncio.wait_for(read_all(stream), 60)
            await stream.aclose()
        assert "".join(item.original for item in items) == THOUGHT
        async with httpx.AsyncClient(base_url=sidecar) as http:

            async def is_open() -> bool:
                streams = (await http.get("/v1/streams")).json()["streams"]
                return any(s["stream_id"] == "late.1" and s["state"] == "open"
                           for s in streams)

            left = True
            for _ in range(300):  # a closed stream ends at once: it holds no text
                left = await is_open()
                if not left:
                    break
                await asyncio.sleep(0.1)
        late = [entry for entry in forwarder.log if entry[0] == "late POST"]
    assert late, forwarder.log  # the POST given up did reach the sidecar, after the release
    assert not left, forwarder.log
    assert [status for *_, status in late] == [409], forwarder.log
