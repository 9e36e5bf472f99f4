"""``thinktrans-acp`` between the ACP SDK's client side and a fake agent on its agent side.

The agent (``tests/acp_agent.py``) runs as the proxy's child; the proxy is the installed
console script; the sidecar is a real server. Every message the editor receives is checked
against ACP's published JSON schema (``tests/data/acp-schema-v1.json``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

pytest.importorskip("acp", reason="needs the client's acp extra: pip install './client[acp]'")

from acp import PROTOCOL_VERSION, RequestPermissionResponse, spawn_agent_process, text_block
from acp.connection import StreamDirection, StreamEvent
from acp.schema import AllowedOutcome

from tests.acp_agent import TURN, signal_exit
from tests.conftest import Server
from tests.fakes_remote import FakeChat
from tests.test_acp import is_thought, others, thinktrans_meta, thought_parts, update_of
from tests.test_client import llm_server

ROOT = Path(__file__).resolve().parent.parent
PROXY = str(Path(sys.executable).with_name("thinktrans-acp"))
AGENT = (sys.executable, str(ROOT / "tests" / "acp_agent.py"))
SCHEMA = json.loads((ROOT / "tests" / "data" / "acp-schema-v1.json").read_text())


def validator(definition: str | None = None) -> jsonschema.Draft202012Validator:
    """The published schema's root (any ACP message), or one of its definitions."""
    schema = SCHEMA if definition is None else {
        "$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"],
        "$ref": f"#/$defs/{definition}"}
    return jsonschema.Draft202012Validator(schema)


ANY_MESSAGE = validator()
SESSION_NOTIFICATION = validator("SessionNotification")
INITIALIZE_RESPONSE = validator("InitializeResponse")


@pytest.fixture(scope="module")
def chat(chat_server: FakeChat) -> FakeChat:
    return chat_server


@pytest.fixture(scope="module")
def llm_sidecar(chat: FakeChat) -> Iterator[Server]:
    """The llm backend on FakeChat ("<language name>: <text>"), offering two locales; a
    thinking part ends by a message or a close, not by the 30 s idle flush."""
    with llm_server(chat, THINKTRANS_ALLOWED_LOCALES="zh-CN,de",
                    THINKTRANS_FLUSH_IDLE_MS="30000") as server:
        yield server


class Editor:
    """The SDK's client side: every session update; a permission request runs ``hook``."""

    def __init__(self, hook: Callable[[], None] | None = None) -> None:
        self.hook = hook
        self.updates: list[tuple[str, Any]] = []
        self.wire: list[dict[str, Any]] = []  # what the proxy sent, as read off the pipe

    def observe(self, event: StreamEvent) -> None:
        if event.direction is StreamDirection.INCOMING:
            self.wire.append(event.message)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        if self.hook is not None:
            self.hook()
        return RequestPermissionResponse(
            outcome=AllowedOutcome(option_id="allow", outcome="selected"))


