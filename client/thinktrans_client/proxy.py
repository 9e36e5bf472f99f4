"""``thinktrans-acp``: any ACP agent's thinking translated in the editor, the agent unchanged.

    thinktrans-acp [--url URL] [--target LOCALE] [--model M] [--policy P] -- AGENT [ARGS...]

The editor launches this command instead of the agent. It starts the agent as a child
process and relays JSON-RPC over stdio both ways, line by line and in order:

- client to agent: every line goes on at once, byte for byte. The proxy reads the
  messages it needs on the way (``ThoughtTranslator.observe``): the client's locale in
  ``initialize``, a session's own locale in ``session/new``/``session/load``
  (``_meta.locale``), the user's prompt text, which session a request is of, and
  ``session/cancel``;
- agent to client: every line goes on byte for byte, in its place, except
  ``session/update`` notifications carrying ``agent_thought_chunk``, which come out
  translated (``ThoughtTranslator``: one sidecar stream per thinking part, the original in
  ``_meta.thinktrans.original``), and the ``initialize`` answer, which gains the sidecar's
  locales in ``_meta.thinktrans.locales``.

It is never in the way: with the sidecar down, slow or failing, thoughts pass through
unchanged and in order (the client's fallback, bounded by ``--timeout``); a line that is
not a JSON object passes through as it came; the agent's stderr is the proxy's stderr;
SIGINT, SIGTERM and SIGHUP are passed to the agent; the agent's exit code is the proxy's
(128 + N when a signal N ended it; 127 when the command is not found, 126 when it cannot
be run). The proxy's own log goes to stderr and never holds thinking text.

Limits: a line is parsed only up to ``MAX_PARSED_LINE_BYTES`` (a longer one passes through
untouched, and the proxy learns nothing from it); a line longer than
``READ_BUFFER_BYTES`` passes through in pieces, so memory stays bounded.

The relay needs the ACP SDK (``pip install 'thinktrans-client[acp]'``): its stdio streams
and its child-process transport. Its connection classes do not fit a relay, which must
forward every method, id and field it does not know without answering or re-encoding it.
``translate_stdio`` is the agent-to-client half alone, for a recording of both directions
on stdin (``examples/acp_bridge.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import stat
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thinktrans_client.acp import ThoughtTranslator
from thinktrans_client.client import ThinktransClient
from thinktrans_client.locale import InvalidLocale, canonicalize

__all__ = ["MAX_PARSED_LINE_BYTES", "READ_BUFFER_BYTES", "ProxyError", "RawLine", "encode",
           "main", "parse_line", "run", "translate_stdio"]

log = logging.getLogger("thinktrans.acp.proxy")

MAX_PARSED_LINE_BYTES = 1 << 20  # thought chunks and session requests are far smaller
READ_BUFFER_BYTES = 8 << 20  # per direction; a longer line passes through in pieces
CHILD_EXIT_GRACE_S = 5.0  # after its stdin closes, before the agent is sent SIGTERM
DEFAULT_URL = "http://127.0.0.1:8088"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INSTALL_HINT = "pip install 'thinktrans-client[acp]'"


class ProxyError(Exception):
    """The relay cannot start: the message says what to change."""


@dataclass(frozen=True, slots=True)
class RawLine:
    """Bytes passed on as they came, in their place: a line that is not a JSON object, or a
    piece of one too long to read whole."""

    raw: bytes


class _Received(dict[str, Any]):
    """A JSON object read from a line, with the line's bytes: what goes out if untouched."""

    __slots__ = ("raw",)

    def __init__(self, value: dict[str, Any], raw: bytes) -> None:
        super().__init__(value)
        self.raw = raw


def parse_line(piece: bytes, *, whole: bool = True) -> Any:
    """A line's JSON object (which ``encode`` gives back byte for byte), else ``RawLine``."""
    if not whole or len(piece) > MAX_PARSED_LINE_BYTES:
        return RawLine(piece)
    try:
        value = json.loads(piece)
    except ValueError:  # not JSON, or not UTF-8
        return RawLine(piece)
    return _Received(value, piece) if isinstance(value, dict) else RawLine(piece)


def encode(message: Any) -> bytes:
    """A message as it goes out: the bytes it came as, or a new line of JSON."""
    if isinstance(message, _Received | RawLine):
        return message.raw
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        return text.encode() + b"\n"
    except UnicodeEncodeError:  # a lone surrogate from a "\\ud800" escape: keep it escaped
        return json.dumps(message, separators=(",", ":")).encode() + b"\n"


