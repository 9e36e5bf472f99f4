"""Fuzzing: bad input gets a 4xx problem that says what is wrong, never a 5xx or a hang.

Four layers, each bounded for CI and made longer with ``THINKTRANS_FUZZ_EXAMPLES``
(docs/reliability.md):

- schemathesis reads the service's own OpenAPI document and sends schema-valid and
  schema-violating requests to every operation, statelessly and as stateful workflows
  (open -> chunks -> close -> events -> delete, linked by the stream id);
- hypothesis sends what a schema cannot describe: raw bytes (invalid UTF-8, broken JSON),
  odd header bytes, control and bidi characters in ids and locales;
- a hypothesis state machine abuses one stream's seqs (negative, huge, gaps, the same seq
  with other text, chunks after close) against a model of what the contract promises;
- the segmenter's cut must not depend on how the text was chunked, at any size bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

pytest.importorskip("schemathesis", reason="needs the dev extra: pip install 'thinktrans[dev]'")

import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    status_code_conformance,
)

from service.http.app import create_app
from service.text.segmenter import Piece
from tests.configs import segment, segmenter
from tests.conftest import Running, make_settings, start_app

PROBLEM = "application/problem+json"
FUZZ_EXAMPLES = int(os.environ.get("THINKTRANS_FUZZ_EXAMPLES", "25"))
REQUEST_TIMEOUT_S = 5.0
SLOW_ANSWER_S = 60.0  # a hang guard: long-polls wait 50 ms here, so any answer is far quicker
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                suppress_health_check=list(HealthCheck))


def fuzz_settings(**overrides: Any) -> Any:
    """The fuzzed app: passthrough, short long-polls and deadlines, small limits."""
    base: dict[str, Any] = {
        "default_locale": "zh-CN", "max_wait_poll_ms": 50, "deadline_ms": 500,
        "flush_idle_ms": 100, "max_texts": 16, "max_chunks_per_request": 64,
        "max_request_bytes": 65_536, "max_streams": 64,
        # schemathesis calls an app in-process as "testserver", a name the server must allow.
        "allowed_hosts": ["testserver"],
    }
    return make_settings(**{**base, **overrides})


# -- schemathesis: every operation of the OpenAPI document -----------------------------------


def problem_details(ctx: Any, response: Any, case: Any) -> None:
    """Every error is an RFC 9457 problem whose status matches and whose detail says why."""
    if response.status_code < 400:
        return
    ctype = (response.headers.get("content-type") or [""])[0]
    assert ctype.startswith(PROBLEM), f"{response.status_code} answered as {ctype!r}"
    body = response.json()
    assert body["status"] == response.status_code, body
    assert body["title"] and body["type"], body
    assert isinstance(body["detail"], str) and body["detail"].strip(), body


def answers_in_time(ctx: Any, response: Any, case: Any) -> None:
    """No hang: the fuzz app caps long-polls at 50 ms, so every answer is quick.

    An SSE read of a stream that is not closed stays open by design (heartbeats until
    the stream ends or expires); schemathesis cuts it at the request timeout.
    """
    ctype = (response.headers.get("content-type") or [""])[0]
    if ctype.startswith("text/event-stream"):
        return
    assert response.elapsed < SLOW_ANSWER_S, f"took {response.elapsed:.1f} s"


CHECKS = [not_a_server_error, problem_details, answers_in_time]


# The operations come from a throwaway app's document (building an app runs nothing);
# each test sends its cases to a fresh app of its own, whose lifespan schemathesis starts
# at the first request and ends with the test. (schemathesis.pytest.from_fixture would be
# the lazy way, but it reaches into pytest internals that pytest 9 no longer has.)
schema = schemathesis.openapi.from_dict(create_app(make_settings()).openapi())


@pytest.fixture
def fuzz_app() -> Any:
    return create_app(fuzz_settings())


@schema.parametrize()
@FUZZ
def test_every_operation_answers_any_input_without_a_5xx(case: Any, fuzz_app: Any) -> None:
    case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S, app=fuzz_app)


def test_stream_workflows_answer_without_a_5xx(fuzz_app: Any) -> None:
    """Stateful: schemathesis links POST /v1/streams to the routes that take its stream_id."""
    workflow = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app).as_state_machine()
    # Stream ids come from the open (POST /v1/streams) or from the list (GET /v1/streams).
    linked = [name for name in dir(workflow)
              if name.startswith(("POST_v1_streams___201", "GET_v1_streams___200"))]
    targets = {"chunks", "close", "events", "stream_id_"}  # ..._stream_id_: the DELETE
    assert {t for t in targets if any(name.endswith(t) for name in linked)} == targets, linked

    answered: set[tuple[str, int]] = set()

    class Workflow(workflow):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # Each scenario starts with no streams: a stream id opened by an earlier one
            # would answer 200, not 201, and change which rules hypothesis may draw.
            delete = self.schema["/v1/streams/{stream_id}"]["DELETE"]
            runtime = getattr(fuzz_app.state, "runtime", None)  # None before the lifespan
            manager = runtime.streams if runtime is not None else None
            for sid in list(manager.streams if manager is not None else ()):
                delete.Case(path_parameters={"stream_id": sid}).call(timeout=REQUEST_TIMEOUT_S)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"timeout": REQUEST_TIMEOUT_S}

        def after_call(self, response: Any, case: Any) -> None:
            super().after_call(response, case)
            answered.add((case.operation.label, response.status_code))

        def validate_response(self, response: Any, case: Any,
                              additional_checks: Any = None, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    Workflow.run(settings=settings(
        max_examples=max(5, FUZZ_EXAMPLES // 2), stateful_step_count=8, deadline=None,
        suppress_health_check=list(HealthCheck)))
    # The workflows reached streams that exist (a 2xx past the open), not only 404s.
    reached = [(op, status) for op, status in answered
               if op != "POST /v1/streams" and 200 <= status < 300]
    assert reached, sorted(answered)


@pytest.fixture
def small_app_schema() -> Any:
    app = create_app(fuzz_settings(max_streams=1, max_events_retained=16))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def test_the_openapi_document_describes_the_errors_the_service_answers(
    small_app_schema: Any,
) -> None:
    """A client generated from /openapi.json must know the problem responses it will get.

    Every /v1 error is application/problem+json, and the stream routes answer 404, 409
    and 429 (API.md); the document must say so, or generated clients mis-read them.
    """
    schema = small_app_schema
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("/v1/translate", "POST", {"body": {"texts": []}}),  # 422
        ("/v1/streams", "POST", {"body": {"stream_id": "one"}}),  # 201: max_streams is 1
        ("/v1/streams", "POST", {"body": {"stream_id": "two"}}),  # 429
        ("/v1/streams/{stream_id}/chunks", "POST",
         {"path_parameters": {"stream_id": "one"},
          "body": {"chunks": [{"seq": 0, "text": "Hello. "}]}}),  # 200
        ("/v1/streams/{stream_id}/chunks", "POST",
         {"path_parameters": {"stream_id": "one"},
          "body": {"chunks": [{"seq": 0, "text": "Other. "}]}}),  # 409
        ("/v1/streams/{stream_id}/close", "POST", {"path_parameters": {"stream_id": "nope"}}),
        ("/v1/streams/{stream_id}/events", "GET", {"path_parameters": {"stream_id": "nope"}}),
        ("/v1/streams/{stream_id}", "DELETE", {"path_parameters": {"stream_id": "nope"}}),
    ]
    mismatches = []
    for path, method, fields in calls:
        case = schema[path][method].Case(**fields)
        response = case.call(timeout=REQUEST_TIMEOUT_S)
        for check in (status_code_conformance, content_type_conformance):
            try:
                case.validate_response(response, checks=[check])
            except FailureGroup as group:
                for failure in group.exceptions:
                    mismatches.append(f"{method} {path} -> {response.status_code}: "
                                      f"{failure.title}")
    assert not mismatches, "the document does not describe:\n" + "\n".join(mismatches)


# -- hypothesis over raw HTTP: bytes, headers, ids and locales ---------------------------------


class _AppRunner:
    """One app, its lifespan running in one event loop, driven from sync hypothesis code."""

    def __init__(self, **overrides: Any) -> None:
        self.runner = asyncio.Runner()
        self._gen = start_app(fuzz_settings(**overrides))
        self.running: Running = self.runner.run(anext(self._gen))
        transport = httpx.ASGITransport(app=self.running.app, raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1")

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            return await asyncio.wait_for(self.client.request(method, url, **kwargs),
                                          REQUEST_TIMEOUT_S)
        return self.runner.run(send())

    def close(self) -> None:
        self.runner.run(self.client.aclose())
        self.runner.run(self._gen.aclose())
        self.runner.close()


@pytest.fixture
def sync_app() -> Iterator[_AppRunner]:
    app = _AppRunner()
    try:
        yield app
    finally:
        app.close()


def assert_4xx_problem_or_success(resp: httpx.Response, *, where: str = "") -> None:
    assert resp.status_code < 500, (where, resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        assert resp.headers["content-type"].startswith(PROBLEM), (where, resp.headers)
        body = resp.json()
        assert body["status"] == resp.status_code and body["detail"].strip(), body


POST_ROUTES = ["/v1/translate", "/v1/detect", "/v1/streams", "/v1/streams/f1/chunks",
               "/v1/streams/f1/close"]
_VALID_BODIES = [
    b'{"texts": ["Hello there, my friend. How are you?"], "target": "de"}',
    b'{"stream_id": "f1", "target": "zh-CN", "user_text": "Hallo"}',
    b'{"chunks": [{"seq": 0, "text": "Hmm, "}, {"seq": 1, "text": "let me think."}]}',
]


@st.composite
def mutated_json(draw: st.DrawFn) -> bytes:
    """A valid body with a few bytes replaced, inserted or cut: broken UTF-8 and JSON."""
    body = bytearray(draw(st.sampled_from(_VALID_BODIES)))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(body)))
        action = draw(st.sampled_from(["replace", "insert", "cut"]))
        byte = draw(st.sampled_from([0x00, 0x22, 0x5C, 0x7B, 0x80, 0xC3, 0xED, 0xFE, 0xFF]))
        if action == "replace" and pos < len(body):
            body[pos] = byte
        elif action == "insert":
            body[pos:pos] = bytes([byte])
        else:
            del body[pos:]
    return bytes(body)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
BODIES = st.one_of(
    st.binary(max_size=256),
    mutated_json(),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"texts": _JSON, "target": _JSON}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"chunks": st.lists(st.fixed_dictionaries(
        {"seq": _JSON, "text": _JSON}), max_size=3)}).map(lambda v: json.dumps(v).encode()),
)


@example(route="/v1/translate", body=b'{"texts": ["\xff\xfe"]}', ctype="application/json")
@example(route="/v1/streams/f1/chunks", body=b'{"chunks": [{"seq": 0, "text": "\\ud800"}]}',
         ctype="application/json")
@example(route="/v1/streams", body=b"", ctype=None)
@given(route=st.sampled_from(POST_ROUTES), body=BODIES,
       ctype=st.sampled_from(["application/json", None, "text/plain", "application/x-ndjson"]))
@FUZZ
def test_any_bytes_to_any_post_route_get_a_4xx_problem_or_success(
    sync_app: _AppRunner, route: str, body: bytes, ctype: str | None
) -> None:
    headers = {"content-type": ctype} if ctype else {}
    resp = sync_app.request("POST", route, content=body, headers=headers)
    assert_4xx_problem_or_success(resp, where=f"{route} {body[:60]!r}")
    assert sync_app.request("GET", "/healthz").status_code == 200


# Bytes a proxy may pass in a header value: printable ASCII and latin-1, never CR, LF or NUL.
HEADER_BYTES = st.binary(max_size=24).map(
    lambda b: bytes(c for c in b if c == 0x09 or 0x20 <= c <= 0x7E or c >= 0xA0))


@example(value=b"\xb2")  # "²": str.isdigit() says yes, int() says no
@example(value=b"--5")  # lstrip("-") leaves digits, int() refuses the two signs
@example(value=b"9" * 5000)  # past Python's 4300-digit limit for int(str)
@example(value=b"-1")
@given(value=HEADER_BYTES | st.integers(-(2**70), 2**70).map(lambda n: str(n).encode()))
@FUZZ
def test_any_last_event_id_gets_events_or_a_422_or_409_problem(sync_app: _AppRunner,
                                                               value: bytes) -> None:
    # Closed, so that an SSE read ends after the last event instead of waiting for more.
    sync_app.request("POST", "/v1/streams/h1/chunks",
                     json={"chunks": [{"seq": 0, "text": "Hello there. Bye."}]})
    sync_app.request("POST", "/v1/streams/h1/close")
    for accept in ("application/json", "text/event-stream"):
        resp = sync_app.request("GET", "/v1/streams/h1/events",
                                headers={"Last-Event-ID": value, "Accept": accept})
        assert_4xx_problem_or_success(resp, where=f"Last-Event-ID {value[:40]!r}")
        if resp.status_code >= 400:
            assert resp.status_code in (409, 422) and "Last-Event-ID" in resp.json()["detail"]
        if resp.status_code == 409:  # an id past the stream's last event (2: two segments, end)
            assert resp.json()["last_event_id"] == 2 and int(value.decode().strip()) > 2


def _has_unsafe(text: str) -> bool:
    return any(unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp", "Cs"} for ch in text)


UNSAFE_CHARS = st.sampled_from(["\u0000", "\u0007", "\n", "\r", "\u200e", "\u200f", "\u202a",
                                "\u202e", "\u2066", "\u2069", "\ufeff", "\u2028", "\u00ad"])
LOCALE_TEXT = st.one_of(
    st.text(max_size=20),
    st.tuples(st.sampled_from(["zh-CN", "en", "pt-BR", "de", "zh-Hant-TW"]), UNSAFE_CHARS,
              st.integers(0, 5)).map(lambda t: t[0][:t[2]] + t[1] + t[0][t[2]:]),
)


@example(target="en\u202e")
@example(target="zh\u0000-CN")
@example(target="ZH-cn")
@given(target=LOCALE_TEXT)
@FUZZ
def test_control_and_bidi_characters_in_a_locale_are_a_422_problem(sync_app: _AppRunner,
                                                                  target: str) -> None:
    resp = sync_app.request("POST", "/v1/translate", json={"texts": ["Hello."], "target": target})
    assert_4xx_problem_or_success(resp, where=repr(target))
    if _has_unsafe(target):
        assert resp.status_code == 422, (target, resp.text)
    if resp.status_code == 200:
        canonical = resp.json()["results"][0]["segments"][0]["target"]
        assert canonical and not _has_unsafe(canonical) and " " not in canonical
    opened = sync_app.request("POST", "/v1/streams", json={"stream_id": "loc", "target": target})
    assert_4xx_problem_or_success(opened, where=repr(target))
    if _has_unsafe(target):
        assert opened.status_code == 422
    if opened.status_code in (200, 201):
        sync_app.request("DELETE", "/v1/streams/loc")


STREAM_ID_TEXT = st.one_of(
    st.text(max_size=40),
    st.tuples(st.from_regex(r"[A-Za-z0-9._:-]{1,20}", fullmatch=True), UNSAFE_CHARS).map("".join),
)


@example(sid="a\u202eb")
@example(sid="/")  # its path is "/v1/streams//": answered 404, never redirected
@example(sid="x" * 129)
@given(sid=STREAM_ID_TEXT)
@FUZZ
def test_a_stream_id_outside_its_alphabet_is_a_422_problem_on_every_route(
    sync_app: _AppRunner, sid: str
) -> None:
    valid = 1 <= len(sid) <= 128 and all(
        ch.isascii() and (ch.isalnum() or ch in "._:-") for ch in sid)
    opened = sync_app.request("POST", "/v1/streams", json={"stream_id": sid})
    assert_4xx_problem_or_success(opened, where=repr(sid))
    assert (opened.status_code in (200, 201)) == valid, (sid, opened.text)
    if sid in (".", ".."):  # dot segments are not path segments a client can send as-is
        sync_app.running.app.state.runtime.streams.delete(sid)
        return
    path = quote(sid, safe="")
    for method, url, body in [
        ("POST", f"/v1/streams/{path}/chunks", {"chunks": [{"seq": 0, "text": "Hi. "}]}),
        ("GET", f"/v1/streams/{path}/events", None),
        ("POST", f"/v1/streams/{path}/close", None),
        ("DELETE", f"/v1/streams/{path}", None),
    ]:
        resp = sync_app.request(method, url, json=body)
        assert_4xx_problem_or_success(resp, where=f"{method} {sid!r}")
        if not valid and sid:
            assert resp.status_code in (404, 405, 422), (method, sid, resp.status_code)
    assert sync_app.running.app.state.runtime.streams.streams == {}  # deleted, or never opened


@pytest.mark.parametrize("value", [True, False, "1", "0"], ids=["true", "false", "str1", "str0"])
def test_a_seq_must_be_a_json_integer(sync_app: _AppRunner, value: object) -> None:
    """The schema says integer; `true` must not be read as seq 1, nor "0" as seq 0."""
    resp = sync_app.request("POST", "/v1/streams/strict/chunks",
                            json={"chunks": [{"seq": value, "text": "Hello. "}]})
    assert resp.status_code == 422, resp.text
    assert "seq" in resp.json()["detail"]


@pytest.mark.parametrize(
    ("route", "body", "words"),
    [
        ("/v1/translate", {"texts": ["a"] * 17}, ["17 texts", "THINKTRANS_MAX_TEXTS=16"]),
        ("/v1/detect", {"texts": ["a"] * 17}, ["THINKTRANS_MAX_TEXTS"]),
        ("/v1/streams/big/chunks", {"chunks": [{"seq": i, "text": "a"} for i in range(65)]},
         ["65 chunks", "THINKTRANS_MAX_CHUNKS_PER_REQUEST"]),
        ("/v1/translate", {"texts": ["word " * 20_000]}, ["THINKTRANS_MAX_REQUEST_BYTES"]),
        ("/v1/streams/big/chunks", {"chunks": [{"seq": 0, "text": "a" * 70_000}]},
         ["THINKTRANS_MAX_REQUEST_BYTES"]),
    ],
    ids=["texts", "detect-texts", "chunks", "body", "chunk-body"],
)
def test_huge_counts_and_bodies_get_413_naming_the_limit(
    sync_app: _AppRunner, route: str, body: dict[str, Any], words: list[str]
) -> None:
    resp = sync_app.request("POST", route, json=body)
    assert resp.status_code == 413, resp.text
    assert resp.headers["content-type"].startswith(PROBLEM)
    for word in words:
        assert word in resp.json()["detail"]
    assert "big" not in sync_app.running.app.state.runtime.streams.streams  # nothing was accepted


# -- the stream state machine under seq abuse ---------------------------------------------------

HUGE_SEQ = 2**53
MAX_GAP = 4
WORDS = ["Hmm, ", "let me ", "think. ", "OK.", "\n", "我们", "来看看。", "`x = 1` ", "Done! ", ""]


class StreamModel(RuleBasedStateMachine):
    """One stream id, driven through every route, checked against the contract's model.

    The model tracks the seqs accepted in order, those held past a gap, and whether the
    stream is open, closed or gone; each answer must be the one the contract gives, and
    whatever happened, the originals out so far must be a prefix of the accepted text,
    and all of it once the stream is closed.
    """

    SID = "fz:1"

    def __init__(self) -> None:
        super().__init__()
        self.app = _AppRunner(max_gap=MAX_GAP, flush_idle_ms=30)
        self._reset_model()

    def _reset_model(self) -> None:
        self.exists = False
        self.closed = False
        self.accepted: list[str] = []  # text by seq, contiguous from 0
        self.held: dict[int, str] = {}

    def teardown(self) -> None:
        self.app.close()

    @property
    def next_seq(self) -> int:
        return len(self.accepted)

    def _post(self, chunks: list[tuple[int, str]]) -> httpx.Response:
        body = {"chunks": [{"seq": s, "text": t} for s, t in chunks]}
        return self.app.request("POST", f"/v1/streams/{self.SID}/chunks", json=body)

    def _expect_post(self, chunks: list[tuple[int, str]]) -> tuple[int, int | None]:
        """The status and accepted_through the contract gives, applying it to the model."""
        if any(s < 0 or s > HUGE_SEQ for s, _ in chunks):
            return 422, None  # validation: nothing is looked at
        if self.closed:
            return 409, None
        self.exists = True
        for seq, text in chunks:
            if seq < self.next_seq:
                if self.accepted[seq] != text:
                    return 409, None
                continue
            if seq in self.held:
                if self.held[seq] != text:
                    return 409, None
                continue
            if seq > self.next_seq:
                if len(self.held) >= MAX_GAP:
                    return 409, None
                self.held[seq] = text
                continue
            self.accepted.append(text)
            while self.next_seq in self.held:
                self.accepted.append(self.held.pop(self.next_seq))
        return 200, self.next_seq - 1

    def _check_post(self, chunks: list[tuple[int, str]]) -> None:
        resp = self._post(chunks)
        status, through = self._expect_post(chunks)
        assert_4xx_problem_or_success(resp, where=repr(chunks))
        assert resp.status_code == status, (chunks, resp.text)
        if through is not None:
            assert resp.json() == {"accepted_through": through}

    @rule(text=st.sampled_from(WORDS), n=st.integers(1, 3))
    def post_next(self, text: str, n: int) -> None:
        start = self.next_seq
        self._check_post([(start + i, text) for i in range(n)])

    @rule(ahead=st.integers(1, 6), text=st.sampled_from(WORDS))
    def post_past_a_gap(self, ahead: int, text: str) -> None:
        self._check_post([(self.next_seq + ahead, text)])

    @precondition(lambda self: self.accepted)
    @rule(data=st.data())
    def retry_an_accepted_seq(self, data: st.DataObject) -> None:
        seq = data.draw(st.integers(0, self.next_seq - 1))
        same = data.draw(st.booleans())
        text = self.accepted[seq] if same else self.accepted[seq] + "x"
        self._check_post([(seq, text)])

    @rule(seq=st.sampled_from([-1, -(2**31), HUGE_SEQ, HUGE_SEQ + 1, 2**63]))
    def post_an_extreme_seq(self, seq: int) -> None:
        self._check_post([(seq, "x")])

    @rule(text=st.sampled_from(WORDS))
    def post_a_mixed_request(self, text: str) -> None:
        """A good chunk, a retry and a gap in one request, in an odd order."""
        chunks = [(self.next_seq + 2, text), (self.next_seq, text)]
        if self.accepted:
            chunks.append((0, self.accepted[0]))
        self._check_post(chunks)

    @rule()
    def open_again(self) -> None:
        resp = self.app.request("POST", "/v1/streams", json={"stream_id": self.SID})
        assert_4xx_problem_or_success(resp)
        assert resp.status_code == (200 if self.exists else 201), resp.text
        if not self.exists:
            self.exists = True

    @rule()
    def close(self) -> None:
        resp = self.app.request("POST", f"/v1/streams/{self.SID}/close")
        assert_4xx_problem_or_success(resp)
        if not self.exists:
            assert resp.status_code == 404
        elif self.held:
            assert resp.status_code == 409
            assert resp.json()["missing_seq"] == self.next_seq
        else:
            assert resp.status_code == 200, resp.text
            self.closed = True
            self._check_ended()

    @rule()
    def delete(self) -> None:
        resp = self.app.request("DELETE", f"/v1/streams/{self.SID}")
        assert resp.status_code == (204 if self.exists else 404), resp.text
        self._reset_model()

    def _events(self, wait_ms: int = 0) -> list[dict[str, Any]]:
        resp = self.app.request("GET", f"/v1/streams/{self.SID}/events",
                                params={"after": -1, "wait_ms": wait_ms})
        assert resp.status_code == 200, resp.text
        events: list[dict[str, Any]] = resp.json()["events"]
        return events

    def _check_ended(self) -> None:
        events: list[dict[str, Any]] = []
        for _ in range(40):
            events = self._events(wait_ms=50)
            if events and events[-1]["type"] == "end":
                break
        assert events and events[-1]["type"] == "end", events
        originals = [e["data"]["original"] for e in events if e["type"] == "segment"]
        assert "".join(originals) == "".join(self.accepted)
        assert events[-1]["data"] == {"segments": len(originals)}

    @invariant()
    def originals_so_far_are_a_prefix_of_the_accepted_text(self) -> None:
        if not self.exists:
            resp = self.app.request("GET", f"/v1/streams/{self.SID}/events")
            assert resp.status_code == 404
            return
        events = self._events()
        assert [e["id"] for e in events] == list(range(len(events)))
        segments = [e["data"] for e in events if e["type"] == "segment"]
        assert [s["index"] for s in segments] == list(range(len(segments)))
        assert "".join(self.accepted).startswith("".join(s["original"] for s in segments))


def test_seq_abuse_never_breaks_a_stream() -> None:
    run_state_machine_as_test(StreamModel, settings=settings(
        max_examples=max(10, FUZZ_EXAMPLES), stateful_step_count=25, deadline=None,
        suppress_health_check=list(HealthCheck)))


# -- the segmenter ---------------------------------------------------------------------------

_SENTENCES = ["Hmm, the user said hello. ", "Let me think about it! ", "Is 3.14 right? ",
              "首先，确定总时间。", "```python\nx = 1\n```\n", "word " * 12, "a" * 70 + ". ",
              "e.g. this one. ", "\r\n", "\n\n", "~~~\n", "…", "OK."]
SEG_TEXTS = st.lists(st.one_of(st.sampled_from(_SENTENCES), st.text(max_size=30)),
                     max_size=10).map("".join)


def _fed(text: str, sizes: list[int], max_chars: int) -> list[Piece]:
    seg = segmenter(max_chars)
    pieces: list[Piece] = []
    pos = 0
    for size in sizes:
        pieces += seg.feed(text[pos:pos + size])
        pos += size
    pieces += seg.feed(text[pos:])
    pieces += seg.flush()
    return pieces


@example(text="Hmm, the user said hello. Let me think about it! ", sizes=[1] * 60, max_chars=16)
@example(text="x" * 500 + ". Then more.", sizes=[1] * 600, max_chars=400)
@given(text=SEG_TEXTS, sizes=st.lists(st.integers(1, 8), max_size=200),
       max_chars=st.integers(16, 120))
@settings(max_examples=max(200, FUZZ_EXAMPLES * 8), deadline=None)
def test_chunking_does_not_change_the_cut_at_any_size_bound(
    text: str, sizes: list[int], max_chars: int
) -> None:
    """tests/test_segmenter.py holds this at max_chars=400 with short sentences; a sentence
    longer than the bound must be cut the same whether it arrives whole or in deltas."""
    whole = segment(text, max_chars)
    fed = _fed(text, sizes, max_chars)
    assert [(p.text, p.kind) for p in fed] == [(p.text, p.kind) for p in whole]
