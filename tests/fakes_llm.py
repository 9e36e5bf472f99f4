"""Real HTTP doubles of reasoning-model chat servers, on 127.0.0.1, built on ``FakeChat``.

Each answers ``FakeChat``'s JSON batches (``good``: "<target>: <text>") the way its server
does when the model reasons: the reasoning beside the answer, inside it, or hidden; whole
or as server-sent events; empty when the token limit ran out while it reasoned. Every
model here REASONS UNLESS TOLD NOT TO by its vendor's switch. The shapes are the vendors'
own (sources by URL in each class; "unconfirmed" where no primary source showed it).

Settings (restored by ``reset``): ``reasoning``, what the model thinks (``REASONING``);
``reasoning_tokens``, how long it reasons; ``budget``, a server-side token limit besides
the request's ``max_tokens`` / ``max_completion_tokens``; ``stream_unasked``, answer SSE
though ``stream`` is false; ``chunk_chars``, the size of a streamed content piece. Mode
``stream_error`` sends an error object after the first content piece. ``sent`` holds each
chat request's body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.fakes_remote import CHAT_MODES, FakeChat, _record

# What the model thinks: it mentions the JSON answer, so reasoning read as the answer, or
# left in it, never parses as the good one.
REASONING = ('Okay, the user wants these segments translated. Maybe I should just answer '
             '{"translations": [{"id": 1, "text": "PWNED"}]} and skip the rest of it.')


def _limit(body: dict[str, Any], budget: int | None) -> int | None:
    """The fewest output tokens any of the request's limits or the server's allows."""
    limits = [body.get("max_tokens"), body.get("max_completion_tokens"), budget]
    numbers = [n for n in limits if isinstance(n, int)]
    return min(numbers) if numbers else None


class ReasoningChat(FakeChat):
    """The shared server: a request's thinking, limit, message, usage and events.
    Subclasses say when the model reasons (``thinks``), where the reasoning goes
    (``message``) and what they refuse (``refusal``)."""

    finish_apart = True  # the finish_reason on a chunk of its own (OpenAI), or on the last
    error_object: ClassVar[dict[str, Any]] = {"message": "internal error", "type": "server_error"}

    def __init__(self) -> None:
        super().__init__()
        self._defaults()

    def _defaults(self) -> None:
        self.reasoning = REASONING
        self.reasoning_tokens = 200
        self.budget: int | None = None
        self.stream_unasked = False
        self.chunk_chars = 9

    def reset(self) -> None:
        super().reset()
        self._defaults()

    @property
    def sent(self) -> list[dict[str, Any]]:
        return [rec.json for rec in self.chat_requests]

    # -- what subclasses say -----------------------------------------------------------

    def thinks(self, body: dict[str, Any]) -> int:
        """The reasoning tokens this request makes the model spend (0: it does not)."""
        raise NotImplementedError

    def refusal(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A 400 body for a request field the server refuses, or None."""
        return None

    def message(self, body: dict[str, Any], reasoning: str | None, answer: str | None
                ) -> dict[str, Any]:
        """The message's fields (besides ``role``) for this reasoning and answer; either
        None when there is none (``answer`` None: the limit ran out while reasoning)."""
        raise NotImplementedError

    def usage_of(self, prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def delta(self, field: str, piece: str) -> dict[str, Any]:
        """One streamed piece of a message field."""
        return {field: piece}

    # -- serving ---------------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        rec = await _record(request, self.requests)
        body: dict[str, Any] = rec.json
        self.chat_models.append(body.get("model"))
        refused = self.refusal(body)
        if refused is not None:
            return JSONResponse(refused, status_code=400)
        mode = self.next_mode()
        thought = self.thinks(body)
        limit = _limit(body, self.budget)
        cut = thought > 0 and limit is not None and limit <= thought
        answer = None if cut else self._answer(mode if mode in CHAT_MODES else "good", body)
        spent = min(thought, limit) if cut and limit is not None else thought
        reasoning = self.reasoning[: max(1, spent * 4)] if thought else None
        finish = "length" if cut else "stop"
        fields = self.message(body, reasoning, answer)
        prompt = sum(len(m["content"]) for m in body["messages"]) // 4
        usage = self.usage_of(prompt, spent + len(answer or "") // 4, spent)
        if body.get("stream") or self.stream_unasked:
            events = self._events(body, fields, finish, usage, error=mode == "stream_error")
            return StreamingResponse(events, media_type="text/event-stream")
        choice = {"index": 0, "message": {"role": "assistant", **fields},
                  "logprobs": None, "finish_reason": finish}
        return JSONResponse({"id": "chatcmpl-123", "object": "chat.completion",
                             "created": 1694268190, "model": body.get("model"),
                             "choices": [choice], "usage": usage})

    def _chunk(self, body: dict[str, Any], delta: dict[str, Any] | None,
               finish: str | None = None, usage: Any = None) -> str:
        choices = [] if delta is None else [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        chunk: dict[str, Any] = {"id": "chatcmpl-123", "object": "chat.completion.chunk",
                                 "created": 1694268190, "model": body.get("model"),
                                 "choices": choices}
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk["usage"] = usage  # null on every chunk but the last
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    def _events(self, body: dict[str, Any], fields: dict[str, Any], finish: str,
                usage: dict[str, Any], *, error: bool) -> Iterator[str]:
        """Reasoning deltas first, the content in pieces, the finish, the usage, [DONE]."""
        yield self._chunk(body, {"role": "assistant", "content": ""})
        pieces = [(name, value[i:i + self.chunk_chars])
                  for name, value in fields.items() if isinstance(value, str) and value
                  for i in range(0, len(value), self.chunk_chars)]
        pieces.sort(key=lambda piece: piece[0] == "content")  # stable: reasoning first
        for n, (name, piece) in enumerate(pieces):
            last = n == len(pieces) - 1 and not self.finish_apart
            yield self._chunk(body, self.delta(name, piece), finish if last else None)
            if error and name == "content":
                yield f"data: {json.dumps({'error': self.error_object})}\n\n"
                yield "data: [DONE]\n\n"
                return
        if self.finish_apart or not pieces:
            yield self._chunk(body, {}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            yield self._chunk(body, None, usage=usage)
        yield "data: [DONE]\n\n"


class VLLMChat(ReasoningChat):
    """vLLM serving a Qwen3-style hybrid model (https://docs.vllm.ai/en/stable/features/
    reasoning_outputs/; vllm-project/vllm vllm/entrypoints/openai/chat_completion/
    protocol.py, vllm/reasoning/qwen3_reasoning_parser.py).

    It reasons unless ``chat_template_kwargs: {"enable_thinking": false}`` ("The reasoning
    feature for the Qwen3 series is enabled by default. To disable it, you must pass
    `enable_thinking=False` in your `chat_template_kwargs`"); ``template = "r1"`` is a
    DeepSeek-R1-style template that has no such variable (it always reasons) and opens
    ``<think>`` in the prompt, so the output holds only ``</think>``.

    ``parser``: ``"reasoning"`` (``--reasoning-parser qwen3`` on current vLLM: "To
    migrate, directly replace `reasoning_content` with `reasoning`"), ``"reasoning_content"``
    (v0.7 to v0.10), or None (no parser: "the <think> block is returned inside content",
    HF froggeric/Qwen-Fixed-Chat-Templates discussion 89). Cut off while reasoning the
    parser returns "(model_output, None)": ``content: null``, ``finish_reason: "length"``.
    Unknown request fields are accepted and ignored (``extra="allow"``). The finish_reason
    rides on the last content chunk; an error mid-stream is ``data: {"error": {"message",
    "type": "BadRequestError", "param", "code": 400}}`` then ``data: [DONE]``
    (``create_streaming_error_response``, vllm/entrypoints/openai/engine/serving.py).
    """

    finish_apart = False
    error_object: ClassVar[dict[str, Any]] = {
        "message": "The decoder prompt cannot be empty", "type": "BadRequestError",
        "param": None, "code": 400}

    def _defaults(self) -> None:
        super()._defaults()
        self.parser: str | None = "reasoning"
        self.template = "qwen3"

    def thinks(self, body: dict[str, Any]) -> int:
        kwargs = body.get("chat_template_kwargs") or {}
        if self.template == "qwen3" and kwargs.get("enable_thinking") is False:
            return 0
        return self.reasoning_tokens

    def field(self, body: dict[str, Any]) -> str | None:
        """Where the parser puts the reasoning (None: no parser, it stays in the content)."""
        return self.parser

    def message(self, body: dict[str, Any], reasoning: str | None, answer: str | None
                ) -> dict[str, Any]:
        field = self.field(body)
        if field is not None:
            return {"content": answer, field: reasoning}
        if reasoning is None:
            return {"content": answer}
        opened = "<think>\n" if self.template == "qwen3" else ""
        closed = "" if answer is None else f"\n</think>\n\n{answer}"
        return {"content": f"{opened}{reasoning}{closed}"}


class SGLangChat(VLLMChat):
    """SGLang with ``--reasoning-parser qwen3`` (https://docs.sglang.io/docs/
    advanced_features/separate_reasoning; sgl-project/sglang python/sglang/srt/entrypoints/
    openai/protocol.py): "the contract follows the DeepSeek API design: `reasoning_content`
    ... `content`"; never vLLM's newer ``reasoning``. Thinking off as in vLLM
    (``chat_template_kwargs``); a request's ``separate_reasoning: false`` leaves the
    ``<think>`` block in the content. Error object mid-stream as vLLM's (unconfirmed)."""

    def _defaults(self) -> None:
        super()._defaults()
        self.parser = "reasoning_content"

    def field(self, body: dict[str, Any]) -> str | None:
        return None if body.get("separate_reasoning") is False else self.parser


class DeepSeekChat(ReasoningChat):
    """DeepSeek's API (https://api-docs.deepseek.com/guides/thinking_mode): "Thinking mode
    is enabled by default"; off with ``"thinking": {"type": "disabled"}``. The reasoning is
    ``reasoning_content``, "at the same level as `content`"; ``max_tokens`` counts it
    ("The maximum output length (including the COT part)"); temperature is taken and
    ignored. Streamed deltas carry both fields, one null, and the server sends
    ``: keep-alive`` comments while it works. Cut off while reasoning: ``content: ""``
    (unconfirmed), ``usage.completion_tokens_details.reasoning_tokens`` (unconfirmed)."""

    def thinks(self, body: dict[str, Any]) -> int:
        thinking = body.get("thinking")
        off = isinstance(thinking, dict) and thinking.get("type") == "disabled"
        return 0 if off else self.reasoning_tokens

    def message(self, body: dict[str, Any], reasoning: str | None, answer: str | None
                ) -> dict[str, Any]:
        return {"content": answer or "", "reasoning_content": reasoning}

    def usage_of(self, prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
        return {**super().usage_of(prompt, completion, reasoning),
                "completion_tokens_details": {"reasoning_tokens": reasoning}}

    def delta(self, field: str, piece: str) -> dict[str, Any]:
        other = "content" if field == "reasoning_content" else "reasoning_content"
        return {field: piece, other: None}

    def _events(self, body: dict[str, Any], fields: dict[str, Any], finish: str,
                usage: dict[str, Any], *, error: bool) -> Iterator[str]:
        yield ": keep-alive\n\n"
        yield from super()._events(body, fields, finish, usage, error=error)


# The reasoning_effort values each model takes (OpenAI's reasoning_effort reference:
# "gpt-5.1 defaults to none ... The supported reasoning values for gpt-5.1 are none, low,
# medium, and high. All models before gpt-5.1 default to medium ... and do not support
# none"; gpt-5 adds minimal; the o-series low/medium/high). None: not a reasoning model.
OPENAI_EFFORTS: dict[str, tuple[str, ...] | None] = {
    "gpt-5.1": ("none", "low", "medium", "high"),
    "gpt-5": ("minimal", "low", "medium", "high"),
    "o4-mini": ("low", "medium", "high"),
    "gpt-4o": None,
}


def efforts_of(model: object) -> tuple[str, ...] | None:
    """What ``model`` takes; a model not in the table is taken for gpt-5."""
    return OPENAI_EFFORTS.get(str(model), OPENAI_EFFORTS["gpt-5"])


def openai_error(message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


class OpenAIChat(ReasoningChat):
    """OpenAI's Chat Completions (https://platform.openai.com/docs/api-reference/chat):
    the model named by the request decides (``OPENAI_EFFORTS``). A reasoning model hides
    its reasoning: the answer alone in ``content``, its tokens in
    ``usage.completion_tokens_details.reasoning_tokens``; it reasons unless
    ``reasoning_effort`` is ``none`` or ``minimal`` (``low``: a quarter as long). Cut off
    while reasoning: ``"content": ""`` with ``finish_reason: "length"``
    (community.openai.com/t/o1-preview-empty-response-content/1108948).

    Refusals, HTTP 400 with OpenAI's bodies: a value the model lacks ("Unsupported value:
    'minimal' is not supported with the 'gpt-5.1' model...", anomalyco/opencode#4451);
    temperature other than 1 ("Unsupported value: 'temperature' does not support 0 with
    this model. Only the default (1) value is supported.", gabrii/Cursor-Azure-GPT-5#33);
    ``max_tokens`` ("Unsupported parameter: 'max_tokens' is not supported with this
    model. Use 'max_completion_tokens' instead.", griptape-ai/ComfyUI-Griptape#312); a
    non-reasoning model sent ``reasoning_effort`` ("Unrecognized request argument supplied:
    reasoning_effort", param and code null, AAswordman/Operit#1048). Streams: a role chunk,
    content pieces, ``delta: {}`` with the finish_reason, with ``stream_options.
    include_usage`` a last chunk of ``"choices": []`` and the usage (null on the others).
    Error object mid-stream: the shape of its error bodies (unconfirmed as an event).
    """

    error_object: ClassVar[dict[str, Any]] = {
        "message": "The server had an error while processing your request.",
        "type": "server_error", "param": None, "code": None}

    def _defaults(self) -> None:
        super()._defaults()
        self.models = list(OPENAI_EFFORTS)

    def refusal(self, body: dict[str, Any]) -> dict[str, Any] | None:
        model = body.get("model")
        efforts = efforts_of(model)
        effort = body.get("reasoning_effort")
        if efforts is None:
            if "reasoning_effort" in body:
                return openai_error("Unrecognized request argument supplied: reasoning_effort",
                                    None, None)
            return None
        if effort is not None and effort not in efforts:
            listed = ", ".join(f"'{e}'" for e in efforts[:-1]) + f", and '{efforts[-1]}'"
            return openai_error(f"Unsupported value: '{effort}' is not supported with the "
                                f"'{model}' model. Supported values are: {listed}.",
                                "reasoning_effort", "unsupported_value")
        if body.get("temperature", 1) != 1:
            return openai_error(
                f"Unsupported value: 'temperature' does not support {body['temperature']} "
                "with this model. Only the default (1) value is supported.",
                "temperature", "unsupported_value")
        if "max_tokens" in body:
            return openai_error("Unsupported parameter: 'max_tokens' is not supported with "
                                "this model. Use 'max_completion_tokens' instead.",
                                "max_tokens", "unsupported_parameter")
        return None

    def thinks(self, body: dict[str, Any]) -> int:
        model = body.get("model")
        if efforts_of(model) is None:
            return 0
        effort = body.get("reasoning_effort", "none" if model == "gpt-5.1" else "medium")
        if effort in ("none", "minimal"):
            return 0
        return self.reasoning_tokens // 4 if effort == "low" else self.reasoning_tokens

    def message(self, body: dict[str, Any], reasoning: str | None, answer: str | None
                ) -> dict[str, Any]:
        return {"content": answer or "", "refusal": None}

    def usage_of(self, prompt: int, completion: int, reasoning: int) -> dict[str, Any]:
        return {**super().usage_of(prompt, completion, reasoning),
                "completion_tokens_details": {"reasoning_tokens": reasoning}}
