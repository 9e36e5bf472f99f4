"""How a chat request asks the endpoint not to reason, and what it does when refused.

Hybrid reasoning models reason by default, and each family has its own switch; a
translation request never needs the reasoning, which costs seconds, tokens and, when it
eats the token budget, the answer itself. A dialect names the switch (``auto``: read from
the endpoint's host); a field the service chose that an endpoint refuses by name is sent
differently or not at all for that model from then on (``Refusals``).
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

import httpx

from models.llm.replies import short_int

log = logging.getLogger("models.llm")

DIALECTS = ("auto", "openai", "vllm", "sglang", "deepseek", "none")

# reasoning_effort values, lowest first: newer OpenAI models take "none", gpt-5 "minimal",
# the o-series "low" at least. A refused value moves to the next; the last refused, none;
# a refusal of the field itself (a model that does not reason: "Unrecognized request
# argument"), none at once.
EFFORTS = ("none", "minimal", "low")

# Who reads each switch: OpenAI's reasoning models; vLLM's and SGLang's chat templates with
# that variable (Qwen3, GLM-4.5; a template without it ignores it); DeepSeek's and GLM's
# hosted APIs.
_SWITCHES: dict[str, dict[str, Any]] = {
    "openai": {"reasoning_effort": EFFORTS[0]},
    "vllm": {"chat_template_kwargs": {"enable_thinking": False}},
    "sglang": {"chat_template_kwargs": {"enable_thinking": False}},
    "deepseek": {"thinking": {"type": "disabled"}},
    "none": {},
}

# Hosts whose dialect is known; every other endpoint is taken for vLLM, SGLang or a server
# that reads the same field (llama.cpp's does; others ignore it or refuse it by name).
_HOSTS = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "openai"),
    ("api.deepseek.com", "deepseek"),
    ("open.bigmodel.cn", "deepseek"),
    ("api.z.ai", "deepseek"),
)

# Request fields never taken from the extra body: the service's own.
RESERVED_FIELDS = ("model", "messages", "stream")
MAX_EXTRA_BODY_CHARS = 16_384


def resolve_dialect(dialect: str, base_url: str | None) -> str:
    """The dialect in force: ``auto`` read from the endpoint's host."""
    if dialect != "auto":
        return dialect
    try:
        host = httpx.URL(base_url or "").host.lower()
    except httpx.InvalidURL:
        return "vllm"
    for name, known in _HOSTS:
        if host == name.lstrip(".") or host.endswith("." + name.lstrip(".")):
            return known
    return "vllm"


def switch(dialect: str) -> dict[str, Any]:
    """The fields that switch reasoning off in ``dialect`` (resolved, not ``auto``)."""
    return copy.deepcopy(_SWITCHES[dialect])


def extra_body_problem(extra: object) -> str | None:
    """Why ``extra`` cannot be merged into requests, or None."""
    if not isinstance(extra, dict):
        return "must be a JSON object"
    reserved = [key for key in RESERVED_FIELDS if key in extra]
    if reserved:
        return (f"may not set {', '.join(map(repr, reserved))}: the service sends those "
                "(THINKTRANS_LLM_MODEL, the prompt, THINKTRANS_LLM_STREAM)")
    if len(json.dumps(extra, ensure_ascii=False)) > MAX_EXTRA_BODY_CHARS:
        return f"is longer than {MAX_EXTRA_BODY_CHARS} characters as JSON"
    return None


