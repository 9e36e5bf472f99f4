"""Every way ``thinktrans-acp`` exits leaves none of its streams open on the sidecar.

The proxy is the installed console script, its agent ``tests/acp_agent.py``, the sidecar the
app under uvicorn on 127.0.0.1; the editor is this module, writing and reading JSON lines.
A session exits mid-thought, after a chosen number of the agent's deltas, by each path: the
editor's EOF, SIGTERM, the agent's exit (with and without a child holding its stdout), the
editor hanging up, a cancel. Then the sidecar's ``GET /v1/streams`` shows none of its open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("acp", reason="needs the client's acp extra: pip install './client[acp]'")

from models.passthrough import PassthroughTranslator
from tests.conftest import InThread
from tests.fakes import FakeTranslator

ROOT = Path(__file__).resolve().parent.parent
PROXY = str(Path(sys.executable).with_name("thinktrans-acp"))
AGENT = (sys.executable, str(ROOT / "tests" / "acp_agent.py"))
# The same scripted agent without the SDK's import, for the loop of many sessions.
PLAIN_AGENT = (sys.executable, str(ROOT / "tests" / "acp_plain_agent.py"))
AGENT_EXIT_CODE = 3
# Every exit path; ``wait`` or ``exit`` is the prompt the agent gets (tests/acp_agent.py).
EXITS = {"eof": "wait", "sigterm": "wait", "agent-exit": "exit", "agent-exit-lingering": "exit",
         "hangup": "wait", "cancel": "wait"}
THOUGHT_DELTAS = 8  # tests/acp_agent.py's WAIT_THOUGHT, 52 characters, in deltas of 7


@pytest.fixture(scope="module")
def sidecar() -> Iterator[str]:
    """A translator that takes 0.2 s a batch (some parts are still being translated when the
    proxy exits); idle streams would expire only after 10 minutes, far past these tests."""
    backends = {"passthrough": PassthroughTranslator(), "fake": FakeTranslator(delay_s=0.2)}
    with InThread(backends=backends, backend="fake", stream_idle_expire_s=600) as url:
        yield url


@dataclass
class Session:
    """One proxy process and its editor's side: the lines it wrote to the editor, stderr."""

    proc: asyncio.subprocess.Process
    tmp: Path
    out: list[dict[str, Any]]

    def write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    def stderr(self) -> str:
        return (self.tmp / "stderr.txt").read_text(errors="replace")

    def thoughts_sent(self) -> int:
        """How many thought deltas the agent has sent (its own record)."""
        try:
            lines = (self.tmp / "agent.jsonl").read_text().splitlines()
        except OSError:
            return 0
        return sum("agent_thought_chunk" in line for line in lines)


async def until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    """Wait until ``check()`` holds, looking every 20 ms (a generous bound stops a hang)."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s:g} s: {what}") from None


async def start(url: str, tmp: Path, name: str, *proxy_args: str, linger: bool = False,
                agent: tuple[str, ...] = AGENT) -> Session:
    env = {**os.environ, "ACP_AGENT_LOG": str(tmp / "agent.jsonl"),
           "ACP_AGENT_EXIT": str(AGENT_EXIT_CODE), "ACP_AGENT_SESSIONS": name,
           "ACP_AGENT_RELEASE": str(tmp / "release")}  # a cancel is answered at once
    if linger:
        env["ACP_AGENT_LINGER"] = str(tmp / "linger.pid")
    with (tmp / "stderr.txt").open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            PROXY, "--url", url, "--target", "de", *proxy_args, "--", *agent, cwd=ROOT,
            env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=stderr)
    (tmp / "release").touch()
    return Session(proc, tmp, [])


async def read_out(session: Session) -> None:
    assert session.proc.stdout is not None
    while line := await session.proc.stdout.readline():
        session.out.append(json.loads(line))


def answered(session: Session, request_id: int) -> dict[str, Any] | None:
    return next((m for m in session.out if m.get("id") == request_id and "method" not in m),
                None)


async def one_session(url: str, tmp: Path, name: str, how: str, deltas: int,
                      *proxy_args: str, agent: tuple[str, ...] = AGENT) -> Session:
    """A session that exits by ``how`` once the agent has sent ``deltas`` of its thought."""
    session = await start(url, tmp, name, *proxy_args, linger=how == "agent-exit-lingering",
                          agent=agent)
    reading = asyncio.create_task(read_out(session))
    try:
        session.write({"id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
        session.write({"id": 1, "method": "session/new",
                       "params": {"cwd": str(tmp), "mcpServers": []}})
        await until(lambda: answered(session, 1) is not None, "session/new answered")
        new = answered(session, 1)
        assert new is not None
        session_id = new["result"]["sessionId"]
        session.write({"id": 2, "method": "session/prompt", "params": {
            "sessionId": session_id,
            "prompt": [{"type": "text", "text": f"{EXITS[how]} {deltas}"}]}})
        await until(lambda: session.thoughts_sent() >= deltas, "the agent's deltas")
        await exit_by(session, how, session_id, reading)
        await asyncio.wait_for(session.proc.wait(), 120)
    finally:
        if session.proc.returncode is None:
            session.proc.kill()
            await session.proc.wait()
        reading.cancel()
        linger = tmp / "linger.pid"
        if linger.exists() and linger.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(linger.read_text()), signal.SIGKILL)
    return session


async def exit_by(session: Session, how: str, session_id: str, reading: asyncio.Task[None]
                  ) -> None:
    proc = session.proc
    assert proc.stdin is not None
    if how == "eof":
        proc.stdin.close()
    elif how == "sigterm":
        proc.send_signal(signal.SIGTERM)  # passed to the agent, which exits
    elif how == "agent-exit-lingering":
        # The agent is gone and its child holds its stdout: the proxy goes on until the
        # editor stops it, here with SIGTERM (which ends the proxy once the agent is gone).
        await until(lambda: "the agent exited" in session.stderr(), "the agent's exit logged")
        proc.send_signal(signal.SIGTERM)
    elif how == "hangup":  # the editor closes both pipes: the proxy can write to no one
        reading.cancel()
        proc.stdin.close()
        assert proc.stdout is not None
        transport = getattr(proc.stdout, "_transport", None)
        if transport is not None:
            transport.close()
    elif how == "cancel":
        session.write({"method": "session/cancel", "params": {"sessionId": session_id}})
        await until(lambda: answered(session, 2) is not None, "the cancelled prompt answered")
        proc.stdin.close()


def open_streams(url: str, names: list[str]) -> list[str]:
    """The sidecar's open streams of the sessions named ``names``."""
    streams = httpx.get(f"{url}/v1/streams", timeout=30).json()["streams"]
    return [s["stream_id"] for s in streams if s["state"] == "open"
            and any(s["stream_id"].startswith(f"{name}-") for name in names)]


