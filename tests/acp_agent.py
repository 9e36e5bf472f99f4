"""A fake ACP agent written with the ACP SDK's agent side; the proxy's tests run it as a child.

    python tests/acp_agent.py

A prompt whose text is ``turn`` streams the turn below: thought chunks (deltas, cut inside
words) between message chunks, a tool call, its update, a plan and a permission request,
then ends with ``end_turn``. ``wait`` streams a thought without a sentence end and waits
for ``session/cancel``, then ends with ``cancelled`` ``CANCEL_ANSWER_DELAY_S`` later (or,
with ``$ACP_AGENT_RELEASE`` set, once a file of that name exists); ``wait N`` streams only
its first N deltas. ``exit N`` streams them and exits at once, mid-thought, with
``$ACP_AGENT_EXIT``; with ``$ACP_AGENT_LINGER`` set, a child of its own keeps its stdout
open after it (the child's pid written to the file of that name). Its sessions are
``<$ACP_AGENT_SESSIONS>-<n>`` (``sess-1``, ... by default). Every message it sends
is appended to ``$ACP_AGENT_LOG`` (one JSON line each, as the SDK put it on the wire). It
writes one line to stderr when it starts, exits with ``$ACP_AGENT_EXIT`` when its stdin
closes, and on SIGINT, SIGTERM or SIGHUP writes a line to stderr and exits with
``signal_exit(signum)``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

from acp import (
    Client,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    update_agent_message_text,
    update_plan,
    update_tool_call,
)
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AgentCapabilities,
    AgentThoughtChunk,
    PermissionOption,
    PlanEntry,
    ToolCallUpdate,
)

CANCEL_ANSWER_DELAY_S = 1.5
# The thought of ``wait`` and ``exit``: no sentence end, so it stays open on the sidecar.
WAIT_THOUGHT = "Let me think about the dates and how they are parsed"


async def released() -> None:
    """Once the file ``$ACP_AGENT_RELEASE`` names exists, else ``CANCEL_ANSWER_DELAY_S``."""
    path = os.environ.get("ACP_AGENT_RELEASE")
    if not path:
        await asyncio.sleep(CANCEL_ANSWER_DELAY_S)
        return
    while not os.path.exists(path):
        await asyncio.sleep(0.01)


def signal_exit(signum: int) -> int:
    """The exit code on a signal: distinct from 128 + N, so the test sees the agent's own."""
    return 100 + signum


# (kind, payload): "thought" text is cut into deltas; "permission" asks the client.
TURN: list[tuple[str, Any]] = [
    ("thought", ("t1", "The test parses dates in the local timezone. "
                       "On CI the timezone is UTC, so the day can shift.")),
    ("message", "Let me look at the test."),
    ("tool", None),
    ("thought", ("t2", "这个测试在本地通过，因为时区是 Asia/Shanghai。 "
                       "I should read parse_dates next.")),
    ("tool_done", None),
    ("plan", None),
    ("permission", None),
    ("thought", ("t3", "The fix is to pass tz=UTC explicitly. "
                       "Then the test no longer depends on the machine.")),
    ("message", "Fixed: the test now parses dates in UTC."),
]


def deltas(text: str, size: int = 7) -> list[str]:
    """``text`` cut every ``size`` characters, inside words, as a model streams it."""
    return [text[i:i + size] for i in range(0, len(text), size)]


class FakeAgent:
    def __init__(self) -> None:
        self.conn: Client | None = None
        self.sessions = 0
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=protocol_version,
                                  agent_capabilities=AgentCapabilities(load_session=True))

    async def new_session(self, cwd: str, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        self.sessions += 1
        session = f"{os.environ.get('ACP_AGENT_SESSIONS', 'sess')}-{self.sessions}"
        self.cancelled[session] = asyncio.Event()
        return NewSessionResponse(session_id=session)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           **kwargs: Any) -> None:
        self.cancelled.setdefault(session_id, asyncio.Event())
        return None

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.setdefault(session_id, asyncio.Event()).set()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        command, *count = " ".join(getattr(block, "text", "") for block in prompt).split() or [""]
        if command in ("wait", "exit"):
            pieces = deltas(WAIT_THOUGHT)
            for delta in pieces[:int(count[0]) if count else len(pieces)]:
                await self._thought(session_id, "w1", delta)
            if command == "exit":
                exit_now()
            await self.cancelled[session_id].wait()
            await released()  # the thought must not wait for this
            return PromptResponse(stop_reason="cancelled")
        if command != "turn":
            raise RequestError.invalid_params({"prompt": "send 'turn' or 'wait'"})
        for kind, payload in TURN:
            await self._step(session_id, kind, payload)
            await asyncio.sleep(0.01)  # a model's pace: the proxy sees the turn unfold
        return PromptResponse(stop_reason="end_turn")

    async def _thought(self, session_id: str, message_id: str, delta: str) -> None:
        assert self.conn is not None
        await self.conn.session_update(session_id, AgentThoughtChunk(
            session_update="agent_thought_chunk", content=text_block(delta),
            message_id=message_id))

    async def _step(self, session_id: str, kind: str, payload: Any) -> None:
        assert self.conn is not None
        if kind == "thought":
            message_id, text = payload
            for delta in deltas(text):
                await self._thought(session_id, message_id, delta)
        elif kind == "message":
            await self.conn.session_update(session_id, update_agent_message_text(payload))
        elif kind == "tool":
            await self.conn.session_update(session_id, start_tool_call(
                "call_1", "Read tests/test_dates.py", kind="read", status="in_progress"))
        elif kind == "tool_done":
            await self.conn.session_update(session_id, update_tool_call(
                "call_1", status="completed"))
        elif kind == "plan":
            await self.conn.session_update(session_id, update_plan([
                PlanEntry(content="Parse dates in UTC", priority="high", status="pending")]))
        elif kind == "permission":
            await self.conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="call_2", title="Edit parse_dates"),
                options=[PermissionOption(option_id="allow", name="Allow",
                                          kind="allow_once")])


def exit_now() -> None:
    """Exit mid-turn, what was sent flushed; a child may keep stdout open (the module's
    docstring)."""
    linger = os.environ.get("ACP_AGENT_LINGER")
    if linger:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        with open(linger, "w", encoding="utf-8") as out:
            out.write(str(child.pid))
    sys.stdout.flush()
    os._exit(int(os.environ.get("ACP_AGENT_EXIT", "0")))


def main() -> int:
    log_path = os.environ.get("ACP_AGENT_LOG")

    def record(event: StreamEvent) -> None:
        if log_path and event.direction is StreamDirection.OUTGOING:
            with open(log_path, "a", encoding="utf-8") as out:
                out.write(json.dumps(event.message, ensure_ascii=False) + "\n")

    def on_signal(signum: int, _: Any) -> None:
        print(f"fake agent: {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        os._exit(signal_exit(signum))

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print("fake agent: started", file=sys.stderr, flush=True)
    asyncio.run(run_agent(FakeAgent(), observers=[record]))
    return int(os.environ.get("ACP_AGENT_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
