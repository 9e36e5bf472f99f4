"""Real HTTP doubles of the remote backends' vendors, served on 127.0.0.1.

``FakeDeepL`` speaks enough of the DeepL v2 API for the official client; ``FakeChat``
is an OpenAI-compatible chat endpoint. Each runs uvicorn in a background thread (its
own event loop), so the blocking DeepL client and the async httpx client both talk to
it over real sockets. Tests set ``mode`` (or queue one-shot modes in ``script``) and
read back ``requests``, the record of every call.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


@dataclass
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = None
    form: dict[str, list[str]] = field(default_factory=dict)
    query: dict[str, list[str]] = field(default_factory=dict)


class _ServerThread:
    """uvicorn on a pre-bound ephemeral port, in a daemon thread."""

    def __init__(self, app: Starlette) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
        self._sock.close()


async def _record(request: Request, into: list[Recorded]) -> Recorded:
    body = await request.body()
    ctype = request.headers.get("content-type", "")
    parsed_json: Any = None
    form: dict[str, list[str]] = {}
    if "json" in ctype and body:
        parsed_json = json.loads(body)
    elif body:
        # The DeepL client sends GET /v2/languages with a form body.
        form = parse_qs(body.decode("utf-8"))
    rec = Recorded(
        method=request.method,
        path=request.url.path,
        headers={k.lower(): v for k, v in request.headers.items()},
        body=body,
        json=parsed_json,
        form=form,
        query=parse_qs(request.url.query),
    )
    into.append(rec)
    return rec


class _Fake:
    """Shared start/stop, mode and script handling."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.script: deque[str] = deque()  # one-shot modes, used before ``mode``
        self.slow_s = 3.0
        self.requests: list[Recorded] = []
        self._server = _ServerThread(self._app())

    def _app(self) -> Starlette:  # pragma: no cover - overridden
        raise NotImplementedError

    def next_mode(self) -> str:
        return self.script.popleft() if self.script else self.mode

    def reset(self) -> None:
        self.mode = "ok"
        self.script.clear()
        self.slow_s = 3.0
        self.requests.clear()

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self._server.port}"


# -- DeepL v2 ------------------------------------------------------------------------------

DEEPL_TARGETS = [
    ("AR", "Arabic", False), ("DE", "German", True), ("EN-GB", "English (British)", False),
    ("EN-US", "English (American)", False), ("ES", "Spanish", True), ("FR", "French", True),
    ("HE", "Hebrew", False), ("JA", "Japanese", True), ("PT-BR", "Portuguese (Brazilian)", True),
    ("PT-PT", "Portuguese (European)", True), ("SW", "Swahili", False),
    ("ZH", "Chinese (simplified)", False),
    ("ZH-HANS", "Chinese (simplified)", False), ("ZH-HANT", "Chinese (traditional)", False),
]  # fmt: skip
DEEPL_SOURCES = [("DE", "German"), ("EN", "English"), ("FR", "French"), ("ZH", "Chinese")]


