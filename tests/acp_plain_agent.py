"""``tests/acp_agent.py``'s ``wait N`` and ``exit N`` without the ACP SDK: JSON lines on stdio.

For tests that start many agents (the SDK takes a second of CPU to import): the same
prompts, environment variables, thought, log of what it sent and exit codes, standard
library only. It answers ``initialize``, ``session/new``, ``session/prompt`` and
``session/cancel``; anything else with an id gets a JSON-RPC error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

CANCEL_ANSWER_DELAY_S = 1.5
WAIT_THOUGHT = "Let me think about the dates and how they are parsed"
_out = threading.Lock()


def send(message: dict[str, Any]) -> None:
    line = json.dumps({"jsonrpc": "2.0", **message}, ensure_ascii=False)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        log = os.environ.get("ACP_AGENT_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as out:
                out.write(line + "\n")


def exit_now() -> None:
    """Exit mid-turn; with ``$ACP_AGENT_LINGER``, a child keeps stdout open after it."""
    linger = os.environ.get("ACP_AGENT_LINGER")
    if linger:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        with open(linger, "w", encoding="utf-8") as out:
            out.write(str(child.pid))
    os._exit(int(os.environ.get("ACP_AGENT_EXIT", "0")))


def answer_cancel(request_id: Any) -> None:
    """The cancelled prompt's answer, once ``$ACP_AGENT_RELEASE`` exists (else after a delay)."""
    release = os.environ.get("ACP_AGENT_RELEASE")
    if release:
        while not os.path.exists(release):
            time.sleep(0.01)
    else:
        time.sleep(CANCEL_ANSWER_DELAY_S)
    send({"id": request_id, "result": {"stopReason": "cancelled"}})


def prompt(request_id: Any, params: dict[str, Any], waiting: dict[str, Any]) -> None:
    session = params["sessionId"]
    text = " ".join(b.get("text", "") for b in params.get("prompt", []) if isinstance(b, dict))
    command, *count = text.split() or [""]
    if command not in ("wait", "exit"):
        send({"id": request_id, "error": {"code": -32602, "message": "send 'wait' or 'exit'"}})
        return
    pieces = [WAIT_THOUGHT[i:i + 7] for i in range(0, len(WAIT_THOUGHT), 7)]
    for delta in pieces[:int(count[0]) if count else len(pieces)]:
        send({"method": "session/update", "params": {"sessionId": session, "update": {
            "sessionUpdate": "agent_thought_chunk", "messageId": "w1",
            "content": {"type": "text", "text": delta}}}})
    if command == "exit":
        exit_now()
    waiting[session] = request_id


def main() -> int:
    def on_signal(signum: int, _: Any) -> None:
        print(f"plain agent: {signal.Signals(signum).name}", file=sys.stderr, flush=True)
        os._exit(100 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print("plain agent: started", file=sys.stderr, flush=True)
    sessions = 0
    waiting: dict[str, Any] = {}  # session -> the prompt awaiting its cancel
    for line in sys.stdin:
        message = json.loads(line)
        method, params, request_id = (message.get("method"), message.get("params") or {},
                                      message.get("id"))
        if method == "initialize":
            send({"id": request_id, "result": {"protocolVersion": params["protocolVersion"],
                                               "agentCapabilities": {}}})
        elif method == "session/new":
            sessions += 1
            name = os.environ.get("ACP_AGENT_SESSIONS", "sess")
            send({"id": request_id, "result": {"sessionId": f"{name}-{sessions}"}})
        elif method == "session/prompt":
            prompt(request_id, params, waiting)
        elif method == "session/cancel" and params.get("sessionId") in waiting:
            threading.Thread(target=answer_cancel, args=(waiting.pop(params["sessionId"]),),
                             daemon=True).start()
        elif request_id is not None and method is not None:
            send({"id": request_id, "error": {"code": -32601, "message": "not scripted"}})
    return int(os.environ.get("ACP_AGENT_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