async def _pieces(reader: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bool]]:
    """``reader``'s bytes line by line, each with its newline, and whether it is a whole
    line; a line past the reader's limit comes in pieces (not whole), so nothing is lost."""
    at_start = True
    while True:
        try:
            piece = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:  # the end, with or without a last line
            if exc.partial:
                yield exc.partial, at_start
            return
        except asyncio.LimitOverrunError as exc:
            piece = await reader.readexactly(exc.consumed)
            yield piece, False
            at_start = False
            continue
        yield piece, at_start
        at_start = True


async def _relay(lines: AsyncIterator[tuple[bytes, bool]], translator: ThoughtTranslator) -> None:
    """Feed the translator every line, in order (what it sends goes through ``encode``)."""
    async for piece, whole in lines:
        await translator.feed(parse_line(piece, whole=whole))


async def _client_to_agent(reader: asyncio.StreamReader, agent_stdin: asyncio.StreamWriter,
                           translator: ThoughtTranslator,
                           process: asyncio.subprocess.Process) -> None:
    """Every line the editor sends, on to the agent at once; the translator looks first.
    At the end of the editor's input, the agent's stdin is closed, and an agent that does
    not exit within ``CHILD_EXIT_GRACE_S`` is sent SIGTERM, then after as long SIGKILL."""
    try:
        async for piece, whole in _pieces(reader):
            message = parse_line(piece, whole=whole)
            if not isinstance(message, RawLine):
                try:
                    await translator.observe(message)
                except Exception:  # a bug here must not cost the agent its input
                    log.exception("a message from the client was passed on unread")
            agent_stdin.write(piece)
            await agent_stdin.drain()
        agent_stdin.write_eof()
    except (ConnectionError, OSError):
        log.info("the agent's stdin is closed; the editor's input is no longer passed on")
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), CHILD_EXIT_GRACE_S)
            return
        except TimeoutError:
            log.warning("the agent is still running %gs after its input ended; sending %s",
                        CHILD_EXIT_GRACE_S, sig.name)
            _forward(process, sig)


async def _stdio() -> tuple[asyncio.StreamReader, Callable[[bytes], Awaitable[None]]]:
    """This process's stdin as a stream, and a writer to its stdout.

    Pipes and terminals (an editor gives pipes) through the SDK's stdio streams; a regular
    file (``< requests.jsonl > out.jsonl`` in a shell) read and written from threads.
    """
    try:
        from acp.stdio import stdio_streams
    except ImportError as exc:
        raise ProxyError(f"the ACP SDK is not installed: {INSTALL_HINT}") from exc
    if not any(stat.S_ISREG(os.fstat(f.fileno()).st_mode) for f in (sys.stdin, sys.stdout)):
        reader, writer = await stdio_streams(limit=READ_BUFFER_BYTES)

        async def to_pipe(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        return reader, to_pipe
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_BUFFER_BYTES)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.buffer

    def feed() -> None:
        try:
            while chunk := os.read(stdin, 1 << 16):
                loop.call_soon_threadsafe(reader.feed_data, chunk)
        finally:
            loop.call_soon_threadsafe(reader.feed_eof)

    threading.Thread(target=feed, name="thinktrans-acp:stdin", daemon=True).start()

    def blocking_write(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    async def to_file(data: bytes) -> None:
        await asyncio.to_thread(blocking_write, data)

    return reader, to_file


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


async def run(command: Sequence[str], *, url: str = DEFAULT_URL, token: str | None = None,
              target: str | None = None, timeout_s: float = 2.0,
              stream_options: Mapping[str, Any] | None = None) -> int:
    """Relay this process's stdio to ``command``'s, thoughts translated; its exit code.

    ProxyError when it cannot start: the ACP SDK is not installed.
    """
    try:
        from acp.transports import spawn_stdio_transport
    except ImportError as exc:
        raise ProxyError(f"the ACP SDK is not installed: {INSTALL_HINT}") from exc
    reader, write = await _stdio()

    async def send(message: Any) -> None:
        await write(encode(message))

    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            ThinktransClient(url, token=token, timeout_s=timeout_s))
        try:
            agent_stdout, agent_stdin, process = await stack.enter_async_context(
                spawn_stdio_transport(command[0], *command[1:], env=dict(os.environ),
                                      stderr=None, limit=READ_BUFFER_BYTES,
                                      shutdown_timeout=CHILD_EXIT_GRACE_S))
        except OSError as exc:
            log.error("cannot start the agent %r: %s", command[0], exc.strerror or exc)
            return 127 if isinstance(exc, FileNotFoundError) else 126
        for sig in FORWARDED_SIGNALS:
            loop.add_signal_handler(sig, _forward, process, sig)
        stack.callback(_restore_signals, loop)
        translator = ThoughtTranslator(client, send, target=target,
                                       stream_options=stream_options)
        inbound = asyncio.create_task(
            _client_to_agent(reader, agent_stdin, translator, process),
            name="thinktrans-acp:to-agent")
        stack.push_async_callback(_cancel, inbound)
        outbound = asyncio.create_task(_relay(_pieces(agent_stdout), translator),
                                       name="thinktrans-acp:to-client")
        # Until the agent's stdout ends: it exited, or closed it (or, left alone here, its
        # own children that inherited the pipe exited too).
        await asyncio.wait({outbound})
        if outbound.exception() is not None:
            log.error("output to the editor failed: %s; stopping the agent",
                      outbound.exception())
            _forward(process, signal.SIGTERM)
        try:
            await translator.aclose()  # what was read goes out, bounded by the timeout
        except (ConnectionError, OSError, RuntimeError) as exc:
            log.error("output to the editor failed: %s", exc)
        await process.wait()
    return _exit_code(process.returncode)