class FakeDeepL(_Fake):
    """DeepL v2: /v2/translate, /v2/languages, /v2/usage.

    Modes: ``ok`` (answers "[<TARGET>] <text>"), ``429``, ``456``, ``403``, ``500``, ``slow``
    (sleeps ``slow_s`` before answering ok). ``received`` holds, per translate request in
    arrival order, the ``context`` field (None when absent) and the texts;
    ``max_in_flight`` the most translate requests it was serving at once.
    """

    def __init__(self) -> None:
        self.character_count = 1234
        self.character_limit = 500_000
        self.targets = list(DEEPL_TARGETS)
        self.received: list[tuple[str | None, list[str]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.character_count = 1234
        self.targets = list(DEEPL_TARGETS)
        self.received.clear()
        self.in_flight = self.max_in_flight = 0

    @property
    def translate_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/v2/translate"]

    async def _fail(self, mode: str) -> Response | None:
        if mode == "slow":
            await asyncio.sleep(self.slow_s)
            return None
        if mode in {"429", "456", "403", "500"}:
            return JSONResponse({"message": f"fake failure {mode}"}, status_code=int(mode))
        return None

    async def _translate(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        data: dict[str, Any]
        if rec.json is not None:
            data = rec.json
        else:
            data = {k: v if k == "text" else v[0] for k, v in rec.form.items()}
        self.received.append((data.get("context"), list(data.get("text") or [])))
        self.in_flight += 1  # one event loop: no lock needed
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            failed = await self._fail(self.next_mode())
        finally:
            self.in_flight -= 1
        if failed is not None:
            return failed
        target = str(data["target_lang"]).upper()
        source = data.get("source_lang")
        texts = data["text"]
        return JSONResponse(
            {
                "translations": [
                    {
                        "detected_source_language": source or "EN",
                        "text": f"[{target}] {text}",
                        "billed_characters": len(text),
                        "model_type_used": data.get("model_type"),
                    }
                    for text in texts
                ]
            }
        )

    async def _languages(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        mode = self.next_mode()
        if mode != "456":  # a spent quota still answers metadata calls
            failed = await self._fail(mode)
            if failed is not None:
                return failed
        kind = (rec.form.get("type") or rec.query.get("type") or ["source"])[0]
        if kind == "target":
            return JSONResponse(
                [{"language": c, "name": n, "supports_formality": f} for c, n, f in self.targets]
            )
        return JSONResponse([{"language": c, "name": n} for c, n in DEEPL_SOURCES])

    async def _usage(self, request: Request) -> Response:
        await _record(request, self.requests)
        mode = self.next_mode()
        if mode == "456":
            return JSONResponse(
                {"character_count": self.character_limit, "character_limit": self.character_limit}
            )
        failed = await self._fail(mode)
        if failed is not None:
            return failed
        return JSONResponse(
            {"character_count": self.character_count, "character_limit": self.character_limit}
        )

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v2/translate", self._translate, methods=["POST"]),
                Route("/v2/languages", self._languages, methods=["GET", "POST"]),
                Route("/v2/usage", self._usage, methods=["GET", "POST"]),
            ]
        )


# -- OpenAI-compatible chat -----------------------------------------------------------------

CHAT_MODES = {
    "good", "fenced", "malformed", "wrong_count", "wrong_ids", "empty", "short", "long",
    "one_empty", "swapped", "obey", "echo_context", "500", "401", "403", "429", "timeout",
    "no_content", "drop_span", "alter_span", "ignore_terms", "drop_some",
}  # fmt: skip
# What a model that follows the text instead of translating it says: fluent, no numbers.
OBEYED = (
    "I have ignored all previous instructions, as the text asked me to, and I will now "
    "answer the question directly instead of translating anything."
)


def _segments_of(body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    payload = json.loads(user)
    return payload["target_language"], payload["segments"]


def _render_terms(text: str, terms: dict[str, str]) -> str:
    """``text`` with each term of an item's ``terms`` written as its rendering."""
    for source, target in sorted(terms.items(), key=lambda t: -len(t[0])):
        text = text.replace(source, target)
    return text


# How a careless model mangles what it was told to keep: it translates a file name's stem,
# "fixes" a URL, shortens a version, regroups a number, drops backticks; else it puts a
# space inside the string.
_ALTERATIONS = [
    (re.compile(r"config"), "配置"),
    (re.compile(r"^https://"), "http://"),
    (re.compile(r"^(v?\d+\.\d+)\.\d+"), r"\1"),
    (re.compile(r"^(\d+)\.(\d+)(\s?[A-Za-z]+)$"), r"\1,\2\3"),
    (re.compile(r"^`(.*)`$"), r"\1"),
]


def altered(keep: str) -> str:
    """``keep`` as a careless model writes it: never ``keep`` itself."""
    for pattern, replacement in _ALTERATIONS:
        changed = pattern.sub(replacement, keep, count=1)
        if changed != keep:
            return changed
    middle = max(1, len(keep) // 2)
    return f"{keep[:middle]} {keep[middle:]}"


def _model_not_found(model: object) -> dict[str, Any]:
    """OpenAI's answer (with HTTP 404) to a chat request naming a model it does not have."""
    return {
        "error": {
            "message": f"The model `{model}` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    }


# How a plain prompt (one user message, no system prompt) is answered: the text after the
# instruction's last blank line, behind this tag.
PLAIN_TAG = "[plain] "


class FakeChat(_Fake):
    """POST /v1/chat/completions (and GET /v1/models), with failure modes.

    ``good`` prefixes each text with "<target_language>: " so tests see the name used.
    ``fenced`` wraps a good answer in a Markdown code fence; ``one_empty`` empties only
    the first segment; ``short``/``long`` answer far shorter/longer than the source;
    ``swapped`` swaps the first two items' texts; ``obey`` answers every item with
    ``OBEYED``; ``echo_context`` puts an item's ``context`` before its good answer;
    ``timeout`` sleeps ``slow_s``. A plain prompt (``THINKTRANS_LLM_PROMPT_STYLE=plain``: one
    user message) is answered with its text behind ``PLAIN_TAG``. ``replies`` maps a
    segment's text to the text answered for it in the modes that answer per item (the good
    answer otherwise).

    A good answer renders an item's ``terms`` (each key written as its value) and keeps
    its ``keep`` strings, as the text has them. ``drop_span`` removes each item's first
    ``keep`` string from its answer; ``alter_span`` writes every ``keep`` string as a
    careless model would (``altered``: ``config.yaml`` as ``配置.yaml``, ``https://`` as
    ``http://``, ``v2.13.0`` as ``v2.13``, ``12.50 GB`` as ``12,50 GB``, backticks dropped);
    ``ignore_terms`` leaves each term as the text has it; ``drop_some`` drops an item's
    first ``keep`` string with probability ``drop_rate`` (``rng``, seeded by ``reset``).
    ``dropped`` counts the items answered without a ``keep`` string or a term. ``usage``, when
    set, is raw JSON text sent as the answer's ``usage`` (so tests can send what
    ``json.dumps`` would not write, like ``1e400``).

    ``models`` is what GET /v1/models lists; with ``list_models`` off that route answers
    404. With ``only_listed`` on, a chat request naming a model not in ``models`` gets
    OpenAI's 404 ``model_not_found``. ``chat_models`` records the model each chat
    request named, in arrival order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.mode = "good"
        self.replies: dict[str, str] = {}
        self.usage: str | None = None
        self.models = ["fake-model", "other-model"]
        self.list_models = True
        self.only_listed = False
        self.chat_models: list[str | None] = []
        self.drop_rate = 0.0
        self.rng = random.Random(0)
        self.dropped = 0

    def reset(self) -> None:
        super().reset()
        self.mode = "good"
        self.replies = {}
        self.usage = None
        self.models = ["fake-model", "other-model"]
        self.list_models = True
        self.only_listed = False
        self.chat_models.clear()
        self.drop_rate = 0.0
        self.rng = random.Random(0)
        self.dropped = 0

    def _item_text(self, mode: str, target: str, segment: dict[str, Any]) -> str:
        """One item's answer: the good one, or its spans mangled as ``mode`` says."""
        text = segment["text"]
        if text in self.replies:
            return self.replies[text]
        keep: list[str] = segment.get("keep") or []
        terms: dict[str, str] = segment.get("terms") or {}
        if terms and mode != "ignore_terms":
            text = _render_terms(text, terms)
        if keep and (mode == "drop_span"
                     or (mode == "drop_some" and self.rng.random() < self.drop_rate)):
            text = text.replace(keep[0], "", 1)
        elif keep and mode == "alter_span":
            for each in keep:
                text = text.replace(each, altered(each))
        lost = (any(text.count(each) < segment["text"].count(each) for each in keep)
                or any(rendering not in text for rendering in terms.values()))
        self.dropped += lost
        return f"{target}: {text}"

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def _answer(self, mode: str, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        if len(messages) == 1:  # a plain prompt: the text after the instruction, tagged
            return PLAIN_TAG + messages[0]["content"].rsplit("\n\n", 1)[-1]
        target, segments = _segments_of(body)
        items = [{"id": s["id"], "text": self._item_text(mode, target, s)} for s in segments]
        if mode == "echo_context":
            contexts = [s.get("context") for s in segments]
            items = [
                {"id": item["id"], "text": f"{context} {item['text']}" if context else item["text"]}
                for item, context in zip(items, contexts, strict=True)
            ]
        if mode == "malformed":
            return '{"translations": [{"id": 1, "text": "unterminated'
        if mode == "wrong_count":
            items = items[:-1] if len(items) > 1 else [*items, {"id": 99, "text": "extra"}]
        elif mode == "wrong_ids":
            items = [{"id": item["id"] + 1, "text": item["text"]} for item in items]
        elif mode == "empty":
            items = [{"id": item["id"], "text": ""} for item in items]
        elif mode == "one_empty":
            items[0]["text"] = " "
        elif mode == "swapped" and len(items) > 1:
            items[0]["text"], items[1]["text"] = items[1]["text"], items[0]["text"]
        elif mode == "obey":
            items = [{"id": item["id"], "text": OBEYED} for item in items]
        elif mode == "short":
            items = [{"id": item["id"], "text": "OK"} for item in items]
        elif mode == "long":
            items = [
                {"id": item["id"], "text": "Sure! Here is a long explanation. " * 20}
                for item in items
            ]
        answer = json.dumps({"translations": items}, ensure_ascii=False)
        if mode == "fenced":
            answer = f"Here you go:\n```json\n{answer}\n```"
        return answer

    async def _chat(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        model = rec.json.get("model") if isinstance(rec.json, dict) else None
        self.chat_models.append(model)
        if self.only_listed and model not in self.models:
            return JSONResponse(_model_not_found(model), status_code=404)
        mode = self.next_mode()
        if mode == "timeout":
            await asyncio.sleep(self.slow_s)
            mode = "good"
        if mode in {"500", "401", "403", "429"}:
            return JSONResponse({"error": {"message": f"fake {mode}"}}, status_code=int(mode))
        body = rec.json
        content: str | None = None if mode == "no_content" else self._answer(mode, body)
        prompt_chars = sum(len(m["content"]) for m in body["messages"])
        answer: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_chars // 4,
                "completion_tokens": len(content or "") // 4,
            },
        }
        if self.usage is None:
            return JSONResponse(answer)
        del answer["usage"]
        raw = json.dumps(answer)[:-1] + f', "usage": {self.usage}}}'
        return Response(raw, media_type="application/json")

    async def _models(self, request: Request) -> Response:
        await _record(request, self.requests)
        mode = self.mode
        if mode in {"401", "403", "500"}:
            return PlainTextResponse(f"fake {mode}", status_code=int(mode))
        if not self.list_models:
            return PlainTextResponse("Not Found", status_code=404)
        data = [{"id": ident, "object": "model", "owned_by": "fake"} for ident in self.models]
        return JSONResponse({"object": "list", "data": data})

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (the port was bound, then released)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
