"""An HTTP/1.1 server on 127.0.0.1 whose answers may never end, counting what it sends.

Each route answers a status, a content type and a head; an ``endless`` one then sends filler
in 64 KiB chunks, made as they go, until the client closes the connection (or ``CAP``: a
client that never stops fails its test instead of filling the machine). ``sent`` counts the
body bytes handed to the socket, so a test sees how much a client read before it gave up;
``IN_FLIGHT`` is what the sockets between them may hold besides.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

CHUNK = 64 * 1024


def _socket_buffer_max(name: str, fallback: int) -> int:
    """The largest buffer the kernel gives a TCP socket (``tcp_rmem``, ``tcp_wmem``)."""
    try:
        return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return fallback


# What may be on its way between the server's writes and the client's reads: the client's
# receive buffer, the server's send buffer, the server's transport buffer and a read chunk.
IN_FLIGHT = (_socket_buffer_max("tcp_rmem", 8 << 20) + _socket_buffer_max("tcp_wmem", 8 << 20)
             + 4 * CHUNK)
# Where an endless answer stops all the same: far past any bound and IN_FLIGHT.
CAP = 3 * IN_FLIGHT + (64 << 20)


@dataclass(frozen=True)
class Answer:
    """What a route answers: ``status``, ``head`` (all of it, unless ``endless``), then
    ``filler`` repeated for ever."""

    status: int
    head: bytes
    content_type: str = "application/json"
    endless: bool = False
    filler: bytes = b"x"


class EndlessServer:
    """``routes`` (path -> Answer) on 127.0.0.1, an async context; 404 elsewhere."""

    def __init__(self, routes: dict[str, Answer]) -> None:
        self.routes = dict(routes)
        self.sent = 0  # body bytes of endless answers handed to the socket
        self.asked: list[str] = []  # the paths asked, in order
        self._endless = 0  # endless answers still being sent
        self._idle = asyncio.Event()
        self._idle.set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> EndlessServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 10)

    async def finished(self, timeout_s: float = 120.0) -> int:
        """Wait until no endless answer is being sent (each ends when its client closes the
        connection); the bytes sent. ``timeout_s`` only guards against a hang."""
        async with asyncio.timeout(timeout_s):
            await self._idle.wait()
        return self.sent

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._answer(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request answered; whether the connection may take another."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1].split("?")[0]
        length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith("content-length:")), 0)
        await reader.readexactly(length)
        self.asked.append(path)
        answer = self.routes.get(path, Answer(404, b'{"detail": "Not Found"}'))
        status = f"HTTP/1.1 {answer.status} X\r\nContent-Type: {answer.content_type}\r\n"
        if not answer.endless:
            writer.write(f"{status}Content-Length: {len(answer.head)}\r\n\r\n".encode()
                         + answer.head)
            await writer.drain()
            return True
        self._endless += 1
        self._idle.clear()
        try:
            writer.write(f"{status}Transfer-Encoding: chunked\r\n\r\n".encode())
            await self._send(writer, answer.head)
            filler = (answer.filler * (CHUNK // len(answer.filler) + 1))[:CHUNK]
            while self.sent < CAP and not writer.is_closing():
                await self._send(writer, filler)
            writer.write(b"0\r\n\r\n")  # the cap: the body ends, read whole if it was
            await writer.drain()
        finally:
            self._endless -= 1
            if not self._endless:
                self._idle.set()
        return False

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.sent += len(data)
        await writer.drain()