async def translate_stdio(*, url: str = DEFAULT_URL, token: str | None = None,
                          target: str | None = None, timeout_s: float = 2.0,
                          stream_options: Mapping[str, Any] | None = None) -> None:
    """Copy stdin to stdout, thoughts translated: a recording of both directions, no agent.

    The client's messages in it (``initialize``, ``session/new``...) are read as the proxy
    reads them, and passed on too. Needs the ACP SDK for stdin and stdout as pipes.
    """
    reader, write = await _stdio()

    async def send(message: Any) -> None:
        await write(encode(message))

    async with ThinktransClient(url, token=token, timeout_s=timeout_s) as client:
        async with ThoughtTranslator(client, send, target=target,
                                     stream_options=stream_options) as translator:
            await _relay(_pieces(reader), translator)


def _forward(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)


def _restore_signals(loop: asyncio.AbstractEventLoop) -> None:
    for sig in FORWARDED_SIGNALS:
        loop.remove_signal_handler(sig)


async def _cancel(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thinktrans-acp", usage="%(prog)s [options] -- AGENT_COMMAND [ARGS...]",
        description="Launch an ACP agent and translate its thinking (agent_thought_chunk) "
                    "through a thinktrans sidecar; everything else passes through.")
    parser.add_argument("--url", default=os.environ.get("THINKTRANS_URL", DEFAULT_URL),
                        help="the sidecar's base URL (default: $THINKTRANS_URL, else "
                             f"{DEFAULT_URL})")
    parser.add_argument("--token", default=None,
                        help="the sidecar's API token (default: $THINKTRANS_API_TOKEN; the "
                             "variable keeps it out of the process list)")
    parser.add_argument("--target", help="BCP 47 locale for every session (default: the "
                        "session's _meta.locale, else the client's, else the sidecar's)")
    parser.add_argument("--model", help="the sidecar model for every stream")
    parser.add_argument("--policy", choices=("translate", "hide"),
                        help="translate foreign thoughts, or hide them (originals kept in "
                             "_meta.thinktrans.original)")
    parser.add_argument("--timeout", type=float, default=2.0, metavar="S",
                        help="seconds a sidecar request may take before thoughts pass "
                             "through untranslated (default: 2)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``thinktrans-acp`` command: 2 for bad usage, else the agent's exit code."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    split = args_in.index("--") if "--" in args_in else len(args_in)
    args, command = parser.parse_args(args_in[:split]), args_in[split + 1:]
    if not command:
        parser.print_usage(sys.stderr)
        print("thinktrans-acp: give the agent's command after --", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr, format="thinktrans-acp: %(name)s: %(message)s")
    target = None
    if args.target is not None:
        try:
            target = canonicalize(args.target)
        except InvalidLocale as exc:
            print(f"thinktrans-acp: --target: {exc}", file=sys.stderr)
            return 2
    options = {key: value for key in ("model", "policy")
               if (value := getattr(args, key)) is not None}
    token = args.token or os.environ.get("THINKTRANS_API_TOKEN") or None
    try:
        return asyncio.run(run(command, url=args.url, token=token, target=target,
                               timeout_s=args.timeout, stream_options=options))
    except ProxyError as exc:
        print(f"thinktrans-acp: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the agent was started
        return 130


if __name__ == "__main__":
    sys.exit(main())
