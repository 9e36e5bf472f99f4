"""The parts a ThoughtTranslator composes, each on its own: what the client's messages tell
(``_Sessions``) and the ordered output (``_Output``)."""

from __future__ import annotations

import asyncio
from typing import Any

from thinktrans_client.acp import _Output, _Sessions, _Slot, _Thoughts


def _request(ident: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": method, "params": params}


def test_sessions_learn_the_client_locale_and_each_sessions_own() -> None:
    sessions = _Sessions((), advertise=True)
    sessions.note(_request(0, "initialize", protocolVersion=1, _meta={"locale": "zh-cn"}))
    assert sessions.client_locale == "zh-CN"
    sessions.note(_request(1, "session/new", cwd="/", _meta={"locale": "de-DE"}))
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"sessionId": "s1"}}
    assert sessions.answered(answer) == "s1"
    assert sessions.locales == {"s1": "de-DE"}
    sessions.note(_request(2, "session/prompt", sessionId="s1",
                           prompt=[{"type": "text", "text": "Wie lange dauert es?"}]))
    assert sessions.user_text["s1"] == "Wie lange dauert es?"
    # The prompt's answer is of that session (it ends the turn of s1 alone).
    assert sessions.answered({"jsonrpc": "2.0", "id": 2, "result": {}}) == "s1"
    assert sessions.answered({"jsonrpc": "2.0", "id": 2, "result": {}}) is None


def test_only_the_answer_to_the_initialize_seen_is_completed_and_only_once() -> None:
    sessions = _Sessions((), advertise=True)
    sessions.note(_request(7, "initialize", protocolVersion=1))
    assert not sessions.answers_initialize({"jsonrpc": "2.0", "id": "7", "result": {}})
    assert sessions.answers_initialize({"jsonrpc": "2.0", "id": 7, "result": {}})
    assert not sessions.answers_initialize({"jsonrpc": "2.0", "id": 7, "result": {}})
    quiet = _Sessions((), advertise=False)
    quiet.note(_request(7, "initialize", protocolVersion=1))
    assert not quiet.answers_initialize({"jsonrpc": "2.0", "id": 7, "result": {}})


class _Part:
    """A thinking part's stand-in: the output reads only its ready chunks and end."""

    def __init__(self) -> None:
        self.thoughts = _Thoughts(stream=None, template={})  # type: ignore[arg-type]


async def _settle(out: _Output) -> None:
    for _ in range(20):  # the emitter's task takes a few loop turns per change
        await asyncio.sleep(0)


def _recording() -> tuple[_Output, list[Any]]:
    """An output whose ``send`` records what goes out."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    return _Output(send, max_pending=16), sent


async def test_an_open_part_holds_back_its_session_only() -> None:
    out, sent = _recording()
    a = _Part()
    out.append(_Slot("A", thoughts=a.thoughts))
    out.append(_Slot("A", message="after a, in A"))
    out.append(_Slot("B", message="in B"))
    await _settle(out)
    assert sent == ["in B"]  # B does not wait for A's open part
    out.add_ready(a.thoughts, {"chunk": 1})
    await _settle(out)
    assert sent == ["in B", {"chunk": 1}]
    a.thoughts.finished = True
    out.changed()
    await _settle(out)
    assert sent == ["in B", {"chunk": 1}, "after a, in A"]
    out.close()
    await asyncio.wait_for(out.finished(), 10)


async def test_a_slot_of_no_session_waits_for_all_before_it_and_holds_all_after() -> None:
    out, sent = _recording()
    a = _Part()
    out.append(_Slot("A", thoughts=a.thoughts))
    out.append(_Slot(None, message="of no session"))
    out.append(_Slot("B", message="in B"))
    await _settle(out)
    assert sent == []
    a.thoughts.finished = True
    out.changed()
    await _settle(out)
    assert sent == ["of no session", "in B"]
    out.close()
    await asyncio.wait_for(out.finished(), 10)


async def test_full_counts_slots_and_translated_chunks_waiting() -> None:
    gate = asyncio.Event()

    async def send(message: Any) -> None:
        await gate.wait()

    out = _Output(send, max_pending=3)
    a = _Part()
    out.append(_Slot("A", thoughts=a.thoughts))
    out.add_ready(a.thoughts, {"chunk": 1})
    assert not out.full()
    out.add_ready(a.thoughts, {"chunk": 2})
    assert out.full()
    gate.set()
    await _settle(out)
    assert not out.full() and out.room.is_set()
    a.thoughts.finished = True
    out.close()
    await asyncio.wait_for(out.finished(), 10)