async def left_open(url: str, names: list[str]) -> list[str]:
    """The streams of ``names`` still open once those the proxy closed (not deleted: see
    ``ThinktransClient.release_stream``) have ended by themselves, which takes them at most
    the sidecar's deadline; a stream left open stays so until its idle expiry."""
    left: list[str] = []

    def check() -> bool:
        left[:] = open_streams(url, names)
        return not left

    with contextlib.suppress(AssertionError):
        await until(check, "the closed streams end", timeout_s=30)
    return left


@pytest.mark.parametrize("how", list(EXITS))
async def test_an_exit_mid_thought_leaves_no_stream_open(tmp_path: Path, sidecar: str,
                                                         how: str) -> None:
    """Five of the eight deltas sent: the part is open on the sidecar as the proxy exits."""
    name = f"mid-{how}"
    session = await one_session(sidecar, tmp_path, name, how, 5)
    assert await left_open(sidecar, [name]) == [], session.stderr()[-3000:]
    codes = {"eof": AGENT_EXIT_CODE, "sigterm": 100 + signal.SIGTERM,
             "agent-exit": AGENT_EXIT_CODE, "agent-exit-lingering": AGENT_EXIT_CODE,
             "cancel": AGENT_EXIT_CODE}  # hangup: EOF or SIGTERM, whichever the agent sees first
    if how in codes:
        assert session.proc.returncode == codes[how], session.stderr()[-3000:]


async def test_forty_sessions_exiting_at_varied_points(tmp_path: Path, sidecar: str) -> None:
    """40 proxies, four at a time, each with the plain agent: each exit path after 1 to 8 of
    the agent's deltas (before the stream opens, while it opens, while chunks are posted),
    with a wait for the part's last translations of 0 (none) or 1500 ms (past the
    translator's 0.2 s)."""
    gate = asyncio.Semaphore(4)
    plan = [(f"loop{n}", list(EXITS)[n % len(EXITS)], 1 + (n * 3) % THOUGHT_DELTAS,
             "0" if n % 2 else "1500") for n in range(40)]

    async def run(name: str, how: str, deltas: int, deadline_ms: str) -> None:
        async with gate:
            tmp = tmp_path / name
            tmp.mkdir()
            await one_session(sidecar, tmp, name, how, deltas, "--deadline-ms", deadline_ms,
                              agent=PLAIN_AGENT)

    await asyncio.gather(*(run(*step) for step in plan))
    left = await left_open(sidecar, [step[0] for step in plan])
    where = {step[0]: f"{step[1]} after {step[2]} deltas, --deadline-ms {step[3]}"
             for step in plan}
    assert left == [], [f"{sid}: {where[sid.rsplit('-', 1)[0]]}" for sid in left]
