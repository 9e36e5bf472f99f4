"""A chat completion's answer as the endpoints send it: one JSON object, or server-sent
events (``stream: true``), with the reasoning beside the answer or inside it.

Servers disagree on where a reasoning model's thinking goes; what counts here is the
message's ``content``, whether the endpoint reasoned, and how the answer ended, so that
running out of tokens is told apart. A reasoning block can stand only at the content's
start, and only the prompt style knows where the answer after it begins (``thinking_ends``):
the text translated may quote ``<think>`` and ``</think>`` itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from models.remote import AnswerBound

# An answer is a few sentences; more than this is a runaway, read no further.
MAX_ANSWER_CHARS = 1_000_000

_OPEN = re.compile(r"\s*<think>")
CLOSE = "</think>"
# Never read as the answer: vLLM's and SGLang's reasoning parsers and DeepSeek put the
# reasoning in the first, newer vLLM in the second.
_REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass
class Reply:
    """One answer: its content (None: none), how it ended, what it used. The content is as
    the endpoint sent it, a reasoning block at its start included, unless that block was
    never closed (then all of it was reasoning: empty). An empty answer cut off by
    ``length`` is the endpoint running out of tokens while it reasoned, not a model that
    cannot answer."""

    content: str | None = None
    finish_reason: str | None = None
    # The endpoint reasoned: a reasoning field, or a <think> block opening the content.
    reasoned: bool = False
    usage: Any = None
    error: str | None = None  # an error the endpoint sent instead of (or inside) a stream


def short_int(digits: str) -> int | None:
    """``parse_int`` for answers: an integer literal too long to be a count is None.

    Python refuses to parse integers over 4,300 digits (ValueError); without this one
    such number in ``usage`` would make the whole answer unreadable.
    """
    return int(digits) if len(digits) <= 30 else None


def opens_thinking(content: str) -> bool:
    """Whether ``content`` opens with a ``<think>`` block (a server without a reasoning
    parser); it ends at one of ``thinking_ends``."""
    return _OPEN.match(content) is not None


def thinking_ends(content: str) -> list[int]:
    """Where a reasoning block at the start of ``content`` may end: just past each
    ``</think>``, in order. Reasoning may quote the tag, and so may the translation after
    it; which one closes the block (if any: a template that opened it in the prompt,
    DeepSeek-R1's, leaves only ``</think>``) is for the prompt style to tell, by what an
    answer of its own looks like."""
    return [m.end() for m in re.finditer(re.escape(CLOSE), content)]


def _reasoning_in(part: object) -> bool:
    return isinstance(part, dict) and any(
        isinstance(part.get(name), str) and part[name].strip() for name in _REASONING_FIELDS)


def _error_text(data: object) -> str | None:
    """What an error object says it is (its code or type, never its message, which may
    quote the text); None when ``data`` carries none."""
    if not isinstance(data, dict) or data.get("error") is None:
        return None
    error = data["error"]
    kind = (error.get("code") or error.get("type")) if isinstance(error, dict) else None
    return re.sub(r"[^\w .:-]", "", str(kind))[:80] if kind else "without a code"


def _finish(reply: Reply, text: str, *, truncated: bool = False) -> Reply:
    if truncated and reply.finish_reason is None:
        reply.finish_reason = "length"
    if text:
        opened = opens_thinking(text)
        reply.reasoned = reply.reasoned or opened
        # Opened and never closed: all of it was reasoning.
        reply.content = "" if opened and CLOSE not in text else text
    return reply


def from_json(data: object) -> Reply:
    """A non-streamed answer: ``{"choices": [{"message": {...}, "finish_reason"}], ...}``."""
    reply = Reply(error=_error_text(data))
    if not isinstance(data, dict):
        return reply
    reply.usage = data.get("usage")
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return reply
    reason = choice.get("finish_reason")
    reply.finish_reason = reason if isinstance(reason, str) else None
    message = choice.get("message")
    reply.reasoned = _reasoning_in(message)
    # A chat answer's message, or a raw completion's text (a model without a chat template).
    content = message.get("content") if isinstance(message, dict) else choice.get("text")
    return _finish(reply, content if isinstance(content, str) else "")


async def from_events(response: httpx.Response, bound: AnswerBound) -> Reply:
    """A streamed answer: ``data: {...}`` lines of ``choices[0].delta``, then ``[DONE]``;
    a last chunk may hold only ``usage``. Read to ``[DONE]`` or the end of the body; a line
    past ``bound`` fails it (BadOutput)."""
    reply = Reply()
    parts: list[str] = []
    size = 0
    async for line in bound.lines(response, "a line of the LLM endpoint's streamed answer"):
        if not line.startswith("data:"):
            continue  # comments, event names, blank separators
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = json.loads(payload, parse_int=short_int)
        except ValueError:
            continue
        if not isinstance(chunk, dict):
            continue
        error = _error_text(chunk)
        if error is not None:
            reply.error = error
            break
        if chunk.get("usage") is not None:
            reply.usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        reply.reasoned = reply.reasoned or _reasoning_in(delta)
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(piece, str):
            parts.append(piece)
            size += len(piece)
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            reply.finish_reason = reason
        if size > MAX_ANSWER_CHARS:
            return _finish(reply, "".join(parts), truncated=True)
    return _finish(reply, "".join(parts))


async def read_reply(response: httpx.Response, bound: AnswerBound) -> Reply:
    """The answer of a 2xx response, streamed or not, whichever the endpoint sent; one
    past ``bound`` (the body, or a line of a streamed one) is BadOutput."""
    if "text/event-stream" in response.headers.get("content-type", ""):
        return await from_events(response, bound)
    body = await bound.body(response, "the LLM endpoint's answer")
    try:
        data = json.loads(body, parse_int=short_int)
    except ValueError:
        return Reply()
    return from_json(data)
