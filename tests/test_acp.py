"""thinktrans_client.acp and examples/acp_bridge.py against real sidecars, healthy and not."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from thinktrans_client.acp import (
    ThoughtTranslator,
    advertise_locales,
    default_lane,
    locale_from_initialize,
    translate_messages,
)
from thinktrans_client.client import STREAM_ID, ThinktransClient, safe_stream_id
from thinktrans_client.locale import canonicalize

from tests.conftest import Server, served
from tests.fakes_remote import FakeChat, closed_port_url
from tests.test_client import RawServer, answer_500, llm_server, never_answer

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "acp_trace.jsonl"
BRIDGE = ROOT / "examples" / "acp_bridge.py"
SESSION = "sess_7f3c2a"


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Server]:
    """Passthrough, no default locale."""
    with served() as server:
        yield server


@pytest.fixture(scope="module")
def allowed_sidecar() -> Iterator[Server]:
    """Passthrough (any target) narrowed by THINKTRANS_ALLOWED_LOCALES."""
    with served(THINKTRANS_ALLOWED_LOCALES="zh-CN,de") as server:
        yield server


@pytest.fixture(scope="module")
def chat(chat_server: FakeChat) -> FakeChat:
    return chat_server


@pytest.fixture(scope="module")
def llm_sidecar(chat: FakeChat) -> Iterator[Server]:
    with llm_server(chat) as server:
        yield server


@pytest.fixture
def fake_chat(chat: FakeChat) -> FakeChat:
    chat.reset()
    return chat


def load_trace() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]


def update_of(message: Any) -> dict[str, Any] | None:
    if isinstance(message, dict) and message.get("method") == "session/update":
        update: dict[str, Any] = message["params"]["update"]
        return update
    return None


def is_thought(message: Any) -> bool:
    update = update_of(message)
    return update is not None and update["sessionUpdate"] == "agent_thought_chunk"


def others(messages: Sequence[Any]) -> list[Any]:
    return [m for m in messages if not is_thought(m)]


def thought_parts(messages: Sequence[Any], *, output: bool) -> list[str]:
    """The thinking text between other messages: input deltas, or output originals, joined."""
    parts: list[str] = []
    current: list[str] | None = None
    for message in messages:
        if is_thought(message):
            update = update_of(message)
            assert update is not None
            text = (update["_meta"]["thinktrans"]["original"] if output
                    else update["content"]["text"])
            if current is None:
                current = []
                parts.append("")
            current.append(text)
            parts[-1] = "".join(current)
        else:
            current = None
    return parts


def thinktrans_meta(messages: Sequence[Any]) -> list[dict[str, Any]]:
    return [update["_meta"]["thinktrans"] for m in messages
            if is_thought(m) and (update := update_of(m)) is not None]


async def paced(messages: Sequence[Any], pause_s: float = 0.0) -> AsyncIterator[Any]:
    for message in messages:
        yield copy.deepcopy(message)
        if pause_s:
            await asyncio.sleep(pause_s)


async def translate_all(url: str, messages: Sequence[Any], *, pause_s: float = 0.0,
                        timeout_s: float = 2.0, **options: Any) -> list[Any]:
    async with ThinktransClient(url, timeout_s=timeout_s) as client:
        return [m async for m in translate_messages(client, paced(messages, pause_s), **options)]


def assert_order_kept(inp: Sequence[Any], out: Sequence[Any]) -> None:
    """Every other message unchanged and in place; each thinking part whole, between them."""
    assert others(out) == others(inp)
    assert thought_parts(out, output=True) == thought_parts(inp, output=False)


# -- the client's locale -------------------------------------------------------------------


@pytest.mark.parametrize(("meta", "allowed", "default", "expected"), [
    ({"locale": "zh-CN"}, (), None, "zh-CN"),
    ({"locale": "ZH-cn"}, (), None, "zh-CN"),
    ({"locale": "zh_CN"}, (), None, None),  # malformed: not used
    ({"locale": "zh_CN"}, (), "en", "en"),
    ({"locale": "ja-JP"}, ("zh", "en"), "en", "en"),  # not allowed
    ({"locale": "zh-Hant-TW"}, ("zh",), None, "zh-Hant-TW"),
    ({"locale": ["xx_YY", "pt-br"]}, (), None, "pt-BR"),  # a preference list
    ({"locale": 42}, (), None, None),
    ({"locale": "en\u202e"}, (), None, None),  # bidi control characters
    ({"locale": "zh-CN"}, ("ZH-cn",), None, "zh-CN"),  # allowed entries are canonicalised
    ({"locale": "zh-CN"}, ("zh-TW",), None, None),  # a region admits only itself
    ({"locale": "zh-CN"}, ("zh_CN", "en"), None, None),  # a malformed entry admits nothing
    ({"locale": "iw-IL"}, ("he",), None, "he-IL"),  # a withdrawn code, as the registry maps it
    ({}, (), "de", "de"),
    (None, (), None, None),
])
def test_locale_from_initialize(meta: Any, allowed: tuple[str, ...], default: str | None,
                                expected: str | None) -> None:
    params = {"protocolVersion": 1} if meta is None else {"protocolVersion": 1, "_meta": meta}
    assert locale_from_initialize(params, allowed=allowed, default=default) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(locale=json_values | st.sampled_from(["zh-CN", "en-US", "und", "x-private", "i-klingon",
                                              "zh-Hans-CN-u-co-pinyin", "a" * 70]),
       default=st.none() | st.sampled_from(["en", "zh_CN", "fr-FR"]),
       params=st.none() | json_values)
def test_locale_never_raises(locale: Any, default: str | None, params: Any) -> None:
    got = locale_from_initialize({"_meta": {"locale": locale}}, default=default)
    assert got is None or canonicalize(got) == got
    assert locale_from_initialize(params) is None or isinstance(params, dict)


async def test_translator_refuses_a_bad_target_without_echoing_it(
        caplog: pytest.LogCaptureFixture) -> None:
    async with ThinktransClient(closed_port_url()) as client:

        async def send(message: Any) -> None:
            pass

        for target, allowed in (("zh_CN\u202e", ()), ("ja-JP", ("zh",))):
            with pytest.raises(ValueError) as caught:
                ThoughtTranslator(client, send, target=target, allowed=allowed)
            assert target not in str(caught.value) and "BCP 47" in str(caught.value)
        translator = ThoughtTranslator(client, send, target="zh-tw", allowed=("zh", "bad_one"))
        assert translator.target == "zh-TW"
        assert "1 of 2 allowed locales" in caplog.text and "bad_one" not in caplog.text
        await translator.aclose()


def test_default_lane() -> None:
    assert default_lane({"sessionUpdate": "agent_thought_chunk"}) == ""
    assert default_lane({"_meta": {"ts": 17, "thinktrans": {"x": 1}}}) == ""
    sub = default_lane({"_meta": {"claudeCode": {"parentToolUseId": "toolu_9"}}})
    assert sub == "parenttooluseid=toolu_9"
    assert default_lane({"_meta": {"parent_tool_call_id": "call_2"}}) != sub


# -- the translator on a real sidecar ------------------------------------------------------


async def test_trace_is_translated_in_order(llm_sidecar: Server, fake_chat: FakeChat) -> None:
    trace = load_trace()
    out = await translate_all(llm_sidecar.url, trace, pause_s=0.001)
    assert_order_kept(trace, out)
    metas = thinktrans_meta(out)
    assert {m["target"] for m in metas} == {"zh-CN"}  # from initialize _meta.locale
    assert len(thought_parts(out, output=True)) == 2
    translated = [m for m in metas if m["status"] == "translated"]
    assert len(translated) >= 6 and {m["backend"] for m in translated} == {"llm"}
    for message in out:
        update = update_of(message)
        if is_thought(message) and update is not None:
            info = update["_meta"]["thinktrans"]
            expected = (f"Simplified Chinese: {info['original'].strip()}"
                        if info["status"] == "translated" else info["original"])
            assert update["content"]["text"].strip() == expected.strip()
            assert message["params"]["sessionId"] == SESSION


async def test_explicit_target_wins(llm_sidecar: Server, fake_chat: FakeChat) -> None:
    out = await translate_all(llm_sidecar.url, load_trace()[:40], target="de")
    metas = thinktrans_meta(out)
    assert metas and {m["target"] for m in metas} == {"de"}
    assert any(update["content"]["text"].startswith("German: ") for m in out
               if is_thought(m) and (update := update_of(m)) is not None)


@pytest.mark.parametrize("locale", [None, "zh_CN", "xx-invalid-"])
async def test_no_usable_locale_leaves_it_to_the_user_text(sidecar: Server,
                                                           locale: str | None) -> None:
    trace = load_trace()[:30]
    meta = trace[0]["params"].pop("_meta")
    if locale is not None:
        trace[0]["params"]["_meta"] = {**meta, "locale": locale}
    out = await translate_all(sidecar.url, trace)
    assert_order_kept(trace, out)
    # The user wrote Chinese in session/prompt; the service detects it (API.md step 3).
    assert {m["target"] for m in thinktrans_meta(out)} == {"zh-Hans"}
    without_prompt = [m for m in trace if m.get("method") != "session/prompt"]
    out = await translate_all(sidecar.url, without_prompt)
    assert {m["status"] for m in thinktrans_meta(out)} == {"no_target"}


def thought(text: str, session: str = SESSION, meta: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": "agent_thought_chunk",
                              "content": {"type": "text", "text": text}}
    if meta is not None:
        update["_meta"] = meta
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session, "update": update}}


def other(kind: str, session: str = SESSION, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session, "update": {"sessionUpdate": kind, **fields}}}


async def test_sub_agent_thoughts_keep_their_own_stream(sidecar: Server) -> None:
    sub_meta = {"claudeCode": {"parentToolUseId": "toolu_9"}}
    main_text = "First I look at the parser. Then I run the tests again."
    sub_text = "Searching the repo for parse calls. Found three of them."
    messages = [other("tool_call", toolCallId="toolu_9", title="Task", status="pending")]
    for a, b in itertools.zip_longest(main_text.split(" "), sub_text.split(" ")):
        if a:
            messages.append(thought(a + " "))
        if b:
            messages.append(thought(b + " ", meta=sub_meta))
    messages.append(other("agent_message_chunk", content={"type": "text", "text": "Done."}))
    out = await translate_all(sidecar.url, messages, target="de")
    assert others(out) == others(messages)
    thoughts = [update for m in out if is_thought(m) and (update := update_of(m)) is not None]
    main = [u for u in thoughts if "claudeCode" not in u["_meta"]]
    sub = [u for u in thoughts if "claudeCode" in u["_meta"]]
    assert "".join(u["_meta"]["thinktrans"]["original"] for u in main) == main_text + " "
    assert "".join(u["_meta"]["thinktrans"]["original"] for u in sub) == sub_text + " "
    assert all(u["_meta"]["claudeCode"] == sub_meta["claudeCode"] for u in sub)
    # Whole sentences each: the two agents' words were not mixed into one stream.
    assert all(u["_meta"]["thinktrans"]["status"] == "translated" for u in main + sub)


async def test_sessions_do_not_wait_for_each_other(sidecar: Server) -> None:
    sent: list[Any] = []
    changed = asyncio.Event()

    async def send(message: Any) -> None:
        sent.append(message)
        changed.set()

    async def until(condition: Any) -> None:
        while not condition():
            changed.clear()
            await asyncio.wait_for(changed.wait(), 3)

    async with ThinktransClient(sidecar.url) as client:
        async with ThoughtTranslator(client, send, target="de") as tr:
            await tr.feed(thought("Session A thinks about", session="A"))
            await tr.feed(other("tool_call", session="B", toolCallId="b1"))
            await until(lambda: others(sent))  # B's tool call is out, A's thought still open
            assert not [m for m in sent if is_thought(m)]
            await tr.feed(thought(" its plan.", session="A"))
            await tr.feed({"jsonrpc": "2.0", "id": 7, "result": {"stopReason": "end_turn"}})
            await tr.feed(other("agent_message_chunk", session="B",
                                content={"type": "text", "text": "B again"}))
            await tr.drain()
    kinds = [(m["params"]["sessionId"], update_of(m)["sessionUpdate"])  # type: ignore[index]
             if "method" in m else "response" for m in sent]
    # The response (no session) waited for A's thoughts; B's message waited for the response.
    assert kinds[0] == ("B", "tool_call")
    assert kinds[-2:] == ["response", ("B", "agent_message_chunk")]
    assert set(kinds[1:-2]) == {("A", "agent_thought_chunk")}
    assert thought_parts(sent, output=True) == ["Session A thinks about its plan."]


# -- model and policy ----------------------------------------------------------------------


async def test_stream_options_carry_model_and_policy(sidecar: Server, llm_sidecar: Server,
                                                     fake_chat: FakeChat) -> None:
    trace = load_trace()[:40]
    out = await translate_all(llm_sidecar.url, trace, target="de",
                              stream_options={"model": "acp-model"})
    translated = [m for m in thinktrans_meta(out) if m["status"] == "translated"]
    assert translated and {m["model"] for m in translated} == {"acp-model"}
    assert {(r.json or {}).get("model") for r in fake_chat.chat_requests} == {"acp-model"}
    # Hidden: the English thoughts go out empty, their originals kept in _meta.
    out = await translate_all(sidecar.url, trace, stream_options={"policy": "hide"})
    assert_order_kept(trace, out)
    thoughts = [u for m in out if is_thought(m) and (u := update_of(m)) is not None]
    assert thoughts and {u["_meta"]["thinktrans"]["status"] for u in thoughts} == {"hidden"}
    assert all(u["content"]["text"] == "" and u["_meta"]["thinktrans"]["original"]
               for u in thoughts)


# -- the locales offered in the initialize answer ------------------------------------------

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": 1, "_meta": {"locale": "zh-CN"}}}
ANSWER = {"jsonrpc": "2.0", "id": 0,
          "result": {"protocolVersion": 1, "agentCapabilities": {"loadSession": True},
                     "_meta": {"vendor": {"build": 7}, "thinktrans": {"v": 1}}}}


def test_advertise_locales_is_pure() -> None:
    result = copy.deepcopy(ANSWER["result"])
    out = advertise_locales(result, ["zh-CN", "de"])
    assert result == ANSWER["result"]  # the input is left as it was
    assert out == {**result, "_meta": {"vendor": {"build": 7},
                                       "thinktrans": {"v": 1, "locales": ["zh-CN", "de"]}}}
    assert advertise_locales({"protocolVersion": 1}, ("en",)) == {
        "protocolVersion": 1, "_meta": {"thinktrans": {"locales": ["en"]}}}
    assert advertise_locales({"x": 1}, "de")["_meta"]["thinktrans"]["locales"] == ["de"]
    # None (any target) adds nothing; a _meta that is not an object is not ours to repair.
    assert advertise_locales(result, None) == result
    assert advertise_locales(result, None) is not result
    assert advertise_locales({"_meta": "x"}, ["de"]) == {"_meta": "x"}
    assert advertise_locales({"_meta": {"thinktrans": 3}}, ["de"]) == {
        "_meta": {"thinktrans": 3}}


def session_messages() -> list[dict[str, Any]]:
    return [copy.deepcopy(INITIALIZE), {"jsonrpc": "2.0", "id": 5, "result": {"other": 1}},
            copy.deepcopy(ANSWER), thought("Let me look at "), thought("the parser first."),
            other("tool_call", toolCallId="t1", title="Read", status="pending")]


@pytest.mark.parametrize(("options", "expected"), [
    ({}, ["zh-CN", "de"]),
    ({"allowed": ("zh",)}, ["zh-CN"]),  # what the translator admits of the sidecar's
    ({"target": "de"}, ["de"]),  # a fixed target: the client's locale is not used
    ({"target": "ja"}, None),  # a target the sidecar refuses: nothing worth offering
    ({"advertise_locales": False}, None),
])
async def test_initialize_answer_offers_the_sidecars_locales(
        allowed_sidecar: Server, options: dict[str, Any], expected: list[str] | None) -> None:
    messages = session_messages()
    out = await translate_all(allowed_sidecar.url, messages, **options)
    assert thought_parts(out, output=True) == thought_parts(messages, output=False)
    rest = others(out)
    answer = rest[2]
    assert rest[:2] == messages[:2] and rest[3:] == others(messages)[3:]  # only it changed
    if expected is None:
        assert answer == ANSWER
    else:
        assert answer == {**ANSWER, "result": advertise_locales(ANSWER["result"], expected)}
        assert answer["result"]["_meta"]["vendor"] == {"build": 7}


async def test_any_target_adds_nothing(sidecar: Server) -> None:
    out = await translate_all(sidecar.url, session_messages())
    assert others(out)[2] == ANSWER  # passthrough takes any target


@pytest.mark.parametrize("fault", ["down", "hung", "500"])
async def test_initialize_answer_untouched_when_the_sidecar_does_not_say(
        fault: str, caplog: pytest.LogCaptureFixture) -> None:
    messages = session_messages()
    started = asyncio.get_running_loop().time()
    if fault == "down":
        out = await translate_all(closed_port_url(), messages, timeout_s=0.3)
    else:
        async with RawServer(never_answer if fault == "hung" else answer_500) as url:
            out = await translate_all(url, messages, timeout_s=0.3)
    assert asyncio.get_running_loop().time() - started < 2.0  # bounded by timeout_s
    assert others(out) == others(messages)
    assert thought_parts(out, output=True) == thought_parts(messages, output=False)
    [line] = [r.getMessage() for r in caplog.records if "without locales" in r.getMessage()]
    assert "parser" not in line and "Let me" not in line


# -- a sidecar that is down, hung or failing -----------------------------------------------


@pytest.mark.parametrize("fault", ["down", "hung", "500"])
async def test_broken_sidecar_passes_thoughts_through(fault: str) -> None:
    trace = load_trace()
    if fault == "down":
        out = await translate_all(closed_port_url(), trace)
    else:
        async with RawServer(never_answer if fault == "hung" else answer_500) as url:
            out = await translate_all(url, trace, timeout_s=0.3)
    assert_order_kept(trace, out)
    metas = thinktrans_meta(out)
    assert {m["status"] for m in metas} == {"error"}
    assert all(m["error"].startswith("sidecar:") for m in metas)
    for message in out:
        update = update_of(message)
        if is_thought(message) and update is not None:
            assert update["content"]["text"] == update["_meta"]["thinktrans"]["original"]


# -- the bridge ----------------------------------------------------------------------------


async def run_bridge(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(BRIDGE), *args, cwd=ROOT,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as a user runs it
    )


async def test_bridge_on_the_shipped_trace(llm_sidecar: Server, fake_chat: FakeChat) -> None:
    proc = await run_bridge("--url", llm_sidecar.url)
    stdout, stderr = await asyncio.wait_for(proc.communicate(TRACE.read_bytes()), 30)
    assert proc.returncode == 0, stderr.decode()
    out = [json.loads(line) for line in stdout.decode().splitlines()]
    trace = load_trace()
    assert_order_kept(trace, out)
    metas = thinktrans_meta(out)
    assert {m["target"] for m in metas} == {"zh-CN"}
    assert sum(m["status"] == "translated" for m in metas) >= 6
    assert len(out) < len(trace)  # deltas came back as whole sentences


async def test_bridge_survives_the_sidecar_dying_mid_stream() -> None:
    lines = TRACE.read_text().splitlines()
    first_tool = next(i for i, line in enumerate(lines) if '"tool_call"' in line)
    with served() as server:
        proc = await run_bridge("--url", server.url, "--timeout", "0.5")
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n".join(lines[: first_tool + 1]).encode() + b"\n")
        await proc.stdin.drain()
        got: list[dict[str, Any]] = []
        while not any(update_of(m) and update_of(m)["sessionUpdate"] == "tool_call"  # type: ignore[index]
                      for m in got):
            got.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 10)))
        server.proc.kill()
        for line in lines[first_tool + 1:]:
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            await asyncio.sleep(0.001)
        proc.stdin.write(b"this line is not JSON\n")
        proc.stdin.close()
        rest, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, stderr.decode()
    tail = rest.decode().splitlines()
    assert tail[-1] == "this line is not JSON"
    out = got + [json.loads(line) for line in tail[:-1]]
    trace = [json.loads(line) for line in lines]
    assert_order_kept(trace, out)
    first, second = (thinktrans_meta(out[: len(got)]), thinktrans_meta(out[len(got):]))
    assert {m["status"] for m in first} == {"translated"}
    assert {m["status"] for m in second} == {"error"}  # passed through, nothing lost
    assert b"Let me read" not in stderr  # no thinking text in its logs


async def test_bridge_refuses_a_bad_target() -> None:
    proc = await run_bridge("--url", closed_port_url(), "--target", "zh_CN")
    _, stderr = await asyncio.wait_for(proc.communicate(b""), 10)
    assert proc.returncode == 2
    assert stderr.decode().count("\n") == 1 and "use '-', not '_'" in stderr.decode()


def test_stream_ids_are_valid() -> None:
    sessions = ("sess_7f3c2a", "a b/c", "a_b/c", "会话", "x" * 500, "x" * 501, "")
    ids = [safe_stream_id(session, "ab12cd.3") for session in sessions]
    assert ids[0] == "sess_7f3c2a:ab12cd.3"
    assert all(STREAM_ID.match(i) for i in ids) and len(set(ids)) == len(ids)
