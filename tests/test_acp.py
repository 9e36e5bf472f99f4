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
                        timeout_s: float = 30.0, stall_s: float = 10.0, **options: Any
                        ) -> list[Any]:
    """Every message through the client; its timeout only stops a hang unless a test sets
    it (a loaded machine's sidecar may be slow to answer)."""
    async with ThinktransClient(url, timeout_s=timeout_s, stall_s=stall_s) as client:
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
            await asyncio.wait_for(changed.wait(), 60)

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
    # Bounded by timeout_s (0.3 s a call), not by the stall budget (ten minutes here).
    async with asyncio.timeout(120):
        if fault == "down":
            out = await translate_all(closed_port_url(), messages, timeout_s=0.3, stall_s=600)
        else:
            async with RawServer(never_answer if fault == "hung" else answer_500) as url:
                out = await translate_all(url, messages, timeout_s=0.3, stall_s=600)
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
    stdout, stderr = await asyncio.wait_for(proc.communicate(TRACE.read_bytes()), 60)
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
            got.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)))
        server.proc.kill()
        for line in lines[first_tool + 1:]:
            proc.stdin.write(line.encode() + b"\n")
            await proc.stdin.drain()
            await asyncio.sleep(0.001)
        proc.stdin.write(b"this line is not JSON\n")
        proc.stdin.close()
        rest, stderr = await asyncio.wait_for(proc.communicate(), 60)
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
    _, stderr = await asyncio.wait_for(proc.communicate(b""), 60)
    assert proc.returncode == 2
    assert stderr.decode().count("\n") == 1 and "use '-', not '_'" in stderr.decode()


def _imports_the_client(path: Path) -> bool:
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(name.split(".")[0] == "thinktrans_client" for name in names):
            return True
    return False


EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if _imports_the_client(p))


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_an_example_run_without_the_client_says_what_to_install(example: Path,
                                                                tmp_path: Path) -> None:
    """A Python without the client's dependencies (``-S``: no site-packages, so no httpx):
    one line that says what to install, and a non-zero exit; no traceback."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    out = subprocess.run([sys.executable, "-S", str(example), "--url", "http://127.0.0.1:9"],
                         cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "pip install" in out.stderr and "thinktrans-client" in out.stderr


def test_stream_ids_are_valid() -> None:
    sessions = ("sess_7f3c2a", "a b/c", "a_b/c", "会话", "x" * 500, "x" * 501, "")
    ids = [safe_stream_id(session, "ab12cd.3") for session in sessions]
    assert ids[0] == "sess_7f3c2a:ab12cd.3"
    assert all(STREAM_ID.match(i) for i in ids) and len(set(ids)) == len(ids)


# -- what the client sends: observe --------------------------------------------------------


@pytest.fixture(scope="module")
def slow_flush_sidecar() -> Iterator[Server]:
    """Passthrough; a segment without a sentence end waits 30 s, or for its stream's close."""
    with served(THINKTRANS_FLUSH_IDLE_MS="30000") as server:
        yield server


