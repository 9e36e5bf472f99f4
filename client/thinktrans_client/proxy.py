"""``thinktrans-acp``: any ACP agent's thinking translated in the editor, the agent unchanged.

    thinktrans-acp [--url URL] [--target LOCALE] [--model M] [--policy P]
                   [--glossary FILE.json] [--deadline-ms MS] -- AGENT [ARGS...]

The editor launches this command instead of the agent; it starts the agent as its child and
relays JSON-RPC over stdio both ways, byte for byte and in order, but the thoughts, which
``ThoughtTranslator`` translates. It is never in the way: with the sidecar down, slow or
failing, thoughts pass through unchanged. docs/integration.md tells what it does.
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
from importlib import metadata
from typing import Any

from thinktrans_client.acp import ThoughtTranslator
from thinktrans_client.client import ThinktransClient
from thinktrans_client.locale import InvalidLocale, canonicalize

__all__ = ["MAX_PARSED_LINE_BYTES", "READ_BUFFER_BYTES", "ProxyError", "RawLine", "encode",
           "main", "parse_line", "run", "translate_stdio"]

log = logging.getLogger("thinktrans.acp.proxy")

# A longer line passes through untouched, in pieces; memory stays bounded by this times
# MAX_PENDING_MESSAGES (thinktrans_client.acp), past which the agent's output waits.
MAX_PARSED_LINE_BYTES = 1 << 20  # thought chunks and session requests are far smaller
READ_BUFFER_BYTES = MAX_PARSED_LINE_BYTES  # per direction; a longer line comes in pieces
CHILD_EXIT_GRACE_S = 5.0  # after its stdin closes, before the agent is sent SIGTERM
EXIT_POLL_S = 0.05  # the agent's exit is seen from its return code, not its pipes
# After the agent's exit, how long its output may take to end before the log says it has
# not (processes it started hold its stdout: the proxy goes on until they close it).
OUTPUT_AFTER_EXIT_S = 1.0
DEFAULT_URL = "http://127.0.0.1:8088"
# After a thinking part ends (the session's next message is waiting), how long that message
# waits for the part's last translations: ACP cannot replace a chunk later, so a translation
# that misses this goes out as the original (status deadline) and the message goes on.
# 1500 ms: see docs/integration.md (bench/acp_proxy.py --turns).
DEFAULT_DEADLINE_MS = 1500.0
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
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the stack
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
            try:
                message = parse_line(piece, whole=whole)
                if not isinstance(message, RawLine):
                    await translator.observe(message)
            except Exception:  # a bug here must not cost the agent its input
                log.exception("a message from the client was passed on unread")
            agent_stdin.write(piece)
            await agent_stdin.drain()
        agent_stdin.write_eof()
    except (ConnectionError, OSError):
        log.info("the agent's stdin is closed; the editor's input is no longer passed on")
        return
    # The end of its input is the agent's cue to exit: it gets a grace before SIGTERM.
    if not await _exited_within(process, CHILD_EXIT_GRACE_S):
        log.warning("the agent is still running %gs after its input ended",
                    CHILD_EXIT_GRACE_S)
        await _terminate(process)


async def _terminate(process: asyncio.subprocess.Process) -> None:
    """SIGTERM, then SIGKILL if the agent has not exited ``CHILD_EXIT_GRACE_S`` later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.returncode is not None:
            return
        log.warning("sending the agent %s", sig.name)
        _forward(process, sig)
        await _exited_within(process, CHILD_EXIT_GRACE_S)