class Run:
    """One proxy process: the editor's view, the agent's own record, stderr, exit code."""

    def __init__(self, tmp: Path) -> None:
        self.agent_log = tmp / "agent.jsonl"
        self.stderr_path = tmp / "stderr.txt"
        self.returncode: int | None = None

    def agent_sent(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.agent_log.read_text().splitlines()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def without_locales(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with ``_meta.thinktrans`` taken out of an initialize answer."""
    out = []
    for message in messages:
        meta = (message.get("result") or {}).get("_meta") if "result" in message else None
        if isinstance(meta, dict) and "thinktrans" in meta:
            rest = {k: v for k, v in meta.items() if k != "thinktrans"}
            result = {k: v for k, v in message["result"].items() if k != "_meta"}
            message = {**message, "result": {**result, **({"_meta": rest} if rest else {})}}
        out.append(message)
    return out


async def drive(tmp: Path, url: str, *proxy_args: str, client_locale: str | None = "zh-CN",
                session_locale: str | None = "de", prompt: str = "turn",
                hook: Callable[[], None] | None = None, exit_code: int = 3,
                during: Callable[[Any, str, Editor], Any] | None = None,
                agent_env: dict[str, str] | None = None) -> tuple[Run, Editor, Any]:
    """initialize, session/new and one prompt through the proxy; the proxy then exits."""
    run, editor = Run(tmp), Editor(hook)
    env = {**os.environ, "ACP_AGENT_LOG": str(run.agent_log), "ACP_AGENT_EXIT": str(exit_code),
           **(agent_env or {})}
    with run.stderr_path.open("wb") as stderr:
        async with spawn_agent_process(
                editor, PROXY, "--url", url, "--timeout", "0.5", *proxy_args, "--", *AGENT,
                env=env, cwd=ROOT, observers=[editor.observe],
                transport_kwargs={"stderr": stderr, "shutdown_timeout": 20}) as (conn, proc):
            init = await conn.initialize(protocol_version=PROTOCOL_VERSION, **(
                {"locale": client_locale} if client_locale else {}))
            session = await conn.new_session(cwd=str(tmp), mcp_servers=[], **(
                {"locale": session_locale} if session_locale else {}))
            turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id,
                                                     prompt=[text_block(prompt)]))
            if during is not None:
                await during(conn, session.session_id, editor)
            answer = await asyncio.wait_for(turn, 30)
            assert init.protocol_version == PROTOCOL_VERSION
        run.returncode = proc.returncode
    return run, editor, answer


def assert_relayed(run: Run, editor: Editor) -> None:
    """Everything the agent sent reached the editor, in order, thoughts whole and valid."""
    sent, got = run.agent_sent(), editor.wire
    assert others(without_locales(got)) == others(sent)
    assert thought_parts(got, output=True) == thought_parts(sent, output=False)
    for message in got:
        ANY_MESSAGE.validate(message)
        if message.get("method") == "session/update":
            SESSION_NOTIFICATION.validate(message["params"])
    # Each output chunk keeps its part's messageId.
    ids = [(update["_meta"]["thinktrans"]["original"], update.get("messageId"))
           for m in got if is_thought(m) and (update := update_of(m)) is not None]
    assert [i for _, i in ids] == sorted((i for _, i in ids), key=str)
    assert set(i for _, i in ids) == {payload[0] for kind, payload in TURN if kind == "thought"}


def test_the_schema_has_teeth() -> None:
    bad = {"sessionId": "s", "update": {"sessionUpdate": "agent_thought_chunk",
                                        "content": {"type": "text"}}}
    with pytest.raises(jsonschema.ValidationError):
        SESSION_NOTIFICATION.validate(bad)


async def test_a_turn_through_the_proxy(tmp_path: Path, llm_sidecar: Server,
                                        chat: FakeChat) -> None:
    chat.reset()
    run, editor, answer = await drive(tmp_path, llm_sidecar.url)
    assert answer.stop_reason == "end_turn"
    assert run.returncode == 3  # the agent's exit code
    assert_relayed(run, editor)
    got = editor.wire
    # The initialize answer offers the sidecar's locales, and stays a valid answer.
    [init] = [m for m in got if "protocolVersion" in m.get("result", {})]
    INITIALIZE_RESPONSE.validate(init["result"])
    assert init["result"]["_meta"]["thinktrans"]["locales"] == ["zh-CN", "de"]
    # The session asked for German: its thoughts are in German, originals kept.
    metas = thinktrans_meta(got)
    assert {m["target"] for m in metas} == {"de"}
    assert {m["status"] for m in metas} == {"translated"}
    texts = [u["content"]["text"] for m in got if is_thought(m) and (u := update_of(m))]
    assert all(text.startswith("German: ") for text in texts)
    assert len(texts) == 6  # deltas came back as sentences
    # The SDK's client side got every update, in the wire's order.
    assert len(editor.updates) == sum(m.get("method") == "session/update" for m in got)
    stderr = run.stderr()
    assert "fake agent: started" in stderr  # the agent's stderr is the proxy's
    assert "timezone" not in stderr and "时区" not in stderr  # no thinking text logged


async def test_the_target_order(tmp_path: Path, llm_sidecar: Server, chat: FakeChat) -> None:
    chat.reset()
    # No session locale: the client's. A malformed one is ignored (one log line, no value).
    (tmp_path / "a").mkdir()
    run, editor, _ = await drive(tmp_path / "a", llm_sidecar.url, session_locale="de_DE\u202e")
    assert {m["target"] for m in thinktrans_meta(editor.wire)} == {"zh-CN"}
    assert "de_DE" not in run.stderr()
    # --target wins over both.
    (tmp_path / "b").mkdir()
    run, editor, _ = await drive(tmp_path / "b", llm_sidecar.url, "--target", "de",
                                 session_locale="zh-CN")
    assert {m["target"] for m in thinktrans_meta(editor.wire)} == {"de"}
    assert_relayed(run, editor)
    # A well-formed locale the sidecar does not offer: passed over, with a line naming it.
    (tmp_path / "c").mkdir()
    run, editor, _ = await drive(tmp_path / "c", llm_sidecar.url, session_locale="fr")
    assert {m["target"] for m in thinktrans_meta(editor.wire)} == {"zh-CN"}
    assert "locale fr is not among the sidecar's targets" in run.stderr()


async def test_the_sidecar_killed_mid_turn(tmp_path: Path, chat: FakeChat) -> None:
    """The editor's permission dialog kills the sidecar: the rest passes through, in order."""
    chat.reset()
    with llm_server(chat) as server:
        run, editor, answer = await drive(tmp_path, server.url, hook=server.proc.kill,
                                          exit_code=5)
    assert answer.stop_reason == "end_turn"
    assert run.returncode == 5
    assert_relayed(run, editor)
    got = editor.wire
    cut = next(i for i, m in enumerate(got) if m.get("method") == "session/request_permission")
    before, after = thinktrans_meta(got[:cut]), thinktrans_meta(got[cut:])
    assert before and {m["status"] for m in before} == {"translated"}
    assert after and {m["status"] for m in after} == {"error"}
    for message in got[cut:]:
        if is_thought(message) and (update := update_of(message)) is not None:
            assert update["content"]["text"] == update["_meta"]["thinktrans"]["original"]


async def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait until ``check`` holds, looking every 20 ms (generously bounded)."""
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def test_cancel_ends_the_thinking_part(tmp_path: Path, llm_sidecar: Server,
                                             chat: FakeChat) -> None:
    """The part goes out at the cancel: the agent answers only once the editor has it."""
    chat.reset()
    thinking = "Let me think about the dates and how they are parsed"
    release = tmp_path / "release"

    def agent_thought() -> bool:  # the agent has sent every delta of its thought
        try:
            return thought_parts(Run(tmp_path).agent_sent(), output=False) == [thinking]
        except (OSError, ValueError):  # not written yet, or a line half written
            return False

    def proxy_streams() -> bool:  # the proxy has fed the thought to a sidecar stream
        metrics = httpx.get(f"{llm_sidecar.url}/metrics").text
        return any(line.startswith("thinktrans_open_streams ") and float(line.split()[1]) > 0
                   for line in metrics.splitlines())

    async def cancel(conn: Any, session_id: str, editor: Editor) -> None:
        await until(agent_thought)
        await until(proxy_streams)
        await conn.cancel(session_id=session_id)
        # With the part held until the answer, this would wait for the 60 s stall.
        await until(lambda: any(is_thought(m) for m in editor.wire))
        release.touch()

    run, editor, answer = await drive(tmp_path, llm_sidecar.url, "--stall", "60",
                                      prompt="wait", during=cancel,
                                      agent_env={"ACP_AGENT_RELEASE": str(release)})
    assert answer.stop_reason == "cancelled"
    assert thought_parts(editor.wire, output=True) == [thinking]
    assert others(without_locales(editor.wire)) == others(run.agent_sent())


# -- the relay itself: bytes, signals, exit codes (no SDK on the other side) ---------------

ECHO = ("import sys\n"
        "print('echo: started', file=sys.stderr, flush=True)\n"
        "for line in sys.stdin.buffer:\n"
        "    sys.stdout.buffer.write(line); sys.stdout.buffer.flush()\n")


async def proxy_process(*command: str, url: str = "http://127.0.0.1:9"
                        ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PROXY, "--url", url, "--timeout", "0.3", "--", *command, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


async def test_every_line_passes_byte_for_byte() -> None:
    """An echoing agent: what the editor sends comes back unchanged, both ways through."""
    from thinktrans_client.proxy import MAX_PARSED_LINE_BYTES, READ_BUFFER_BYTES

    lines = [
        b'{"jsonrpc": "2.0", "id": 7, "method": "x/custom",  "params": {"b": 1, "a": 2}}\n',
        b"this line is not JSON {\n",
        b"\n",
        b'{"jsonrpc":"2.0","method":"session/update","params":{}}\r\n',
        b"[1, 2, 3]\n",
        b"\xff\xfe not utf-8\n",
        b'{"big": "' + b"x" * MAX_PARSED_LINE_BYTES + b'"}\n',
        b'{"bigger": "' + b"y" * (READ_BUFFER_BYTES + 5) + b'"}\n',
        b'{"jsonrpc":"2.0","id":"1","result":{"\\u00e9":"\\ud800"}}\n',
        b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"\n",  # nested past the parser's stack
        b"no newline at the end",
    ]
    data = b"".join(lines)
    proc = await proxy_process(sys.executable, "-c", ECHO)
    out, err = await asyncio.wait_for(proc.communicate(data), 60)
    assert out == data
    assert proc.returncode == 0
    assert b"echo: started" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_signals_reach_the_agent_and_its_code_is_the_proxys(sig: signal.Signals) -> None:
    proc = await proxy_process(*AGENT)
    assert proc.stderr is not None
    assert b"started" in await asyncio.wait_for(proc.stderr.readline(), 30)
    proc.send_signal(sig)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert f"fake agent: {sig.name}".encode() in err
    assert proc.returncode == signal_exit(sig)


# An agent that writes argv[2] lines of argv[1] bytes of padding as fast as its stdout
# takes them, and keeps "<pid> <lines written>" in the file argv[3] before each line.
TICKER = ("import os, sys, time\n"
          "line = b'{\"jsonrpc\":\"2.0\",\"method\":\"x/tick\",\"params\":{\"pad\":\"'"
          " + b'p' * int(sys.argv[1]) + b'\"}}\\n'\n"
          "progress = os.open(sys.argv[3], os.O_WRONLY | os.O_CREAT)\n"
          "for n in range(int(sys.argv[2]) + 1):\n"
          "    os.pwrite(progress, b'%d %12d' % (os.getpid(), n), 0)\n"
          "    if n < int(sys.argv[2]):\n"
          "        sys.stdout.buffer.write(line)\n"
          "        sys.stdout.buffer.flush()\n"
          "time.sleep(60)\n")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the proxy passes it to its agent), then SIGKILL: nothing is left running."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def state(pid: int) -> str:
    """The process's state letter (``S``: asleep, waiting on something)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def held_back(proxy: subprocess.Popen[bytes], progress: Path, lines: int,
              timeout_s: float = 60.0) -> int:
    """Wait until the ticker is held back, and return how many lines it wrote by then.

    Held back: the ticker and the proxy both asleep, its count unchanged, over ten looks in
    a row. Each would be awake were the other moving: the proxy reading a full pipe, or the
    ticker writing into one the proxy emptied; only the proxy's bound holds both still.
    Fails at once if the ticker gets all its lines out first.
    """
    deadline = time.monotonic() + timeout_s
    last, still = -1, 0
    while time.monotonic() < deadline:
        record = progress.read_bytes().split()
        if len(record) == 2:
            pid, written = int(record[0]), int(record[1])
            assert written < lines, (
                "the agent wrote all its output while the editor read none: no backpressure")
            asleep = state(pid) == "S" and state(proxy.pid) == "S"
            still = still + 1 if asleep and written == last else 0
            if still >= 10:
                return written
            last = written
        time.sleep(0.05)
    raise AssertionError(f"the agent was not held back within {timeout_s:g}s")


def test_an_editor_that_does_not_read_holds_the_agent_back(tmp_path: Path) -> None:
    """100 MB of agent output while the editor reads nothing: the agent waits on its pipe
    once a few MB are on their way, the proxy stays small, and every line arrives once the
    editor reads."""
    lines, size = 10_000, 10_000
    progress = tmp_path / "progress"
    progress.touch()
    proc = subprocess.Popen([PROXY, "--url", "http://127.0.0.1:9", "--", sys.executable,
                             "-c", TICKER, str(size), str(lines), str(progress)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        written = held_back(proc, progress, lines)
        # The bound: MAX_PENDING_MESSAGES (256) lines, the agent's pipe and the proxy's
        # 2 MiB read buffer, the editor's pipe: some 5 MB, far below the 100 MB.
        assert written * size < 20_000_000
        assert rss_mib(proc.pid) < 150
        assert proc.stdout is not None
        expected = (b'{"jsonrpc":"2.0","method":"x/tick","params":{"pad":"' + b"p" * size
                    + b'"}}\n')
        for _ in range(lines):
            assert proc.stdout.readline() == expected
    finally:
        stop(proc)


def test_an_editor_that_closes_its_end_stops_the_agent(tmp_path: Path) -> None:
    lines = 100_000_000
    progress = tmp_path / "progress"
    progress.touch()
    proc = subprocess.Popen([PROXY, "--url", "http://127.0.0.1:9", "--", sys.executable,
                             "-c", TICKER, "10", str(lines), str(progress)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdout.readline()
        # The editor does not read: every pipe and buffer on the way fills, and the proxy
        # waits on its write to the editor when the editor closes its end.
        held_back(proc, progress, lines)
        proc.stdout.close()
        assert proc.wait(20) == 128 + signal.SIGTERM
        assert b"output to the editor failed" in proc.stderr.read()
    finally:
        stop(proc)


async def test_an_agent_that_ignores_the_end_of_its_input_is_stopped() -> None:
    ignores_eof = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, lambda *_: sys.exit(9))\n"
                   "time.sleep(60)\n")
    proc = await proxy_process(sys.executable, "-c", ignores_eof)
    _, err = await asyncio.wait_for(proc.communicate(b""), 30)  # stdin closed at once
    assert proc.returncode == 9
    assert b"sending the agent SIGTERM" in err


@pytest.mark.parametrize(("command", "code"), [
    (("sh", "-c", "kill -KILL $$"), 128 + 9),
    (("sh", "-c", "exit 7"), 7),
    (("/nonexistent/agent",), 127),
])
async def test_exit_codes(command: tuple[str, ...], code: int) -> None:
    proc = await proxy_process(*command)
    _, err = await asyncio.wait_for(proc.communicate(b""), 30)
    assert proc.returncode == code, err.decode()


def test_stdin_that_is_not_a_pipe(tmp_path: Path) -> None:
    """/dev/null (a character device the event loop cannot watch) and a regular file."""
    command = [PROXY, "--url", "http://127.0.0.1:9", "--", "sh", "-c", "echo hi; cat"]
    out = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, b"hi\n")
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(b'{"jsonrpc": "2.0", "id": 1, "method": "x/y"}\nnot JSON\n')
    with requests.open("rb") as stdin:
        out = subprocess.run(command, stdin=stdin, capture_output=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, b"hi\n" + requests.read_bytes())


async def test_usage_errors() -> None:
    for args in ((), ("--target", "zh_CN", "--", "true"), ("--timeout", "0", "--", "true")):
        proc = await asyncio.create_subprocess_exec(
            PROXY, *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 2 and out == b""
        assert (b"after --" in err or b"use '-', not '_'" in err
                or b"positive number of seconds" in err)


def test_version() -> None:
    """``thinktrans-acp --version`` prints the client's version, and starts nothing."""
    from importlib import metadata

    out = subprocess.run([PROXY, "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (
        0, f"thinktrans-acp {metadata.version('thinktrans-client')}\n", "")


async def test_deadline_ms_bounds_what_a_tool_call_waits(chat: FakeChat) -> None:
    """ACP cannot replace a chunk: a translation later than ``--deadline-ms`` after the part
    ended is of no use, so the tool call behind the part waits no longer than that (not
    the translator's 5 s, nor the sidecar's 10 s deadline), and the thought goes out as it
    was (status deadline)."""
    chat.reset()
    # The translator and the sidecar's deadline both far past the guards below: the tool
    # call comes through only if --deadline-ms let the thought go.
    chat.mode, chat.slow_s = "timeout", 600.0
    thought = {"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s1", "update": {"sessionUpdate": "agent_thought_chunk",
                                      "content": {"type": "text", "text": "Let me look."}}}}
    tool = {"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": "s1", "update": {"sessionUpdate": "tool_call", "toolCallId": "c1",
                                      "title": "Read"}}}
    try:
        with llm_server(chat, THINKTRANS_DEADLINE_MS="600000",
                        THINKTRANS_LLM_TIMEOUT_S="600") as server:
            proc = await asyncio.create_subprocess_exec(
                PROXY, "--url", server.url, "--target", "de", "--deadline-ms", "300", "--",
                sys.executable, "-c", ECHO, cwd=ROOT, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            assert proc.stdin is not None and proc.stdout is not None
            warm = {**tool, "params": {**tool["params"], "sessionId": "s0"}}
            proc.stdin.write(json.dumps(warm).encode() + b"\n")  # the proxy is up, and the
            await proc.stdin.drain()  # agent: what follows is not timed with their start
            assert json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)) == warm
            proc.stdin.write(json.dumps(thought).encode() + b"\n")
            await proc.stdin.drain()
            await asyncio.sleep(0.3)  # the thought is on the sidecar, being translated
            proc.stdin.write(json.dumps(tool).encode() + b"\n")
            await proc.stdin.drain()
            out = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
                   for _ in range(2)]
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 30)
    finally:
        chat.reset()
    meta = out[0]["params"]["update"]["_meta"]["thinktrans"]
    assert (meta["status"], meta["original"]) == ("deadline", "Let me look.")
    assert out[1] == tool