def request(id_: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def answer(id_: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": result}


class Collected:
    """A translator's output, with a wait for what should arrive."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.changed = asyncio.Event()

    async def send(self, message: Any) -> None:
        self.messages.append(message)
        self.changed.set()

    def originals(self, session: str) -> str:
        return "".join(update["_meta"]["thinktrans"]["original"] for m in self.messages
                       if is_thought(m) and m["params"]["sessionId"] == session
                       and (update := update_of(m)) is not None)

    async def until(self, check: Any, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not check():
                self.changed.clear()
                await self.changed.wait()


async def test_cancel_and_the_end_of_a_turn_close_only_their_sessions_parts(
        slow_flush_sidecar: Server) -> None:
    out = Collected()
    async with ThinktransClient(slow_flush_sidecar.url, timeout_s=30) as client:
        translator = ThoughtTranslator(client, out.send, target="de")
        for id_, session in ((1, "a"), (2, "b"), (3, "c")):
            await translator.observe(request(id_, "session/prompt", {
                "sessionId": session, "prompt": [{"type": "text", "text": "go"}]}))
            await translator.feed(thought(f"thinking in {session}, no end yet", session))
        await translator.observe({"jsonrpc": "2.0", "method": "session/cancel",
                                  "params": {"sessionId": "a"}})
        await out.until(lambda: out.originals("a") == "thinking in a, no end yet")
        assert out.originals("b") == out.originals("c") == ""  # still open: not cut short
        await translator.feed(answer(2, {"stopReason": "end_turn"}))  # b's turn ends
        await out.until(lambda: any(m.get("id") == 2 for m in out.messages))
        assert out.originals("b") == "thinking in b, no end yet"
        assert out.originals("c") == ""  # an answer of b's request does not close c's part
        await translator.aclose()
    assert out.originals("c") == "thinking in c, no end yet"


async def test_a_new_message_id_starts_a_new_part(sidecar: Server) -> None:
    def chunk(text: str, message_id: str | None) -> dict[str, Any]:
        message = thought(text)
        if message_id is not None:
            message["params"]["update"]["messageId"] = message_id
        return message

    messages = [chunk("First thought", "m1"), chunk(" goes on", "m1"), chunk(" still", None),
                chunk("Second thought", "m2"), chunk(" ends.", "m2")]
    out = await translate_all(sidecar.url, messages, target="de")
    parts: dict[str, str] = {}
    for message in out:
        update = update_of(message)
        assert update is not None
        key = update["messageId"]
        parts[key] = parts.get(key, "") + update["_meta"]["thinktrans"]["original"]
    assert parts == {"m1": "First thought goes on still", "m2": "Second thought ends."}


async def test_the_session_locale_comes_before_the_clients(allowed_sidecar: Server,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    out = Collected()
    async with ThinktransClient(allowed_sidecar.url, timeout_s=30) as client:
        translator = ThoughtTranslator(client, out.send)
        await translator.observe(request(0, "initialize", {
            "protocolVersion": 1, "_meta": {"locale": "zh-CN"}}))
        await translator.feed(answer(0, {"protocolVersion": 1}))
        await translator.drain()  # a client waits for this answer (with the locales)
        await translator.observe(request(1, "session/new", {
            "cwd": "/", "mcpServers": [], "_meta": {"locale": "de-AT"}}))
        await translator.feed(answer(1, {"sessionId": "s-de"}))
        await translator.observe(request("2", "session/fork", {"sessionId": "s-de", "cwd": "/"}))
        await translator.feed(answer("2", {"sessionId": "s-fork"}))
        await translator.observe(request(3, "session/load", {
            "sessionId": "s-bad", "cwd": "/", "mcpServers": [],
            "_meta": {"locale": "de_DE\u202e"}}))
        await translator.feed(answer(3, {}))
        await translator.observe(request(4, "session/new", {
            "cwd": "/", "mcpServers": [], "_meta": {"locale": "fr"}}))  # not offered
        await translator.feed(answer(4, {"sessionId": "s-fr"}))
        for session in ("s-de", "s-fork", "s-bad", "s-fr", "s-other"):
            await translator.feed(thought(f"Thinking in {session}.", session))
        await translator.aclose()
    targets = {m["params"]["sessionId"]: update["_meta"]["thinktrans"]["target"]
               for m in out.messages if is_thought(m) and (update := update_of(m)) is not None}
    # The sidecar allows de and zh-CN: de-AT is served by its German.
    assert targets == {"s-de": "de-AT", "s-fork": "de-AT", "s-bad": "zh-CN", "s-fr": "zh-CN",
                       "s-other": "zh-CN"}
    logged = [r.getMessage() for r in caplog.records]
    assert any("locale fr is not among the sidecar's targets" in line for line in logged)
    assert not any("de_DE" in line for line in logged)


async def test_a_locale_the_sidecar_refuses_is_passed_over(sidecar: Server,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    """``zz`` is well formed, so the client sends it; the sidecar refuses it (422). That part
    passes through; the next ones use the next choice (here the user's text)."""
    out = Collected()
    async with ThinktransClient(sidecar.url, timeout_s=30) as client:
        translator = ThoughtTranslator(client, out.send, advertise_locales=False)
        await translator.observe(request(0, "initialize", {
            "protocolVersion": 1, "_meta": {"locale": "zz"}}))
        await translator.observe(request(1, "session/prompt", {
            "sessionId": SESSION, "prompt": [{"type": "text", "text": "请解释一下这个错误"}]}))
        await translator.feed(thought("First part."))
        await translator.feed(other("agent_message_chunk"))
        await translator.drain()
        await translator.feed(thought("Second part."))
        await translator.aclose()
    metas = thinktrans_meta(out.messages)
    assert [m["status"] for m in metas] == ["error", "translated"]
    assert metas[1]["target"] == "zh-Hans"
    assert sum("locale zz was refused by the sidecar" in r.getMessage()
               for r in caplog.records) == 1


async def test_the_agents_request_ids_are_not_the_clients(slow_flush_sidecar: Server) -> None:
    """Both sides number their requests from 0: the agent's permission request 3 in session
    b must not take the place of the client's prompt 3 of session a."""
    out = Collected()
    async with ThinktransClient(slow_flush_sidecar.url, timeout_s=30) as client:
        translator = ThoughtTranslator(client, out.send, target="de")
        await translator.observe(request(3, "session/prompt", {
            "sessionId": "a", "prompt": [{"type": "text", "text": "go"}]}))
        await translator.feed(thought("thinking in a, no end yet", "a"))
        await translator.feed(request(3, "session/request_permission", {
            "sessionId": "b", "toolCall": {"toolCallId": "t"}, "options": []}))
        await translator.feed(answer(3, {"stopReason": "end_turn"}))  # a's turn ends
        await out.until(lambda: any(m.get("result") for m in out.messages))
        await translator.aclose()
    kinds = ["thought" if is_thought(m) else m.get("method", "answer") for m in out.messages]
    assert kinds.index("thought") < kinds.index("answer")
    assert out.originals("a") == "thinking in a, no end yet"


async def test_an_empty_thought_chunk_goes_out_as_it_is(sidecar: Server) -> None:
    messages = [thought("Let me see. "), thought(""), thought("It works.")]
    out = await translate_all(sidecar.url, messages, target="de")
    assert messages[1] in out
    assert thought_parts([m for m in out if m != messages[1]], output=True) == [
        "Let me see. It works."]


async def test_feed_waits_for_room_when_the_client_does_not_read(sidecar: Server) -> None:
    gate = asyncio.Event()
    sending = asyncio.Event()
    sent: list[Any] = []
    fed = 0

    async def slow_send(message: Any) -> None:
        sending.set()
        await gate.wait()
        sent.append(message)

    async with ThinktransClient(sidecar.url, timeout_s=30) as client:
        translator = ThoughtTranslator(client, slow_send, max_pending=4)

        async def feed_all() -> None:
            nonlocal fed
            for i in range(10):
                await translator.feed(other("tool_call", toolCallId=str(i)))
                fed += 1

        feeding = asyncio.ensure_future(feed_all())
        await asyncio.wait_for(sending.wait(), 60)
        for _ in range(100):  # turns of the loop: without the bound, every feed would return
            await asyncio.sleep(0)
        assert not feeding.done()
        assert fed == 4  # max_pending, the one in send among them: the rest wait for room
        gate.set()
        await asyncio.wait_for(feeding, 60)
        await translator.aclose()
    assert [m["params"]["update"]["toolCallId"] for m in sent] == [str(i) for i in range(10)]


async def test_room_is_made_when_open_parts_hold_the_rest() -> None:
    """Sub-agent thoughts queue behind the main agent's open part, with the sidecar down:
    waiting for room closes the open parts instead of waiting for a message that would."""
    main = thought("Main thinking starts. ")
    subs = [thought(f"sub thought {i}. ", meta={"claudeCode": {"parentToolUseId": "t1"}})
            for i in range(20)]
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async with ThinktransClient(closed_port_url(), timeout_s=0.3) as client:
        translator = ThoughtTranslator(client, send, max_pending=4)
        async with asyncio.timeout(60):
            for message in [main, *subs, thought("", meta={"x": 1})]:
                await translator.feed(message)
            await translator.aclose()
    originals = "".join(update["_meta"]["thinktrans"]["original"] for m in sent
                        if (update := update_of(m)) is not None and "thinktrans" in
                        update.get("_meta", {}))
    assert originals == "Main thinking starts. " + "".join(f"sub thought {i}. "
                                                            for i in range(20))


async def test_a_thought_sent_as_a_request_keeps_its_id_to_itself(sidecar: Server) -> None:
    """ACP sends thoughts as notifications; one that comes as a request (with an ``id``)
    expects one answer, to that message. It goes out once, as it came, in its place (it
    ends the session's open part, as any other message does); no translated chunk carries
    its ``id``, and the parts around it are translated as usual."""

    def asked(id_: Any, text: str) -> dict[str, Any]:
        return {**thought(text), "id": id_}

    messages = [asked(3, "First I read the test. "), thought("Then the code. "),
                thought("Then I run it."), asked("r9", "Now the logs. "),
                thought("They say it timed out."), other("tool_call", toolCallId="c1")]
    out = await translate_all(sidecar.url, messages, target="de")
    with_ids = [m for m in out if "id" in m]
    assert with_ids == [messages[0], messages[3]]  # each once, unchanged
    at = [out.index(m) for m in with_ids]
    translated = [m for m in out if "id" not in m and is_thought(m)]
    assert all("thinktrans" in update_of(m)["_meta"] for m in translated)  # type: ignore[index]
    originals = "".join(update_of(m)["_meta"]["thinktrans"]["original"]  # type: ignore[index]
                        for m in out[at[0] + 1: at[1]])
    assert originals == "Then the code. Then I run it."
    assert out[at[1] + 1:][-1] == messages[-1]
    assert "".join(update_of(m)["_meta"]["thinktrans"]["original"]  # type: ignore[index]
                   for m in out[at[1] + 1: -1]) == "They say it timed out."