async def _exited_within(process: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the agent exits within ``seconds``. Its return code is set at its exit;
    ``process.wait()`` also waits for its pipes, which its own children may hold open."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds
    while process.returncode is None and loop.time() < give_up:
        await asyncio.sleep(EXIT_POLL_S)
    return process.returncode is not None


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


class _EditorOutput(asyncio.Protocol):
    """The write side of the proxy's stdout pipe: flow control, and an error once the editor
    has closed it (a plain StreamWriter's drain would wait forever then)."""

    def __init__(self) -> None:
        self.transport: asyncio.WriteTransport | None = None
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport
        # ``write`` returns once the editor has the bytes: nothing is left in a buffer that
        # the loop's end would drop.
        transport.set_write_buffer_limits(high=0)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    async def write(self, data: bytes) -> None:
        if self._lost or self.transport is None or self.transport.is_closing():
            raise BrokenPipeError("the editor closed the proxy's stdout")
        self.transport.write(data)
        while self._paused and not self._lost:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self._lost:
            raise BrokenPipeError("the editor closed the proxy's stdout")


async def _stdio() -> tuple[asyncio.StreamReader, Callable[[bytes], Awaitable[None]]]:
    """This process's stdin as a stream, and a writer to its stdout.

    Pipes and sockets (an editor gives pipes) on the event loop; anything else (a file, a
    terminal, ``/dev/null``) from threads, as is a pipe that is also the proxy's stderr: the
    loop makes what it uses non-blocking, and the agent, which inherits stderr, must not
    find it so.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_BUFFER_BYTES)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    if _loop_can_use(stdin):
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    else:
        def feed() -> None:
            try:
                while chunk := os.read(stdin, 1 << 16):
                    loop.call_soon_threadsafe(reader.feed_data, chunk)
            finally:
                loop.call_soon_threadsafe(reader.feed_eof)

        threading.Thread(target=feed, name="thinktrans-acp:stdin", daemon=True).start()
    if _loop_can_use(stdout):
        _, output = await loop.connect_write_pipe(_EditorOutput, sys.stdout)
        return reader, output.write

    def blocking_write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    async def to_file(data: bytes) -> None:
        await asyncio.to_thread(blocking_write, data)

    return reader, to_file


def _loop_can_use(fd: int) -> bool:
    """A pipe or socket that is not also stderr (see ``_stdio``)."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    try:
        return not os.path.samestat(os.fstat(fd), os.fstat(sys.stderr.fileno()))
    except (OSError, ValueError, AttributeError):  # no stderr: nothing to share it with
        return True


def _sender(write: Callable[[bytes], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    async def send(message: Any) -> None:
        try:
            data = encode(message)
        except (ValueError, RecursionError):  # not one the agent could have sent either
            log.error("a message could not be encoded and was left out")
            return
        await write(data)

    return send


class _Signals:
    """SIGINT, SIGTERM and SIGHUP: passed to the agent while it runs; before it starts, or
    once it has exited, they end the proxy (its task is cancelled)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.process: asyncio.subprocess.Process | None = None
        self.ended_by: signal.Signals | None = None
        for sig in FORWARDED_SIGNALS:
            self.loop.add_signal_handler(sig, self._handle, sig)

    def _handle(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            _forward(self.process, sig)
        elif self.ended_by is None and self.task is not None:
            self.ended_by = sig
            self.task.cancel()

    def restore(self) -> None:
        for sig in FORWARDED_SIGNALS:
            self.loop.remove_signal_handler(sig)


async def run(command: Sequence[str], *, url: str = DEFAULT_URL, token: str | None = None,
              target: str | None = None, timeout_s: float = 2.0, stall_s: float = 10.0,
              stream_options: Mapping[str, Any] | None = None) -> int:
    """Relay this process's stdio to ``command``'s, thoughts translated; its exit code.

    ProxyError when it cannot start: the ACP SDK is not installed. Only its child process
    transport is used: its connection classes do not fit a relay, which must forward every
    method, id and field it does not know without answering or re-encoding it, nor does its
    stdout writer, which does not notice an editor that closed the pipe (``_EditorOutput``).
    """
    try:
        from acp.transports import spawn_stdio_transport
    except ImportError as exc:
        raise ProxyError(f"the ACP SDK is not installed: {INSTALL_HINT}") from exc
    signals = _Signals()
    try:
        reader, write = await _stdio()
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                ThinktransClient(url, token=token, timeout_s=timeout_s, stall_s=stall_s))
            try:
                agent_stdout, agent_stdin, process = await stack.enter_async_context(
                    spawn_stdio_transport(command[0], *command[1:], env=dict(os.environ),
                                          stderr=None, limit=READ_BUFFER_BYTES,
                                          shutdown_timeout=CHILD_EXIT_GRACE_S))
            except OSError as exc:
                log.error("cannot start the agent %r: %s", command[0], exc.strerror or exc)
                return 127 if isinstance(exc, FileNotFoundError) else 126
            signals.process = process
            translator = ThoughtTranslator(client, _sender(write), target=target,
                                           stream_options=stream_options)
            inbound = asyncio.create_task(
                _client_to_agent(reader, agent_stdin, translator, process),
                name="thinktrans-acp:to-agent")
            stack.push_async_callback(_cancel, inbound)
            watch = asyncio.create_task(_watch_exit(process, agent_stdout),
                                        name="thinktrans-acp:watch")
            stack.push_async_callback(_cancel, watch)
            await _agent_to_client(agent_stdout, translator, process)
            await process.wait()
        return _exit_code(process.returncode)
    except asyncio.CancelledError:
        if signals.ended_by is None:
            raise
        agent = signals.process
        return _exit_code(agent.returncode if agent is not None else -signals.ended_by)
    finally:
        signals.restore()


async def _watch_exit(process: asyncio.subprocess.Process,
                      agent_stdout: asyncio.StreamReader) -> None:
    """Log the agent's exit when its output goes on past it (``OUTPUT_AFTER_EXIT_S``): the
    proxy relays it until it ends, or until a signal ends the proxy."""
    await _exited_within(process, float("inf"))
    loop = asyncio.get_running_loop()
    give_up = loop.time() + OUTPUT_AFTER_EXIT_S
    while not agent_stdout.at_eof() and loop.time() < give_up:
        await asyncio.sleep(EXIT_POLL_S)
    if not agent_stdout.at_eof():
        log.warning("the agent exited (code %d), but its output has not ended (processes it "
                    "started may hold its stdout); the proxy relays it until it ends, or a "
                    "signal ends the proxy", _exit_code(process.returncode))


async def _agent_to_client(agent_stdout: asyncio.StreamReader, translator: ThoughtTranslator,
                           process: asyncio.subprocess.Process) -> None:
    """Until the agent's stdout ends (it exited or closed it; its own children that
    inherited the pipe keep it open): its lines through the translator to the editor."""
    try:
        await _relay(_pieces(agent_stdout), translator)
    except (ConnectionError, OSError, RuntimeError) as exc:
        # RuntimeError: the translator's output stopped, for the same reason.
        log.error("output to the editor failed (%s); stopping the agent", type(exc).__name__)
        await _stop(process, agent_stdout)
    try:
        await translator.aclose()  # what was read goes out, bounded by the client's budgets
    except (ConnectionError, OSError, RuntimeError) as exc:
        log.error("output to the editor failed (%s)", type(exc).__name__)


async def _stop(process: asyncio.subprocess.Process, agent_stdout: asyncio.StreamReader) -> None:
    """SIGTERM, then SIGKILL after ``CHILD_EXIT_GRACE_S``; meanwhile the agent's output is
    read and dropped, so that its pipe ends (and nothing waits on a full one)."""
    async def discard() -> None:
        async for _ in _pieces(agent_stdout):
            pass

    draining = asyncio.create_task(discard(), name="thinktrans-acp:discard")
    await _terminate(process)
    await draining


async def translate_stdio(*, url: str = DEFAULT_URL, token: str | None = None,
                          target: str | None = None, timeout_s: float = 2.0,
                          stream_options: Mapping[str, Any] | None = None) -> None:
    """Copy stdin to stdout, thoughts translated: a recording of both directions, no agent.

    The client's messages in it (``initialize``, ``session/new``...) are read as the proxy
    reads them, and passed on too.
    """
    reader, write = await _stdio()
    async with ThinktransClient(url, token=token, timeout_s=timeout_s) as client:
        translator = ThoughtTranslator(client, _sender(write), target=target,
                                       stream_options=stream_options)
        try:
            await _relay(_pieces(reader), translator)
            await translator.aclose()
        except (ConnectionError, OSError, RuntimeError) as exc:  # the reader went away
            log.error("output failed (%s)", type(exc).__name__)


def _forward(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)


async def _cancel(task: asyncio.Task[None]) -> None:
    if not task.done():
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _glossary_file(path: str) -> dict[str, Any]:
    """``--glossary FILE``: a JSON glossary, read and given its shape's check here; the
    sidecar checks its terms when a stream opens."""
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path!r} is not JSON: {exc}") from None
    if (not isinstance(data, dict) or set(data) - {"terms", "keep"}
            or not isinstance(data.get("terms", {}), dict)
            or not isinstance(data.get("keep", []), list)):
        raise argparse.ArgumentTypeError(
            f'{path!r} must hold {{"terms": {{"source": "target"}}, "keep": ["term"]}}')
    return data


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
    parser.add_argument("--glossary", type=_glossary_file, metavar="FILE",
                        help='a JSON file of one glossary for every stream: {"terms": '
                             '{"source": "target"}, "keep": ["term"]}')
    parser.add_argument("--timeout", type=_seconds, default=2.0, metavar="S",
                        help="seconds a sidecar request may take before thoughts pass "
                             "through untranslated (default: 2)")
    parser.add_argument("--stall", type=_seconds, default=10.0, metavar="S",
                        help="seconds a thinking part may go without a result before it "
                             "passes through untranslated; a session's later messages wait "
                             "no longer (default: 10; above the sidecar's deadline_ms)")
    parser.add_argument("--deadline-ms", type=_milliseconds, metavar="MS",
                        default=os.environ.get("THINKTRANS_ACP_DEADLINE_MS",
                                               str(DEFAULT_DEADLINE_MS)),
                        help="once a thinking part ends, how long the session's next message "
                             "(a tool call, the answer) waits for the part's last "
                             "translations; those still missing go out as the originals "
                             "(status deadline), as ACP cannot replace them later (default: "
                             f"$THINKTRANS_ACP_DEADLINE_MS, else {DEFAULT_DEADLINE_MS:g}; "
                             "0: no wait)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the version of thinktrans-client and exit")
    return parser


def _version() -> str:
    """The installed thinktrans-client's version (none when run from a checkout only)."""
    try:
        return metadata.version("thinktrans-client")
    except metadata.PackageNotFoundError:
        return "(thinktrans-client is not installed: run from a checkout)"


def _milliseconds(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        ms = float("nan")
    if not 0 <= ms < float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a number of milliseconds >= 0, not {value!r} (the default comes from "
            "$THINKTRANS_ACP_DEADLINE_MS where set)")
    return ms


def _seconds(value: str) -> float:
    seconds = float(value)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {value}")
    return seconds


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
    options: dict[str, Any] = {key: value for key in ("model", "policy", "glossary")
                               if (value := getattr(args, key)) is not None}
    options["close_wait_s"] = args.deadline_ms / 1000
    token = args.token or os.environ.get("THINKTRANS_API_TOKEN") or None
    try:
        return asyncio.run(run(command, url=args.url, token=token, target=target,
                               timeout_s=args.timeout, stall_s=args.stall,
                               stream_options=options))
    except ProxyError as exc:
        print(f"thinktrans-acp: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the agent was started
        return 130


if __name__ == "__main__":
    sys.exit(main())