def test_every_option_in_help_is_in_the_docs() -> None:
    """The options table of docs/integration.md lists exactly what ``--help`` offers."""
    import re

    out = subprocess.run([PROXY, "--help"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    offered = {name for line in out.stdout.splitlines()
               if (match := re.match(r"  (-\w, )?(--[a-z][a-z-]*)", line))
               for name in (match.group(2), *(match.group(1) or "").strip(", ").split())}
    doc = (ROOT / "docs" / "integration.md").read_text(encoding="utf-8")
    table = doc.split("| option | default | meaning |", 1)[1].split("\n\n", 1)[0]
    listed = {name for row in table.splitlines()[2:]
              for name in re.findall(r"`(--?[a-z][a-z-]*)", row.split(" | ", 1)[0])}
    assert {"--glossary", "--deadline-ms", "-v"} <= offered  # the parse finds them
    assert listed == offered


def test_a_bad_deadline_names_the_variable() -> None:
    env = {**os.environ, "THINKTRANS_ACP_DEADLINE_MS": "soon"}
    out = subprocess.run([PROXY, "--", "true"], stdin=subprocess.DEVNULL, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "THINKTRANS_ACP_DEADLINE_MS" in out.stderr


def test_a_glossary_file_goes_to_every_stream_and_a_bad_one_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from thinktrans_client.proxy import _parser

    good = tmp_path / "glossary.json"
    good.write_text('{"terms": {"pull request": "拉取请求"}, "keep": ["PyTorch"]}',
                    encoding="utf-8")
    args = _parser().parse_args(["--glossary", str(good)])
    assert args.glossary == {"terms": {"pull request": "拉取请求"}, "keep": ["PyTorch"]}
    for text, words in (("[1]", "must hold"), ("{nope", "is not JSON")):
        bad = tmp_path / "bad.json"
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(SystemExit) as info:
            _parser().parse_args(["--glossary", str(bad)])
        assert info.value.code == 2 and words in capsys.readouterr().err