def merge(body: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with ``extra`` merged over it: objects key by key, a ``None`` removes."""
    out = dict(body)
    for key, value in extra.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _error_of(response: httpx.Response) -> object:
    """The error object of an error answer (its ``error`` member where it has one)."""
    try:
        data = response.json(parse_int=short_int)
    except ValueError:
        return None
    return data.get("error", data) if isinstance(data, dict) else data


def _message_of(response: httpx.Response, error: object) -> str:
    message = error.get("message") if isinstance(error, dict) else error
    return (message if isinstance(message, str) else response.text)[:1000]


def named_fields(response: httpx.Response, fields: set[str]) -> set[str]:
    """Which of ``fields`` a 400 or 422 answer says the endpoint refuses: OpenAI names it
    in ``error.param``; vLLM, LiteLLM, Groq and others in the message's words."""
    if response.status_code not in (400, 422) or not fields:
        return set()
    error = _error_of(response)
    param = error.get("param") if isinstance(error, dict) else None
    if isinstance(param, str) and param.split(".")[0] in fields:
        return {param.split(".")[0]}
    message = _message_of(response, error)
    return {name for name in fields if name in message}


# How a server says it has no such field at all (not that it refuses the value): OpenAI's
# "Unrecognized request argument supplied" (a model without reasoning) and "Unsupported
# parameter", pydantic's extra="forbid", LiteLLM's "UnsupportedParamsError".
_NO_SUCH_FIELD = re.compile(
    r"unrecogni[sz]ed (?:request )?argument|unsupported ?param|unknown (?:parameter|field|"
    r"argument)|extra (?:inputs|fields) (?:are )?not permitted|extra_forbidden",
    re.IGNORECASE)


def refuses_the_field(response: httpx.Response) -> bool:
    """Whether an error answer refuses a field as such, not only the value it was sent:
    another value of it would be refused too."""
    error = _error_of(response)
    code = error.get("code") if isinstance(error, dict) else None
    if code in ("unsupported_parameter", "unknown_parameter"):
        return True
    return _NO_SUCH_FIELD.search(_message_of(response, error)) is not None


class Refusals:
    """What each model refused of the fields the service chose to send, so that later
    requests send them differently (the next ``reasoning_effort``) or not at all."""

    MAX_MODELS = 100  # models are named by requests: the memory is bounded

    def __init__(self, dialect: str, extra: Mapping[str, Any]) -> None:
        self.dialect = dialect
        self._switch = switch(dialect)
        self._extra = dict(extra)
        self._dropped: dict[str | None, set[str]] = {}
        self._effort: dict[str | None, int] = {}

    def optional(self) -> set[str]:
        """The fields the service may change or drop: its own, not the operator's."""
        return {*self._switch, "temperature", "max_tokens", "max_completion_tokens",
                "stream_options"} - set(self._extra)

    def shape(self, body: dict[str, Any], model: str | None, *,
              chat: bool = True) -> dict[str, Any]:
        """The request to send: ``body``, the switch (a chat request's: a raw completion has
        no template to switch), the extra body, less what ``model`` refused."""
        fields = switch(self.dialect) if chat else {}
        if "reasoning_effort" in fields:
            fields["reasoning_effort"] = EFFORTS[self._effort.get(model, 0)]
        out = merge(body, fields)
        if self.dialect == "openai" and "max_tokens" in out:
            # OpenAI's reasoning models refuse max_tokens and count reasoning in this one.
            out["max_completion_tokens"] = out.pop("max_tokens")
        for name in self._dropped.get(model, ()):
            out.pop(name, None)
        return merge(out, self._extra)

    def refused(self, response: httpx.Response, model: str | None) -> str | None:
        """Note a refusal of the service's own fields; what changes (for the log), or None
        when the answer names none of them (the request fails as it is)."""
        named = named_fields(response, self.optional() - self._dropped.get(model, set()))
        if not named:
            return None
        if len(self._dropped) >= self.MAX_MODELS and model not in self._dropped:
            self._dropped.pop(next(iter(self._dropped)))
        if "reasoning_effort" in named and not refuses_the_field(response):
            step = self._effort.get(model, 0) + 1
            if step < len(EFFORTS):
                self._effort[model] = step
                named.discard("reasoning_effort")
                if not named:
                    return f"reasoning_effort {EFFORTS[step]!r}"
        self._dropped.setdefault(model, set()).update(named)
        return "no " + ", ".join(sorted(named))

    def dropped(self) -> dict[str, list[str]]:
        """Per model, the fields no longer sent (for ``info``)."""
        return {str(model): sorted(names) for model, names in self._dropped.items()}
